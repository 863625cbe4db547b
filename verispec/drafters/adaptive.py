"""Adaptive draft length: how many tokens the draft model drafts next round, from the acceptance its rounds have had
so far and what a round costs (docs/algorithms.md §1.4, "Variable γ").

Why: a fixed γ pays only where the draft is accepted often enough. On mixed prompts at T = 1 a round of γ = 4 draft
tokens, which costs four draft forwards and a target pass over five rows, accepted too little to beat plain decoding
(`sd` 0.99x of `ar` on the int4 path). Each round here drafts the γ in 0..γ_max that maximises the expected tokens per
unit of time, E(γ) / T(γ), with
- E(γ) = (1 − α^(γ+1)) / (1 − α): the tokens a round emits when each draft token is accepted with probability α;
- T(γ) = c·γ + f(γ + 1): γ draft forwards, each costing c target forwards, and a target pass over γ + 1 rows, f(k)
  being its cost over a one-row pass (`RoundCosts`);
- α: the acceptance rate of the recent model-drafted rounds (geometric: accepted tokens over accepted tokens plus
  rejections, counts decayed by `decay` per round, from a prior of `prior`).
γ = 0 is a plain target step (E = T = 1). While γ stays 0 nothing is learnt, so the counts decay toward the prior
and the draft is tried again after a few rounds.

Lossless: the length is chosen before the round from the counts of earlier rounds only (never timings or draws of
this round), so every round is an ordinary round of its verifier and the target's law is kept; a seed gives the
same tokens on any machine, since the costs are a fixed table rather than timings of this host.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class RoundCosts:
    """What a round costs, in units of one target forward over one token."""

    draft: float  # c: one draft forward (one token per path)
    target: tuple[float, ...]  # f(k) for k = 1, 2, ...: the target's pass over k rows; the last entry's slope goes on

    def target_pass(self, rows: int) -> float:
        """Return f(`rows`), extended linearly past the table."""
        f = self.target
        if rows <= len(f):
            return f[rows - 1]
        slope = f[-1] - f[-2] if len(f) > 1 else f[-1]
        return f[-1] + slope * (rows - len(f))


# Measured on the default pair's int4 path (2-core Xeon, 8-bit layers on vector registers): the target's medians
# f(k) over k = 1..12 (benchmarks/results/tile-passes-by-size.json, k = 11 interpolated) and c for the draft with
# its weights in 4 bits (BENCHMARKS.md §3). A fixed table, not this host's timings: see the module's docstring.
INT4_COSTS = RoundCosts(draft=0.36, target=(1.0, 1.10, 1.20, 1.30, 1.40, 1.52, 1.93, 1.98, 1.96, 2.02, 2.17, 2.32))
PRIOR_ACCEPTANCE = 0.7  # what α is taken to be before any round, and what it decays toward while γ stays 0
PRIOR_WEIGHT = 2.0  # the prior counts as this many tokens' worth of evidence
DECAY = 0.85  # per round: the last ~7 rounds carry most of the estimate


def expected_tokens(alpha: float, gamma: int) -> float:
    """Return E(γ): the expected tokens a round emits (accepted draft tokens plus the target's) when each of its γ
    draft tokens is accepted with probability `alpha` until the first rejection."""
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def best_gamma(alpha: float, max_gamma: int, costs: RoundCosts = INT4_COSTS) -> int:
    """Return the γ in 0..`max_gamma` with the most expected tokens per unit of time (the smallest on a tie)."""
    def rate(gamma: int) -> float:
        return expected_tokens(alpha, gamma) / (costs.draft * gamma + costs.target_pass(gamma + 1))

    return max(range(max_gamma + 1), key=lambda gamma: (rate(gamma), -gamma))


class AdaptiveGamma:
    """The draft length of each model-drafted round of one decode (a fresh one per decode)."""

    def __init__(self, max_gamma: int, costs: RoundCosts = INT4_COSTS, prior: float = PRIOR_ACCEPTANCE,
                 prior_weight: float = PRIOR_WEIGHT, decay: float = DECAY) -> None:
        self.max_gamma, self.costs, self.decay = max_gamma, costs, decay
        self.prior_accepted, self.prior_rejected = prior * prior_weight, (1.0 - prior) * prior_weight
        self.accepted = self.rejected = 0.0  # decayed counts of the model-drafted rounds so far

    @property
    def alpha(self) -> float:
        """Return the current estimate of the per-token acceptance rate."""
        accepted = self.accepted + self.prior_accepted
        return accepted / (accepted + self.rejected + self.prior_rejected)

    def next(self) -> int:
        """Return the most tokens the draft model may draft this round (0: none)."""
        return best_gamma(self.alpha, self.max_gamma, self.costs)

    def observe(self, drafter: str, drafted: int, accepted: int) -> None:
        """Record a round: `drafted` tokens proposed by `drafter`, of which the verifier kept `accepted`. Only the
        draft model's rounds inform α (lookup rounds have other odds); every round decays the counts."""
        self.accepted *= self.decay
        self.rejected *= self.decay
        if drafter == "model" and drafted > 0:
            self.accepted += accepted
            self.rejected += 1.0 if accepted < drafted else 0.0
