"""The llama.cpp model backend: clear errors without the build or with a bad file; on the real draft GGUF (when
`make peers` built the library): rollback exactness, logits of a prefix alone and inside a longer feed, and greedy
`sd` with the llama.cpp draft reproducing greedy `ar` token for token."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from verispec.errors import ConfigError, ModelFilesError
from verispec.limits import check_context
from verispec.models import llamacpp
from verispec.native import llamacpp_build


def test_missing_library_names_make_peers(monkeypatch, tmp_path):
    monkeypatch.setattr(llamacpp_build, "library", lambda: tmp_path / "libverispec_llama.so")
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    with pytest.raises(ConfigError, match="make peers"):
        llamacpp.LlamaCppModel(gguf, "m")


def test_missing_or_non_gguf_file_is_refused(tmp_path):
    with pytest.raises(ModelFilesError, match="does not exist"):
        llamacpp.LlamaCppModel(tmp_path / "absent.gguf", "m")
    folder = tmp_path / "model"
    folder.mkdir()
    with pytest.raises(ConfigError, match="not a .gguf file"):
        llamacpp.load_llamacpp_model(str(folder), "draft")


class FakeLibrary:
    """The shim's C functions, as far as loading a model and reading its sizes goes: no llama.cpp needed."""

    def __init__(self, vocab: int, context: int) -> None:
        self.vocab, self.context = vocab, context

    def vs_load(self, *args: object) -> int:
        return 1

    def vs_n_vocab(self, handle: int) -> int:
        return self.vocab

    def vs_n_ctx(self, handle: int) -> int:
        return self.context

    def vs_free(self, handle: int) -> None:
        pass



def test_a_user_gguf_gets_its_own_tokenizer_read_once(monkeypatch, tmp_path):
    from tests.models.gguf_cases import write_tiny_gguf
    from verispec.models import gguf_direct

    monkeypatch.setattr(gguf_direct, "cache_dir", lambda: tmp_path / "cache")
    made = []
    monkeypatch.setattr(llamacpp, "LlamaCppModel", lambda path, name, tokenizer, *rest: made.append(tokenizer))
    path = write_tiny_gguf(tmp_path / "tiny.gguf")
    llamacpp.load_llamacpp_model(f"llamacpp:{path}", "draft")
    assert made[0].get_vocab()["ab"] == 28  # the tiny file's own vocabulary (gguf_cases)
    assert any((tmp_path / "cache" / "gguf-meta").iterdir())  # cached: a second load reads no metadata

def test_the_context_check_catches_a_prompt_beyond_llamacpps_context(monkeypatch, tmp_path):
    monkeypatch.setattr(llamacpp, "_load_library", lambda: FakeLibrary(vocab=50, context=64))
    gguf = tmp_path / "model.gguf"
    gguf.write_bytes(b"GGUF")
    model = llamacpp.LlamaCppModel(gguf, "m", vocab_size=60)
    assert model.context_length == 64 and model.vocab_size == 60 and model.own_thread_pool
    check_context(54, 10, None, model)  # exactly fills the context
    with pytest.raises(ConfigError, match=r"55 tokens.*max_new_tokens 10: 65 positions.*draft model's context of 64"):
        check_context(55, 10, None, model)


def _real_draft() -> llamacpp.LlamaCppModel:
    if not llamacpp_build.library().exists():
        pytest.skip("llama.cpp's backend library is not built on this machine: run `make peers`")
    from verispec.models.default_pair import DEFAULT_PAIR, gguf_path

    if not gguf_path(DEFAULT_PAIR["draft"]).exists():
        pytest.skip("the default draft GGUF is not assembled: run `make models`")
    return llamacpp.load_llamacpp_model(None, "draft", threads=2)


@pytest.mark.slow
def test_real_backend_rolls_back_exactly_and_refuses_trees(tmp_path):
    model = _real_draft()
    ids = [750, 75698, 1445, 1648, 198, 262, 421, 308, 2651, 220, 16, 25]
    whole = model.forward(ids, n_logits=4).logits
    assert whole.shape == (4, model.vocab_size) and model.cache_length == len(ids)
    assert model.context_length > 0  # the pre-flight context check reads llama.cpp's context
    model.reset()
    model.forward(ids[:8])
    fresh = model.forward(ids[8:], n_logits=4).logits
    model.truncate(8)  # roll back four tokens, feed them again: what a fresh decode of the same feeds gives
    again = model.forward(ids[8:], n_logits=4).logits
    assert torch.equal(fresh, again) and model.cache_length == len(ids)
    # feeds of other shapes agree to llama.cpp's rounding, which depends on the batch (it quantizes activations
    # per block and keeps an f16 KV cache): seen up to 0.33 in a logit, 0.03 in total variation. The drafter
    # reports the q it drew from, so this moves acceptance, never the output law.
    def tv(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        return 0.5 * (a.softmax(-1) - b.softmax(-1)).abs().sum(-1)

    assert torch.equal(fresh.argmax(-1), whole.argmax(-1)) and bool((tv(fresh, whole) < 0.1).all())
    model.reset()  # one token at a time: the batched feed's law, to the same rounding
    for token in ids[:-1]:
        model.forward([token])
    last = model.forward(ids[-1:]).logits
    assert float(tv(last[0], whole[-1])) < 0.1 and int(last[0].argmax()) == int(whole[-1].argmax())
    with pytest.raises(ConfigError, match="one path"):
        model.forward([1, 2], parents=[len(ids) - 1, len(ids) - 1])
    with pytest.raises(ConfigError, match="hidden states"):
        model.forward([1], return_hidden=True)
    with pytest.raises(ModelFilesError, match="could not load"):
        bad = tmp_path / "bad.gguf"
        bad.write_bytes(b"GGUF" + bytes(64))
        llamacpp.LlamaCppModel(bad, "bad")


@pytest.mark.slow
def test_real_greedy_sd_with_llamacpp_draft_equals_ar():
    _real_draft()
    from verispec import Decoder

    decoder = Decoder(draft="llamacpp:default")
    prompt = "Write a Python function that returns the n-th Fibonacci number."
    ar = decoder.generate(prompt, method="ar", max_new_tokens=48)
    sd = decoder.generate(prompt, method="sd", gamma=4, max_new_tokens=48)
    assert sd.tokens == ar.tokens
    assert sd.trace.target_calls < ar.trace.target_calls  # the draft was used, and accepted
    assert "llama.cpp" in decoder.linear_kernels()["draft"]
    assert Path(decoder.model("draft").path).suffix == ".gguf"


def test_requantised_spec_names_its_problems(monkeypatch, tmp_path):
    from verispec.models import hf

    with pytest.raises(ConfigError, match="unknown llama.cpp weight type 'q3_x'"):
        llamacpp.gguf_file("llamacpp:default-q3_x", "draft")
    assert llamacpp.embedded_kind("llamacpp:default-Q4_0") == "q4_0"
    assert llamacpp.embedded_kind(None) == "" and llamacpp.embedded_kind("llamacpp:default") == ""
    assert llamacpp.embedded_kind("llamacpp:/models/x.gguf") is None
    hf.check_model_spec("llamacpp:default-q4_0")  # the embedded model's spec: no file to look for
    monkeypatch.setattr(llamacpp_build, "root", lambda isa="native": tmp_path / "no-build")
    source = tmp_path / "draft.gguf"
    source.write_bytes(b"GGUF")
    with pytest.raises(ConfigError, match="make peers"):
        llamacpp_build.requantized(source, "q4_0", "abc")


def test_requantised_file_is_written_once_and_redone_for_another_source(monkeypatch, tmp_path):
    """A stand-in llama-quantize (a shell script copying its input and counting its runs): the file and its record
    are reused while the record matches the source's checksum, rewritten when it does not, and a failing tool
    leaves neither file behind."""
    tool = tmp_path / "bin" / "llama-quantize"
    tool.parent.mkdir()
    runs = tmp_path / "runs"
    tool.write_text(f'#!/bin/sh\necho run >> {runs}\n[ "$4" = Q4_0 ] || exit 3\ncp "$2" "$3"\n')
    tool.chmod(0o755)
    monkeypatch.setattr(llamacpp_build, "root", lambda isa="native": tmp_path)
    source = tmp_path / "draft.gguf"
    source.write_bytes(b"GGUF-one")
    out = llamacpp_build.requantized(source, "q4_0", "sha-one")
    assert out.name == "draft-q4_0.gguf" and out.read_bytes() == b"GGUF-one"
    assert llamacpp_build.requantized(source, "q4_0", "sha-one") == out
    assert runs.read_text().count("run") == 1
    record = __import__("json").loads(out.with_suffix(".json").read_text())
    assert record["source_sha256"] == "sha-one" and record["size"] == len(b"GGUF-one") and record["type"] == "q4_0"
    source.write_bytes(b"GGUF-two")
    assert llamacpp_build.requantized(source, "q4_0", "sha-two").read_bytes() == b"GGUF-two"
    assert runs.read_text().count("run") == 2
    with pytest.raises(ConfigError, match=r"could not requantise .* \(exit 3\)"):
        llamacpp_build.requantized(source, "q8_0", "sha-two")
    assert not (tmp_path / "draft-q8_0.gguf").exists()
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith(".")]  # no scratch file left


@pytest.mark.slow
def test_real_requantised_draft_loads_as_the_embedded_model():
    _real_draft()
    if not llamacpp_build.binary("llama-quantize").exists():
        pytest.skip("llama.cpp's llama-quantize is not built on this machine: run `make peers`")
    model = llamacpp.load_llamacpp_model("llamacpp:default-q4_0", "draft", threads=2)
    assert model.path.name.endswith("-q4_0.gguf") and model.name.endswith("(Q4_0)")
    assert model.vocab_size == llamacpp.load_llamacpp_model(None, "draft", threads=2).vocab_size
    logits = model.forward([750, 75698, 1445, 1648], n_logits=1).logits
    assert logits.shape == (1, model.vocab_size) and bool(torch.isfinite(logits[0, :1000]).all())
