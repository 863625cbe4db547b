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
) -> HFCausalLM:
    """Return the model named by `spec` for `role` ("target" or "draft"); None or "default" is the embedded pair.

    `linear_backend`: "int8" (default), "onednn" (CPU only, see verispec.models.fastpath) or "torch"
    (transformers as is).
    """
    check_linear_backend(linear_backend)  # before minutes of loading
    if spec is None or spec == DEFAULT:
        embedded = DEFAULT_PAIR[role]
        path, name = str(prepare(embedded)), embedded.upstream
    else:
        path, name = spec, spec
    model, tokenizer = load_pretrained(path, dtype=dtype, device=device)
    wrapped = HFCausalLM(model, tokenizer, name=name)  # reads the vocabulary size before the weights are packed
    apply_linear_backend(wrapped, linear_backend)
    return wrapped
