"""Every backend against the `CausalLM` protocol: each has every member the protocol names, of the type it states,
so the code above reads them as plain attributes (no backend-specific probing)."""

from __future__ import annotations

import types
import typing
from typing import Any

import pytest
import torch

from tests.models.test_llamacpp_backend import FakeLibrary
from verispec.models import llamacpp, protocol
from verispec.models.batched import ForwardBatcher, SlotLM
from verispec.models.fastpath import LINEAR_BACKENDS, LINEAR_BUILDERS, apply_linear_backend, check_linear_backend
from verispec.models.hf import HFCausalLM
from verispec.models.protocol import CausalLM, ModelDefaults
from verispec.models.tabular import TabularLM
from verispec.models.threads import ThreadedForward
from verispec.models.tiny import tiny_qwen2


def member_types() -> dict[str, Any]:
    """Return the protocol's members -> their stated types: data members, and properties by their return type."""
    stated = typing.get_type_hints(CausalLM, vars(protocol))  # the annotated data members
    for name, member in vars(CausalLM).items():
        if isinstance(member, property):
            stated[name] = typing.get_type_hints(member.fget, vars(protocol))["return"]
    return stated


def conforms(value: Any, stated: Any) -> bool:
    """Return whether `value` is of the `stated` type (Any: anything)."""
    if stated is Any:
        return True
    if isinstance(stated, types.UnionType) or typing.get_origin(stated) is typing.Union:
        return any(conforms(value, arm) for arm in typing.get_args(stated))
    return isinstance(value, stated)


def llamacpp_model(monkeypatch: pytest.MonkeyPatch, tmp_path: Any) -> llamacpp.LlamaCppModel:
    monkeypatch.setattr(llamacpp, "_load_library", lambda: FakeLibrary(vocab=50, context=64))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    return llamacpp.LlamaCppModel(gguf, "llama.cpp", vocab_size=60)


BACKENDS = ["hf", "hf-reduced-head", "hf-int8", "hf-slot", "tabular", "llamacpp", "threaded"]


@pytest.fixture
def backend(request, tokenizer, monkeypatch, tmp_path):
    vocab = len(tokenizer)
    name = request.param
    if name == "hf":
        return HFCausalLM(tiny_qwen2(vocab, seed=1), tokenizer)
    if name == "hf-reduced-head":
        return HFCausalLM(tiny_qwen2(vocab, seed=1), tokenizer, vocab_ids=list(range(8)))
    if name == "hf-int8":
        model = HFCausalLM(tiny_qwen2(vocab, seed=1, dtype=torch.float32), tokenizer)
        apply_linear_backend(model, "int8")
        return model
    if name == "hf-slot":  # one sequence's view of a shared model in the server's batcher (not started here)
        return SlotLM(HFCausalLM(tiny_qwen2(vocab, seed=1), tokenizer), ForwardBatcher(own_thread=False))
    if name == "tabular":
        return TabularLM(5, seed=0)
    if name == "llamacpp":
        return llamacpp_model(monkeypatch, tmp_path)
    return ThreadedForward(TabularLM(5, seed=0), threads=1)


@pytest.mark.parametrize("backend", BACKENDS, indirect=True)
def test_every_backend_has_every_protocol_member_of_its_stated_type(backend):
    stated = member_types()
    assert {"context_length", "hidden_size", "linear_kernel", "prompt_rows", "draft_vocab", "own_thread_pool",
            "cache_length"} <= stated.keys()  # the walk read the protocol
    assert isinstance(backend, CausalLM)
    wrong = {name: repr(getattr(backend, name)) for name, kind in stated.items()
             if not conforms(getattr(backend, name), kind)}
    assert not wrong, f"{type(backend).__name__}: members not of their stated type: {wrong}"


def test_every_data_member_has_a_default():
    stated = member_types()
    data = {name for name in stated if name not in ("name", "vocab_size", "cache_length")}
    assert data <= set(vars(ModelDefaults)), data - set(vars(ModelDefaults))
    for name in data:
        assert conforms(getattr(ModelDefaults, name), stated[name]), name


def test_what_backends_state_of_themselves(tokenizer, monkeypatch, tmp_path):
    hf = HFCausalLM(tiny_qwen2(len(tokenizer), seed=1), tokenizer)
    assert (hf.context_length, hf.hidden_size, hf.draft_vocab, hf.own_thread_pool) == (512, 32, None, False)
    reduced = HFCausalLM(tiny_qwen2(len(tokenizer), seed=1), tokenizer, vocab_ids=list(range(8)))
    assert reduced.draft_vocab == 8 and reduced.vocab_ids.tolist() == list(range(8))
    cpp = llamacpp_model(monkeypatch, tmp_path)
    assert (cpp.context_length, cpp.hidden_size, cpp.own_thread_pool) == (64, None, True)
    assert TabularLM(5, seed=0).context_length is None


def test_the_linear_backends_are_a_registry():
    assert LINEAR_BACKENDS == ("auto", "torch", *LINEAR_BUILDERS)
    assert set(LINEAR_BUILDERS) == {"onednn", "int8", "int4", "int4-rounded"}
    with pytest.raises(Exception, match="choose one of auto, torch, onednn"):
        check_linear_backend("int3")
