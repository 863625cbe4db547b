"""Keyed draws: the exponential race samples its law, the exact match probability, and keyed verification."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from tests.stats import FALSE_ALARM, chi_square_pvalue
from verispec.sampling import KeyedNoise, SamplingConfig, process_logits, race
from verispec.verify.keyed import keyed_verify, match_probability

LAW = torch.tensor([0.05, 0.4, 0.0, 0.25, 0.2, 0.1], dtype=torch.float64)  # a zero entry: never chosen


def race_counts(law: torch.Tensor, runs: int, noise_of) -> Counter:
    return Counter(race(law.log(), noise_of(seed)) for seed in range(runs))


def test_the_race_on_keyed_noise_draws_its_law():
    counts = race_counts(LAW, 20_000, lambda seed: KeyedNoise(seed, LAW.numel()).row(7))
    assert counts[2] == 0
    assert chi_square_pvalue(counts, dict(enumerate(LAW.tolist()))) > FALSE_ALARM


def test_the_race_test_catches_uniform_noise():
    # The check must be able to fail: racing on -log U = E (U uniform) instead of G = -log E is biased.
    def uniform_noise(seed: int) -> torch.Tensor:
        return -torch.rand(LAW.numel(), generator=torch.Generator().manual_seed(seed), dtype=torch.float64).log()

    counts = race_counts(LAW, 20_000, uniform_noise)
    assert chi_square_pvalue(counts, dict(enumerate(LAW.tolist()))) < FALSE_ALARM


def test_noise_is_a_function_of_seed_and_position_alone():
    a, b = KeyedNoise(3, 50), KeyedNoise(3, 50)
    assert torch.equal(a.row(10), b.row(10))  # another instance, the same row
    assert not torch.equal(a.row(10), a.row(11)) and not torch.equal(a.row(10), KeyedNoise(4, 50).row(10))
    assert torch.equal(a.rows(9, 3)[1], a.row(10))
    a.forget(before=11)
    assert sorted(a._rows) == [11]
    assert bool(torch.isfinite(a.row(12)).all())


def test_greedy_keyed_draw_is_the_argmax():
    logits = torch.tensor([0.5, 2.0, -1.0, 2.0, 1.0])  # ties: the lowest id
    assert KeyedNoise(0, 5).choose(logits, 0, SamplingConfig()) == 1


@pytest.mark.parametrize("sampling", [SamplingConfig(temperature=0.7), SamplingConfig(temperature=1.0),
                                      SamplingConfig(temperature=1.3, top_k=4),
                                      SamplingConfig(temperature=1.0, top_p=0.6)])
def test_a_keyed_draw_from_logits_is_the_race_on_their_law(sampling):
    # The draw reads log-weights (shifted logits over T where the law is temperature alone) and must choose what
    # the race on the law's own log chooses: the same token at every position, the law's zeros never.
    gen = torch.Generator().manual_seed(3)
    logits = torch.randn(40, generator=gen) * 3
    law = process_logits(logits.unsqueeze(0), sampling)[0]
    noise = KeyedNoise(21, 40)
    for position in range(300):
        token = noise.choose(logits, position, sampling)
        assert token == race(law.log(), noise.row(position)) and law[token] > 0


def brute_match(p: torch.Tensor, q: torch.Tensor) -> float:
    """Σ_v 1 / Σ_u max(p(u)/p(v), q(u)/q(v)) over the tokens both laws can choose: O(V²)."""
    total = 0.0
    for v in range(p.numel()):
        if p[v] > 0 and q[v] > 0:
            total += 1.0 / float(torch.maximum(p / p[v], q / q[v]).sum())
    return total


def random_law(vocab: int, gen: torch.Generator, zeros: int = 0) -> torch.Tensor:
    law = -torch.rand(vocab, generator=gen, dtype=torch.float64).log()
    law[torch.randperm(vocab, generator=gen)[:zeros]] = 0.0
    return law / law.sum()


@pytest.mark.parametrize("zeros", [0, 2])
def test_match_probability_equals_the_brute_sum_and_respects_its_bounds(zeros):
    gen = torch.Generator().manual_seed(5)
    for _ in range(20):
        p, q = random_law(8, gen, zeros), random_law(8, gen, zeros)
        exact = float(match_probability(p, q))
        assert exact == pytest.approx(brute_match(p, q), abs=1e-12)
        tv = 0.5 * float((p - q).abs().sum())
        assert (1 - tv) / (1 + tv) - 1e-12 <= exact <= 1 - tv + 1e-12
    # Ties in p/q (q proportional to p on a subset) and a batch of rows give the same numbers.
    p = torch.tensor([0.2, 0.2, 0.3, 0.3], dtype=torch.float64)
    q = torch.tensor([0.1, 0.1, 0.4, 0.4], dtype=torch.float64)
    assert float(match_probability(p, q)) == pytest.approx(brute_match(p, q), abs=1e-12)
    rows = match_probability(torch.stack([p, LAW[:4] / LAW[:4].sum()]), torch.stack([q, q]))
    assert float(rows[0]) == pytest.approx(brute_match(p, q), abs=1e-12)


def test_match_probability_special_cases():
    assert float(match_probability(LAW, LAW)) == pytest.approx(1.0, abs=1e-12)
    point = torch.zeros_like(LAW)
    point[3] = 1.0  # a fixed proposal (lookup) is kept with probability p(x), as token verification keeps it
    assert float(match_probability(LAW, point)) == pytest.approx(0.25, abs=1e-12)


def test_match_probability_agrees_with_races_on_keyed_noise():
    gen = torch.Generator().manual_seed(9)
    p, q = random_law(6, gen), random_law(6, gen)
    runs = 20_000
    matches = 0
    for seed in range(runs):
        row = KeyedNoise(seed, 6).row(0)
        matches += race(p.log(), row) == race(q.log(), row)
    exact = float(match_probability(p, q))
    # a binomial count within 5.3 standard deviations: false alarm below 1e-6
    assert abs(matches - runs * exact) <= 5.3 * (runs * exact * (1 - exact)) ** 0.5


def test_keyed_verify_keeps_the_matching_prefix_then_the_targets_choice():
    noise = KeyedNoise(11, LAW.numel())
    p = torch.stack([LAW, LAW.flip(0), LAW])  # γ = 2
    p = p.log()
    choices = [race(p[i], noise.row(20 + i)) for i in range(3)]
    rows = noise.rows(20, 3)
    kept = keyed_verify(torch.tensor(choices[:2]), p, rows)
    assert (kept.accepted, kept.token) == (2, choices[2])
    wrong = (choices[1] + 1) % LAW.numel()
    kept = keyed_verify(torch.tensor([choices[0], wrong]), p, rows)
    assert (kept.accepted, kept.token) == (1, choices[1])
    kept = keyed_verify(torch.empty(0, dtype=torch.long), p[:1], rows[:1])
    assert (kept.accepted, kept.token) == (0, choices[0])
