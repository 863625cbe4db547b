"""The kernels' instruction-set levels: which level a CPU gets (mocked feature sets, $VERISPEC_ISA), and every level
this host can run returning the portable build's bits: the 4-bit and 8-bit linears at 1..70 tokens, each token
alone as in its batch, and the decoder stack's hidden states, logits and caches.

Each level's first use builds its kernels (about a minute each with g++; cached afterwards)."""

from __future__ import annotations

import platform

import pytest
import torch

from tests.models.test_decoder_stack import model, passes
from verispec.errors import ConfigError
from verispec.models.decoder_stack import decoder_stack
from verispec.models.int4 import GROUP, ISA_NAMES, Int4Linear, Int8RowLinear, extension
from verispec.models.quantized import quantized_engine
from verispec.native.cpu import ENV, LEVELS, best_isa, isa_flags, missing_flags, supported_isas

AVX2 = {"sse4_2", "avx", "avx2", "fma", "f16c"}
AVX_VNNI = AVX2 | {"avx_vnni"}  # a client core without AVX-512 (Alder Lake and later)
AVX512 = AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512dq", "avx512_vnni"}  # as this test's usual host
AMX = AVX512 | {"avx_vnni", "amx_tile", "amx_int8", "amx_bf16"}  # a Sapphire Rapids Xeon


@pytest.fixture(autouse=True)
def no_forced_level(monkeypatch):
    monkeypatch.delenv(ENV, raising=False)


@pytest.mark.parametrize(("features", "best", "levels"), [
    (AVX512, "avx512-vnni", ["avx512-vnni", "avx-vnni", "avx2", "portable"]),
    (AVX_VNNI, "avx-vnni", ["avx-vnni", "avx2", "portable"]),
    (AVX2, "avx2", ["avx2", "portable"]),
    (AVX2 - {"f16c"}, "portable", ["portable"]),
    (set(), "portable", ["portable"]),
])
def test_each_cpu_gets_the_best_level_it_can_run(features, best, levels):
    assert best_isa(features) == best
    assert supported_isas(features) == levels


def test_the_avx_vnni_level_compiles_the_instruction_the_cpu_has():
    assert "-mavxvnni" in isa_flags("avx-vnni", AVX_VNNI)
    evex = isa_flags("avx-vnni", AVX512)  # the same 256-bit instruction in its AVX-512 form, for testing there
    assert "-mavx512vnni" in evex and "-mavxvnni" not in evex
    assert "-mavxvnni" in isa_flags("avx-vnni", AMX)  # both: the AVX-VNNI form, as a client core runs it


def test_amx_is_compiled_in_where_the_cpu_has_it():
    assert {"-mamx-tile", "-mamx-int8"} <= set(isa_flags("avx512-vnni", AMX))
    assert "-mamx-tile" not in isa_flags("avx512-vnni", AVX512)
    assert not any("amx" in flag for flag in isa_flags("avx-vnni", AMX))


def test_the_levels_define_their_own_macro_and_no_native_tuning():
    for level in LEVELS:
        flags = isa_flags(level, AMX)
        assert not any("native" in flag for flag in flags)
        assert ("-mprefer-vector-width=512" in flags) == (level == "avx512-vnni")
        if level != "portable":
            assert f"-DVERISPEC_ISA_LEVEL={3 - LEVELS.index(level)}" in flags


def test_the_environment_forces_a_level(monkeypatch):
    monkeypatch.setenv(ENV, "avx2")
    assert best_isa(AVX512) == "avx2"
    monkeypatch.setenv(ENV, "avx512-vnni")
    with pytest.raises(ConfigError, match="avx512-vnni.*lacks avx512_vnni, avx512bw, avx512f, avx512vl"):
        best_isa(AVX2)
    monkeypatch.setenv(ENV, "sse9")
    with pytest.raises(ConfigError, match="'sse9'.*avx512-vnni, avx-vnni, avx2, portable"):
        best_isa(AVX2)


def test_a_level_the_cpu_cannot_run_is_refused_by_its_missing_flags():
    assert missing_flags("avx2", AVX2 - {"fma"}) == ["fma"]
    with pytest.raises(ConfigError, match="avx-vnni.*lacks avx_vnni"):
        isa_flags("avx-vnni", AVX2)


# The kernels at every level this host runs, against the portable build.

RUNNABLE = [level for level in LEVELS if level != "portable"]
kernels = pytest.mark.skipif(quantized_engine() is None or platform.machine() not in ("x86_64", "AMD64"),
                             reason="needs torch's fbgemm engine and an x86-64 host (the portable build's target)")


def runnable(level: str) -> str:
    gaps = missing_flags(level)
    if gaps:
        pytest.skip(f"this CPU cannot run the {level} level: it lacks {', '.join(gaps)}")
    return level


def random_4bit(out_features: int, in_features: int, seed: int, bias: bool) -> Int4Linear:
    """Random levels, scales and offsets; row 0 all zero, rows 1-2 with scales 1000x the others'."""
    gen = torch.Generator().manual_seed(seed)
    q = torch.randint(0, 16, (out_features, in_features), generator=gen, dtype=torch.uint8)
    scale = torch.rand(out_features, in_features // GROUP, generator=gen) * 0.02 + 1e-3
    offset = -8 * scale + torch.randn(out_features, in_features // GROUP, generator=gen) * 1e-3
    q[0], scale[0], offset[0] = 0, 0.0, 0.0
    scale[1:3] *= 1000
    b = torch.randn(out_features, generator=gen) if bias else None
    return Int4Linear(q, scale, offset, b)


def random_8bit(out_features: int, in_features: int, seed: int, bias: bool) -> Int8RowLinear:
    """Random weights; row 0 all zero, rows 1-2 1000x the others; row 3 with a -128 level (the 256-bit path's sign
    trick takes |w| = 128 as an unsigned byte)."""
    gen = torch.Generator().manual_seed(seed)
    weight = torch.randn(out_features, in_features, generator=gen)
    weight[0] = 0.0
    weight[1:3] *= 1000
    layer = Int8RowLinear(weight, torch.randn(out_features, generator=gen) if bias else None)
    layer.packed.view(-1)[3 * 4:3 * 4 + 4] = -128  # row 3 of block 0, inputs 0..3 (byte 4j + b of the first vector)
    layer.rowsum.copy_(layer.dequantized().div(layer.scale[:, None]).round().sum(1).to(torch.int32))
    return layer


def activations(tokens: int, in_features: int, seed: int) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(tokens, in_features, generator=gen)
    x[3] *= 1e4  # one loud token
    x[5] = 0.0  # one silent token: its outputs are the bias
    x[7, : in_features // 2] = 0.0
    return x


def run(module, layer: Int4Linear | Int8RowLinear, x: torch.Tensor) -> torch.Tensor:
    if isinstance(layer, Int4Linear):
        return module.linear(x, layer.packed, layer.bias)
    return module.linear8(x, layer.packed, layer.scale, layer.rowsum, layer.bias)


@kernels
@pytest.mark.parametrize("level", RUNNABLE)
@pytest.mark.parametrize("bits", [4, 8])
@pytest.mark.parametrize(("shape", "bias"), [((128, 96), True), ((192, 1024), False)])
def test_every_level_returns_the_portable_bits(level, bits, shape, bias):
    module, portable = extension(runnable(level)), extension("portable")
    assert module.isa() == level and portable.isa() == "portable"
    layer = (random_4bit if bits == 4 else random_8bit)(*shape, seed=sum(shape) + bits, bias=bias)
    x = activations(70, shape[1], seed=bits)
    expected = run(portable, layer, x)
    assert torch.isfinite(expected).all()
    batch = run(module, layer, x)
    assert torch.equal(batch, expected)
    for tokens in range(1, 70):
        assert torch.equal(run(module, layer, x[:tokens]), expected[:tokens]), f"{tokens} tokens"
    for i in range(70):
        assert torch.equal(run(module, layer, x[i: i + 1])[0], batch[i]), f"token {i} alone"


@kernels
def test_the_layers_name_their_level():
    layer = random_4bit(64, 64, seed=0, bias=False)
    assert ISA_NAMES[best_isa()] in layer.describe()
    assert set(ISA_NAMES) == set(LEVELS)


@kernels
@pytest.mark.parametrize("level", RUNNABLE)
def test_the_decoder_stack_at_every_level_gives_the_portable_bits(level):
    m = model("mixed")
    lean = m._lean
    outputs = {}
    for isa in ("portable", runnable(level)):
        lean.stack = decoder_stack(lean.model, lean.layers, isa=isa)
        assert lean.stack is not None
        outputs[isa] = passes(m)
    for got, expected in zip(outputs[level], outputs["portable"], strict=True):
        assert torch.equal(got, expected)
