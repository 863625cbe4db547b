"""Keyed draws: every token of a decode chosen by an exponential race over noise keyed by (seed, position), and the
verification that matches a drafted token against the target's own choice (docs/algorithms.md §0.1), lossless.

At position t every token v has an exponential variate E_t(v), a fixed function of (seed, t); the law r at that
position chooses argmax_v r(v) / E_t(v), which is distributed exactly as r (the exponential race, the Gumbel-max
trick in other clothes). The target's tokens are then a fixed function of the seed and the prompt: a draft that
races on the same noise proposes tokens, and the verifier keeps a drafted token while it is the target's own
choice at its position, emitting the target's choice at the first mismatch. So `ar`, and `sd` with any drafter, any
draft length and any batch, write the same tokens for a seed; what speculation changes is only how many target
passes they take. The price: a drafted token is kept with probability `match_probability(p, q)`, between
(1 − TV)/(1 + TV) and 1 − TV (token verification's), and exactly p(x) for a fixed proposal x (lookup), as there.

Pure functions of tensors: the noise comes in as rows G_t = -log E_t (standard Gumbel; `verispec.sampling.KeyedNoise`
makes them) and the laws as log-weights (`verispec.sampling.race_scores`), so that a race (`verispec.sampling.race`)
is one add and one argmax, argmax_v log r(v) + G_t(v), the same choice as argmax_v r(v) / E_t(v).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from verispec.sampling import race
from verispec.verify.common import VerifyResult


def keyed_verify(draft_tokens: torch.Tensor, scores: torch.Tensor, gumbel: Sequence[torch.Tensor]) -> VerifyResult:
    """Verify one block by matching: keep drafted token i while it is the target's race choice at its position;
    emit the target's choice at the first mismatch (correction) or after the last token (bonus).

    draft_tokens: [γ] long; scores: [γ+1, V] log-weights of the target laws (processed; a law's log, or
    `race_scores`); gumbel: γ+1 rows [V], row i the noise of the position scores[i] is the law of. With γ = 0 this
    is one keyed draw from row 0 (the autoregressive step)."""
    gamma = draft_tokens.shape[0]
    assert scores.shape[0] == gamma + 1 and len(gumbel) == gamma + 1, (
        f"scores and gumbel must have gamma+1={gamma + 1} rows, got {scores.shape[0]} and {len(gumbel)}")
    return match_choices(draft_tokens.tolist(), lambda i: race(scores[i], gumbel[i]))


def greedy_verify(draft_tokens: Sequence[int], choices: Sequence[int]) -> VerifyResult:
    """Verify one block at T = 0, where the target's law at each position is a point mass on its argmax
    `choices[i]` (γ+1 of them, the first maximum of each row's processed logits): token verification then keeps
    drafted token i iff it is that argmax (min(1, p(x)/q(x)) is 1 or 0, as q is a point mass too) and draws the
    next token from a point mass, the argmax at the first mismatch or after the last token. So this is token
    verification's result (and `ar`'s plain draw at γ = 0) without its float64 laws: the same match as keyed draws,
    on races that are all argmaxes."""
    assert len(choices) == len(draft_tokens) + 1, (
        f"choices must have gamma+1={len(draft_tokens) + 1} entries, got {len(choices)}")
    return match_choices(list(draft_tokens), choices.__getitem__)


def match_choices(drafted: list[int], choose: Callable[[int], int]) -> VerifyResult:
    """Keep drafted token i while it is `choose(i)`, the target's own choice at its position; emit the target's
    choice at the first mismatch, or after the last drafted token. `choose` is called for the rows read only."""
    for i in range(len(drafted) + 1):
        choice = choose(i)
        if i == len(drafted) or choice != drafted[i]:
            return VerifyResult(accepted=i, token=choice)
    raise AssertionError("unreachable")


def match_probability(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Return P(race(log p, G) == race(log q, G)) over G i.i.d. standard Gumbel, exactly, for laws p, q `[..., V]`
    (rows): the probability that keyed verification keeps a token the draft drew from q where the target's law is p.

    Both choose v iff E(u) > E(v)·max(p(u)/p(v), q(u)/q(v)) for every u ≠ v; integrating over E(v) gives
    P(both choose v) = 1 / Σ_u max(p(u)/p(v), q(u)/q(v)) = p(v) / (r(v)·Q(r ≤ r(v)) + P(r > r(v))), with
    r = p/q and Q, P the masses of q and p over the tokens of ratio at most / above r(v) (one sort, O(V log V))."""
    p, q = p.to(torch.float64), q.to(torch.float64)
    both = (p > 0) & (q > 0)  # a token only one law can choose is never a match
    ratio = torch.where(both, p / torch.where(both, q, 1.0), torch.where(p > 0, torch.inf, 0.0))
    ratio, order = torch.sort(ratio, dim=-1)
    p_sorted, q_sorted, both_sorted = p.gather(-1, order), q.gather(-1, order), both.gather(-1, order)
    # Q(r ≤ r(v)) and P(r > r(v)), ties included on the "≤" side: the tied tokens' max terms are equal either way.
    q_upto = q_sorted.cumsum(-1)
    p_above = p_sorted.sum(-1, keepdim=True) - p_sorted.cumsum(-1)
    last_of_tie = torch.searchsorted(ratio.contiguous(), ratio.contiguous(), right=True) - 1
    q_upto, p_above = q_upto.gather(-1, last_of_tie), p_above.gather(-1, last_of_tie)
    denominator = torch.where(both_sorted, ratio * q_upto + p_above, 1.0)
    return torch.where(both_sorted, p_sorted / denominator, 0.0).sum(-1)
