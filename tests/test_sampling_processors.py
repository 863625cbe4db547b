"""Logit processors (logit_bias, presence and frequency penalties): the offsets against OpenAI's formula, how they
enter `process_logits`, and their validation."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from verispec.config import DecodeConfig
from verispec.engine import Engine
from verispec.errors import ConfigError
from verispec.models.tabular import TabularLM
from verispec.processors import LogitProcessors, tree_prefixes
from verispec.sampling import SamplingConfig, first_argmax, process_logits

V = 7
BIAS = {2: 1.5, 5: -100.0}
PRESENCE, FREQUENCY = 0.4, 0.3


def formula(logits: torch.Tensor, bias: dict, presence: float, frequency: float, generated: list[int]) -> torch.Tensor:
    """OpenAI's formula, written out on a dense row: logit[t] + bias[t] − presence·1[c[t] > 0] − frequency·c[t]."""
    out = logits.to(torch.float64).clone()
    for token, amount in bias.items():
        out[token] += amount
    for token, count in Counter(generated).items():
        out[token] -= presence * (count > 0) + frequency * count
    return out


def rows(n: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(n, V, generator=torch.Generator().manual_seed(seed))


def test_offsets_follow_the_formula_with_each_rows_drafted_prefix():
    logits = rows(3)
    generated = [1, 1, 2]
    prefixes = [[], [4], [4, 1]]  # the round's first position, then after one and two drafted tokens
    adjusted = LogitProcessors(BIAS, PRESENCE, FREQUENCY).at(Counter(generated)).rows(prefixes).apply(logits)
    assert adjusted.dtype == torch.float64
    for r, prefix in enumerate(prefixes):
        expected = formula(logits[r], BIAS, PRESENCE, FREQUENCY, generated + prefix)
        torch.testing.assert_close(adjusted[r], expected, rtol=0, atol=1e-12)
    assert torch.equal(logits, rows(3))  # the logits themselves are left as they were


def test_a_drafted_row_is_bit_for_bit_the_autoregressive_row_at_the_same_context():
    # Speculation reaches a context as counts + drafted prefix; autoregressive decoding has it all in its counts.
    processors = LogitProcessors(BIAS, PRESENCE, FREQUENCY)
    logits = rows(1, seed=3)
    drafted = processors.at(Counter([1, 2])).rows([[4, 1, 4]]).apply(logits)
    plain = processors.at(Counter([1, 2, 4, 1, 4])).rows([[]]).apply(logits)
    assert torch.equal(drafted, plain)


def test_bias_alone_is_the_same_in_every_row_and_keeps_minus_infinity():
    logits = rows(2)
    logits[1, 3] = -math.inf
    adjusted = LogitProcessors({3: 50.0, 6: -2.0}, 0.0, 0.0).at(Counter([6, 6])).rows([[], [6, 6]]).apply(logits)
    for r in range(2):
        torch.testing.assert_close(adjusted[r], formula(logits[r], {3: 50.0, 6: -2.0}, 0.0, 0.0, []), rtol=0, atol=0)
    assert adjusted[1, 3] == -math.inf


@pytest.mark.parametrize("sampling", [SamplingConfig(0.0), SamplingConfig(1.0), SamplingConfig(0.7, top_k=4),
                                      SamplingConfig(1.3, top_p=0.8)])
def test_process_logits_applies_the_offsets_before_temperature_top_k_and_top_p(sampling):
    logits = rows(3, seed=5)
    generated, prefixes = [0, 2, 2], [[], [3], [3, 0]]
    offsets = LogitProcessors(BIAS, PRESENCE, FREQUENCY).at(Counter(generated)).rows(prefixes)
    expected = torch.stack([formula(logits[r], BIAS, PRESENCE, FREQUENCY, generated + prefixes[r]) for r in range(3)])
    torch.testing.assert_close(process_logits(logits, sampling, offsets=offsets),
                               process_logits(expected, sampling), rtol=0, atol=1e-15)
    out = torch.empty(3, V, dtype=torch.float64)
    assert process_logits(logits, sampling, out, offsets) is out
    torch.testing.assert_close(out, process_logits(expected, sampling), rtol=0, atol=1e-15)


def test_greedy_follows_the_bias():
    logits = rows(1, seed=2)
    best = int(logits.argmax())
    banned = LogitProcessors({best: -100.0}, 0.0, 0.0).at({}).rows([[]])
    assert int(process_logits(logits, SamplingConfig(), offsets=banned).argmax()) != best
    forced = LogitProcessors({(best + 1) % V: 100.0}, 0.0, 0.0).at({}).rows([[]])
    assert int(process_logits(logits, SamplingConfig(), offsets=forced).argmax()) == (best + 1) % V


def test_the_greedy_argmax_reads_only_the_offset_columns_and_agrees_with_the_full_row():
    """`RowOffsets.argmax` (the offset columns against the best untouched one) against `first_argmax` of the whole
    adjusted row, on rows with ties, −inf entries, a banned argmax and offsets that create ties."""
    gen = torch.Generator().manual_seed(9)
    for trial in range(200):
        logits = torch.randint(-3, 4, (4, V), generator=gen).to(torch.float32)  # small integers: many ties
        logits[0, 1:3] = -math.inf
        counts = Counter(torch.randint(0, V, (trial % 5,), generator=gen).tolist())
        bias = {int(logits[1].argmax()): -100.0, 3: float(trial % 3)}  # ban row 1's argmax; integer biases tie
        offsets = LogitProcessors(bias, 1.0, float(trial % 2)).at(counts).rows([[], [0], [0, 0], [5, 6, 0]])
        assert torch.equal(offsets.argmax(logits), first_argmax(offsets.apply(logits))), trial
    assert LogitProcessors({}, 0.0, 0.0).at({}).rows([[]]).argmax(logits[:1]).tolist() == [[int(logits[0].argmax())]]


def test_tree_prefixes_follow_the_parents():
    # nodes: 0 and 1 children of the root, 2 under 0, 3 under 2
    assert tree_prefixes([5, 6, 7, 8], [-1, -1, 0, 2]) == [[], [5], [6], [5, 7], [5, 7, 8]]


def test_no_processor_set_builds_nothing():
    assert LogitProcessors.of(DecodeConfig()) is None
    assert DecodeConfig(logit_bias={}).logit_bias is None
    assert LogitProcessors.of(DecodeConfig(logit_bias={}, presence_penalty=0, frequency_penalty=0.0)) is None
    assert LogitProcessors.of(DecodeConfig(frequency_penalty=0.5)) == LogitProcessors({}, 0.0, 0.5)


def test_settings_are_normalised_and_taken_by_name():
    config = DecodeConfig(logit_bias={"7": 5, 3: -1.5})  # JSON object keys are strings
    assert config.logit_bias == {3: -1.5, 7: 5.0}
    changed = config.with_settings(presence_penalty=-2, frequency_penalty=2.0, logprobs=20)
    assert (changed.presence_penalty, changed.frequency_penalty, changed.logprobs) == (-2, 2.0, 20)
    assert DecodeConfig(logprobs=0).logprobs == 0


@pytest.mark.parametrize(("settings", "message"), [
    ({"logit_bias": {1: 100.5}}, r"^logit_bias: the bias of token 1 must be a number in \[-100, 100\]"),
    ({"logit_bias": {1: float("nan")}}, r"^logit_bias: .* in \[-100, 100\]"),
    ({"logit_bias": {1: True}}, r"^logit_bias: .* in \[-100, 100\]"),
    ({"logit_bias": {-1: 0.0}}, r"^logit_bias: token ids must be integers >= 0"),
    ({"logit_bias": {"a": 0.0}}, r"^logit_bias: token ids must be integers >= 0"),
    ({"logit_bias": {"1": 1.0, 1: 2.0}}, r"^logit_bias: token 1 is given twice"),
    ({"logit_bias": [1, 2]}, r"^logit_bias must map token ids to biases in \[-100, 100\]"),
    ({"presence_penalty": 2.5}, r"^presence_penalty must be a number in \[-2, 2\]"),
    ({"presence_penalty": None}, r"^presence_penalty must be a number in \[-2, 2\]"),
    ({"frequency_penalty": -2.01}, r"^frequency_penalty must be a number in \[-2, 2\]"),
    ({"frequency_penalty": float("inf")}, r"^frequency_penalty must be a number in \[-2, 2\]"),
    ({"logprobs": 21}, r"^logprobs .* must be an integer in \[0, 20\]"),
    ({"logprobs": -1}, r"^logprobs .* must be an integer in \[0, 20\]"),
    ({"logprobs": True}, r"^logprobs .* must be an integer in \[0, 20\]"),
    ({"logprobs": 2.0}, r"^logprobs .* must be an integer in \[0, 20\]"),
])
def test_bad_settings_are_config_errors_naming_the_field_and_range(settings, message):
    # The message starts with the field's name: the server maps it to the request field it is about.
    with pytest.raises(ConfigError, match=message):
        DecodeConfig(**settings)
    with pytest.raises(ConfigError, match=message):
        DecodeConfig().with_settings(**settings)


def test_a_bias_outside_the_vocabulary_is_refused_before_decoding():
    engine = Engine(TabularLM(5, seed=1), TabularLM(5, seed=2))
    with pytest.raises(ConfigError, match=r"^logit_bias: token id 5 is outside the vocabulary \(5 tokens\)"):
        engine.decode([0], DecodeConfig("sd", logit_bias={5: 1.0}, drafter="model"))
    assert engine.decode([0], DecodeConfig("sd", logit_bias={4: 1.0}, drafter="model", max_new_tokens=3)).tokens
