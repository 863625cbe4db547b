"""The drafters in the decode loop: greedy equivalence with `ar`, the loop's output law, lengths, trace, errors."""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch

from tests.stats import FALSE_ALARM, chi_square_pvalue, target_law
from verispec.drafters import lookup_length
from verispec.drafters.adaptive import ADAPTIVE_LOOKUP_GAMMA
from verispec.engine import DecodeConfig, Engine
from verispec.errors import ConfigError
from verispec.models.hf import HFCausalLM
from verispec.models.tabular import TabularLM
from verispec.sampling import SamplingConfig
from verispec.serve.bounds import draft_length

# Repetitive, so that prompt lookup finds matches from the first round on.
PROMPT = "def add(a, b):\n    return a + b\n\ndef sub(a, b):\n    return a - b\n\ndef add(a, b):\n    return"
SINGLE = [("sd", 1), ("bv", 1)]
MULTI = [("gbv", 3), ("nss", 2), ("specinfer", 3), ("spectr", 2), ("traversal", 2)]


def ids(tokenizer):
    return tokenizer(PROMPT)["input_ids"]


@pytest.fixture(scope="module", params=[False, True], ids=["fixed-head", "context-head"])
def reduced_same(request, tiny_pair, tokenizer):
    """The target's own weights with a head over half the vocabulary (the special tokens and the even ids), alone
    or with the context's tokens."""
    model = copy.deepcopy(tiny_pair["target"].model)
    keep = [0, 1] + list(range(2, len(tokenizer), 2))
    return HFCausalLM(model, tokenizer, name="tiny-same-reduced", vocab_ids=keep, context_vocab=request.param)


@pytest.mark.parametrize("method,paths", SINGLE + MULTI)
@pytest.mark.parametrize("drafter,ngram_min", [("ngram", 1), ("ngram", 2), ("hybrid", 2)])
def test_greedy_drafters_equal_ar(tiny_pair, tokenizer, method, paths, drafter, ngram_min):
    engine = Engine(tiny_pair["target"], tiny_pair["partial"])
    expected = engine.decode(ids(tokenizer), DecodeConfig("ar", max_new_tokens=40)).tokens
    config = DecodeConfig(method, gamma=4, max_new_tokens=40, paths=paths, drafter=drafter, ngram_min=ngram_min)
    out = engine.decode(ids(tokenizer), config)
    assert out.tokens == expected
    proposed = out.trace.rounds_by_drafter()
    assert proposed.get("ngram", 0) > 0
    if drafter == "ngram":
        assert out.trace.draft_calls == 0 and "model" not in proposed


@pytest.mark.parametrize("method,paths", SINGLE + [("gbv", 2), ("specinfer", 2)])
def test_greedy_reduced_head_equals_ar(tiny_pair, tokenizer, reduced_same, method, paths):
    engine = Engine(tiny_pair["target"], reduced_same)
    expected = engine.decode(ids(tokenizer), DecodeConfig("ar", max_new_tokens=40)).tokens
    config = DecodeConfig(method, gamma=4, max_new_tokens=40, paths=paths, draft_vocab=reduced_same.draft_vocab)
    out = engine.decode(ids(tokenizer), config)
    assert out.tokens == expected
    # The same weights, half the head: a target token outside the head is never drafted, one inside always is.
    assert 0.0 < out.trace.acceptance_rate <= 1.0
    if not reduced_same.reduced_head.context:
        assert out.trace.acceptance_rate < 1.0


def test_a_context_head_accepts_what_the_context_repeats(tiny_pair, tokenizer):
    """Half the head, fixed or grown with the context: the same greedy tokens; the odd-id tokens that the prompt
    and the answer repeat are drafted (and accepted) only by the context head."""
    keep = [0, 1] + list(range(2, len(tokenizer), 2))
    accepted = {}
    expected = Engine(tiny_pair["target"]).decode(ids(tokenizer), DecodeConfig("ar", max_new_tokens=40)).tokens
    for context in (False, True):
        draft = HFCausalLM(copy.deepcopy(tiny_pair["target"].model), tokenizer, vocab_ids=keep, context_vocab=context)
        out = Engine(tiny_pair["target"], draft).decode(ids(tokenizer), DecodeConfig("sd", gamma=4, max_new_tokens=40,
                                                                                        draft_vocab=len(keep),
                                                                                        drafter="model"))
        assert out.tokens == expected
        accepted[context] = sum(r.accepted for r in out.trace.rounds)
    repeated_odd = [t for i, t in enumerate(expected) if t % 2 and t not in keep and t in ids(tokenizer) + expected[:i]]
    assert repeated_odd and accepted[True] > accepted[False]


def test_hybrid_records_which_drafter_proposed(tiny_pair, tokenizer):
    engine = Engine(tiny_pair["target"], tiny_pair["partial"])
    config = DecodeConfig("sd", gamma=4, max_new_tokens=60, drafter="hybrid", ngram_min=3, ngram_max=4)
    trace = engine.decode(ids(tokenizer), config).trace
    counts = trace.rounds_by_drafter()
    assert counts.get("ngram", 0) > 0 and counts.get("model", 0) > 0
    assert trace.draft_calls == sum(r.drafted for r in trace.rounds if r.drafter == "model")
    assert trace.to_dict()["rounds_by_drafter"] == counts


def test_hybrid_skips_the_draft_model_when_its_catch_up_costs_too_much(tiny_pair, tokenizer):
    """catchup = 0: the draft model never drafts (rounds without a match are plain steps, its cache stays empty),
    the tokens are still ar's; no limit: the model drafts where lookup misses, as on a short prompt by default."""
    engine = Engine(tiny_pair["target"], tiny_pair["partial"])
    expected = engine.decode(ids(tokenizer), DecodeConfig("ar", max_new_tokens=60)).tokens
    base = dict(gamma=4, max_new_tokens=60, drafter="hybrid", ngram_min=3, ngram_max=4)
    lookup_only = engine.decode(ids(tokenizer), DecodeConfig("sd", hybrid_catchup=0.0, **base))
    assert lookup_only.tokens == expected
    counts = lookup_only.trace.rounds_by_drafter()
    assert "model" not in counts and counts.get("none", 0) > 0 and counts.get("ngram", 0) > 0
    assert lookup_only.trace.draft_calls == 0 and tiny_pair["partial"].cache_length == 0
    for catchup in (float("inf"), DecodeConfig.hybrid_catchup):  # 60 tokens to go: a short prompt is caught up
        out = engine.decode(ids(tokenizer), DecodeConfig("sd", hybrid_catchup=catchup, **base))
        assert out.tokens == expected and out.trace.rounds_by_drafter().get("model", 0) > 0


def test_hybrid_catch_up_follows_the_engines_load(tiny_pair, tokenizer):
    """Alone the default rule catches the short prompt up; with 1,000 sequences sharing the passes the catch-up is
    weighed 1,000 times, so the draft model never drafts; the tokens are ar's either way (T = 0)."""
    expected = Engine(tiny_pair["target"], tiny_pair["partial"]).decode(
        ids(tokenizer), DecodeConfig("ar", max_new_tokens=60)).tokens
    config = DecodeConfig("sd", gamma=4, max_new_tokens=60, drafter="hybrid", ngram_min=3, ngram_max=4)
    for load, model_rounds in ((1, True), (1000, False)):
        engine = Engine(tiny_pair["target"], tiny_pair["partial"], load=lambda load=load: load)
        out = engine.decode(ids(tokenizer), config)
        assert out.tokens == expected
        assert (out.trace.rounds_by_drafter().get("model", 0) > 0) == model_rounds


@pytest.mark.parametrize("behind, sequences, drafts", [(12, 1, True), (13, 1, False), (6, 2, True), (7, 2, False),
                                                       (12, 2, False), (3, 4, True), (4, 4, False)])
def test_hybrid_catch_up_boundary(tiny_pair, tokenizer, behind, sequences, drafts):
    """The draft model drafts when the tokens it lacks, times the sequences sharing the passes, are at most catchup ×
    remaining, and not one token more."""
    from verispec.drafters import DraftRequest, HybridDrafter, ModelDrafter, NgramDrafter

    draft = tiny_pair["partial"]
    draft.reset()
    tokens = list(range(10, 10 + behind))  # no repeated n-gram: lookup never matches
    request = DraftRequest(tokens, 1, 3, SamplingConfig(), torch.Generator().manual_seed(0), frozenset(),
                           tiny_pair["target"].vocab_size, remaining=4, sequences=sequences)
    block = HybridDrafter(NgramDrafter(2, 3), ModelDrafter(draft), catchup=3.0).propose(request)  # 12 = 3 × 4
    assert (block.drafter == "model" and block.length == 3) if drafts else (block.drafter == "none" and
                                                                           block.length == 0)
    assert draft.cache_length == (len(tokens) + 2 if drafts else 0)
    draft.reset()


@pytest.mark.parametrize("n", [1, 2, 5, 13])
@pytest.mark.parametrize("drafter", ["ngram", "hybrid"])
def test_stops_exactly_at_max_new_tokens(tiny_pair, tokenizer, n, drafter):
    engine = Engine(tiny_pair["target"], tiny_pair["same"])
    out = engine.decode(ids(tokenizer), DecodeConfig("sd", 4, n, drafter=drafter, ngram_min=1))
    assert out.tokens == engine.decode(ids(tokenizer), DecodeConfig("ar", max_new_tokens=n)).tokens
    produced = 0
    for r in out.trace.rounds:  # a round never drafts what max_new_tokens could not keep
        assert r.drafted <= n - produced - 1
        produced += r.emitted


@pytest.mark.parametrize("method,paths", SINGLE + [("gbv", 3), ("specinfer", 3)])
@pytest.mark.parametrize("drafter", ["ngram", "hybrid"])
def test_longer_lookup_rounds_keep_greedy_ar_and_their_length(tiny_pair, tokenizer, method, paths, drafter):
    """ngram_gamma = 9 over gamma = 2: lookup rounds draft up to 9 tokens (model rounds still 2), greedy output is
    `ar`'s, and no round drafts past max_new_tokens."""
    engine = Engine(tiny_pair["target"], tiny_pair["partial"])
    n = 30
    expected = engine.decode(ids(tokenizer), DecodeConfig("ar", max_new_tokens=n)).tokens
    config = DecodeConfig(method, gamma=2, max_new_tokens=n, paths=paths, drafter=drafter, ngram_gamma=9)
    out = engine.decode(ids(tokenizer), config)
    assert out.tokens == expected
    assert max(r.drafted for r in out.trace.rounds if r.drafter == "ngram") > 2
    assert all(r.drafted <= 2 for r in out.trace.rounds if r.drafter == "model")
    produced = 0
    for r in out.trace.rounds:
        assert r.drafted <= min(9, n - produced - 1)
        produced += r.emitted


@pytest.mark.parametrize("drafter", ["ngram", "hybrid"])
def test_by_default_lookup_rounds_choose_their_length_up_to_their_own_most(tiny_pair, tokenizer, drafter):
    """With the default adaptive length and no ngram_gamma, a lookup round may draft past gamma, up to
    ADAPTIVE_LOOKUP_GAMMA (chosen per round from the lookups' acceptance); the greedy output stays `ar`'s. Without
    the adaptive length, lookups stay at gamma."""
    engine = Engine(tiny_pair["target"], tiny_pair["partial"])
    n = 60
    expected = engine.decode(ids(tokenizer), DecodeConfig("ar", max_new_tokens=n)).tokens
    out = engine.decode(ids(tokenizer), DecodeConfig("sd", gamma=2, max_new_tokens=n, drafter=drafter))
    assert out.tokens == expected
    lookups = [r.drafted for r in out.trace.rounds if r.drafter == "ngram"]
    assert max(lookups) > 2 and max(lookups) <= ADAPTIVE_LOOKUP_GAMMA
    fixed = engine.decode(ids(tokenizer), DecodeConfig("sd", gamma=2, max_new_tokens=n, drafter=drafter,
                                                        adaptive_gamma=False))
    assert fixed.tokens == expected and max(r.drafted for r in fixed.trace.rounds) <= 2


def test_lookup_length_is_ngram_gamma_else_the_adaptive_most_else_gamma():
    assert lookup_length(DecodeConfig("sd", gamma=3)) == ADAPTIVE_LOOKUP_GAMMA  # hybrid, adaptive by default
    assert lookup_length(DecodeConfig("sd", gamma=3, adaptive_gamma=False)) == 3
    assert lookup_length(DecodeConfig("sd", gamma=3, ngram_gamma=7)) == 7
    assert draft_length(DecodeConfig("sd", gamma=3)) == ADAPTIVE_LOOKUP_GAMMA  # the server bounds a round by it
    assert draft_length(DecodeConfig("sd", gamma=3, drafter="model")) == 3


@pytest.mark.parametrize("method,paths", [("sd", 1), ("specinfer", 3)])
@pytest.mark.parametrize("gamma,ngram_gamma", [(2, None), (1, 3)])
def test_full_loop_law_with_prompt_lookup(method, paths, gamma, ngram_gamma):
    """Monte-Carlo through the decode loop on a tabular target: 3,000 runs of 3 tokens, chi-square at 1e-6.
    The lookup's candidates (several of them for multi-path methods; longer than gamma with ngram_gamma) verify as
    the target's law."""
    target = TabularLM(3, seed=81)
    engine = Engine(target, None)
    sampling = SamplingConfig(temperature=1.0)
    prompt = [0, 1, 2, 0, 1]
    counts = Counter(
        tuple(engine.decode(prompt, DecodeConfig(method, gamma, 3, sampling, seed=s, paths=paths, drafter="ngram",
                                                 ngram_min=1, ngram_max=2, ngram_gamma=ngram_gamma)).tokens)
        for s in range(3000)
    )
    assert chi_square_pvalue(counts, target_law(target, prompt, 3)) > FALSE_ALARM


def test_ngram_needs_no_draft_model_and_model_drafter_does(tiny_pair, tokenizer):
    engine = Engine(tiny_pair["target"], None)
    assert len(engine.decode(ids(tokenizer), DecodeConfig("sd", max_new_tokens=5, drafter="ngram")).tokens) == 5
    for drafter in ("model", "hybrid"):
        with pytest.raises(ConfigError, match="needs a draft model"):
            engine.decode(ids(tokenizer), DecodeConfig("sd", drafter=drafter))


def test_draft_vocab_must_match_the_loaded_head(tiny_pair, tokenizer, reduced_same):
    with pytest.raises(ConfigError, match="head of 7 tokens"):
        Engine(tiny_pair["target"], tiny_pair["same"]).decode(ids(tokenizer), DecodeConfig("sd", draft_vocab=7))
    with pytest.raises(ConfigError, match="exceeds the vocabulary"):
        Engine(tiny_pair["target"], reduced_same).decode(ids(tokenizer), DecodeConfig("sd", draft_vocab=10_000))


@pytest.mark.parametrize(
    "settings, message",
    [
        (dict(drafter="nope"), "unknown drafter 'nope'; choose one of: model, ngram, hybrid"),
        (dict(drafter="ngram", ngram_min=3, ngram_max=2), r"ngram_min \(3\) must not exceed ngram_max \(2\)"),
        (dict(drafter="ngram", ngram_min=0), "ngram_min .* must be an integer >= 1"),
        (dict(drafter="ngram", ngram_max=0), "ngram_max .* must be an integer >= 1"),
        (dict(draft_vocab=1), "draft_vocab .* must be an integer >= 2"),
        (dict(drafter="ngram", ngram_gamma=0), "ngram_gamma .* must be an integer >= 1"),
        (dict(drafter="hybrid", ngram_gamma=2.5), "ngram_gamma .* must be an integer >= 1"),
        (dict(drafter="hybrid", hybrid_catchup=-1.0), "hybrid_catchup .* must be a number >= 0"),
        (dict(drafter="hybrid", hybrid_catchup=float("nan")), "hybrid_catchup .* must be a number >= 0"),
        (dict(draft_vocab=1.5), "draft_vocab .* must be an integer >= 2"),
        (dict(drafter="ngram", draft_vocab=64), "draft model's head, which method 'sd' with drafter 'ngram'"),
        (dict(method="ar", drafter="ngram"), "method 'ar' takes no drafter other than 'model'"),
        (dict(method="sprinter", drafter="hybrid"), "method 'sprinter' takes no drafter other than 'model'"),
        (dict(method="ar", draft_vocab=64), "method 'ar' with drafter 'model' does not use"),
    ],
)
def test_bad_drafter_settings_are_config_errors(settings, message):
    settings = {"method": "sd", **settings}
    with pytest.raises(ConfigError, match=message):
        DecodeConfig(**settings)
