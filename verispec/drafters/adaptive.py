"""Adaptive draft length: how many tokens the draft model drafts next round, from the acceptance its rounds have had
so far and what a round costs (docs/algorithms.md §1.4, "Variable γ").

Why: a fixed γ pays only where the draft is accepted often enough. On mixed prompts at T = 1 a round of γ = 4 draft
tokens, which costs four draft forwards and a target pass over five rows, accepted too little to beat plain decoding
(`sd` 0.99x of `ar` on the int4 path). Each round here drafts the γ in 0..γ_max that maximises the expected tokens per
unit of time, E(γ) / T(γ), with
- E(γ) = (1 − α^(γ+1)) / (1 − α): the tokens a round emits when each draft token is accepted with probability α;
- T(γ) = c·γ + f(γ + 1): γ draft forwards, each costing c target forwards, and a target pass over γ + 1 rows, f(k)
  being its cost over a one-row pass (`RoundCosts`), plus, where the round verifies on laws (T > 0, not keyed),
  each row's law (ROW_LAW per row);
- α: the acceptance rate of the recent model-drafted rounds (geometric: accepted tokens over accepted tokens plus
  rejections, counts decayed by `decay` per round, from a prior of `prior`).
γ = 0 is a plain target step (E = T = 1). While γ stays 0 nothing is learnt, so the counts decay toward the prior
and the draft is tried again after a few rounds.

Under load (a server decoding n sequences whose passes run together, `verispec.models.batched`) a round's passes
carry every sequence's rows: T(γ) = c·g(n)·γ + f_n(n·(γ + 1)), g(n) being the draft's pass over n rows against one
and f_n the batched pass's cost (`RoundCosts.batched_target`), taking the other sequences to draft as this one
does. Rows cost more once a pass is no longer bound by reading the weights, so the more sequences share the
passes, the shorter the best γ as a rule: at 4 sequences and α = 0.7 a plain step, at 16 nearly always. Not
always: where a longer round brings a pass to the size the 4-bit layers' AMX tiles take (10 rows), its rows cost
less, and the measured table says so.

Lookup rounds cost no draft forward, only their rows in the target's pass, so each drafts the γ up to its own
maximum (`ngram_gamma`, ADAPTIVE_LOOKUP_GAMMA by default) that maximises E(γ) / f(γ + 1), under load
E(γ) / f_n(n·(γ + 1)), at the recent acceptance of the lookup rounds (`lookup_next`; counted and decayed like the
model's, from the same prior); alone, never less than γ_max. Where lookups are copied on and on (code, at T = 0)
that is their longest; where they miss (sampled chat), γ_max.

Lossless: the length is chosen before the round from the counts of earlier rounds only (never timings or draws of
this round), so every round is an ordinary round of its verifier and the target's law is kept; a seed gives the
same tokens on any machine, since the costs are a fixed table rather than timings of this host.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace

import numpy as np


@dataclass(frozen=True)
class RoundCosts:
    """What a round costs, in units of one target forward over one token."""

    draft: float  # c: one draft forward (one token per path)
    target: tuple[float, ...]  # f(k) for k = 1, 2, ...: the target's pass over k rows; the last entry's slope goes on
    # g(k): the draft's pass over k rows (k sequences) against one row; the default: as one row, whatever k
    draft_rows: tuple[float, ...] = (1.0, 1.0)
    # f(k) of a batched pass over k rows of several sequences (each attends to a cache of its own); None: `target`
    batched_target: tuple[float, ...] | None = None
    # what each row's law adds to the pass where the round verifies on laws (T > 0, unless keyed): 0 at T = 0
    row_law: float = 0.0

    def target_pass(self, rows: int, sequences: int = 1) -> float:
        """Return f(`rows`) of a pass over `sequences` sequences' rows, extended linearly past the table, with
        their laws' cost."""
        batched = sequences > 1 and self.batched_target is not None
        return _extended(self.batched_target if batched else self.target, rows) + self.row_law * rows

    def draft_pass(self, rows: int) -> float:
        """Return c·g(`rows`): a draft pass over `rows` rows, in target forwards."""
        return self.draft * _extended(self.draft_rows, rows)


def _extended(table: tuple[float, ...], rows: int) -> float:
    """Return table[rows - 1], extended linearly past the table by its last entries' slope (for one entry: in
    proportion to `rows`)."""
    if rows <= len(table):
        return table[rows - 1]
    slope = table[-1] - table[-2] if len(table) > 1 else table[-1]
    return table[-1] + slope * (rows - len(table))


def interpolated(points: dict[int, float]) -> tuple[float, ...]:
    """Return the table over k = 1..max(points), linear between the measured `points` (k -> cost, 1 among them)."""
    known = sorted(points)
    return tuple(float(v) for v in np.interp(range(1, known[-1] + 1), known, [points[k] for k in known]))


# Measured on the default pair's int4 path (2-core Xeon with AMX): the target's medians f(k) over k = 1..17, 21, 25
# and 33 rows of one sequence, linear between (benchmarks/results/decode-passes-by-size.json; past 9 rows the 4-bit
# layers run on tiles, so 10-16 rows cost less than 7-8), and c for the draft with its weights in 4 bits
# (BENCHMARKS.md §3). Under load, the server's batched passes (benchmarks/results/batched-passes.json,
# 4-bit layers on AMX tiles from 10 rows on, which is why 10-12 rows cost less than 8): f(k) over k rows in all, the
# median of the sequence counts measured at k, linear between; g(n): the draft's pass over n sequences of one token
# each (1.24, 1.62, 2.79 at n = 2, 4, 8). A fixed table, not this host's timings: see the module's docstring.
INT4_COSTS = RoundCosts(
    draft=0.36,
    target=interpolated({1: 1.0, 2: 1.12, 3: 1.20, 4: 1.24, 5: 1.27, 6: 1.31, 7: 1.63, 8: 1.71, 9: 1.61, 10: 1.59,
                         11: 1.62, 12: 1.63, 13: 1.67, 14: 1.69, 15: 1.69, 16: 1.74, 17: 1.98, 21: 2.14, 25: 2.28,
                         33: 3.19}),
    draft_rows=interpolated({1: 1.0, 2: 1.24, 4: 1.62, 8: 2.79}),
    batched_target=interpolated({1: 1.0, 2: 1.20, 4: 1.36, 6: 1.45, 8: 2.03, 10: 1.73, 12: 1.93, 16: 2.31, 20: 2.70,
                                 24: 2.98, 32: 3.70, 40: 5.07, 48: 6.07, 64: 7.74}),
)
# The most tokens a lookup round drafts where the draft length is chosen per round and no `ngram_gamma` is given:
# lookup tokens cost no draft forward, and a 17-row pass costs about two one-token passes (the table above). On 20
# HumanEval prompts (not those of BENCHMARKS.md's default-path rows) at T = 0, fixed lookups of 8 ran 1.11x those of
# 4, and 12 and 16 ran 1.13x and 1.15x those of 8 (two runs); lengths chosen per round up to 16 ran 1.23x lookups of
# 4 (docs/drafters.md).
ADAPTIVE_LOOKUP_GAMMA = 16
# A verified row's float64 law over the vocabulary at T > 0 (with its draws), in target forwards: rounds of 5 rows
# took about 8 ms more at T = 1 than at T = 0 in the decodes of the default path on 2-core Xeons (~1.6 ms a row, a
# one-token pass ~55 ms). Greedy and keyed rounds match tokens and make no law.
ROW_LAW = 0.03
PRIOR_ACCEPTANCE = 0.7  # what α is taken to be before any round, and what it decays toward while γ stays 0
PRIOR_WEIGHT = 2.0  # the prior counts as this many tokens' worth of evidence
DECAY = 0.85  # per round: the last ~7 rounds carry most of the estimate


def expected_tokens(alpha: float, gamma: int) -> float:
    """Return E(γ): the expected tokens a round emits (accepted draft tokens plus the target's) when each of its γ
    draft tokens is accepted with probability `alpha` until the first rejection."""
    if alpha >= 1.0:
        return float(gamma + 1)
    return (1.0 - alpha ** (gamma + 1)) / (1.0 - alpha)


def best_gamma(alpha: float, max_gamma: int, costs: RoundCosts = INT4_COSTS, sequences: int = 1) -> int:
    """Return the γ in 0..`max_gamma` with the most expected tokens per unit of time (the smallest on a tie), when
    `sequences` sequences share every pass (each taken to draft as this one)."""
    n = max(1, sequences)

    def rate(gamma: int) -> float:
        return expected_tokens(alpha, gamma) / (costs.draft_pass(n) * gamma + costs.target_pass(n * (gamma + 1), n))

    return max(range(max_gamma + 1), key=lambda gamma: (rate(gamma), -gamma))


class AdaptiveGamma:
    """The draft length of each model-drafted round of one decode (a fresh one per decode)."""

    def __init__(self, max_gamma: int, costs: RoundCosts = INT4_COSTS, prior: float = PRIOR_ACCEPTANCE,
                 prior_weight: float = PRIOR_WEIGHT, decay: float = DECAY,
                 sequences: Callable[[], int] | None = None, lookup_max: int | None = None,
                 row_laws: bool = False) -> None:
        """`sequences`: asked each round how many sequences share the passes (a batched server's load); None:
        this one alone. `lookup_max`: the most tokens a lookup round drafts (None: `max_gamma`). `row_laws`: the
        rounds verify on laws (T > 0 and not keyed), whose cost per row (ROW_LAW) goes on `costs`' passes."""
        if row_laws:
            costs = replace(costs, row_law=ROW_LAW)
        self.max_gamma, self.costs, self.decay, self.sequences = max_gamma, costs, decay, sequences
        self.lookup_max = max_gamma if lookup_max is None else lookup_max
        # a lookup round's costs: no draft forward, the same target passes
        self.lookup_costs = replace(costs, draft=0.0)
        self.prior_accepted, self.prior_rejected = prior * prior_weight, (1.0 - prior) * prior_weight
        self.accepted = self.rejected = 0.0  # decayed counts of the model-drafted rounds so far
        self.lookup_accepted = self.lookup_rejected = 0.0  # the same for the lookup rounds

    @property
    def alpha(self) -> float:
        """Return the current estimate of the per-token acceptance rate of the draft model's tokens."""
        return self._estimate(self.accepted, self.rejected)

    @property
    def lookup_alpha(self) -> float:
        """Return the current estimate of the per-token acceptance rate of lookup tokens."""
        return self._estimate(self.lookup_accepted, self.lookup_rejected)

    def _estimate(self, accepted: float, rejected: float) -> float:
        accepted += self.prior_accepted
        return accepted / (accepted + rejected + self.prior_rejected)

    def next(self) -> int:
        """Return the most tokens the draft model may draft this round (0: none)."""
        sequences = self.sequences() if self.sequences is not None else 1
        return best_gamma(self.alpha, self.max_gamma, self.costs, sequences)

    def lookup_next(self) -> int:
        """Return the most tokens a lookup round may draft this round (0: none). Alone, at least the model's most
        (γ_max): a lookup round costs no draft forward, and where lookups miss (T > 0) the geometric estimate
        undervalued them (on dev prompts at T = 1 a lookup round of 4 tokens emitted 2.6 tokens at 30 ms each, a
        plain step 55 ms), so it only lengthens them where their acceptance pays for the longer pass."""
        sequences = self.sequences() if self.sequences is not None else 1
        best = best_gamma(self.lookup_alpha, self.lookup_max, self.lookup_costs, sequences)
        return best if sequences > 1 else max(best, min(self.max_gamma, self.lookup_max))

    def observe(self, drafter: str, drafted: int, accepted: int) -> None:
        """Record a round: `drafted` tokens proposed by `drafter`, of which the verifier kept `accepted`. The draft
        model's rounds inform α, the lookup rounds their own estimate (other odds); every round decays both."""
        self.accepted *= self.decay
        self.rejected *= self.decay
        self.lookup_accepted *= self.decay
        self.lookup_rejected *= self.decay
        missed = 1.0 if accepted < drafted else 0.0
        if drafter == "model" and drafted > 0:
            self.accepted, self.rejected = self.accepted + accepted, self.rejected + missed
        elif drafter == "ngram" and drafted > 0:
            self.lookup_accepted, self.lookup_rejected = self.lookup_accepted + accepted, self.lookup_rejected + missed
