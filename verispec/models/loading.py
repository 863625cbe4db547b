"""Turn a model name (the embedded default, a hub id, a folder, a .gguf file) into a loaded `HFCausalLM`."""

from __future__ import annotations

from pathlib import Path

import torch

from verispec.errors import ConfigError
from verispec.models.default_pair import DEFAULT_PAIR, assembled, prepare
from verispec.models.default_pair import model_files as default_model_files
from verispec.models.fastpath import (
    apply_linear_backend,
    check_linear_backend,
    is_gguf_spec,
    resolve_linear_backend,
)
from verispec.models.hf import LLAMACPP_PREFIX, HFCausalLM, check_model_spec, load_pretrained, parse_dtype
from verispec.models.protocol import CausalLM
from verispec.models.quantized import quantized_engine

# "auto" picks per model (verispec.models.fastpath.resolve_linear_backend): on a CPU whose vector instructions
# verispec's kernel uses, a GGUF model (the embedded pair, a .gguf file) runs its 4-bit weights as shipped, built
# straight from the GGUF's blocks ("int4"; "int4-rounded" for a draft: every draft linear in 4 bits); a float model
# runs oneDNN with packed float weights ("onednn": a few-token verify pass costs about one token's, and a
# position's logits do not move with the rest of its block beyond float rounding, so greedy speculative decoding
# reproduces greedy `ar`). The int4 path's linears compute every token on its own and its verify passes attend one
# query at a time, so greedy `sd` reproduces greedy `ar` there too. "int8" (verispec.models.quantized) is opt-in:
# it shifts the target's NLL by about 0.045 nats (BENCHMARKS.md §3). "torch" keeps transformers' own linears; it
# is what every backend falls back to off the CPU and for dtypes other than float32/bfloat16.
DEFAULT_LINEAR_BACKEND = "auto"

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
    `linear_backend`: "auto" (default: `verispec.models.fastpath.resolve_linear_backend`), "onednn", "int8",
    "int4" or "int4-rounded" (CPU only, see verispec.models.fastpath) or "torch" (transformers as is). A GGUF model
    on the int4 backends in float32 is built from its blocks (`verispec.models.gguf_direct`: seconds, no float
    copy); every other case loads float weights (for the embedded pair, its float32 conversion: `prepare`).
    `draft_vocab`: N, to slice the output layer to the N most frequent tokens plus the special ones
    (`verispec.models.vocab`) before the weights are packed or quantized; the head then also covers the tokens of
    each decode's context (`verispec.models.reduced_head`), unless `context_vocab` is False.
    """
    check_linear_backend(linear_backend)  # before minutes of loading
    if spec is not None and spec.startswith(LLAMACPP_PREFIX):
        from verispec.models.llamacpp import load_llamacpp_model

        if draft_vocab is not None:
            raise ConfigError("draft_vocab slices a torch draft's output layer; a llama.cpp model computes every "
                              "token's logit: drop --draft-vocab or the llamacpp: prefix")
        return load_llamacpp_model(spec, role)  # the prefix is read where GGUF files are resolved
    backend = resolve_linear_backend(linear_backend, spec, role, device, dtype)
    direct = _direct_gguf(spec, role) if _builds_direct(spec, backend, device, dtype) else None
    if direct is not None:
        from verispec.models.gguf_direct import load_gguf_model

        path, files, name = direct
        built = load_gguf_model(path, files, round_to_4bit=backend == "int4-rounded",
                                float_head=draft_vocab is not None)
        model, tokenizer = built.model, built.tokenizer
    else:
        if spec is None or spec == DEFAULT:
            embedded = DEFAULT_PAIR[role]
            path, name = str(prepare(embedded)), embedded.upstream
        else:
            path, name = spec, spec
        model, tokenizer = load_pretrained(path, dtype=dtype, device=device)
    vocab_ids = None
    if draft_vocab is not None:
        from verispec.models.vocab import draft_vocabulary

        vocab_ids = draft_vocabulary(tokenizer, draft_vocab, int(model.get_output_embeddings().weight.shape[0]))
        extent = " + the context's" if context_vocab else ""
        name = f"{name} (head of {draft_vocab} tokens{extent})"
    # reads the vocabulary size and slices the head before the weights are packed
    wrapped = HFCausalLM(model, tokenizer, name=name, vocab_ids=vocab_ids, context_vocab=context_vocab)
    if direct is None:
        apply_linear_backend(wrapped, backend, requested=linear_backend)
        return wrapped
    from verispec.models.gguf_direct import finish_gguf_model

    finish_gguf_model(wrapped, built, backend, requested=linear_backend)
    return wrapped


def gguf_blocks_file(spec: str | None, role: str, linear_backend: str = DEFAULT_LINEAR_BACKEND,
                     device: str = "cpu", dtype: str | torch.dtype = "float32") -> Path | None:
    """Return the GGUF file `load_model` builds `spec` from, block by block, on `linear_backend`; None where it
    loads float weights instead."""
    backend = resolve_linear_backend(linear_backend, spec, role, device, dtype)
    direct = _direct_gguf(spec, role) if _builds_direct(spec, backend, device, dtype) else None
    return None if direct is None else direct[0]


def _builds_direct(spec: str | None, backend: str, device: str, dtype: str | torch.dtype) -> bool:
    """Whether `spec` on `backend` is built from GGUF blocks: a GGUF model, an int4 backend, float32 on the CPU, and
    torch's fbgemm engine present (layers the kernel does not take need it; without it the float path falls back
    to torch)."""
    return (is_gguf_spec(spec) and backend in ("int4", "int4-rounded") and torch.device(device).type == "cpu"
            and parse_dtype(dtype) == torch.float32 and quantized_engine() is not None)


def _direct_gguf(spec: str | None, role: str) -> tuple[Path, Path, str] | None:
    """Return (GGUF path, folder of its tokenizer and config, model name) for a GGUF model built from its blocks,
    or None where its architecture is not built that way (it then loads through transformers' float path)."""
    from verispec.models.gguf_direct import direct_support, model_files

    if spec is None or spec == DEFAULT:
        embedded = DEFAULT_PAIR[role]
        return assembled(embedded), default_model_files(embedded), embedded.upstream
    check_model_spec(spec)
    path = Path(spec).expanduser()
    if direct_support(path) is not None:
        return None
    return path, model_files(path), spec
