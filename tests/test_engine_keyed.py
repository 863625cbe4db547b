"""Keyed draws in the decode loop: every keyable method writes `ar`'s tokens for a seed, whatever the drafter and the
draft length, and the loop's output law is the target's."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.stats import FALSE_ALARM, chi_square_pvalue, target_law
from verispec.engine import DecodeConfig, Engine
from verispec.errors import ConfigError
from verispec.models.tabular import TabularLM
from verispec.sampling import SamplingConfig

PROMPT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef add(a, b):\n    return"
WARM = SamplingConfig(temperature=1.0)


def ids(tokenizer):
    return tokenizer(PROMPT)["input_ids"]


@pytest.mark.parametrize("drafter,role", [("model", "same"), ("model", "unrelated"), ("model", "partial"),
                                          ("ngram", "partial"), ("hybrid", "partial")])
def test_keyed_sd_writes_keyed_ar_tokens(tiny_pair, tokenizer, drafter, role):
    engine = Engine(tiny_pair["target"], tiny_pair[role])
    for seed in range(3):
        ar = DecodeConfig("ar", max_new_tokens=30, sampling=WARM, seed=seed, keyed_draws=True)
        expected = engine.decode(ids(tokenizer), ar).tokens
        for gamma, adaptive in [(1, False), (3, False), (6, False), (4, True)]:
            config = ar.with_settings(method="sd", gamma=gamma, drafter=drafter, adaptive_gamma=adaptive)
            out = engine.decode(ids(tokenizer), config)
            assert out.tokens == expected, (seed, gamma, adaptive)
            assert out.trace.target_calls <= len(expected)
        if role == "same" and drafter == "model":  # the draft's races are the target's: every token is kept
            assert out.trace.acceptance_rate == 1.0


def test_keyed_draws_hold_with_top_p_top_k_and_processors(tiny_pair, tokenizer):
    engine = Engine(tiny_pair["target"], tiny_pair["partial"])
    ar = DecodeConfig("ar", max_new_tokens=30, seed=4, keyed_draws=True, logit_bias={11: 3.0},
                      frequency_penalty=0.5, sampling=SamplingConfig(temperature=0.8, top_k=40, top_p=0.9))
    expected = engine.decode(ids(tokenizer), ar).tokens
    assert engine.decode(ids(tokenizer), ar.with_settings(method="sd", drafter="model")).tokens == expected
    assert engine.decode(ids(tokenizer), ar.with_settings(method="sd", gamma=6)).tokens == expected


def test_keyed_greedy_is_greedy(tiny_pair, tokenizer):
    engine = Engine(tiny_pair["target"], tiny_pair["partial"])
    plain = engine.decode(ids(tokenizer), DecodeConfig("ar", max_new_tokens=20)).tokens
    assert engine.decode(ids(tokenizer), DecodeConfig("sd", max_new_tokens=20, keyed_draws=True)).tokens == plain


def test_keyed_sd_output_law_is_the_targets():
    """Monte-Carlo through the real decode loop on tabular models: 10,000 seeds of 3 tokens, chi-square at 1e-6."""
    target, draft = TabularLM(3, seed=41), TabularLM(3, seed=42, sharpness=2.0)
    engine = Engine(target, draft)
    config = DecodeConfig("sd", gamma=2, max_new_tokens=3, sampling=WARM, drafter="model", keyed_draws=True)
    counts = Counter(tuple(engine.decode([0], config.with_settings(seed=s)).tokens) for s in range(10_000))
    assert chi_square_pvalue(counts, target_law(target, [0], 3)) > FALSE_ALARM


def test_keyed_draws_are_refused_where_a_method_draws_residuals():
    for method in ("bv", "gbv", "sprinter", "typical"):
        with pytest.raises(ConfigError, match="keyed_draws is taken by ar, draft, sd, sprinter-exact"):
            DecodeConfig(method, keyed_draws=True)
    with pytest.raises(ConfigError, match="true or false"):
        DecodeConfig(keyed_draws=1)
