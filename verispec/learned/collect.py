"""Training data for SPRINTER's verifier (docs/algorithms.md §3.2): one row per drafted token, labelled by the target.

Per prompt the trajectory follows §3.2: the draft proposes x ~ q(·|ctx); the row records the draft's hidden state
that produced q, x, q(x), p(x), H(q), TV(p, q), the position in the run and the label 1{q(x) ≤ λ·p(x)}; the
trajectory continues with x if the label is 1, else with a token sampled from the target's p (its greedy token at
temperature 0). The position restarts at 1 after a label 0 or after `cap` tokens, as runs do with a perfect
verifier. Collection drafts `block` tokens ahead and labels them with one target pass, cutting at the first
label 0: the same trajectory law as one step at a time, with fewer target calls.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch

from verispec.drafters import DraftRequest, ModelDrafter
from verispec.errors import ConfigError, IncompatibleModelsError, VerifierFileError
from verispec.learned.verifier import entropy
from verispec.models.protocol import CausalLM
from verispec.models.spec import ModelSpec, flat_dict
from verispec.sampling import SamplingConfig, sample
from verispec.scoring import roll_back, score_block

DATA_FORMAT = "verispec-verifier-data"


@dataclass
class VerifierData:
    """Rows of drafted tokens (N rows, draft hidden size H) and the manifest describing how they were made."""

    hidden: torch.Tensor  # [N, H] float32, draft last-layer state at the last context position (produced q)
    token: torch.Tensor  # [N] long, the drafted token x
    q_x: torch.Tensor  # [N] float64, q(x) under the processed draft law
    p_x: torch.Tensor  # [N] float64, p(x) under the processed target law
    q_entropy: torch.Tensor  # [N] float64, entropy of the processed q (nats)
    tv: torch.Tensor  # [N] float64, TV(p, q) at this position
    position: torch.Tensor  # [N] long, 1-based position in the run
    label: torch.Tensor  # [N] long, 1{q(x) <= λ p(x)} with the manifest's λ
    committed: torch.Tensor  # [N] long, the token the trajectory continued with (x, or the target's token)
    temperature: torch.Tensor  # [N] float32, the sampling temperature
    prompt_id: torch.Tensor  # [N] long, index of the prompt (validation splits by it)
    step: torch.Tensor  # [N] long, index of the row within its prompt's trajectory
    manifest: dict[str, Any]

    def __len__(self) -> int:
        return self.token.shape[0]

    @property
    def hidden_size(self) -> int:
        """Return H."""
        return self.hidden.shape[1]

    def labels(self, lam: float | None = None) -> torch.Tensor:
        """Return labels `[N]` float64: stored ones, or recomputed as q(x) ≤ λ·p(x) for another λ."""
        if lam is None:
            return self.label.to(torch.float64)
        return (self.q_x <= lam * self.p_x).to(torch.float64)

    def tensors(self) -> dict[str, torch.Tensor]:
        """Return the row tensors by field name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.name != "manifest"}

    def subset(self, rows: torch.Tensor) -> VerifierData:
        """Return the rows selected by a boolean mask or an index tensor, with the same manifest."""
        return VerifierData(**{k: v[rows] for k, v in self.tensors().items()}, manifest=dict(self.manifest))

    @staticmethod
    def concat(parts: list[VerifierData]) -> VerifierData:
        """Return the rows of several data sets (same draft hidden size); prompt ids are renumbered apart."""
        if len({p.hidden_size for p in parts}) != 1:
            raise ConfigError(f"cannot join data of different hidden sizes {sorted({p.hidden_size for p in parts})}")
        if len(parts) == 1:
            return parts[0]
        out, offset = {}, 0
        for part in parts:
            tensors = part.tensors()
            tensors["prompt_id"] = tensors["prompt_id"] + offset
            offset = int(tensors["prompt_id"].max()) + 1 if len(part) else offset
            for key, value in tensors.items():
                out.setdefault(key, []).append(value)
        manifest = {"joined": [p.manifest for p in parts], **{k: parts[0].manifest.get(k) for k in MODEL_KEYS}}
        return VerifierData(**{k: torch.cat(v) for k, v in out.items()}, manifest=manifest)


MODEL_KEYS = ("draft_model", "target_model", "hidden_size", "lam")


class _Rows:
    """Accumulates the per-row values of one collection."""

    def __init__(self) -> None:
        self.values: dict[str, list] = {f.name: [] for f in fields(VerifierData) if f.name != "manifest"}

    def add(self, **row: Any) -> None:
        for key, value in row.items():
            self.values[key].append(value)

    def build(self, manifest: dict[str, Any], hidden_size: int) -> VerifierData:
        v = self.values
        floats = {"q_x", "p_x", "q_entropy", "tv"}
        out: dict[str, torch.Tensor] = {
            "hidden": torch.stack(v["hidden"]).float() if v["hidden"] else torch.zeros(0, hidden_size),
            "temperature": torch.tensor(v["temperature"], dtype=torch.float32),
        }
        for key in v.keys() - out.keys():
            out[key] = torch.tensor(v[key], dtype=torch.float64 if key in floats else torch.long)
        return VerifierData(**out, manifest=manifest)


def collect(
    draft: CausalLM,
    target: CausalLM,
    prompts: list[list[int]],
    steps: int,
    lam: float = 1.0,
    sampling: SamplingConfig | None = None,
    seed: int = 0,
    progress: bool = False,
    cap: int = 20,
    block: int = 8,
    eos_ids: set[int] | None = None,
) -> VerifierData:
    """Return the verifier training rows of up to `steps` drafted tokens per prompt (fewer if EOS is committed).

    prompts: token ids; lam: λ of the labels; sampling: applied to both models (as in decoding); seed: of the one
    torch.Generator used for every draw; cap: runs restart at position 1 after this many tokens; block: tokens
    drafted ahead per target pass (a speed knob only).
    """
    sampling = sampling or SamplingConfig()
    if draft.vocab_size != target.vocab_size:
        raise IncompatibleModelsError(f"draft {draft.name!r} and target {target.name!r} have different vocabulary "
                                      f"sizes ({draft.vocab_size} vs {target.vocab_size})")
    if steps < 1 or cap < 1 or block < 1 or lam <= 0:
        raise ConfigError(f"need steps, cap, block >= 1 and lam > 0; got {steps}, {cap}, {block}, {lam}")
    if not prompts or any(len(p) == 0 for p in prompts):
        raise ConfigError("collect needs at least one prompt, and every prompt needs at least one token")
    generator = torch.Generator().manual_seed(seed)
    rows = _Rows()
    hidden_size = 0
    iterator: Any = enumerate(prompts)
    if progress:
        from tqdm import tqdm

        iterator = tqdm(iterator, total=len(prompts), desc="collect", unit="prompt")
    for prompt_id, prompt in iterator:
        hidden_size = _trajectory(draft, target, list(prompt), prompt_id, steps, lam, sampling, generator, cap,
                                  block, eos_ids or set(), rows)
    labels = rows.values["label"]
    manifest = {
        "format": DATA_FORMAT,
        "draft_model": draft.name,
        "target_model": target.name,
        "hidden_size": hidden_size,
        "vocab_size": draft.vocab_size,
        "lam": lam,
        "steps": steps,
        "cap": cap,
        "block": block,
        "seed": seed,
        "sampling": asdict(sampling),
        "prompts": len(prompts),
        "rows": len(labels),
        "positives": int(sum(labels)),
    }
    return rows.build(manifest, hidden_size)


def _trajectory(
    draft: CausalLM,
    target: CausalLM,
    seq: list[int],
    prompt_id: int,
    steps: int,
    lam: float,
    sampling: SamplingConfig,
    generator: torch.Generator,
    cap: int,
    block: int,
    eos_ids: set[int],
    rows: _Rows,
) -> int:
    """Append one prompt's rows to `rows`; return the draft hidden size.

    Each step is a decode round built from the engine's pieces: the model drafter proposes a run, `score_block`
    gives p over it in one target pass, and `roll_back` returns both caches to the committed tokens. A run whose
    every token is labelled 1 commits them all; its last token then plays the round's extra token (fed next)."""
    draft.reset()
    target.reset()
    drafter = ModelDrafter(draft)
    position, done, hidden_size = 1, 0, 0
    while done < steps:
        k = min(block, steps - done)
        base = len(seq)
        # 1. draft k tokens ahead from q, keeping the state that produced each q. No EOS ids: drafting goes on
        # past an EOS, so the draws are those of drafting the whole run whatever the labels turn out to be.
        run = drafter.propose(DraftRequest(seq, 1, k, sampling, generator, frozenset(), target.vocab_size,
                                           keep_hidden=True))
        # 2. one target pass: p(·|seq + x_<i) for i = 1..k+1
        scored = score_block(target, seq, run, sampling)
        p, qs, xs = scored.p[0], run.q[0], run.tokens[0]  # [k+1, V], [k, V], [k]
        hidden_size = int(run.hiddens[0].shape[-1])
        accepted, committed, finished = k - 1, xs[-1], False
        for i, x in enumerate(xs):  # 3. label each token; the trajectory leaves the draft at the first label 0
            q_x, p_x = float(qs[i][x]), float(p[i][x])
            label = q_x <= lam * p_x
            committed = x if label else sample(p[i], generator)
            rows.add(hidden=run.hiddens[i], token=x, q_x=q_x, p_x=p_x, q_entropy=float(entropy(qs[i])),
                     tv=0.5 * float((p[i] - qs[i]).abs().sum()), position=position, label=int(label),
                     committed=committed, temperature=sampling.temperature, prompt_id=prompt_id, step=done)
            done += 1
            position = position + 1 if label and position < cap else 1
            finished = committed in eos_ids
            if not label or finished:
                accepted = i
                break
        seq += xs[:accepted] + [committed]
        if finished:
            break
        # 4. roll both caches back to the committed tokens before the last one, which the next round feeds
        roll_back(target, draft, base, scored, 0, accepted)
    return hidden_size


def save_dataset(path: str | Path, data: VerifierData, manifest: dict[str, Any] | None = None) -> Path:
    """Write the rows as safetensors (manifest embedded) plus a readable `<path>.json` copy; return the path.

    `manifest` entries are merged over `data.manifest` (e.g. the prompt source, added by the CLI)."""
    from safetensors.torch import save_file

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    merged = {**data.manifest, **(manifest or {}), "format": DATA_FORMAT, "rows": len(data)}
    save_file({k: v.contiguous() for k, v in data.tensors().items()}, str(path),
              metadata={"manifest": json.dumps(merged)})
    path.with_suffix(path.suffix + ".json").write_text(json.dumps(merged, indent=2) + "\n")
    return path


def load_dataset(path: str | Path) -> VerifierData:
    """Return the rows saved by `save_dataset`; raise VerifierFileError if the file is missing or not one."""
    from safetensors import safe_open

    path = Path(path)
    if not path.is_file():
        raise VerifierFileError(f"verifier data file not found: {path}")
    try:
        with safe_open(str(path), framework="pt") as handle:
            header = handle.metadata() or {}
            tensors = {key: handle.get_tensor(key) for key in handle.keys()}
    except Exception as exc:  # safetensors raises its own error types for damaged files
        raise VerifierFileError(f"verifier data file {path} is not a readable safetensors file: {exc}") from exc
    if "manifest" not in header:
        raise VerifierFileError(f"{path} is not verispec verifier data (no manifest)")
    try:
        manifest = json.loads(header["manifest"])
    except ValueError as exc:
        raise VerifierFileError(f"{path} has an unreadable manifest: {exc}") from exc
    missing = [f.name for f in fields(VerifierData) if f.name != "manifest" and f.name not in tensors]
    if missing or not isinstance(manifest, dict) or manifest.get("format") != DATA_FORMAT:
        raise VerifierFileError(f"{path} is not verispec verifier data (missing {missing or 'the format tag'})")
    return VerifierData(**{f.name: tensors[f.name] for f in fields(VerifierData) if f.name != "manifest"},
                        manifest=manifest)


@dataclass
class CollectConfig:
    """`verispec verifier collect`: models, training prompts (never the evaluation prompts), and settings."""

    # the pair (default: the embedded pair) and how it runs; its verifier is unused (collecting makes one's data)
    models: ModelSpec = field(default_factory=ModelSpec)
    prompts: str = "builtin"  # a `verispec.prompt_sets.load_prompts` source
    category: list[str] | None = None  # keep only these categories
    limit: int | None = None  # number of prompts (None: all)
    offset: int = 0  # skip this many prompts first
    subset_seed: int | None = None  # shuffle the prompts with this seed before offset/limit
    chat_template: bool = True  # encode prompts through the tokenizer's chat template
    steps: int = 20  # drafted tokens per prompt (the released code: 20)
    lam: float = 1.0  # λ of the labels q(x) <= λ p(x) (released code 1, the paper 1.2)
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int = 0
    cap: int = 20  # run positions restart after this many tokens (SPRINTER's cap)
    block: int = 8  # tokens drafted ahead per target pass (speed only)


def collect_from_config(config: CollectConfig, out: str | Path, progress: bool = True) -> VerifierData:
    """Load the models and prompts named by `config`, collect, save to `out`; return the rows."""
    from verispec.models.pair import check_compatible, encode_prompt, eos_token_ids
    from verispec.prompt_sets import load_prompts

    target, draft = config.models.load("target"), config.models.load("draft")
    check_compatible(target, draft)
    prompts = load_prompts(config.prompts, category=config.category, limit=config.limit, seed=config.subset_seed,
                           offset=config.offset)
    ids = [encode_prompt(target.tokenizer, p.text, config.chat_template) for p in prompts]
    sampling = SamplingConfig(temperature=config.temperature, top_k=config.top_k, top_p=config.top_p)
    data = collect(draft, target, ids, config.steps, config.lam, sampling, config.seed, progress, config.cap,
                   config.block, eos_token_ids(target))
    save_dataset(out, data, {"config": flat_dict(config), "prompt_ids": [p.id for p in prompts],
                             "prompt_fingerprints": [prompt_fingerprint(p.text) for p in prompts]})
    return data


def prompt_fingerprint(text: str) -> str:
    """Return a short stable fingerprint (sha256 prefix) of a prompt's text: verifier files record those of their
    training prompts, so a benchmark can refuse to evaluate on them whatever file or id the prompts come from."""
    import hashlib

    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def training_fingerprints(manifest: dict[str, Any]) -> list[str] | None:
    """Return the training-prompt fingerprints a data manifest (or a join of several) records; None when any
    part predates them (then nothing can be checked)."""
    parts = manifest.get("joined") or [manifest]
    if any("prompt_fingerprints" not in part for part in parts):
        return None
    return sorted({f for part in parts for f in part["prompt_fingerprints"]})
