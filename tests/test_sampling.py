"""Logits processing: temperature, top-k, top-p, greedy; invalid settings are clear errors."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from tests.stats import chi_square_pvalue
from verispec.errors import ConfigError
from verispec.sampling import SamplingConfig, draw, first_argmax, process_logits, sample, softmax_rows

LOGITS = torch.tensor([[2.0, 1.0, 0.0, -1.0, 3.0]])


def test_greedy_is_a_point_mass_on_the_argmax():
    probs = process_logits(LOGITS, SamplingConfig(temperature=0.0))
    assert probs.tolist() == [[0.0, 0.0, 0.0, 0.0, 1.0]]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float64])
def test_greedy_is_a_float64_point_mass_whatever_the_logits_dtype(dtype):
    logits = torch.randn(3, 1000, generator=torch.Generator().manual_seed(1)).to(dtype)
    probs = process_logits(logits, SamplingConfig())
    assert probs.dtype == torch.float64 and probs.shape == (3, 1000)
    expected = torch.zeros(3, 1000, dtype=torch.float64).scatter_(-1, logits.double().argmax(-1, keepdim=True), 1.0)
    assert torch.equal(probs, expected)


@pytest.mark.parametrize("shape", [(7,), (3, 7), (2, 3, 7)])
def test_first_argmax_is_torchs_argmax_with_ties_to_the_lowest_index(shape):
    rows = torch.randint(0, 3, shape, generator=torch.Generator().manual_seed(2)).float()  # many ties
    for x in (rows, rows.double(), rows.bfloat16()):
        assert torch.equal(first_argmax(x), x.argmax(dim=-1, keepdim=True))


def test_draw_takes_a_point_mass_token_without_a_random_draw_and_samples_otherwise():
    q = torch.zeros(9, dtype=torch.float64)
    q[6] = 1.0
    gen = torch.Generator().manual_seed(0)
    state = gen.get_state()
    assert draw(q, SamplingConfig(), gen) == 6 and torch.equal(gen.get_state(), state)
    probs = torch.softmax(torch.randn(9, generator=gen, dtype=torch.float64), dim=0)
    expected = sample(probs, torch.Generator().manual_seed(5))
    assert draw(probs, SamplingConfig(temperature=1.0), torch.Generator().manual_seed(5)) == expected


def test_greedy_ties_go_to_the_lowest_token_id():
    probs = process_logits(torch.tensor([[1.0, 5.0, 5.0]]), SamplingConfig())
    assert probs.tolist() == [[0.0, 1.0, 0.0]]


def test_temperature_scales_logits():
    probs = process_logits(LOGITS, SamplingConfig(temperature=2.0))
    torch.testing.assert_close(probs, torch.softmax(LOGITS.double() / 2.0, dim=-1))


def test_top_k_keeps_the_k_largest():
    probs = process_logits(LOGITS, SamplingConfig(temperature=1.0, top_k=2))[0]
    assert (probs > 0).tolist() == [True, False, False, False, True]
    torch.testing.assert_close(probs.sum(), torch.tensor(1.0, dtype=torch.float64))


def test_top_p_keeps_the_token_that_crosses_the_threshold():
    base = torch.softmax(LOGITS.double(), dim=-1)[0]  # sorted: token 4 (0.64), 0 (0.24), 1 (0.09), ...
    probs = process_logits(LOGITS, SamplingConfig(temperature=1.0, top_p=0.7))[0]
    assert (probs > 0).tolist() == [True, False, False, False, True]
    torch.testing.assert_close(probs[[0, 4]], base[[0, 4]] / base[[0, 4]].sum())
    assert (process_logits(LOGITS, SamplingConfig(temperature=1.0, top_p=0.5))[0] > 0).sum() == 1


def test_sampling_is_reproducible_with_a_generator():
    probs = process_logits(LOGITS, SamplingConfig(temperature=1.0))[0]
    draws = lambda seed: [sample(probs, g) for g in [torch.Generator().manual_seed(seed)] for _ in range(50)]  # noqa: E731
    assert draws(3) == draws(3)


@pytest.mark.parametrize(
    "kwargs, field",
    [
        ({"temperature": -1.0}, "temperature"),
        ({"temperature": float("inf")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.01}, "top_p"),
        ({"top_k": -3}, "top_k"),
        ({"top_k": 2.5}, "top_k"),
    ],
)
def test_invalid_settings_raise(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        SamplingConfig(**kwargs)


@pytest.mark.parametrize("temperature", [1e-320, 5e-324, 1e-300, 1e-30])
def test_tiny_temperatures_give_the_greedy_limit_never_nan(temperature):
    big = torch.tensor([[30.0, -20.0, 10.0, 29.5, 0.0]])  # logits/1e-320 overflow: inf - inf would be NaN
    probs = process_logits(big, SamplingConfig(temperature=temperature))
    assert torch.isfinite(probs).all()
    assert probs.tolist() == [[1.0, 0.0, 0.0, 0.0, 0.0]]
    tied = process_logits(torch.tensor([[1.0, 4.0, 4.0]]), SamplingConfig(temperature=temperature))
    assert tied.tolist() == [[0.0, 0.5, 0.5]]  # the limit of the tempered law: the tied maxima share the mass
    gen = torch.Generator().manual_seed(0)
    assert sample(probs[0], gen) == 0


def test_sample_follows_its_law_and_never_draws_a_zero_weight() -> None:
    # Unnormalised weights with zeros at both ends and inside; 20,000 draws against the exact law, chi-square at a
    # 1e-6 false-alarm rate: a sampler off by one index or ignoring the normalisation fails.
    weights = torch.tensor([0.0, 3.0, 0.0, 1.0, 0.5, 0.0, 2.5, 0.0], dtype=torch.float64)
    gen = torch.Generator().manual_seed(11)
    counts = Counter(sample(weights, gen) for _ in range(20_000))
    assert set(counts) <= {1, 3, 4, 6}
    law = {i: float(w / weights.sum()) for i, w in enumerate(weights) if w > 0}
    assert chi_square_pvalue(counts, law) > 1e-6
    assert sample(torch.tensor([0.0, 0.0, 1.0]), gen) == 2  # a point mass, float32 too


@pytest.mark.parametrize("weights", [[0.0, 0.0], [1.0, -0.5], [1.0, float("nan")], [float("inf"), 1.0]])
def test_sample_refuses_weights_that_are_no_distribution(weights: list[float]) -> None:
    with pytest.raises(ValueError, match="cannot sample"):
        sample(torch.tensor(weights, dtype=torch.float64), torch.Generator().manual_seed(0))


@pytest.mark.parametrize("rows", [1, 3])
def test_softmax_rows_is_the_softmax_and_leaves_its_input_alone(rows):
    logits = 8 * torch.randn(rows, 5000, generator=torch.Generator().manual_seed(2), dtype=torch.float64)
    logits[:, :10] = -torch.inf  # masked tokens (top-k) get 0
    before = logits.clone()
    probs = softmax_rows(logits)
    assert torch.equal(logits, before)
    assert torch.allclose(probs, torch.softmax(before, -1), rtol=1e-13, atol=1e-300)
    assert (probs[:, :10] == 0).all() and torch.allclose(probs.sum(-1), torch.ones(rows, dtype=torch.float64))


@pytest.mark.parametrize("config", [
    SamplingConfig(), SamplingConfig(temperature=1.0), SamplingConfig(temperature=0.7, top_k=50),
    SamplingConfig(temperature=1.0, top_p=0.9)], ids=["greedy", "T=1", "top-k", "top-p"])
@pytest.mark.parametrize("rows", [1, 4])
def test_process_logits_into_a_buffer_writes_the_same_bits(config, rows):
    logits = 4 * torch.randn(rows, 3000, generator=torch.Generator().manual_seed(5))
    buffer = torch.full((rows + 2, 3000), torch.nan, dtype=torch.float64)
    out = buffer[1 : rows + 1]
    result = process_logits(logits, config, out)
    assert result.data_ptr() == out.data_ptr() and torch.equal(result, process_logits(logits, config))
    assert buffer[0].isnan().all() and buffer[-1].isnan().all()  # nothing written outside `out`
