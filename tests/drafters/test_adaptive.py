"""The adaptive draft length: each round's γ from the recent acceptance and a round's cost; every single-path
verifier stays lossless (docs/algorithms.md §1.4 "Variable γ")."""

from __future__ import annotations

import argparse
from collections import Counter

import pytest

from tests.stats import FALSE_ALARM, chi_square_pvalue, target_law
from verispec.drafters.adaptive import INT4_COSTS, AdaptiveGamma, RoundCosts, best_gamma, expected_tokens
from verispec.engine import DecodeConfig, Engine
from verispec.errors import ConfigError
from verispec.models.tabular import TabularLM
from verispec.sampling import SamplingConfig

T1 = SamplingConfig(temperature=1.0)


def test_expected_tokens_is_the_geometric_sum():
    assert expected_tokens(0.5, 0) == 1.0
    assert expected_tokens(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    assert expected_tokens(1.0, 4) == 5.0


def test_the_length_grows_with_acceptance_and_is_zero_where_drafting_cannot_pay():
    lengths = [best_gamma(alpha / 20, 8) for alpha in range(20)]
    assert lengths == sorted(lengths)  # never shorter for a higher acceptance
    assert lengths[0] == 0 and best_gamma(0.3, 8) == 0  # a draft accepted this rarely costs more than it saves
    assert best_gamma(0.95, 8) >= 4
    assert best_gamma(0.99, 3) == 3  # capped at the maximum
    free_target = RoundCosts(draft=0.0, target=(1.0, 1.0))  # rows cost nothing, drafts cost nothing: draft all
    assert best_gamma(0.2, 6, free_target) == 6


def test_costs_extend_past_the_table():
    costs = RoundCosts(draft=0.5, target=(1.0, 1.5))
    assert costs.target_pass(4) == pytest.approx(2.5)
    assert INT4_COSTS.target_pass(13) > INT4_COSTS.target_pass(12)


def test_under_load_the_length_shortens_and_alone_it_is_unchanged():
    alphas = [a / 20 for a in range(20)]
    assert all(best_gamma(a, 8, sequences=1) == best_gamma(a, 8) for a in alphas)
    for alpha in alphas:  # never longer at 8 or 16 sequences than alone or at 4
        lengths = [best_gamma(alpha, 8, sequences=n) for n in (1, 4, 8, 16)]
        assert lengths[0] >= max(lengths[1:]) and lengths[1] >= lengths[3] and lengths[2] >= lengths[3]
    assert sum(best_gamma(a, 8, sequences=16) for a in alphas) < sum(best_gamma(a, 8, sequences=4) for a in alphas)
    assert best_gamma(0.7, 8, sequences=4) == 0 < best_gamma(0.7, 8)  # a plain step pays more at 4 sequences
    assert best_gamma(0.95, 8, sequences=4) > 0  # a draft accepted this often still pays
    flat = RoundCosts(draft=0.36, target=(1.0, 1.0))  # rows cost nothing: the load changes nothing
    assert all(best_gamma(a, 8, flat, sequences=8) == best_gamma(a, 8, flat) for a in alphas)
    assert INT4_COSTS.draft_pass(1) == INT4_COSTS.draft and INT4_COSTS.draft_pass(20) > INT4_COSTS.draft_pass(9)


def test_a_decode_under_load_drafts_less_and_at_t0_writes_the_same_tokens(tiny_pair, tokenizer):
    ids = tokenizer.encode("the quick brown fox")
    config = DecodeConfig("sd", gamma=6, max_new_tokens=40, drafter="model", adaptive_gamma=True)
    alone = Engine(tiny_pair["target"], tiny_pair["same"]).decode(ids, config)
    loaded = Engine(tiny_pair["target"], tiny_pair["same"], load=lambda: 16).decode(ids, config)
    assert loaded.tokens == alone.tokens
    assert sum(r.model_gamma for r in loaded.trace.rounds) < sum(r.model_gamma for r in alone.trace.rounds)


def test_the_estimate_follows_the_rounds_and_drifts_back_to_the_prior_while_idle():
    rule = AdaptiveGamma(6)
    first = rule.next()
    for _ in range(10):
        rule.observe("model", 4, 4)  # every token accepted
    assert rule.alpha > 0.9 and rule.next() > first
    for _ in range(25):
        rule.observe("model", 4, 0)  # every first token rejected
    assert rule.alpha < 0.3 and rule.next() == 0
    for _ in range(30):
        rule.observe("none", 0, 0)  # plain steps: nothing learnt, the counts decay
    assert rule.next() == first  # back at the prior: the draft is tried again
    rule.observe("model", 3, 1)
    lookup, plain = AdaptiveGamma(6), AdaptiveGamma(6)
    lookup.__dict__.update(rule.__dict__)
    plain.__dict__.update(rule.__dict__)
    lookup.observe("ngram", 4, 0)  # a lookup round's odds are not the draft model's: it counts as a plain step
    plain.observe("none", 0, 0)
    assert lookup.alpha == plain.alpha != rule.alpha
    assert lookup.lookup_alpha < plain.lookup_alpha  # it informs the lookup rounds' own estimate


def test_lookup_rounds_draft_what_their_acceptance_pays_for_alone_and_under_load():
    load = [1]
    rule = AdaptiveGamma(4, sequences=lambda: load[0], lookup_max=16)
    for _ in range(10):
        rule.observe("ngram", 4, 0)  # every lookup round rejected at once
    assert rule.lookup_next() == 4  # alone, never shorter than the model's most: no draft forward to pay for
    load[0] = 16
    assert rule.lookup_next() == 0  # under load its rows cost the batched pass: a plain step pays more
    for _ in range(20):
        rule.observe("ngram", 16, 16)  # every lookup token accepted
    load[0] = 1
    alone = rule.lookup_next()
    assert alone > 4  # past the model's most: a lookup round has its own, and costs no draft forward
    load[0] = 16
    assert 0 < rule.lookup_next() < alone  # a lookup accepted this often still pays under load, shorter
    assert AdaptiveGamma(4).lookup_max == 4  # no lookup maximum of its own: the model's


def test_a_capped_lookup_round_drafts_fewer_tokens(tiny_pair, tokenizer):
    ids = tokenizer.encode("a b c d e f a b c d e f a b c d e f a b")
    config = DecodeConfig("sd", gamma=4, max_new_tokens=30, drafter="hybrid", adaptive_gamma=True)
    alone = Engine(tiny_pair["target"], tiny_pair["same"]).decode(ids, config)
    loaded = Engine(tiny_pair["target"], tiny_pair["same"], load=lambda: 64).decode(ids, config)
    assert loaded.tokens == alone.tokens  # T = 0: the lengths change no token
    lookups = [r.drafted for r in alone.trace.rounds if r.drafter == "ngram"]
    assert lookups and sum(r.drafted for r in loaded.trace.rounds if r.drafter == "ngram") < sum(lookups)


@pytest.mark.parametrize("method", ["sd", "bv"])
def test_the_loop_keeps_the_target_law_with_adaptive_lengths(method):
    """Monte-Carlo through the decode loop on tabular models: 6,000 runs of 4 tokens, chi-square at FALSE_ALARM."""
    target, draft = TabularLM(3, seed=51), TabularLM(3, seed=52, sharpness=2.0)
    engine = Engine(target, draft)
    config = DecodeConfig(method, 3, 4, T1, drafter="model", adaptive_gamma=True)
    counts, lengths = Counter(), Counter()
    for s in range(6000):
        out = engine.decode([0], config.with_settings(seed=s))
        counts[tuple(out.tokens)] += 1
        lengths.update(r.model_gamma for r in out.trace.rounds)
    assert len(lengths) > 1 and None not in lengths  # rounds of several chosen lengths were verified
    assert chi_square_pvalue(counts, target_law(target, [0], 4)) > FALSE_ALARM


def test_a_seed_gives_the_same_tokens_and_lengths(tiny_pair, tokenizer):
    engine = Engine(tiny_pair["target"], tiny_pair["partial"])
    ids = tokenizer.encode("the quick brown fox")
    config = DecodeConfig("sd", gamma=6, max_new_tokens=40, sampling=T1, seed=3, adaptive_gamma=True)
    first, second = engine.decode(ids, config), engine.decode(ids, config)
    assert first.tokens == second.tokens
    assert [r.model_gamma for r in first.trace.rounds] == [r.model_gamma for r in second.trace.rounds]
    assert all(r.drafted <= r.model_gamma for r in first.trace.rounds if r.drafter == "model")


def test_greedy_adaptive_decoding_writes_the_targets_greedy_tokens(tiny_pair, tokenizer):
    engine = Engine(tiny_pair["target"], tiny_pair["partial"])
    ids = tokenizer.encode("the quick brown fox")
    ar = engine.decode(ids, DecodeConfig("ar", max_new_tokens=40))
    for drafter in ("model", "hybrid"):
        sd = engine.decode(ids, DecodeConfig("sd", gamma=6, max_new_tokens=40, drafter=drafter, adaptive_gamma=True))
        assert sd.tokens == ar.tokens


@pytest.mark.parametrize("settings", [{"method": "gbv"}, {"method": "ar"}, {"method": "sprinter"},
                                      {"method": "typical"}, {"adaptive_gamma": "yes"}])
def test_methods_without_a_single_path_length_refuse_it(settings):
    with pytest.raises(ConfigError, match="adaptive_gamma"):
        DecodeConfig(**({"adaptive_gamma": True} | settings))


def test_the_command_line_and_bench_variants_take_it():
    from verispec.options import add_decode_options, decode_config
    from verispec.variants import parse_method

    parser = argparse.ArgumentParser()
    add_decode_options(parser)
    assert decode_config(parser.parse_args(["--adaptive-gamma"])).adaptive_gamma is True
    assert decode_config(parser.parse_args(["--no-adaptive-gamma"])).adaptive_gamma is False
    assert parse_method("sd:adaptive_gamma=true", {"sd"}).overrides == {"adaptive_gamma": True}
    with pytest.raises(ConfigError, match="bad value"):
        parse_method("sd:adaptive_gamma=maybe", {"sd"})
