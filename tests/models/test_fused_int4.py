"""Projections that share an input run as one 4-bit kernel call (`FusedInt4`): bit-identical to the layers one by
one, no second copy of the weights, and the decoder loop uses them."""

from __future__ import annotations

import pytest
import torch

from tests.models.test_int4 import layer_for, planted_grid
from verispec.models.fastpath import apply_linear_backend
from verispec.models.fused import FusedInt4, fused_projections
from verispec.models.grid4 import grid_4bit
from verispec.models.hf import HFCausalLM
from verispec.models.int4 import PROMPT_ROWS, Int4Linear
from verispec.models.quantized import QuantizedLinear, quantized_engine
from verispec.models.tiny import tiny_qwen2, tiny_tokenizer

pytestmark = pytest.mark.skipif(quantized_engine() is None, reason="this torch build has no fbgemm engine")


def three_layers() -> list[Int4Linear]:
    gen = torch.Generator().manual_seed(4)
    return [layer_for(planted_grid(n, 96, seed=n), bias=torch.randn(n, generator=gen) if n != 64 else None)
            for n in (192, 64, 128)]


@pytest.mark.parametrize("rows", [1, 2, 5, 8, 13])
def test_a_fused_call_returns_each_layers_own_bits(rows):
    layers = three_layers()
    x = torch.randn(rows, 96, generator=torch.Generator().manual_seed(rows))
    alone = [layer(x) for layer in layers]
    fused = FusedInt4(layers)
    for got, expected in zip(fused(x), alone, strict=True):
        assert torch.equal(got, expected)
    for got, layer in zip(fused(x), layers, strict=True):  # the layers, now views into the fused buffer, agree
        assert torch.equal(got, layer(x))


def test_the_layers_weights_become_views_into_the_fused_buffer():
    layers = three_layers()
    fused = FusedInt4(layers)
    start, end = fused.packed.data_ptr(), fused.packed.data_ptr() + fused.packed.numel()
    assert all(start <= layer.packed.data_ptr() < end for layer in layers)
    assert sum(layer.packed.numel() for layer in layers) == fused.packed.numel()
    again = FusedInt4(layers)  # a rebuilt decoder loop fuses the same layers again: no new copy
    assert again.packed.data_ptr() == fused.packed.data_ptr() and again.packed.shape == fused.packed.shape
    x = torch.randn(2, 96)
    assert all(torch.equal(a, b) for a, b in zip(again(x), fused(x), strict=True))


def test_prompt_sized_inputs_run_each_layers_prompt_copy():
    weights = [planted_grid(n, 64, seed=n) for n in (64, 128)]
    layers = []
    for w in weights:
        q, scale, offset, _ = grid_4bit(w)
        layers.append(Int4Linear(q, scale, offset, None, prompt_linear=QuantizedLinear(w, None)))
    x = torch.randn(PROMPT_ROWS + 3, 64, generator=torch.Generator().manual_seed(2))
    for got, layer in zip(FusedInt4(layers)(x), layers, strict=True):
        assert torch.equal(got, layer.prompt_linear(x))


def test_runs_of_4bit_layers_fuse_and_the_others_run_alone():
    layers = three_layers()
    modules = [torch.nn.Linear(96, layer.out_features, bias=False) for layer in layers] + [torch.nn.Linear(96, 32)]
    for module, layer in zip(modules, layers, strict=False):
        module.quantized = layer  # what replace_linears records
        module.forward = layer.forward
    x = torch.randn(3, 96, generator=torch.Generator().manual_seed(1))
    expected = [module(x) for module in modules]
    assert isinstance(fused_projections(modules[:3]), FusedInt4)
    # 4-bit, plain, 4-bit, 4-bit: three calls (the last two fused), outputs in the modules' order
    order = [modules[0], modules[3], modules[1], modules[2]]
    got = fused_projections(order)(x)
    for out, module in zip(got, order, strict=True):
        assert torch.equal(out, expected[modules.index(module)])


def grid_qwen(hidden: int = 128) -> tuple[torch.nn.Module, object]:
    """A tiny Qwen2 whose linears all lie on a 4-bit grid and have kernel-sized shapes (k/v: 64 outputs)."""
    tokenizer = tiny_tokenizer()
    model = tiny_qwen2(len(tokenizer), seed=5, hidden=hidden, dtype=torch.float32)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                q, scale, offset, _ = grid_4bit(module.weight)
                groups = q.reshape(q.shape[0], -1, 32).float()
                module.weight.copy_((groups * scale[..., None] + offset[..., None]).reshape(q.shape))
    return model, tokenizer


def test_the_decoder_loop_fuses_the_projections_and_keeps_transformers_logits():
    model, tokenizer = grid_qwen()
    lean, plain = HFCausalLM(model, tokenizer), HFCausalLM(model, tokenizer, lean=False)
    assert apply_linear_backend(lean, "int4") == "int4"  # replaces the shared modules' linears
    lean.per_query_attention = False  # torch's attention, as transformers' forward runs it
    lean.linears_changed()
    loop = lean._lean
    assert all(isinstance(call, FusedInt4) and len(call.layers) == 3 for call in loop.qkv)
    assert all(isinstance(call, FusedInt4) and len(call.layers) == 2 for call in loop.gate_up)
    tokens = torch.randint(2, lean.vocab_size, (20,), generator=torch.Generator().manual_seed(0)).tolist()
    for chunk, n_logits in ((tokens[:9], 2), (tokens[9:10], 1), (tokens[10:15], 5)):
        a = lean.forward(chunk, n_logits=n_logits).logits
        b = plain.forward(chunk, n_logits=n_logits).logits
        assert torch.equal(a, b), (a - b).abs().max()
