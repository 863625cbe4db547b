"""The draft-confidence stop: a draft path ends after a token the draft drew with q(x) < h; every single-path
verifier stays lossless (docs/algorithms.md §1.4 "Variable γ")."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from tests.stats import FALSE_ALARM, chi_square_pvalue, decode_counts, target_law
from verispec.drafters.confidence import ConfidenceStop
from verispec.drafting import draft_paths
from verispec.engine import DecodeConfig, Engine
from verispec.errors import ConfigError
from verispec.models.tabular import TabularLM
from verispec.sampling import SamplingConfig

T1 = SamplingConfig(temperature=1.0)


def test_the_rule_reads_the_drawn_tokens_probability():
    rule = ConfidenceStop(0.3)
    q = torch.tensor([0.5, 0.3, 0.2], dtype=torch.float64)
    assert [rule.score(None, q, t, 1) for t in range(3)] == [0.5, 0.3, 0.2]
    assert [rule.accepts(rule.score(None, q, t, 1)) for t in range(3)] == [True, True, False]
    assert rule.accept_mask(None, q, 1).tolist() == [1.0, 1.0, 0.0] and not rule.uses_hidden


@pytest.mark.parametrize("threshold", [0.15, 0.3, 0.5])
def test_a_path_ends_at_its_first_unsure_token_or_at_gamma(threshold):
    draft = TabularLM(6, seed=52, sharpness=3.0)
    rule = ConfidenceStop(threshold)
    lengths = Counter()
    for seed in range(200):
        draft.reset()
        block = draft_paths(draft, [0, 3], 1, 5, T1, torch.Generator().manual_seed(seed), frozenset(), 6,
                            stop_rule=rule)
        path, q = block.tokens[0], block.q[0]
        probs = [float(q[i, token]) for i, token in enumerate(path)]
        assert all(p >= threshold for p in probs[:-1])  # drafting went on after every token but the last
        assert len(path) == 5 or probs[-1] < threshold  # and stopped at γ or right after an unsure token
        assert block.forwards == len(path) and not block.hiddens  # no forward wasted, no hidden states kept
        lengths[len(path)] += 1
    assert len(lengths) > 1  # the rule really varies the length on this pair


@pytest.mark.parametrize("method", ["sd", "bv"])
def test_the_loop_keeps_the_target_law_with_the_confidence_stop(method):
    """Monte-Carlo through the decode loop on tabular models: 6,000 runs of 3 tokens, chi-square at FALSE_ALARM."""
    target, draft = TabularLM(3, seed=51), TabularLM(3, seed=52, sharpness=2.0)
    engine = Engine(target, draft)
    config = DecodeConfig(method, 3, 3, T1, draft_confidence=0.45, adaptive_gamma=False)  # the stop alone
    counts, lengths = Counter(), Counter()
    for s in range(6000):
        out = engine.decode([0], config.with_settings(seed=s))
        counts[tuple(out.tokens)] += 1
        lengths.update(r.drafted for r in out.trace.rounds)
    assert len([n for n in lengths if n > 0]) > 1  # blocks of several lengths were verified
    assert chi_square_pvalue(counts, target_law(target, [0], 3)) > FALSE_ALARM


@pytest.mark.parametrize("settings, message", [
    ({"draft_confidence": 0.0}, "must be in"),
    ({"draft_confidence": 1.5}, "must be in"),
    ({"draft_confidence": True}, "must be in"),
    ({"method": "gbv", "draft_confidence": 0.3}, "single path"),
    ({"drafter": "ngram", "draft_confidence": 0.3}, "single path"),
    ({"method": "ar", "draft_confidence": 0.3}, "single path"),
    ({"draft_confidence": 0.3, "temperature": 0.0}, "temperature > 0"),
])
def test_bad_confidence_settings_are_refused_by_name(settings, message):
    with pytest.raises(ConfigError, match=message):
        DecodeConfig(sampling=T1).with_settings(**settings)


def test_the_command_line_takes_the_threshold():
    import argparse

    from verispec.options import add_decode_options, decode_config

    parser = argparse.ArgumentParser()
    add_decode_options(parser)
    config = decode_config(parser.parse_args(["--temperature", "1", "--draft-confidence", "0.4"]))
    assert config.draft_confidence == 0.4
    variant = decode_config(parser.parse_args(["--temperature", "1", "--method", "bv:draft_confidence=0.25"]))
    assert (variant.method, variant.draft_confidence) == ("bv", 0.25)


def test_the_law_test_catches_a_rule_that_drops_the_unsure_token(monkeypatch):
    """Planted bug: the path ends *before* the unsure token (drawn, then thrown away). The proposals are then q
    restricted to the sure tokens while verification uses q, and the output law leaves the target's."""
    import verispec.drafters.model as model_drafter

    real = model_drafter.draft_paths

    def dropping(*args, **kwargs):
        block = real(*args, **kwargs)
        path, q = block.tokens[0], block.q
        if path and float(q[0, len(path) - 1, path[-1]]) < 0.45:
            block.tokens[0] = path[:-1]
            block.q = q[:, : len(path) - 1]
        return block

    monkeypatch.setattr(model_drafter, "draft_paths", dropping)
    target, draft = TabularLM(3, seed=51), TabularLM(3, seed=52, sharpness=2.0)
    engine = Engine(target, draft)
    config = DecodeConfig("sd", 3, 3, T1, draft_confidence=0.45, adaptive_gamma=False)  # as above
    counts = decode_counts(engine, config, 6000)
    assert chi_square_pvalue(counts, target_law(target, [0], 3)) < FALSE_ALARM
