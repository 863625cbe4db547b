"""GBV (docs/algorithms.md §2.2–2.6) by exact enumeration on tabular models, and its order (`NodeOrder`)."""

from __future__ import annotations

from collections import defaultdict
from functools import partial

import pytest
import torch

import verispec.verify.gbv as gbv
from tests.stats import max_abs_diff, target_law
from tests.verify.exact import block_inputs, draft_tuples, expected_accepted, paths_inputs, speculative_law
from tests.verify.test_multipath import CONTEXT, pair
from verispec.drafting import merge_paths
from verispec.models.tabular import TabularLM
from verispec.scoring import path_nodes
from verispec.verify import MultiPathResult, PathLaws, block_verify_law, draw, gbv_verify, gbv_verify_law

CASES = [(1, 1), (2, 1), (3, 1), (1, 2), (2, 2), (1, 3), (2, 3), (3, 2)]  # (γ, K), V = 3


def gbv_error(target, draft, gamma: int, k: int, law_fn=gbv_verify_law) -> float:
    law = speculative_law(law_fn, target, draft, CONTEXT, gamma, gamma + 1, k=k)
    assert abs(sum(law.values()) - 1.0) < 1e-12
    return max_abs_diff(law, target_law(target, CONTEXT, gamma + 1))


# The torch reference alone: the planted bugs below patch its Python pieces, which the kernel does not call.
REFERENCE = partial(gbv_verify_law, use_kernel=False)


@pytest.mark.parametrize("gamma,k", CASES)
@pytest.mark.parametrize("seed", [0, 1])
@pytest.mark.parametrize("use_kernel", [True, False], ids=["kernel", "torch"])
def test_gbv_reproduces_the_target_law_exactly(gamma, k, seed, use_kernel):
    # Every K-tuple of i.i.d. paths (duplicates included), every outcome, rounds until γ+1 tokens are out.
    assert gbv_error(*pair(seed), gamma, k, partial(gbv_verify_law, use_kernel=use_kernel)) < 1e-12


@pytest.mark.parametrize("gamma,k", [(2, 2), (1, 3)])
@pytest.mark.parametrize("use_kernel", [True, False], ids=["kernel", "torch"])
def test_gbv_is_exact_when_every_key_ties(gamma, k, use_kernel):
    # p = q at every node: every token has ratio 1, so the whole order comes from the token-id tie-break (§2.2).
    model = TabularLM(3, seed=4)
    assert gbv_error(model, model, gamma, k, partial(gbv_verify_law, use_kernel=use_kernel)) < 1e-12


def clipped_key(p_u, q_u):
    return torch.clamp(p_u / q_u, max=1.0)  # min(1, p/q): every token with p ≥ q ties at 1


def first_child_wins(children, order):
    best = children[0]  # a strict '>' in path order: the first child wins a tie, whatever the CDF order says
    for t in children[1:]:
        if order.sort_key(t)[:2] > order.sort_key(best)[:2]:  # the key, without the token-id tie-break
            best = t
    return best


@pytest.mark.parametrize(
    "clipped,same_model,gamma,k",
    [
        (True, False, 2, 2),  # min(1, p/q): ties wherever several tokens have p ≥ q
        (True, False, 2, 3),
        (False, True, 2, 2),  # the raw ratio, but p = q at every node: every key ties at 1
    ],
)
def test_enumeration_catches_the_tie_break_trap_of_section_2_2(monkeypatch, clipped, same_model, gamma, k):
    # Ties broken by token id in q_skew (stable argsort) but by first-child-wins in selection: not lossless (§2.2).
    if clipped:
        monkeypatch.setattr(gbv, "ratio_key", clipped_key)
    monkeypatch.setattr(gbv, "select_child", first_child_wins)
    target, draft = (TabularLM(3, seed=4),) * 2 if same_model else pair(0)
    assert gbv_error(target, draft, gamma, k, REFERENCE) > 1e-4


def test_clipped_key_with_one_shared_tie_break_is_still_exact(monkeypatch):
    # What matters is that selection and q_skew share one total order, not which key defines it (§2.2, §2.6).
    monkeypatch.setattr(gbv, "ratio_key", clipped_key)
    assert gbv_error(*pair(0), 2, 3, REFERENCE) < 1e-12


@pytest.mark.parametrize("gamma,k", [(2, 2), (2, 3)])
def test_selected_path_follows_the_best_of_k_law(gamma, k):
    # §2.3/§2.7: the selected path has law Π_i q_skew(x_{i+1}|x^i), and q_skew depends on the path only.
    target, draft = pair(1)
    selected: dict = defaultdict(float)
    skew: dict = {}
    for paths, prob in draft_tuples(draft, CONTEXT, gamma, k):
        chosen, law = gbv_verify_law(*paths_inputs(target, draft, CONTEXT, paths))
        selected[paths[chosen]] += prob
        if paths[chosen] in skew:
            assert torch.equal(skew[paths[chosen]], law.q)
        skew[paths[chosen]] = law.q
    for path, q_skew in skew.items():
        product_law = float(torch.prod(q_skew[torch.arange(gamma), torch.tensor(path)]))
        assert selected[path] == pytest.approx(product_law, abs=1e-14)
    assert abs(sum(selected.values()) - 1.0) < 1e-12


def test_one_path_gbv_is_exactly_bv():
    target, draft = pair(2)
    for paths, _ in draft_tuples(draft, CONTEXT, 3, 1):
        chosen, gbv = gbv_verify_law(*paths_inputs(target, draft, CONTEXT, paths))
        bv = block_verify_law(*block_inputs(target, draft, CONTEXT, paths[0]))
        assert chosen == 0
        assert torch.equal(gbv.stop, bv.stop) and torch.equal(gbv.weights, bv.weights) and torch.equal(gbv.q, bv.q)


def test_duplicate_paths_count_as_separate_draws():
    # Two identical paths merge into one node, but the root skew is still the best-of-2 law F(t)² − F(t⁻)² (§2.6).
    q = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    p = torch.tensor([0.2, 0.3, 0.5], dtype=torch.float64)  # ratios 0.4, 1, 2.5: order 0 < 1 < 2
    tokens = torch.tensor([[0], [0]])
    _, law = gbv_verify_law(tokens, q.expand(2, 1, 3), p.expand(2, 2, 3))
    cdf = torch.cumsum(q, 0)
    assert torch.allclose(law.q[0], cdf**2 - (cdf - q) ** 2, atol=1e-15)


def test_more_paths_accept_more_on_a_toy_pair():
    # The direction of §2.7's toy table (BV < GBV K=2 < GBV K=3) on our tabular pair; its numbers need its models.
    target, draft = pair(0)
    by_k = [expected_accepted(gbv_verify_law, target, draft, CONTEXT, 2, k) for k in (1, 2, 3)]
    assert by_k[0] == pytest.approx(expected_accepted(block_verify_law, target, draft, CONTEXT, 2), abs=1e-15)
    assert by_k[0] < by_k[1] < by_k[2]


def test_gbv_verify_draws_from_its_law():
    target, draft = pair(3)
    paths = ((2, 0, 1), (2, 1, 1), (0, 0, 0))
    inputs = paths_inputs(target, draft, CONTEXT, paths)
    chosen, law = gbv_verify_law(*inputs)
    for seed in range(20):
        expected = draw(law, torch.Generator().manual_seed(seed))
        result = gbv_verify(*inputs, torch.Generator().manual_seed(seed))
        assert result == MultiPathResult(path=chosen, accepted=expected.accepted, token=expected.token)




def test_key_bits_sort_like_the_float_keys_with_ties_in_id_order():
    generator = torch.Generator().manual_seed(0)
    key = torch.rand(151_936, generator=generator, dtype=torch.float64) * 10
    key[:1000] = 1.0  # a block of exact ties, as with p = q
    key[1000:1100] = key[1000:1100].to(torch.float32).to(torch.float64) + 1e-12  # distinct in float64 only
    key[5] = 0.0  # p = 0
    key[6] = -0.0  # the same key as +0.0: the tie goes to the larger id
    key[7] = 1e300  # p/q with q clamped to MIN_DRAFT_PROB
    order = torch.sort(gbv.key_bits(key), stable=True).indices
    assert torch.equal(order, torch.argsort(key, stable=True))  # ascending float64 key, ties in token-id order
    assert order[:2].tolist() == [5, 6] and order[-1] == 7


# ---- The order of `NodeOrder`: ranked tokens by ratio, the rest below them by token id ----


# Thresholds that leave one or two of the three tokens unranked at most nodes of the tabular pair.
FEW_RANKED = {"min_q": 0.35, "min_share": 1.0}


def unranked_nodes(target, draft, gamma: int) -> int:
    """Return how many of the draft's conditionals along every γ-token path have a token left unranked."""
    count = 0
    for paths, _ in draft_tuples(draft, CONTEXT, gamma, 1):
        _, q, p = paths_inputs(target, draft, CONTEXT, paths)
        count += sum(int((~gbv.node_order(p[0, i], q[0, i], **FEW_RANKED).is_ranked).any()) for i in range(gamma))
    return count


@pytest.mark.parametrize("gamma,k", [(1, 2), (2, 2), (2, 3), (3, 2)])
@pytest.mark.parametrize("use_kernel", [True, False], ids=["kernel", "torch"])
def test_gbv_is_exact_when_some_tokens_are_unranked(gamma, k, use_kernel):
    target, draft = pair(0)
    assert unranked_nodes(target, draft, gamma) > 0
    law_fn = partial(gbv_verify_law, **FEW_RANKED, use_kernel=use_kernel)
    assert gbv_error(target, draft, gamma, k, law_fn) < 1e-12


@pytest.mark.parametrize("gamma,k", [(2, 2), (3, 2)])
@pytest.mark.parametrize("use_kernel", [True, False], ids=["kernel", "torch"])
def test_gbv_is_exact_with_every_token_ranked(gamma, k, use_kernel):
    # min_q = 0: the reference code's plain ratio order over the whole vocabulary.
    assert gbv_error(*pair(1), gamma, k, partial(gbv_verify_law, min_q=0.0, use_kernel=use_kernel)) < 1e-12


def test_enumeration_catches_a_selection_that_ignores_the_unranked_tier(monkeypatch):
    # Planted bug: q_skew built from the tiered order, the child selected by the ratio over every token.
    tiered_order = gbv.node_order

    def mixed_order(p_u, q_u, min_q, min_share):
        every = tiered_order(p_u, q_u, 0.0, min_share)
        tiered = tiered_order(p_u, q_u, min_q, min_share)
        return gbv.NodeOrder(p_u=p_u, q_u=q_u, threshold=every.threshold, below=tiered.below)

    monkeypatch.setattr(gbv, "node_order", mixed_order)
    assert gbv_error(*pair(0), 2, 2, partial(REFERENCE, **FEW_RANKED)) > 1e-4


def test_node_order_matches_a_brute_force_sort_on_a_large_vocabulary():
    generator = torch.Generator().manual_seed(3)
    vocab = 5000
    q = torch.softmax(4 * torch.randn(vocab, generator=generator, dtype=torch.float64), 0)
    p = torch.softmax(4 * torch.randn(vocab, generator=generator, dtype=torch.float64), 0)
    p[:50] = q[:50] * 2.0  # equal ratios: ties broken by token id
    order = gbv.node_order(p, q)
    threshold = min(gbv.RANKED_MIN_Q, gbv.RANKED_MIN_SHARE * float(q.max()))  # the rule, restated
    assert float(gbv.ranked_threshold(q)) == threshold
    ranked = (q >= threshold).tolist()
    assert 0 < sum(ranked) < vocab  # both tiers are present
    ratio = (p / q).tolist()

    def reference_key(t: int):
        return (1, ratio[t], t) if ranked[t] else (0, 0.0, t)

    reference = sorted(range(vocab), key=reference_key)
    q_list = q.tolist()
    below, mass = [0.0] * vocab, 0.0
    for t in reference:
        below[t], mass = mass, mass + q_list[t]
    assert torch.allclose(order.below, torch.tensor(below, dtype=torch.float64), rtol=0, atol=1e-14)
    sample = torch.randint(vocab, (300,), generator=generator).tolist() + list(range(50))
    assert sorted(sample, key=order.sort_key) == sorted(sample, key=reference_key)


def lazy_laws(draft_tokens: torch.Tensor, p: torch.Tensor, read: list[int]) -> PathLaws:
    """p `[K, γ+1, V]` as `PathLaws` over its prefix tree's nodes, as the engine builds it; `read` records the nodes
    whose rows were computed."""
    tree = merge_paths(draft_tokens.tolist())
    nodes = path_nodes(tree)  # [K, γ+1]: the root is node 0
    by_node = torch.empty(len(tree.tokens) + 1, p.shape[-1], dtype=torch.float64)
    by_node[nodes.view(-1)] = p.reshape(-1, p.shape[-1])

    def rows(ids: list[int], out: torch.Tensor | None) -> torch.Tensor:
        read.extend(ids)
        return by_node[ids] if out is None else out.copy_(by_node[ids])

    return PathLaws(rows, nodes, p.shape[-1])


def test_path_laws_hand_out_the_dense_rows_and_compute_each_node_once():
    target, draft = pair(1)
    paths = ((2, 0, 1), (2, 0, 2), (1, 1, 1))
    tokens, _, p = paths_inputs(target, draft, CONTEXT, paths)
    nodes = path_nodes(merge_paths(tokens.tolist())).tolist()  # [K][γ+1]: paths 0 and 1 share 3 nodes
    read: list[int] = []
    laws = lazy_laws(tokens, p, read)
    assert laws.shape == p.shape and laws.dim() == 3
    assert torch.equal(laws.row(1, 2), p[1, 2]) and read == [nodes[1][2]]  # the node after (2, 0): one row
    assert torch.equal(laws.path(0), p[0])
    assert read == [nodes[1][2], nodes[0][0], nodes[0][1], nodes[0][3]]  # (2, 0) is not computed again
    assert torch.equal(laws.tensor(), p) and len(read) == len(set(read)) == 8  # the root and 7 distinct prefixes
    dense = PathLaws.of(p.float())
    assert dense.row(2, 1).dtype == torch.float64 and torch.equal(dense.tensor(), p.float().double())


def test_a_path_read_root_to_leaf_is_handed_out_without_a_copy():
    # GBV reads its selected path's rows one by one, root to leaf, then the whole path: the rows were computed into
    # one per-depth buffer, and that buffer is the path (a copy of 5 rows of 151,936 was ~0.5 ms a round).
    target, draft = pair(1)
    tokens, _, p = paths_inputs(target, draft, CONTEXT, ((2, 0, 1), (2, 0, 2), (1, 1, 1)))
    laws = lazy_laws(tokens, p, [])
    rows = [laws.row(1, i) for i in range(3)]
    path = laws.path(1)
    assert torch.equal(path, p[1])
    assert [row.data_ptr() for row in rows] == [path[i].data_ptr() for i in range(3)]
    assert torch.equal(laws.path(0), p[0]) and torch.equal(laws.path(2), p[2])  # other paths: fresh rows, same laws
    assert torch.equal(laws.path(1), p[1]) and torch.equal(laws.tensor(), p)


@pytest.mark.parametrize("gamma,k", [(2, 2), (2, 3), (3, 2)])
def test_gbv_on_rows_computed_per_node_is_exact_and_reads_only_the_selected_path(gamma, k):
    """The law from `PathLaws` equals the dense law on every K-tuple (so GBV stays exact through it: the enumeration
    above), and only the selected path's γ+1 rows are ever computed."""
    target, draft = pair(0)
    tuples = 0
    for paths, _ in draft_tuples(draft, CONTEXT, gamma, k):
        tokens, q, p = paths_inputs(target, draft, CONTEXT, paths)
        read: list[int] = []
        chosen, law = gbv_verify_law(tokens, q, lazy_laws(tokens, p, read))
        dense_chosen, dense = gbv_verify_law(tokens, q, p)
        assert chosen == dense_chosen
        assert torch.equal(law.stop, dense.stop) and torch.equal(law.weights, dense.weights)
        assert torch.equal(law.q, dense.q)
        assert read == path_nodes(merge_paths(tokens.tolist()))[chosen].tolist()  # each once, root to leaf
        tuples += 1
    assert tuples == (3 ** gamma) ** k  # every K-tuple of paths over V = 3


def test_gbv_through_per_node_rows_reproduces_the_target_law_exactly():
    def law_fn(tokens, q, p):
        return gbv_verify_law(tokens, q, lazy_laws(tokens, p, []))

    assert gbv_error(*pair(1), 2, 3, law_fn) < 1e-12
