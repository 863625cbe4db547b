"""Turn a model name (the embedded default, a hub id, a folder, a .gguf file) into a loaded `HFCausalLM`."""

from __future__ import annotations

import torch

from verispec.models.default_pair import DEFAULT_PAIR, prepare
from verispec.models.hf import HFCausalLM, load_pretrained

DEFAULT = "default"


def load_model(spec: str | None, role: str, dtype: str | torch.dtype = "float32", device: str = "cpu") -> HFCausalLM:
    """Return the model named by `spec` for `role` ("target" or "draft"); None or "default" is the embedded pair."""
    if spec is None or spec == DEFAULT:
        embedded = DEFAULT_PAIR[role]
        model, tokenizer = load_pretrained(str(prepare(embedded)), dtype=dtype, device=device)
        return HFCausalLM(model, tokenizer, name=embedded.upstream)
    model, tokenizer = load_pretrained(spec, dtype=dtype, device=device)
    return HFCausalLM(model, tokenizer, name=spec)
