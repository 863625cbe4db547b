"""The hybrid proposer's draft caches (`verispec.vllm.draft_pool`; no vLLM needed): greedy drafts for a batch of
contexts equal each context's greedy draft computed alone, a request's next step feeds only what it committed since,
caches stay within their capacity and are reused least recently used first, and the proposer drafts with the model
only where the lookup finds nothing."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from verispec.models.decoder_stack import stack_kernel
from verispec.models.fastpath import apply_linear_backend
from verispec.models.hf import HFCausalLM
from verispec.models.quantized import quantized_engine
from verispec.models.tiny import perturb, tiny_qwen2, tiny_tokenizer
from verispec.vllm.draft_pool import DraftPool, common_prefix
from verispec.vllm.proposer import HybridProposer

pytestmark = pytest.mark.skipif(quantized_engine() is None or stack_kernel() is None,
                                reason="needs torch's fbgemm engine and a C++ compiler")


@pytest.fixture(scope="module")
def draft() -> HFCausalLM:
    """A tiny draft on the int4 path (decode passes on the stacked decoder kernel, long passes alone)."""
    tokenizer = tiny_tokenizer()
    net = perturb(tiny_qwen2(len(tokenizer), seed=21, hidden=128, dtype=torch.float32), 0.05, seed=22)
    model = HFCausalLM(net, tokenizer, name="tiny-draft")
    apply_linear_backend(model, "int4-rounded")
    return model


def alone(model: HFCausalLM, context: list[int], gamma: int) -> list[int]:
    """The greedy draft of `context` on a fresh copy of the model's cache: one pass over the context, then one per
    token (as the pool runs a new request)."""
    reference = copy.copy(model)
    reference.reset()
    out, tokens = reference.forward(context), []
    while True:
        tokens.append(int(out.logits[-1].argmax()))
        if len(tokens) == gamma or tokens[-1] in {0}:
            return tokens
        out = reference.forward(tokens[-1:])


def contexts(seed: int, lengths: list[int]) -> list[list[int]]:
    gen = torch.Generator().manual_seed(seed)
    return [torch.randint(2, 40, (n,), generator=gen).tolist() for n in lengths]


def test_common_prefix():
    assert common_prefix([1, 2, 3], [1, 2, 4, 5]) == 2
    assert common_prefix([1, 2], [1, 2, 3]) == 2
    assert common_prefix([], [1]) == 0
    assert common_prefix([5], [1]) == 0


def test_batched_drafts_equal_drafts_alone_and_reuse_caches(draft):
    pool = DraftPool(draft, capacity=4)
    first = contexts(1, [9, 30, 90])  # 90 tokens: over the decode kernels' rows, so that catch-up runs alone
    drafts = pool.draft(first + [[]], [4, 3, 5, 4])
    assert drafts[3] == []  # an empty context drafts nothing
    assert drafts[:3] == [alone(draft, ctx, g) for ctx, g in zip(first, [4, 3, 5], strict=True)]
    assert len(pool.caches) == 3
    fed = pool.fed
    # next step, rows in another order: each request committed two of its drafts and one token of its own
    grown = [first[1] + drafts[1][:2] + [7], first[0] + drafts[0][:2] + [8]]
    again = pool.draft(grown, [4, 4])
    assert again == [alone(draft, ctx, 4) for ctx in grown]
    # each request fed its one new token (the drafts it kept were cached), then each draft token but the last
    assert pool.fed - fed == sum(1 + len(d) - 1 for d in again)
    assert len(pool.caches) == 3


def test_caches_stay_within_capacity_least_recently_used_first(draft):
    pool = DraftPool(draft, capacity=2)
    a, b, c = contexts(2, [12, 14, 16])
    c[0] = 1  # shares no prefix with a or b
    pool.draft([a, b], [2, 2])
    pool.draft([a + [5]], [2])  # b's cache is now the least recently used
    held_b = next(s for s in pool.caches if s.tokens[:len(b)] == b)
    assert pool.draft([c], [3]) == [alone(draft, c, 3)]
    assert len(pool.caches) == 2 and held_b.tokens[:len(c)] == c  # c took b's cache
    # a context that is a prefix of what a cache holds rolls it back (and still feeds one token)
    assert pool.draft([a[:6]], [2]) == [alone(draft, a[:6], 2)]
    # more requests at once than capacity: every one gets a cache
    assert pool.draft([a, b, c], [1, 1, 1]) == [alone(draft, ctx, 1) for ctx in (a, b, c)]
    assert len(pool.caches) == 3


def test_hybrid_proposer_drafts_with_the_model_where_lookup_finds_nothing(draft, monkeypatch):
    monkeypatch.setattr("verispec.vllm.proposer.check_vllm_version", lambda: None)  # the check needs vLLM itself
    config = SimpleNamespace(speculative_config=SimpleNamespace(num_speculative_tokens=3),
                             model_config=SimpleNamespace(max_model_len=40, get_vocab_size=lambda: draft.vocab_size),
                             scheduler_config=SimpleNamespace(max_num_seqs=4))
    proposer = HybridProposer(config)
    proposer.pool = DraftPool(draft, proposer.capacity, proposer.vocab_size)  # instead of loading VERISPEC_VLLM_DRAFT
    tokens = np.zeros((3, 40), dtype=np.int64)
    tokens[0, :8] = [11, 12, 13, 14, 15, 11, 12, 13]  # a suffix recurs: the lookup drafts
    tokens[1, :6] = [21, 22, 23, 24, 25, 26]  # no suffix recurs: the model drafts
    tokens[2, :38] = contexts(3, [38])[0]  # 38 of 40 positions used: one draft token fits
    drafts = proposer.propose([[13], [26], [5]], np.array([8, 6, 38]), tokens)
    assert drafts[0] == [14, 15, 11]
    assert drafts[1] == alone(draft, [21, 22, 23, 24, 25, 26], 3)
    found = proposer.lookup(tokens[2, :38].tolist(), 1)
    assert drafts[2] == (found or alone(draft, tokens[2, :38].tolist(), 1))
    assert len(proposer.pool.caches) == 1 + (not found)
