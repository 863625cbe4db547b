"""The int4 linear backend: exact recovery of 4-bit grids, the kernel against a float64 reference, per-token
causality (bit-identical rows), and the protocol on tiny models whose linears are put on a 4-bit grid.

The first use builds the kernel (about 40 s with g++; cached per source and torch version afterwards).
"""

from __future__ import annotations

import platform
from types import SimpleNamespace

import pytest
import torch

from tests.models.protocol_cases import fresh_logits, rollback_case, tree_case
from verispec.engine import DecodeConfig, Engine
from verispec.models import int4
from verispec.models.fastpath import apply_linear_backend
from verispec.models.grid4 import grid_4bit
from verispec.models.hf import HFCausalLM
from verispec.models.int4 import (
    GROUP,
    PROMPT_ROWS,
    Int4Linear,
    Int8RowLinear,
    PromptSwitch,
    extension,
    use_int4_linears,
)
from verispec.models.quantized import QuantizedLinear, quantized_engine
from verispec.models.tiny import perturb, tiny_qwen2, tiny_tokenizer
from verispec.scoring import path_rows, tree_pass
from verispec.verify.tree import PrefixTree

pytestmark = pytest.mark.skipif(quantized_engine() is None, reason="this torch build has no fbgemm engine")


def planted_grid(out_features: int, in_features: int, seed: int, top: int = 15) -> torch.Tensor:
    """Weights that are offset + scale * q per group of 32 (as a Q4_K tensor dequantized), q in 0..top."""
    gen = torch.Generator().manual_seed(seed)
    groups = out_features * in_features // GROUP
    q = torch.randint(0, top + 1, (groups, GROUP), generator=gen).float()
    q[:, 0], q[:, 1] = 0, top  # every level range is used from its bottom to its top
    scale = torch.rand(groups, 1, generator=gen) * 0.01 + 0.001
    offset = -scale * 8 + torch.randn(groups, 1, generator=gen) * 0.001
    return (offset + scale * q).reshape(out_features, in_features)


def layer_for(weight: torch.Tensor, bias: torch.Tensor | None = None) -> Int4Linear:
    q, scale, offset, share = grid_4bit(weight)
    assert share == 1.0
    return Int4Linear(q, scale, offset, bias)


@pytest.mark.parametrize("top", [15, 13, 1])
def test_a_4bit_grid_is_recovered_to_float16_precision(top):
    weight = planted_grid(64, 128, seed=top, top=top)
    layer = layer_for(weight)
    groups = weight.reshape(-1, GROUP)
    low, step = groups.amin(1), (groups.amax(1) - groups.amin(1)) / top
    err = (layer.dequantized() - weight).abs().reshape(-1, GROUP).amax(1)
    # float16 scale and offset, each rounded to 2^-11 of itself: at most 15 steps' and the offset's share of that
    assert (err <= 2.0**-11 * (15 * step + low.abs()) * 1.01 + 1e-7).all()
    assert (err < 0.02 * step).all()  # far below a step: the levels themselves are exact


def test_weights_on_no_grid_are_reported_as_such():
    weight = torch.randn(64, 128, generator=torch.Generator().manual_seed(0))
    assert grid_4bit(weight)[3] < 0.01


def documented_layout(q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """The packed layout int4_linear.cpp describes, built byte by byte: per quad of 16-row blocks, group and block,
    byte 64p + 4j + b holds row j's input 4p + b in its low nibble and 4(p + 4) + b in its high one; then the 16
    rows' float16 scales and offsets."""
    n, k = q.shape
    out = torch.zeros(n // 64, k // GROUP, 4, 320, dtype=torch.uint8)
    halves = [v.float().half().view(torch.uint8).reshape(n, k // GROUP, 2) for v in (scale, offset)]
    for row in range(n):
        quad, block, j = row // 64, row // 16 % 4, row % 16
        for g in range(k // GROUP):
            levels = q[row, g * GROUP: (g + 1) * GROUP]
            cell = out[quad, g, block]
            for p in range(4):
                low, high = levels[4 * p: 4 * p + 4], levels[4 * p + 16: 4 * p + 20]
                cell[64 * p + 4 * j: 64 * p + 4 * j + 4] = low | (high << 4)
            cell[256 + 2 * j: 258 + 2 * j], cell[288 + 2 * j: 290 + 2 * j] = halves[0][row, g], halves[1][row, g]
    return out


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_the_packed_layout_is_the_documented_one(dtype):
    gen = torch.Generator().manual_seed(3)
    q = torch.randint(0, 16, (128, 96), generator=gen, dtype=torch.uint8)
    # scales that float16 must round (half-way cases included), and offsets of both signs
    scale = (torch.rand(128, 3, generator=gen) * 0.01 + torch.tensor(1 + 2.0**-11)).to(dtype)
    offset = (torch.randn(128, 3, generator=gen) * 0.1).to(dtype)
    packed = int4.pack(q, scale, offset)
    assert packed.shape == (2, 3, 4, 320) and torch.equal(packed, documented_layout(q, scale, offset))
    layer = Int4Linear(q, scale, offset, None)
    expected = q.float().reshape(128, 3, GROUP) * scale.half().float()[..., None] + offset.half().float()[..., None]
    assert torch.equal(layer.dequantized(), expected.reshape(128, 96))


def reference(layer: Int4Linear | Int8RowLinear, x: torch.Tensor) -> torch.Tensor:
    """x quantized per token as the kernel does (x * 127 / max|x|, half to even), then float64 products."""
    peak = x.abs().amax(1, keepdim=True).clamp_min(1e-30)
    xq = torch.round(x * (127.0 / peak))
    y = (xq.double() @ layer.dequantized().double().T) * (peak.double() / 127.0)
    return y + (layer.bias.double() if layer.bias.numel() else 0.0)


def test_the_kernel_computes_the_quantized_product():
    gen = torch.Generator().manual_seed(1)
    layer = layer_for(planted_grid(128, 96, seed=2), bias=torch.randn(128, generator=gen))
    x = torch.randn(11, 96, generator=gen)
    x[4] *= 50
    x[6] = 0.0  # an all-zero row: its output is the bias
    y = layer(x)
    torch.testing.assert_close(y.double(), reference(layer, x), rtol=1e-5, atol=1e-5)
    assert torch.equal(y[6], layer.bias)
    dense = x @ layer.dequantized().T + layer.bias
    assert (y - dense).abs().max() < 0.02 * dense.abs().max()  # 8-bit activations: ~1% of the output range


def test_a_dropped_offset_term_moves_the_output_far_past_the_tolerance():
    layer = layer_for(planted_grid(64, 64, seed=3))
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(4))
    expected = reference(layer, x)
    layer.packed[..., 288:] = 0  # every float16 offset zeroed, as a kernel that skipped the offsets' term
    assert (layer(x).double() - expected).abs().max() > 1e3 * 1e-5


@pytest.mark.parametrize("rows", [9, 73])  # one register tile and more; past the 64-token cache block
def test_a_rows_outputs_are_bit_identical_alone_and_in_any_batch(rows):
    gen = torch.Generator().manual_seed(5)
    layer = layer_for(planted_grid(192, 64, seed=6), bias=torch.randn(192, generator=gen))  # 3 quads of blocks
    x = torch.randn(rows, 64, generator=gen)
    x[1] *= 50
    batch = layer(x)
    for i in range(rows):
        assert torch.equal(layer(x[i: i + 1])[0], batch[i])
    for n in range(1, rows):
        assert torch.equal(layer(x[:n]), batch[:n])


def test_prompt_sized_forwards_run_the_int8_copy_and_shorter_ones_the_4bit_kernel():
    weight = planted_grid(64, 64, seed=9)
    q, scale, offset, _ = grid_4bit(weight)
    copy = QuantizedLinear(weight, None)
    layer, plain = Int4Linear(q, scale, offset, None, prompt_linear=copy), Int4Linear(q, scale, offset, None)
    x = torch.randn(PROMPT_ROWS + 1, 64, generator=torch.Generator().manual_seed(10))
    assert torch.equal(layer(x), copy(x))
    assert torch.equal(layer(x[:PROMPT_ROWS]), plain(x[:PROMPT_ROWS]))
    assert not torch.equal(layer(x)[:PROMPT_ROWS], plain(x[:PROMPT_ROWS]))  # the two kernels do differ


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the portable build targets x86-64-v2")
def test_the_portable_path_returns_the_same_bits():
    """Hosts without AVX2 run the portable C++ path: the same operations in the same order (every level against it:
    tests/models/test_isa_paths.py)."""
    gen = torch.Generator().manual_seed(11)
    layer = layer_for(planted_grid(128, 96, seed=12), bias=torch.randn(128, generator=gen))
    x = torch.randn(13, 96, generator=gen)
    x[2] *= 50
    portable = extension(isa="portable")
    assert portable.isa() == "portable" and not portable.vnni()
    assert torch.equal(portable.linear(x, layer.packed, layer.bias), layer(x))


@pytest.mark.parametrize("threads", [1, 2, 3])
def test_the_kernel_runs_on_torchs_threads(threads):
    """The kernel's loops are OpenMP regions of torch's own runtime: as many threads as torch.set_num_threads gives
    (a build without -fopenmp ran them on one thread whatever the setting, at half the speed on 2 cores)."""
    before = torch.get_num_threads()
    try:
        torch.set_num_threads(threads)
        assert extension().parallel_threads() == torch.get_num_threads() == threads
    finally:
        torch.set_num_threads(before)


def test_bfloat16_inputs_come_back_in_bfloat16():
    layer = layer_for(planted_grid(64, 32, seed=7))
    x = torch.randn(2, 3, 32, generator=torch.Generator().manual_seed(8)).to(torch.bfloat16)
    out = layer(x)
    assert out.dtype == torch.bfloat16 and out.shape == (2, 3, 64)
    assert torch.equal(out, layer(x.float()).to(torch.bfloat16))


def on_grid(seed: int) -> HFCausalLM:
    """A tiny float32 Qwen2 whose linears are all put on a 4-bit grid (as a Q4 GGUF's would be), float linears."""
    tokenizer = tiny_tokenizer()
    model = tiny_qwen2(len(tokenizer), seed=seed, hidden=64, dtype=torch.float32)
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, torch.nn.Linear):
                q, scale, offset, _ = grid_4bit(module.weight)
                groups = q.reshape(q.shape[0], -1, GROUP).float()
                module.weight.copy_((groups * scale[..., None] + offset[..., None]).reshape(q.shape))
    return HFCausalLM(model, tokenizer)


def grid_model(seed: int = 1) -> HFCausalLM:
    """`on_grid` with the int4 backend (the linears whose shapes the kernel takes in 4 bits, the rest int8)."""
    wrapped = on_grid(seed)
    assert apply_linear_backend(wrapped, "int4") == "int4"
    return wrapped


def on_fbgemm(layer: object) -> bool:
    """Whether `layer` runs fbgemm's int8 linear in decode passes: alone, or with a bfloat16 copy for prompts (AMX)."""
    return type(layer) is QuantizedLinear or (isinstance(layer, PromptSwitch) and type(layer.decode) is QuantizedLinear)


def test_layers_on_a_grid_go_to_4_bits_and_the_others_to_int8():
    tokenizer = tiny_tokenizer()
    model = tiny_qwen2(len(tokenizer), seed=1, hidden=64, dtype=torch.float32)
    mlp = [m for n, m in model.named_modules() if ".mlp." in n and isinstance(m, torch.nn.Linear)]
    with torch.no_grad():
        for module in mlp:
            q, scale, offset, _ = grid_4bit(module.weight)
            module.weight.copy_((q.reshape(q.shape[0], -1, GROUP).float() * scale[..., None]
                                 + offset[..., None]).reshape(q.shape))
    counts = use_int4_linears(model, lm_head=model.get_output_embeddings())
    assert counts["int4"] == len(mlp) and counts["int8_rows"] > 0
    assert all(isinstance(m.quantized, Int4Linear) for m in mlp)
    attention = [m for n, m in model.named_modules() if ".self_attn." in n and isinstance(m, torch.nn.Linear)]
    fitting = [m for m in attention if m.out_features % 64 == 0]  # the kernel's shapes (k, v: 32 outputs here)
    assert fitting and all(isinstance(m.quantized, Int8RowLinear) for m in fitting)  # off the grid, small
    assert all(on_fbgemm(m.quantized) for m in attention if m not in fitting)
    assert counts["int4"] + counts["int8_rows"] + counts["int8"] == len(mlp) + len(attention) + 1


def test_off_grid_layers_too_wide_for_the_8_bit_path_go_to_fbgemm(monkeypatch):
    tokenizer = tiny_tokenizer()
    model = tiny_qwen2(len(tokenizer), seed=1, hidden=64, dtype=torch.float32)
    monkeypatch.setattr(int4, "MAX_INT8_INPUTS", 63)  # the attention projections' 64 inputs are now too many
    counts = use_int4_linears(model, lm_head=model.get_output_embeddings())
    q_proj = model.model.layers[0].self_attn.q_proj
    assert on_fbgemm(q_proj.quantized) and counts["int8"] > 0


def test_a_prefix_logits_do_not_depend_on_later_tokens_in_the_batch():
    model = grid_model()
    prefix = [5, 9, 13, 2]
    batch = fresh_logits(model, prefix + [30, 7], 6)[:4]
    alone = torch.stack([fresh_logits(model, prefix[: i + 1], 1)[0] for i in range(4)])
    assert torch.equal(batch, alone)  # per-token linears and attention one query at a time


def test_rollback_and_tree_attention_are_exact():
    after_rollback, expected, stale = rollback_case(grid_model())
    assert torch.equal(after_rollback, expected) and not torch.equal(stale, expected)
    for row, plain in tree_case(grid_model(), grid_model, [5, 9, 13, 2, 7], cached=4):
        assert torch.equal(row, plain)


def test_on_4bit_weights_the_backend_is_nearer_the_float_model_than_int8_and_says_what_ran():
    exact = fresh_logits(on_grid(seed=1), [3, 4, 5], 3)
    int8 = on_grid(seed=1)
    apply_linear_backend(int8, "int8")
    model = grid_model(seed=1)
    err_int4 = (fresh_logits(model, [3, 4, 5], 3) - exact).abs().max()
    err_int8 = (fresh_logits(int8, [3, 4, 5], 3) - exact).abs().max()
    assert err_int4 < err_int8 and err_int4 < 0.05 * exact.abs().max()  # measured: 0.039 and 0.058 of the max
    assert model.linear_backend == "int4" and "4-bit weights per 32 inputs in 10 linears" in model.linear_kernel


@pytest.mark.parametrize("paths", [[[7, 8, 9, 10]], [[7, 8, 9, 10], [7, 11, 12, 13], [14, 15, 16, 17]]])
def test_a_block_drafted_on_a_prompt_is_scored_as_ar_would_score_it(paths):
    """A prompt-sized first round (prompt + block over `PROMPT_ROWS` tokens) reads the prompt apart, so the block's
    positions run the decode kernels, as `ar` computes them token by token: a block scored in one forward with the
    prompt ran the prompt copy, whose logits differ by far more than attention's order (so greedy `sd` parted
    from `ar` on long prompts)."""
    model = grid_model()
    assert model.prompt_rows == PROMPT_ROWS
    prompt = [3 + (7 * i) % 37 for i in range(PROMPT_ROWS + 8)]
    model.reset()
    logits, tree, fed = tree_pass(model, prompt, SimpleNamespace(tokens=paths, tree=PrefixTree.of(paths)))
    assert fed == len(prompt) + len(tree.tokens)
    scored = path_rows(logits, tree)
    for k, path in enumerate(paths):
        model.reset()
        expected = [model.forward(prompt).logits[0]] + [model.forward([token]).logits[0] for token in path]
        assert torch.equal(scored[k], torch.stack(expected))


@pytest.mark.parametrize(("method", "paths"), [("sd", 1), ("gbv", 3)])
def test_greedy_speculative_decoding_equals_ar(one_thread, method, paths):
    target = grid_model(seed=1)
    draft = tiny_qwen2(len(target.tokenizer), seed=1, hidden=64, dtype=torch.float32)
    perturb(draft, 0.03, seed=3)
    draft = HFCausalLM(draft, target.tokenizer)
    prompt = target.tokenizer("def add(a, b):\n    return")["input_ids"]
    expected = Engine(target).decode(prompt, DecodeConfig("ar", max_new_tokens=40)).tokens
    out = Engine(target, draft).decode(prompt, DecodeConfig(method, gamma=4, paths=paths, max_new_tokens=40))
    assert out.tokens == expected
    assert 0 < out.trace.acceptance_rate < 1


def test_int4_rounded_puts_the_layers_on_no_grid_in_4_bits_too():
    """Weights on no 4-bit grid: int4 runs them in int8, int4-rounded rounds each group of 32 onto 16 levels between
    its minimum and maximum (each weight within half a level of itself, plus float16's rounding of scale and
    offset) and says how many layers it rounded."""
    gen = torch.Generator().manual_seed(5)
    weight = torch.randn(128, 96, generator=gen)
    layers = {}
    for rounded in (False, True):
        linear = torch.nn.Linear(96, 128)
        linear.weight.data.copy_(weight)
        counts = use_int4_linears(torch.nn.Sequential(linear), round_to_4bit=rounded)
        layers[rounded] = linear.quantized
        assert counts["int4"] == counts["int4_rounded"] == int(rounded)
    assert isinstance(layers[False], Int8RowLinear) and isinstance(layers[True], Int4Linear)
    groups = weight.reshape(-1, GROUP)
    half_step = (groups.amax(1) - groups.amin(1)) / 30
    err = (layers[True].dequantized() - weight).abs().reshape(-1, GROUP).amax(1)
    assert (err <= half_step * 1.01 + 2.0**-11 * groups.abs().amax(1) * 16).all()
    assert (err > 0.2 * half_step).float().mean() > 0.9  # rounded indeed: random weights sit between the levels
    x = torch.randn(PROMPT_ROWS + 1, 96, generator=gen)  # a prompt: the layer's prompt copy holds the rounded weights
    prompt_out = layers[True](x)
    rounded_err = (prompt_out - (x @ layers[True].dequantized().T + linear.bias)).abs().max()
    assert rounded_err < 0.3 * (prompt_out - (x @ weight.T + linear.bias)).abs().max()
    tokenizer = tiny_tokenizer()
    model = HFCausalLM(tiny_qwen2(len(tokenizer), seed=2, hidden=64, dtype=torch.float32), tokenizer)
    assert apply_linear_backend(model, "int4-rounded") == "int4-rounded" and model.per_query_attention
    rounded_layers = sum(isinstance(m.quantized, Int4Linear) for m in model.model.modules() if hasattr(m, "quantized"))
    assert rounded_layers > 0 and f"({rounded_layers} of them rounded to 4 bits)" in model.linear_kernel
