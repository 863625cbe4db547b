"""Attention one query at a time (verispec/native/attention.cpp): torch's attention to float32 rounding, the same
bits whatever the call's other queries (causal blocks, tree masks, cache views), and on the int4 and int8 paths a
drafted block's logits bit-identical to one-token forwards'.

The first use builds the kernel (about 20 s with g++; cached per source and torch version afterwards).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

from tests.models.protocol_cases import fresh_logits
from verispec.models.fastpath import apply_linear_backend
from verispec.models.hf import HFCausalLM
from verispec.models.quantized import quantized_engine
from verispec.models.query_attention import attention_kernel
from verispec.models.tiny import tiny_qwen2, tiny_tokenizer

pytestmark = pytest.mark.skipif(attention_kernel() is None, reason="the attention kernel cannot be built here")


def qkv(heads: int, kv_heads: int, dim: int, queries: int, keys: int, seed: int = 0):
    """q [1, heads, T, D] laid out as a projection's output (tokens outer), k and v as views into a cache buffer with
    room for more positions than are filled."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(1, queries, heads, dim, generator=gen).transpose(1, 2)
    room = keys + 7
    k = torch.randn(1, kv_heads, room, dim, generator=gen)[:, :, :keys]
    v = torch.randn(1, kv_heads, room, dim, generator=gen)[:, :, :keys]
    return q, k, v


def reference(q, k, v, mask, scale):
    """torch's attention in float64, [1, T, heads, D]."""
    out = F.scaled_dot_product_attention(q.double(), k.double(), v.double(), attn_mask=mask, scale=scale,
                                         enable_gqa=q.shape[1] != k.shape[1])
    return out.transpose(1, 2).float()


# kv groups of 1, 2, 6 (the default target), 7 (its draft), 8 (one block) and 9 (a block and a rest); head sizes
# that are and are not multiples of the kernel's 16 lanes and 32-wide output chunks
SHAPES = [(4, 4, 16), (4, 2, 64), (12, 2, 128), (14, 2, 64), (8, 1, 40), (18, 2, 32), (6, 3, 20)]


@pytest.mark.parametrize(("heads", "kv_heads", "dim"), SHAPES)
def test_causal_attention_after_a_cache_matches_torch(heads, kv_heads, dim):
    q, k, v = qkv(heads, kv_heads, dim, queries=5, keys=37)
    causal = torch.ones(5, 37, dtype=torch.bool).tril(37 - 5)
    out = attention_kernel().attend(q, k, v, None, dim ** -0.5)
    torch.testing.assert_close(out, reference(q, k, v, causal, dim ** -0.5), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize(("heads", "kv_heads", "dim"), SHAPES)
def test_each_query_gets_the_bits_it_gets_alone(heads, kv_heads, dim):
    q, k, v = qkv(heads, kv_heads, dim, queries=6, keys=41, seed=1)
    kernel, scale = attention_kernel(), 0.3
    block = kernel.attend(q, k, v, None, scale)
    for i in range(6):
        seen = 41 - 6 + i + 1
        alone = kernel.attend(q[:, :, i: i + 1], k[:, :, :seen], v[:, :, :seen], None, scale)
        assert torch.equal(block[:, i: i + 1], alone)


def test_a_tree_mask_gives_each_node_the_bits_of_its_own_path():
    """Nodes attend to the cached prefix and their ancestors only; each gets what one query over exactly those keys,
    in position order, gets."""
    q, k, v = qkv(12, 2, 128, queries=4, keys=30, seed=2)
    kernel, scale = attention_kernel(), 128 ** -0.5
    mask = torch.zeros(4, 30, dtype=torch.bool)
    mask[:, :26] = True  # the cached prefix
    for node, ancestors in enumerate([[26], [26, 27], [28], [28, 29]]):
        mask[node, ancestors] = True
    out = kernel.attend(q, k, v, mask, scale)
    torch.testing.assert_close(out, reference(q, k, v, mask, scale), rtol=1e-5, atol=1e-5)
    for node in range(4):
        seen = mask[node].nonzero().squeeze(1)
        alone = kernel.attend(q[:, :, node: node + 1], k[:, :, seen], v[:, :, seen], None, scale)
        assert torch.equal(out[:, node: node + 1], alone)


def test_a_mask_that_shows_the_causal_keys_changes_nothing():
    q, k, v = qkv(12, 2, 128, queries=5, keys=20, seed=3)
    causal = torch.ones(5, 20, dtype=torch.bool).tril(15)
    kernel = attention_kernel()
    assert torch.equal(kernel.attend(q, k, v, causal, 0.1), kernel.attend(q, k, v, None, 0.1))


def test_bad_inputs_are_refused_by_name():
    q, k, v = qkv(4, 2, 16, queries=2, keys=5)
    kernel = attention_kernel()
    with pytest.raises(RuntimeError, match="float32"):
        kernel.attend(q.double(), k.double(), v.double(), None, 0.1)
    with pytest.raises(RuntimeError, match="multiple of kv_heads"):
        kernel.attend(q[:, :3], k, v, None, 0.1)
    with pytest.raises(RuntimeError, match="mask"):
        kernel.attend(q, k, v, torch.ones(2, 4, dtype=torch.bool), 0.1)
    with pytest.raises(RuntimeError, match="fewer keys"):
        kernel.attend(q, k[:, :, :1], v[:, :, :1], None, 0.1)


def tiny(backend: str) -> HFCausalLM:
    """A tiny float32 Qwen2 (4 heads of 16 sharing 2 key-value heads) on `backend`."""
    tokenizer = tiny_tokenizer()
    model = HFCausalLM(tiny_qwen2(len(tokenizer), seed=4, hidden=64, dtype=torch.float32), tokenizer)
    apply_linear_backend(model, backend)
    return model


@pytest.mark.skipif(quantized_engine() is None, reason="this torch build has no fbgemm engine")
@pytest.mark.parametrize("backend", ["int8", "int4"])
def test_on_the_quantized_paths_a_block_gets_exactly_the_logits_of_one_token_forwards(backend):
    model = tiny(backend)
    assert model.linear_backend == backend and model.per_query_attention
    assert "one query at a time" in model.decoder_loop
    prompt, block = [5, 9, 13, 2, 7], [20, 21, 22, 23]
    model.forward(prompt)
    scored = model.forward(block, n_logits=4).logits
    model.reset()
    model.forward(prompt)
    singles = torch.stack([model.forward([token]).logits[0] for token in block])
    assert torch.equal(scored, singles)
    assert torch.equal(fresh_logits(model, prompt + block, 9)[5:], singles)  # prompt and block in one forward


@pytest.mark.parametrize("backend", ["torch", "onednn"])
def test_float_paths_keep_torchs_attention(backend):
    model = tiny(backend)
    assert not model.per_query_attention and "one query" not in model.decoder_loop


# ---- The small per-token ops of a decode pass that run in the same module ----


@pytest.mark.parametrize("tokens,heads,kv_heads,dim", [(1, 14, 2, 64), (5, 12, 2, 128), (64, 4, 4, 16)])
def test_rotate_qk_writes_the_bits_of_torchs_rotary(tokens, heads, kv_heads, dim):
    from verispec.models.lean import _rotate_half

    gen = torch.Generator().manual_seed(tokens)
    fused = torch.randn(tokens, (heads + 2 * kv_heads) * dim, generator=gen)  # a fused q, k, v projection's output
    q, k, _ = fused.split([heads * dim, kv_heads * dim, kv_heads * dim], -1)
    q = q.view(1, tokens, heads, dim).transpose(1, 2)
    k = k.view(1, tokens, kv_heads, dim).transpose(1, 2)
    cos, sin = torch.randn(tokens, dim, generator=gen), torch.randn(tokens, dim, generator=gen)
    expected_q = q * cos + _rotate_half(q) * sin  # transformers' apply_rotary_pos_emb, broadcast over heads
    expected_k = k * cos + _rotate_half(k) * sin
    attention_kernel().rotate_qk(q, k, cos, sin)  # in place
    assert torch.equal(q, expected_q) and torch.equal(k, expected_k)  # fails if the compiler fused the products


def test_rms_norm_is_torchs_to_rounding_and_per_row():
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(7, 896, generator=gen) * 3
    weight = torch.randn(896, generator=gen)
    out = attention_kernel().rms_norm(x, weight, 1e-6)
    assert torch.allclose(out, F.rms_norm(x.double(), (896,), weight.double(), 1e-6).float(), rtol=1e-5, atol=1e-6)
    for row in (0, 3, 6):  # a row's bits do not depend on the call's other rows
        assert torch.equal(attention_kernel().rms_norm(x[row:row + 1], weight, 1e-6), out[row:row + 1])
    with pytest.raises(RuntimeError, match="weight"):
        attention_kernel().rms_norm(x, weight[:10], 1e-6)
