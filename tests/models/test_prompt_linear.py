"""The copy that reads prompts on the int4 path: bfloat16 on oneDNN (AMX hosts) or int8 on fbgemm, chosen per host;
its numbers, its independence of the other rows, and which forwards reach it."""

from __future__ import annotations

import pytest
import torch

from tests.models.protocol_cases import fresh_logits
from tests.models.test_int4 import grid_model, on_grid, planted_grid
from verispec.errors import ConfigError
from verispec.models import int4, prompt_linear
from verispec.models.grid4 import grid_4bit
from verispec.models.int4 import (
    PROMPT_ROWS,
    Int4Linear,
    Int8RowLinear,
    PromptSwitch,
    prompt_copy_of,
    use_int4_linears,
)
from verispec.models.prompt_linear import Bf16Linear, prompt_copy, prompt_format, prompt_layer
from verispec.models.quantized import QuantizedLinear, quantized_engine
from verispec.models.tiny import tiny_qwen2
from verispec.provenance import cpu_description

pytestmark = pytest.mark.skipif(quantized_engine() is None, reason="this torch build has no fbgemm engine")


def test_the_bfloat16_copy_computes_the_linear_to_bfloat16_precision():
    gen = torch.Generator().manual_seed(0)
    weight, bias = torch.randn(96, 128, generator=gen) * 0.05, torch.randn(96, generator=gen)
    x = torch.randn(PROMPT_ROWS + 9, 128, generator=gen)
    exact = x.double() @ weight.double().T + bias.double()
    got = Bf16Linear(weight, bias)(x)
    assert got.dtype == torch.float32 and got.shape == (PROMPT_ROWS + 9, 96)
    # inputs and weights rounded to 8 significant bits (relative 2^-9 each), sums of 128 products, output rounded
    scale = (x.abs().double() @ weight.abs().double().T).amax()
    assert (got.double() - exact).abs().max() < 2.0**-7 * scale
    assert (got.double() - exact).abs().max() > 0  # it does round: not the float32 linear


def test_a_row_of_the_bfloat16_copy_does_not_depend_on_the_other_rows():
    gen = torch.Generator().manual_seed(1)
    layer = Bf16Linear(torch.randn(64, 96, generator=gen), None)
    x = torch.randn(PROMPT_ROWS + 1, 96, generator=gen)
    other = x.clone()
    other[5:] *= 50  # same batch size, much wider rows elsewhere: no shared activation scale to move row 0..4
    assert torch.equal(layer(x)[:5], layer(other)[:5])


@pytest.mark.skipif(cpu_description()["cpu_features"] is None, reason="no /proc/cpuinfo to compare with")
def test_amx_is_detected_as_the_cpu_reports_it():
    flags = cpu_description()["cpu_features"]
    assert prompt_linear.amx_available() == ("amx_tile" in flags and prompt_linear.onednn_bf16())


def test_auto_takes_int8_rows_with_tiles_bfloat16_with_amx_alone_the_kernel_at_avx512_vnni_and_int8_elsewhere(
        monkeypatch):
    monkeypatch.delenv(prompt_linear.CHOICE_VARIABLE, raising=False)
    cases = [(True, True, level, "int8-rows") for level in ("avx512-vnni", "avx2")]
    cases += [(True, False, level, "bf16") for level in ("avx512-vnni", "avx2")]
    cases += [(False, False, "avx512-vnni", "none"), (False, False, "avx-vnni", "int8"),
              (False, False, "avx2", "int8"), (False, False, "portable", "int8")]
    for amx, tiles, level, expected in cases:
        monkeypatch.setattr(prompt_linear, "amx_available", lambda amx=amx: amx)
        monkeypatch.setattr(prompt_linear, "kernel_tiles", lambda tiles=tiles: tiles)
        monkeypatch.setattr(prompt_linear, "kernel_level", lambda level=level: level)
        assert prompt_format() == expected, (amx, tiles, level)
        for choice in ("none", "int8-rows", "int8", "bf16"):
            assert prompt_format(choice) == choice
            monkeypatch.setenv(prompt_linear.CHOICE_VARIABLE, choice)  # what "auto" means, where the user says
            assert prompt_format() == choice
            monkeypatch.delenv(prompt_linear.CHOICE_VARIABLE)
    assert "bfloat16" in prompt_copy("bf16") and "fbgemm" in prompt_copy("int8") and "same" in prompt_copy("none")
    assert "8-bit kernel" in prompt_copy("int8-rows")
    weight = torch.randn(64, 32)
    assert isinstance(prompt_layer(weight, None, "bf16"), Bf16Linear)
    assert isinstance(prompt_layer(weight, None, "int8"), QuantizedLinear)
    assert isinstance(prompt_copy_of(weight, None, "int8-rows"), Int8RowLinear)
    assert prompt_layer(weight, None, "none") is None and prompt_copy_of(weight, None, "none") is None
    with pytest.raises(ValueError, match="prompt_copy_of"):  # the kernel's copies are made where the kernel is
        prompt_layer(weight, None, "int8-rows")
    # a shape the 8-bit kernel does not take gets the copy the host would make without it
    monkeypatch.setattr(int4, "onednn_bf16", lambda: True)
    assert isinstance(prompt_copy_of(torch.randn(48, 32), None, "int8-rows"), Bf16Linear)
    monkeypatch.setattr(int4, "onednn_bf16", lambda: False)
    assert isinstance(prompt_copy_of(torch.randn(48, 32), None, "int8-rows"), QuantizedLinear)


def test_a_wrong_prompt_copy_variable_is_a_clear_error(monkeypatch):
    monkeypatch.setenv(prompt_linear.CHOICE_VARIABLE, "fp8")
    with pytest.raises(ConfigError, match="VERISPEC_PROMPT_COPY='fp8' is not a prompt copy format"):
        prompt_format()


def test_the_int8_rows_copy_of_a_4bit_layer_is_the_8bit_layer_of_its_weights_bit_for_bit():
    gen = torch.Generator().manual_seed(3)
    weight = planted_grid(128, 96, seed=3)
    weight[5] = 0  # an all-zero row keeps a scale of 1
    q, scale, offset, _ = grid_4bit(weight)
    bias = torch.randn(128, generator=gen)
    layer = Int4Linear(q, scale, offset, bias)
    copy, reference = Int8RowLinear.from_int4(layer, bias), Int8RowLinear(layer.dequantized(), bias)
    for name in ("packed", "scale", "rowsum", "bias"):
        assert torch.equal(getattr(copy, name), getattr(reference, name)), name
    assert copy.scale[5] == 1 and copy.rowsum[5] == 0
    x = torch.randn(PROMPT_ROWS + 7, 96, generator=gen)
    assert torch.equal(copy(x), reference(x))
    # it is a copy of this layer's weights: another layer's differ
    other = Int4Linear(*grid_4bit(planted_grid(128, 96, seed=4))[:3], bias)
    assert not torch.equal(Int8RowLinear.from_int4(other, bias).packed, copy.packed)


def test_an_unknown_prompt_copy_format_is_a_clear_error():
    with pytest.raises(ConfigError, match="unknown prompt copy format 'fp8'.*auto, none, int8-rows, int8, bf16"):
        prompt_format("fp8")
    with pytest.raises(ConfigError, match="unknown prompt copy format"):
        use_int4_linears(tiny_qwen2(64, seed=0, hidden=64, dtype=torch.float32), prompt="fp8")


def test_prompt_sized_forwards_of_each_kernel_layer_run_the_bfloat16_copy():
    weight = planted_grid(64, 64, seed=9)
    q, scale, offset, _ = grid_4bit(weight)
    copy = Bf16Linear(weight, None)
    x = torch.randn(PROMPT_ROWS + 1, 64, generator=torch.Generator().manual_seed(10))
    for layer, plain in ((Int4Linear(q, scale, offset, None, prompt_linear=copy), Int4Linear(q, scale, offset, None)),
                         (Int8RowLinear(weight, None, prompt_linear=copy), Int8RowLinear(weight, None))):
        assert torch.equal(layer(x), copy(x))
        assert torch.equal(layer(x[:PROMPT_ROWS]), plain(x[:PROMPT_ROWS]))
        assert "over 64 tokens a bfloat16 copy" in layer.describe()
    switch = PromptSwitch(QuantizedLinear(weight, None), copy)
    decode = QuantizedLinear(weight, None)
    assert torch.equal(switch(x), copy(x))
    assert torch.equal(switch(x[:PROMPT_ROWS]), decode(x[:PROMPT_ROWS]))
    assert not torch.equal(switch(x)[:PROMPT_ROWS], decode(x[:PROMPT_ROWS]))  # the two copies do differ
    assert "fbgemm" in switch.describe() and "bfloat16 copy" in switch.describe()


@pytest.mark.parametrize("amx, tiles", [(True, True), (True, False), (False, False)])
def test_every_layer_but_the_lm_head_gets_a_prompt_copy_where_the_host_makes_one(monkeypatch, amx, tiles):
    monkeypatch.delenv(prompt_linear.CHOICE_VARIABLE, raising=False)
    monkeypatch.setattr(prompt_linear, "amx_available", lambda: amx)
    monkeypatch.setattr(prompt_linear, "kernel_tiles", lambda: tiles)
    model = grid_model(seed=1)
    layers = [m.quantized for m in model.model.modules() if hasattr(m, "quantized")]
    head = model.model.get_output_embeddings().quantized
    kernel_layers = [layer for layer in layers if hasattr(layer, "prompt_linear")]
    assert kernel_layers and getattr(head, "prompt_linear", None) is None
    if tiles:  # 4-bit layers get an int8 copy on the 8-bit kernel, the 8-bit layers read prompts themselves, and
        # layers of shapes the kernel does not take keep the bfloat16 copy
        expected = {Int4Linear: Int8RowLinear, Int8RowLinear: type(None), PromptSwitch: Bf16Linear}
        kinds = {type(layer) for layer in kernel_layers if layer is not head}
        assert Int4Linear in kinds and kinds <= set(expected)
        for layer in kernel_layers:
            if layer is not head:
                assert isinstance(layer.prompt_linear, expected[type(layer)])
        assert "an int8 copy (verispec's 8-bit kernel" in model.linear_kernel
    elif amx:
        assert all(isinstance(layer.prompt_linear, Bf16Linear) for layer in kernel_layers if layer is not head)
        assert "a bfloat16 copy" in model.linear_kernel
    else:  # the kernels read prompts themselves: no copy of any weight, none named
        assert all(layer.prompt_linear is None for layer in kernel_layers)
        assert "copy" not in model.linear_kernel
    # a prompt of more than PROMPT_ROWS tokens runs on the copies (or the kernels) and still gives the model's logits
    ids = torch.arange(PROMPT_ROWS + 6) % (model.vocab_size - 2) + 2
    logits = model.forward(ids.tolist(), n_logits=1).logits
    exact = fresh_logits(on_grid(seed=1), ids.tolist(), 1)  # the float32 model
    # measured on this random tiny model after 70 tokens: 7.5% (int8) and 9.3% (bf16) of the largest logit; a copy
    # of the wrong weights is off by about 100%
    assert (logits - exact).abs().max() < 0.2 * exact.abs().max()
