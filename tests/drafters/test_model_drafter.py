"""The model drafter's block: each row of q is the law its token was drawn from, written in place per depth."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from verispec.drafting import draft_paths
from verispec.models.tabular import TabularLM
from verispec.processors import LogitProcessors
from verispec.sampling import KeyedNoise, SamplingConfig, process_logits, race
from verispec.verify.tree import PrefixTree, build_prefix_tree

CONTEXT = [0, 3]
EOS = 5


@pytest.mark.parametrize("n_paths", [1, 3])
@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7, top_p=0.9),
                                      SamplingConfig()], ids=["T=1", "top-p", "greedy"])
def test_each_row_of_q_is_the_law_of_its_prefix(n_paths, sampling):
    draft = TabularLM(6, seed=2, sharpness=2.0)
    stopped_early = 0
    for seed in range(40):
        draft.reset()
        block = draft_paths(draft, CONTEXT, n_paths, 4, sampling, torch.Generator().manual_seed(seed),
                            frozenset({EOS}), 6)
        depth = block.q.shape[1]
        assert block.q.shape == (n_paths, depth, 6) and block.q.is_contiguous() and depth == block.forwards
        stopped_early += depth < 4  # every path drew EOS before γ
        for k, path in enumerate(block.tokens):
            assert len(path) == depth
            for i in range(depth):
                logits = draft.conditional(CONTEXT + path[:i]).log().float()[None]
                # to rounding: K rows are processed together, this one alone (softmax by rows vs one row's passes)
                expected = process_logits(logits, sampling)[0]
                assert torch.allclose(block.q[k, i], expected, rtol=1e-13, atol=1e-300), (k, i)
    assert stopped_early > 0 or sampling.greedy  # the early-stop slice was exercised


def test_paths_that_share_a_prefix_share_its_draft_row_and_cache_position():
    # K i.i.d. paths from a confident draft often coincide: each depth feeds the draft one row per distinct prefix
    # (not K), and the paths of a prefix point at the same cache position. A forward that fed every path, or a path
    # given another prefix's row, would fail the counts or the law check above (greedy: all paths are one prefix).
    draft = TabularLM(6, seed=2, sharpness=2.0)
    shared = distinct = 0
    for seed in range(40):
        draft.reset()
        block = draft_paths(draft, CONTEXT, 3, 4, SamplingConfig(temperature=1.0), torch.Generator().manual_seed(seed),
                            frozenset(), 6)
        prefixes = [len({tuple(path[: i + 1]) for path in block.tokens}) for i in range(block.forwards - 1)]
        assert block.fed == len(CONTEXT) + sum(prefixes)
        assert draft.cache_length == len(CONTEXT) + sum(prefixes)
        for i in range(block.forwards - 1):
            for a, b in ((0, 1), (0, 2), (1, 2)):
                same = block.tokens[a][: i + 1] == block.tokens[b][: i + 1]
                assert (block.positions[a][i] == block.positions[b][i]) == same
        shared += sum(n < 3 for n in prefixes)
        distinct += sum(n == 3 for n in prefixes)
    assert shared and distinct  # depths with shared and with distinct prefixes were both exercised


def test_the_block_carries_the_prefix_tree_its_feeding_followed():
    # One tree per round: the draft grows it as it draws, feeds its nodes breadth first (node n at cache position
    # len(CONTEXT) + n), and hands it on in the block, where the target's pass and the verifiers read it.
    draft = TabularLM(6, seed=2, sharpness=2.0)
    for seed in range(20):
        draft.reset()
        block = draft_paths(draft, CONTEXT, 3, 4, SamplingConfig(temperature=1.0), torch.Generator().manual_seed(seed),
                            frozenset(), 6)
        rebuilt = PrefixTree.of(block.tokens)
        assert (block.tree.tokens, block.tree.parents, block.tree.node_of) == (rebuilt.tokens, rebuilt.parents,
                                                                               rebuilt.node_of)
        for k in range(3):
            assert block.positions[k] == [len(CONTEXT) + node for node in block.tree.node_of[k][:-1]]
        assert block.tree.by_prefix() == build_prefix_tree(block.as_tensor())


@pytest.mark.parametrize("sampling", [SamplingConfig(), SamplingConfig(temperature=1.0),
                                      SamplingConfig(temperature=0.8, top_k=3)], ids=["greedy", "T=1", "top-k"])
def test_a_block_drafted_without_laws_has_the_tokens_its_laws_give(sampling):
    # Rounds verified by matching (keyed draws, greedy) draft without q, choosing from the logits: each token must
    # be what its law would give, the first argmax at T = 0 and at T > 0 the keyed race on the law's log, with logit
    # processors too (the draft's row at depth i counts its first i tokens).
    draft = TabularLM(6, seed=2, sharpness=2.0)
    processors = LogitProcessors({3: 3.2, 4: -1.0}, 0.5, 0.5).at(Counter([1, 4]))
    for seed in range(30):
        noise = None if sampling.greedy else KeyedNoise(seed, 6)
        blocks = []
        for laws in (True, False):
            draft.reset()
            blocks.append(draft_paths(draft, CONTEXT, 1, 4, sampling, torch.Generator().manual_seed(seed),
                                      frozenset({EOS}), 6, processors=processors, noise=noise, laws=laws))
        with_laws, without = blocks
        assert without.q is None and with_laws.q is not None
        assert without.tokens == with_laws.tokens and without.length == with_laws.length == without.forwards
        for i, token in enumerate(without.tokens[0]):
            law = with_laws.q[0, i]
            expected = int(law.argmax()) if noise is None else race(law.log(), noise.row(len(CONTEXT) + i))
            assert token == expected, (seed, i)
