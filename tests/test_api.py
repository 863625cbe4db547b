"""The public API and its errors: every bad input gets a clear, specific error."""

from __future__ import annotations

import pytest
import torch

from verispec import DecodeConfig, Decoder, SamplingConfig, generate
from verispec.api import check_compatible
from verispec.config import MULTIPATH_PATHS
from verispec.errors import ConfigError, IncompatibleModelsError
from verispec.models.hf import HFCausalLM
from verispec.models.quantized import quantized_engine
from verispec.models.tiny import TINY_CHARS, tiny_qwen2, tiny_tokenizer


@pytest.fixture(scope="module")
def decoder(tiny_pair):
    return Decoder(tiny_pair["target"], tiny_pair["partial"])


def test_generate_returns_text_tokens_and_trace(decoder):
    gen = decoder.generate("def add(a, b):", method="sd", gamma=3, max_new_tokens=12)
    assert gen.trace.generated == len(gen.tokens)
    # Either the budget was used exactly, or the tokenizer's EOS ended the output (and is its last token).
    assert len(gen.tokens) == 12 or (gen.stopped_at_eos and gen.tokens[-1] == decoder.tokenizer.eos_token_id)
    assert gen.text == decoder.tokenizer.decode(gen.tokens, skip_special_tokens=True)
    data = gen.to_dict()
    assert data["config"]["gamma"] == 3 and data["trace"]["target_calls"] == gen.trace.target_calls


def test_greedy_api_sd_equals_ar(decoder):
    ar = decoder.generate("hello there", method="ar", max_new_tokens=20)
    sd = decoder.generate("hello there", method="sd", gamma=5, max_new_tokens=20)
    assert sd.tokens == ar.tokens


def test_prompt_without_chat_template_is_raw_text(decoder):
    assert decoder.encode_prompt("abc") == decoder.tokenizer("abc", add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"prompt": ""}, "prompt is empty"),
        ({"prompt": "   \n"}, "prompt is empty"),
        ({"gamma": 0}, "gamma"),
        ({"gamma": -2}, "gamma"),
        ({"temperature": -0.5}, "temperature"),
        ({"temperature": float("nan")}, "temperature"),
        ({"top_p": 0.0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"method": "beam"}, "unknown method 'beam'"),
    ],
)
def test_bad_arguments_raise_config_errors(decoder, kwargs, message):
    kwargs = {"prompt": "hi"} | kwargs
    with pytest.raises(ConfigError, match=message):
        decoder.generate(kwargs.pop("prompt"), **kwargs)


def test_unknown_setting_is_a_config_error_naming_it_and_the_valid_ones(decoder):
    with pytest.raises(ConfigError, match=r"unknown decode setting\(s\) gama;.*gamma.*typical_epsilon.*temperature"):
        decoder.generate("hi", gama=3)
    with pytest.raises(ConfigError, match="unknown decode setting"):
        generate("hi", temprature=0.5)  # refused before any model loads


def test_a_config_that_is_not_a_decode_config_is_refused(decoder):
    with pytest.raises(ConfigError, match="config must be a DecodeConfig"):
        decoder.generate("hi", "sd")


def test_config_and_settings_combine(decoder):
    base = DecodeConfig(method="sd", gamma=2, max_new_tokens=10, seed=5)
    gen = decoder.generate("def f(x):", base, temperature=0.7, gamma=3, chat_template=False)
    assert gen.config == DecodeConfig(method="sd", gamma=3, max_new_tokens=10, seed=5,
                                      sampling=SamplingConfig(temperature=0.7))
    same = decoder.generate("def f(x):", gen.config, chat_template=False)
    assert same.tokens == gen.tokens  # the settings became the config the decode ran with
    by_keywords = decoder.generate("def f(x):", method="sd", gamma=3, max_new_tokens=10, seed=5, temperature=0.7,
                                   chat_template=False)
    assert by_keywords.tokens == gen.tokens


def test_with_settings_merges_sampling_and_resets_paths_for_another_method():
    base = DecodeConfig(method="sd", sampling=SamplingConfig(temperature=1.0, top_k=5))
    changed = base.with_settings(top_p=0.5, method="gbv")
    assert changed.sampling == SamplingConfig(temperature=1.0, top_k=5, top_p=0.5)
    assert changed.paths == MULTIPATH_PATHS  # sd's K = 1 does not carry over to a multi-path method
    assert base.with_settings(method="gbv", paths=2).paths == 2
    assert base.with_settings() is base
    assert base.with_settings(typical_epsilon=0.2).typical_epsilon == 0.2
    with pytest.raises(ConfigError, match="unknown decode setting"):
        base.with_settings(knobs={"typical_epsilon": 0.2})


def test_generate_takes_the_models_as_a_spec_or_by_name_and_keeps_them_loaded(tiny_pair, monkeypatch):
    from verispec import ModelSpec, api

    monkeypatch.setattr(api, "_DECODERS", {})
    spec = ModelSpec(tiny_pair["target"], tiny_pair["partial"])
    settings = {"method": "sd", "gamma": 3, "max_new_tokens": 6, "chat_template": False}
    by_spec = generate("hello", models=spec, **settings)
    by_name = generate("hello", target=tiny_pair["target"], draft=tiny_pair["partial"], **settings)
    assert by_spec.tokens == by_name.tokens and list(api._DECODERS) == [spec]  # one pair loaded, reused
    with pytest.raises(ConfigError, match="unknown dtype") as caught:
        generate("hello", models=spec, dtype="int3", **settings)
    assert caught.value.field == "dtype"


def test_different_vocabulary_sizes_are_rejected(tiny_pair):
    other = tiny_tokenizer(TINY_CHARS + "XYZ")
    bigger = HFCausalLM(tiny_qwen2(len(other), seed=4), other, name="bigger")
    with pytest.raises(IncompatibleModelsError, match="different vocabularies"):
        Decoder(tiny_pair["target"], bigger)


def test_different_tokenizers_of_the_same_size_are_rejected(tiny_pair):
    shuffled = tiny_tokenizer(TINY_CHARS[::-1])  # same size, different token-to-id map
    drafter = HFCausalLM(tiny_qwen2(len(shuffled), seed=4), shuffled, name="shuffled")
    with pytest.raises(IncompatibleModelsError, match="different tokenizers"):
        check_compatible(tiny_pair["target"], drafter)


def test_bad_dtype_is_rejected_before_loading():
    with pytest.raises(ConfigError, match="dtype"):
        Decoder("some/model", dtype="int3")


def saved_pair(tiny_pair, tmp_path):
    """Save the tiny target and partly agreeing draft as model folders; return {"target": path, "partial": path}."""
    folders = {}
    for role in ("target", "partial"):
        folders[role] = tmp_path / role
        tiny_pair[role].model.save_pretrained(folders[role])
        tiny_pair[role].tokenizer.save_pretrained(folders[role])
    return folders


def test_draft_dtype_loads_a_cheaper_draft_and_stays_lossless(tiny_pair, tmp_path):
    folders = saved_pair(tiny_pair, tmp_path)
    mixed = Decoder(str(folders["target"]), str(folders["partial"]), draft_dtype="bfloat16", linear_backend="torch")
    assert next(mixed.model("draft").model.parameters()).dtype == torch.bfloat16
    assert next(mixed.model("target").model.parameters()).dtype == torch.float32
    ar = mixed.generate("def f(x):", method="ar", max_new_tokens=12, chat_template=False)
    # the model drafter at a fixed γ, so that every round drafts (the adaptive γ may choose plain steps here)
    sd = mixed.generate("def f(x):", method="sd", gamma=3, max_new_tokens=12, chat_template=False, drafter="model",
                        adaptive_gamma=False)
    assert sd.tokens == ar.tokens  # greedy: the target decides every token, whatever the draft's precision
    # The bfloat16 draft really drafted: one forward per drafted position, every round but a last 1-token one.
    assert sd.trace.draft_calls == sum(r.drafted for r in sd.trace.rounds) >= len(sd.trace.rounds) - 1
    with pytest.raises(ConfigError, match="dtype"):
        Decoder("some/model", draft_dtype="int3")


def test_the_recorded_linear_backend_is_the_one_in_use(tiny_pair, tmp_path, monkeypatch):
    from verispec.models import fastpath, loading

    folder = tmp_path / "target"
    tiny_pair["target"].model.save_pretrained(folder)
    tiny_pair["target"].tokenizer.save_pretrained(folder)
    assert loading.load_model(str(folder), "target", linear_backend="torch").linear_backend == "torch"
    # Where oneDNN cannot pack the linears (no oneDNN here, or a CUDA device), the model runs transformers' own
    # kernels, and the record, which goes into every profile and results file, must say so.
    monkeypatch.setattr(fastpath, "onednn_available", lambda: False)
    assert loading.load_model(str(folder), "target", linear_backend="onednn").linear_backend == "torch"


@pytest.mark.skipif(quantized_engine() is None, reason="this torch build has no fbgemm engine")
def test_an_int4_target_gets_a_4bit_draft_unless_told_otherwise(tiny_pair, tmp_path):
    folders = saved_pair(tiny_pair, tmp_path)
    pair = Decoder(str(folders["target"]), str(folders["partial"]), linear_backend="int4")
    assert pair.models.linear_backend_of("draft") == "int4-rounded"
    assert pair.model("target").linear_backend == "int4" and pair.model("draft").linear_backend == "int4-rounded"
    ar = pair.generate("def f(x):", method="ar", max_new_tokens=12, chat_template=False)
    sd = pair.generate("def f(x):", method="sd", gamma=3, max_new_tokens=12, chat_template=False)
    assert sd.tokens == ar.tokens
    as_given = Decoder(str(folders["target"]), str(folders["partial"]), linear_backend="int4",
                       draft_linear_backend="int4")
    assert as_given.model("draft").linear_backend == "int4"
    assert Decoder(linear_backend="int8").models.linear_backend_of("draft") == "int8"
    with pytest.raises(ConfigError, match="linear backend 'int3'"):
        Decoder("some/model", draft_linear_backend="int3")
