"""Multi-path verifiers (docs/algorithms.md §2): GBV and the §2.9 baselines by exact enumeration, samplers by MC."""

from __future__ import annotations

import random
from collections import Counter
from functools import partial
from itertools import product

import pytest
import torch

import verispec.verify.multipath as multipath
import verispec.verify.traversal as traversal
from tests.stats import FALSE_ALARM, chi_square_pvalue, max_abs_diff, target_law
from tests.verify.exact import (
    block_inputs,
    block_outcomes,
    draft_tuples,
    paths_inputs,
    speculative_law,
)
from verispec.models.tabular import TabularLM
from verispec.verify import (
    MultiPathResult,
    block_verify_law,
    build_prefix_tree,
    gbv_verify,
    nss_verify,
    specinfer_verify,
    spectr_verify,
    traversal_verify,
    traversal_verify_law,
)

CONTEXT = [0, 1]


def pair(seed: int) -> tuple[TabularLM, TabularLM]:
    """Return (target, draft): two unrelated context-dependent tabular models over V = 3, the draft peakier."""
    return TabularLM(3, seed=10 + seed), TabularLM(3, seed=20 + seed, sharpness=2.0)


def test_prefix_tree_merges_shared_prefixes_and_keeps_duplicates():
    tree = build_prefix_tree(torch.tensor([[1, 2], [1, 0], [2, 2], [1, 2]]))
    assert tree[()].draws == (1, 1, 2, 1) and tree[()].children == Counter({1: 3, 2: 1})
    assert tree[(1,)].path == 0 and tree[(1,)].draws == (2, 0, 2)
    assert tree[(2,)].path == 2 and tree[(1, 0)].path == 1 and tree[(1, 2)].draws == ()
    assert len(tree) == 1 + 2 + 3


# ---- The OT-style baselines of §2.9 (nss, specinfer, spectr): exact laws of the tree walks ----


@pytest.mark.parametrize("gamma,k", [(1, 2), (2, 2), (1, 3), (2, 3), (3, 2)])
@pytest.mark.parametrize("name", ["nss", "specinfer", "spectr"])
def test_baseline_walk_reproduces_the_target_law_exactly(name, gamma, k):
    law_fn = partial(multipath.tree_walk_law, multipath.NODE_LAWS[name])
    target, draft = pair(0)
    law = speculative_law(law_fn, target, draft, CONTEXT, gamma, gamma + 1, k=k)
    assert max_abs_diff(law, target_law(target, CONTEXT, gamma + 1)) < 1e-12


@pytest.mark.parametrize("name", ["specinfer", "spectr"])
def test_node_laws_average_to_p_over_iid_draws(name):
    # §2.9: a per-node solver emits p(·|node) when its k children are i.i.d. draws from q(·|node).
    gen = torch.Generator().manual_seed(1)
    for k in (1, 2, 3, 4):
        p, q = torch.rand(2, 4, generator=gen, dtype=torch.float64) ** 2
        p, q = p / p.sum(), q / q.sum()
        average = sum(
            float(torch.prod(q[list(draws)])) * multipath.NODE_LAWS[name](draws, p, q)
            for draws in product(range(4), repeat=k)
        )
        assert torch.allclose(average, p, atol=1e-14, rtol=0)


def test_enumeration_catches_specinfer_without_the_residual(monkeypatch):
    # After a rejection, going on with p instead of norm((p − q)_+) is biased (§2.9 specinfer).
    monkeypatch.setattr(multipath, "rrs_step", lambda p_cur, q_cur, rejected: (p_cur, q_cur))
    law_fn = partial(multipath.tree_walk_law, multipath.specinfer_node_law)
    target, draft = pair(0)
    law = speculative_law(law_fn, target, draft, CONTEXT, 2, 3, k=2)
    assert max_abs_diff(law, target_law(target, CONTEXT, 3)) > 1e-3


# ---- Monte-Carlo checks of the samplers (chi-square, false alarm ≤ 1e-6 per test) ----

SAMPLES = 20_000


def round_counts(verify, target, draft, gamma: int, k: int, seed: int = 0) -> tuple[Counter, Counter]:
    """Return the counts of (first token,) and (first two tokens,) over SAMPLES rounds from K i.i.d. paths.

    When a round emits one token only, the second is drawn from the target, so both laws must be the target's.
    """
    tuples = list(draft_tuples(draft, CONTEXT, gamma, k))
    gen, rng = torch.Generator().manual_seed(seed), random.Random(seed)
    picks = rng.choices(range(len(tuples)), weights=[prob for _, prob in tuples], k=SAMPLES)
    inputs: dict = {}
    second = {y: target.conditional(CONTEXT + [y]).tolist() for y in range(target.vocab_size)}
    first, two = Counter(), Counter()
    for i in picks:
        paths = tuples[i][0]
        if i not in inputs:
            inputs[i] = paths_inputs(target, draft, CONTEXT, paths)
        result = verify(*inputs[i], gen)
        emitted = paths[result.path][: result.accepted] + (result.token,)
        if len(emitted) == 1:  # complete from the target
            emitted += tuple(rng.choices(range(target.vocab_size), weights=second[emitted[0]]))
        first[emitted[:1]] += 1
        two[emitted[:2]] += 1
    return first, two


def assert_target_law(target, first: Counter, two: Counter) -> None:
    assert chi_square_pvalue(first, target_law(target, CONTEXT, 1)) > FALSE_ALARM
    assert chi_square_pvalue(two, target_law(target, CONTEXT, 2)) > FALSE_ALARM


@pytest.mark.parametrize(
    "verify,k", [(nss_verify, 2), (specinfer_verify, 3), (spectr_verify, 3), (traversal_verify, 2)]
)
def test_baseline_sampler_reproduces_the_target_law(verify, k):
    # 20,000 rounds, V = 3, γ = 2; each chi-square test rejects a correct sampler with probability ≤ 1e-6.
    # The exact laws are checked above; this checks the node-by-node sampler of the walk, K = 2 and 3 between them.
    target, draft = pair(0)
    assert_target_law(target, *round_counts(verify, target, draft, 2, k))


def test_monte_carlo_check_catches_specinfer_without_the_residual(monkeypatch):
    # The check must be able to fail: after a rejection, sampling on from p instead of norm((p − q)_+) is biased.
    monkeypatch.setattr(multipath, "rrs_step", lambda p_cur, q_cur, rejected: (p_cur, q_cur))
    target, draft = pair(0)
    first, two = round_counts(specinfer_verify, target, draft, 2, 2)
    assert chi_square_pvalue(first, target_law(target, CONTEXT, 1)) < FALSE_ALARM
    assert chi_square_pvalue(two, target_law(target, CONTEXT, 2)) < FALSE_ALARM


@pytest.mark.parametrize("verify", [specinfer_verify, spectr_verify, traversal_verify])
def test_identical_models_accept_every_path(verify):
    # With p = q: the OT solvers accept the first child (min(1, p/q) = 1; K-SEQ finds ρ = 1) and every traversal
    # weight is 1. (Not GBV: it verifies against q_skew ≠ p, which over-weights the high-key tokens.)
    model = TabularLM(3, seed=5)
    inputs = paths_inputs(model, model, CONTEXT, ((0, 1), (2, 2), (0, 2)))
    gen = torch.Generator().manual_seed(0)
    assert all(verify(*inputs, gen).accepted == 2 for _ in range(50))


def kseq_excess(p: torch.Tensor, q: torch.Tensor, k: int, rho: float) -> float:
    beta = float(torch.minimum(p / rho, q).sum())
    return 1 - (1 - beta) ** k - rho * beta  # ≤ 0 exactly when ρ is feasible (§2.9 step 1)


def test_spectr_scale_is_feasible_and_tight():
    gen = torch.Generator().manual_seed(0)
    for _ in range(50):
        p, q = torch.rand(2, 5, generator=gen, dtype=torch.float64) ** 3
        p, q = p / p.sum(), q / q.sum()
        rho = multipath.kseq_rho(p, q, 3)
        excess = partial(kseq_excess, p, q, 3)
        assert 1.0 <= rho <= 3.0 and excess(rho) <= 1e-15  # feasible: the step-3 residual is non-negative
        assert rho == 1.0 or excess(rho * (1 - 1e-9)) > 0  # tight: a slightly smaller ρ is infeasible


# ---- Traversal verification (§2.9 `traversal`) ----


@pytest.mark.parametrize("gamma,k", [(1, 2), (2, 2), (1, 3), (2, 3), (3, 2)])
def test_traversal_reproduces_the_target_law_exactly(gamma, k):
    target, draft = pair(1)
    law = speculative_law(traversal_verify_law, target, draft, CONTEXT, gamma, gamma + 1, k=k)
    assert max_abs_diff(law, target_law(target, CONTEXT, gamma + 1)) < 1e-12


def test_enumeration_catches_traversal_that_keeps_q_after_a_deletion(monkeypatch):
    # §2.9 step 3 zeroes the deleted token in the parent's q; keeping q (as for draws with replacement) is biased.
    original = traversal.after_rejection

    def keep_q(p_u, q_u, weight, token):
        p_next, _, weight_next = original(p_u, q_u, weight, token)
        return p_next, q_u, weight_next

    monkeypatch.setattr(traversal, "after_rejection", keep_q)
    target, draft = pair(0)
    law = speculative_law(traversal_verify_law, target, draft, CONTEXT, 2, 3, k=2)
    assert max_abs_diff(law, target_law(target, CONTEXT, 3)) > 1e-3


def test_one_path_traversal_is_bv():
    target, draft = pair(2)
    for paths, _ in draft_tuples(draft, CONTEXT, 3, 1):
        traversal_law = traversal_verify_law(*paths_inputs(target, draft, CONTEXT, paths))
        bv = block_outcomes(0, block_verify_law(*block_inputs(target, draft, CONTEXT, paths[0])))
        assert max_abs_diff(traversal_law, bv) < 1e-15


def test_traversal_sampler_draws_from_the_exact_law():
    # The sampler walks the chain of leaf visits with one coin per leaf; its outcomes must follow the summed law.
    target, draft = pair(3)
    inputs = paths_inputs(target, draft, CONTEXT, ((2, 0), (2, 1), (0, 0)))
    law = traversal_verify_law(*inputs)
    assert abs(sum(law.values()) - 1.0) < 1e-12
    gen = torch.Generator().manual_seed(0)
    counts = Counter(traversal_verify(*inputs, gen) for _ in range(SAMPLES))
    assert chi_square_pvalue(counts, law) > FALSE_ALARM


def test_traversal_sampler_check_catches_a_wrong_coin(monkeypatch):
    # The check must be able to fail: accepting a leaf with probability w² instead of w is biased.
    target, draft = pair(3)
    inputs = paths_inputs(target, draft, CONTEXT, ((2, 0), (2, 1), (0, 0)))
    law = traversal_verify_law(*inputs)
    original = traversal.leaf_visits
    monkeypatch.setattr(traversal, "leaf_visits", lambda *a: ((leaf, node, accept**2 if accept < 1 else accept)
                                                            for leaf, node, accept in original(*a)))
    gen = torch.Generator().manual_seed(0)
    counts = Counter(traversal_verify(*inputs, gen) for _ in range(SAMPLES))
    assert chi_square_pvalue(counts, law) < FALSE_ALARM


def test_empty_paths_sample_from_p():
    p = torch.tensor([[[0.0, 0.0, 1.0]]] * 2, dtype=torch.float64)  # [K=2, 1, V]
    tokens, q = torch.empty(2, 0, dtype=torch.long), torch.empty(2, 0, 3)
    for verify in (gbv_verify, nss_verify, specinfer_verify, spectr_verify, traversal_verify):
        assert verify(tokens, q, p) == MultiPathResult(path=0, accepted=0, token=2)


def test_shape_contract_is_checked():
    with pytest.raises(AssertionError, match="p must be"):
        gbv_verify(torch.tensor([[0, 1]]), torch.rand(1, 2, 3), torch.rand(1, 2, 3))
