"""A cost model: price a decode's recorded counts with a hardware profile to predict its wall time per token.

docs/algorithms.md §3.4 writes SD latency per token as [γ·c_q + c_p] / E[N]. Here every count a trace records is priced
on its own, so one model covers every method (multi-path trees, SPRINTER's variable runs, transformers' peers):

    time = Σ_target forwards t_p(k, L) + Σ_draft forwards t_q(k, L)                  (k new tokens, L cached ones)
         + Σ_rounds [verify_round + verify_row · (nodes + 1) + other_round] + sample_row · (drafted rows)

t(k, L) is a measured curve t(k) at the profile's context L0, plus `context_slope` · (L − L0) for attention over
a longer cache; beyond the curve's largest k it interpolates towards a measured prompt forward (`prefill`). Longer
prompt forwards cost k · u(k), with the cost per prompt token u linear in k through that point and a second, longer
one (`long_prefill`): attention over the prompt makes each token dearer as the prompt grows. Without the second
point u stays constant.
f(k) = t(k) / t(1) is the curve's shape: on a CPU it grows with k; on a memory-bound accelerator f(k) = 1 for small
k, since a forward's time is dominated by reading the weights once (`accelerator_profile`).

Which forwards a trace implies (verispec.engine, verispec.drafting): round r's target pass feeds `fed` tokens
after `committed − (fed − nodes)` cached ones. A round whose draft model drafted d tokens on K paths makes d draft
forwards: one feeding the committed tokens the draft cache lacks (the prompt in round 0, then 1 or 2 tokens, more
after rounds it sat out), then d − 1 feeding K tokens each; the first forwards' sizes are recovered from the trace's
`draft_tokens` total. Rounds proposed by another drafter (prompt lookup: `RoundTrace.drafter`) run no draft model.
"""

from __future__ import annotations

import json
from bisect import bisect_left
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from verispec.errors import ConfigError
from verispec.stats import default_baseline, speedup_of_totals

SCHEMA = "verispec.profile/1"
KIND_MEASURED = "measured"  # timed on a machine by `verispec profile`
KIND_MODELLED = "modelled"  # built from model sizes and nominal hardware numbers (`accelerator_profile`)
# accelerator_profile's defaults: bf16 weights on an H200 (nominal HBM bandwidth, dense bf16 throughput).
ACCEL_BYTES_PER_PARAM = 2.0
ACCEL_BANDWIDTH = 4.8e12  # bytes/s
ACCEL_FLOPS = 989e12  # FLOP/s


@dataclass
class ModelCost:
    """The cost of one model's forward pass over k new tokens, as measured (or modelled) on one machine."""

    name: str  # the model (hub id, folder, or "random:<arch>" for random weights of that architecture)
    ks: list[int]  # new tokens per forward, ascending, starting at 1
    seconds: list[float]  # t(k): median seconds of a forward over ks[i] new tokens after `context` cached ones
    context: int  # cached tokens before each forward of the curve (L0)
    context_slope: float = 0.0  # extra seconds per forward per cached token beyond `context` (attention, KV reads)
    prefill_tokens: int = 0  # a prompt forward of this many tokens on an empty cache was measured (0 = none)
    prefill_seconds: float = 0.0  # its median seconds
    long_prefill_tokens: int = 0  # a longer prompt forward on an empty cache was measured (0 = none)
    long_prefill_seconds: float = 0.0  # its median seconds
    params: int = 0  # parameter count
    streamed_params: int = 0  # parameters one forward reads: all but an untied input-embedding table (one row)
    dtype: str = "float32"  # weights' dtype when measured
    device: str = "cpu"  # torch device when measured
    linear_backend: str = "torch"  # CPU linear kernels when measured (verispec.models.fastpath)
    logits: str = "all"  # "all": the forward computed logits for every new token (a target pass); "last": one row

    def __post_init__(self) -> None:
        if not self.ks or self.ks[0] != 1 or sorted(set(self.ks)) != list(self.ks):
            raise ConfigError(f"{self.name}: ks must be ascending, distinct and start at 1, got {self.ks}")
        if len(self.seconds) != len(self.ks) or min(self.seconds) <= 0:
            raise ConfigError(f"{self.name}: need one positive time per k, got {self.seconds} for ks {self.ks}")

    def forward_seconds(self, k: float, context: float) -> float:
        """Return the modelled seconds of a forward over `k` new tokens after `context` cached ones."""
        if k < 1:
            raise ConfigError(f"a forward feeds at least one token, got {k}")
        shift = self.context_slope * (context - self.context)
        k_max, t_max = self.ks[-1], self.seconds[-1]
        if k <= k_max:  # piecewise linear between the measured ks
            i = bisect_left(self.ks, k)
            if self.ks[i] == k:
                return self.seconds[i] + shift
            k0, k1, t0, t1 = self.ks[i - 1], self.ks[i], self.seconds[i - 1], self.seconds[i]
            return t0 + (t1 - t0) * (k - k0) / (k1 - k0) + shift
        if self.prefill_tokens > k_max:
            # Between the curve's end and the prompt forward: linear in k. The prompt forward was measured on an
            # empty cache, so its own context term is slope · L (not slope · (L − L0)).
            end = self.prefill_seconds + self.context_slope * context
            if k <= self.prefill_tokens:
                return t_max + shift + (end - t_max - shift) * (k - k_max) / (self.prefill_tokens - k_max)
            if self.long_prefill_tokens > self.prefill_tokens:
                return k * self._prompt_token_seconds(k) + self.context_slope * context
            return end * k / self.prefill_tokens  # longer prompts: compute-bound, proportional to k
        return (t_max + shift) * k / k_max

    def _prompt_token_seconds(self, k: float) -> float:
        """Return u(k), the cost per token of a k-token prompt forward: linear through the two prompt points."""
        n1, n2 = self.prefill_tokens, self.long_prefill_tokens
        u1, u2 = self.prefill_seconds / n1, self.long_prefill_seconds / n2
        if k > n2 and u2 < u1:
            return u2  # a cheaper token at the longer point is GEMM efficiency, not a trend to extrapolate
        return u1 + (u2 - u1) * (k - n1) / (n2 - n1)

    def f(self, k: float) -> float:
        """Return f(k) = t(k) / t(1) at the profile's context: the cost of a k-token forward in 1-token forwards."""
        return self.forward_seconds(k, self.context) / self.forward_seconds(1, self.context)


@dataclass
class Overheads:
    """Per-round and per-row costs outside the model forwards (CPU work in verispec's engine)."""

    sample_row: float = 0.0  # seconds to turn one draft logits row into q and sample a token (per path and depth)
    verify_round: float = 0.0  # fixed seconds of one verification (the rule, the extra token)
    verify_row: float = 0.0  # seconds per target row turned into p (nodes + 1 rows a round)
    other_round: float = 0.0  # bookkeeping per round (commit, rollback); `verispec profile` does not measure it


@dataclass
class HardwareProfile:
    """Model forward costs and engine overheads on one machine (or a modelled one); saved as JSON."""

    models: dict[str, ModelCost]  # by role: "target" and/or "draft"
    overheads: Overheads = field(default_factory=Overheads)
    kind: str = KIND_MEASURED  # KIND_MEASURED or KIND_MODELLED: reports label modelled profiles as such
    description: str = ""  # where and how it was obtained, for report headings
    machine: dict[str, Any] = field(default_factory=dict)  # where it was measured (provenance.machine_description)
    sampling: dict[str, Any] | None = None  # the sampling settings the overheads were measured at

    def model(self, role: str) -> ModelCost:
        """Return the cost of the `role` model, or raise ConfigError naming what the profile holds."""
        if role not in self.models:
            raise ConfigError(f"the profile has no {role} model (it holds: {', '.join(self.models) or 'none'})")
        return self.models[role]

    def to_dict(self) -> dict[str, Any]:
        """Return the profile as a JSON-able dict (with its schema tag)."""
        return {"schema": SCHEMA, **asdict(self)}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HardwareProfile:
        """Return the profile stored in `data` (as written by `to_dict`)."""
        if data.get("schema") != SCHEMA:
            raise ConfigError(f"not a verispec hardware profile (schema {data.get('schema')!r}, expected {SCHEMA!r})")
        try:
            models = {role: ModelCost(**cost) for role, cost in data["models"].items()}
            return cls(models, Overheads(**data.get("overheads", {})), data.get("kind", KIND_MEASURED),
                       data.get("description", ""), data.get("machine", {}), data.get("sampling"))
        except (KeyError, TypeError) as exc:
            raise ConfigError(f"malformed hardware profile: {exc}") from exc

    def save(self, path: str | Path) -> Path:
        """Write the profile as JSON to `path`; return the path."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1))
        return path

    @classmethod
    def load(cls, path: str | Path) -> HardwareProfile:
        """Return the profile saved at `path`."""
        try:
            return cls.from_dict(json.loads(Path(path).read_text()))
        except (OSError, json.JSONDecodeError) as exc:
            raise ConfigError(f"cannot read profile {path}: {exc}") from exc


def merge_profiles(*profiles: HardwareProfile) -> HardwareProfile:
    """Return one profile holding every model of `profiles` (later ones win); overheads etc. from the first."""
    first = profiles[0]
    models = {role: cost for p in profiles for role, cost in p.models.items()}
    return HardwareProfile(models, first.overheads, first.kind, first.description, first.machine, first.sampling)


@dataclass
class CostBreakdown:
    """Modelled seconds of one decode (or a sum of decodes), split like the trace's measured times."""

    target: float = 0.0  # target forwards (trace time_target)
    draft: float = 0.0  # draft forwards and draft sampling (trace time_draft)
    verify: float = 0.0  # turning target logits into p and verifying (trace time_verify)
    other: float = 0.0  # per-round bookkeeping (trace time_other)

    @property
    def total(self) -> float:
        """Return the modelled wall time in seconds."""
        return self.target + self.draft + self.verify + self.other


def _as_dict(trace: Any) -> dict[str, Any]:
    return trace if isinstance(trace, dict) else trace.to_dict()


def _draft_forwards(trace: dict[str, Any], commits: list[int]) -> list[tuple[float, float]]:
    """Return (new tokens, cached tokens) of every draft forward a speculative trace implies (module docstring)."""
    rounds = [(i, r) for i, r in enumerate(trace["rounds"]) if r["drafted"] > 0 and drafted_by_model(r)]
    if not rounds:
        return []
    later = [(r.get("paths", 1), commits[i]) for i, r in rounds for _ in range(r["drafted"] - 1)]
    first_total = trace.get("draft_tokens", 0) - sum(k for k, _ in later)
    prefill = trace.get("prefill_tokens", 0)
    n_rest = len(rounds) - 1
    if rounds[0][0] == 0 and prefill > 0 and first_total - prefill >= n_rest:
        # Round 0 feeds the prompt; the later first forwards feed 1 or 2 tokens each, priced at their mean.
        mean = (first_total - prefill) / n_rest if n_rest else 0.0
        first = [(float(prefill), 0.0)] + [(mean, commits[i]) for i, _ in rounds[1:]]
    elif first_total >= len(rounds):
        first = [(first_total / len(rounds), commits[i]) for i, _ in rounds]
    else:  # counts that do not fit the engine's pattern: spread all draft tokens evenly over the forwards
        calls = max(trace.get("draft_calls", 0), 1)
        mean = max(trace.get("draft_tokens", 0) / calls, 1.0)
        return [(mean, commits[i]) for i, r in rounds for _ in range(r["drafted"])]
    return first + [(float(k), float(ctx)) for k, ctx in later]


def drafted_by_model(round_: dict[str, Any]) -> bool:
    """Whether a round's proposal came from the draft model (traces before `drafter` was recorded: always)."""
    return round_.get("drafter", "model") == "model"


def other_drafter_rounds(traces: list[Any]) -> bool:
    """Whether any round of these traces was proposed by a drafter other than the draft model: then the SD formula,
    which prices every round as γ draft-model forwards, does not describe the decode."""
    return any(r.get("drafter", "model") not in ("model", "none") for t in traces for r in _as_dict(t)["rounds"])


def breakdown(trace: Any, profile: HardwareProfile) -> CostBreakdown:
    """Return the modelled time of one decode (a `Trace` or its `to_dict()`), split into target/draft/verify/other."""
    t = _as_dict(trace)
    rounds = t["rounds"]
    if any("fed" not in r for r in rounds):
        raise ConfigError("the trace has no per-round token counts ('fed'): it predates them; rerun the decode")
    commits, committed = [], t.get("prefill_tokens", 0)  # committed tokens at the start of each round
    for r in rounds:
        commits.append(committed)
        committed += r["emitted"]
    # The decoding model: the target, unless the draft made every pass and never drafted (method `draft`).
    draft_decodes = t.get("target_calls", 0) == 0 and t.get("draft_calls", 0) > 0 and not any(
        r["drafted"] for r in rounds)
    decoder = profile.model("draft" if draft_decodes else "target")
    o = profile.overheads
    out = CostBreakdown()
    decode = 0.0
    for r, before in zip(rounds, commits, strict=True):
        nodes = r.get("tree_nodes") or r["drafted"]  # peers record no tree: their block is the drafted tokens
        if r["fed"] > 0:
            decode += decoder.forward_seconds(r["fed"], max(before - (r["fed"] - nodes), 0))
        out.verify += o.verify_round + o.verify_row * (nodes + 1)
        out.other += o.other_round
    drafts = _draft_forwards(t, commits)
    if drafts:
        draft = profile.model("draft")
        out.draft += sum(draft.forward_seconds(k, ctx) for k, ctx in drafts)
        out.draft += o.sample_row * sum(r["drafted"] * r.get("paths", 1) for r in rounds if drafted_by_model(r))
    if draft_decodes:
        out.draft += decode
    else:
        out.target = decode
    return out


def predict(trace: Any, profile: HardwareProfile) -> float:
    """Return the modelled wall time, in seconds, of the decode `trace` (a `Trace` or its dict) on `profile`."""
    return breakdown(trace, profile).total


def predict_per_token(trace: Any, profile: HardwareProfile) -> float | None:
    """Return the modelled seconds per generated token of `trace` (None when it generated nothing)."""
    t = _as_dict(trace)
    generated = sum(r["emitted"] for r in t["rounds"])
    return predict(t, profile) / generated if generated else None


def cost_ratios(profile: HardwareProfile, gamma: int) -> tuple[float, float]:
    """Return (c, f) of the SD speedup formula at the profile's context (bench.metrics.theoretical_speedup).

    c = (one 1-token draft forward + its sampling) / one 1-token target forward; f = f_target(γ + 1).
    """
    target, draft = profile.model("target"), profile.model("draft")
    t1 = target.forward_seconds(1, target.context)
    return (draft.forward_seconds(1, draft.context) + profile.overheads.sample_row) / t1, target.f(gamma + 1)


def accelerator_profile(
    target_params: int,
    draft_params: int,
    bytes_per_param: float = ACCEL_BYTES_PER_PARAM,
    bandwidth: float = ACCEL_BANDWIDTH,
    flops: float = ACCEL_FLOPS,
    kv_bytes_per_token: tuple[float, float] = (0.0, 0.0),
    prefill_tokens: int = 512,
    overheads: Overheads | None = None,
    names: tuple[str, str] = ("target", "draft"),
) -> HardwareProfile:
    """Return a memory-bound accelerator profile: t(k) = t(1) = weight bytes / bandwidth for k ≤ 16.

    `target_params` / `draft_params`: the parameters a forward reads (c = draft bytes / target bytes). `flops`
    prices only the prompt forward (compute-bound: 2·params·tokens / flops). Defaults: nominal H200 HBM bandwidth and
    dense bf16 throughput; speedups depend on the ratio c and on f, not on these absolute numbers.
    `kv_bytes_per_token` (target, draft): KV-cache bytes read per cached token, for the context slope.
    """
    models = {}
    for role, params, kv, name in zip(("target", "draft"), (target_params, draft_params), kv_bytes_per_token, names,
                                      strict=True):
        t1 = params * bytes_per_param / bandwidth
        models[role] = ModelCost(
            name=name, ks=list(range(1, 17)), seconds=[t1] * 16, context=0, context_slope=kv / bandwidth,
            prefill_tokens=prefill_tokens, prefill_seconds=max(t1, 2 * params * prefill_tokens / flops),
            params=int(params), streamed_params=int(params), dtype=f"{bytes_per_param:g} bytes/param",
            device="memory-bound accelerator (modelled)", linear_backend="-",
        )
    c = draft_params / target_params
    return HardwareProfile(
        models, overheads or Overheads(), KIND_MODELLED,
        f"modelled memory-bound accelerator: f(k) = 1 for k ≤ 16, c = draft / target weight bytes = {c:.3f}, "
        f"{bandwidth / 1e12:g} TB/s",
    )


def accelerator_like(profile: HardwareProfile, **kwargs: Any) -> HardwareProfile:
    """Return `accelerator_profile` for the models of a measured `profile` (their streamed parameters give c)."""
    target, draft = profile.model("target"), profile.model("draft")
    sizes = [m.streamed_params or m.params for m in (target, draft)]
    if not all(sizes):
        raise ConfigError("the profile records no model sizes (params / streamed_params)")
    kwargs.setdefault("names", (target.name, draft.name))
    return accelerator_profile(sizes[0], sizes[1], **kwargs)


def _paired_speedup(records: list[dict[str, Any]], baseline: str, method: str, seconds: Any) -> float | None:
    """Return (baseline seconds per token) / (method seconds per token) over the prompts both decoded."""
    base = {r["prompt_index"]: r for r in records if r["method"] == baseline}
    mine = {r["prompt_index"]: r for r in records if r["method"] == method}
    shared = sorted(set(base) & set(mine))
    return speedup_of_totals([(seconds(base[i]), base[i]["trace"]["generated"]) for i in shared],
                             [(seconds(mine[i]), mine[i]["trace"]["generated"]) for i in shared])


def modelled_speedup(
    records: list[dict[str, Any]], profile: HardwareProfile, baseline: str | None = None,
    method_profiles: dict[str, HardwareProfile] | None = None,
) -> list[dict[str, Any]]:
    """Return one row per method of a bench results file's `records`: measured and modelled seconds per token and
    speedups vs `baseline` (default "ar" when present, else the first method), over the prompts both decoded.
    Each method is priced with `profile`, or with `method_profiles[method]` where given (e.g. the transformers peers,
    which run another linear path, with a profile of that path).

    Row keys: method, tokens, measured_seconds_per_token, modelled_seconds_per_token, model_over_measured,
    measured_speedup, modelled_speedup, and the measured and modelled target/draft/verify/other seconds.
    """
    methods = list(dict.fromkeys(r["method"] for r in records))
    baseline = default_baseline(methods, baseline)
    priced = {m: (method_profiles or {}).get(m, profile) for m in methods}
    rows = []
    for method in methods:
        mine = [r for r in records if r["method"] == method]
        tokens = sum(r["trace"]["generated"] for r in mine)
        measured = sum(r["trace"]["time_total"] for r in mine)
        parts = [breakdown(r["trace"], priced[method]) for r in mine]
        modelled = sum(p.total for p in parts)
        row: dict[str, Any] = {
            "method": method, "tokens": tokens,
            "measured_seconds_per_token": measured / tokens if tokens else None,
            "modelled_seconds_per_token": modelled / tokens if tokens else None,
            "model_over_measured": modelled / measured if measured else None,
            "measured_speedup": _paired_speedup(records, baseline, method, lambda rec: rec["trace"]["time_total"]),
            "modelled_speedup": _paired_speedup(records, baseline, method,
                                                lambda rec: predict(rec["trace"], priced[rec["method"]])),
        }
        for part in ("target", "draft", "verify", "other"):
            row[f"measured_{part}"] = sum(r["trace"].get(f"time_{part}", 0.0) for r in mine)
            row[f"modelled_{part}"] = sum(getattr(p, part) for p in parts)
        rows.append(row)
    return rows
