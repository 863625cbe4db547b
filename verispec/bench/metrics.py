"""Benchmark metrics, all computed from the per-prompt records (each holds one decode's `Trace.to_dict()`).

Per method (notation of docs/algorithms.md §3.4; p = target, q = draft):

* wall time per generated token = Σ time_total / Σ generated over the prompts (token-weighted);
* speedup vs the baseline = (baseline seconds per token) / (method seconds per token), same prompts, with its 95%
  percentile-bootstrap interval over prompts (the baseline's and the method's decode of a prompt stay paired);
  the estimator, the bootstrap and the default baseline are `verispec.stats`'s; the speedup per answer
  (`answer_speedup`) is the same with each prompt's whole time in place of its time per token;
* block efficiency = generated tokens / target calls (tokens per target call, E[N] when every call is a round).
  `efficiency` gives it and the wall time per token with 95% intervals (the same bootstrap over prompts, of the
  ratio of totals), and, against a comparison method, the paired ratio of block efficiencies with its interval;
* acceptance rate = accepted / drafted tokens (the engine's definition; it counts draft tokens after a rejection);
* α = per-position acceptance probability: accepted / (accepted + rejections), where a round has a rejection when
  τ < drafted. This is the maximum-likelihood estimate of the i.i.d. acceptance probability from rounds cut at the
  first rejection, and it is the α of the speedup formula (β of §3.4);
* mean accepted length = Σ τ / rounds; target and draft calls per generated token;
* theoretical SD speedup (Leviathan et al. 2023; docs/algorithms.md §3.4, SD latency per token [γ·c_q + c_p]/E[N_SD]):

      S = (1 − α^{γ+1}) / ((1 − α)(γ·c + f))

  with every symbol measured:
  - α: as above, from this method's rounds;
  - γ: the configured draft length;
  - t₁: mean seconds of a 1-token target forward, from the baseline's rounds that fed exactly one token (the prefill
    round excluded), i.e. the actual cost of one autoregressive step of the target;
  - c = (seconds drafting per drafted token, rounds after the first) / t₁: draft forward + its sampling;
  - f = (mean seconds of this method's target forwards that fed exactly γ+1 tokens, the first round excluded) / t₁:
    the measured cost of verifying a block relative to one autoregressive step (Leviathan assume f = 1).
  It ignores verification and bookkeeping time, which the measured speedup includes. It also prices decode rounds
  only, not the prompt's processing: compare it with the decode-round speedup below;
* the prompt round and the decode rounds (`decode_split`): a decode's first round processes the prompt (the target's
  prefill, the draft's own prefill for speculative methods) and commits its first tokens; long prompts with short
  outputs make it a large share of the wall time. Per method: that round's share of the wall time, seconds per
  token over the later rounds (time_total − the first round's draft, target and verify seconds, over the tokens
  the later rounds emitted), and the speedup of those decode rounds over the baseline's, with its 95% interval.

Also per method, when the records carry them: FLOPs per generated token (`bench.flops`, convention stated there),
the quality aggregates of `bench.quality.summarize_quality` (NLL / perplexity under the target, ROUGE-L, each with a
95% bootstrap interval over prompts), and for SPRINTER methods the learned verifier's online operating point
η_FP / η_TP pooled over every drafted token of every prompt (`verifier_rates`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from statistics import fmean
from typing import Any

from verispec.bench.flops import summarize_flops
from verispec.bench.quality import summarize_quality
from verispec.bench.sprinter_online import leak_online, sprinter_online, verifier_rates
from verispec.costmodel import other_drafter_rounds
from verispec.methods import METHODS
from verispec.stats import Interval, bootstrap_ratio, default_baseline
from verispec.stats import paired_speedup as paired_totals_speedup


def _rounds(records: Sequence[dict[str, Any]], skip_first: bool = False) -> list[dict[str, Any]]:
    return [r for rec in records for r in rec["trace"]["rounds"][1 if skip_first else 0:]]


def alpha_estimate(records: Sequence[dict[str, Any]]) -> float | None:
    """Return the per-position acceptance probability α = accepted / (accepted + rejections), None without drafts."""
    rounds = [r for r in _rounds(records) if r["drafted"] > 0]
    accepted = sum(r["accepted"] for r in rounds)
    rejections = sum(r["accepted"] < r["drafted"] for r in rounds)
    return accepted / (accepted + rejections) if accepted + rejections else None


def one_token_target_seconds(records: Sequence[dict[str, Any]]) -> float | None:
    """Return the mean seconds of a target forward that fed one token (non-speculative rounds, prefill excluded)."""
    times = [r["time_decode"] for r in _rounds(records, skip_first=True) if r["drafted"] == 0 and r["fed"] == 1]
    return fmean(times) if times else None


def measured_costs(
    records: Sequence[dict[str, Any]], gamma: int, t1: float | None
) -> tuple[float | None, float | None]:
    """Return (c, f): seconds per drafted token and per target forward of γ+1 tokens, both divided by `t1`."""
    rounds = _rounds(records, skip_first=True)
    drafted = sum(r["drafted"] for r in rounds)
    block = [r["time_decode"] for r in rounds if r["fed"] == gamma + 1 and r["drafted"] == gamma]
    if not t1 or not drafted or not block:
        return None, None
    return sum(r["time_draft"] for r in rounds) / drafted / t1, fmean(block) / t1


def theoretical_speedup(alpha: float | None, gamma: int, c: float | None, f: float | None) -> float | None:
    """Return (1 − α^{γ+1}) / ((1 − α)(γc + f)): the SD speedup over autoregressive decoding (module docstring)."""
    if alpha is None or c is None or f is None:
        return None
    tokens_per_round = gamma + 1 if alpha == 1.0 else (1 - alpha ** (gamma + 1)) / (1 - alpha)
    return tokens_per_round / (gamma * c + f)


SD_FORMULA_METHODS = ("sd", "hf-assisted")

TracePart = Callable[[dict[str, Any]], tuple[float, int]]  # a trace -> (seconds, tokens) of some of its rounds


def whole_decode(trace: dict[str, Any]) -> tuple[float, int]:
    """Return (wall seconds, generated tokens) of a whole decode."""
    return trace["time_total"], trace["generated"]


def prompt_round_seconds(trace: dict[str, Any]) -> float:
    """Return the seconds of a decode's first round: the prompt's forwards and the first commit (0 without rounds)."""
    if not trace["rounds"]:
        return 0.0
    first = trace["rounds"][0]
    return first["time_draft"] + first["time_decode"] + first["time_verify"]


def target_calls_and_tokens(trace: dict[str, Any]) -> tuple[float, int]:
    """Return (target calls, generated tokens) of a decode: as a `paired_speedup` part, the ratio of two methods'
    block efficiencies (tokens per target call), mine over base."""
    return trace["target_calls"], trace["generated"]


def whole_answer(trace: dict[str, Any]) -> tuple[float, int]:
    """Return (wall seconds, 1) of a whole decode: as a `paired_speedup` part, the ratio of the time each method took
    to answer the same prompts, whatever the answers' lengths (a lossy rule that writes longer answers pays for it)."""
    return trace["time_total"], 1


def decode_rounds(trace: dict[str, Any]) -> tuple[float, int]:
    """Return (seconds, tokens) of the rounds after the first: the decode without the prompt's processing."""
    emitted = trace["rounds"][0]["emitted"] if trace["rounds"] else 0
    return trace["time_total"] - prompt_round_seconds(trace), trace["generated"] - emitted


def paired_speedup(
    base: dict[int, dict[str, Any]], mine: dict[int, dict[str, Any]], resamples: int, seed: int,
    part: TracePart = whole_decode,
) -> tuple[float | None, Interval | None]:
    """Return (speedup of `mine` over `base`, its 95% bootstrap interval) over the prompts both decoded, timing
    `part` of each decode (default: all of it)."""
    shared = sorted(set(base) & set(mine))
    return paired_totals_speedup([part(base[i]["trace"]) for i in shared], [part(mine[i]["trace"]) for i in shared],
                                 resamples, seed)


def _by_method(records: Sequence[dict[str, Any]], methods: Sequence[str]) -> dict[str, dict[int, dict[str, Any]]]:
    return {m: {rec["prompt_index"]: rec for rec in records if rec["method"] == m} for m in methods}


def decode_split(
    records: Sequence[dict[str, Any]], methods: Sequence[str], baseline: str | None = None, resamples: int = 2000,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Return one row per method splitting its wall time into the prompt round and the decode rounds (module
    docstring): method, prompt_round_share, decode_seconds_per_token, decode_speedup and decode_speedup_ci95 (vs
    `baseline`, by default `stats.default_baseline`, over the prompts both decoded)."""
    baseline = default_baseline(methods, baseline)
    by_method = _by_method(records, methods)
    rows = []
    for method in methods:
        traces = [rec["trace"] for rec in by_method[method].values()]
        seconds = sum(t["time_total"] for t in traces)
        decode = [decode_rounds(t) for t in traces]
        decode_seconds, decode_tokens = sum(s for s, _ in decode), sum(n for _, n in decode)
        speedup, ci = paired_speedup(by_method.get(baseline, {}), by_method[method], resamples, seed, decode_rounds)
        rows.append({
            "method": method,
            "prompt_round_share": (seconds - decode_seconds) / seconds if seconds else None,
            "decode_seconds_per_token": decode_seconds / decode_tokens if decode_tokens else None,
            "decode_speedup": speedup,
            "decode_speedup_ci95": ci,
        })
    return rows


TIME_PARTS = ("draft", "target", "verify", "other")


def efficiency(
    records: Sequence[dict[str, Any]], methods: Sequence[str], compare_to: str | None = None, resamples: int = 2000,
    seed: int = 0,
) -> list[dict[str, Any]]:
    """Return one row per method: wall time per token and block efficiency, each with its 95% bootstrap interval
    over prompts; seconds per token in drafting, target forwards, verification and the rest; tokens per target pass
    in the decode rounds (the tree size for multi-path methods); with `compare_to`, the paired ratios of block
    efficiency (`block_efficiency_vs`) and of speed (`speedup_vs`) against that method, with their intervals."""
    by_method = _by_method(records, methods)
    rows = []
    for method in methods:
        traces = [rec["trace"] for rec in by_method[method].values()]
        tokens = sum(t["generated"] for t in traces)
        calls = sum(t["target_calls"] for t in traces)
        later = _rounds(list(by_method[method].values()), skip_first=True)
        row: dict[str, Any] = {
            "method": method,
            "prompts": len(traces),
            "seconds_per_token": sum(t["time_total"] for t in traces) / tokens if tokens else None,
            "seconds_per_token_ci95": bootstrap_ratio([whole_decode(t) for t in traces], resamples, seed),
            "tokens_per_target_call": tokens / calls if calls else None,
            "tokens_per_target_call_ci95": bootstrap_ratio([(t["generated"], t["target_calls"]) for t in traces],
                                                           resamples, seed),
            "tokens_per_target_pass": sum(r["fed"] for r in later) / len(later) if later else None,
        }
        seconds = {part: sum(t[f"time_{part}"] for t in traces) for part in TIME_PARTS[:-1]}
        seconds["other"] = sum(t["time_total"] for t in traces) - sum(seconds.values())  # bookkeeping, sampling
        for part in TIME_PARTS:
            row[f"{part}_seconds_per_token"] = seconds[part] / tokens if tokens else None
        if compare_to is not None:
            versus = by_method.get(compare_to, {})
            row["block_efficiency_vs"], row["block_efficiency_vs_ci95"] = paired_speedup(
                versus, by_method[method], resamples, seed, target_calls_and_tokens)
            row["speedup_vs"], row["speedup_vs_ci95"] = paired_speedup(versus, by_method[method], resamples, seed)
        rows.append(row)
    return rows


def summarize(
    records: Sequence[dict[str, Any]],
    methods: Sequence[str],
    baseline: str | None = None,
    gamma: int | dict[str, int] | None = None,
    resamples: int = 2000,
    seed: int = 0,
    compare_to: str | None = None,
) -> list[dict[str, Any]]:
    """Return one aggregate row per method (keys in the module docstring); speedups are vs `baseline` (default:
    `stats.default_baseline`), over the prompts both decoded; with `compare_to`, also `speedup_vs_<compare_to>`.
    `gamma`: one draft length for all methods, or one per method label."""
    baseline = default_baseline(methods, baseline)
    by_method = _by_method(records, methods)
    base = by_method.get(baseline, {})
    t1 = one_token_target_seconds(list(base.values()))
    split = decode_split(records, methods, baseline, resamples, seed)
    rows = []
    for method, split_row in zip(methods, split, strict=True):
        mine = list(by_method[method].values())
        traces = [rec["trace"] for rec in mine]
        tokens = sum(t["generated"] for t in traces)
        seconds = sum(t["time_total"] for t in traces)
        rounds = _rounds(mine)
        drafted = sum(r["drafted"] for r in rounds)
        accepted = sum(r["accepted"] for r in rounds)
        target_calls, draft_calls = sum(t["target_calls"] for t in traces), sum(t["draft_calls"] for t in traces)
        row: dict[str, Any] = {
            "method": method,
            "prompts": len(mine),
            "tokens": tokens,
            "seconds": seconds,
            "seconds_per_token": seconds / tokens if tokens else None,
            "tokens_per_second": tokens / seconds if seconds else None,
            "acceptance_rate": accepted / drafted if drafted else None,
            "alpha": alpha_estimate(mine),
            "mean_accepted": accepted / len(rounds) if drafted else None,
            "tokens_per_target_call": tokens / target_calls if target_calls else None,
            "target_calls_per_token": target_calls / tokens if tokens else None,
            "draft_calls_per_token": draft_calls / tokens if tokens else None,
        }
        shared = sorted(set(base) & set(by_method[method]))
        row["speedup"], row["speedup_ci95"] = paired_speedup(base, by_method[method], resamples, seed)
        row["answer_speedup"], row["answer_speedup_ci95"] = paired_speedup(base, by_method[method], resamples, seed,
                                                                           whole_answer)
        row.update({k: v for k, v in split_row.items() if k != "method"})
        if compare_to is not None:
            versus = paired_speedup(by_method[compare_to], by_method[method], resamples, seed)
            row[f"speedup_vs_{compare_to}"], row[f"speedup_vs_{compare_to}_ci95"] = versus
        row["same_tokens_as_baseline"] = (
            sum(base[i]["tokens"] == by_method[method][i]["tokens"] for i in shared) / len(shared) if shared else None
        )
        method_gamma = gamma.get(method) if isinstance(gamma, dict) else gamma
        # The SD formula models single-path token verification with a fixed draft length from the draft model only.
        if (drafted and method_gamma is not None and method.split(":")[0] in SD_FORMULA_METHODS
                and not other_drafter_rounds(traces)):
            c, f = measured_costs(mine, method_gamma, t1)
            theory = theoretical_speedup(row["alpha"], method_gamma, c, f)
            row.update(cost_draft_c=c, cost_block_f=f, theoretical_speedup=theory)
        else:
            row.update(cost_draft_c=None, cost_block_f=None, theoretical_speedup=None)
        row.update(summarize_flops(mine))
        row.update(verifier_rates(mine))
        row["sprinter_online"] = sprinter_online(mine)
        row.update(leak_online(mine))  # every lossy rule's measured TV(output law, p) per position (§3.3)
        registered = METHODS.get(method.split(":")[0])
        if registered is not None and registered.lossless and row["leak_tv_out"] is None:
            row["leak_tv_out"] = 0.0  # a lossless method's output law is the target's at every position
        row.update(summarize_quality(mine, resamples, seed))
        rows.append(row)
    return rows
