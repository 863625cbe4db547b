"""The 4-bit layers' AMX tile path (verispec/native/int4_amx.h, `amx_quad4`): the same bits as the vector path for
every pass size and split of a pass into tiles; run where the CPU has AMX tiles."""

from __future__ import annotations

import pytest
import torch

from tests.models.test_int4 import layer_for, planted_grid
from verispec.models.decoder_stack import set_amx4_tiles, set_amx_tiles
from verispec.models.int4 import Int4Linear, extension

pytestmark = pytest.mark.skipif(not extension().amx(), reason="no AMX tiles on this CPU (or not granted by the OS)")


@pytest.fixture
def tiles():
    """set_amx4_tiles, turned back to the default after the test."""
    yield set_amx4_tiles
    set_amx4_tiles(None)
    set_amx_tiles(True)


def grid_layer(out_features: int, in_features: int, seed: int) -> Int4Linear:
    bias = torch.randn(out_features, generator=torch.Generator().manual_seed(seed))
    return layer_for(planted_grid(out_features, in_features, seed=seed), bias=bias)


def test_the_tile_path_returns_the_vector_paths_bits_at_every_size(tiles):
    layer = grid_layer(256, 320, seed=21)  # 4 quads of blocks, 10 groups of inputs
    x = torch.randn(70, 320, generator=torch.Generator().manual_seed(22))
    x[3] *= 80
    x[17] = 0.0
    for rows in range(1, 71):  # one tile of 1..16 tokens, two of 17..32 per unpacking, past the 64-token cache block
        tiles(1)
        on_tiles = layer._run(x[:rows])
        tiles(0)
        assert torch.equal(on_tiles, layer._run(x[:rows])), rows


def test_each_row_is_the_same_alone_and_in_a_pass_on_tiles(tiles):
    layer = grid_layer(128, 64, seed=23)
    x = torch.randn(37, 64, generator=torch.Generator().manual_seed(24))
    tiles(None)
    batch = layer._run(x)  # 32 tokens as two tiles, then one tile of 5
    for i in range(37):
        assert torch.equal(layer._run(x[i: i + 1])[0], batch[i]), i


def test_the_description_says_which_passes_take_tiles(tiles):
    layer = grid_layer(64, 64, seed=25)
    tiles(None)
    assert f"passes of {extension().amx4_min_tokens()}+ tokens on AMX tiles" in layer.describe()
    tiles(0)
    assert "AMX" not in layer.describe()
    set_amx_tiles(False)  # turns every tile path off
    tiles(None)
    assert "AMX" not in layer.describe()


def test_the_threshold_must_be_a_count_of_tokens():
    with pytest.raises(ValueError, match="min_tokens must be >= 0"):
        set_amx4_tiles(-2)
