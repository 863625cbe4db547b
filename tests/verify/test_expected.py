"""Each verifier's exact E[τ] given the drafted paths (`Method.expected_accepted`) is the mean τ of its own law."""

from __future__ import annotations

from itertools import product

import pytest
import torch

from tests.verify.exact import block_inputs, expected_accepted, paths_inputs
from tests.verify.test_block import IIDModel
from verispec.methods import METHODS, get_method
from verispec.models.tabular import TabularLM
from verispec.verify import (
    NODE_LAWS,
    block_verify_law,
    gbv_verify_law,
    token_verify_law,
    traversal_verify_law,
    tree_walk_expected_accepted,
    tree_walk_law,
)

CONTEXT = [1, 0]
SINGLE = {"sd": token_verify_law, "bv": block_verify_law}
MULTI = ["gbv", "specinfer", "spectr", "nss", "traversal"]


def pair(seed: int) -> tuple[TabularLM, TabularLM]:
    """Return (target, draft) over 4 tokens, the draft peakier so that rejections are common."""
    return TabularLM(4, seed=30 + seed), TabularLM(4, seed=40 + seed, sharpness=2.0)


def mean_tau_of_law(name: str, tokens, q, p) -> float:
    """Return Σ P(outcome)·τ from the method's full exact law (the slow way, enumerating the vocabulary)."""
    if name in SINGLE:
        stop = SINGLE[name](tokens, q, p).stop
        return float(sum(i * float(stop[i]) for i in range(len(stop))))
    if name == "gbv":
        law = gbv_verify_law(tokens, q, p)[1]
        return float(sum(i * float(law.stop[i]) for i in range(len(law.stop))))
    law = traversal_verify_law(tokens, q, p) if name == "traversal" else tree_walk_law(NODE_LAWS[name], tokens, q, p)
    return sum(prob * outcome.accepted for outcome, prob in law.items())


def test_every_lossless_speculative_method_has_an_exact_expectation():
    with_law = {name for name, m in METHODS.items() if m.expected_accepted is not None}
    assert with_law == set(SINGLE) | set(MULTI)


@pytest.mark.parametrize("name", list(SINGLE))
@pytest.mark.parametrize("gamma", [1, 3])
def test_single_path_expectation_is_the_mean_of_the_law(name, gamma):
    target, draft = pair(0)
    for block in list(product(range(4), repeat=gamma))[:20]:
        tokens, q, p = block_inputs(target, draft, CONTEXT, block)
        got = get_method(name).expected_accepted(tokens, q, p)
        assert got == pytest.approx(mean_tau_of_law(name, tokens, q, p), abs=1e-12)


@pytest.mark.parametrize("name", MULTI)
@pytest.mark.parametrize("k,gamma", [(2, 2), (3, 2), (2, 3)])
def test_multi_path_expectation_is_the_mean_of_the_law(name, k, gamma):
    target, draft = pair(1)
    generator = torch.Generator().manual_seed(k * 10 + gamma)
    for _ in range(6):  # random K-tuples of paths, duplicates and shared prefixes included at V = 4
        paths = tuple(tuple(torch.randint(0, 4, (gamma,), generator=generator).tolist()) for _ in range(k))
        tokens, q, p = paths_inputs(target, draft, CONTEXT, paths)
        got = get_method(name).expected_accepted(tokens, q, p)
        assert got == pytest.approx(mean_tau_of_law(name, tokens, q, p), abs=1e-12)


def test_averaged_over_all_drafts_it_gives_the_binary_example_of_section_1_6():
    # §1.6: p = (1/3, 2/3), q = (2/3, 1/3), γ = 2 gives E[τ] = 10/9 (TV) and 11/9 (BV); `exact` counts them by
    # enumerating whole rounds, here the per-block expectations are averaged under the draft's law.
    target, draft = IIDModel([1 / 3, 2 / 3]), IIDModel([2 / 3, 1 / 3])
    for name, want in (("sd", 10 / 9), ("bv", 11 / 9)):
        total = sum(draft.sequence_prob([], block) * get_method(name).expected_accepted(
            *block_inputs(target, draft, [], block)) for block in product(range(2), repeat=2))
        assert total == pytest.approx(want, abs=1e-14)
        assert total == pytest.approx(expected_accepted(SINGLE[name], target, draft, [], 2), abs=1e-14)


def test_with_one_path_gbv_expects_what_bv_expects():
    target, draft = pair(2)
    for block in list(product(range(4), repeat=3))[:10]:
        tokens, q, p = block_inputs(target, draft, CONTEXT, block)
        gbv = get_method("gbv").expected_accepted(tokens[None], q[None], p[None])
        assert gbv == pytest.approx(get_method("bv").expected_accepted(tokens, q, p), abs=1e-15)


def test_the_reach_sum_catches_a_wrong_node_law():
    # The check must be able to fail: SpecInfer's reach probabilities are not NSS's on a rejecting pair.
    target, draft = pair(3)
    tokens, q, p = paths_inputs(target, draft, CONTEXT, ((0, 1), (2, 1), (0, 3)))
    right = tree_walk_expected_accepted(NODE_LAWS["specinfer"], tokens, q, p)
    wrong = tree_walk_expected_accepted(NODE_LAWS["nss"], tokens, q, p)
    assert right == pytest.approx(mean_tau_of_law("specinfer", tokens, q, p), abs=1e-12)
    assert abs(right - wrong) > 1e-3


@pytest.mark.parametrize("name", ["bv", "gbv", "specinfer", "traversal"])
def test_the_samplers_mean_tau_matches_the_expectation(name):
    # Ties the expectation to what the engine actually draws (10,000 rounds; 5 standard errors).
    target, draft = pair(4)
    method = get_method(name)
    if method.multipath:
        inputs = paths_inputs(target, draft, CONTEXT, ((0, 1, 2), (0, 3, 1), (2, 2, 0)))
    else:
        inputs = block_inputs(target, draft, CONTEXT, (0, 1, 2))
    expected = method.expected_accepted(*inputs)
    generator = torch.Generator().manual_seed(0)
    taus = torch.tensor([float(method.verify(*inputs, generator).accepted) for _ in range(10_000)])
    assert abs(float(taus.mean()) - expected) < 5 * float(taus.std()) / 100 + 1e-9
