"""The copy that reads prompts on the int4 path: bfloat16 on oneDNN (AMX hosts) or int8 on fbgemm, chosen per host;
its numbers, its independence of the other rows, and which forwards reach it."""

from __future__ import annotations

import pytest
import torch

from tests.models.protocol_cases import fresh_logits
from tests.models.test_int4 import grid_model, on_grid, planted_grid
from verispec.errors import ConfigError
from verispec.models import prompt_linear
from verispec.models.int4 import PROMPT_ROWS, Int4Linear, Int8RowLinear, PromptSwitch, grid_4bit, use_int4_linears
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


def test_auto_takes_bfloat16_with_amx_the_kernel_at_avx512_vnni_and_int8_elsewhere(monkeypatch):
    cases = [(True, level, "bf16") for level in ("avx512-vnni", "avx2")]
    cases += [(False, "avx512-vnni", "none"), (False, "avx-vnni", "int8"), (False, "avx2", "int8"),
              (False, "portable", "int8")]
    for amx, level, expected in cases:
        monkeypatch.setattr(prompt_linear, "amx_available", lambda amx=amx: amx)
        monkeypatch.setattr(prompt_linear, "kernel_level", lambda level=level: level)
        assert prompt_format() == expected, (amx, level)
        for choice in ("none", "int8", "bf16"):
            assert prompt_format(choice) == choice
    assert "bfloat16" in prompt_copy("bf16") and "int8" in prompt_copy("int8") and "same" in prompt_copy("none")
    weight = torch.randn(64, 32)
    assert isinstance(prompt_layer(weight, None, "bf16"), Bf16Linear)
    assert isinstance(prompt_layer(weight, None, "int8"), QuantizedLinear)
    assert prompt_layer(weight, None, "none") is None


def test_an_unknown_prompt_copy_format_is_a_clear_error():
    with pytest.raises(ConfigError, match="unknown prompt copy format 'fp8'.*auto, none, int8, bf16"):
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


@pytest.mark.parametrize("amx", [True, False])
def test_every_layer_but_the_lm_head_gets_a_prompt_copy_where_the_host_makes_one(monkeypatch, amx):
    monkeypatch.setattr(prompt_linear, "amx_available", lambda: amx)
    model = grid_model(seed=1)
    layers = [m.quantized for m in model.model.modules() if hasattr(m, "quantized")]
    head = model.model.get_output_embeddings().quantized
    kernel_layers = [layer for layer in layers if hasattr(layer, "prompt_linear")]
    assert kernel_layers and getattr(head, "prompt_linear", None) is None
    if amx:
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
