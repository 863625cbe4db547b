"""The decode loop: greedy equivalence, the full loop's output law, determinism, EOS and length handling."""

from __future__ import annotations

from collections import Counter

import pytest

from tests.stats import FALSE_ALARM, chi_square_pvalue, target_law
from verispec.engine import DecodeConfig, Engine
from verispec.errors import ConfigError
from verispec.models.tabular import TabularLM
from verispec.sampling import SamplingConfig

PROMPT = "def add(a, b):\n    return"


def ids(tokenizer, text=PROMPT):
    return tokenizer(text)["input_ids"]


def ar_tokens(tiny_pair, tokenizer, n=40, eos=()):
    return Engine(tiny_pair["target"], eos_token_ids=eos).decode(ids(tokenizer), DecodeConfig("ar", max_new_tokens=n))


@pytest.mark.parametrize("drafter", ["same", "unrelated", "partial"])
@pytest.mark.parametrize("gamma", [1, 3, 6])
def test_greedy_sd_equals_ar(tiny_pair, tokenizer, drafter, gamma):
    expected = ar_tokens(tiny_pair, tokenizer).tokens
    engine = Engine(tiny_pair["target"], tiny_pair[drafter])
    out = engine.decode(ids(tokenizer), DecodeConfig("sd", gamma=gamma, max_new_tokens=40))
    assert out.tokens == expected


def test_acceptance_reflects_how_much_the_drafter_agrees(tiny_pair, tokenizer):
    rates = {}
    for drafter in ("same", "unrelated", "partial"):
        config = DecodeConfig("sd", gamma=4, drafter="model")
        out = Engine(tiny_pair["target"], tiny_pair[drafter]).decode(ids(tokenizer), config)
        rates[drafter] = out.trace.acceptance_rate
    assert rates["same"] == 1.0
    assert rates["unrelated"] < 0.2
    assert 0.2 < rates["partial"] < 0.95


def test_sd_trace_counts_are_consistent(tiny_pair, tokenizer):
    out = Engine(tiny_pair["target"], tiny_pair["partial"]).decode(ids(tokenizer), DecodeConfig("sd", gamma=3))
    trace = out.trace
    assert trace.generated == len(out.tokens) == 128
    assert trace.target_calls == len(trace.rounds)
    # Round 1 feeds the prompt and its block; every later round feeds the previous round's extra token and its block.
    assert trace.target_tokens == len(ids(tokenizer)) + sum(r.drafted for r in trace.rounds) + len(trace.rounds) - 1
    assert all(r.emitted == r.accepted + 1 for r in trace.rounds[:-1])
    assert trace.time_total >= trace.time_draft + trace.time_target + trace.time_verify


@pytest.mark.parametrize("method", ["sd", "ar"])
def test_seeded_sampling_is_deterministic(tiny_pair, tokenizer, method):
    engine = Engine(tiny_pair["target"], tiny_pair["partial"])
    config = lambda seed: DecodeConfig(  # noqa: E731
        method, gamma=3, max_new_tokens=30, seed=seed, sampling=SamplingConfig(temperature=1.0)
    )
    first = engine.decode(ids(tokenizer), config(7)).tokens
    assert engine.decode(ids(tokenizer), config(7)).tokens == first
    assert engine.decode(ids(tokenizer), config(8)).tokens != first


@pytest.mark.parametrize("n", [1, 2, 5, 7, 13])
@pytest.mark.parametrize("drafter", ["same", "unrelated"])
def test_stops_exactly_at_max_new_tokens(tiny_pair, tokenizer, n, drafter):
    out = Engine(tiny_pair["target"], tiny_pair[drafter]).decode(ids(tokenizer), DecodeConfig("sd", 4, n))
    assert len(out.tokens) == n
    assert out.tokens == ar_tokens(tiny_pair, tokenizer, n).tokens


def test_eos_inside_an_accepted_block_ends_the_output(tiny_pair, tokenizer):
    reference = ar_tokens(tiny_pair, tokenizer, 40).tokens
    # With the same-weights drafter every block of γ=4 is accepted whole, so rounds emit tokens 0-4, 5-9, ...
    # Choose as EOS a token whose first occurrence is strictly inside a block.
    position = next(i for i, t in enumerate(reference) if i % 5 in (1, 2, 3) and t not in reference[:i])
    eos = reference[position]
    engine = Engine(tiny_pair["target"], tiny_pair["same"], eos_token_ids=[eos])
    out = engine.decode(ids(tokenizer), DecodeConfig("sd", gamma=4, max_new_tokens=40))
    assert out.tokens == reference[: position + 1]
    assert out.stopped_at_eos
    assert ar_tokens(tiny_pair, tokenizer, 40, eos=[eos]).tokens == out.tokens


def test_full_loop_output_law_matches_the_target():
    """Monte-Carlo through the real decode loop on tabular models: 10,000 runs of 3 tokens, chi-square at 1e-6."""
    target, draft = TabularLM(3, seed=31), TabularLM(3, seed=32, sharpness=2.0)
    engine = Engine(target, draft)
    sampling = SamplingConfig(temperature=1.0)
    counts = Counter(
        tuple(engine.decode([0], DecodeConfig("sd", gamma=2, max_new_tokens=3, sampling=sampling, seed=s)).tokens)
        for s in range(10_000)
    )
    assert chi_square_pvalue(counts, target_law(target, [0], 3)) > FALSE_ALARM


def test_draft_method_decodes_with_the_draft_alone(tiny_pair, tokenizer):
    engine = Engine(tiny_pair["target"], tiny_pair["unrelated"])
    out = engine.decode(ids(tokenizer), DecodeConfig("draft", max_new_tokens=20))
    alone = Engine(tiny_pair["unrelated"]).decode(ids(tokenizer), DecodeConfig("ar", max_new_tokens=20))
    assert out.tokens == alone.tokens
    assert out.trace.target_calls == 0 and out.trace.draft_calls == 20


def test_engine_rejects_bad_input(tiny_pair, tokenizer):
    engine = Engine(tiny_pair["target"], None)
    with pytest.raises(ConfigError, match="empty"):
        engine.decode([], DecodeConfig("ar"))
    with pytest.raises(ConfigError, match="needs a draft model"):
        engine.decode(ids(tokenizer), DecodeConfig("sd"))
