"""The C++ kernel of the verification laws' vocabulary-wide steps (verispec/native/laws.cpp): GBV's order and q_skew
at a node, and BV's leftover mass per row (`verispec.verify.gbv`, `verispec.verify.block`). Importing this module
registers it as the rules' accelerator (`verispec.verify.kernels`); the engine imports it, the rules never do.

The torch code beside each call is the reference and the fallback: the kernel computes the same quantities in a few
fused passes (tests hold the two equal to rounding and run the exact-enumeration proofs through both). It is built
once per machine on first use; where it cannot be built, or the tensors are not float64 on the CPU, the torch code
runs.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import torch

from verispec.errors import ConfigError
from verispec.verify.kernels import register_law_kernel

SOURCE = Path(__file__).resolve().parent / "laws.cpp"


@functools.cache
def _extension() -> Any | None:
    from verispec.native.build import load_native  # imported here: it pulls in torch's compiler tooling

    try:
        return load_native(SOURCE, "laws")
    except ConfigError:
        return None


def law_kernel(*tensors: torch.Tensor) -> Any | None:
    """Return the kernel module when it can take `tensors` (float64, on the CPU) and has been built, else None."""
    if any(t.device.type != "cpu" or t.dtype != torch.float64 for t in tensors):
        return None
    return _extension()


register_law_kernel(law_kernel)
