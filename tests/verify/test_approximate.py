"""SPRINTER's approximate verification (docs/algorithms.md §3.1, §3.3): exact laws on tabular models.

A round is enumerated exactly: every drafted run, every decision of an oracle verifier that accepts acceptable
tokens (q ≤ λp) with probability η_TP and the others with η_FP, then `sprinter_verify_law`'s BlockLaw.
"""

from __future__ import annotations

from collections import Counter, defaultdict

import pytest
import torch

import verispec.verify.common as common
from tests.stats import FALSE_ALARM, chi_square_pvalue, max_abs_diff, target_law
from tests.verify.exact import block_inputs, speculative_law
from verispec import theory
from verispec.models.tabular import TabularLM
from verispec.verify import token_verify_law
from verispec.verify.approximate import sprinter_verify, sprinter_verify_law

PAIRS = [(4, 0), (3, 1)]  # (V, seed)


def models(vocab: int, seed: int) -> tuple[TabularLM, TabularLM]:
    return TabularLM(vocab, seed=10 + seed), TabularLM(vocab, seed=20 + seed, sharpness=2.0)


def oracle(target: TabularLM, draft: TabularLM, eta_tp: float, eta_fp: float, lam: float = 1.0):
    """Return a(ctx, x) of the token-aware oracle verifier."""

    def accept(ctx: tuple[int, ...], x: int) -> float:
        return float(theory.oracle_accept(target.conditional(ctx), draft.conditional(ctx), eta_tp, eta_fp, lam)[x])

    return accept


def round_outcomes(target, draft, context, cap, accept):
    """Return [(drafted run, probability that the round drafts exactly this run, its BlockLaw)] (§3.1 loop)."""
    out = []

    def walk(run: tuple[int, ...], mass: float) -> None:
        ctx = tuple(context) + run
        q = draft.conditional(ctx)
        for x in range(draft.vocab_size):
            keep = accept(ctx, x) if len(run) + 1 < cap else 0.0  # the run ends at the cap whatever V says
            if keep > 0:
                walk(run + (x,), mass * float(q[x]) * keep)
            ended = run + (x,)
            out.append((ended, mass * float(q[x]) * (1.0 - keep),
                        sprinter_verify_law(*block_inputs(target, draft, list(context), ended))))

    walk((), 1.0)
    return out


def round_law(outcomes) -> dict:
    """Return {emitted tokens: probability} of one round."""
    law: dict = defaultdict(float)
    for run, mass, block_law in outcomes:
        joint = block_law.joint()  # [T+1, V]
        for tau in range(len(run) + 1):
            for y in range(joint.shape[1]):
                if mass * float(joint[tau, y]) > 0:
                    law[run[:tau] + (y,)] += mass * float(joint[tau, y])
    return dict(law)


def position_laws(outcomes, vocab: int) -> dict[tuple[int, ...], torch.Tensor]:
    """Return {prefix r: law [V] of the j-th emitted token given the run reached j = len(r)+1 after drafting r}."""
    laws: dict = defaultdict(lambda: torch.zeros(vocab, dtype=torch.float64))
    for run, mass, block_law in outcomes:
        joint = block_law.joint()
        for j in range(1, len(run) + 1):  # the run reached position j: tokens 1..j−1 were verifier-accepted
            prefix = run[: j - 1]
            if j < len(run):  # x_j was accepted by the verifier too: emitted unchecked
                laws[prefix][run[j - 1]] += mass
            else:  # x_j = x_T: the SD test, then x_T (τ = T) or the residual (τ = T − 1)
                laws[prefix][run[j - 1]] += mass * float(block_law.stop[j])
                laws[prefix] += mass * joint[j - 1]
    return {prefix: law / law.sum() for prefix, law in laws.items()}


def test_law_commits_all_but_the_last_token_unchecked():
    q = torch.tensor([[0.5, 0.3, 0.2], [0.2, 0.2, 0.6], [0.1, 0.8, 0.1]], dtype=torch.float64)
    p = torch.tensor([[0.1, 0.1, 0.8], [0.6, 0.2, 0.2], [0.3, 0.4, 0.3], [0.2, 0.3, 0.5]], dtype=torch.float64)
    law = sprinter_verify_law(torch.tensor([0, 2, 1]), q, p)  # x_1, x_2 would fail SD; x_3 passes w.p. 0.5
    assert torch.allclose(law.stop, torch.tensor([0.0, 0.0, 0.5, 0.5], dtype=torch.float64))
    residual = torch.tensor([0.2, 0.0, 0.2], dtype=torch.float64) / 0.4  # norm((p[2] − q[2])_+)
    assert torch.allclose(law.residual(2), residual)
    assert torch.equal(law.residual(3), p[3])  # the bonus


def test_reject_everything_is_token_verification_with_gamma_1():
    target, draft = models(4, 0)
    for x in range(4):
        inputs = block_inputs(target, draft, [0, 1], (x,))
        assert torch.allclose(sprinter_verify_law(*inputs).joint(), token_verify_law(*inputs).joint(), atol=1e-15)
    # run lengths of 1 everywhere = SD with γ = 1, which is lossless
    law = speculative_law(sprinter_verify_law, target, draft, [0, 1], gamma=1, n=3)
    assert max_abs_diff(law, target_law(target, [0, 1], 3)) < 1e-12


@pytest.mark.parametrize("vocab,seed", PAIRS)
@pytest.mark.parametrize("eta_tp,eta_fp", [(0.9, 0.3), (0.6, 0.0), (1.0, 0.7)])
def test_each_drafted_position_follows_the_mixture_law(vocab, seed, eta_tp, eta_fp):
    # §3.3: token-aware verifier, λ = 1 -> (1 − η_FP)·p + η_FP·q below the cap; exactly p at the cap.
    target, draft = models(vocab, seed)
    cap, context = 3, (0, 1)
    outcomes = round_outcomes(target, draft, context, cap, oracle(target, draft, eta_tp, eta_fp))
    assert abs(sum(m for _, m, _ in outcomes) - 1.0) < 1e-12
    laws = position_laws(outcomes, vocab)
    if eta_fp > 0:  # every prefix is reachable (with η_FP = 0 only runs of acceptable tokens are)
        assert len(laws) == sum(vocab**i for i in range(cap))
    for prefix, law in laws.items():
        ctx = context + prefix
        p, q = target.conditional(ctx), draft.conditional(ctx)
        expected = p if len(prefix) + 1 == cap else theory.mixture_law(p, q, eta_fp)
        assert torch.allclose(law, expected, atol=1e-12, rtol=0), (prefix, law, expected)
    # the whole round agrees with the closed-form round recursion of theory.py
    reference = theory.sprinter_round_law(target.conditional, draft.conditional,
                                          oracle(target, draft, eta_tp, eta_fp), context, cap)
    assert max_abs_diff(round_law(outcomes), reference) < 1e-12


@pytest.mark.parametrize("lam", [1.0, 1.5])
def test_general_position_law_and_leak(lam):
    # §3.3 general formula (any a(x)); with λ > 1 the leak ε also counts acceptable over-proposed tokens.
    target, draft = models(4, 0)
    outcomes = round_outcomes(target, draft, (0,), 2, oracle(target, draft, 0.8, 0.25, lam))
    law = position_laws(outcomes, 4)[()]
    p, q = target.conditional((0,)), draft.conditional((0,))
    accept = theory.oracle_accept(p, q, 0.8, 0.25, lam)
    assert torch.allclose(law, theory.position_law(p, q, accept), atol=1e-12)
    over = (q - p).clamp_min(0)
    eps = 0.25 * float(over[q > lam * p].sum()) + 0.8 * float(over[(q > p) & (q <= lam * p)].sum())
    assert abs(theory.total_variation(law, p) - eps) < 1e-12


def test_context_only_verifier_switches_between_q_and_p():
    target, draft = models(4, 1)
    always = round_outcomes(target, draft, (2,), 3, lambda ctx, x: 1.0 if len(ctx) < 2 else 0.0)
    laws = position_laws(always, 4)
    assert torch.allclose(laws[()], draft.conditional((2,)), atol=1e-12)  # a(c) = 1: pure draft
    assert torch.allclose(laws[(3,)], target.conditional((2, 3)), atol=1e-12)  # a(c) = 0: exactly the target


def test_the_mixture_check_can_fail(monkeypatch):
    # Resampling a failed last token from p instead of norm((p − q)_+) breaks the law; the check must notice.
    monkeypatch.setattr(common, "positive_residual", lambda scaled_p, q, fallback: fallback)
    target, draft = models(4, 0)
    laws = position_laws(round_outcomes(target, draft, (0, 1), 3, oracle(target, draft, 0.9, 0.3)), 4)
    p, q = target.conditional((0, 1)), draft.conditional((0, 1))
    assert float((laws[()] - theory.mixture_law(p, q, 0.3)).abs().max()) > 1e-3


def sprinter_sequence_law(target, draft, context, cap, accept, n):
    """Return the exact law of the first n tokens of SPRINTER decoding, rounds chained."""
    memo: dict = {}

    def rest(ctx: tuple[int, ...], m: int) -> dict:
        if ctx + (m,) not in memo:
            law: dict = defaultdict(float)
            for emitted, prob in round_law(round_outcomes(target, draft, ctx, cap, accept)).items():
                if len(emitted) >= m:
                    law[emitted[:m]] += prob
                    continue
                for tail, tail_prob in rest(ctx + emitted, m - len(emitted)).items():
                    law[emitted + tail] += prob * tail_prob
            memo[ctx + (m,)] = law
        return memo[ctx + (m,)]

    return dict(rest(tuple(context), n))


@pytest.mark.parametrize("eta_fp,lossless", [(0.0, True), (0.3, False)])
def test_a_perfect_verifier_is_lossless(eta_fp, lossless):
    # §3.3: η_FP = 0 gives exactly the target's sequence law, whatever η_TP; η_FP > 0 does not.
    target, draft = models(3, 1)
    law = sprinter_sequence_law(target, draft, (0,), 2, oracle(target, draft, 0.7, eta_fp), n=3)
    assert abs(sum(law.values()) - 1.0) < 1e-12
    diff = max_abs_diff(law, target_law(target, [0], 3))
    assert (diff < 1e-12) if lossless else (diff > 1e-3)


def test_sprinter_verify_draws_from_its_law():
    target, draft = models(4, 0)
    inputs = block_inputs(target, draft, [1], (2, 0, 3))
    joint = sprinter_verify_law(*inputs).joint()
    generator = torch.Generator().manual_seed(0)
    counts = Counter()
    for _ in range(4000):
        result = sprinter_verify(*inputs, generator=generator)
        counts[(result.accepted, result.token)] += 1
    probs = {(t, y): float(joint[t, y]) for t in range(4) for y in range(4) if joint[t, y] > 0}
    assert chi_square_pvalue(counts, probs) > FALSE_ALARM
