"""A bench results dict around hand-built records, as `runner.run_bench` writes it, for report and model tests."""

from __future__ import annotations

from typing import Any

from verispec.bench.metrics import summarize
from verispec.bench.runner import BenchConfig

MACHINE = {"platform": "TestOS", "processor": "x86_64", "cpu_threads": 2, "torch": "2", "transformers": "5"}


def results_dict(config: BenchConfig, records: list[dict[str, Any]], resamples: int) -> dict[str, Any]:
    """Return the results of `records` run under `config`, aggregated against `ar` with `resamples` resamples."""
    return {
        "schema": "verispec.bench/1", "config": config.to_dict(), "started": "2026-01-01T00:00:00",
        "machine": dict(MACHINE), "git_commit": "0123456789abcdef", "git_dirty": False,
        "aggregate": summarize(records, config.methods, "ar", config.gamma, resamples, 0), "records": records,
    }
