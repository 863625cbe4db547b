"""Closed forms of verispec.theory (docs/algorithms.md §3.3, §3.4, §3.9) against identities and Monte-Carlo runs.

Monte-Carlo comparisons allow 5 standard errors: a correct formula fails with probability about 6e-7 each
(normal approximation), the FALSE_ALARM rate of tests/stats.py.
"""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from tests.stats import FALSE_ALARM, chi_square_pvalue
from verispec import theory
from verispec.verify.approximate import sprinter_verify

Z = 5.0  # standard errors allowed in Monte-Carlo comparisons

P = torch.tensor([0.40, 0.25, 0.20, 0.10, 0.05], dtype=torch.float64)  # target, the same at every position
Q = torch.tensor([0.10, 0.45, 0.15, 0.05, 0.25], dtype=torch.float64)  # draft


def random_pair(seed: int, vocab: int = 6) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    p, q = torch.rand(vocab, generator=gen, dtype=torch.float64), torch.rand(vocab, generator=gen, dtype=torch.float64)
    return p / p.sum(), q / q.sum()


@pytest.mark.parametrize("seed", range(3))
def test_mixture_identities(seed):
    p, q = random_pair(seed)
    for eta_fp in (0.0, 0.3, 1.0):
        law = theory.position_law(p, q, theory.oracle_accept(p, q, 0.8, eta_fp))
        assert torch.allclose(law, theory.mixture_law(p, q, eta_fp), atol=1e-14)  # λ = 1: the mixture (§3.3)
        assert abs(theory.total_variation(law, p) - theory.predicted_tv(p, q, eta_fp)) < 1e-14
    accept = theory.oracle_accept(p, q, 0.8, 0.3, lam=1.4)
    law = theory.position_law(p, q, accept)
    assert abs(float(law.sum()) - 1.0) < 1e-14 and bool((law >= 0).all())
    assert abs(theory.total_variation(law, p) - theory.leak(p, q, accept)) < 1e-14
    assert abs(theory.sd_pass_rate(p, q) - (1.0 - theory.total_variation(p, q))) < 1e-14
    assert torch.allclose(theory.context_law(p, q, 0.0), p) and torch.allclose(theory.context_law(p, q, 1.0), q)


def test_run_length_formulas():
    assert theory.expected_run_length(0.5, cap=None) == 2.0
    assert theory.expected_run_length(0.0, cap=20) == 1.0 and theory.expected_run_length(1.0, cap=20) == 20.0
    # E[T] = Σ_{t=1}^{C} P(T >= t) = Σ π^{t−1}
    assert abs(theory.expected_run_length(0.7, cap=6) - sum(0.7**t for t in range(6))) < 1e-14
    for cap in (None, 5, 20):
        for pi in (0.0, 0.3, 0.9):
            mean = theory.expected_run_length(pi, cap)
            assert abs(theory.acceptance_rate_for_run_length(mean, cap) - pi) < 1e-9
    with pytest.raises(ValueError):
        theory.acceptance_rate_for_run_length(0.5, 20)
    assert abs(theory.sd_expected_tokens(0.6, 4) - sum(0.6**i for i in range(5))) < 1e-14
    assert theory.sd_latency_per_token(0.6, 4, 1.0, 10.0) == pytest.approx(14.0 / theory.sd_expected_tokens(0.6, 4))
    assert theory.sprinter_latency_per_token(3.0, 3.5, 1.0, 10.0, 0.1) == pytest.approx((3.0 * 1.1 + 10.0) / 3.5)
    assert theory.eta_fp_lower_bound(0.9, 0.5) == pytest.approx(0.8)


@pytest.mark.parametrize("eta_tp,eta_fp,r", [(0.95, 0.3, 3), (0.7, 0.5, 1), (1.0, 0.2, 4), (0.6, 0.6, 0)])
def test_paper_theorem_3_3_is_the_expected_accepts_before_the_first_rejection(eta_tp, eta_fp, r):
    # §3.9: r acceptable tokens then unacceptable ones; N = verifier accepts before the first rejection.
    series = sum(math.prod(eta_tp if i < r else eta_fp for i in range(k)) for k in range(1, 3000))
    expected = theory.paper_expected_accepted(eta_tp, eta_fp, r)
    assert abs(expected - series) < 1e-9
    assert expected <= (r - 1) + 1 / (1 - eta_fp) + 1e-12  # the review's bound
    if eta_tp == eta_fp:  # i.i.d. decisions with π = η: E[T] − 1 of §3.4, uncapped
        assert abs(expected - (theory.expected_run_length(eta_tp) - 1)) < 1e-12


def simulate_rounds(p, q, eta_tp, eta_fp, cap, rounds, seed):
    """Run `rounds` SPRINTER rounds with a context-free pair and an oracle verifier; return T, N, first tokens."""
    gen = torch.Generator().manual_seed(seed)
    accept = theory.oracle_accept(p, q, eta_tp, eta_fp)
    lengths, tokens, firsts = [], [], []
    for _ in range(rounds):
        run = []
        while True:  # §3.1: draft until the verifier rejects or the cap is reached
            x = int(torch.multinomial(q, 1, generator=gen))
            run.append(x)
            if float(torch.rand(1, generator=gen, dtype=torch.float64)) >= accept[x] or len(run) >= cap:
                break
        t = len(run)
        result = sprinter_verify(torch.tensor(run), q.expand(t, -1), p.expand(t + 1, -1), generator=gen)
        emitted = run[: result.accepted] + [result.token]
        lengths.append(t)
        tokens.append(len(emitted))
        firsts.append(emitted[0])
    return torch.tensor(lengths, dtype=torch.float64), torch.tensor(tokens, dtype=torch.float64), firsts


def within(sample: torch.Tensor, expected: float) -> bool:
    return abs(float(sample.mean()) - expected) <= Z * float(sample.std()) / math.sqrt(sample.numel())


@pytest.mark.parametrize("eta_tp,eta_fp,cap", [(0.9, 0.3, 4), (0.95, 0.6, 20)])
def test_run_length_and_tokens_per_round_match_monte_carlo(eta_tp, eta_fp, cap):
    t, n, firsts = simulate_rounds(P, Q, eta_tp, eta_fp, cap, rounds=6000, seed=cap)
    alpha = theory.label_rate(P, Q)
    pi = theory.acceptance_rate(alpha, eta_tp, eta_fp)
    accept = theory.oracle_accept(P, Q, eta_tp, eta_fp)
    assert abs(pi - float((Q * accept).sum())) < 1e-14
    assert within(t, theory.expected_run_length(pi, cap))
    beta, pass_rejected = theory.sd_pass_rate(P, Q), theory.pass_rate_on_reject(P, Q, accept)
    predicted = theory.expected_tokens_per_round(pi, cap, pass_rejected, beta)
    assert within(n, predicted)
    # the pass rate of the last token, N − T, separately: it has the power to reject §3.4's context-only form
    # (pass rate β for every last token), which is wrong for a token-aware verifier
    at_cap = pi ** (cap - 1)
    assert within(n - t, (1 - at_cap) * pass_rejected + at_cap * beta)
    assert not within(n - t, beta)
    # and the first token of each round follows the mixture law (§3.3)
    law = theory.mixture_law(P, Q, eta_fp)
    assert chi_square_pvalue(Counter(firsts), {v: float(law[v]) for v in range(5)}) > FALSE_ALARM
