"""Turn a model name (the embedded default, a hub id, a folder, a .gguf file) into a loaded `HFCausalLM`."""

from __future__ import annotations

import torch

from verispec.errors import ConfigError
from verispec.models.default_pair import DEFAULT_PAIR, prepare
from verispec.models.fastpath import apply_linear_backend, check_linear_backend
from verispec.models.hf import LLAMACPP_PREFIX, HFCausalLM, load_pretrained
from verispec.models.protocol import CausalLM

# oneDNN with packed float weights: a few-token verify pass costs about one token's, and a position's logits do not
# move with the rest of its block beyond float rounding, so greedy speculative decoding reproduces greedy `ar`.
# "int8" (verispec.models.quantized) is faster (4x fewer weight bytes) but opt-in: dynamic activation quantization
# turns the float rounding differences between block shapes into logit differences of a few hundredths, so greedy
# `sd` can part from greedy `ar` at near-ties, and it shifts the target's NLL by about 0.045 nats (BENCHMARKS.md
# §3). "torch" keeps transformers' own linears. None applies to dtypes other than float32/bfloat16 or off the CPU.
DEFAULT_LINEAR_BACKEND = "onednn"

DEFAULT = "default"


def load_model(
    spec: str | None,
    role: str,
    dtype: str | torch.dtype = "float32",
    device: str = "cpu",
    linear_backend: str = DEFAULT_LINEAR_BACKEND,
    draft_vocab: int | None = None,
    context_vocab: bool = True,
) -> CausalLM:
    """Return the model named by `spec` for `role` ("target" or "draft"); None or "default" is the embedded pair.

    `spec` "llamacpp:FILE.gguf" or "llamacpp:default": the GGUF run in-process by llama.cpp with its own kernels
    (`verispec.models.llamacpp`; chain forwards only, no hidden states), whatever `linear_backend` and `dtype` say.
    `linear_backend`: "onednn" (default), "int8" or "int4" (CPU only, see verispec.models.fastpath) or "torch"
    (transformers as is).
    `draft_vocab`: N, to slice the output layer to the N most frequent tokens plus the special ones
    (`verispec.drafters.vocab`) before the weights are packed or quantized; the head then also covers the tokens of
    each decode's context (`verispec.models.reduced_head`), unless `context_vocab` is False.
    """
    check_linear_backend(linear_backend)  # before minutes of loading
    if spec is not None and spec.startswith(LLAMACPP_PREFIX):
        from verispec.models.llamacpp import load_llamacpp_model

        if draft_vocab is not None:
            raise ConfigError("draft_vocab slices a torch draft's output layer; a llama.cpp model computes every "
                              "token's logit: drop --draft-vocab or the llamacpp: prefix")
        return load_llamacpp_model(spec, role)  # the prefix is read where GGUF files are resolved
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
        extent = " + the context's" if context_vocab else ""
        name = f"{name} (head of {draft_vocab} tokens{extent})"
    # reads the vocabulary size and slices the head before the weights are packed
    wrapped = HFCausalLM(model, tokenizer, name=name, vocab_ids=vocab_ids, context_vocab=context_vocab)
    apply_linear_backend(wrapped, linear_backend)
    return wrapped
