"""Hugging Face adapter: any AutoModelForCausalLM (hub id, local folder, or GGUF file) behind `CausalLM`."""

from __future__ import annotations

import re
import shutil
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import SafetensorError

from verispec.errors import ConfigError, ModelFilesError
from verispec.models.kv_cache import InPlaceKVCache
from verispec.models.lean import LeanDecoder, lean_support
from verispec.models.manifest import safetensors_problem
from verispec.models.protocol import ForwardOutput, TreeCachedLM
from verispec.models.query_attention import query_attention_support
from verispec.models.reduced_head import ReducedHead
from verispec.models.tree import CacheTree

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16, "float64": torch.float64}


def parse_dtype(dtype: str | torch.dtype) -> torch.dtype:
    """Return the torch dtype named by `dtype` ("float32", "bfloat16", "float16", "float64")."""
    if isinstance(dtype, torch.dtype):
        return dtype
    if dtype not in DTYPES:
        raise ConfigError(f"unknown dtype {dtype!r}; choose one of {', '.join(DTYPES)}")
    return DTYPES[dtype]


class HFCausalLM(TreeCachedLM):
    """A transformers causal LM with a KV cache; implements `verispec.models.CausalLM`."""

    def __init__(
        self, model: Any, tokenizer: Any = None, name: str | None = None, vocab_ids: Sequence[int] | None = None,
        lean: bool = True, context_vocab: bool = True,
    ) -> None:
        """`vocab_ids`: a reduced head; the output layer is sliced to these token ids once, here (before any
        weight packing), and `forward` returns logits over the whole vocabulary with -inf outside them. With
        `context_vocab` the head also covers every token fed since the last reset (`verispec.models.reduced_head`).
        `lean`: run verispec's own decoder loop (`verispec.models.lean`) where the architecture allows it;
        False keeps transformers' forward (the same logits, more framework time per forward)."""
        from transformers import DynamicCache

        self.model = model.eval()
        self.tokenizer = tokenizer
        # Set by verispec.models.fastpath.apply_linear_backend when a CPU fast path is applied.
        self.linear_backend = "torch"
        # Forwards over more than this many tokens run other kernels than decode passes (the int4 path's prompt
        # copies), so the engine reads a prompt apart from a block drafted on top of it; None: the same kernels.
        self.prompt_rows: int | None = None
        # Set by the fast paths whose linears compute every token on its own (int4, int8): attend one query at a
        # time in forwards over at most `prompt_rows` tokens, so a block's logits equal one-token forwards'.
        self.per_query_attention = False
        self.linear_kernel = "transformers' own linears (float weights)"
        self.name = name or getattr(model.config, "name_or_path", None) or type(model).__name__
        self.vocab_size = int(model.get_output_embeddings().weight.shape[0])
        self.device = next(model.parameters()).device
        self.vocab_ids: torch.Tensor | None = None  # [N] long, sorted: the fixed token ids of a reduced head
        self.draft_vocab: int | None = None  # N, or None for the full head
        self._head: ReducedHead | None = None
        if vocab_ids is not None:
            self._slice_head(vocab_ids, context_vocab)
        self._dynamic_cache = lambda: DynamicCache(config=model.config)
        self.set_decoder_loop(lean)

    def set_decoder_loop(self, lean: bool, in_place_cache: bool = True, fuse: bool = True) -> None:
        """Run forwards on verispec's decoder loop (`lean`, where `lean_support` allows) or transformers' own;
        `decoder_loop` says which runs. The decoder loop keeps its KV cache in place (`InPlaceKVCache`) unless
        `in_place_cache` is False (transformers' DynamicCache, as transformers' forward always does), and runs the
        projections that share an input as one call where the linear backend allows, unless `fuse` is False.
        Empties the cache."""
        reason = lean_support(self.model) if lean else "transformers' forward requested"
        self._loop_request = (lean, in_place_cache, fuse)
        self._lean = self._lean_decoder(fuse) if reason is None else None
        self.decoder_loop = "verispec's decoder loop" if reason is None else f"transformers' forward ({reason})"
        if self._lean is not None and self.per_query_attention:
            self.decoder_loop += (", attention one query at a time" if self._lean.query_kernel is not None
                                  else f", torch's attention ({query_attention_support(self.model)})")
        layers = self.model.config.num_hidden_layers
        self._new_cache = (lambda: InPlaceKVCache(layers)) if self._lean is not None and in_place_cache \
            else self._dynamic_cache
        self.reset()

    def linears_changed(self) -> None:
        """Rebuild the decoder loop over the model's current linears (after a fast path replaced them, so that it
        can fuse the projections that share an input); empties the cache."""
        self.set_decoder_loop(*self._loop_request)

    def _lean_decoder(self, fuse: bool) -> LeanDecoder:
        per_query = self.per_query_attention and self.prompt_rows is not None \
            and query_attention_support(self.model) is None
        return LeanDecoder(self.model, fuse, self.prompt_rows if per_query else None)

    @torch.inference_mode()
    def _run(self, tokens: Sequence[int], n_logits: int, return_hidden: bool,
             tree: tuple[torch.Tensor, torch.Tensor] | None) -> ForwardOutput:
        """Return the last `n_logits` logits `[n, V]` (float32 at least, CPU) of `tokens` after the cached ones."""
        fresh = self._head.cover(tokens) if self._head is not None else None  # before the forward that uses them
        ids = torch.as_tensor(list(tokens), dtype=torch.long, device=self.device).unsqueeze(0)  # [1, T]
        if self._lean is not None:
            logits, hidden = self._lean(ids, self._cache, n_logits, return_hidden, tree)
            return self._outputs(logits, hidden, fresh, len(tokens))
        extra: dict[str, Any] = {}
        if tree is not None:
            mask, depths = tree  # [T, cache+T] bool, [T]
            extra["position_ids"] = depths.to(self.device).unsqueeze(0)  # [1, T]
            # An additive 4D mask is used as-is by transformers (eager and sdpa alike).
            additive = torch.zeros(mask.shape, dtype=self.model.dtype)
            additive.masked_fill_(~mask, torch.finfo(self.model.dtype).min)
            extra["attention_mask"] = additive.to(self.device)[None, None]  # [1, 1, T, cache+T]
        out = self.model(
            input_ids=ids,
            cache=self._cache,
            use_cache=True,
            logits_to_keep=n_logits,  # the LM head over 151k tokens is costly: compute only the rows we use
            output_hidden_states=return_hidden,
            **extra,
        )
        hidden = out.hidden_states[-1][0, -n_logits:] if return_hidden else None
        return self._outputs(out.logits[0, -n_logits:], hidden, fresh, len(tokens))

    def _outputs(self, logits: torch.Tensor, hidden: torch.Tensor | None, fresh: torch.Tensor | None = None,
                 fed: int = 0) -> ForwardOutput:
        """Return `logits` [n, V or N] and `hidden` [n, H] as the protocol wants them: CPU, full vocabulary,
        float32 at least (bf16/fp16 are upcast; float64 models keep their precision). `fresh`, `fed`: the reduced
        head's columns added by this forward of `fed` tokens (`ReducedHead.cover`)."""
        n_logits = logits.shape[0]
        upcast = (lambda t: t) if logits.dtype == torch.float64 else (lambda t: t.float())
        logits = upcast(logits)  # [n, V], or [n, N + context tokens] with a reduced head
        if self._head is not None:
            logits = ReducedHead.causal(logits, fresh, fed) if fresh is not None else logits
            # Back to full-vocabulary ids: -inf outside the head, so softmax, top-k/top-p and argmax give q zero there.
            full = logits.new_full((n_logits, self.vocab_size), float("-inf"))
            logits = full.index_copy_(1, self._head.ids, logits)  # [n, V]
        hidden = upcast(hidden).cpu() if hidden is not None else None  # [n, H]
        return ForwardOutput(logits=logits.cpu(), hidden=hidden)

    @property
    def config(self) -> Any:
        """The transformers config of the model."""
        return self.model.config

    @property
    def generation_config(self) -> Any:
        """The transformers generation config of the model (None when it has none)."""
        return getattr(self.model, "generation_config", None)  # not every transformers model carries one

    @property
    def context_length(self) -> int | None:
        """The positions the config says the model handles (`max_position_embeddings`), None when it does not."""
        positions = getattr(self.model.config, "max_position_embeddings", None)  # not every architecture states it
        return positions if isinstance(positions, int) and positions > 0 else None

    @property
    def hidden_size(self) -> int:
        """The width H of the hidden states `forward(return_hidden=True)` returns."""
        return int(self.model.config.hidden_size)

    @property
    def dtype(self) -> torch.dtype:
        """The dtype of the model's weights and KV cache."""
        return self.model.dtype

    @property
    def reduced_head(self) -> ReducedHead | None:
        """The reduced output layer (its `ids` are the tokens it covers now), or None for the full head."""
        return self._head

    def _slice_head(self, vocab_ids: Sequence[int], context: bool) -> None:
        """Replace the output layer by a `ReducedHead` over `vocab_ids` (N instead of V logits, plus the context's
        tokens with `context`)."""
        self._head = ReducedHead(self.model.get_output_embeddings(), vocab_ids, context)
        self.model.set_output_embeddings(self._head)  # the full layer's rows stay reachable only with `context`
        self.vocab_ids, self.draft_vocab = self._head.base_ids, len(self._head.base_ids)

    def truncate(self, length: int) -> None:
        """Roll the KV cache back to its first `length` tokens."""
        assert length >= 0, f"cannot truncate to a negative length {length}"
        if length < self.cache_length:
            self._cache.crop(length - self.cache_length)  # negative: remove that many tokens
            self._tree.truncate(length)

    def keep(self, positions: Sequence[int]) -> None:
        """Keep only the cache entries at `positions` (a chain: the committed prefix plus one tree path)."""
        self._tree.check_chain(positions)
        index = torch.as_tensor(list(positions), dtype=torch.long, device=self.device)
        if isinstance(self._cache, InPlaceKVCache):
            self._cache.keep(index)
        else:
            for layer in self._cache.layers:
                if getattr(layer, "is_initialized", True) and getattr(layer, "keys", None) is not None:
                    layer.keys = layer.keys.index_select(-2, index)
                    layer.values = layer.values.index_select(-2, index)
        self._tree = CacheTree.chain(len(positions))

    def reset(self) -> None:
        """Empty the KV cache (and a reduced head's context tokens)."""
        self._cache = self._new_cache()
        self._tree = CacheTree.chain(0)
        if self._head is not None:
            self._head.clear()


# A Hugging Face hub id: "name" or "owner/name". Anything else that is not an existing path cannot be loaded.
HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


LLAMACPP_PREFIX = "llamacpp:"  # a model spec with this prefix runs in llama.cpp, not in torch


def check_model_spec(name_or_path: str) -> None:
    """Raise ModelFilesError when `name_or_path` is a path with no model in it (a folder without config.json, a
    plain file, a missing .gguf) or neither an existing path nor a hub id; cheap, so callers check before loading.
    `llamacpp:GGUF` (or `llamacpp:default`, `llamacpp:default-q4_0`) names a GGUF run by llama.cpp
    (`verispec.models.llamacpp`)."""
    if name_or_path.startswith(LLAMACPP_PREFIX):
        name_or_path = name_or_path.removeprefix(LLAMACPP_PREFIX)
        if name_or_path in ("", "default") or name_or_path.startswith("default-"):
            return  # the embedded model, as shipped or requantised: its weight type is checked where it is built
        if not name_or_path.endswith(".gguf"):
            raise ModelFilesError(f"llama.cpp runs GGUF files: {LLAMACPP_PREFIX}{name_or_path} names no .gguf file "
                                  f"(use {LLAMACPP_PREFIX}default for the embedded model)")
    path = Path(name_or_path).expanduser()
    if path.suffix == ".gguf" and not path.is_file():
        raise ModelFilesError(f"GGUF file not found: {path}")
    if path.is_dir() and not (path / "config.json").is_file():
        raise ModelFilesError(f"the folder {path} holds no model: a model folder has a config.json beside the "
                              f"weights and the tokenizer files")
    if path.is_file() and path.suffix != ".gguf":
        raise ModelFilesError(f"{path} is a file but not a model: give a model folder, a .gguf file or a hub id")
    if path.is_dir() and (problem := safetensors_problem(path)):
        raise ModelFilesError(f"cannot load the model in {path}: {problem}")  # e.g. a truncated download
    if not path.exists() and (not HUB_ID.match(name_or_path) or name_or_path.startswith(("~", "."))):
        raise ModelFilesError(f"model not found: {name_or_path!r} is neither an existing file or folder nor a hub id "
                              f"(like Qwen/Qwen2.5-Coder-0.5B-Instruct)")


def load_pretrained(
    name_or_path: str, gguf_file: str | None = None, dtype: str | torch.dtype = "float32", device: str = "cpu"
) -> tuple[Any, Any]:
    """Return (model, tokenizer) from a hub id or local folder, or from a GGUF file (`gguf_file` or a .gguf path)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch_dtype = parse_dtype(dtype)
    path = Path(name_or_path).expanduser()
    if gguf_file is None:
        check_model_spec(name_or_path)
    if gguf_file is None and path.suffix == ".gguf":
        name_or_path, gguf_file = str(path.parent), path.name
    kwargs: dict[str, Any] = {"gguf_file": gguf_file} if gguf_file else {}
    try:
        tokenizer = AutoTokenizer.from_pretrained(name_or_path, **kwargs)
        model = AutoModelForCausalLM.from_pretrained(name_or_path, dtype=torch_dtype, **kwargs)
    except (OSError, ValueError, SafetensorError) as exc:  # a missing model or file, an offline hub, a bad config
        where = f"{name_or_path!r}" + (f" ({gguf_file})" if gguf_file else "")
        raise ModelFilesError(f"cannot load model {where}: {exc}") from exc
    return model.to(device), tokenizer


def save_converted(model: Any, tokenizer: Any, out_dir: Path, marker: dict[str, Any] | None = None) -> None:
    """Save a (GGUF-dequantised) model and its tokenizer as safetensors into `out_dir`, atomically: written into a
    unique scratch folder beside it, then renamed into place. With `marker`, the folder's marker file records it
    plus the manifest (size and sha256) of every file, written before the rename (`verispec.models.manifest`)."""
    from verispec.models.manifest import file_manifest, publish_folder, scratch_folder, write_marker

    # A GGUF-loaded model refuses to save while it still carries its quantizer (the weights are dequantised).
    model.hf_quantizer = None
    if hasattr(model.config, "quantization_config"):
        del model.config.quantization_config
    model.config.name_or_path = out_dir.name
    scratch = scratch_folder(out_dir)
    try:
        model.save_pretrained(scratch, safe_serialization=True)
        tokenizer.save_pretrained(scratch)
        if marker is not None:
            write_marker(scratch, {**marker, "files": file_manifest(scratch)})
        publish_folder(scratch, out_dir)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
