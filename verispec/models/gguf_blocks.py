"""GGUF's block formats decoded with whole-tensor torch ops: 4-bit blocks into the 4-bit kernel's own terms (levels,
scale and offset per group of 32 inputs), every other type into float32 weights.

Why: loading a quantized model should not cost a float32 copy of it. llama.cpp's 4-bit blocks already are the
kernel's format, w = scale * q + offset with q in 0..15 per 32 weights: Q4_0 (scale d, offset -8d), Q4_1 (d, m)
and Q4_K (super-blocks of 256 weights, fp16 d and dmin, 6-bit scale and min per 32: scale d*sc, offset -dmin*m).
Those products of float16 numbers and small integers are exact in float32, so `dequantized(levels)` equals
gguf's own `dequantize` bit for bit. The other types common in GGUF files (Q5_0, Q5_1, Q5_K, Q6_K, Q8_0, F16, BF16,
F32) are decoded here too, also bit for bit like gguf; the rest go through `gguf.quants.dequantize` (numpy, one
thread: 50-200 M weights/s, several times slower than these). A 151,936 x 1536 LM head is 233 M weights.

Layouts (gguf/quants.py, ggml-common.h): every block starts with its float16 factors, then packed integers. Nibbles
come in runs: within a run of n bytes, the low nibbles are weights 0..n-1 and the high nibbles weights n..2n-1.
"""

from __future__ import annotations

import functools

import numpy as np
import torch
from gguf import GGML_QUANT_SIZES
from gguf import GGMLQuantizationType as GGML
from gguf.quants import dequantize as gguf_dequantize

GROUP = 32  # weights per 4-bit scale and offset (and per block of the 32-weight types)
CHUNK = 1 << 20  # weights decoded at a time by `dequantize` (4 MB of float32 output)
K_SCALES = 12  # bytes of packed 6-bit scales and mins in a Q4_K / Q5_K super-block


def _f16(blocks: torch.Tensor, start: int) -> torch.Tensor:
    """The float16 at byte `start` of every block, as float32 [blocks, 1]."""
    return blocks[:, start: start + 2].contiguous().view(torch.float16).float()


def _nibbles(packed: torch.Tensor, run: int) -> torch.Tensor:
    """[blocks, bytes] -> [blocks, 2 * bytes] levels 0..15: per run of `run` bytes, the low nibbles, then the high.
    Eight bytes at a time (as int64 words: masks and shifts act on every byte alike), into one preallocated output:
    a few passes over memory instead of dozens of small byte-wide ops."""
    n = packed.shape[0]
    words = packed.contiguous().view(torch.int64).reshape(n, -1, 1, run // 8)  # [blocks, runs, 1, run / 8]
    out = torch.empty(n, words.shape[1], 2, run // 8, dtype=torch.int64)
    torch.bitwise_and(words, _LOW4, out=out[:, :, :1])
    torch.bitwise_and(words >> 4, _LOW4, out=out[:, :, 1:])  # >> smears bits across bytes; the mask cuts them
    return out.view(torch.uint8).reshape(n, -1)


def _bits(packed: torch.Tensor, count: int, width: int = 1) -> torch.Tensor:
    """[..., bytes] -> [..., count, bytes]: field i of `width` bits of every byte (bits i*width and up)."""
    shifts = torch.arange(0, count * width, width, dtype=torch.uint8)
    return (packed.unsqueeze(-2) >> shifts.view(-1, 1)) & ((1 << width) - 1)


def _k_scales(packed: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Q4_K / Q5_K's 12 bytes per super-block -> (scales, mins) [blocks, 8] float32, 6 bits each. Bytes 0-3 hold
    scales 0-3 (low 6 bits) and the top 2 bits of scales 4-7; bytes 4-7 the same for the mins; bytes 8-11 the low
    4 bits of scales 4-7 (low nibble) and of mins 4-7 (high nibble). Decoded as three little-endian int32 words per
    block, four bytes per operation (the masks keep every byte's bits within it)."""
    low_sc, low_m, rest = packed.contiguous().view(torch.int32).unbind(1)
    words = torch.stack([low_sc & 0x3F3F3F3F, (rest & 0x0F0F0F0F) | ((low_sc >> 2) & 0x30303030),
                         low_m & 0x3F3F3F3F, ((rest >> 4) & 0x0F0F0F0F) | ((low_m >> 2) & 0x30303030)], dim=1)
    both = words.view(torch.uint8).float()  # [blocks, 16]: 8 scales, then 8 mins
    return both[:, :8], both[:, 8:]


def _levels_q4_0(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    d = _f16(blocks, 0)
    return _nibbles(blocks[:, 2:], 16), d, -8 * d


def _levels_q4_1(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return _nibbles(blocks[:, 4:], 16), _f16(blocks, 0), _f16(blocks, 2)


def _levels_q4_k(blocks: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    sc, m = _k_scales(blocks[:, 4: 4 + K_SCALES])
    return _nibbles(blocks[:, 4 + K_SCALES:], 32), _f16(blocks, 0) * sc, -(_f16(blocks, 2) * m)


# type -> [blocks, bytes] uint8 -> (levels [blocks, weights] uint8, scale and offset [blocks, weights / 32] float32)
FOUR_BIT = {GGML.Q4_0: _levels_q4_0, GGML.Q4_1: _levels_q4_1, GGML.Q4_K: _levels_q4_k}


def _dq_q5_0(blocks: torch.Tensor) -> torch.Tensor:
    high = _bits(blocks[:, 2:6], 8).transpose(1, 2).reshape(-1, 32)  # bit j of the little-endian uint32: weight j
    q = (_nibbles(blocks[:, 6:], 16) | (high << 4)).to(torch.int8) - 16
    return _f16(blocks, 0) * q.float()


def _dq_q5_1(blocks: torch.Tensor) -> torch.Tensor:
    high = _bits(blocks[:, 4:8], 8).transpose(1, 2).reshape(-1, 32)
    q = _nibbles(blocks[:, 8:], 16) | (high << 4)
    return _f16(blocks, 0) * q.float() + _f16(blocks, 2)


def _dq_q8_0(blocks: torch.Tensor) -> torch.Tensor:
    return blocks[:, 2:].contiguous().view(torch.int8).float() * _f16(blocks, 0)


def _dq_q4_k(blocks: torch.Tensor) -> torch.Tensor:
    return dequantized(*_levels_q4_k(blocks))


def _dq_q5_k(blocks: torch.Tensor) -> torch.Tensor:
    n = blocks.shape[0]
    sc, m = _k_scales(blocks[:, 4: 4 + K_SCALES])
    high = _bits(blocks[:, 16:48], 8).reshape(n, 8, 32)  # bit j of byte i: weight i of sub-block j
    q = (_nibbles(blocks[:, 48:], 32).reshape(n, 8, 32) | (high << 4)).float()
    return ((_f16(blocks, 0) * sc).unsqueeze(2) * q - (_f16(blocks, 2) * m).unsqueeze(2)).reshape(n, 256)


def _dq_q6_k(blocks: torch.Tensor) -> torch.Tensor:
    """Per 256 weights: 128 bytes of low nibbles (two halves of 64 bytes; in each, weights 0-63 low, 64-127 high),
    64 bytes of 2-bit high parts (two halves of 32 bytes, four fields per byte: weight t + 32 f of the half), 16
    int8 scales (one per 16 weights), fp16 d; w = d * scale * (q - 32). Worked on as int64 words (8 weights each)."""
    n = blocks.shape[0]
    low = blocks[:, :128].contiguous().view(torch.int64).reshape(n, 2, 1, 8)  # [blocks, half, 1, words]
    low = torch.cat([low & _LOW4, (low >> 4) & _LOW4], dim=2).reshape(n, 2, 4, 4)  # [blocks, half, field, words]
    high = blocks[:, 128:192].contiguous().view(torch.int64).reshape(n, 2, 1, 4)
    high = ((high >> _FIELDS) & _LOW2) << 4
    q = (low | high).view(torch.uint8).reshape(n, 16, 16).float().sub_(32)
    factors = _f16(blocks, 208) * blocks[:, 192:208].contiguous().view(torch.int8).float()  # [blocks, 16]
    return q.mul_(factors.unsqueeze(2)).reshape(n, 256)


_LOW4, _LOW2 = 0x0F0F0F0F0F0F0F0F, 0x0303030303030303  # the low 4 / 2 bits of each byte of an int64 word
_FIELDS = torch.tensor([0, 2, 4, 6]).view(1, 1, 4, 1)  # the shifts of the four 2-bit fields of a byte


DECODERS = {GGML.Q5_0: _dq_q5_0, GGML.Q5_1: _dq_q5_1, GGML.Q8_0: _dq_q8_0, GGML.Q4_K: _dq_q4_k, GGML.Q5_K: _dq_q5_k,
            GGML.Q6_K: _dq_q6_k}
PLAIN = {GGML.F32: torch.float32, GGML.F16: torch.float16, GGML.BF16: torch.bfloat16}


def blocks_of(raw: torch.Tensor, ggml_type: GGML) -> torch.Tensor:
    """The bytes of a tensor of `ggml_type` as [blocks, bytes per block] uint8."""
    return raw.reshape(-1, GGML_QUANT_SIZES[ggml_type][1])


def four_bit_levels(raw: torch.Tensor, ggml_type: GGML, shape: tuple[int, int]
                    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return (q [rows, cols] uint8 in 0..15, scale [rows, cols/32], offset [rows, cols/32] float32) of the 4-bit
    tensor `raw` (its bytes, any shape) of `ggml_type` (one of `FOUR_BIT`) and logical `shape`: w = scale * q +
    offset per group of 32 weights along a row."""
    rows, cols = shape
    q, scale, offset = FOUR_BIT[ggml_type](blocks_of(raw, ggml_type))
    return q.reshape(rows, cols), scale.reshape(rows, cols // GROUP), offset.reshape(rows, cols // GROUP)


def dequantized(q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """Return the float32 weights scale * q + offset [rows, cols] of 4-bit levels (`four_bit_levels`' outputs), in
    gguf's order of operations (so equal to its `dequantize` bit for bit)."""
    rows, cols = q.shape
    groups = q.reshape(rows, -1, GROUP).float()
    return groups.mul_(scale.unsqueeze(2)).add_(offset.unsqueeze(2)).reshape(rows, cols)


@functools.cache
def readable(ggml_type: GGML) -> bool:
    """Return whether `dequantize` can decode `ggml_type` (here, or through gguf's numpy decoders)."""
    if ggml_type in DECODERS or ggml_type in PLAIN:
        return True
    try:
        gguf_dequantize(np.zeros((1, GGML_QUANT_SIZES[ggml_type][1]), dtype=np.uint8), ggml_type)
    except (NotImplementedError, KeyError, ValueError):
        return False
    return True


def dequantize(raw: torch.Tensor, ggml_type: GGML, shape: tuple[int, ...]) -> torch.Tensor:
    """Return the float32 tensor of logical `shape` stored in the bytes `raw` (uint8) as `ggml_type`. Raises
    NotImplementedError for a type neither verispec nor the gguf package can decode (`readable` says so)."""
    if ggml_type in PLAIN:  # a copy even of float32: a view would keep the whole mapped file alive
        return raw.contiguous().view(PLAIN[ggml_type]).to(torch.float32, copy=True).reshape(shape)
    if ggml_type in DECODERS:
        # In slices of about CHUNK weights: each decoder's temporaries (several per weight) then stay in cache
        # instead of costing GBs for an LM head, and the output is written once.
        blocks, size = blocks_of(raw, ggml_type), GGML_QUANT_SIZES[ggml_type][0]
        out = torch.empty(blocks.shape[0], size)
        step = max(1, CHUNK // size)
        for start in range(0, blocks.shape[0], step):
            out[start: start + step] = DECODERS[ggml_type](blocks[start: start + step])
        return out.reshape(shape)
    if not readable(ggml_type):
        raise NotImplementedError(f"no decoder for GGML type {ggml_type.name}")
    return torch.from_numpy(gguf_dequantize(raw.numpy().reshape(-1), ggml_type)).reshape(shape)
