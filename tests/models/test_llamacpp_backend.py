"""The llama.cpp model backend: clear errors without the build or with a bad file; on the real draft GGUF (when
`make peers` built the library): rollback exactness, logits of a prefix alone and inside a longer feed, and greedy
`sd` with the llama.cpp draft reproducing greedy `ar` token for token."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from verispec.errors import ConfigError, ModelFilesError
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
