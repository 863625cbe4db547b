"""SPRINTER in the decode loop: the learned stop rule, the last-token check, online η_FP/η_TP, sprinter-exact."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from tests.stats import FALSE_ALARM, chi_square_pvalue, target_law
from verispec.engine import DecodeConfig, Engine
from verispec.errors import ConfigError
from verispec.learned import LearnedVerifier
from verispec.models.tabular import TabularLM
from verispec.sampling import SamplingConfig

SAMPLING = SamplingConfig(temperature=1.0)


def constant_verifier(accept: bool, hidden_size: int = 1) -> LearnedVerifier:
    """A context verifier whose score is sigmoid(±20) whatever it sees: it accepts or rejects every token."""
    return LearnedVerifier(torch.zeros(hidden_size, dtype=torch.float64), 20.0 if accept else -20.0, "context",
                           0.5, 1.0, hidden_size, "any")


def law_of_outputs(engine: Engine, config: DecodeConfig, runs: int) -> Counter:
    return Counter(tuple(engine.decode([0], DecodeConfig(**{**config.__dict__, "seed": s})).tokens)
                   for s in range(runs))


def tabular_pair():
    return TabularLM(3, seed=41), TabularLM(3, seed=42, sharpness=2.0)


def test_sprinter_whose_verifier_rejects_everything_is_lossless_like_sd_gamma_1():
    target, draft = tabular_pair()
    engine = Engine(target, draft, verifier=constant_verifier(False))
    config = DecodeConfig("sprinter", max_new_tokens=3, sampling=SAMPLING)
    counts = law_of_outputs(engine, config, 6000)
    assert chi_square_pvalue(counts, target_law(target, [0], 3)) > FALSE_ALARM
    out = engine.decode([0], config)
    assert all(r.drafted == 1 for r in out.trace.rounds[:-1]) and out.trace.rounds[-1].drafted <= 1


def test_sprinter_whose_verifier_accepts_everything_commits_draft_tokens_unchecked():
    # η_FP = 1: the first token of a 2-token run is never checked, so its law is q, not p (§3.3 mixture at η_FP=1).
    target, draft = tabular_pair()
    engine = Engine(target, draft, verifier=constant_verifier(True))
    counts = Counter(t[:1] for t in law_of_outputs(engine, DecodeConfig("sprinter", max_new_tokens=3, cap=2,
                                                                        sampling=SAMPLING), 6000).elements())
    q_law = {(t,): float(draft.conditional([0])[t]) for t in range(3)}
    p_law = {(t,): float(target.conditional([0])[t]) for t in range(3)}
    assert chi_square_pvalue(counts, q_law) > FALSE_ALARM
    assert chi_square_pvalue(counts, p_law) < FALSE_ALARM  # and the check can tell q from p


def test_sprinter_exact_is_lossless_with_any_run_length():
    target, draft = tabular_pair()
    engine = Engine(target, draft, verifier=constant_verifier(True))
    counts = law_of_outputs(engine, DecodeConfig("sprinter-exact", max_new_tokens=3, cap=3, sampling=SAMPLING), 6000)
    assert chi_square_pvalue(counts, target_law(target, [0], 3)) > FALSE_ALARM


def test_greedy_sprinter_exact_equals_ar_and_records_online_rates(tiny_pair, tokenizer):
    prompt = tokenizer("def add(a, b):")["input_ids"]
    hidden = tiny_pair["partial"].model.config.hidden_size
    engine = Engine(tiny_pair["target"], tiny_pair["partial"], verifier=constant_verifier(True, hidden))
    ar = engine.decode(prompt, DecodeConfig("ar", max_new_tokens=30)).tokens
    out = engine.decode(prompt, DecodeConfig("sprinter-exact", max_new_tokens=30, cap=4))
    assert out.tokens == ar
    rounds = out.trace.rounds
    assert all(1 <= r.drafted <= 4 and len(r.verifier_scores) == len(r.acceptable) == r.drafted for r in rounds)
    rates = out.trace.verifier_rates()
    assert rates["eta_tp"] == 1.0 and rates["tokens"] == sum(r.drafted for r in rounds)
    if rates["tokens"] > rates["acceptable"]:
        assert rates["eta_fp"] == 1.0  # an accept-everything verifier accepts every unacceptable token too


def test_sprinter_needs_a_verifier(tiny_pair, tokenizer):
    engine = Engine(tiny_pair["target"], tiny_pair["partial"])
    with pytest.raises(ConfigError, match="learned verifier"):
        engine.decode([3, 4], DecodeConfig("sprinter"))


@pytest.mark.parametrize("kwargs, message", [({"cap": 0}, "cap"), ({"tau": 1.5}, "tau")])
def test_bad_sprinter_settings(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        DecodeConfig("sprinter", **kwargs)
