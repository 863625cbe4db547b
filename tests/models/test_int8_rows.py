"""The kernel's 8-bit path (`Int8RowLinear`: int8 weights with one scale per row, the int4 backend's layers that
hold more than 4 bits): the product against a float64 reference, the unsigned-activation correction, per-token
causality (bit-identical rows), the prompt-size switch and the portable path's bits."""

from __future__ import annotations

import platform

import pytest
import torch

from tests.models.test_int4 import reference  # x quantized per token as the kernel does, float64 products
from verispec.models.int4 import PROMPT_ROWS, Int8RowLinear, extension
from verispec.models.quantized import QuantizedLinear, quantized_engine

pytestmark = pytest.mark.skipif(quantized_engine() is None, reason="this torch build has no fbgemm engine")


def layer_for(out_features: int, in_features: int, seed: int, bias: bool = True) -> Int8RowLinear:
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, in_features, generator=gen) * 0.05
    weight[3] = 0.0  # an all-zero row: its output is the bias
    weight[5] *= 40  # rows of very different ranges: each has its own scale
    return Int8RowLinear(weight, torch.randn(out_features, generator=gen) if bias else None)


def test_the_weights_are_rounded_per_row_to_half_a_step():
    gen = torch.Generator().manual_seed(0)
    weight = torch.randn(64, 96, generator=gen)
    weight[7] = 0.0
    layer = Int8RowLinear(weight, None)
    step = weight.abs().amax(1, keepdim=True) / 127
    assert ((layer.dequantized() - weight).abs() <= step / 2 + 1e-7).all()
    assert torch.equal(layer.dequantized()[7], torch.zeros(96))


def test_the_kernel_computes_the_quantized_product():
    layer = layer_for(128, 96, seed=1)
    x = torch.randn(11, 96, generator=torch.Generator().manual_seed(2))
    x[4] *= 50
    x[6] = 0.0  # an all-zero input row: its output is the bias
    y = layer(x)
    torch.testing.assert_close(y.double(), reference(layer, x), rtol=1e-5, atol=1e-5)
    assert torch.equal(y[6], layer.bias) and torch.equal(y[:, 3], layer.bias[3].expand(11))
    dense = x @ layer.dequantized().T + layer.bias
    assert (y - dense).abs().max() < 0.02 * dense.abs().max()  # 8-bit activations: ~1% of the output range


def test_a_missing_unsigned_activation_correction_moves_the_output_far_past_the_tolerance():
    layer = layer_for(64, 64, seed=3, bias=False)
    x = torch.randn(3, 64, generator=torch.Generator().manual_seed(4))
    expected = reference(layer, x)
    layer.rowsum.zero_()  # as a kernel that forgot the +128 it adds to every activation
    assert (layer(x).double() - expected).abs().max() > 1e3 * 1e-5


@pytest.mark.parametrize("rows", [9, 73])  # one register tile and more; past the 64-token cache block
def test_a_rows_outputs_are_bit_identical_alone_and_in_any_batch(rows):
    layer = layer_for(192, 64, seed=5)  # 3 quads of blocks
    x = torch.randn(rows, 64, generator=torch.Generator().manual_seed(6))
    x[1] *= 50
    batch = layer._run(x)
    for i in range(rows):
        assert torch.equal(layer._run(x[i: i + 1])[0], batch[i])
    for n in range(1, rows):
        assert torch.equal(layer._run(x[:n]), batch[:n])


def test_prompt_sized_forwards_run_the_fbgemm_copy_and_shorter_ones_the_kernel():
    weight = torch.randn(64, 64, generator=torch.Generator().manual_seed(7))
    copy = QuantizedLinear(weight, None)
    layer, plain = Int8RowLinear(weight, None, prompt_linear=copy), Int8RowLinear(weight, None)
    x = torch.randn(PROMPT_ROWS + 1, 64, generator=torch.Generator().manual_seed(8))
    assert torch.equal(layer(x), copy(x))
    assert torch.equal(layer(x[:PROMPT_ROWS]), plain(x[:PROMPT_ROWS]))
    assert not torch.equal(layer(x)[:PROMPT_ROWS], plain(x[:PROMPT_ROWS]))  # the two kernels do differ


def test_shapes_the_kernel_cannot_take_are_refused_clearly():
    with pytest.raises(ValueError, match="multiples of 64"):
        Int8RowLinear(torch.randn(48, 64), None)


@pytest.mark.skipif(platform.machine() not in ("x86_64", "AMD64"), reason="the portable build targets x86-64-v2")
def test_the_portable_path_returns_the_same_bits():
    layer = layer_for(128, 96, seed=9)
    x = torch.randn(13, 96, generator=torch.Generator().manual_seed(10))
    x[2] *= 50
    portable = extension(isa="portable")
    assert torch.equal(portable.linear8(x, layer.packed, layer.scale, layer.rowsum, layer.bias), layer(x))


@pytest.fixture
def tiles_then_restored():
    """The kernel's AMX switch, turned back to its default after the test."""
    from verispec.models.decoder_stack import set_amx_tiles

    yield set_amx_tiles
    set_amx_tiles(True)


@pytest.mark.skipif(not extension().amx(), reason="no AMX tiles on this CPU (or not granted by the OS)")
def test_the_tile_path_returns_the_vector_paths_bits_at_every_size(tiles_then_restored):
    layer = layer_for(256, 320, seed=11)  # 4 quads of blocks, 10 chunks of inputs
    x = torch.randn(70, 320, generator=torch.Generator().manual_seed(12))
    x[6] *= 80
    x[20] = 0.0
    for rows in range(1, 71):  # one tile of 1..16 tokens, several, past the 64-token cache block
        tiles_then_restored(True, min_tokens=1)
        on_tiles = layer._run(x[:rows])
        tiles_then_restored(False)
        assert torch.equal(on_tiles, layer._run(x[:rows])), rows
    assert "AMX" not in layer.describe()
    tiles_then_restored(True)
    assert f"passes of {extension().amx_min_tokens()}+ tokens on AMX tiles" in layer.describe()


def test_the_tiles_threshold_must_be_a_count_of_tokens(tiles_then_restored):
    with pytest.raises(ValueError, match="min_tokens must be >= 1"):
        tiles_then_restored(True, min_tokens=0)
