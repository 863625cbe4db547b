"""The model drafter's block: each row of q is the law its token was drawn from, written in place per depth."""

from __future__ import annotations

import pytest
import torch

from verispec.drafting import draft_paths
from verispec.models.tabular import TabularLM
from verispec.sampling import SamplingConfig, process_logits

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
