"""Block verification (docs/algorithms.md §1) is lossless, matches §1.5's marginals, and never accepts less than TV."""

from __future__ import annotations

from fractions import Fraction
from functools import partial
from itertools import product

import pytest
import torch

from tests.stats import max_abs_diff, target_law
from tests.verify.exact import block_inputs, expected_accepted, speculative_law
from verispec.models.tabular import TabularLM
from verispec.verify import BlockLaw, VerifyResult, block_verify, block_verify_law, draw, token_verify_law
from verispec.verify.block import stop_from_hazards

CONTEXT = [0, 1]


def pair(vocab: int, seed: int) -> tuple[TabularLM, TabularLM]:
    """Return (target, draft): two unrelated context-dependent tabular models, the draft peakier."""
    return TabularLM(vocab, seed=10 + seed), TabularLM(vocab, seed=20 + seed, sharpness=2.0)


@pytest.mark.parametrize("vocab,gamma", [(3, 1), (3, 2), (3, 3), (4, 2)])
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("use_kernel", [True, False], ids=["kernel", "torch"])
def test_block_verification_reproduces_the_target_law_exactly(vocab, gamma, seed, use_kernel):
    target, draft = pair(vocab, seed)
    law_fn = partial(block_verify_law, use_kernel=use_kernel)
    law = speculative_law(law_fn, target, draft, CONTEXT, gamma, gamma + 1)  # rounds until γ+1 tokens
    assert abs(sum(law.values()) - 1.0) < 1e-12
    assert max_abs_diff(law, target_law(target, CONTEXT, gamma + 1)) < 1e-12


def tv_residual(draft_tokens, q, p) -> BlockLaw:
    law = block_verify_law(draft_tokens, q, p)  # BV's τ, but the TV residual norm((p − q)_+)
    return BlockLaw(stop=law.stop, weights=torch.ones_like(law.weights), q=law.q, p=law.p)


def tv_hazards(draft_tokens, q, p) -> BlockLaw:
    law = block_verify_law(draft_tokens, q, p)  # BV's residual, but h_i = w_i instead of ρ_i/(ρ_i + 1 − w_i)
    h = law.weights.clone()
    h[0] = 1.0
    return BlockLaw(stop=stop_from_hazards(h), weights=law.weights, q=law.q, p=law.p)


@pytest.mark.parametrize("variant", [tv_residual, tv_hazards])
def test_enumeration_catches_bv_with_a_wrong_piece(variant):
    # The exact check must be able to fail: each half of BV is wrong without the other (§1.2, §1.3).
    target, draft = pair(3, 0)
    law = speculative_law(variant, target, draft, CONTEXT, 3, 4)
    assert max_abs_diff(law, target_law(target, CONTEXT, 4)) > 1e-3


def test_stop_and_reach_probabilities_are_those_of_section_1_5():
    # §1.5: P(τ ≥ i, X^i = x^i) = Q(x^i)·w_i and P(τ = i, X^i = x^i) = Q(x^i)·ρ_i, summing over the continuations.
    target, draft = pair(3, 1)
    gamma = 3
    reach, stop, weight_of = {}, {}, {}
    for block in product(range(3), repeat=gamma):
        law = block_verify_law(*block_inputs(target, draft, CONTEXT, block))
        prob = draft.sequence_prob(CONTEXT, block)
        for i in range(gamma + 1):
            reach[block[:i]] = reach.get(block[:i], 0.0) + prob * float(law.stop[i:].sum())
            stop[block[:i]] = stop.get(block[:i], 0.0) + prob * float(law.stop[i])
            weight_of[block[:i]] = float(law.weights[i])
    for prefix in reach:
        i, mass = len(prefix), draft.sequence_prob(CONTEXT, prefix)
        ctx = CONTEXT + list(prefix)
        w_p = weight_of[prefix] * target.conditional(ctx)
        rho = float((w_p - draft.conditional(ctx)).clamp_min(0).sum()) if i < gamma else weight_of[prefix]
        assert reach[prefix] == pytest.approx(mass * weight_of[prefix], abs=1e-14)
        assert stop[prefix] == pytest.approx(mass * rho, abs=1e-14)


class IIDModel:
    """A context-independent model: the same next-token law after every prefix."""

    def __init__(self, probs: list[float]) -> None:
        self.probs = torch.tensor(probs, dtype=torch.float64)
        self.vocab_size = len(probs)

    def conditional(self, prefix) -> torch.Tensor:
        return self.probs

    def sequence_prob(self, context, continuation) -> float:
        return float(torch.prod(self.probs[list(continuation)])) if continuation else 1.0


def ideal_accepted(target, draft, gamma: int) -> float:
    """Return Σ_i Σ_{x^i} min(Q(x^i), P(x^i)): the most any lossless verifier can accept (§1.6 'full-joint')."""
    return sum(
        min(draft.sequence_prob([], x), target.sequence_prob([], x))
        for i in range(1, gamma + 1)
        for x in product(range(target.vocab_size), repeat=i)
    )


def test_binary_example_of_section_1_6():
    # §1.6 states only "binary vocabulary, context-independent models"; these p, q, γ give exactly its numbers:
    # p = (1/3, 2/3), q = (2/3, 1/3), γ = 2 → TV 10/9, BV 11/9, ideal 12/9 expected accepted tokens per block.
    target, draft = IIDModel([1 / 3, 2 / 3]), IIDModel([2 / 3, 1 / 3])
    tv = expected_accepted(token_verify_law, target, draft, [], 2)
    bv = expected_accepted(block_verify_law, target, draft, [], 2)
    assert Fraction(tv).limit_denominator(100) == Fraction(10, 9) and tv == pytest.approx(10 / 9, abs=1e-14)
    assert Fraction(bv).limit_denominator(100) == Fraction(11, 9) and bv == pytest.approx(11 / 9, abs=1e-14)
    assert ideal_accepted(target, draft, 2) == pytest.approx(12 / 9, abs=1e-14)


@pytest.mark.parametrize("vocab,gamma,instances", [(3, 3, 200), (4, 4, 8)])
def test_block_verification_never_accepts_less_than_token_verification(vocab, gamma, instances):
    # §1.6: BV is optimal among lossless single-path verifiers, so E[τ_BV] ≥ E[τ_TV]; and no lossless verifier
    # accepts more than the ideal. The instances vary the draft's sharpness so that both near and far pairs occur.
    gains = []
    for seed in range(instances):
        target = TabularLM(vocab, seed=1000 + seed)
        draft = TabularLM(vocab, seed=2000 + seed, sharpness=0.5 + (seed % 5) * 0.5)
        tv = expected_accepted(token_verify_law, target, draft, [seed % vocab], gamma)
        bv = expected_accepted(block_verify_law, target, draft, [seed % vocab], gamma)
        upper = sum(
            min(draft.sequence_prob([seed % vocab], x), target.sequence_prob([seed % vocab], x))
            for i in range(1, gamma + 1)
            for x in product(range(vocab), repeat=i)
        )
        assert tv - 1e-12 <= bv <= upper + 1e-12
        gains.append(bv - tv)
    assert max(gains) > 1e-2  # BV is not just TV in disguise


def test_identical_models_accept_everything():
    # p = q: every ρ_i = 0, so h_i = 0 in the middle (§1.4) and h_γ = w_γ = 1.
    model = TabularLM(4, seed=3)
    law = block_verify_law(*block_inputs(model, model, [0], (1, 2, 3)))
    assert torch.equal(law.stop, torch.tensor([0, 0, 0, 1], dtype=torch.float64))


def test_greedy_point_masses_accept_while_argmaxes_agree():
    onehot = lambda t: torch.nn.functional.one_hot(torch.tensor(t), 5).to(torch.float64)  # noqa: E731
    q = torch.stack([onehot(1), onehot(2), onehot(3)])
    p = torch.stack([onehot(1), onehot(2), onehot(4), onehot(0)])
    assert block_verify(torch.tensor([1, 2, 3]), q, p) == VerifyResult(accepted=2, token=4)


def test_drafted_token_with_zero_draft_probability_does_not_divide_by_zero():
    # §1.4: q(x_i) = 0 cannot happen in exact arithmetic; the clamp keeps the law finite.
    q = torch.tensor([[1.0, 0.0], [0.5, 0.5]], dtype=torch.float64)
    p = torch.tensor([[0.5, 0.5], [0.5, 0.5], [0.5, 0.5]], dtype=torch.float64)
    law = block_verify_law(torch.tensor([1, 0]), q, p)
    assert torch.isfinite(law.stop).all() and law.stop.sum() == pytest.approx(1.0)


def test_empty_block_samples_from_p():
    p = torch.tensor([[0.0, 1.0, 0.0]], dtype=torch.float64)
    assert block_verify(torch.empty(0, dtype=torch.long), torch.empty(0, 3), p) == VerifyResult(0, 1)


def test_block_verify_draws_from_its_law_with_the_given_generator():
    target, draft = pair(4, 2)
    inputs = block_inputs(target, draft, CONTEXT, (0, 3, 1))
    law = block_verify_law(*inputs)
    for seed in range(20):
        expected = draw(law, torch.Generator().manual_seed(seed))
        assert block_verify(*inputs, torch.Generator().manual_seed(seed)) == expected


def test_shape_contract_is_checked():
    with pytest.raises(AssertionError, match="q must be"):
        block_verify(torch.tensor([0, 1]), torch.rand(3, 3), torch.rand(3, 3))
