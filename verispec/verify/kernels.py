"""The accelerator slot of the verification laws' vocabulary-wide steps: GBV's order and q_skew at a node, BV's
leftover mass per row (`verispec.verify.gbv`, `verispec.verify.block`).

The rules here are pure torch, and their torch code is the reference. A faster kernel for those steps (the C++ one,
`verispec.native.laws`, which sits above the rules and registers itself here when it is imported) is looked up at
each use: where none is registered, or it declines the tensors (not float64 on the CPU, not built), the torch code
runs. So the rules never import the native build, and a decode can report which code computed its laws: the engine
counts each lookup's outcome with `counting_law_steps` and writes the counts into its trace.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch

# A finder: the kernel module for these tensors, or None when it cannot take them.
LawKernelFinder = Callable[..., Any | None]

_finder: LawKernelFinder | None = None


@dataclass
class LawSteps:
    """How the law steps of one decode ran: `kernel` steps by the registered kernel, `torch` by the reference."""

    kernel: int = 0
    torch: int = 0


# The counts of the decode running in this thread or task, if it asked for them (a context variable: the server's
# worker threads decode concurrently, each with its own counts).
_steps: ContextVar[LawSteps | None] = ContextVar("verispec_law_steps", default=None)


def register_law_kernel(finder: LawKernelFinder | None) -> None:
    """Make `finder` the accelerator of the law steps (None: the torch reference only)."""
    global _finder
    _finder = finder


def law_kernel(*tensors: torch.Tensor) -> Any | None:
    """Return the registered kernel when it takes `tensors`, else None (the caller runs its torch reference); count
    the outcome for the decode that asked (`counting_law_steps`)."""
    kernel = _finder(*tensors) if _finder is not None else None
    steps = _steps.get()
    if steps is not None:
        if kernel is not None:
            steps.kernel += 1
        else:
            steps.torch += 1
    return kernel


@contextmanager
def counting_law_steps() -> Iterator[LawSteps]:
    """Count, inside the block, how many law steps ran on the kernel and how many on the torch reference."""
    steps = LawSteps()
    token = _steps.set(steps)
    try:
        yield steps
    finally:
        _steps.reset(token)
