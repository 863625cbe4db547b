"""Measuring a hardware profile: the timing protocol (with a fake clock), tiny real models, random weights, the CLI."""

from __future__ import annotations

import argparse
import json

import pytest
import torch

import verispec.profile as profile_module
from verispec.costmodel import KIND_MEASURED, KIND_MODELLED, HardwareProfile, cost_ratios
from verispec.errors import ConfigError
from verispec.models.fastpath import onednn_available
from verispec.models.protocol import ForwardOutput, ModelDefaults
from verispec.profile import (
    DEFAULT_ARCHITECTURES,
    architecture_config,
    count_params,
    measure_model_cost,
    measure_profile,
    memory_bound_profile,
    random_like,
    register,
)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


class FakeLM(ModelDefaults):
    """A CausalLM whose forward advances a fake clock by 1 + 0.5·k + 0.01·cache + 0.1·n_logits (+100 in the first
    repetition: a warm-up that must be dropped)."""

    name, vocab_size = "fake", 50

    def __init__(self, clock):
        self.clock, self.cache, self.calls, self.resets = clock, 0, [], 0

    @property
    def cache_length(self):
        return self.cache

    def forward(self, tokens, n_logits=1, return_hidden=False, parents=None):
        assert all(0 <= t < self.vocab_size for t in tokens) and parents is None
        self.clock.now += 1 + 0.5 * len(tokens) + 0.01 * self.cache + 0.1 * n_logits + 100 * (self.resets == 1)
        self.calls.append((len(tokens), self.cache, n_logits))
        self.cache += len(tokens)
        return ForwardOutput(logits=torch.zeros(n_logits, self.vocab_size))

    def truncate(self, length):
        self.cache = min(self.cache, length)

    def keep(self, positions):
        raise AssertionError("profiling never keeps a tree path")

    def reset(self):
        self.cache, self.resets = 0, self.resets + 1


def test_measure_model_cost_times_each_forward_at_the_stated_context(monkeypatch):
    clock = Clock()
    monkeypatch.setattr(profile_module, "perf_counter", clock)
    model = FakeLM(clock)
    cost = measure_model_cost(model, ks=[4, 1, 2], context=6, reps=1, slope_context=10)
    assert cost.ks == [1, 2, 4] and cost.context == 6 and cost.logits == "all"
    assert cost.seconds == pytest.approx([1 + 0.6 * k + 0.06 for k in (1, 2, 4)])
    assert (cost.prefill_tokens, cost.prefill_seconds) == (6, pytest.approx(1 + 3 + 0.1))  # warm-up dropped
    assert cost.context_slope == pytest.approx(0.01)  # (t1 at 10 − t1 at 6) / 4
    assert (cost.long_prefill_tokens, cost.long_prefill_seconds) == (24, pytest.approx(1 + 12 + 0.1))  # 4 x context
    timed = [c for c in model.calls if c[1] == 6 and c[0] == c[2]]  # k tokens after 6, k logits rows
    assert len(timed) == 2 * 3 and model.cache_length == 0  # 2 reps (one warm-up) of 3 ks; left empty
    last = measure_model_cost(FakeLM(clock), ks=[1, 3], context=4, reps=1, all_logits=False, slope_context=0)
    assert last.seconds == pytest.approx([1 + 0.5 + 0.04 + 0.1, 1 + 1.5 + 0.04 + 0.1]) and last.context_slope == 0
    with pytest.raises(ConfigError, match="must exceed context"):
        measure_model_cost(FakeLM(clock), ks=[1], context=4, reps=1, slope_context=3)
    with pytest.raises(ConfigError, match="long_prefill .3. must exceed context"):
        measure_model_cost(FakeLM(clock), ks=[1], context=4, reps=1, long_prefill=3)
    assert measure_model_cost(FakeLM(clock), ks=[1], context=4, reps=1, long_prefill=0).long_prefill_tokens == 0


def test_measure_profile_on_a_tiny_model_reads_its_forwards_and_overheads(tiny_pair, tmp_path, monkeypatch):
    """The real tiny model runs through the protocol while a fake clock charges each forward 1 + 0.5·k + 0.01·cache
    and each draft sample 0.3, each verification 0.1 + 0.05 per p row: every figure of the profile is then known."""
    import verispec.engine as engine_module

    clock = Clock()
    monkeypatch.setattr(profile_module, "perf_counter", clock)
    model = tiny_pair["target"]
    forward, verify_paths, sample = model.forward, engine_module.verify_paths, profile_module.sample

    def timed_forward(tokens, n_logits=1, return_hidden=False, parents=None):
        clock.now += 1 + 0.5 * len(tokens) + 0.01 * model.cache_length
        return forward(tokens, n_logits, return_hidden, parents)

    def timed_verify(method, draft, q, p, generator):  # p: [K, k, V]
        clock.now += 0.1 + 0.05 * p.shape[1]
        return verify_paths(method, draft, q, p, generator)

    def timed_sample(probs, generator):
        clock.now += 0.3
        return sample(probs, generator)

    monkeypatch.setattr(model, "forward", timed_forward)
    monkeypatch.setattr(engine_module, "verify_paths", timed_verify)
    monkeypatch.setattr(profile_module, "sample", timed_sample)
    profile = measure_profile(model, "target", ks=[1, 2, 3], context=4, reps=2)
    cost = profile.models["target"]
    assert list(profile.models) == ["target"] and profile.kind == KIND_MEASURED and cost.name == "tiny-target"
    assert cost.ks == [1, 2, 3] and cost.seconds == pytest.approx([1.54, 2.04, 2.54])  # after 4 cached tokens
    assert [cost.f(k) for k in (1, 2, 3)] == pytest.approx([1.0, 2.04 / 1.54, 2.54 / 1.54])  # t(k) / t(1)
    assert (cost.prefill_tokens, cost.prefill_seconds) == (4, pytest.approx(3.0))  # 4 tokens on an empty cache
    assert cost.context_slope == pytest.approx(0.01)  # t(1) after 8 cached tokens less t(1) after 4, over 4
    assert (cost.long_prefill_tokens, cost.long_prefill_seconds) == (16, pytest.approx(9.0))
    params = sum(p.numel() for p in model.model.parameters())
    assert cost.params == params and cost.streamed_params == params - model.model.get_input_embeddings().weight.numel()
    overheads = profile.overheads
    assert overheads.sample_row == pytest.approx(0.3)
    assert (overheads.verify_round, overheads.verify_row) == (pytest.approx(0.1), pytest.approx(0.05))
    assert model.cache_length == 0
    assert HardwareProfile.load(profile.save(tmp_path / "profile.json")) == profile


def _tiny_config_dir(tmp_path, name, hidden):
    from transformers import Qwen2Config

    config = Qwen2Config(vocab_size=64, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=256,
                         tie_word_embeddings=False)
    folder = tmp_path / name
    config.save_pretrained(folder)
    return folder


def test_random_like_builds_the_architecture_from_a_config_folder(tmp_path):
    folder = _tiny_config_dir(tmp_path, "tiny", 32)
    model = random_like(str(folder), "target", dtype="float32")
    assert model.name.startswith("random:") and model.vocab_size == 64
    assert model.model.config.hidden_size == 32 and model.model.dtype == torch.float32
    logits = model.forward([1, 2, 3], n_logits=3).logits
    assert logits.shape == (3, 64) and torch.isfinite(logits).all() and logits.std() > 0
    # A config.json file works too, and the count excludes the untied input embedding.
    same = random_like(str(folder / "config.json"), "target")
    params, streamed = count_params(same.model)
    assert params == count_params(model.model)[0] and streamed == params - 64 * 32


def test_the_default_architectures_match_the_converted_pair(tmp_path, monkeypatch):
    from verispec.models.default_pair import DEFAULT_PAIR, converted_dir

    on_disk = {role: converted_dir(DEFAULT_PAIR[role]) / "config.json" for role in DEFAULT_PAIR}
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))  # no converted folder: the built-in architectures
    for role, path in on_disk.items():
        config = architecture_config(None, role)
        assert config.hidden_size == DEFAULT_ARCHITECTURES[role]["hidden_size"] and not config.tie_word_embeddings
        if path.is_file():  # the converted pair is present here: the fallback must describe the same model
            stored = json.loads(path.read_text())
            for key in (*DEFAULT_ARCHITECTURES[role], "vocab_size", "tie_word_embeddings"):
                assert getattr(config, key) == stored[key], key


def test_memory_bound_profile_from_configs(tmp_path):
    target, draft = _tiny_config_dir(tmp_path, "t", 64), _tiny_config_dir(tmp_path, "d", 32)
    profile = memory_bound_profile(str(target), str(draft), bytes_per_param=2.0, bandwidth=1e9)
    t, d = profile.models["target"], profile.models["draft"]
    assert profile.kind == KIND_MODELLED and all(t.f(k) == 1.0 for k in range(1, 17))
    assert cost_ratios(profile, 4)[0] == pytest.approx(d.streamed_params / t.streamed_params)
    assert t.context_slope == pytest.approx(2 * 2 * 2 * 16 * 2.0 / 1e9)  # K and V, 2 layers, 2 KV heads of 16


def test_linear_backend_is_applied_after_counting_parameters(tmp_path):
    with pytest.raises(ConfigError, match="unknown linear backend"):
        measure_profile(str(_tiny_config_dir(tmp_path, "x", 32)), random_weights=True, linear_backend="fast")
    plain = measure_profile(str(_tiny_config_dir(tmp_path, "y", 32)), "draft", linear_backend="torch",
                            random_weights=True, ks=[1], context=2, reps=1, overheads=False)
    assert plain.models["draft"].linear_backend == "torch"
    if not onednn_available():
        pytest.skip("this torch build has no oneDNN linear ops")
    folder = _tiny_config_dir(tmp_path, "tiny", 32)
    profile = measure_profile(str(folder), "draft", linear_backend="onednn", random_weights=True, ks=[1, 2],
                              context=3, reps=1, overheads=False)
    cost = profile.models["draft"]
    assert cost.linear_backend == "onednn" and cost.logits == "last"
    assert cost.params == count_params(random_like(str(folder)).model)[0]  # counted before packing hid the weights


def _run(argv):
    parser = argparse.ArgumentParser(prog="verispec")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    return args.func(args)


def test_profile_cli_with_random_weights_end_to_end(tmp_path, capsys):
    target, draft = _tiny_config_dir(tmp_path, "t", 32), _tiny_config_dir(tmp_path, "d", 16)
    out = tmp_path / "out" / "profile.json"
    assert _run(["profile", "--random-weights", "--target", str(target), "--draft", str(draft), "--ks", "1", "2",
                 "4", "--context", "4", "--reps", "1", "--out", str(out)]) == 0
    profile = HardwareProfile.load(out)
    assert set(profile.models) == {"target", "draft"} and profile.models["draft"].ks == [1, 2, 4]
    assert "random weights" in profile.description and profile.sampling == {"temperature": 0.0, "top_k": 0,
                                                                            "top_p": 1.0}
    printed = capsys.readouterr().out
    assert "c (draft/target 1-token cost)" in printed and f"profile: {out}" in printed
    accel = tmp_path / "accel.json"
    assert _run(["profile", "--memory-bound", "--target", str(target), "--draft", str(draft), "--out",
                 str(accel)]) == 0
    assert HardwareProfile.load(accel).kind == KIND_MODELLED
