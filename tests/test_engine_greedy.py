"""At T = 0 the engine verifies the keyable methods (ar, draft, sd) by matching the target's argmaxes
(`verispec.verify.keyed.greedy_verify`) instead of running token verification on float64 point masses: the two
must give the same result on every block, ties and logit processors included."""

from __future__ import annotations

import pytest
import torch

from verispec.drafters.base import point_mass_block
from verispec.drafting import merge_paths
from verispec.engine import verify_block, verify_paths
from verispec.methods import get_method
from verispec.processors import LogitProcessors, tree_prefixes
from verispec.sampling import SamplingConfig
from verispec.scoring import ScoredBlock
from verispec.verify.keyed import greedy_verify

GREEDY = SamplingConfig(temperature=0.0)
VOCAB = 40


def test_greedy_verify_keeps_the_matching_prefix_then_the_argmax():
    kept = greedy_verify([5, 6, 7], [5, 6, 7, 8])
    assert (kept.accepted, kept.token) == (3, 8)  # all kept, then the bonus
    kept = greedy_verify([5, 9, 7], [5, 6, 7, 8])
    assert (kept.accepted, kept.token) == (1, 6)  # the first mismatch gets the target's token
    kept = greedy_verify([], [4])
    assert (kept.accepted, kept.token) == (0, 4)  # γ = 0: a plain greedy step
    with pytest.raises(AssertionError, match="gamma"):
        greedy_verify([1, 2], [1, 2])


def _scored(gamma: int, seed: int, processors: LogitProcessors | None) -> ScoredBlock:
    """A chain block of `gamma` lookup tokens, each the row's argmax or not at random, over integer logits (many
    ties) for its γ+1 rows."""
    generator = torch.Generator().manual_seed(seed)
    logits = torch.randint(0, 4, (gamma + 1, VOCAB), generator=generator).to(torch.float32)
    argmax = logits.argmax(-1).tolist()
    tokens = [argmax[i] if torch.rand(1, generator=generator) < 0.7
              else int(torch.randint(0, VOCAB, (1,), generator=generator)) for i in range(gamma)]
    block = point_mass_block([tokens], VOCAB, "ngram")
    tree = merge_paths([tokens])
    offsets = None
    if processors is not None:
        round_processors = processors.at({tokens[0] if tokens else 3: 2})
        offsets = round_processors.rows(tree_prefixes(tree.tokens, tree.parents))
    return ScoredBlock(block, tree, logits, gamma + 1, GREEDY, offsets)


@pytest.mark.parametrize("method", ["ar", "draft", "sd"])
@pytest.mark.parametrize("processors", [None, LogitProcessors({1: 2.0, 7: -1.0}, 0.5, 0.25)],
                         ids=["plain", "processors"])
def test_greedy_matching_is_token_verification_at_temperature_zero(method, processors):
    spec = get_method(method)
    outcomes = set()
    for seed in range(150):
        gamma = 0 if not spec.speculative else seed % 5
        scored = _scored(gamma, seed, processors)
        fast = verify_block(spec, scored.block, scored, torch.Generator().manual_seed(seed))
        assert "p" not in scored.__dict__  # no float64 law was made
        generic = verify_paths(spec, scored.block.as_tensor(), scored.block.q, scored.p,
                               torch.Generator().manual_seed(seed))
        assert (fast.path, fast.accepted, fast.token) == (generic.path, generic.accepted, generic.token)
        outcomes.add((gamma, fast.accepted))
    if spec.speculative:  # the blocks exercised both long full acceptances and early mismatches
        assert any(accepted == gamma >= 2 for gamma, accepted in outcomes)
        assert any(accepted < gamma for gamma, accepted in outcomes)
