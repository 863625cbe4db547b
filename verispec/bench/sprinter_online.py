"""SPRINTER's theory set against its own decode traces (docs/algorithms.md §3.4, §3.8), for bench reports.

Every SPRINTER round drafts T tokens, the verifier scoring each; the round ends at the first rejection or at the
cap C, and one target pass checks the last token (N = T tokens plus a bonus on a pass, T on a fail). Because that
pass covers the whole run, each drafted token's acceptability (q(x) ≤ p(x)) is known, so the verifier's errors are
observed online. From the records of one method this module returns:

* `pi`: the verifier's acceptance rate over the decisions that steer a run (tokens below the cap);
* `alpha`: the share of drafted tokens that were acceptable; `eta_tp`, `eta_fp` from `verifier_rates`;
* `run_length` measured vs `run_length_predicted` = E[T] = (1 − π^C)/(1 − π), the §3.4 formula under i.i.d.
  decisions; `tokens_per_round` measured vs `tokens_per_round_predicted` = E[T] + P(pass), with P(pass) the
  measured pass rate of the checked tokens (`pass_rate`);
* `per_position`: by position in the run, the verifier's acceptance rate and the acceptable share (i.i.d. says flat);
* `error_autocorrelation`: the lag-1 correlation of verifier errors (accept ≠ acceptable) between consecutive
  tokens of the same run (i.i.d. says 0);
* `tv_out`: the mean over steered positions of ε = Σ_v a(v)·(q(v) − p(v))_+, the exact total-variation distance
  between that position's output law and p given the verifier's decision a(v) for every token (§3.3, recorded by
  the engine), against `tv_out_predicted` = η_FP·TV(p, q) (§3.3, token-aware verifier at λ = 1), with `tv_pq` the
  mean TV(p, q) there; None for lossless methods and traces without it.

Only "natural" rounds enter the run-length figures: those that ended at a rejection or at the cap. A round cut
short by `max_new_tokens` or an EOS ends with an accepted token below the cap and would bias T downwards.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import torch

from verispec.learned.evaluate import error_autocorrelation
from verispec.theory import expected_run_length, expected_tokens_per_round


def verifier_rates(records: Sequence[dict[str, Any]]) -> dict[str, float | int | None]:
    """Return the learned verifier's online η_FP = P(accept | unacceptable), η_TP = P(accept | acceptable) and the
    token count, pooled over the records' drafted tokens (acceptable: q(x) ≤ p(x) in the same round's target pass)."""
    pairs = [(a, ok) for rec in records for r in rec["trace"]["rounds"]
             for a, ok in zip(r.get("verifier_accepts") or [], r.get("acceptable") or [], strict=True)]
    bad, good = [a for a, ok in pairs if not ok], [a for a, ok in pairs if ok]
    return {"eta_fp": sum(bad) / len(bad) if bad else None, "eta_tp": sum(good) / len(good) if good else None,
            "verifier_tokens": len(pairs)}


def leak_online(records: Sequence[dict[str, Any]]) -> dict[str, float | int | None]:
    """Return the online leak of one lossy method's bench records: over every drafted position with a recorded ε
    (SPRINTER: the positions its verifier steers; the relaxed rules of `verify/relaxed.py`: the positions the rule
    examined), `leak_positions`, the mean TV(p, q) there (`leak_tv_pq`) and the mean ε = TV(output law, p) per
    position (`leak_tv_out`, §3.3; for fly an unbiased estimate). None values without such positions (lossless
    methods)."""
    pairs = [(tv, leak) for rec in records for r in rec["trace"]["rounds"]
             for tv, leak in zip(r.get("tv_pq") or [], r.get("leak") or [], strict=True) if leak is not None]
    return {"leak_positions": len(pairs),
            "leak_tv_pq": sum(tv for tv, _ in pairs) / len(pairs) if pairs else None,
            "leak_tv_out": sum(leak for _, leak in pairs) / len(pairs) if pairs else None}


def _natural(round_: dict[str, Any], cap: int) -> bool:
    accepts = round_["verifier_accepts"]
    return bool(accepts) and (not accepts[-1] or len(accepts) == cap)


def sprinter_online(records: Sequence[dict[str, Any]], max_positions: int = 8) -> dict[str, Any] | None:
    """Return the online theory-vs-measurement figures (module docstring) of one SPRINTER method's bench records;
    None when the records hold no verifier decisions. Positions beyond `max_positions` are pooled into the last."""
    runs = []  # (cap, round) for every round with verifier decisions
    for record in records:
        rounds = [r for r in record["trace"]["rounds"] if r.get("verifier_accepts")]
        if rounds:
            runs += [(int(record["config"]["cap"]), r) for r in rounds]
    if not runs:
        return None
    caps = {cap for cap, _ in runs}
    cap = caps.pop() if len(caps) == 1 else None  # one formula needs one cap
    steering = [a for c, r in runs for i, a in enumerate(r["verifier_accepts"]) if i + 1 < c]
    pi = sum(steering) / len(steering) if steering else None
    rates = verifier_rates(records)
    acceptable = sum(ok for _, r in runs for ok in r["acceptable"])

    natural = [r for c, r in runs if _natural(r, c)]
    run_length = sum(len(r["verifier_accepts"]) for r in natural) / len(natural) if natural else None
    passed = [r["accepted"] == r["drafted"] for r in natural]
    pass_rate = sum(passed) / len(passed) if passed else None
    out: dict[str, Any] = {
        "rounds": len(runs), "natural_rounds": len(natural), "cap": cap, "pi": pi,
        "alpha": acceptable / rates["verifier_tokens"], "eta_tp": rates["eta_tp"], "eta_fp": rates["eta_fp"],
        "pass_rate": pass_rate, "run_length": run_length,
        "tokens_per_round": run_length + pass_rate if natural else None,
        "run_length_predicted": None, "tokens_per_round_predicted": None,
    }
    if pi is not None and cap is not None and natural:
        out["run_length_predicted"] = expected_run_length(pi, cap)
        # The bonus rule is the same whether the last token was a rejection or the cap: one measured pass rate.
        out["tokens_per_round_predicted"] = expected_tokens_per_round(pi, cap, pass_rate)

    # §3.3: at a position the verifier steers, TV(output law, p) = ε exactly; predicted η_FP·TV(p, q).
    steered = leak_online(records)
    out["tv_positions"], out["tv_pq"], out["tv_out"] = (steered["leak_positions"], steered["leak_tv_pq"],
                                                        steered["leak_tv_out"])
    out["tv_out_predicted"] = (out["eta_fp"] * out["tv_pq"] if out["tv_positions"] and out["eta_fp"] is not None
                               else None)

    by_position: dict[int, list[tuple[bool, bool]]] = {}
    for _, r in runs:
        for i, pair in enumerate(zip(r["verifier_accepts"], r["acceptable"], strict=True)):
            by_position.setdefault(min(i + 1, max_positions), []).append(pair)
    out["per_position"] = [
        {"position": position, "tokens": len(rows), "accept_rate": sum(a for a, _ in rows) / len(rows),
         "acceptable_rate": sum(ok for _, ok in rows) / len(rows), "pooled": position == max_positions}
        for position, rows in sorted(by_position.items())
    ]
    errors, round_ids, steps = [], [], []
    for index, (_, r) in enumerate(runs):
        for i, (a, ok) in enumerate(zip(r["verifier_accepts"], r["acceptable"], strict=True)):
            errors.append(float(a != ok))
            round_ids.append(index)
            steps.append(i)
    autocorrelation = error_autocorrelation(torch.tensor(errors), torch.tensor(round_ids), torch.tensor(steps))
    out["error_autocorrelation"] = None if autocorrelation != autocorrelation else autocorrelation  # NaN -> None
    return out
