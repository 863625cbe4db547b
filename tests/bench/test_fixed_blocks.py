"""The fixed-block comparison: every verifier's exact E[τ] on the same drafted paths, at contexts along the target's
own continuation; rows checked against an independent computation on exact tabular models."""

from __future__ import annotations

import json

import pytest
import torch

from tests.verify.exact import expected_accepted, paths_inputs
from verispec import Decoder
from verispec.bench.fixed_blocks import (
    SCHEMA,
    FixedBlocksConfig,
    context_positions,
    context_rows,
    render_fixed_blocks,
    run_fixed_blocks,
)
from verispec.cli import build_parser, main
from verispec.drafting import draft_paths
from verispec.errors import ConfigError
from verispec.methods import get_method
from verispec.models.spec import flat_dict
from verispec.models.tabular import TabularLM
from verispec.options import config_from_args
from verispec.prompt_sets import Prompt
from verispec.verify import block_verify_law, gbv_verify_law

PROMPTS = [Prompt("a", "def add(a, b):", "code"), Prompt("b", "hello there", "chat")]


def test_rows_are_each_verifiers_expectation_on_the_paths_drawn():
    # Replays the draws and recomputes every row from the tabular models' exact conditionals: a path whose target
    # rows were laid out wrongly (tree order, prefix sharing, the γ-prefix slices) would not match.
    target, draft = TabularLM(5, seed=1), TabularLM(5, seed=2, sharpness=2.0)
    config = FixedBlocksConfig(methods=["sd", "bv", "gbv", "specinfer", "spectr"], gammas=[2, 3], paths=[2, 3],
                               draws=6, temperature=1.0)
    context = [0, 1, 2]
    rows, drafted = context_rows(target, draft, context, config, torch.Generator().manual_seed(5), frozenset())
    assert drafted == 3 and draft.cache_length == target.cache_length == len(context) - 1
    replay = draft_paths(draft, context, 6, 3, config.sampling(), torch.Generator().manual_seed(5), frozenset(), 5)
    paths = tuple(tuple(path) for path in replay.tokens)
    assert len(set(paths)) > 1
    tokens, q, p = paths_inputs(target, draft, context, paths)  # [6, 3], [6, 3, V], [6, 4, V], exact
    assert [(r["method"], r["gamma"], r["paths"]) for r in rows] == [
        (name, gamma, k) for gamma in (2, 3) for name in config.methods
        for k in ((2, 3) if get_method(name).multipath else (1,))
    ]
    for row in rows:
        method, gamma, k = get_method(row["method"]), row["gamma"], row["paths"]
        if method.multipath:
            values = [method.expected_accepted(tokens[j:j + k, :gamma], q[j:j + k, :gamma], p[j:j + k, :gamma + 1])
                      for j in range(0, 6, k)]
        else:
            values = [method.expected_accepted(tokens[j, :gamma], q[j, :gamma], p[j, :gamma + 1]) for j in range(6)]
        assert row["groups"] == len(values)
        # The models' logits are float32; a misplaced row would be off by far more than their rounding.
        assert row["expected_accepted"] == pytest.approx(sum(values) / len(values), abs=1e-6)


def test_the_mean_over_contexts_converges_to_the_exact_expectation():
    # Averaged over many independent draws at one context, a row estimates E over the draft's paths of E[τ | paths]:
    # here against full enumeration of the 5^2 blocks (BV, γ = 2) and of the 25^2 pairs of blocks (GBV, K = 2).
    target, draft = TabularLM(5, seed=3), TabularLM(5, seed=4, sharpness=2.0)
    config = FixedBlocksConfig(methods=["bv", "gbv"], gammas=[2], paths=[2], draws=8, temperature=1.0)
    context, generator = [4, 2], torch.Generator().manual_seed(0)
    estimates: dict[str, list[float]] = {"bv": [], "gbv": []}
    for _ in range(150):
        rows, _ = context_rows(target, draft, context, config, generator, frozenset())
        for row in rows:
            estimates[row["method"]].append(row["expected_accepted"])
    for name, law, k in (("bv", block_verify_law, None), ("gbv", gbv_verify_law, 2)):
        exact = expected_accepted(law, target, draft, context, 2, k)
        values = torch.tensor(estimates[name])
        assert abs(float(values.mean()) - exact) < 5 * float(values.std()) / len(values) ** 0.5


def test_context_positions_stop_before_the_end_and_never_follow_an_eos():
    config = FixedBlocksConfig(contexts=4, stride=10)
    assert context_positions(31, False, config) == [0, 10, 20, 30]
    assert context_positions(30, False, config) == [0, 10, 20, 30]  # the context is the whole continuation
    assert context_positions(30, True, config) == [0, 10, 20]  # ... unless its last token is an EOS
    assert context_positions(1, True, config) == [0]  # the prompt alone: its next token (the EOS) is a prediction


@pytest.mark.parametrize("settings,message", [
    ({"draws": 10, "paths": [2, 3]}, "multiple of every K"),
    ({"methods": ["sd", "ar"]}, "no exact per-block law"),
    ({"methods": ["sprinter"]}, "no exact per-block law"),
    ({"methods": ["bv", "bv"]}, "without repeats"),
    ({"methods": ["beam"]}, "unknown method"),
    ({"gammas": []}, "gammas"),
    ({"gammas": [0]}, "gammas"),
    ({"contexts": 0}, "contexts"),
    ({"stride": 0}, "stride"),
    ({"temperature": -1.0}, "temperature"),
])
def test_bad_settings_are_clear_errors(settings, message):
    with pytest.raises(ConfigError, match=message):
        FixedBlocksConfig(**settings)


def test_draws_need_not_divide_k_without_multi_path_methods():
    FixedBlocksConfig(methods=["sd", "bv"], draws=5, paths=[2, 3])


@pytest.fixture(scope="module")
def tiny_results(tiny_pair, tmp_path_factory, one_thread):
    decoder = Decoder(tiny_pair["target"], tiny_pair["partial"])
    out = tmp_path_factory.mktemp("fixed") / "fixed.json"
    config = FixedBlocksConfig(methods=["sd", "bv", "gbv", "nss"], gammas=[2, 3], paths=[2, 4], draws=4, contexts=2,
                               stride=3, temperature=1.0, bootstrap_resamples=200)
    return config, run_fixed_blocks(config, out, progress=False, decoder=decoder, prompts=PROMPTS), out


def test_on_tiny_models_every_context_gets_every_configuration(tiny_results):
    config, results, out = tiny_results
    assert json.loads(out.read_text()) == json.loads(json.dumps(results))
    assert results["schema"] == SCHEMA and results["config"] == flat_dict(config)
    contexts = results["contexts"]
    assert 1 <= len(contexts) <= 4 and {c["prompt_id"] for c in contexts} <= {"a", "b"}
    assert len(results["rows"]) == len(contexts) * len(config.labels())
    for row in results["rows"]:
        assert 0.0 <= row["expected_accepted"] <= row["drafted"] <= row["gamma"]
    summary = {row["label"]: row for row in results["summary"]}
    assert set(summary) == {label for label, *_ in config.labels()}
    for gamma in config.gammas:
        assert summary[f"bv:gamma={gamma}"]["vs_bv"] == pytest.approx(1.0)
        assert summary[f"sd:gamma={gamma}"]["vs_sd"] == pytest.approx(1.0)
        gbv, bv = summary[f"gbv:paths=2,gamma={gamma}"], summary[f"bv:gamma={gamma}"]
        # Both ran on the same contexts, so the paired ratio is the ratio of their block efficiencies.
        assert gbv["vs_bv"] == pytest.approx(gbv["block_efficiency"] / bv["block_efficiency"])
    table = render_fixed_blocks(results)
    assert "| gbv | 3 | 4 |" in table and "vs bv, same γ" in table


def test_greedy_every_lossless_verifier_accepts_the_same(tiny_pair, one_thread):
    # Temperature 0: q and p are point masses, so every lossless verifier keeps the longest prefix on which the
    # draft's and the target's argmaxes agree: one number per context and γ, whatever the method.
    decoder = Decoder(tiny_pair["target"], tiny_pair["partial"])
    config = FixedBlocksConfig(methods=["sd", "bv", "gbv", "specinfer", "spectr"], gammas=[3], paths=[2],
                               draws=2, contexts=2, stride=2, temperature=0.0, bootstrap_resamples=50)
    results = run_fixed_blocks(config, None, progress=False, decoder=decoder, prompts=PROMPTS[:1])
    by_context: dict[int, set[float]] = {}
    for row in results["rows"]:
        by_context.setdefault(row["position"], set()).add(round(row["expected_accepted"], 12))
    assert by_context and all(len(values) == 1 for values in by_context.values())


def test_cli_defaults_are_the_configs_and_bad_input_is_one_line(capsys):
    args = build_parser().parse_args(["fixed-blocks"])
    assert config_from_args(FixedBlocksConfig, args) == FixedBlocksConfig()
    args = build_parser().parse_args(["fixed-blocks", "--methods", "bv", "gbv", "sd", "--gammas", "2", "4",
                                      "--paths", "2", "3", "--draws", "6", "--temperature", "0.6"])
    config = config_from_args(FixedBlocksConfig, args)
    assert config.temperature == 0.6 and config.draws == 6
    assert [label for label, *_ in config.labels()] == [  # single-path methods once per γ, GBV per (K, γ)
        "bv:gamma=2", "gbv:paths=2,gamma=2", "gbv:paths=3,gamma=2", "sd:gamma=2",
        "bv:gamma=4", "gbv:paths=2,gamma=4", "gbv:paths=3,gamma=4", "sd:gamma=4"]
    assert main(["fixed-blocks", "--draws", "5"]) == 2
    assert "multiple of every K" in capsys.readouterr().err
