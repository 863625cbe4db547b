"""Deterministic drafts (docs/algorithms.md §6.1): point-mass q under SD and BV, and sample-and-match on fixed
candidate trees, proven lossless by exact enumeration; each proof is shown to catch a planted bug."""

from __future__ import annotations

import pytest
import torch

from tests.stats import max_abs_diff, target_law
from tests.verify.exact import fixed_draft_law, point_mass_inputs
from verispec.drafters.ngram import NgramIndex
from verispec.models.tabular import TabularLM
from verispec.verify import (
    BlockLaw,
    block_verify_law,
    candidate_tree_expected_accepted,
    candidate_tree_law,
    candidate_tree_verify,
    draw_outcome,
    token_verify_law,
)
from verispec.verify.multipath import specinfer_node_law, tree_walk_law

CONTEXT = [0, 1, 2, 0, 1]  # V = 3: repeats, so prompt lookup finds matches of several lengths
N_TOKENS = 4


def lookup(ngram_min: int, ngram_max: int, k: int):
    """Return a proposer that drafts by prompt lookup over the context (the real index), up to k candidates."""
    def propose(context: list[int], gamma: int) -> list[list[int]]:
        index = NgramIndex(ngram_min, ngram_max)
        index.extend(context)
        return index.candidates(k, gamma)
    return propose


def fixed_tree(context: list[int], gamma: int) -> list[list[int]]:
    """A hand-made tree that depends on the context: three distinct candidates sharing a first token."""
    a = sum(context) % 3
    paths = [[a, (a + 1) % 3, 0], [a, (a + 2) % 3, 1], [(a + 1) % 3, a, 2]]
    return [path[:gamma] for path in paths] if gamma else []


def error(law: dict, target: TabularLM) -> float:
    assert abs(sum(law.values()) - 1.0) < 1e-12
    return max_abs_diff(law, target_law(target, CONTEXT, N_TOKENS))


def residual_over_full_vocabulary(law_fn):
    """A planted bug: on rejection the extra token comes from p itself instead of norm((w·p − q)_+), i.e. the
    rejected candidate is not taken out of the residual."""
    def buggy(tokens, q, p):
        law = law_fn(tokens, q, p)
        return BlockLaw(law.stop, law.weights, torch.zeros_like(law.q), law.p)
    return buggy


@pytest.mark.parametrize("law_fn", [token_verify_law, block_verify_law], ids=["sd", "bv"])
@pytest.mark.parametrize("gamma", [1, 2, 3])
@pytest.mark.parametrize("seed", [0, 1])
def test_point_mass_q_is_lossless_under_sd_and_bv(law_fn, gamma, seed):
    target = TabularLM(3, seed=60 + seed)
    for propose in (lookup(1, 2, 1), lambda ctx, g: fixed_tree(ctx, g)[:1]):
        law = fixed_draft_law(law_fn, target, propose, CONTEXT, gamma, N_TOKENS, multipath=False)
        assert error(law, target) < 1e-12


@pytest.mark.parametrize("law_fn", [token_verify_law, block_verify_law], ids=["sd", "bv"])
def test_point_mass_check_catches_a_residual_over_the_full_vocabulary(law_fn):
    target = TabularLM(3, seed=60)
    buggy = residual_over_full_vocabulary(law_fn)
    law = fixed_draft_law(buggy, target, lookup(1, 2, 1), CONTEXT, 2, N_TOKENS, multipath=False)
    assert error(law, target) > 1e-3


@pytest.mark.parametrize("k", [2, 3])
@pytest.mark.parametrize("gamma", [1, 2, 3])
@pytest.mark.parametrize("seed", [0, 1])
def test_candidate_tree_rule_is_lossless_on_fixed_candidates(k, gamma, seed):
    target = TabularLM(3, seed=70 + seed)
    for propose in (lookup(1, 3, k), lambda ctx, g: fixed_tree(ctx, g)[:k]):
        law = fixed_draft_law(candidate_tree_law, target, propose, CONTEXT, gamma, N_TOKENS, multipath=True)
        assert error(law, target) < 1e-12


def sequential_point_mass_node_law(draws, p_u, q_u):
    """A planted bug: each distinct child is accepted with probability p(child) in turn, but the token after every
    rejection comes from p over the full vocabulary instead of p off the rejected children."""
    law, alive = torch.zeros_like(p_u), 1.0
    for child in dict.fromkeys(draws):
        law[child] += alive * p_u[child]
        alive *= 1.0 - float(p_u[child])
    return law + alive * p_u


def uniform_candidates_specinfer_node_law(draws, p_u, q_u):
    """SpecInfer's i.i.d. rule misapplied to fixed candidates, q taken as their empirical law."""
    empirical = torch.zeros_like(p_u).index_add_(0, torch.tensor(draws), torch.ones(len(draws), dtype=p_u.dtype))
    return specinfer_node_law(draws, p_u, empirical / len(draws))


@pytest.mark.parametrize("node_law", [sequential_point_mass_node_law, uniform_candidates_specinfer_node_law])
def test_candidate_tree_check_catches_wrong_rules(node_law):
    target = TabularLM(3, seed=70)
    wrong = lambda tokens, q, p: tree_walk_law(node_law, tokens, q, p)  # noqa: E731
    law = fixed_draft_law(wrong, target, lambda ctx, g: fixed_tree(ctx, g)[:2], CONTEXT, 2, N_TOKENS, True)
    assert error(law, target) > 1e-3


def test_candidate_tree_expected_accepted_is_the_mass_of_the_candidate_nodes():
    target = TabularLM(3, seed=71)
    paths = fixed_tree(CONTEXT, 3)
    tokens, q, p = point_mass_inputs(target, CONTEXT, paths)
    # By hand: τ ≥ d iff the target's own continuation follows a candidate for d tokens.
    by_hand = sum(
        target.sequence_prob(CONTEXT, prefix)
        for prefix in {tuple(path[:d]) for path in paths for d in range(1, 4)}
    )
    assert candidate_tree_expected_accepted(tokens, q, p) == pytest.approx(by_hand, abs=1e-12)
    law = candidate_tree_law(tokens, q, p)
    assert sum(prob * o.accepted for o, prob in law.items()) == pytest.approx(by_hand, abs=1e-12)


def test_candidate_tree_sampler_follows_its_law():
    """The node-by-node sampler against the exact law: 4,000 draws, every outcome within 6 standard errors."""
    target = TabularLM(3, seed=72)
    tokens, q, p = point_mass_inputs(target, CONTEXT, fixed_tree(CONTEXT, 2))
    law = candidate_tree_law(tokens, q, p)
    gen = torch.Generator().manual_seed(0)
    n = 4000
    counts: dict = {}
    for _ in range(n):
        o = candidate_tree_verify(tokens, q, p, gen)
        key = (tuple(tokens[o.path, : o.accepted].tolist()), o.token)
        counts[key] = counts.get(key, 0) + 1
    exact: dict = {}
    for o, prob in law.items():
        key = (tuple(tokens[o.path, : o.accepted].tolist()), o.token)
        exact[key] = exact.get(key, 0.0) + prob
    assert set(counts) <= set(exact)
    for key, prob in exact.items():
        assert abs(counts.get(key, 0) / n - prob) < 6 * (prob * (1 - prob) / n) ** 0.5 + 1e-9
    assert draw_outcome(law, gen) in law
