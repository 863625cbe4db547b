"""Where a decode's torch work runs: its model forwards on all of torch's threads, the rest of each round on one
(`round_threads`, around every decode; `forward_threads`, around every forward inside it).

Why: sampling and verification reduce rows of 151,936 probabilities, and a reduction to one number
(`probs.sum()`) splits its input among the OpenMP threads: its last bits depend on how many there are (31 of 120
sums over such rows differed between one and two threads). A decode's per-round work therefore always runs on one
OpenMP thread of the thread that decodes, whichever thread that is, and its forwards on the count that thread had
when the decode began. So a request decoded on a server's helper thread draws the same tokens as `verispec
generate`, at any temperature. It also keeps a batched server fast: a helper thread whose round work opened OpenMP
regions would start a thread pool of its own, and once libgomp manages more threads than there are cores it stops
letting idle workers spin, so every parallel loop of the batched passes waits for its workers to wake (measured on a
2-core Xeon: 4 sequences' passes took 74 ms each with helper pools, 56 ms without; one sequence's 55 ms against
44 ms).
The count is set per thread, through the OpenMP runtime torch loaded (`omp_set_num_threads` acts on the calling
thread only; `torch.set_num_threads` also changes process-wide state). Where no such runtime is found (a torch
built without OpenMP) nothing changes.
"""

from __future__ import annotations

import ctypes
import functools
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

OPENMP_RUNTIMES = ("libgomp", "libiomp5", "libomp")  # GNU (torch's Linux wheels), Intel, LLVM


@functools.cache
def openmp_runtime() -> Any | None:
    """Return the OpenMP runtime this process loaded for torch (a ctypes library with `omp_set_num_threads`), or
    None where there is none to be found (no /proc/self/maps, a torch without OpenMP)."""
    try:
        lines = Path("/proc/self/maps").read_text().splitlines()
    except OSError:
        return None
    paths = {line.split()[-1] for line in lines if "/" in line}
    for path in sorted(paths):
        if Path(path).name.startswith(OPENMP_RUNTIMES):
            try:
                library = ctypes.CDLL(path)
                library.omp_set_num_threads.argtypes = [ctypes.c_int]
                return library
            except (OSError, AttributeError):
                continue
    return None


@contextmanager
def openmp_threads(n: int) -> Iterator[None]:
    """Run the block with `n` OpenMP threads for torch operations started by the calling thread (no other thread's
    count changes), then restore this thread's previous count. A no-op without an OpenMP runtime."""
    runtime = openmp_runtime()
    before = torch.get_num_threads()  # also ATen's per-thread set-up, which would otherwise overwrite the count later
    if runtime is None or n == before:
        yield
        return
    runtime.omp_set_num_threads(n)
    try:
        yield
    finally:
        runtime.omp_set_num_threads(before)


_forward = threading.local()  # .threads: the count forwards of this thread's current decode run with


@contextmanager
def round_threads() -> Iterator[None]:
    """Run a decode: its round work on one OpenMP thread, its forwards (`forward_threads`) on the count the calling
    thread has now."""
    outer = getattr(_forward, "threads", None)
    _forward.threads = outer if outer is not None else torch.get_num_threads()
    try:
        with openmp_threads(1):
            yield
    finally:
        _forward.threads = outer


@contextmanager
def forward_threads() -> Iterator[None]:
    """Run a model forward on the thread count of the calling thread's decode (`round_threads`); unchanged outside
    one."""
    threads = getattr(_forward, "threads", None)
    if threads is None:
        yield
        return
    with openmp_threads(threads):
        yield
