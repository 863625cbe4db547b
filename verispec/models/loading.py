"""Turn a model name (the embedded default, a hub id, a folder, a .gguf file) into a loaded `HFCausalLM`."""

from __future__ import annotations

import torch

from verispec.models.default_pair import DEFAULT_PAIR, prepare
from verispec.models.fastpath import apply_linear_backend, check_linear_backend
from verispec.models.hf import HFCausalLM, load_pretrained

# int8 weights with per-token int8 activations (verispec.models.quantized): 4x fewer weight bytes per token than
# fp32, so a 1-token forward costs less than oneDNN's fp32 one while a few-token verify pass stays near one token's
# cost (benchmarks/quantized_models.py; BENCHMARKS.md). "onednn" (packed fp32) and "torch" stay selectable; none
# applies to other dtypes than float32/bfloat16 or off the CPU (float64 test models run transformers' linears).
DEFAULT_LINEAR_BACKEND = "int8"

DEFAULT = "default"


def load_model(
    spec: str | None,
    role: str,
    dtype: str | torch.dtype = "float32",
    device: str = "cpu",
    linear_backend: str = DEFAULT_LINEAR_BACKEND,
    draft_vocab: int | None = None,
) -> HFCausalLM:
    """Return the model named by `spec` for `role` ("target" or "draft"); None or "default" is the embedded pair.

    `linear_backend`: "int8" (default), "onednn" (CPU only, see verispec.models.fastpath) or "torch"
    (transformers as is).
    `draft_vocab`: N, to slice the output layer to the N most frequent tokens plus the special ones
    (`verispec.drafters.vocab`) before the weights are packed or quantized.
    """
    check_linear_backend(linear_backend)  # before minutes of loading
    if spec is None or spec == DEFAULT:
        embedded = DEFAULT_PAIR[role]
        path, name = str(prepare(embedded)), embedded.upstream
    else:
        path, name = spec, spec
    model, tokenizer = load_pretrained(path, dtype=dtype, device=device)
    vocab_ids = None
    if draft_vocab is not None:
        from verispec.drafters.vocab import draft_vocabulary

        vocab_ids = draft_vocabulary(tokenizer, draft_vocab, int(model.get_output_embeddings().weight.shape[0]))
        name = f"{name} (head of {draft_vocab} tokens)"
    # reads the vocabulary size and slices the head before the weights are packed
    wrapped = HFCausalLM(model, tokenizer, name=name, vocab_ids=vocab_ids)
    apply_linear_backend(wrapped, linear_backend)
    return wrapped
