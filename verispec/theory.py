"""Closed-form predictions for SPRINTER (docs/algorithms.md §3.3, §3.4, §3.8, §3.9), to set against measurements.

Notation (p = target, q = draft, one position with its context): a(x) is the probability that the verifier accepts
the draft token x; η_TP = P(accept | q(x) ≤ λp(x)) and η_FP = P(accept | q(x) > λp(x)); α = P_{x~q}(q(x) ≤ λp(x));
π = α·η_TP + (1 − α)·η_FP is the verifier's acceptance rate; β = Σ_v min(p(v), q(v)) is SD's acceptance rate;
C is the cap on draft tokens per round; T is the number of tokens drafted in a round and N the number it commits.
Distributions are float64 tensors `[V]`; everything else is a plain float.
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Callable, Sequence

import torch


def total_variation(p: torch.Tensor, q: torch.Tensor) -> float:
    """Return TV(p, q) = ½·Σ|p − q| = Σ(p − q)_+ for two distributions `[V]`."""
    return float(0.5 * (p.to(torch.float64) - q.to(torch.float64)).abs().sum())


def sd_pass_rate(p: torch.Tensor, q: torch.Tensor) -> float:
    """Return β = Σ_v min(p(v), q(v)) = 1 − TV(p, q): the probability that x ~ q passes the SD test (§3.4)."""
    return float(torch.minimum(p.to(torch.float64), q.to(torch.float64)).sum())


def mixture_law(p: torch.Tensor, q: torch.Tensor, eta_fp: float) -> torch.Tensor:
    """Return (1 − η_FP)·p + η_FP·q `[V]`: SPRINTER's law at a drafted position, token-aware verifier, λ = 1 (§3.3,
    the paper's Theorem 3.1 in §3.9). η_TP does not enter: it changes the speed, not the law."""
    return (1.0 - eta_fp) * p.to(torch.float64) + eta_fp * q.to(torch.float64)


def predicted_tv(p: torch.Tensor, q: torch.Tensor, eta_fp: float) -> float:
    """Return the predicted TV(P_out, p) = η_FP·TV(p, q) (§3.3, token-aware verifier at λ = 1)."""
    return eta_fp * total_variation(p, q)


def oracle_accept(p: torch.Tensor, q: torch.Tensor, eta_tp: float, eta_fp: float, lam: float = 1.0) -> torch.Tensor:
    """Return a(x) `[V]` of a token-aware verifier that accepts acceptable tokens (q(x) ≤ λp(x)) with probability
    η_TP and the others with probability η_FP (§3.3)."""
    acceptable = q.to(torch.float64) <= lam * p.to(torch.float64)
    ones = torch.ones(acceptable.shape, dtype=torch.float64)
    return torch.where(acceptable, eta_tp * ones, eta_fp * ones)  # float64 throughout: exact tests compare to 1e-12


def position_law(p: torch.Tensor, q: torch.Tensor, accept: torch.Tensor) -> torch.Tensor:
    """Return SPRINTER's output law `[V]` at a drafted position below the cap, for a verifier accepting x with
    probability a(x) = accept[x] (§3.3, general formula):

        P_out = p + a·(q − p)_+ − ε·(p − q)_+ / Z,   Z = TV(p, q),   ε = Σ_v a(v)·(q(v) − p(v))_+.
    """
    p, q, accept = p.to(torch.float64), q.to(torch.float64), accept.to(torch.float64)
    over, under = (q - p).clamp_min(0.0), (p - q).clamp_min(0.0)
    z = float(under.sum())
    if z <= 0.0:
        return p.clone()
    return p + accept * over - leak(p, q, accept) * under / z


def leak(p: torch.Tensor, q: torch.Tensor, accept: torch.Tensor) -> float:
    """Return ε = Σ_v a(v)·(q(v) − p(v))_+ = TV(P_out, p), the mass leaked by false accepts (§3.3).

    For the oracle of `oracle_accept` this is η_FP·Σ_{q>λp}(q − p) + η_TP·Σ_{p<q≤λp}(q − p) (§3.3, λ > 1)."""
    return float((accept.to(torch.float64) * (q.to(torch.float64) - p.to(torch.float64)).clamp_min(0.0)).sum())


def context_law(p: torch.Tensor, q: torch.Tensor, accept_context: float) -> torch.Tensor:
    """Return a(c)·q + (1 − a(c))·p `[V]`: the law under a context-only verifier (§3.3 "released verifier")."""
    return accept_context * q.to(torch.float64) + (1.0 - accept_context) * p.to(torch.float64)


def label_rate(p: torch.Tensor, q: torch.Tensor, lam: float = 1.0) -> float:
    """Return α = P_{x~q}(q(x) ≤ λ·p(x)), the share of draft tokens labelled acceptable (§3.4)."""
    p, q = p.to(torch.float64), q.to(torch.float64)
    return float(q[q <= lam * p].sum())


def acceptance_rate(alpha: float, eta_tp: float, eta_fp: float) -> float:
    """Return π = α·η_TP + (1 − α)·η_FP, the verifier's acceptance rate under §3.4's i.i.d. assumption."""
    return alpha * eta_tp + (1.0 - alpha) * eta_fp


def expected_run_length(pi: float, cap: int | None = None) -> float:
    """Return E[T] = (1 − π^C)/(1 − π), the expected draft steps per round, T = min(Geometric(1 − π), C) (§3.4);
    1/(1 − π) without a cap."""
    if cap is None:
        return math.inf if pi >= 1.0 else 1.0 / (1.0 - pi)
    if pi >= 1.0:
        return float(cap)
    return (1.0 - pi**cap) / (1.0 - pi)


def acceptance_rate_for_run_length(mean_run_length: float, cap: int | None = None) -> float:
    """Return the π whose E[T] (`expected_run_length`) equals `mean_run_length`: the inverse of §3.4's formula
    (§3.8 uses it to read π off a measured run length). Needs 1 ≤ mean_run_length (< cap when capped)."""
    if mean_run_length < 1.0 or (cap is not None and mean_run_length > cap):
        raise ValueError(f"a mean run length must lie in [1, cap={cap}], got {mean_run_length}")
    if cap is None:
        return 1.0 - 1.0 / mean_run_length
    if mean_run_length >= cap:
        return 1.0
    lo, hi = 0.0, 1.0  # E[T] increases with π: bisection to double precision
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if expected_run_length(mid, cap) < mean_run_length else (lo, mid)
    return 0.5 * (lo + hi)


def pass_rate_on_reject(p: torch.Tensor, q: torch.Tensor, accept: torch.Tensor) -> float:
    """Return P(x passes the SD test | the verifier rejected x) = Σ q·(1 − a)·min(1, p/q) / (1 − π) [derived from
    §3.4]; equal to β when the verifier does not look at the token (a constant)."""
    p, q, accept = p.to(torch.float64), q.to(torch.float64), accept.to(torch.float64)
    reject = float((q * (1.0 - accept)).sum())
    if reject <= 0.0:
        return sd_pass_rate(p, q)
    return float(((1.0 - accept) * torch.minimum(p, q)).sum()) / reject


def expected_tokens_per_round(
    pi: float, cap: int | None, pass_rejected: float, pass_cap: float | None = None
) -> float:
    """Return E[N] = E[T] + P(the last token passes the SD test) (§3.4), i.i.d. verifier decisions.

    The last token is a verifier rejection with probability 1 − π^{C−1} (it then passes with `pass_rejected`) and
    the cap-th token otherwise (unconditioned, so it passes with `pass_cap` = β; default `pass_rejected`). For a
    context-only verifier both are β and this is §3.4's E[N] = (1 − π^C)/(1 − π) + β.
    """
    pass_cap = pass_rejected if pass_cap is None else pass_cap
    at_cap = 0.0 if cap is None else pi ** (cap - 1)
    return expected_run_length(pi, cap) + (1.0 - at_cap) * pass_rejected + at_cap * pass_cap


def paper_expected_accepted(eta_tp: float, eta_fp: float, r: int) -> float:
    """Return the paper's Theorem 3.3 (§3.9): E[N] = (η_TP − η_TP^r)/(1 − η_TP) + η_TP^r/(1 − η_FP).

    Its model: a run's ground truth is r acceptable tokens, then unacceptable ones, with i.i.d. verifier decisions,
    no cap; N counts the tokens the verifier accepts before its first rejection (the paper's "tokens accepted
    before the target is invoked"; E[T] − 1 in §3.4's terms). The review's bound E[N] ≤ (r − 1) + 1/(1 − η_FP)
    follows from η_TP ≤ 1.
    """
    head = float(r - 1) if eta_tp == 1.0 else (eta_tp - eta_tp**r) / (1.0 - eta_tp)
    return head + eta_tp**r / (1.0 - eta_fp)


def eta_fp_lower_bound(pi: float, alpha: float) -> float:
    """Return the smallest η_FP consistent with an acceptance rate π: (π − α)/(1 − α), since η_TP ≤ 1 (§3.8)."""
    return max(0.0, (pi - alpha) / (1.0 - alpha)) if alpha < 1.0 else 0.0


def sd_expected_tokens(beta: float, gamma: int) -> float:
    """Return E[N_SD] = (1 − β^{γ+1})/(1 − β): standard SD's tokens per round with draft length γ (§3.4)."""
    return float(gamma + 1) if beta >= 1.0 else (1.0 - beta ** (gamma + 1)) / (1.0 - beta)


def sprinter_latency_per_token(
    expected_run: float, expected_tokens: float, draft_cost: float, target_cost: float, verifier_cost: float = 0.0
) -> float:
    """Return SPRINTER's predicted seconds per token ≈ [E[T]·(c_q + c_v) + c_p] / E[N] (§3.4)."""
    return (expected_run * (draft_cost + verifier_cost) + target_cost) / expected_tokens


def sd_latency_per_token(beta: float, gamma: int, draft_cost: float, target_cost: float) -> float:
    """Return standard SD's predicted seconds per token ≈ [γ·c_q + c_p] / E[N_SD] (§3.4)."""
    return (gamma * draft_cost + target_cost) / sd_expected_tokens(beta, gamma)


Conditional = Callable[[tuple[int, ...]], torch.Tensor]


def sprinter_round_law(
    p_fn: Conditional,
    q_fn: Conditional,
    accept_fn: Callable[[tuple[int, ...], int], float],
    context: Sequence[int],
    cap: int,
) -> dict[tuple[int, ...], float]:
    """Return {tokens one round emits: probability} for one SPRINTER round, computed from §3.1's rules directly.

    p_fn / q_fn: context tuple -> `[V]` float64 law; accept_fn(context, x): the verifier's probability of
    accepting x. At a position below the cap, x ~ q is kept and the run goes on with probability a(x); otherwise
    x is tested: on a pass x and a bonus from p are emitted, on a fail the residual norm((p − q)_+). At the cap
    the test always runs. For exact tests on tiny vocabularies (cost V^cap).
    """
    assert cap >= 1, f"the cap must be >= 1, got {cap}"
    law: dict[tuple[int, ...], float] = defaultdict(float)

    def walk(ctx: tuple[int, ...], emitted: tuple[int, ...], mass: float, position: int) -> None:
        p, q = p_fn(ctx).to(torch.float64), q_fn(ctx).to(torch.float64)
        residual = (p - q).clamp_min(0.0)
        fail_mass = 0.0
        for x in range(q.shape[0]):
            qx = float(q[x])
            if qx == 0.0:
                continue
            keep = 0.0 if position == cap else accept_fn(ctx, x)
            passes = min(1.0, float(p[x]) / qx)
            if keep > 0.0:
                walk(ctx + (x,), emitted + (x,), mass * qx * keep, position + 1)
            tested = mass * qx * (1.0 - keep)
            fail_mass += tested * (1.0 - passes)
            if tested * passes > 0.0:
                bonus = p_fn(ctx + (x,)).to(torch.float64)
                for y in range(bonus.shape[0]):
                    if float(bonus[y]) > 0.0:
                        law[emitted + (x, y)] += tested * passes * float(bonus[y])
        if fail_mass > 0.0:
            residual = residual / residual.sum()
            for y in range(residual.shape[0]):
                if float(residual[y]) > 0.0:
                    law[emitted + (y,)] += fail_mass * float(residual[y])

    walk(tuple(int(t) for t in context), (), 1.0, 1)
    return dict(law)
