"""The decoder stack (every layer of a decode or verify pass in one C++ call) against the decoder loop's step-by-step
layers: the same bits in logits, hidden states and KV cache, on 4-bit, 8-bit and mixed projections, chains, blocks,
trees and rollbacks; where it cannot run, the loop runs; bad inputs are refused by name."""

from __future__ import annotations

import pytest
import torch

from tests.models.test_int4 import planted_grid
from verispec.models.decoder_stack import stack_kernel
from verispec.models.fastpath import apply_linear_backend
from verispec.models.hf import HFCausalLM
from verispec.models.int4 import Int4Linear, Int8RowLinear
from verispec.models.quantized import quantized_engine
from verispec.models.tiny import tiny_qwen2, tiny_tokenizer

pytestmark = pytest.mark.skipif(quantized_engine() is None or stack_kernel() is None,
                                reason="needs torch's fbgemm engine and a C++ compiler")

PLANTED = {"q_proj", "k_proj", "gate_proj"}  # in the mixed model's first layer, these go to 4 bits, the rest to 8


def model(kind: str, hidden: int = 128) -> HFCausalLM:
    """A tiny float32 Qwen2 on the kernel's paths: "int8-rows" (random weights: every linear on the 8-bit path),
    "int4-rounded" (every linear rounded to 4 bits) or "mixed" (layer 0: q, k and gate on a 4-bit grid, v, o, up
    and down in 8 bits; layer 1 all on the grid), so projections have fused, 4-bit and 8-bit parts."""
    tokenizer = tiny_tokenizer()
    net = tiny_qwen2(len(tokenizer), seed=6, hidden=hidden, dtype=torch.float32)
    if kind == "mixed":
        with torch.no_grad():
            for index, layer in enumerate(net.model.layers):
                for name, module in layer.named_modules():
                    if isinstance(module, torch.nn.Linear) and (index == 1 or name.split(".")[-1] in PLANTED):
                        out, inp = module.weight.shape
                        module.weight.copy_(planted_grid(out, inp, seed=out * 7 + inp + index))
    wrapped = HFCausalLM(net, tokenizer)
    apply_linear_backend(wrapped, "int4-rounded" if kind == "int4-rounded" else "int4")
    return wrapped


class Counting:
    """Wraps a DecoderStack and counts its forwards."""

    def __init__(self, stack: object) -> None:
        self.stack, self.calls = stack, 0

    def forward(self, *args: object) -> torch.Tensor:
        self.calls += 1
        return self.stack.forward(*args)


def passes(m: HFCausalLM) -> list[torch.Tensor]:
    """Logits and hidden states of a prompt, a block, one token, a rollback, a tree and a tree rollback; then every
    layer's filled keys and values."""
    m.reset()
    outs = []
    first = m.forward([5, 9, 13, 2, 7, 30, 31], n_logits=2, return_hidden=True)
    block = m.forward([20, 21, 22, 23], n_logits=4, return_hidden=True)
    outs += [first.logits, first.hidden, block.logits, block.hidden, m.forward([3]).logits]
    m.truncate(9)
    outs.append(m.forward([40, 41]).logits)
    length = m.cache_length  # 11: a tree of two branches (12, 13) and (14, 15, 16) after it
    tree = m.forward([12, 13, 14, 15, 16], n_logits=5, parents=[length - 1, length, length - 1, length + 2,
                                                                  length + 3])
    outs.append(tree.logits)
    m.keep(list(range(length)) + [length + 2, length + 3])
    outs.append(m.forward([17, 18], n_logits=2).logits)
    cache = m._cache
    outs += [buffer[..., : cache.lengths[i], :] for i, buffer in enumerate(cache.keys)]
    outs += [buffer[..., : cache.lengths[i], :] for i, buffer in enumerate(cache.values)]
    return outs


@pytest.mark.parametrize("kind", ["int8-rows", "int4-rounded", "mixed"])
def test_the_stack_gives_the_loops_bits(kind):
    m = model(kind)
    lean = m._lean
    assert lean.stack is not None and len(lean.stack) == 2
    counting = lean.stack = Counting(lean.stack)
    with_stack = passes(m)
    assert counting.calls == 6  # every pass above is a decode or verify pass
    lean.whole_stack = False
    step_by_step = passes(m)
    assert counting.calls == 6
    assert len(with_stack) == len(step_by_step) == 8 + 2 * 2
    for got, expected in zip(with_stack, step_by_step, strict=True):
        assert torch.equal(got, expected)


def test_the_mixed_model_has_every_kind_of_part():
    layer = model("mixed")._lean.layers[0]
    kinds = {name: type(getattr(layer.self_attn if name[0] in "qkvo" else layer.mlp, name).quantized)
             for name in ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")}
    assert {name for name, kind in kinds.items() if kind is Int4Linear} == PLANTED
    assert all(kind is Int8RowLinear for name, kind in kinds.items() if name not in PLANTED)


def test_prompts_longer_than_the_per_query_passes_keep_the_loop():
    m = model("int4-rounded")
    counting = m._lean.stack = Counting(m._lean.stack)
    m.forward([3 + i % 40 for i in range(m.prompt_rows + 1)])
    assert counting.calls == 0
    m.forward([4])
    assert counting.calls == 1


def test_a_projection_off_the_kernel_keeps_the_loop():
    m = model("int8-rows", hidden=64)  # 2 key-value heads of 16: k and v have 32 outputs, fbgemm's shapes
    assert m._lean.stack is None and m._lean.query_kernel is not None
    m.forward([5, 6, 7])
    assert m.forward([8]).logits.shape[-1] == m.vocab_size


def test_bad_inputs_are_refused_by_name():
    m = model("int8-rows")
    stack = m._lean.stack
    m.forward([5, 6, 7])
    cache = m._cache
    x, cos, sin = torch.zeros(1, 128), torch.zeros(1, 32), torch.zeros(1, 32)
    with pytest.raises(RuntimeError, match=r"x must be \[tokens, hidden\]"):
        stack.forward(torch.zeros(1, 96), cache.keys, cache.values, 3, cos, sin)
    with pytest.raises(RuntimeError, match="one key and one value buffer per layer"):
        stack.forward(x, cache.keys[:1], cache.values, 3, cos, sin)
    small = [b[..., :3, :].contiguous() for b in cache.keys]
    with pytest.raises(RuntimeError, match="cache buffers"):
        stack.forward(x, small, cache.values, 3, cos, sin)
    with pytest.raises(RuntimeError, match="cos and sin"):
        stack.forward(x, cache.keys, cache.values, 3, torch.zeros(2, 32), sin)
    with pytest.raises(RuntimeError, match="mask must be"):
        stack.forward(x, cache.keys, cache.values, 3, cos, sin, torch.ones(1, 3, dtype=torch.bool))
    layer = m._lean.layers[0]
    norm = layer.input_layernorm.weight.detach()
    o = layer.self_attn.o_proj.quantized
    part = (o.packed, o.scale, o.rowsum, o.bias)
    spec = (norm, 1e-6, [part], [part], norm, 1e-6, [part], [part])
    with pytest.raises(RuntimeError, match="projection q/k/v gives 128 outputs, expected 256"):
        stack_kernel().DecoderStack([spec], 128, 4, 2, 32, 256, 0.1)
