"""The shared statistics: the default baseline, the speedup of totals, and the seeded percentile bootstrap."""

from __future__ import annotations

import pytest

from verispec.stats import bootstrap_ratio, bootstrap_speedup, default_baseline, paired_speedup, speedup_of_totals


def test_the_default_baseline_is_ar_when_it_ran_else_the_first_method():
    assert default_baseline(["sd", "ar", "bv"]) == "ar"
    assert default_baseline(["sd", "bv"]) == "sd"
    assert default_baseline(["sd", "ar"], "bv") == "bv"


def test_the_speedup_is_a_ratio_of_totals_not_a_mean_of_ratios():
    base = [(1.0, 10), (3.0, 10)]  # 0.2 s/token over both prompts
    mine = [(1.0, 10), (1.0, 30)]  # 0.05 s/token: per-prompt speedups 1 and 9 would average 5
    assert speedup_of_totals(base, mine) == pytest.approx(4.0)
    assert speedup_of_totals(base, [(0.0, 10), (0.0, 10)]) is None
    point, interval = paired_speedup(base, mine, resamples=0, seed=0)
    assert point == pytest.approx(4.0) and interval is None


def test_bootstrap_interval_is_seeded_and_brackets_the_spread():
    base = [(1.0, 10)] * 6
    mine = [(0.5, 10), (0.25, 10), (1.0, 10), (0.5, 10), (0.4, 10), (0.8, 10)]  # per-prompt speedups 4 ... 1
    lo, hi = bootstrap_speedup(base, mine, resamples=4000, seed=3)
    point = 6.0 / sum(s for s, _ in mine)
    assert 1.0 < lo < point < hi < 4.0
    assert bootstrap_speedup(base, mine, 4000, 3) == (lo, hi)
    assert bootstrap_speedup(base, mine, 4000, 4) != (lo, hi)
    assert bootstrap_speedup(base[:1], mine[:1], 4000, 3) is None


def test_bootstrap_ratio_is_seeded_and_needs_two_prompts():
    pairs = [(1.0, 10), (3.0, 10), (2.0, 10)]
    lo, hi = bootstrap_ratio(pairs, 2000, 0)
    assert 0.1 <= lo < 0.2 < hi <= 0.3 and bootstrap_ratio(pairs, 2000, 0) == (lo, hi)
    assert bootstrap_ratio(pairs[:1], 2000, 0) is None


def test_bootstrap_ratio_with_unit_denominators_is_the_interval_of_the_mean():
    assert bootstrap_ratio([(1.0, 1.0)], 100, 0) is None
    assert bootstrap_ratio([(2.0, 1.0)] * 3, 100, 0) == (2.0, 2.0)
    lo, hi = bootstrap_ratio([(1.0, 1.0), (2.0, 1.0), (3.0, 1.0), (10.0, 1.0)], 500, 0)
    assert 1.0 <= lo < 4.0 < hi <= 10.0
    assert bootstrap_ratio([(1.0, 1.0), (2.0, 1.0), (3.0, 1.0), (10.0, 1.0)], 500, 0) == (lo, hi)  # seeded
