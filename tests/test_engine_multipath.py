"""Block and multi-path methods in the decode loop: greedy equivalence, the full loop's law, tree rollback."""

from __future__ import annotations

import pytest

from tests.stats import FALSE_ALARM, chi_square_pvalue, decode_counts, target_law
from verispec.engine import DecodeConfig, Engine
from verispec.errors import ConfigError
from verispec.models.tabular import TabularLM
from verispec.sampling import SamplingConfig, process_logits

MULTIPATH = ["gbv", "specinfer", "spectr", "nss", "traversal"]
PROMPT = "def add(a, b):\n    return"


@pytest.mark.parametrize("method", ["bv", *MULTIPATH])
@pytest.mark.parametrize("drafter", ["same", "partial", "unrelated"])
def test_greedy_methods_equal_ar(tiny_pair, tokenizer, method, drafter):
    prompt = tokenizer(PROMPT)["input_ids"]
    engine = Engine(tiny_pair["target"], tiny_pair[drafter])
    expected = engine.decode(prompt, DecodeConfig("ar", max_new_tokens=30)).tokens
    paths = 1 if method == "bv" else 3
    out = engine.decode(prompt, DecodeConfig(method, gamma=4, max_new_tokens=30, paths=paths))
    assert out.tokens == expected
    assert len(out.tokens) == 30


@pytest.mark.parametrize("method", MULTIPATH)
def test_sampled_multipath_decoding_runs_and_keeps_exact_caches(tiny_pair, tokenizer, method):
    """At temperature 1 the K paths differ, so rollback must keep one tree path; a wrong cache would show as
    logits that no longer match a fresh forward. Checked through the trace: every round verified a real tree."""
    prompt = tokenizer(PROMPT)["input_ids"]
    engine = Engine(tiny_pair["target"], tiny_pair["partial"])
    config = DecodeConfig(method, gamma=3, max_new_tokens=40, paths=3, sampling=SamplingConfig(temperature=1.0))
    out = engine.decode(prompt, config)
    assert len(out.tokens) == 40
    assert any(r.tree_nodes > r.drafted for r in out.trace.rounds)  # the paths really branched
    target = tiny_pair["target"]
    assert target.cache_length <= len(prompt) + len(out.tokens)
    # The cache the engine left must equal a fresh forward over the committed tokens it holds.
    held = (prompt + out.tokens)[: target.cache_length]
    cached = target.forward([out.tokens[-1]], n_logits=1).logits
    target.reset()
    fresh = target.forward(held + [out.tokens[-1]], n_logits=1).logits
    assert (cached - fresh).abs().max() < 1e-9


@pytest.mark.parametrize("method", ["bv", "gbv", "specinfer"])
def test_full_loop_law_of_block_and_multipath_methods(method):
    """Monte-Carlo through the decode loop on tabular models: 6,000 runs of 3 tokens, chi-square at 1e-6."""
    target, draft = TabularLM(3, seed=51), TabularLM(3, seed=52, sharpness=2.0)
    engine = Engine(target, draft)
    paths = 1 if method == "bv" else 2
    sampling = SamplingConfig(temperature=1.0)
    counts = decode_counts(engine, DecodeConfig(method, 2, 3, sampling, paths=paths), 6000)
    assert chi_square_pvalue(counts, target_law(target, [0], 3)) > FALSE_ALARM


def test_single_path_methods_refuse_several_paths():
    with pytest.raises(ConfigError, match="single path"):
        DecodeConfig("sd", paths=2)


def test_eos_inside_a_multipath_block(tiny_pair, tokenizer):
    prompt = tokenizer(PROMPT)["input_ids"]
    reference = Engine(tiny_pair["target"]).decode(prompt, DecodeConfig("ar", max_new_tokens=30)).tokens
    position = next(i for i, t in enumerate(reference) if i >= 2 and t not in reference[:i])
    engine = Engine(tiny_pair["target"], tiny_pair["same"], eos_token_ids=[reference[position]])
    out = engine.decode(prompt, DecodeConfig("gbv", gamma=4, max_new_tokens=30, paths=2))
    assert out.tokens == reference[: position + 1] and out.stopped_at_eos


def test_a_gbv_round_processes_only_the_rows_of_the_path_it_selects(tiny_pair, tokenizer, monkeypatch):
    """GBV reads p through `PathLaws`: per round the target's logits of the selected path's γ'+1 nodes are turned
    into laws, not those of the whole tree (the other paths' nodes)."""
    import verispec.scoring as scoring_module

    processed: list[int] = []

    def counting(logits, sampling, out=None):
        processed.append(logits.shape[0])
        return process_logits(logits, sampling, out)

    monkeypatch.setattr(scoring_module, "process_logits", counting)
    prompt = tokenizer(PROMPT)["input_ids"]
    engine = Engine(tiny_pair["target"], tiny_pair["partial"])
    config = DecodeConfig("gbv", gamma=3, max_new_tokens=40, paths=3, sampling=SamplingConfig(temperature=1.0))
    rounds = engine.decode(prompt, config).trace.rounds
    assert any(r.tree_nodes > r.drafted for r in rounds)  # the paths branched: the tree had rows GBV never read
    assert sum(processed) == sum(r.drafted + 1 for r in rounds)
