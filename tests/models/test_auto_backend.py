"""The "auto" linear backend: per model, int4 (int4-rounded for a draft) for a GGUF model where verispec's kernel has
a vector path on this CPU, oneDNN for float models and where it has none, torch off the CPU; and what loads."""

from __future__ import annotations

import pytest
import torch

from tests.models.gguf_cases import write_tiny_gguf
from verispec.errors import ConfigError
from verispec.models import fastpath, gguf_direct
from verispec.models.fastpath import apply_linear_backend, draft_backend_for, resolve_linear_backend
from verispec.models.hf import HFCausalLM
from verispec.models.loading import DEFAULT_LINEAR_BACKEND, load_model
from verispec.models.quantized import quantized_engine
from verispec.models.tiny import tiny_qwen2

GGUF_SPECS = [None, "default", "models/coder.gguf"]


@pytest.fixture
def isa(monkeypatch):
    """Set the instruction-set level the kernel reports (`kernel_isa`), as `verispec.native.cpu.best_isa` would."""
    def set_level(level: str) -> None:
        monkeypatch.setattr(fastpath, "kernel_isa", lambda: level)
    return set_level


@pytest.mark.skipif(quantized_engine() is None, reason="this torch build has no fbgemm engine")
@pytest.mark.parametrize("level", ["avx512-vnni", "avx-vnni", "avx2"])
@pytest.mark.parametrize("spec", GGUF_SPECS)
def test_a_gguf_model_runs_int4_where_the_kernel_has_a_vector_path(isa, level, spec):
    isa(level)
    assert resolve_linear_backend("auto", spec, "target") == "int4"
    assert resolve_linear_backend("auto", spec, "draft") == "int4-rounded" == draft_backend_for("int4")


@pytest.mark.parametrize("spec", GGUF_SPECS)
def test_without_a_vector_path_a_gguf_model_runs_onednn(isa, spec, monkeypatch):
    isa("portable")
    monkeypatch.setattr(fastpath, "onednn_available", lambda: True)
    assert resolve_linear_backend("auto", spec, "target") == resolve_linear_backend("auto", spec, "draft") == "onednn"


def test_float_models_run_onednn_off_the_cpu_torch(isa, monkeypatch):
    isa("avx512-vnni")
    monkeypatch.setattr(fastpath, "onednn_available", lambda: True)
    for spec in ("Qwen/Qwen2.5-Coder-0.5B-Instruct", "/models/my-folder", "llamacpp:model.gguf"):
        assert resolve_linear_backend("auto", spec, "target") == "onednn"
    assert resolve_linear_backend("auto", None, "target", dtype="bfloat16") == "onednn"
    assert resolve_linear_backend("auto", None, "target", dtype=torch.float16) == "torch"
    for spec in (None, "/models/my-folder"):
        assert resolve_linear_backend("auto", spec, "target", device="cuda") == "torch"
        assert resolve_linear_backend("auto", spec, "draft", device="cuda:1") == "torch"
    monkeypatch.setattr(fastpath, "onednn_available", lambda: False)
    assert resolve_linear_backend("auto", "/models/my-folder", "target") == "torch"


def test_a_named_backend_is_kept_and_auto_is_the_default(isa):
    isa("portable")
    assert DEFAULT_LINEAR_BACKEND == "auto" and draft_backend_for("auto") == "auto"
    for backend in ("torch", "onednn", "int8", "int4", "int4-rounded"):
        assert resolve_linear_backend(backend, None, "draft", device="cuda") == backend
    with pytest.raises(ConfigError, match="auto"):
        resolve_linear_backend("int3", None, "target")


def test_auto_on_a_loaded_float_model_is_the_float_rule():
    for dtype, expected in ((torch.float32, "onednn"), (torch.float64, "torch")):
        model = HFCausalLM(tiny_qwen2(40, seed=1, dtype=dtype), None)
        expected = expected if fastpath.onednn_available() else "torch"
        assert apply_linear_backend(model, "auto") == expected == model.linear_backend
        assert "requested" not in model.linear_kernel


@pytest.mark.skipif(quantized_engine() is None, reason="this torch build has no fbgemm engine")
def test_load_model_builds_a_gguf_from_its_blocks_or_loads_it_as_floats(isa, tmp_path, monkeypatch, tiny_folder):
    monkeypatch.setattr(gguf_direct, "cache_dir", lambda: tmp_path / "cache")
    path = str(write_tiny_gguf(tmp_path / "tiny.gguf"))
    isa("avx2")
    target, draft = load_model(path, "target"), load_model(path, "draft")
    assert (target.linear_backend, draft.linear_backend) == ("int4", "int4-rounded")
    assert "4-bit weights" in target.linear_kernel and "rounded" in draft.linear_kernel
    assert target.linear_kernel.endswith("(auto's choice for float32 weights on cpu)")
    isa("portable")
    floats = load_model(path, "target")
    expected = "onednn" if fastpath.onednn_available() else "torch"
    assert floats.linear_backend == expected and floats.model.get_input_embeddings().weight.shape == (64, 256)
    assert load_model(str(tiny_folder), "target").linear_backend == expected
