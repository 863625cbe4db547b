"""The lossy relaxed-acceptance methods through the decode loop: the lossless end is `sd` token for token, the
configured knobs reach the rule, the online leak is recorded, and the emitted law matches §3.3's closed form."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from tests.stats import FALSE_ALARM, chi_square_pvalue
from verispec import theory
from verispec.drafters import DraftRequest, make_drafter
from verispec.engine import DecodeConfig, Engine, score_block, verify_block
from verispec.errors import ConfigError
from verispec.methods import get_method
from verispec.models.tabular import TabularLM
from verispec.sampling import SamplingConfig, process_logits
from verispec.verify.relaxed import margin_mask

WARM = SamplingConfig(temperature=1.0)
LOSSLESS = {
    "typical": {"typical_epsilon": 1.0, "typical_delta": math.inf},
    "margin": {"margin_delta": 0.0},
    "fuzzy": {"fuzzy_threshold": 0.0},
    "fly": {"fly_entropy": math.log(3)},
}
LOSSY = {
    "typical": {"typical_epsilon": 0.05, "typical_delta": math.inf},
    "margin": {"margin_delta": 3.0},
    "fuzzy": {"fuzzy_threshold": 0.6},
    "fly": {"fly_entropy": 0.0, "fly_window": 1},
}


def decode(engine, method, seed, **knobs):
    # the model drafter throughout: the relaxed rules gate the draft model's tokens, and sd is their lossless end
    # and sd's fixed γ: the relaxed rules draft γ tokens every round
    fixed = {"adaptive_gamma": False} if method == "sd" else {}
    config = DecodeConfig(method, gamma=4, max_new_tokens=40, sampling=WARM, seed=seed, drafter="model", **fixed,
                          **knobs)
    return engine.decode([0, 1], config)


def pair_engine() -> Engine:
    """A tabular target and a draft that agrees with it only in part (a 6-token vocabulary, fast to decode)."""
    return Engine(TabularLM(6, seed=61), TabularLM(6, seed=62, sharpness=1.5))


@pytest.mark.parametrize("rule", list(LOSSLESS))
def test_lossless_end_reproduces_sd_and_a_lossy_knob_does_not(rule):
    """Same seed, same tokens as `sd` at the lossless end, for 3 seeds; the lossy knob changes the output of at
    least one seed (so a rule that ignored its knob would fail one of the two checks)."""
    engine = pair_engine()
    changed = 0
    for seed in range(3):
        sd = decode(engine, "sd", seed).tokens
        assert decode(engine, rule, seed, **LOSSLESS[rule]).tokens == sd
        changed += decode(engine, rule, seed, **LOSSY[rule]).tokens != sd
    assert changed > 0


def test_trace_records_the_online_leak():
    """Each round records ε at the positions the rule examined (1..τ+1), None past them, TV(p, q) everywhere."""
    engine = pair_engine()
    for rule in LOSSY:
        trace = decode(engine, rule, 0, **LOSSY[rule]).trace
        leaks = []
        for r in trace.rounds:
            examined = min(r.accepted + 1, r.drafted)
            assert len(r.leak) == len(r.tv_pq) == r.drafted
            assert all(v is not None for v in r.leak[:examined]) and all(v is None for v in r.leak[examined:])
            # ε ≤ TV(p, q) exactly for the position gates; fly's one-sample estimate is a probability
            bounds = [1.0] * examined if rule == "fly" else r.tv_pq[:examined]
            assert all(0.0 <= v <= bound + 1e-9 for v, bound in zip(r.leak[:examined], bounds, strict=True))
            leaks += r.leak[:examined]
        assert max(leaks) > 0.0, rule
    sd = decode(engine, "sd", 0).trace
    assert all(not r.leak for r in sd.rounds)


@pytest.mark.parametrize("rule", list(LOSSY))
def test_verify_block_runs_the_round_the_loop_runs(rule):
    """The first round by hand (the same generator draws the draft, one target pass, then `verify_block` with the
    configured method) keeps what the loop's first round kept, emits its tokens and records its leaks: the exported
    verifier is the loop's, knobs and p̃ included (temperature 0.7 and top-k 3: p̃ is not p)."""
    engine, prompt = pair_engine(), [0, 1]
    sampling = SamplingConfig(temperature=0.7, top_k=3)
    for seed in range(4):
        config = DecodeConfig(rule, gamma=4, max_new_tokens=5, sampling=sampling, seed=seed, drafter="model",
                              **LOSSY[rule])
        out = engine.decode(prompt, config)
        first = out.trace.rounds[0]
        generator = torch.Generator().manual_seed(seed)
        for model in (engine.target, engine.draft):
            model.reset()
        block = make_drafter(config, engine.draft).propose(DraftRequest(
            list(prompt), 1, 4, sampling, generator, engine.eos_token_ids, engine.target.vocab_size, remaining=5))
        scored = score_block(engine.target, list(prompt), block, sampling)
        method = config.decoding_method()
        assert method.verify.knobs == config.relaxed_knobs() != get_method(rule).verify.knobs
        result = verify_block(method, block, scored, generator)
        assert (result.accepted, result.leaks[: result.accepted + 1]) == (first.accepted,
                                                                          first.leak[: first.accepted + 1])
        assert out.tokens[: first.emitted] == (block.tokens[0][: result.accepted] + [result.token])[: first.emitted]


def tabular_case():
    """A tabular pair and context where margin's gate on p̃ = softmax(logits) keeps an over-proposed token that a
    gate on the processed p (temperature 0.5: p ∝ p̃²) would not: ε is 0.32 with p̃ and 0 with p."""
    target, draft = TabularLM(4, seed=41), TabularLM(4, seed=51)
    sampling = SamplingConfig(temperature=0.5)
    p_tilde = target.conditional([2]).to(torch.float64)
    p = process_logits(p_tilde.log(), sampling)
    q = process_logits(draft.conditional([2]).to(torch.float64).log(), sampling)
    return Engine(target, draft), sampling, p_tilde, p, q


def test_engine_passes_the_knob_and_the_unprocessed_target_to_the_gate():
    """The leak the engine records at the first position equals ε computed here with margin's gate on p̃."""
    engine, sampling, p_tilde, p, q = tabular_case()
    expected = theory.leak(p, q, margin_mask(p_tilde[None], 1.0)[0])
    assert expected > 0.3 and theory.leak(p, q, margin_mask(p[None], 1.0)[0]) == 0.0
    out = engine.decode([2], DecodeConfig("margin", gamma=1, max_new_tokens=2, sampling=sampling, margin_delta=1.0))
    assert out.trace.rounds[0].leak[0] == pytest.approx(expected, abs=1e-6)  # logits are float32


def test_engine_output_law_matches_the_closed_form():
    """Monte-Carlo through the decode loop: the first token's law is §3.3's P_out with margin's gate on p̃ (Δ = 1),
    not p. 1,500 runs, chi-square at the shared false-alarm rate 1e-6 (the expected statistic against p is
    about 1,500 · Σ(P_out − p)²/p ≈ 1,600, so that rejection is not luck)."""
    engine, sampling, p_tilde, p, q = tabular_case()
    config = dict(gamma=1, max_new_tokens=2, sampling=sampling, margin_delta=1.0)
    counts = Counter(engine.decode([2], DecodeConfig("margin", seed=s, **config)).tokens[0] for s in range(1500))
    law = theory.position_law(p, q, margin_mask(p_tilde[None], 1.0)[0])
    assert chi_square_pvalue(counts, {v: float(law[v]) for v in range(4)}) > FALSE_ALARM
    assert chi_square_pvalue(counts, {v: float(p[v]) for v in range(4)}) < FALSE_ALARM


@pytest.mark.parametrize("knobs,name", [
    ({"typical_epsilon": 1.2}, "typical_epsilon"), ({"margin_delta": -1.0}, "margin_delta"),
    ({"fuzzy_threshold": 1.0}, "fuzzy_threshold"), ({"fly_window": 0}, "fly_window"),
    ({"method": "fly", "gamma": 3, "fly_window": 3}, "fly_window"),
])
def test_decode_config_rejects_knobs_out_of_range(knobs, name):
    with pytest.raises(ConfigError, match=name):
        DecodeConfig(**knobs)
