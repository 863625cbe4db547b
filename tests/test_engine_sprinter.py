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


def test_trace_records_tv_and_the_exact_leak_at_steered_positions():
    target, draft = tabular_pair()
    p0, q0 = target.conditional([0]).double(), draft.conditional([0]).double()
    tv0 = float(0.5 * (p0 - q0).abs().sum())
    for accept, method in ((True, "sprinter"), (False, "sprinter"), (True, "sprinter-exact")):
        engine = Engine(target, draft, verifier=constant_verifier(accept))
        out = engine.decode([0], DecodeConfig(method, max_new_tokens=8, cap=3, sampling=SAMPLING, seed=1))
        first = out.trace.rounds[0]
        assert out.trace.time_diagnostics > 0  # the online bookkeeping is timed apart from the decode
        assert first.tv_pq[0] == pytest.approx(tv0)  # position 1 of the first round continues the prompt [0]
        for r in out.trace.rounds:
            assert len(r.tv_pq) == len(r.leak) == r.drafted
            steered = [(tv, leak) for tv, leak in zip(r.tv_pq, r.leak, strict=True) if leak is not None]
            if method == "sprinter-exact":
                assert not steered  # lossless: every token is verified, nothing leaks
            elif accept:  # a ≡ 1: ε = Σ (q − p)_+ = TV(p, q), the whole leak the draft can make
                assert all(leak == pytest.approx(tv) for tv, leak in steered)
            else:  # a ≡ 0: nothing is committed unchecked
                assert all(leak == 0.0 for _, leak in steered)
        if method == "sprinter" and accept:  # runs reach the cap: the cap-th position is verified whatever a says
            assert all(r.leak[-1] is None for r in out.trace.rounds if r.drafted)
            assert any(leak is not None for r in out.trace.rounds for leak in r.leak)
