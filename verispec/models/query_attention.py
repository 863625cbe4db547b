"""Attention one query at a time (verispec/native/attention.cpp), so that a token's logits do not depend on which
other tokens share its forward.

Why: torch's fused attention blocks its work by the shape of the call, so a token's attention output moves in the
last bits with the number of tokens in the forward. On the int4 and int8 paths every linear is computed per token,
so that was the one thing that made a verify pass over a drafted block disagree with the one-token forwards of plain
decoding; the per-token int8 activation rounding amplified it to logit differences of 0.7-1.6 (BENCHMARKS.md §3), and
greedy `sd` then differed from `ar` at near-ties. With this kernel in every decode and verify pass a block's logits
are bit-identical to one-token forwards' (tested), so greedy speculative decoding reproduces `ar` token for token.
Measured on one layer of the default target (12 heads sharing 2 key-value heads of 128, 2 threads, Intel Xeon): one
query after 300 cached tokens 0.55x the time of torch's kernel, five queries after 1,000 1.6x; a whole one-token
forward of the target as fast as with torch's kernel, a five-token one 1% slower.

The same passes run their rotary embedding (bit-identical to torch's) and RMSNorm (each row on its own, torch's to
float32 rounding) in this module: one call each instead of six to seven small torch calls per use.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch

from verispec.errors import ConfigError
from verispec.native.build import load_native

NATIVE = Path(__file__).resolve().parent.parent / "native"
# The kernel and its Python module, each compiled once and linked; the header they share.
SOURCES = (NATIVE / "attention.cpp", NATIVE / "attention_module.cpp")
INCLUDES = (NATIVE / "attention.h",)


def attention_extension(isa: str | None = None) -> Any:
    """Build (once per machine and level, cached) and return the per-query attention extension for instruction-set
    level `isa` (verispec.native.cpu; None: the best this CPU runs); raises ConfigError where it cannot be built."""
    return load_native(SOURCES, "attention", isa, includes=INCLUDES)


@functools.cache
def attention_kernel() -> Any | None:
    """Return the per-query attention extension (built once per machine), or None where it cannot be built."""
    try:  # at the avx512-vnni level with 512-bit vectors (gcc prefers 256 by default): measured 1.2-1.45x faster
        return attention_extension()
    except ConfigError:
        return None


def query_attention_support(model: Any) -> str | None:
    """Return None when the per-query kernel can run the attention of `model` (a transformers CausalLM on the
    CPU in float32), else why not."""
    if next(model.parameters()).device.type != "cpu":
        return "not on the CPU"
    if model.dtype != torch.float32:
        return f"{str(model.dtype).removeprefix('torch.')} activations (the kernel is float32)"
    if attention_kernel() is None:
        return "its kernel could not be built (needs g++ and ninja)"
    return None
