"""Lossy relaxed-acceptance rules (docs/algorithms.md §6.2): exact laws on tabular models, lossless ends, leaks.

Each round is enumerated exactly: every drafted block and the rule's BlockLaw. The gates read an unprocessed
target law p̃ that differs from the processed p (p ∝ p̃², as temperature 0.5 would give), so a rule that mixed
the two up would fail the closed forms.
"""

from __future__ import annotations

import math
from itertools import product

import pytest
import torch

from tests.verify.exact import block_inputs
from verispec import theory
from verispec.models.tabular import TabularLM
from verispec.verify import token_verify_law
from verispec.verify.relaxed import (
    RelaxedKnobs,
    fly_gate,
    fly_leaks,
    fly_verify_law,
    fuzzy_mask,
    js_divergence,
    margin_mask,
    position_mask,
    relaxed_law,
    relaxed_position_law,
    typical_mask,
)

TOL = 1e-12
CASES = [(4, 0, [0]), (5, 7, [0])]  # (V, seed, context): contexts where every lossy setting below leaks
LOSSLESS = {
    "typical": RelaxedKnobs(typical_epsilon=1.0, typical_delta=math.inf),
    "margin": RelaxedKnobs(margin_delta=0.0),
    "fuzzy": RelaxedKnobs(fuzzy_threshold=0.0),
    "fly": RelaxedKnobs(fly_entropy=math.log(3), fly_window=1),
}
LOSSY = {
    "typical": RelaxedKnobs(typical_epsilon=0.3, typical_delta=0.6),
    "margin": RelaxedKnobs(margin_delta=1.0),
    "fuzzy": RelaxedKnobs(fuzzy_threshold=0.2),
    "fly": RelaxedKnobs(fly_entropy=0.2, fly_window=1),
}


def sharpen(probs: torch.Tensor) -> torch.Tensor:
    """Return the processed law p ∝ p̃² (temperature 0.5) of an unprocessed one `[..., V]`."""
    squared = probs.to(torch.float64) ** 2
    return squared / squared.sum(-1, keepdim=True)


def models(vocab: int, seed: int) -> tuple[TabularLM, TabularLM]:
    return TabularLM(vocab, seed=40 + seed), TabularLM(vocab, seed=50 + seed, sharpness=2.0)


def inputs(target, draft, context, block):
    """Return (draft_tokens, q, p processed, p̃ unprocessed) of a block after `context`."""
    tokens, q, p_gate = block_inputs(target, draft, context, block)
    return tokens, q, sharpen(p_gate), p_gate.to(torch.float64)


def first_token_law(rule, knobs, target, draft, context, gamma):
    """Return the exact law `[V]` of the first token one round emits, enumerating every drafted block."""
    vocab = target.vocab_size
    out = torch.zeros(vocab, dtype=torch.float64)
    for block in product(range(vocab), repeat=gamma):
        prob = draft.sequence_prob(context, block)
        law, _ = relaxed_law(rule, *inputs(target, draft, context, block), knobs)
        out[block[0]] += prob * float(law.stop[1:].sum())  # τ ≥ 1: x_1 emitted
        out += prob * float(law.stop[0]) * law.residual(0)  # τ = 0: the correction token
    return out


def gate_row(rule, knobs, p, q, p_gate):
    """Return the rule's gate `[V]` at one position (the three position gates)."""
    return position_mask(rule, p[None], q[None], p_gate[None], knobs)[0]


@pytest.mark.parametrize("rule", ["typical", "margin", "fuzzy"])
@pytest.mark.parametrize("vocab,seed,context", CASES)
def test_position_gates_emit_the_closed_form_law(rule, vocab, seed, context):
    """One position: P_out = p + a·(q − p)_+ − ε·(p − q)_+/Z with a the gate (§3.3), and TV(P_out, p) = ε."""
    target, draft = models(vocab, seed)
    p_gate = target.conditional(context).to(torch.float64)
    p, q = sharpen(p_gate), draft.conditional(context).to(torch.float64)
    mask = gate_row(rule, LOSSY[rule], p, q, p_gate)
    expected = theory.position_law(p, q, mask)
    assert torch.equal(relaxed_position_law(rule, p, q, p_gate, LOSSY[rule]), expected)
    for gamma in (1, 2):
        got = first_token_law(rule, LOSSY[rule], target, draft, context, gamma)
        assert torch.allclose(got, expected, atol=TOL, rtol=0)
    # The recorded leak is the exact TV between the emitted law and p.
    _, leaks = relaxed_law(rule, *inputs(target, draft, context, (0,)), LOSSY[rule])
    assert abs(leaks[0] - theory.total_variation(expected, p)) < TOL


@pytest.mark.parametrize("vocab,seed,context", CASES)
def test_the_lossy_settings_do_leak(vocab, seed, context):
    """The lossy knobs of these tests move mass on these contexts, and typical's and margin's gates keep some
    tokens and not others (else the closed-form tests would prove little)."""
    target, draft = models(vocab, seed)
    p_gate = target.conditional(context).to(torch.float64)
    p, q = sharpen(p_gate), draft.conditional(context).to(torch.float64)
    for rule in ("typical", "margin", "fuzzy"):
        mask = gate_row(rule, LOSSY[rule], p, q, p_gate)
        assert theory.leak(p, q, mask) > 1e-3, rule
        assert rule == "fuzzy" or 0 < int(mask.sum()) < vocab, rule


def fly_rescue_probability(target, draft, context, x, window):
    """Return P(the W tokens drafted after x all pass SD's test | context, x), enumerating the continuations."""
    total = 0.0
    for rest in product(range(target.vocab_size), repeat=window):
        block = (x, *rest)
        tokens, q, p, _ = inputs(target, draft, context, block)
        ratio = (p[:-1].gather(1, tokens.view(-1, 1)).view(-1) / q.gather(1, tokens.view(-1, 1)).view(-1))
        total += draft.sequence_prob(list(context) + [x], rest) * float(torch.clamp(ratio[1:], max=1.0).prod())
    return total


@pytest.mark.parametrize("window,gamma", [(1, 2), (1, 3), (2, 3)])
def test_fly_first_position_law_and_unbiased_leak(window, gamma):
    """FLy at the first position: the §3.3 law with a(v) = gate·P(next W pass | v), and E[ε̂] = ε exactly."""
    target, draft = models(3, 2)
    context = [0]
    knobs = RelaxedKnobs(fly_entropy=0.0, fly_window=window)  # the gate is open wherever p̃'s top-3 is not flat 0
    p_gate = target.conditional(context).to(torch.float64)
    assert bool(fly_gate(p_gate[None], 0.0, 3)[0])
    p, q = sharpen(p_gate), draft.conditional(context).to(torch.float64)
    keep = torch.tensor([fly_rescue_probability(target, draft, context, x, window) for x in range(3)],
                        dtype=torch.float64)
    expected = theory.position_law(p, q, keep)
    assert theory.leak(p, q, keep) > 1e-3
    got = first_token_law("fly", knobs, target, draft, context, gamma)
    assert torch.allclose(got, expected, atol=TOL, rtol=0)
    # The recorded ε̂ at position 1, averaged over the drafted blocks, is the exact ε of that position.
    mean = sum(draft.sequence_prob(context, block) * relaxed_law("fly", *inputs(target, draft, context, block),
                                                                 knobs)[1][0]
               for block in product(range(3), repeat=gamma))
    assert abs(mean - theory.leak(p, q, keep)) < TOL


def test_fly_law_sums_to_one_and_cannot_defer_past_the_block():
    """A rejection whose window runs past the block stands: with W = γ − 1 only position 1 can be deferred."""
    target, draft = models(3, 3)
    tokens, q, p, p_gate = inputs(target, draft, [2], (0, 1, 2))
    gate = torch.tensor([False, True, True])
    law = fly_verify_law(tokens, q, p, gate, window=2)
    assert abs(float(law.stop.sum()) - 1.0) < TOL
    assert torch.equal(law.stop, token_verify_law(tokens, q, p).stop)  # the only open gates cannot be confirmed
    assert fly_leaks(tokens, q, p, gate, 2) == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("rule", list(LOSSLESS))
def test_lossless_end_is_sd_bit_for_bit(rule):
    """At its lossless end each rule's law on every block equals token verification's, to the bit."""
    target, draft = models(3, 4)
    for block in product(range(3), repeat=3):
        args = inputs(target, draft, [1], block)
        law, leaks = relaxed_law(rule, *args, LOSSLESS[rule])
        assert torch.equal(law.stop, token_verify_law(*args[:3]).stop)
        assert leaks == [0.0, 0.0, 0.0]


@pytest.mark.parametrize("rule", list(LOSSY))
def test_lossy_setting_is_not_sd(rule):
    """The same check fails away from the lossless end (so ignoring the knob would be caught)."""
    target, draft = models(3, 4)
    differs = 0
    for block in product(range(3), repeat=3):
        args = inputs(target, draft, [1], block)
        differs += not torch.equal(relaxed_law(rule, *args, LOSSY[rule])[0].stop, token_verify_law(*args[:3]).stop)
    assert differs > 0


def test_gate_formulas_on_a_hand_built_row():
    """Typical, margin, fuzzy and FLy gates on hand-computed numbers."""
    p_gate = torch.tensor([[0.5, 0.3, 0.2]], dtype=torch.float64)
    h = -(0.5 * math.log(0.5) + 0.3 * math.log(0.3) + 0.2 * math.log(0.2))  # 1.0297 nats
    threshold = min(0.4, 0.9 * math.exp(-h))  # 0.3214
    assert typical_mask(p_gate, 0.4, 0.9).tolist() == [[0.5 > threshold, 0.3 > threshold, 0.2 > threshold]]
    assert typical_mask(p_gate, 0.25, math.inf).tolist() == [[True, True, False]]  # threshold ε alone
    # log 0.3 − log 0.5 = −0.51: inside a margin of 0.6, outside one of 0.5.
    assert margin_mask(p_gate, 0.6).tolist() == [[True, True, False]]
    assert margin_mask(p_gate, 0.5).tolist() == [[True, False, False]]
    assert margin_mask(p_gate, 0.0).tolist() == [[False, False, False]]
    q = torch.tensor([[0.2, 0.3, 0.5]], dtype=torch.float64)
    js = float(js_divergence(p_gate, q)[0])
    m = [0.35, 0.3, 0.35]
    by_hand = 0.5 * sum(a * math.log(a / b) for a, b in zip([0.5, 0.3, 0.2], m, strict=True)) + \
        0.5 * sum(a * math.log(a / b) for a, b in zip([0.2, 0.3, 0.5], m, strict=True))
    assert abs(js - by_hand) < TOL
    assert fuzzy_mask(p_gate, q, js + 1e-9).all() and not fuzzy_mask(p_gate, q, js).any()
    assert bool(fly_gate(p_gate, h - 1e-9, 3)[0]) and not bool(fly_gate(p_gate, h, 3)[0])
    assert float(js_divergence(p_gate, torch.tensor([[0.0, 0.0, 1.0]], dtype=torch.float64))[0]) <= math.log(2)


@pytest.mark.parametrize("knob,value", [
    ("typical_epsilon", 1.5), ("typical_epsilon", -0.1), ("typical_delta", -1.0), ("margin_delta", -0.1),
    ("fuzzy_threshold", 0.7), ("fly_entropy", float("nan")), ("fly_window", 0), ("fly_top_k", 1),
    ("fly_window", 1.5), ("margin_delta", "big"),
])
def test_knobs_out_of_range_are_config_errors(knob, value):
    from verispec.errors import ConfigError

    with pytest.raises(ConfigError, match=knob):
        RelaxedKnobs(**{knob: value})


def test_leaks_are_one_per_position_and_bounded():
    """One leak per drafted position, in [0, TV(p, q)] (ε ≤ Σ(q − p)_+; fly's estimate likewise here)."""
    target, draft = models(4, 1)
    tokens, q, p, p_gate = inputs(target, draft, [3], (0, 1))
    for rule, knobs in LOSSY.items():
        _, leaks = relaxed_law(rule, tokens, q, p, p_gate, knobs)
        assert len(leaks) == 2
        assert all(0.0 <= value <= theory.total_variation(p[i], q[i]) + TOL for i, value in enumerate(leaks))


@pytest.mark.parametrize("rule,knobs", [
    ("typical", RelaxedKnobs(typical_epsilon=0.3, typical_delta=math.inf)),
    ("margin", RelaxedKnobs(margin_delta=0.3)),
    ("fly", RelaxedKnobs(fly_entropy=0.5, fly_window=1)),
])
def test_gates_read_the_unprocessed_target_at_temperature_zero(rule, knobs):
    """Greedy: p and q are point masses (SD keeps x only if it is p's argmax); the gates read p̃ = softmax(logits),
    so a greedy draft of the target's close second choice is kept (margin: log 0.4 − log 0.5 = −0.22 > −0.3)."""
    p_gate = torch.tensor([[0.5, 0.4, 0.1], [0.2, 0.5, 0.3], [0.3, 0.3, 0.4]], dtype=torch.float64)
    p = torch.nn.functional.one_hot(p_gate.argmax(-1), 3).to(torch.float64)
    q = torch.tensor([[0.0, 1.0, 0.0], [0.0, 1.0, 0.0]], dtype=torch.float64)
    tokens = torch.tensor([1, 1])
    assert float(token_verify_law(tokens, q, p).stop[0]) == 1.0  # SD rejects the first token for sure
    law, leaks = relaxed_law(rule, tokens, q, p, p_gate, knobs)
    assert float(law.stop[0]) == 0.0 and float(law.stop[2]) == 1.0  # kept, then position 2 matches p's argmax
    assert leaks[0] == pytest.approx(1.0)  # at that position the output is q's point mass, TV 1 from p
