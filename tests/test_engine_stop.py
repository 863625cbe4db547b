"""The decode loop's stop hook: asked after every round, it ends the decode with that round's tokens kept."""

from __future__ import annotations

from verispec.engine import DecodeConfig, Engine
from verispec.models.tabular import TabularLM
from verispec.sampling import SamplingConfig


def test_stop_hook_ends_the_decode_after_the_round_that_completes_it():
    engine = Engine(TabularLM(6, seed=61), TabularLM(6, seed=62, sharpness=1.5))
    config = DecodeConfig("sd", gamma=3, max_new_tokens=40, sampling=SamplingConfig(temperature=1.0), seed=1)
    seen, tokens = [], []

    def stop(committed: list[int]) -> bool:  # the on_commit hook sees each round's tokens: stop at 5 in all
        tokens.extend(committed)
        seen.append(len(tokens))
        return len(tokens) >= 5

    full = engine.decode([0], config)
    out = engine.decode([0], config, stop)
    assert 5 <= len(out.tokens) <= 5 + 3 and seen[-1] == len(out.tokens)
    assert out.tokens == full.tokens[: len(out.tokens)]  # the same draws up to the stop
    assert seen == sorted(seen) and len(seen) == len(out.trace.rounds)
    assert not out.stopped_at_eos
