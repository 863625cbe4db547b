"""verispec's decoder loop against transformers' forward on the same modules: logits, hidden states, tree attention.

Asserted bit-identical in every dtype on the CPU: the loop calls the same modules in the same order (float32 through
one fused RMSNorm that rounds as transformers' does; other dtypes through transformers' own norm modules). On a GPU
(`VERISPEC_TEST_DEVICE`) float32 is held to FLOAT32_GPU_ATOL instead: there the two loops' matrix products of
different shapes run different kernels (up to 1.5e-5 apart on logits of size ~5, measured on an H200); float64 and
bfloat16 stayed bit-identical there.
"""

from __future__ import annotations

import pytest
import torch

from tests.device import device_is_cpu, on_test_device
from verispec.models.fastpath import apply_linear_backend
from verispec.models.hf import HFCausalLM
from verispec.models.lean import lean_support
from verispec.models.quantized import quantized_engine
from verispec.models.tiny import perturb, tiny_qwen2, tiny_tokenizer


def tiny_llama(vocab_size: int, seed: int, dtype: torch.dtype) -> object:
    from transformers import LlamaConfig, LlamaForCausalLM

    config = LlamaConfig(vocab_size=vocab_size, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=512,
                         rope_parameters={"rope_type": "llama3", "rope_theta": 10000.0, "factor": 8.0,
                                          "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                          "original_max_position_embeddings": 64})
    return perturb(LlamaForCausalLM(config).to(dtype).eval(), scale=None, seed=seed)


def pair(kind: str, dtype: torch.dtype, backend: str = "torch") -> tuple[HFCausalLM, HFCausalLM]:
    """Two adapters over one model object: verispec's loop and transformers' forward, each with its own cache."""
    tokenizer = tiny_tokenizer()
    if kind == "llama":
        model = tiny_llama(len(tokenizer), seed=3, dtype=dtype)
    else:
        model = tiny_qwen2(len(tokenizer), seed=3, dtype=dtype, tie_embeddings=kind == "qwen2-tied")
    model = on_test_device(model)
    lean, plain = HFCausalLM(model, tokenizer), HFCausalLM(model, tokenizer, lean=False)
    if backend != "torch":
        assert apply_linear_backend(lean, backend) == backend  # packs the shared modules once
        # torch's attention, as transformers' forward runs it (the per-query kernel: test_query_attention.py)
        lean.per_query_attention = False
        lean.linears_changed()
        plain.linear_backend = backend
    assert lean.decoder_loop == "verispec's decoder loop", lean.decoder_loop
    assert plain.decoder_loop.startswith("transformers' forward")
    return lean, plain


FLOAT32_GPU_ATOL = 1e-4
ON_CPU = device_is_cpu()


def check_equal(a: torch.Tensor, b: torch.Tensor, dtype: torch.dtype) -> None:
    assert a.dtype == (torch.float64 if dtype == torch.float64 else torch.float32), a.dtype
    if ON_CPU or dtype != torch.float32:
        assert torch.equal(a, b), (a - b).abs().max()
    else:
        torch.testing.assert_close(a, b, rtol=0, atol=FLOAT32_GPU_ATOL)


CASES = [("qwen2", torch.float32), ("qwen2", torch.float64), ("qwen2", torch.bfloat16), ("qwen2-tied", torch.float32),
         ("llama", torch.float32), ("llama", torch.float64), ("llama", torch.bfloat16)]


@pytest.mark.parametrize(("kind", "dtype"), CASES)
def test_chain_forwards_match_transformers(kind: str, dtype: torch.dtype) -> None:
    lean, plain = pair(kind, dtype)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(2, lean.vocab_size, (20,), generator=gen).tolist()
    # prefill, one token, a verify-sized block, a rollback and a re-feed
    for chunk, n_logits in ((tokens[:9], 2), (tokens[9:10], 1), (tokens[10:15], 5)):
        a = lean.forward(chunk, n_logits=n_logits, return_hidden=True)
        b = plain.forward(chunk, n_logits=n_logits, return_hidden=True)
        check_equal(a.logits, b.logits, dtype)
        check_equal(a.hidden, b.hidden, dtype)
    lean.truncate(11)
    plain.truncate(11)
    check_equal(lean.forward(tokens[11:20], n_logits=9).logits, plain.forward(tokens[11:20], n_logits=9).logits, dtype)


@pytest.mark.parametrize(("kind", "dtype"), [("qwen2", torch.float32), ("llama", torch.float64)])
def test_tree_forward_matches_transformers(kind: str, dtype: torch.dtype) -> None:
    lean, plain = pair(kind, dtype)
    prefix = [5, 9, 11, 4, 7, 20]
    # two branches after the prefix: (12, 13) and (14, 15, 16)
    branch_parents = [5, 6, 5, 8, 9]
    tree_tokens = [12, 13, 14, 15, 16]
    outs = []
    for model in (lean, plain):
        model.forward(prefix)
        outs.append(model.forward(tree_tokens, n_logits=5, parents=branch_parents).logits)
    check_equal(outs[0], outs[1], dtype)


@pytest.mark.skipif(quantized_engine() is None or not ON_CPU,
                    reason="the int8 backend is a CPU kernel, and this torch build has no fbgemm engine or the test "
                           "device is not the CPU")
def test_int8_path_matches_transformers() -> None:
    lean, plain = pair("qwen2-tied", torch.float32, backend="int8")
    tokens = list(range(3, 20))
    check_equal(lean.forward(tokens[:12], n_logits=12).logits, plain.forward(tokens[:12], n_logits=12).logits,
                torch.float32)
    check_equal(lean.forward(tokens[12:], n_logits=5).logits, plain.forward(tokens[12:], n_logits=5).logits,
                torch.float32)


def test_unsupported_models_keep_transformers_forward() -> None:
    from transformers import GPT2Config, GPT2LMHeadModel, Qwen2Config, Qwen2ForCausalLM

    tokenizer = tiny_tokenizer()
    gpt2 = GPT2LMHeadModel(GPT2Config(vocab_size=len(tokenizer), n_embd=32, n_layer=1, n_head=4)).eval()
    assert "gpt2" in lean_support(gpt2)
    windowed = Qwen2ForCausalLM(Qwen2Config(vocab_size=len(tokenizer), hidden_size=32, intermediate_size=64,
                                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                                            use_sliding_window=True, sliding_window=4, max_window_layers=0)).eval()
    assert "sliding" in lean_support(windowed)
    wrapped = HFCausalLM(windowed, tokenizer)
    assert wrapped.decoder_loop.startswith("transformers' forward (sliding")
    assert wrapped.forward([3, 4, 5]).logits.shape == (1, len(tokenizer))
