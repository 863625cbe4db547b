"""The embedded default pair (Qwen2.5-Coder 1.5B target, 0.5B draft): real models, real tokenizer.

Slow (loads ~9 GB of float32 weights and decodes on the CPU); `make test` and CI run it.
"""

from __future__ import annotations

import pytest

from verispec import Decoder
from verispec.models.default_pair import DEFAULT_PAIR, describe

pytestmark = pytest.mark.slow

PROMPTS = [
    "Write a Python function that returns the sum of the squares of a list of numbers.",
    "What is the difference between a list and a tuple in Python?",
]


@pytest.fixture(scope="module")
def decoder():
    return Decoder()


def test_default_pair_files_verify():
    for model in DEFAULT_PAIR.values():
        info = describe(model, verify=True)
        assert info["parts_installed"] and info["sha256_ok"], info


def test_pair_shares_vocabulary_and_chat_template(decoder):
    target, draft = decoder.model("target"), decoder.model("draft")
    assert target.vocab_size == draft.vocab_size == 151936
    ids = decoder.encode_prompt(PROMPTS[0])
    assert decoder.tokenizer.decode(ids).count("<|im_start|>") >= 2  # system/user turns + the assistant opening


@pytest.mark.parametrize("prompt", PROMPTS)
def test_greedy_sd_equals_ar_on_the_default_pair(decoder, prompt):
    ar = decoder.generate(prompt, method="ar", max_new_tokens=32)
    sd = decoder.generate(prompt, method="sd", gamma=4, max_new_tokens=32)
    assert len(ar.tokens) == 32
    assert sd.tokens == ar.tokens
    assert sd.trace.acceptance_rate > 0.3  # a real, mostly agreeing pair
    assert sd.trace.target_calls < ar.trace.target_calls


@pytest.mark.parametrize(
    "method, paths", [("bv", 1), ("gbv", 3), ("specinfer", 2), ("spectr", 2), ("nss", 2), ("traversal", 2)]
)
def test_greedy_block_and_multipath_methods_equal_ar_on_the_default_pair(decoder, method, paths):
    prompt = PROMPTS[0]
    ar = decoder.generate(prompt, method="ar", max_new_tokens=24)
    out = decoder.generate(prompt, method=method, gamma=4, paths=paths, max_new_tokens=24)
    assert out.tokens == ar.tokens


def test_onednn_fast_path_matches_transformers_linears(decoder):
    """The oneDNN linear path computes the same model: logits agree with transformers' own linears."""
    from verispec.models.loading import load_model

    reference = load_model(None, "draft", linear_backend="torch")
    fast = load_model(None, "draft", linear_backend="onednn")
    assert fast.linear_backend == "onednn" and reference.linear_backend == "torch"
    ids = decoder.encode_prompt(PROMPTS[1])
    fast.reset()
    reference.reset()
    a = fast.forward(ids, n_logits=5).logits
    b = reference.forward(ids, n_logits=5).logits
    assert (a - b).abs().max() < 1e-3
    assert (a.argmax(-1) == b.argmax(-1)).all()


def test_sprinter_runs_with_the_packaged_verifier_on_a_fresh_install(decoder):
    gen = decoder.generate(PROMPTS[0], method="sprinter", max_new_tokens=24)
    assert len(gen.tokens) == 24 or gen.stopped_at_eos
    assert gen.verifier["file"].endswith("Qwen--Qwen2.5-Coder-0.5B-Instruct.safetensors")
    assert gen.verifier["draft_model"] == DEFAULT_PAIR["draft"].upstream and 0 < gen.verifier["threshold"] < 1
    # the packaged verifier scored the drafted tokens and ended the runs; every round still emits a token
    assert any(r.verifier_scores for r in gen.trace.rounds)
    assert gen.trace.target_calls <= len(gen.tokens)
