"""A GGUF model run in-process by llama.cpp, behind the small model protocol: the draft backend `llamacpp`.

On a CPU the draft's cost decides speculative decoding (BENCHMARKS.md §3): a 0.5B draft's one-token forward in
torch is dominated by per-layer framework overhead, which llama.cpp does not pay. Drafting needs only one-token
forwards, the one shape llama.cpp is fast at; the target's multi-token verify pass stays in torch, whose cost is
nearly flat in the block length (llama.cpp's is not). Verification stays exactly lossless: every rule checks the
draft tokens against the distribution q they were actually drawn from, here the GGUF model's own logits.

The model runs as llama.cpp loads it (its own quantized weights, e.g. the embedded pair's Q4_K_M), one sequence,
chain forwards only: tree attention (multi-path drafting) and hidden states (SPRINTER's verifier) are refused with
a clear error. The library is built by `make peers` (`verispec.native.llamacpp_build`); Python reaches llama.cpp
only through that library's six C functions (`verispec/native/llamacpp_shim.c`).
"""

from __future__ import annotations

import ctypes
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from verispec.errors import ConfigError, ModelFilesError
from verispec.models.hf import LLAMACPP_PREFIX
from verispec.models.protocol import ForwardOutput, ModelDefaults
from verispec.native import llamacpp_build

DEFAULT_CONTEXT = 8192  # tokens of KV cache; a longer prompt plus generation is refused before decoding
BATCH = 512  # tokens per llama_decode call when a long prompt is fed


def _load_library() -> ctypes.CDLL:
    path = llamacpp_build.library()
    if not path.exists():
        raise ConfigError(f"the llama.cpp backend is not built ({path} is missing): run `make peers` once (it builds "
                          f"llama.cpp from the pinned PyPI sdist; many minutes on a small CPU)")
    lib = ctypes.CDLL(str(path))
    lib.vs_load.restype = ctypes.c_void_p
    lib.vs_load.argtypes = [ctypes.c_char_p, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32, ctypes.c_int32]
    for name in ("vs_n_vocab", "vs_n_ctx"):
        getattr(lib, name).restype = ctypes.c_int32
        getattr(lib, name).argtypes = [ctypes.c_void_p]
    lib.vs_forward.restype = ctypes.c_int32
    lib.vs_forward.argtypes = [ctypes.c_void_p, ctypes.POINTER(ctypes.c_int32), ctypes.c_int32, ctypes.c_int32,
                               ctypes.c_int32, ctypes.c_void_p]
    lib.vs_truncate.restype = ctypes.c_int32
    lib.vs_truncate.argtypes = [ctypes.c_void_p, ctypes.c_int32]
    lib.vs_free.restype = None
    lib.vs_free.argtypes = [ctypes.c_void_p]
    return lib


class LlamaCppModel(ModelDefaults):
    """A GGUF model in llama.cpp with a KV cache of `cache_length` tokens (the `CausalLM` protocol, chain only).

    `tokenizer`: the model's Hugging Face tokenizer (the pair checks that draft and target share it); `vocab_size`:
    the width of the logits returned, padded with -inf when the GGUF's vocabulary is shorter than the pair's.
    """

    own_thread_pool = True  # llama.cpp computes on its own threads: the engine keeps torch's quiet meanwhile
    linear_backend = "llama.cpp"  # none of --linear-backend's: llama.cpp's own kernels for the GGUF's weights

    def __init__(self, path: str | Path, name: str, tokenizer: Any = None, vocab_size: int | None = None,
                 threads: int | None = None, context: int = DEFAULT_CONTEXT) -> None:
        path = Path(path)
        if not path.is_file():
            raise ModelFilesError(f"GGUF file {path} does not exist")
        self._lib = _load_library()
        threads = threads or torch.get_num_threads() or os.cpu_count() or 1
        self._handle = self._lib.vs_load(str(path).encode(), context, BATCH, threads, 0)
        if not self._handle:
            raise ModelFilesError(f"llama.cpp could not load {path} (not a GGUF model it supports?)")
        self.name, self.tokenizer, self.path = name, tokenizer, path
        self.model = None  # no torch module: no hidden states (`hidden_size` stays None)
        self.generation_config: Any = None  # its EOS ids, when the model comes with one (the embedded pair does)
        self.config: Any = None  # its transformers config, when known: the bench's FLOP counts read it
        self.gguf_vocab = int(self._lib.vs_n_vocab(self._handle))
        self.vocab_size = vocab_size or self.gguf_vocab
        if self.gguf_vocab > self.vocab_size:
            raise ModelFilesError(f"{path} has {self.gguf_vocab} tokens, more than the pair's {self.vocab_size}")
        # The tokens llama.cpp's context holds: the pre-flight context check's limit (`CausalLM.context_length`).
        self.context_length: int = int(self._lib.vs_n_ctx(self._handle))
        self.linear_kernel = f"llama.cpp ({path.name}, {threads} threads)"
        self._length = 0

    @property
    def cache_length(self) -> int:
        """Return the number of tokens held in the KV cache."""
        return self._length

    def forward(self, tokens: Sequence[int], n_logits: int = 1, return_hidden: bool = False,
                parents: Sequence[int] | None = None) -> ForwardOutput:
        """Append `tokens` to the cache and return the last `n_logits` positions' logits `[n_logits, V]`."""
        if parents is not None:
            raise ConfigError("the llama.cpp backend drafts one path: multi-path methods (paths > 1) need the torch "
                              "draft backend")
        if return_hidden:
            raise ConfigError("the llama.cpp backend returns no hidden states: SPRINTER's verifier reads the draft's "
                              "hidden states, so it needs the torch draft backend")
        n = len(tokens)
        if n == 0 or not 1 <= n_logits <= n:
            raise ValueError(f"forward needs 1 <= n_logits <= len(tokens), got {n_logits} and {n} tokens")
        if self._length + n > self.context_length:
            raise ConfigError(f"the llama.cpp draft's context holds {self.context_length} tokens; this decode needs "
                              f"{self._length + n}")
        ids = (ctypes.c_int32 * n)(*[int(t) for t in tokens])
        logits = torch.empty(n_logits, self.gguf_vocab, dtype=torch.float32)  # llama.cpp writes into it
        status = self._lib.vs_forward(self._handle, ids, n, self._length, n_logits, logits.data_ptr())
        if status != 0:
            raise RuntimeError(f"llama.cpp's decode failed with status {status} at cache length {self._length}")
        self._length += n
        if self.gguf_vocab < self.vocab_size:  # tokens the GGUF lacks can never be drafted
            pad = torch.full((n_logits, self.vocab_size - self.gguf_vocab), float("-inf"))
            logits = torch.cat([logits, pad], dim=1)
        return ForwardOutput(logits=logits)

    def keep(self, positions: Sequence[int]) -> None:
        """Keep the cache entries at `positions`: only a prefix, as one sequence has no tree to cut."""
        if list(positions) != list(range(len(positions))):
            raise ConfigError("the llama.cpp backend keeps only a prefix of its cache (one path)")
        self.truncate(len(positions))

    def truncate(self, length: int) -> None:
        """Roll the cache back to its first `length` tokens (no-op if it holds no more)."""
        if length < self._length:
            if not self._lib.vs_truncate(self._handle, max(length, 0)):
                raise RuntimeError(f"llama.cpp could not truncate its cache to {length} tokens")
            self._length = max(length, 0)

    def reset(self) -> None:
        """Empty the cache."""
        self.truncate(0)

    def close(self) -> None:
        """Free llama.cpp's model and context (also done when the object is collected)."""
        if getattr(self, "_handle", None):
            self._lib.vs_free(self._handle)
            self._handle = None

    def __del__(self) -> None:
        self.close()


def embedded_kind(spec: str | None) -> str | None:
    """Return which form of the embedded model `spec` names: "" for the shipped GGUF (`spec` None, "default",
    "llamacpp:default"), the llama.cpp weight type for "default-<type>" (the shipped GGUF requantised, e.g.
    `llamacpp:default-q4_0`), None when `spec` names a file. ConfigError for a type llama-quantize is not asked for."""
    name = spec.removeprefix(LLAMACPP_PREFIX) if spec is not None else ""
    if name in ("", "default"):
        return ""
    if not name.startswith("default-"):
        return None
    kind = name.removeprefix("default-").lower()
    if kind not in llamacpp_build.REQUANT_TYPES:
        raise ConfigError(f"{LLAMACPP_PREFIX}{name}: unknown llama.cpp weight type {kind!r}; the embedded model "
                          f"comes as {LLAMACPP_PREFIX}default or {LLAMACPP_PREFIX}default-TYPE with TYPE one of "
                          f"{', '.join(llamacpp_build.REQUANT_TYPES)}")
    return kind


def gguf_file(spec: str | None, role: str) -> Path:
    """Return the GGUF file llama.cpp runs for `role`: the default pair's cached file (`spec` None or "default"),
    that file requantised ("default-q4_0" and the like: written once by llama.cpp's llama-quantize, see
    `llamacpp_build.requantized`), or `spec` itself, with or without the `llamacpp:` prefix; ConfigError naming the
    problem otherwise."""
    from verispec.models.default_pair import DEFAULT_PAIR, gguf_path

    kind = embedded_kind(spec)
    if kind is not None:
        path = gguf_path(DEFAULT_PAIR[role])
        if not path.exists():
            raise ConfigError(f"the default {role} GGUF is not assembled at {path}: run `make models` first")
        return llamacpp_build.requantized(path, kind, DEFAULT_PAIR[role].sha256) if kind else path
    assert spec is not None  # None names the shipped GGUF (embedded_kind "")
    spec = spec.removeprefix(LLAMACPP_PREFIX)
    path = Path(spec).expanduser()
    if path.suffix != ".gguf":
        raise ConfigError(f"llama.cpp runs GGUF files; the {role} {spec!r} is not a .gguf file")
    if not path.is_file():
        raise ConfigError(f"the {role} GGUF {path} does not exist")
    return path


def load_llamacpp_model(spec: str | None, role: str, threads: int | None = None) -> LlamaCppModel:
    """Return the model named by `spec` (None or "default": the embedded pair's GGUF for `role`; "default-q4_0"
    and the like: that GGUF requantised; else a .gguf file) run by llama.cpp, with its Hugging Face tokenizer and
    the pair's vocabulary width."""
    import json

    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    from verispec.models.default_pair import DEFAULT_PAIR, model_files
    from verispec.models.gguf_direct import model_files as gguf_model_files

    path = gguf_file(spec, role)
    kind = embedded_kind(spec)
    if kind is not None:  # the embedded model (or its requantised copy): tokenizer and config cached from its GGUF
        folder = model_files(DEFAULT_PAIR[role])
        vocab = json.loads((Path(folder) / "config.json").read_text())["vocab_size"]
        name = DEFAULT_PAIR[role].upstream + (f" ({kind.upper()})" if kind else "")
        model = LlamaCppModel(path, name, AutoTokenizer.from_pretrained(str(folder)), vocab, threads)
        model.generation_config = GenerationConfig.from_pretrained(str(folder))
        model.config = AutoConfig.from_pretrained(str(folder))
        return model
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_model_files(path)))  # read from the GGUF once, then cached
    return LlamaCppModel(path, str(spec), tokenizer, None, threads)
