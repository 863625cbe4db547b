"""Verifiers compared on the same drafted blocks: the exact E[τ] of each one, paired, without decoding noise.

End-to-end block efficiency (tokens per target call of a decode) compares two verifiers through two different
texts: each method samples its own continuation, so the gap between two lossless verifiers mixes how much they
accept with which contexts they happened to reach. Here every verifier sees the same drafted paths at the same
contexts, and each one's expected number of accepted tokens given those paths is computed exactly from its law
(`Method.expected_accepted`): only the draw of the paths is random, and it is shared, so the comparison is paired.

The contexts are points along the target's own sampled continuation of each prompt (decoded with BV, which is
lossless, so they follow the target's law): positions 0, stride, 2·stride, ... of that continuation. At each
context `draws` i.i.d. draft paths of the longest γ are drawn in one batched pass per depth, and the target scores
their prefix tree in one pass. The γ-block of a path is its first γ tokens, so every γ reuses the same draws.
A single-path verifier's E[τ] at a context is the mean over the `draws` paths taken one at a time; a K-path
verifier's, the mean over the draws // K disjoint groups of K paths. Block efficiency = 1 + E[τ] (docs/algorithms.md
§0), averaged over contexts; intervals are 95% bootstrap intervals over prompts (paired for the ratios).
"""

from __future__ import annotations

import json
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from verispec.api import Decoder
from verispec.bench.files import check_writable, write_atomically
from verispec.bench.tables import with_ci
from verispec.drafting import draft_paths
from verispec.engine import DecodeConfig, score_block
from verispec.errors import ConfigError
from verispec.methods import get_method
from verispec.models.spec import ModelSpec, flat_dict
from verispec.prompt_sets import Prompt, load_prompts
from verispec.provenance import provenance
from verispec.sampling import SamplingConfig
from verispec.stats import bootstrap_ratio

SCHEMA = "verispec.fixed-blocks/1"
DEFAULT_OUT = "results/fixed_blocks.json"
TRAJECTORY_METHOD, TRAJECTORY_GAMMA = "bv", 4  # lossless: the contexts follow the target's law
# The path draws of prompt i use seed + i + DRAW_SEED_OFFSET, so they never replay the stream that decoded the
# trajectory (seed + i), which would make the drafted paths depend on the context in a way the target's law does not.
DRAW_SEED_OFFSET = 1_000_003


@dataclass
class FixedBlocksConfig:
    """Settings of `verispec fixed-blocks`; the CLI reads its defaults from here."""

    prompts: str = "builtin"  # prompt source, as for `verispec bench`
    category: list[str] | None = None  # keep only these categories; None = all
    limit: int | None = None  # how many prompts (after the category filter, shuffle and offset); None = all
    offset: int = 0  # skip this many prompts first
    subset_seed: int | None = None  # shuffle the prompts with this seed before offset/limit; None = file order
    methods: list[str] = field(default_factory=lambda: ["sd", "bv", "gbv", "specinfer", "spectr", "nss"])
    gammas: list[int] = field(default_factory=lambda: [4, 8])  # block lengths (a γ-block is a prefix of the longest)
    paths: list[int] = field(default_factory=lambda: [2, 3, 4])  # K of the multi-path methods
    draws: int = 12  # i.i.d. draft paths per context; a multiple of every K
    contexts: int = 4  # contexts per prompt, `stride` tokens apart along the target's continuation
    stride: int = 32  # tokens between contexts
    temperature: float = 1.0  # at 0 every lossless verifier accepts the same (point masses), so not the default
    top_k: int = SamplingConfig.top_k
    top_p: float = SamplingConfig.top_p
    seed: int = 0  # prompt i's trajectory is decoded with seed + i; its draws use seed + i + DRAW_SEED_OFFSET
    chat_template: bool = True
    # the pair and how it runs (default: the embedded pair); in the results file its fields sit at the top level
    # of `config` (`verispec.models.spec.flat_dict`)
    models: ModelSpec = field(default_factory=ModelSpec)
    bootstrap_resamples: int = 2000
    bootstrap_seed: int = 0

    def __post_init__(self) -> None:
        self.sampling()  # validates temperature, top_k, top_p
        for name in ("draws", "contexts", "stride"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be an integer >= 1, got {value!r}")
        for name in ("gammas", "paths"):
            values = getattr(self, name)
            if not values or any(not isinstance(v, int) or isinstance(v, bool) or v < 1 for v in values):
                raise ConfigError(f"{name} must be a non-empty list of integers >= 1, got {values!r}")
        if not self.methods or len(set(self.methods)) != len(self.methods):
            raise ConfigError(f"methods must be a non-empty list without repeats, got {self.methods!r}")
        for name in self.methods:
            if get_method(name).expected_accepted is None:
                raise ConfigError(f"method {name!r} has no exact per-block law to compare (it drafts no block, or "
                                  "decides its length while drafting); choose among lossless speculative verifiers")
        if self.multipath_methods():
            if bad := [k for k in self.paths if self.draws % k]:
                raise ConfigError(f"draws ({self.draws}) must be a multiple of every K in paths; not of {bad}")

    def sampling(self) -> SamplingConfig:
        """Return the sampling settings of both models."""
        return SamplingConfig(temperature=self.temperature, top_k=self.top_k, top_p=self.top_p)

    def multipath_methods(self) -> list[str]:
        """Return the methods that verify K paths."""
        return [name for name in self.methods if get_method(name).multipath]

    def labels(self) -> list[tuple[str, str, int, int]]:
        """Return (label, method, γ, K) of every compared configuration, labelled as `verispec bench` does."""
        out = []
        for gamma in self.gammas:
            for name in self.methods:
                for k in self.paths if get_method(name).multipath else [1]:
                    label = f"{name}:paths={k},gamma={gamma}" if get_method(name).multipath else f"{name}:gamma={gamma}"
                    out.append((label, name, gamma, k))
        return out


def context_rows(
    target: Any, draft: Any, context: list[int], config: FixedBlocksConfig, generator: torch.Generator,
    eos_token_ids: frozenset[int],
) -> tuple[list[dict[str, Any]], int]:
    """Draw `config.draws` draft paths after `context`, score their tree with the target, and return (one row per
    compared configuration: E[τ] averaged over the paths or path groups, and the seconds its exact computation took
    per path or group;
    the drafted length, shorter than the longest γ only when every path reached an EOS).

    Both caches must hold a prefix of `context` shorter than it; they are left holding context[:-1].
    """
    sampling = config.sampling()
    block = draft_paths(draft, context, config.draws, max(config.gammas), sampling, generator, eos_token_ids,
                        target.vocab_size)
    p = score_block(target, context, block, sampling).p  # [M, γ'+1, V]
    tokens, q = block.as_tensor(), block.q  # [M, γ'], [M, γ', V]
    rows = []
    for label, name, gamma, k in config.labels():
        g = min(gamma, block.length)
        method, values = get_method(name), []
        start = time.perf_counter()
        for j in range(config.draws // k):
            group = slice(j * k, (j + 1) * k) if method.multipath else j
            values.append(method.expected_accepted(tokens[group, :g], q[group, :g], p[group, : g + 1]))
        seconds = (time.perf_counter() - start) / len(values)
        rows.append({"label": label, "method": name, "gamma": gamma, "paths": k, "drafted": g,
                     "expected_accepted": sum(values) / len(values), "groups": len(values),
                     "law_seconds": seconds})
    for model in (draft, target):
        model.truncate(len(context) - 1)
    return rows, block.length


def context_positions(generated: int, stopped_at_eos: bool, config: FixedBlocksConfig) -> list[int]:
    """Return the positions in the continuation where contexts end: 0, stride, ... while a next token exists
    (not past the end of the continuation, and not after its EOS)."""
    last = generated - 1 if stopped_at_eos else generated
    return [c * config.stride for c in range(config.contexts) if c * config.stride <= last]


def run_fixed_blocks(
    config: FixedBlocksConfig,
    out_path: str | Path | None = DEFAULT_OUT,
    progress: bool = True,
    decoder: Decoder | None = None,
    prompts: list[Prompt] | None = None,
) -> dict[str, Any]:
    """Compare the verifiers of `config` on the same drafted blocks; return the results (config, contexts, rows,
    summary) and write them to `out_path` (None: don't) after each prompt. `decoder` and `prompts` override the
    models and prompts the config names."""
    from tqdm import tqdm

    if out_path is not None:
        check_writable(out_path)  # before the models load, not after the measurements
    if prompts is None:
        prompts = load_prompts(config.prompts, config.category, config.limit, config.subset_seed, config.offset)
    if decoder is None:
        decoder = Decoder(config.models)
    target, draft = decoder.model("target"), decoder.model("draft")
    eos = frozenset(decoder.eos_token_ids("target"))
    origin = provenance(config.models.device)
    started, start = time.strftime("%Y-%m-%dT%H:%M:%S"), time.perf_counter()
    contexts: list[dict[str, Any]] = []
    rows: list[dict[str, Any]] = []

    def result() -> dict[str, Any]:
        return {"schema": SCHEMA, "config": flat_dict(config), **origin, "started": started,
                "wall_seconds": time.perf_counter() - start, "contexts": contexts, "rows": rows,
                "summary": summarize_fixed_blocks(rows, config)}

    longest = (config.contexts - 1) * config.stride + 1  # tokens the trajectory needs to reach the last context
    for index, prompt in enumerate(tqdm(prompts, desc="fixed-blocks", unit="prompt", disable=not progress)):
        prompt_ids = decoder.encode_prompt(prompt.text, config.chat_template)
        trajectory_config = DecodeConfig(method=TRAJECTORY_METHOD, gamma=TRAJECTORY_GAMMA, sampling=config.sampling(),
                                         max_new_tokens=longest, seed=config.seed + index)
        trajectory = decoder.generate(prompt.text, trajectory_config, chat_template=config.chat_template)
        generator = torch.Generator().manual_seed(config.seed + index + DRAW_SEED_OFFSET)
        draft.reset()
        target.reset()
        for position in context_positions(len(trajectory.tokens), trajectory.stopped_at_eos, config):
            context = prompt_ids + trajectory.tokens[:position]
            context_start = time.perf_counter()
            found, drafted = context_rows(target, draft, context, config, generator, eos)
            where = {"prompt_index": index, "prompt_id": prompt.id, "category": prompt.category,
                     "position": position}
            contexts.append({**where, "context_tokens": len(context), "drafted": drafted,
                             "seconds": time.perf_counter() - context_start})
            rows.extend({**where, **row} for row in found)
        if out_path is not None:
            write_json(out_path, result())
    out = result()
    if out_path is not None:
        write_json(out_path, out)
    return out


def write_json(path: str | Path, payload: dict[str, Any]) -> None:
    """Write `payload` to `path` as indented JSON, atomically (`files.write_atomically`)."""
    write_atomically(Path(path), json.dumps(payload, indent=1) + "\n")


def summarize_fixed_blocks(rows: Sequence[dict[str, Any]], config: FixedBlocksConfig) -> list[dict[str, Any]]:
    """Return one row per compared configuration: contexts, E[τ], block efficiency with its 95% interval over
    prompts, the paired ratios of block efficiency against `sd` and against `bv` at the same γ (when they ran),
    and the milliseconds per round that computing E[τ] took (the verifier's arithmetic on the drafted tree: every
    node for the tree walks, where their samplers visit one path; the softmax over the vocabulary is not in it)."""
    # per_prompt[label][prompt] = [Σ over its contexts of 1 + E[τ], number of contexts]
    per_prompt: dict[str, dict[int, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0]))
    law: dict[str, list[float]] = defaultdict(list)
    for row in rows:
        cell = per_prompt[row["label"]][row["prompt_index"]]
        cell[0] += 1.0 + row["expected_accepted"]
        cell[1] += 1
        law[row["label"]].append(row["law_seconds"])
    resamples, seed = config.bootstrap_resamples, config.bootstrap_seed
    summary = []
    for label, name, gamma, k in config.labels():
        cells = per_prompt.get(label)
        if not cells:
            continue
        n = sum(c[1] for c in cells.values())
        efficiency = sum(c[0] for c in cells.values()) / n
        entry: dict[str, Any] = {
            "label": label, "method": name, "gamma": gamma, "paths": k, "prompts": len(cells), "contexts": n,
            "expected_accepted": efficiency - 1.0, "block_efficiency": efficiency,
            "block_efficiency_ci95": bootstrap_ratio([tuple(c) for c in cells.values()], resamples, seed),
            "law_ms_per_round": 1e3 * sum(law[label]) / len(law[label]),
        }
        for reference in ("sd", "bv"):
            base = per_prompt.get(f"{reference}:gamma={gamma}")
            key = f"vs_{reference}"
            if base is None or set(base) != set(cells):
                entry[key], entry[f"{key}_ci95"] = None, None
                continue
            pairs = [(cells[i][0], base[i][0]) for i in sorted(cells)]
            entry[key] = sum(a for a, _ in pairs) / sum(b for _, b in pairs)
            entry[f"{key}_ci95"] = bootstrap_ratio(pairs, resamples, seed)
        summary.append(entry)
    return summary


def render_fixed_blocks(results: dict[str, Any]) -> str:
    """Return the summary of a fixed-blocks results dict as a markdown table."""
    contexts = results["contexts"]
    prompts = len({c["prompt_index"] for c in contexts})
    lines = [
        f"{prompts} prompts, {len(contexts)} contexts, {results['config']['draws']} drafted paths per context, "
        f"temperature {results['config']['temperature']}",
        "",
        "| method | γ | K | E[τ] | block efficiency [95% CI] | vs sd, same γ [95% CI] | vs bv, same γ [95% CI] "
        "| E[τ] computed in ms per round |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in results["summary"]:
        lines.append(
            f"| {row['method']} | {row['gamma']} | {row['paths']} | {row['expected_accepted']:.3f} "
            f"| {with_ci(row, 'block_efficiency', '.3f')} | {with_ci(row, 'vs_sd', '.3f')} "
            f"| {with_ci(row, 'vs_bv', '.3f')} "
            f"| {row['law_ms_per_round']:.1f} |"
        )
    return "\n".join(lines) + "\n"
