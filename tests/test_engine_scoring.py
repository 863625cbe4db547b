"""The engine's public pieces for measurement code: `score_block` and `roll_back`, chain (K = 1) and tree (K > 1)."""

from __future__ import annotations

import torch

from verispec.drafters import DraftRequest, ModelDrafter
from verispec.drafting import DraftBlock, merge_paths
from verispec.sampling import SamplingConfig
from verispec.scoring import roll_back, score_block

WARM = SamplingConfig(temperature=1.0)


def test_only_one_path_is_a_chain():
    assert merge_paths([[1, 2, 3]]).is_chain
    assert not merge_paths([[1, 2, 3], [1, 2, 3]]).is_chain  # duplicate paths stay K separate draws
    assert not merge_paths([[], []]).is_chain


def test_the_tree_pass_scores_each_path_as_the_chain_pass_does(tiny_pair):
    target, draft = tiny_pair["target"], tiny_pair["partial"]
    tokens = [3, 7, 11, 5]
    generator = torch.Generator().manual_seed(0)
    draft.reset()
    block = ModelDrafter(draft).propose(DraftRequest(tokens, 3, 4, WARM, generator, frozenset(), target.vocab_size))
    target.reset()
    tree = score_block(target, tokens, block, WARM)
    assert tree.tree is block.tree  # the pass feeds the tree the draft grew
    assert tree.p.shape == (3, block.length + 1, target.vocab_size)
    for k, path in enumerate(block.tokens):
        single = DraftBlock([path], block.q[k : k + 1], [[]], forwards=0, fed=0)
        target.reset()
        chain = score_block(target, tokens, single, WARM)
        assert chain.tree.is_chain and chain.fed == len(tokens) + len(path)
        torch.testing.assert_close(tree.p[k], chain.p[0], atol=1e-6, rtol=1e-5)


def test_roll_back_keeps_the_committed_tokens_then_the_accepted_draft_tokens(tiny_pair):
    target, draft = tiny_pair["target"], tiny_pair["partial"]
    tokens = [3, 7, 11, 5]
    for n_paths in (1, 2):
        draft.reset()
        target.reset()
        generator = torch.Generator().manual_seed(1)
        block = ModelDrafter(draft).propose(DraftRequest(tokens, n_paths, 4, WARM, generator, frozenset(),
                                                         target.vocab_size))
        scored = score_block(target, tokens, block, WARM)
        roll_back(target, draft, len(tokens), scored, n_paths - 1, 2)
        assert target.cache_length == draft.cache_length == len(tokens) + 2
        # The caches now hold the committed tokens and the kept draft tokens: the next pass continues them exactly.
        kept = tokens + block.tokens[n_paths - 1][:2]
        next_logits = target.forward(kept[target.cache_length:] + [0], n_logits=1).logits
        target.reset()
        torch.testing.assert_close(next_logits, target.forward(kept + [0], n_logits=1).logits, atol=1e-5, rtol=1e-4)
