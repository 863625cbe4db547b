"""A draft length set by the draft's own confidence: drafting stops after a token the draft drew with probability
below a threshold h (transformers' `assistant_confidence_threshold` for its assistant model).

A token the draft was unsure of is the likeliest to be rejected, and every token drafted after a rejection is
wasted work. The rule reads only the drafted token and the law q it was drawn from, so every single-path verifier
stays exactly lossless (docs/algorithms.md §1.4, "Variable γ"); only the draft length, and so the speed, changes.
At T = 0 the draft's law is a point mass (q = 1 for every drafted token), so the rule needs T > 0.
"""

from __future__ import annotations

import torch


class ConfidenceStop:
    """A `verispec.drafting.StopRule`: go on drafting while q(x) ≥ `threshold` for the token x just drawn."""

    uses_hidden = False  # it reads q only: the draft's forwards need not return their hidden states

    def __init__(self, threshold: float) -> None:
        self.threshold = float(threshold)

    def score(self, hidden: torch.Tensor | None, q_row: torch.Tensor, token: int, position: int) -> float:
        """Return q(token): the probability the draft drew the token with."""
        return float(q_row[token])

    def accepts(self, score: float) -> bool:
        """Return whether drafting goes on after a token drawn with probability `score`."""
        return score >= self.threshold

    def accept_mask(self, hidden: torch.Tensor | None, q_row: torch.Tensor, position: int) -> torch.Tensor:
        """Return `[V]` float64: 1 where drafting would go on had token v been drawn, else 0."""
        return (q_row >= self.threshold).to(torch.float64)
