"""Measure a hardware profile (verispec.costmodel) on this machine: t(k) per model, context slope, overheads.

Only the public `CausalLM` protocol is used (reset / forward / truncate), timed with `time.perf_counter` (with
`torch.cuda.synchronize` around each forward on CUDA), so any adapter can be profiled. With random weights of the
same architecture (`random_like`), a profile runs on a machine that has no weights: timing does not depend on the
weights' values, only on their shapes and dtype.

One repetition: reset, a prompt forward of `context` tokens (timed: the prefill point), then for each k a forward
over k new tokens timed and rolled back to `context`, then one 1-token forward after `slope_context` cached tokens
(the context slope), then a prompt forward of `long_prefill` tokens on an empty cache (the second prefill point).
Repetition 0 warms up (allocations, kernel choice, weight packing) and is dropped; the curve
holds medians over the others.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from time import perf_counter
from typing import Any

import torch

from verispec.costmodel import (
    ACCEL_BANDWIDTH,
    ACCEL_BYTES_PER_PARAM,
    ACCEL_FLOPS,
    KIND_MEASURED,
    HardwareProfile,
    ModelCost,
    Overheads,
    accelerator_profile,
    cost_ratios,
    merge_profiles,
)
from verispec.errors import ConfigError, ModelFilesError
from verispec.models.fastpath import LINEAR_BACKENDS, apply_linear_backend
from verispec.models.gguf_file import GGUFFile
from verispec.models.hf import HFCausalLM
from verispec.models.loading import DEFAULT_LINEAR_BACKEND, gguf_blocks_file, load_model
from verispec.models.protocol import CausalLM
from verispec.provenance import machine_description
from verispec.sampling import SamplingConfig, process_logits, sample

DEFAULT_KS = (1, 2, 3, 4, 5, 6, 8, 12, 16)

# The default pair's architectures (Qwen2.5-Coder 1.5B / 0.5B as converted from GGUF: untied LM heads), used by
# `random_like` when the converted folder is absent, e.g. on an accelerator machine that holds no weights.
DEFAULT_ARCHITECTURES: dict[str, dict[str, Any]] = {
    "target": dict(hidden_size=1536, intermediate_size=8960, num_hidden_layers=28, num_attention_heads=12,
                   num_key_value_heads=2),
    "draft": dict(hidden_size=896, intermediate_size=4864, num_hidden_layers=24, num_attention_heads=14,
                  num_key_value_heads=2),
}
_QWEN2_COMMON = dict(vocab_size=151936, max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=False,
                     hidden_act="silu", bos_token_id=151643, eos_token_id=151645)


@dataclass
class ProfileConfig:
    """Settings of `verispec profile`; the CLI reads its defaults from here."""

    target: str | None = None  # hub id, folder, config.json or .gguf; None = the embedded default
    draft: str | None = None  # likewise
    roles: list[str] = field(default_factory=lambda: ["target", "draft"])  # which models to measure
    dtype: str = "float32"  # weights' dtype
    device: str = "cpu"  # torch device
    linear_backend: str = DEFAULT_LINEAR_BACKEND  # CPU linear kernels: auto | int8 | int4 | onednn | torch (as bench)
    random_weights: bool = False  # random weights of the same architecture (no weight files needed)
    ks: list[int] = field(default_factory=lambda: list(DEFAULT_KS))  # new tokens per timed forward
    context: int = 128  # cached tokens before each timed forward (and the prefill point's length)
    slope_context: int | None = None  # a 1-token forward after this many cached tokens gives the slope; None = 2x
    long_prefill: int | None = None  # a second, longer prompt forward (long-prompt prefill); None = 4x; 0 = none
    reps: int = 5  # timed repetitions (medians), after one warm-up
    temperature: float = SamplingConfig.temperature  # sampling settings the overheads are measured at
    top_k: int = SamplingConfig.top_k
    top_p: float = SamplingConfig.top_p
    seed: int = 0  # seeds the random token ids and logits


def architecture_config(spec: str | None, role: str) -> Any:
    """Return the transformers config named by `spec` (default pair, folder, config.json, .gguf, or hub id)."""
    from transformers import AutoConfig, Qwen2Config

    from verispec.models.default_pair import DEFAULT_PAIR, converted_dir

    if spec is None or spec == "default":
        folder = converted_dir(DEFAULT_PAIR[role])
        if (folder / "config.json").is_file():
            return AutoConfig.from_pretrained(str(folder))
        return Qwen2Config(**_QWEN2_COMMON, **DEFAULT_ARCHITECTURES[role])
    path = Path(spec).expanduser()
    try:
        if path.is_file() and path.suffix == ".json":
            data = json.loads(path.read_text())
            return AutoConfig.for_model(data.pop("model_type"), **data)
        if path.suffix == ".gguf":
            return AutoConfig.from_pretrained(str(path.parent), gguf_file=path.name)
        return AutoConfig.from_pretrained(spec)
    except (OSError, KeyError, ValueError, json.JSONDecodeError) as exc:
        raise ModelFilesError(f"cannot read a model config from {spec!r}: {exc}") from exc


def count_params(model: torch.nn.Module) -> tuple[int, int]:
    """Return (parameters, parameters one forward reads: all but an untied input-embedding table)."""
    params = sum(p.numel() for p in model.parameters())
    embed = model.get_input_embeddings().weight
    head = model.get_output_embeddings()
    tied = head is not None and head.weight is embed
    return params, params - (0 if tied else embed.numel())


def random_like(spec: str | None, role: str = "target", dtype: str | torch.dtype = "float32",
                device: str = "cpu") -> Any:
    """Return an `HFCausalLM` with randomly initialised weights of `spec`'s architecture (see architecture_config)."""
    from transformers import AutoModelForCausalLM

    from verispec.models.hf import HFCausalLM, parse_dtype

    config = architecture_config(spec, role)
    with torch.device(device):  # initialise in place on the device: no host copy of a large model
        model = AutoModelForCausalLM.from_config(config, dtype=parse_dtype(dtype))
    arch = getattr(config, "_name_or_path", "") or spec or config.model_type
    return HFCausalLM(model, None, name=f"random:{arch}")


def _load(spec: str | None, role: str, dtype: str, device: str, random_weights: bool) -> Any:
    if random_weights:
        return random_like(spec, role, dtype, device)
    return load_model(spec, role, dtype, device, linear_backend="torch")  # packed below, after counting parameters


def measure_model_cost(
    model: CausalLM,
    ks: Sequence[int] = DEFAULT_KS,
    context: int = 128,
    reps: int = 5,
    all_logits: bool = True,
    slope_context: int | None = None,
    seed: int = 0,
    sync: Callable[[], None] = lambda: None,
    long_prefill: int | None = None,
) -> ModelCost:
    """Return the model's measured t(k) at `context`, prefill points and context slope (module docstring).

    `all_logits`: forwards over k tokens return k logits rows (a target pass) rather than one (a draft step).
    `slope_context`: None = 2·context; 0 = do not measure the slope. `long_prefill`: the second prompt forward's
    length; None = 4·context; 0 = do not measure it. `sync` waits for the device (CUDA).
    """
    ks = sorted(set(int(k) for k in ks))
    if not ks or ks[0] != 1 or context < 1 or reps < 1:
        raise ConfigError(f"need ks starting at 1, context >= 1 and reps >= 1; got ks={ks}, {context}, {reps}")
    far = 2 * context if slope_context is None else slope_context
    if far and far <= context:
        raise ConfigError(f"slope_context ({far}) must exceed context ({context}), or be 0 to skip the slope")
    long = 4 * context if long_prefill is None else long_prefill
    if long and long <= context:
        raise ConfigError(f"long_prefill ({long}) must exceed context ({context}), or be 0 to skip it")
    gen = torch.Generator().manual_seed(seed)

    def ids(n: int) -> list[int]:
        return torch.randint(0, model.vocab_size, (n,), generator=gen).tolist()

    def timed(tokens: list[int], n_logits: int) -> float:
        sync()
        start = perf_counter()
        model.forward(tokens, n_logits=n_logits)
        sync()
        return perf_counter() - start

    times: dict[int, list[float]] = {k: [] for k in ks}
    prefill, at_far, at_long = [], [], []
    for rep in range(reps + 1):
        model.reset()
        seconds = timed(ids(context), 1)
        rep_times = {}
        for k in ks:
            rep_times[k] = timed(ids(k), k if all_logits else 1)
            model.truncate(context)
        if far:
            model.forward(ids(far - context), n_logits=1)
            at_far.append(timed(ids(1), 1))
        if long:
            model.reset()
            at_long.append(timed(ids(long), 1))
        if rep > 0:  # repetition 0 is the warm-up
            prefill.append(seconds)
            for k in ks:
                times[k].append(rep_times[k])
    model.reset()
    at_far, at_long = at_far[1:], at_long[1:]
    t1 = statistics.median(times[1])
    # Longer contexts cannot be cheaper: a negative difference is timing noise.
    slope = max((statistics.median(at_far) - t1) / (far - context), 0.0) if far else 0.0
    return ModelCost(
        name=model.name, ks=ks, seconds=[statistics.median(times[k]) for k in ks], context=context, context_slope=slope,
        prefill_tokens=context, prefill_seconds=statistics.median(prefill), long_prefill_tokens=long,
        long_prefill_seconds=statistics.median(at_long) if long else 0.0, logits="all" if all_logits else "last",
    )


def measure_overheads(vocab_size: int, sampling: SamplingConfig, rows: int = 17, reps: int = 5,
                      seed: int = 0) -> Overheads:
    """Return the measured draft sampling cost per row and the verification cost per round and per row.

    Verification is timed as the engine runs it for `sd`: target logits [k, V] -> p, then `engine.verify_paths` with
    token verification of k − 1 draft tokens (other verifiers cost about the same next to the model forwards).
    """
    from verispec.engine import verify_paths
    from verispec.methods import get_method

    method = get_method("sd")

    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(rows, vocab_size, generator=gen)  # [rows, V] float32, like the adapter's output
    q_all = process_logits(logits, sampling)  # [rows, V]

    def clock(fn: Callable[[], Any]) -> float:
        runs = []
        for _ in range(reps + 1):
            start = perf_counter()
            fn()
            runs.append(perf_counter() - start)
        return statistics.median(runs[1:])

    sample_row = clock(lambda: sample(process_logits(logits[:1], sampling)[0], gen))

    def verify(k: int) -> None:
        draft = q_all[: k - 1].argmax(dim=-1)  # [k-1] tokens with q > 0
        p = process_logits(logits[:k], sampling).unsqueeze(0)  # [1, k, V]
        verify_paths(method, draft.unsqueeze(0), q_all[: k - 1].unsqueeze(0), p, gen)

    one, many = clock(lambda: verify(1)), clock(lambda: verify(rows))
    per_row = max((many - one) / (rows - 1), 0.0)
    return Overheads(sample_row=sample_row, verify_round=max(one - per_row, 0.0), verify_row=per_row)


def measure_profile(
    model_or_spec: CausalLM | str | None = None,
    role: str = "target",
    dtype: str = "float32",
    device: str = "cpu",
    linear_backend: str = DEFAULT_LINEAR_BACKEND,
    ks: Sequence[int] = DEFAULT_KS,
    context: int = 128,
    reps: int = 5,
    random_weights: bool = False,
    slope_context: int | None = None,
    sampling: SamplingConfig | None = None,
    overheads: bool = True,
    seed: int = 0,
    long_prefill: int | None = None,
) -> HardwareProfile:
    """Return a measured profile holding the `role` model (and, with `overheads`, the engine's overheads).

    `model_or_spec`: a loaded `CausalLM` (measured as it is, its own `linear_backend` recorded), or a spec that
    `load_model` (or, with `random_weights`, `random_like`) turns into one, with `linear_backend` applied. A target
    is timed with a logits row per new token (a verification pass), a draft with one (a drafting step).
    """
    if role not in ("target", "draft"):
        raise ConfigError(f"role must be 'target' or 'draft', got {role!r}")
    sampling = sampling or SamplingConfig()
    params = streamed = 0
    model = model_or_spec
    blocks = None if random_weights or not (model is None or isinstance(model, str)) else \
        gguf_blocks_file(model, role, linear_backend, device, dtype)
    if blocks is not None:  # built from its GGUF blocks, as decoding loads it: no float copy to count or pack
        params, streamed = GGUFFile(blocks).parameter_counts()
        model = load_model(model, role, dtype, device, linear_backend)
        linear_backend = model.linear_backend
    elif model is None or isinstance(model, str):
        model = _load(model, role, dtype, device, random_weights)
        params, streamed = count_params(model.model)  # before a backend packs (and hides) the weights
        linear_backend = apply_linear_backend(model, linear_backend)
    else:
        linear_backend = model.linear_backend
        if isinstance(model, HFCausalLM):  # a torch module to count
            params, streamed = count_params(model.model)
    sync = torch.cuda.synchronize if str(device).startswith("cuda") else (lambda: None)
    cost = measure_model_cost(model, ks, context, reps, role == "target", slope_context, seed, sync, long_prefill)
    cost.params, cost.streamed_params = params, streamed
    cost.dtype, cost.device, cost.linear_backend = str(dtype).removeprefix("torch."), str(device), linear_backend
    machine = machine_description(str(device))
    extra = Overheads()
    if overheads:
        extra = measure_overheads(model.vocab_size, sampling, rows=max(ks) + 1, reps=reps, seed=seed)
    where = machine.get("gpu") or f"{machine['processor']}, {machine['cpu_threads']} threads"
    kernel = model.linear_kernel
    description = (f"measured on {where}: {cost.dtype}, {device}, linear backend {kernel}, context {context}, "
                   f"{reps} reps{', random weights' if random_weights else ''}")
    return HardwareProfile({role: cost}, extra, KIND_MEASURED, description, machine,
                           {"temperature": sampling.temperature, "top_k": sampling.top_k, "top_p": sampling.top_p})


def memory_bound_profile(target: str | None = None, draft: str | None = None,
                         bytes_per_param: float = ACCEL_BYTES_PER_PARAM, **kwargs: Any) -> HardwareProfile:
    """Return `accelerator_profile` for two architectures, sized on the meta device (no weights, no memory).

    kwargs go to `accelerator_profile` (bandwidth, flops, ...); the KV bytes per cached token (the context slope)
    come from the configs.
    """
    from transformers import AutoModelForCausalLM

    sizes, kv, names = [], [], []
    for spec, role in ((target, "target"), (draft, "draft")):
        config = architecture_config(spec, role)
        with torch.device("meta"):
            sizes.append(count_params(AutoModelForCausalLM.from_config(config))[1])
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
        kv.append(2 * config.num_hidden_layers * kv_heads * head_dim * bytes_per_param)
        names.append(spec or f"default {role}")
    return accelerator_profile(sizes[0], sizes[1], bytes_per_param, kv_bytes_per_token=(kv[0], kv[1]),
                               names=(names[0], names[1]), **kwargs)


def run_profile(config: ProfileConfig) -> HardwareProfile:
    """Measure every model of `config.roles` (one at a time, to hold one in memory) and return one profile."""
    sampling = SamplingConfig(temperature=config.temperature, top_k=config.top_k, top_p=config.top_p)
    profiles = []
    for i, role in enumerate(config.roles):
        spec = config.target if role == "target" else config.draft
        profiles.append(measure_profile(
            spec, role, config.dtype, config.device, config.linear_backend, config.ks, config.context, config.reps,
            config.random_weights, config.slope_context, sampling, overheads=i == 0, seed=config.seed,
            long_prefill=config.long_prefill,
        ))
    return merge_profiles(*profiles)


def format_profile(profile: HardwareProfile) -> str:
    """Return a plain-text summary: t(k) and f(k) per model, the context slope, overheads and c."""
    roles = list(profile.models)
    ks = sorted({k for m in profile.models.values() for k in m.ks})
    lines = [profile.description, "k " + "".join(f"{role + ' ms':>14}{'f':>7}" for role in roles)]
    for k in ks:
        cells = [(m.forward_seconds(k, m.context) * 1e3, m.f(k)) for m in profile.models.values()]
        lines.append(f"{k:<2}" + "".join(f"{ms:>14.2f}{f:>7.2f}" for ms, f in cells))
    for role, m in profile.models.items():
        long = (f", {m.long_prefill_tokens} tokens {m.long_prefill_seconds * 1e3:.1f} ms" if m.long_prefill_tokens
                else "")
        lines.append(f"{role}: {m.name}; prefill {m.prefill_tokens} tokens {m.prefill_seconds * 1e3:.1f} ms{long}; "
                     f"context slope {m.context_slope * 1e6:.2f} us/token; {m.streamed_params / 1e6:.1f}M params read")
    o = profile.overheads
    lines.append(f"overheads: sample {o.sample_row * 1e3:.3f} ms/row, verify {o.verify_round * 1e3:.3f} ms/round + "
                 f"{o.verify_row * 1e3:.3f} ms/row")
    if {"target", "draft"} <= set(roles):
        c, f = cost_ratios(profile, 4)
        lines.append(f"c (draft/target 1-token cost) = {c:.3f}; f(5) = {f:.2f}")
    return "\n".join(lines)


def cmd_profile(args: argparse.Namespace) -> int:
    """Measure (or, with --memory-bound, model) a hardware profile; print it and write the JSON."""
    if args.memory_bound:
        profile = memory_bound_profile(args.target, args.draft, bytes_per_param=args.bytes_per_param,
                                       bandwidth=args.bandwidth, flops=args.flops)
    else:
        profile = run_profile(ProfileConfig(**{f.name: getattr(args, f.name) for f in fields(ProfileConfig)}))
    print(format_profile(profile))
    print(f"profile: {profile.save(args.out)}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add `verispec profile` to the `verispec` command's subparsers."""
    d = ProfileConfig()  # the defaults, read once
    p = sub.add_parser("profile", help="measure per-model forward costs t(k) on this machine: a cost-model profile")
    p.add_argument("--target", default=d.target, help="hub id, folder, config.json or .gguf (default: embedded)")
    p.add_argument("--draft", default=d.draft, help="hub id, folder, config.json or .gguf (default: embedded)")
    p.add_argument("--roles", nargs="+", choices=["target", "draft"], default=d.roles, help="(default: %(default)s)")
    p.add_argument("--dtype", default=d.dtype, help="float32 | bfloat16 | float16 | float64 (default: %(default)s)")
    p.add_argument("--device", default=d.device, help="torch device (default: %(default)s)")
    p.add_argument("--linear-backend", default=d.linear_backend, choices=LINEAR_BACKENDS,
                   help="CPU linear kernels (default: %(default)s)")
    p.add_argument("--random-weights", action="store_true", default=d.random_weights,
                   help="random weights of the same architecture (runs without weight files)")
    p.add_argument("--ks", nargs="+", type=int, default=d.ks, help="new tokens per forward (default: %(default)s)")
    p.add_argument("--context", type=int, default=d.context, help="cached tokens (default: %(default)s)")
    p.add_argument("--slope-context", type=int, default=d.slope_context,
                   help="longer context for the slope; 0 = skip (default: 2 x context)")
    p.add_argument("--long-prefill", type=int, default=d.long_prefill,
                   help="a second, longer prompt forward for long-prompt prefill; 0 = skip (default: 4 x context)")
    p.add_argument("--reps", type=int, default=d.reps, help="timed repetitions (default: %(default)s)")
    p.add_argument("--temperature", type=float, default=d.temperature, help="overheads' sampling (default: greedy)")
    p.add_argument("--top-k", type=int, default=d.top_k, help="(default: %(default)s)")
    p.add_argument("--top-p", type=float, default=d.top_p, help="(default: %(default)s)")
    p.add_argument("--seed", type=int, default=d.seed, help="(default: %(default)s)")
    g = p.add_argument_group("modelled memory-bound accelerator (times nothing)")
    g.add_argument("--memory-bound", action="store_true", help="write accelerator_profile for the two architectures")
    g.add_argument("--bytes-per-param", type=float, default=ACCEL_BYTES_PER_PARAM, help="(default: %(default)s)")
    g.add_argument("--bandwidth", type=float, default=ACCEL_BANDWIDTH, help="bytes/s (default: %(default)s, H200)")
    g.add_argument("--flops", type=float, default=ACCEL_FLOPS, help="for prompt forwards (default: %(default)s)")
    p.add_argument("--out", default="results/profile.json", help="profile JSON to write (default: %(default)s)")
    p.set_defaults(func=cmd_profile)
