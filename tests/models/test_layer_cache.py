"""The cache of a GGUF model's computed layers (`verispec.models.layer_cache`): a second load reads them back, bit for
bit, without computing them; a damaged, stale or unwritable cache is rebuilt or skipped, never trusted."""

from __future__ import annotations

import os

import pytest
import torch

from tests.models.gguf_cases import write_tiny_gguf
from tests.models.protocol_cases import fresh_logits
from verispec.models import gguf_direct, gguf_layers, layer_cache
from verispec.models.hf import HFCausalLM
from verispec.models.int4 import Int4Linear, Int8RowLinear
from verispec.models.loading import load_model
from verispec.models.quantized import quantized_engine

pytestmark = pytest.mark.skipif(quantized_engine() is None, reason="this torch build has no fbgemm engine")
TOKENS = [3, 1, 4, 1, 5, 9, 2, 6]


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    """The tokenizer, config and layer caches of the test's GGUF files live under tmp_path."""
    monkeypatch.setattr(gguf_direct, "cache_dir", lambda: tmp_path / "cache")
    return tmp_path / "cache"


def computed(model) -> dict:
    return {name: module.quantized for name, module in model.model.named_modules()
            if isinstance(getattr(module, "quantized", None), (Int4Linear, Int8RowLinear))}


def forbid_computing(monkeypatch) -> None:
    """Make any layer computed from float weights fail the test: a cached load must read them all."""
    def fail(*args, **kwargs):
        raise AssertionError("a layer was computed although the cache holds it")

    monkeypatch.setattr(gguf_layers, "_computed_layer", fail)


def cache_file(cache, rounded: bool):
    (folder,) = (cache / "layers").glob(f"*-{'rounded' if rounded else 'exact'}-L{layer_cache.LAYOUT}")
    return folder / layer_cache.FILE


@pytest.mark.parametrize(("role", "backend"), [("target", "int4"), ("draft", "int4-rounded")])
def test_a_second_load_reads_the_computed_layers_back_bit_for_bit(tmp_path, cache, monkeypatch, role, backend):
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    first = load_model(str(path), role, linear_backend=backend)
    assert cache_file(cache, backend == "int4-rounded").is_file()
    forbid_computing(monkeypatch)
    dequantized, read_float = [], gguf_direct._Weights.float

    def recording(self, name):
        dequantized.append(name)
        return read_float(self, name)

    monkeypatch.setattr(gguf_direct._Weights, "float", recording)
    second = load_model(str(path), role, linear_backend=backend)
    assert dequantized and "lm_head.weight" not in dequantized  # the cached head: no float rows built for it
    before, after = computed(first), computed(second)
    # Q8_0, Q5_0, Q6_K layers and the Q8_0 head: int8 rows on int4, rounded to 4 bits on int4-rounded
    assert {"model.layers.0.self_attn.v_proj", "model.layers.1.mlp.down_proj", "lm_head"} <= set(before)
    assert before.keys() == after.keys()
    for name, layer in before.items():
        assert type(after[name]) is type(layer)
        for part, tensor in layer.state().items():
            assert torch.equal(after[name].state()[part], tensor), (name, part)
    assert second.linear_kernel == first.linear_kernel  # the same counts per kind, "rounded" ones included
    assert torch.equal(fresh_logits(second, TOKENS, len(TOKENS)), fresh_logits(first, TOKENS, len(TOKENS)))
    long = list(range(1, 64)) * 2  # past PROMPT_ROWS: the cached layers' prompt copies are built and agree
    assert torch.equal(fresh_logits(second, long, 4), fresh_logits(first, long, 4))


def test_a_damaged_cache_is_rebuilt_with_one_line(tmp_path, cache, capsys):
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    reference = fresh_logits(load_model(str(path), "target", linear_backend="int4"), TOKENS, 2)
    file = cache_file(cache, False)
    data = bytearray(file.read_bytes())
    data[-100] ^= 0xFF  # a flipped byte in the last layer's tensors, the size unchanged
    file.write_bytes(bytes(data))
    capsys.readouterr()
    again = load_model(str(path), "target", linear_backend="int4")
    assert "layer cache is damaged" in capsys.readouterr().err
    assert torch.equal(fresh_logits(again, TOKENS, 2), reference)
    assert layer_cache._whole(cache_file(cache, False).parent)  # written again, whole


def test_a_cache_of_another_layout_is_not_read(tmp_path, cache, monkeypatch):
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    load_model(str(path), "target", linear_backend="int4")
    folder = cache_file(cache, False).parent
    monkeypatch.setattr(layer_cache, "LAYOUT", layer_cache.LAYOUT + 1)
    assert not layer_cache._whole(folder)
    assert not layer_cache.LayerCache(folder).found


def test_a_cache_that_cannot_be_written_leaves_the_load_as_it_was(tmp_path, cache, monkeypatch, capsys):
    path = write_tiny_gguf(tmp_path / "tiny.gguf")

    def full(*args, **kwargs):
        raise OSError(28, os.strerror(28))

    monkeypatch.setattr(layer_cache, "publish_folder", full)
    model = load_model(str(path), "target", linear_backend="int4")
    assert "could not cache the computed layers" in capsys.readouterr().err
    assert not list((cache / "layers").glob("*-L*"))  # no half-written folder left behind
    assert fresh_logits(model, TOKENS, 2).isfinite().all()


def test_a_head_other_than_the_files_is_not_cached(tmp_path, cache):
    """A draft's reduced head (`--draft-vocab`) has fewer rows than the file's: its layer is this load's only."""
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    built = gguf_direct.load_gguf_model(path, gguf_direct.model_files(path), round_to_4bit=True)
    built.head_rows += 64  # as if the file's head were larger than the one this model computes
    gguf_direct.finish_gguf_model(HFCausalLM(built.model, built.tokenizer), built, "int4-rounded")
    found = layer_cache.LayerCache(cache_file(cache, True).parent).found
    assert "model.layers.1.mlp.down_proj" in found and "lm_head" not in found
