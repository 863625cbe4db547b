"""GGUF blocks decoded by verispec against the gguf package's own `dequantize` (bit for bit), the 4-bit types' levels
in the kernel's layout (to float16 rounding of scale and offset), and the GGUF reader's table and errors."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from gguf import GGMLQuantizationType as GGML
from gguf import GGUFReader
from gguf.quants import dequantize as gguf_dequantize

from tests.models.gguf_cases import FACTORS, random_blocks, write_tiny_gguf
from verispec.errors import ModelFilesError
from verispec.models.gguf_blocks import FOUR_BIT, dequantize, dequantized, four_bit_levels, readable
from verispec.models.gguf_file import GGUFFile
from verispec.models.quantized import quantized_engine

ROWS, COLS = 128, 512  # two 256-weight super-blocks per row, two 64-row kernel quads


@pytest.mark.parametrize("ggml_type", list(FACTORS), ids=lambda t: t.name)
def test_blocks_decode_as_gguf_does_bit_for_bit(ggml_type):
    raw = random_blocks(ggml_type, ROWS, COLS, seed=int(ggml_type))
    want = torch.from_numpy(gguf_dequantize(raw, ggml_type))
    got = dequantize(torch.from_numpy(raw).reshape(-1), ggml_type, (ROWS, COLS))
    assert got.dtype == torch.float32 and got.shape == (ROWS, COLS)
    assert torch.equal(got, want)


@pytest.mark.parametrize("ggml_type", [GGML.F32, GGML.F16, GGML.BF16, GGML.Q3_K], ids=lambda t: t.name)
def test_float_types_and_types_left_to_gguf_decode_as_gguf_does(ggml_type):
    rng = np.random.default_rng(1)
    if ggml_type == GGML.Q3_K:  # decoded by gguf's numpy code: any bytes with a finite fp16 d at the end
        raw = rng.integers(0, 256, (ROWS, COLS // 256 * 110), dtype=np.uint8)
        raw.reshape(-1, 110)[:, 108:] = np.float16(0.01).reshape(1, 1).view(np.uint8)
    else:
        values = rng.normal(0, 1, (ROWS, COLS)).astype(np.float32)
        stored = {GGML.F32: values, GGML.F16: values.astype(np.float16),
                  GGML.BF16: (values.view(np.uint32) >> 16).astype(np.uint16)}[ggml_type]  # bf16: the top halves
        raw = stored.view(np.uint8)
    want = torch.from_numpy(np.asarray(gguf_dequantize(raw, ggml_type), dtype=np.float32)).reshape(ROWS, COLS)
    assert torch.equal(dequantize(torch.from_numpy(raw).reshape(-1), ggml_type, (ROWS, COLS)), want)


@pytest.mark.parametrize("ggml_type", list(FOUR_BIT), ids=lambda t: t.name)
def test_four_bit_levels_are_the_weights_gguf_decodes(ggml_type):
    raw = random_blocks(ggml_type, ROWS, COLS, seed=7 + int(ggml_type))
    q, scale, offset = four_bit_levels(torch.from_numpy(raw).reshape(-1), ggml_type, (ROWS, COLS))
    assert q.dtype == torch.uint8 and q.shape == (ROWS, COLS) and int(q.max()) <= 15
    assert scale.shape == offset.shape == (ROWS, COLS // 32)
    assert torch.equal(dequantized(q, scale, offset), torch.from_numpy(gguf_dequantize(raw, ggml_type)))


@pytest.mark.skipif(quantized_engine() is None, reason="this torch build has no fbgemm engine")
@pytest.mark.parametrize("ggml_type", list(FOUR_BIT), ids=lambda t: t.name)
def test_the_kernel_holds_the_levels_and_float16_scales(ggml_type):
    from verispec.models.int4 import Int4Linear

    raw = random_blocks(ggml_type, ROWS, COLS, seed=11 + int(ggml_type))
    q, scale, offset = four_bit_levels(torch.from_numpy(raw).reshape(-1), ggml_type, (ROWS, COLS))
    exact = torch.from_numpy(gguf_dequantize(raw, ggml_type))
    kernel = Int4Linear(q, scale, offset, None).dequantized()
    # scale and offset are stored in float16: each within 2^-11 of itself (or a subnormal step), the levels exact
    bound = (2.0**-11 * (15 * scale.abs() + offset.abs()) + 2.0**-24 * 16).repeat_interleave(32, dim=1)
    assert ((kernel - exact).abs() <= bound * 1.001).all()


def test_types_neither_verispec_nor_gguf_decode_are_reported():
    assert not readable(GGML.Q8_1) and readable(GGML.Q4_K) and readable(GGML.IQ4_NL)
    with pytest.raises(NotImplementedError, match="Q8_1"):
        dequantize(torch.zeros(36, dtype=torch.uint8), GGML.Q8_1, (1, 32))


def test_the_reader_lists_the_tensors_gguf_lists(tmp_path):
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    ours, theirs = GGUFFile(path), GGUFReader(path)
    assert ours.architecture == "qwen2" and ours.metadata["qwen2.block_count"] == 2
    assert ours.metadata["tokenizer.ggml.tokens"] == 64  # arrays stand as their length
    assert list(ours.tensors) == [t.name for t in theirs.tensors]
    for tensor in theirs.tensors:
        entry = ours.tensors[tensor.name]
        assert entry.shape == tuple(int(d) for d in reversed(tensor.shape))
        assert entry.ggml_type == tensor.tensor_type and entry.offset == tensor.data_offset
        stored = np.array(tensor.data).view(np.uint8).reshape(-1)
        assert torch.equal(ours.raw(tensor.name), torch.from_numpy(stored))


@pytest.mark.parametrize("damage", ["truncated", "not gguf", "empty", "cut header"])
def test_damaged_files_are_one_line_errors_naming_the_file(tmp_path, damage):
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    data = path.read_bytes()
    cut = {"truncated": data[:-1000], "not gguf": b"PK\x03\x04" + data[4:], "empty": b"", "cut header": data[:200]}
    path.write_bytes(cut[damage])
    with pytest.raises(ModelFilesError) as info:
        GGUFFile(path)
    message = str(info.value)
    assert str(path) in message and "\n" not in message
    # no traceback from inside the reader: nothing chained
    assert info.value.__cause__ is None and (info.value.__suppress_context__ or info.value.__context__ is None)
    if damage == "truncated":
        assert "truncated" in message
