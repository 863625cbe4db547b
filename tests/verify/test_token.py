"""Token verification (speculative sampling) is lossless: exact enumeration on tabular models."""

from __future__ import annotations

from collections import Counter, defaultdict
from itertools import product

import pytest
import torch

import verispec.verify.common as common
from tests.stats import FALSE_ALARM, chi_square_pvalue, max_abs_diff, target_law
from verispec.models.tabular import TabularLM
from verispec.verify import VerifyResult, draw, token_verify, token_verify_law


def block_inputs(target: TabularLM, draft: TabularLM, context: list[int], block: tuple[int, ...]):
    """Return (draft_tokens [γ], q [γ, V], p [γ+1, V]) for a draft block after `context`."""
    prefixes = [context + list(block[:i]) for i in range(len(block) + 1)]
    q = torch.stack([draft.conditional(pre) for pre in prefixes[:-1]]) if block else torch.empty(0, draft.vocab_size)
    p = torch.stack([target.conditional(pre) for pre in prefixes])
    return torch.tensor(block, dtype=torch.long), q.to(torch.float64), p


def speculative_law(law_fn, target, draft, context: list[int], gamma: int, n: int) -> dict:
    """Return the exact law of the first `n` tokens output by rounds of `law_fn`, enumerating every draft block.

    Each round drafts min(gamma, n-1) tokens, as the engine does near max_new_tokens.
    """
    if n == 0:
        return {(): 1.0}
    law: dict = defaultdict(float)
    g = min(gamma, n - 1)
    for block in product(range(target.vocab_size), repeat=g):
        draft_prob = draft.sequence_prob(context, block)
        joint = law_fn(*block_inputs(target, draft, context, block)).joint()  # [g+1, V]
        for tau, y in product(range(g + 1), range(target.vocab_size)):
            prob = draft_prob * float(joint[tau, y])
            if prob == 0.0:
                continue
            emitted = tuple(block[:tau]) + (y,)
            rest = speculative_law(law_fn, target, draft, context + list(emitted), gamma, n - len(emitted))
            for tail, tail_prob in rest.items():
                law[emitted + tail] += prob * tail_prob
    return law


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
