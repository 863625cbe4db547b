"""The process's resident memory: read from /proc on Linux, from getrusage (peak only) elsewhere."""

from __future__ import annotations

import gc
import resource
import sys

import pytest

from verispec.serve import metrics
from verispec.serve.metrics import ServerMetrics, resident_memory

MB = 1 << 20


@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="/proc/self/status is Linux's")
def test_current_and_peak_follow_an_allocation():
    """A written 64 MB block shows in the current and the peak resident memory. Other threads of the test process
    (servers of earlier tests winding down, the garbage collector) may free memory meanwhile, so the growth is
    taken from the best of three tries."""
    growths = []
    for _ in range(3):
        gc.collect()
        current, peak = resident_memory()
        assert 10 * MB < current <= peak
        block = bytearray(64 * MB)  # zero pages are resident only once written
        block[::4096] = b"\1" * len(block[::4096])
        grown, grown_peak = resident_memory()
        assert grown_peak >= grown
        growths.append(grown - current)
        del block
        if growths[-1] > 48 * MB:
            break
    assert max(growths) > 48 * MB, growths
    assert resident_memory()[1] - current > 48 * MB  # the peak keeps the block (the kernel counts in batches)


def test_without_proc_only_the_peak_is_known_from_getrusage(monkeypatch):
    class NoProc:
        def __init__(self, path: str) -> None:
            pass

        def read_text(self) -> str:
            raise FileNotFoundError("/proc/self/status")

    monkeypatch.setattr(metrics, "Path", NoProc)
    current, peak = resident_memory()
    kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    assert current is None and peak == (kib if sys.platform == "darwin" else kib * 1024)
    page = ServerMetrics().render().decode()
    assert "verispec_peak_resident_memory_bytes" in page and "process_resident_memory_bytes" not in page
