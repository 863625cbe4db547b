"""The decode loop's per-round hook: it sees every committed token once, in order, and can end the decode."""

from __future__ import annotations

import pytest

from verispec.engine import DecodeConfig, Engine
from verispec.sampling import SamplingConfig

PROMPT = "def add(a, b):\n    return"


@pytest.mark.parametrize("method, temperature", [("sd", 0.0), ("sd", 1.0), ("gbv", 1.0), ("ar", 0.0)])
def test_rounds_seen_by_the_hook_concatenate_to_the_output(tiny_pair, tokenizer, method, temperature):
    engine = Engine(tiny_pair["target"], tiny_pair["partial"], eos_token_ids=[tokenizer.eos_token_id])
    config = DecodeConfig(method, gamma=3, max_new_tokens=30, paths=2 if method == "gbv" else 1, seed=5,
                          sampling=SamplingConfig(temperature=temperature))
    prompt = tokenizer(PROMPT)["input_ids"]
    rounds: list[list[int]] = []
    out = engine.decode(prompt, config, on_commit=lambda tokens: rounds.append(tokens))
    assert [t for r in rounds for t in r] == out.tokens
    assert [len(r) for r in rounds] == [r.emitted for r in out.trace.rounds]
    assert engine.decode(prompt, config).tokens == out.tokens  # watching changes nothing


def test_a_true_return_ends_the_decode_at_that_round(tiny_pair, tokenizer):
    engine = Engine(tiny_pair["target"], tiny_pair["partial"])
    config = DecodeConfig("sd", gamma=4, max_new_tokens=40)
    prompt = tokenizer(PROMPT)["input_ids"]
    full = engine.decode(prompt, config)
    seen: list[list[int]] = []
    out = engine.decode(prompt, config, on_commit=lambda tokens: seen.append(tokens) or len(seen) == 2)
    assert len(seen) == 2 and len(out.trace.rounds) == 2
    assert out.tokens == seen[0] + seen[1] == full.tokens[: len(out.tokens)]
    assert len(out.tokens) < len(full.tokens)
