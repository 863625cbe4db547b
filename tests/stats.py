"""Statistical helpers for distribution tests: exact laws and a chi-square goodness-of-fit test."""

from __future__ import annotations

from collections import Counter
from itertools import product

import torch

# Every Monte-Carlo law test rejects a correct sampler with probability at most this (its false-alarm rate).
FALSE_ALARM = 1e-6


def chi_square_pvalue(counts: Counter, probs: dict, min_expected: float = 5.0) -> float:
    """Return the chi-square goodness-of-fit p-value of `counts` against the exact law `probs`.

    Cells with expected count below `min_expected` are pooled into one, so the chi-square approximation holds.
    A sample outside the support of `probs` returns 0.
    """
    n = sum(counts.values())
    if any(k not in probs or probs[k] == 0 for k in counts):
        return 0.0
    stat, df = 0.0, -1
    pooled_obs, pooled_exp = 0.0, 0.0
    for key, prob in probs.items():
        expected, observed = n * prob, counts.get(key, 0)
        if expected < min_expected:
            pooled_obs, pooled_exp = pooled_obs + observed, pooled_exp + expected
            continue
        stat += (observed - expected) ** 2 / expected
        df += 1
    if pooled_exp > 0:
        stat += (pooled_obs - pooled_exp) ** 2 / pooled_exp
        df += 1
    df = max(df, 1)
    return float(torch.special.gammaincc(torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2)))


def target_law(model, context: list[int], n: int) -> dict[tuple[int, ...], float]:
    """Return the exact law of the first `n` tokens sampled from a tabular `model` after `context`."""
    return {seq: model.sequence_prob(context, seq) for seq in product(range(model.vocab_size), repeat=n)}


def max_abs_diff(a: dict, b: dict) -> float:
    """Return the largest absolute difference between two laws over the union of their supports."""
    return max(abs(a.get(k, 0.0) - b.get(k, 0.0)) for k in set(a) | set(b))


def decode_counts(engine, config, runs: int, prompt: tuple[int, ...] = (0,)) -> Counter:
    """Return how often each output the decode loop wrote over `runs` decodes of `config` with seeds 0..runs-1."""
    return Counter(tuple(engine.decode(list(prompt), config.with_settings(seed=s)).tokens) for s in range(runs))
