"""The statistics every measurement shares: the default baseline, the paired speedup, and the percentile bootstrap.

* The baseline of a set of methods is the one named, else `ar` when it ran, else the first method.
* The speedup of a method over the baseline is (baseline seconds per token) / (method seconds per token), each a
  ratio of totals over the prompts both decoded (token-weighted, not a mean of per-prompt ratios).
* Its 95% interval, and that of any ratio of totals Σ numerator / Σ denominator over prompts, is a percentile
  bootstrap: prompts are resampled with replacement (a prompt's paired values stay together), the statistic is
  recomputed per resample, and its 2.5% / 97.5% quantiles are reported. The resampling uses
  `numpy.random.default_rng(seed)`, so intervals are reproducible.

This module imports nothing from verispec: the bench, the cost model and the profiler all build on it.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

Interval = tuple[float, float]


def default_baseline(methods: Sequence[str], baseline: str | None = None) -> str:
    """Return `baseline`, or by default `ar` when it is among `methods`, else the first method."""
    return baseline or ("ar" if "ar" in methods else methods[0])


def speedup_of_totals(base: Sequence[tuple[float, float]], mine: Sequence[tuple[float, float]]) -> float | None:
    """Return (Σ base seconds / Σ base tokens) / (Σ my seconds / Σ my tokens) from paired per-prompt (seconds,
    tokens); None when any total is zero."""
    b_sec, b_tok = sum(p[0] for p in base), sum(p[1] for p in base)
    m_sec, m_tok = sum(p[0] for p in mine), sum(p[1] for p in mine)
    return (b_sec / b_tok) / (m_sec / m_tok) if b_tok and m_tok and b_sec and m_sec else None


def paired_speedup(
    base: Sequence[tuple[float, float]], mine: Sequence[tuple[float, float]], resamples: int, seed: int
) -> tuple[float | None, Interval | None]:
    """Return (speedup of totals, its 95% bootstrap interval) from paired per-prompt (seconds, tokens)."""
    return speedup_of_totals(base, mine), bootstrap_speedup(base, mine, resamples, seed)


def bootstrap_speedup(
    base: Sequence[tuple[float, float]], mine: Sequence[tuple[float, float]], resamples: int, seed: int
) -> Interval | None:
    """Return the 95% percentile-bootstrap interval of the speedup from paired per-prompt (seconds, tokens).

    None with fewer than two prompts (no spread to resample) or without tokens.
    """
    if len(base) != len(mine) or len(base) < 2 or resamples < 1:
        return None
    sums = _resampled_sums(np.concatenate([np.asarray(base, float), np.asarray(mine, float)], axis=1), resamples,
                           seed)  # [B, 4]: base seconds, base tokens, method seconds, method tokens
    valid = (sums[:, 1] > 0) & (sums[:, 2] > 0)
    return _interval((sums[valid, 0] / sums[valid, 1]) / (sums[valid, 2] / sums[valid, 3]))


def bootstrap_ratio(pairs: Sequence[tuple[float, float]], resamples: int, seed: int) -> Interval | None:
    """Return the 95% percentile-bootstrap interval of Σ numerator / Σ denominator over per-prompt (numerator,
    denominator) pairs, e.g. (seconds, tokens) for seconds per token, or (value, 1) for the mean of the values;
    None with fewer than two prompts."""
    if len(pairs) < 2 or resamples < 1:
        return None
    sums = _resampled_sums(np.asarray(pairs, dtype=float), resamples, seed)  # [B, 2]
    valid = sums[:, 1] > 0
    return _interval(sums[valid, 0] / sums[valid, 1])


def _resampled_sums(per_prompt: np.ndarray, resamples: int, seed: int) -> np.ndarray:
    """Column sums of `per_prompt` [n, k] over `resamples` resamples of its rows with replacement: [B, k]."""
    idx = np.random.default_rng(seed).integers(0, len(per_prompt), size=(resamples, len(per_prompt)))  # [B, n]
    return per_prompt[idx].sum(axis=1)


def _interval(statistic: np.ndarray) -> Interval | None:
    """The 2.5% and 97.5% quantiles of a resampled statistic (None when no resample was valid)."""
    if statistic.size == 0:
        return None
    lo, hi = np.quantile(statistic, [0.025, 0.975])
    return float(lo), float(hi)
