"""Choosing the verifier's threshold τ on validation data (docs/algorithms.md §3.2–§3.4). Accept when score ≥ τ.

Three rules:
- default: τ = 0.5, the released code's and the paper's value (§3.2, §3.9);
- a quality budget η_FP: the smallest τ whose validation false-positive rate P(accept | label 0) is ≤ η_FP.
  By §3.3 a token-aware verifier at λ = 1 then has TV(P_out, p) = η_FP·TV(p, q) per drafted position. The
  smallest such τ keeps η_TP (the speed) as high as the budget allows;
- a target run length L = E[T] (draft steps per round, §3.4): solve E[T] = (1 − π^C)/(1 − π) for the acceptance
  rate π (cap C, or 1/(1 − π) uncapped), then take τ as the score quantile that accepts a share π of the
  validation rows. This assumes §3.4's i.i.d. decisions; the measured run length will differ where they are not.
"""

from __future__ import annotations

import torch

from verispec import theory
from verispec.errors import ConfigError

DEFAULT_THRESHOLD = 0.5


def calibrate(
    scores: torch.Tensor,
    labels: torch.Tensor,
    target_fp_rate: float | None = None,
    target_run_length: float | None = None,
    cap: int | None = 20,
) -> float:
    """Return τ for validation scores `[N]` and labels `[N]` (1 = acceptable) by the rule chosen (module docstring):
    `target_fp_rate` η_FP in [0, 1], or `target_run_length` E[T] in [1, cap]; neither gives 0.5."""
    if target_fp_rate is not None and target_run_length is not None:
        raise ConfigError("give a target false-positive rate or a target run length, not both")
    scores = scores.to(torch.float64).view(-1)
    if target_fp_rate is not None:
        if not 0.0 <= target_fp_rate <= 1.0:
            raise ConfigError(f"target_fp_rate must be in [0, 1], got {target_fp_rate}")
        return threshold_for_fp_rate(scores, labels.view(-1) > 0.5, target_fp_rate)
    if target_run_length is not None:
        if target_run_length < 1.0 or (cap is not None and target_run_length > cap):
            raise ConfigError(f"target_run_length must be in [1, cap={cap}], got {target_run_length}")
        pi = theory.acceptance_rate_for_run_length(target_run_length, cap)
        return threshold_for_accept_rate(scores, pi)
    return DEFAULT_THRESHOLD


def threshold_for_fp_rate(scores: torch.Tensor, positive: torch.Tensor, eta_fp: float) -> float:
    """Return the smallest τ among the scores (or just above the largest) with P(score ≥ τ | negative) ≤ η_FP."""
    negatives = torch.sort(scores[~positive], descending=True).values  # [n0]
    if negatives.numel() == 0:
        return float(scores.min()) if scores.numel() else DEFAULT_THRESHOLD
    candidates = torch.unique(scores)  # ascending
    # false positives at τ: negatives with score >= τ
    fp = negatives.numel() - torch.searchsorted(torch.sort(negatives).values, candidates, right=False)
    ok = fp.to(torch.float64) / negatives.numel() <= eta_fp
    if bool(ok.any()):
        return float(candidates[ok][0])
    return float(torch.nextafter(negatives[0], torch.tensor(float("inf"), dtype=torch.float64)))


def threshold_for_accept_rate(scores: torch.Tensor, pi: float) -> float:
    """Return τ such that a share as close as possible to π of `scores` is ≥ τ (π = 1: the smallest score)."""
    if scores.numel() == 0:
        return DEFAULT_THRESHOLD
    ordered = torch.sort(scores, descending=True).values
    accepted = round(pi * ordered.numel())
    if accepted <= 0:
        return float(torch.nextafter(ordered[0], torch.tensor(float("inf"), dtype=torch.float64)))
    return float(ordered[min(accepted, ordered.numel()) - 1])
