"""Token verification (speculative sampling) is lossless: exact enumeration on tabular models."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

import verispec.verify.common as common
from tests.stats import FALSE_ALARM, chi_square_pvalue, max_abs_diff, target_law
from tests.verify.exact import block_inputs, speculative_law
from verispec.models.tabular import TabularLM
from verispec.verify import VerifyResult, draw, token_verify, token_verify_law

CASES = [(4, 1), (4, 2), (3, 3)]  # (V, γ): the law of γ+1 tokens; V = 3 at γ = 3 keeps enumeration quick


@pytest.mark.parametrize("vocab,gamma", CASES)
@pytest.mark.parametrize("seed", [0, 1])
def test_token_verification_reproduces_the_target_law_exactly(vocab, gamma, seed):
    target, draft = TabularLM(vocab, seed=10 + seed), TabularLM(vocab, seed=20 + seed, sharpness=2.0)
    context = [0, 1]
    law = speculative_law(token_verify_law, target, draft, context, gamma, gamma + 1)
    assert abs(sum(law.values()) - 1.0) < 1e-12
    assert max_abs_diff(law, target_law(target, context, gamma + 1)) < 1e-12


@pytest.mark.parametrize("vocab,gamma", CASES)
def test_enumeration_catches_a_residual_replaced_by_p(monkeypatch, vocab, gamma):
    # The check must be able to fail: resampling the correction from p instead of norm((p - q)_+) is biased.
    monkeypatch.setattr(common, "positive_residual", lambda scaled_p, q, fallback: fallback)
    target, draft = TabularLM(vocab, seed=10), TabularLM(vocab, seed=20, sharpness=2.0)
    law = speculative_law(token_verify_law, target, draft, [0, 1], gamma, gamma + 1)
    assert max_abs_diff(law, target_law(target, [0, 1], gamma + 1)) > 1e-3


def test_identical_models_accept_everything():
    model = TabularLM(4, seed=3)
    law = token_verify_law(*block_inputs(model, model, [0], (1, 2, 3)))
    assert torch.allclose(law.stop, torch.tensor([0, 0, 0, 1], dtype=torch.float64))


def test_greedy_point_masses_accept_while_argmaxes_agree():
    vocab = 5
    onehot = lambda t: torch.nn.functional.one_hot(torch.tensor(t), vocab).to(torch.float64)  # noqa: E731
    q = torch.stack([onehot(1), onehot(2), onehot(3)])
    p = torch.stack([onehot(1), onehot(2), onehot(4), onehot(0)])
    result = token_verify(torch.tensor([1, 2, 3]), q, p, torch.Generator().manual_seed(0))
    assert result == VerifyResult(accepted=2, token=4)
    all_agree = token_verify(torch.tensor([1, 2]), q[:2], torch.stack([onehot(1), onehot(2), onehot(0)]))
    assert all_agree == VerifyResult(accepted=2, token=0)  # the bonus token


def test_empty_block_samples_from_p():
    p = torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64)
    assert token_verify(torch.empty(0, dtype=torch.long), torch.empty(0, 3), p) == VerifyResult(0, 2)


def test_draw_follows_the_law():
    """Monte-Carlo: 20,000 draws against the exact joint law of (τ, y); false alarm ≤ 1e-6."""
    target, draft = TabularLM(4, seed=5), TabularLM(4, seed=6)
    law = token_verify_law(*block_inputs(target, draft, [2], (0, 3, 1)))
    joint = law.joint()
    probs = {(t, y): float(joint[t, y]) for t in range(4) for y in range(4)}
    gen = torch.Generator().manual_seed(0)
    counts = Counter((r.accepted, r.token) for r in (draw(law, gen) for _ in range(20_000)))
    assert chi_square_pvalue(counts, probs) > FALSE_ALARM


def test_shape_contract_is_checked():
    with pytest.raises(AssertionError, match="p must be"):
        token_verify(torch.tensor([0, 1]), torch.rand(2, 3), torch.rand(2, 3))
