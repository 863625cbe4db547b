"""A GGUF model built straight into the int4 path's kernel layers: no float32 copy of the model, no grid search.

Why: the int4 path used to load a float32 copy of the GGUF (6 GB for the 1.5B target, converted once) and search
every linear for the 4-bit grid its weights came from (`verispec.models.grid4.grid_4bit`): minutes per load. Here
each linear is built from its own GGUF tensor (`verispec.models.gguf_blocks`), one at a time, into the layer the
float path would give it (`verispec.models.gguf_layers.kernel_layer`):
  - 4-bit blocks (Q4_0, Q4_1, Q4_K) give the kernel's levels, scale and offset as they are (`Int4Linear`);
  - any other type is dequantised to a transient float32 tensor: int8 per row, or rounded to 4 bits on
    "int4-rounded".
Norms and biases are float32; the embedding stays in its blocks (`BlockEmbedding`) unless the LM head shares it.
The LM head stays a float layer until `finish_gguf_model` (after `HFCausalLM` may have sliced it to a draft's reduced
head). What differs from the float path: a 4-bit layer's scale and offset are the GGUF's (d * sc and -dmin * m)
rounded to float16, where the float path rounds the grid it recovered (the group's minimum and range): both are the
same grid up to that rounding; and prompt copies are built on first use from the weights the kernel computes with.

The transformers model is created on the meta device (no float weights allocated or initialised) from a config
cached once per GGUF with its tokenizer (`model_files`, read from the GGUF's metadata by `verispec.models.gguf_meta`:
a few seconds for a 150k-token vocabulary). Architectures: qwen2 and llama (llama.cpp stores llama's Q and K rows in
another order, which transformers undoes: the same row permutation is applied to the levels here).
"""

from __future__ import annotations

import copy
import ctypes
import hashlib
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import gguf
import torch

from verispec.cache import cache_dir
from verispec.errors import ConfigError, ModelFilesError
from verispec.models import layer_cache
from verispec.models.fastpath import record_linear_backend
from verispec.models.gguf_blocks import FOUR_BIT, GGML, dequantize, four_bit_levels, readable
from verispec.models.gguf_file import GGUFFile, TensorEntry, type_name
from verispec.models.gguf_layers import COUNTS, BlockEmbedding, add_counts, kernel_layer
from verispec.models.gguf_meta import read_config_and_tokenizer
from verispec.models.int4 import use_int4_linears
from verispec.models.layer_cache import LayerCache
from verispec.models.manifest import (
    cache_lock,
    file_manifest,
    manifest_problem,
    publish_folder,
    read_marker,
    scratch_folder,
    write_marker,
)
from verispec.models.quantized import replace_linears

ARCHITECTURES = ("qwen2", "llama")  # GGUF `general.architecture` values built here
FILES_LAYOUT = 1  # bump when what `model_files` writes changes: older folders are rebuilt


def direct_support(path: str | Path) -> str | None:
    """Return None when the GGUF at `path` can be built here, else why not (its architecture). Reads the header
    only; raises ModelFilesError for a file that is no GGUF, is truncated, or holds a tensor type neither verispec
    nor the gguf package decodes."""
    return _support(GGUFFile(path))


def _support(source: GGUFFile) -> str | None:
    if source.architecture not in ARCHITECTURES:
        return f"architecture {source.architecture!r} (built directly: {', '.join(ARCHITECTURES)})"
    for entry in source.tensors.values():
        if entry.nbytes == 0 or not readable(entry.ggml_type):
            raise ModelFilesError(f"tensor {entry.name} of {source.path} has type {type_name(entry)}, which neither "
                                  f"verispec nor the gguf package can decode")
    return None


def file_key(path: Path) -> str:
    """A cache key for a user's GGUF file: its resolved path, size and modification time (hashing GBs would cost
    seconds per load; a file replaced in place gets a new mtime)."""
    stat = path.stat()
    return hashlib.sha256(f"{path.resolve()}\0{stat.st_size}\0{stat.st_mtime_ns}".encode()).hexdigest()


def model_files(path: str | Path, key: str | None = None, progress: bool = True) -> Path:
    """Return a cached folder holding the config.json, generation_config.json and tokenizer files of the GGUF at
    `path`, read from its metadata the first time (`verispec.models.gguf_meta`; then reused). `key`: what identifies
    the file's contents (the default pair's sha256); by default `file_key`. Written whole or not at all (a scratch
    folder renamed into place, under a file lock), and rebuilt when a file's size differs from its manifest."""
    path = Path(path).expanduser()
    key = key or file_key(path)
    folder = cache_dir() / "gguf-meta" / key[:32]
    if _whole(folder):
        return folder
    with cache_lock(cache_dir() / "locks" / f"gguf-meta-{key[:32]}.lock", f"the tokenizer of {path.name}"):
        if _whole(folder):  # another process built it while we waited
            return folder
        if progress:
            print(f"verispec: reading the tokenizer and config of {path.name} (once; cached in {folder})",
                  file=sys.stderr)
        from transformers import GenerationConfig

        scratch = scratch_folder(folder)
        try:
            try:
                config, tokenizer = read_config_and_tokenizer(path)
            except (OSError, ValueError, KeyError) as exc:
                raise ModelFilesError(f"cannot read the tokenizer and config of {path}: {exc}") from exc
            config.save_pretrained(scratch)
            GenerationConfig.from_model_config(config).save_pretrained(scratch)
            tokenizer.save_pretrained(scratch)
            write_marker(scratch, {"source": str(path), "key": key, "layout": FILES_LAYOUT,
                                   "files": file_manifest(scratch)})
            publish_folder(scratch, folder)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    return folder


def _whole(folder: Path) -> bool:
    marker = read_marker(folder)
    return (marker is not None and marker.get("layout") == FILES_LAYOUT and "files" in marker
            and manifest_problem(folder, marker["files"]) is None)


@dataclass
class GGUFModel:
    """A transformers CausalLM built from GGUF blocks, with what `finish_gguf_model` and the outputs need."""

    model: Any  # every decoder linear a kernel layer; the output layer still float
    tokenizer: Any
    counts: dict[str, int]  # the decoder's layers per kind, as `use_int4_linears` counts them
    head_type: GGML  # how the GGUF stores the output layer (the embedding's type where the two are tied)
    head_rows: int  # the output layer's rows in the file (a draft's reduced head has fewer: not cached)
    layers: LayerCache  # the layers computed rather than repacked, found in or kept for the cache


def load_gguf_model(path: str | Path, files: Path, round_to_4bit: bool = False, prompt: str = "auto",
                    float_head: bool = False) -> GGUFModel:
    """Build the GGUF model at `path` (qwen2 or llama) with the config and tokenizer in `files` (`model_files`):
    every decoder linear a kernel layer, the LM head still float (see `finish_gguf_model`), except an untied head
    whose kernel layer the layer cache holds: a placeholder then, unless `float_head` (a reduced draft head is
    sliced from its float rows). `round_to_4bit`: the "int4-rounded" backend. `prompt`: the prompt copies' format
    (`verispec.models.prompt_linear`)."""
    from transformers import AutoConfig, AutoModelForCausalLM, GenerationConfig

    weights = _Weights(GGUFFile(path))
    if (reason := _support(weights.source)) is not None:
        raise ConfigError(f"{path}: verispec builds no {reason} from GGUF blocks; use --linear-backend onednn")
    config = AutoConfig.from_pretrained(str(files))
    weights.map_names(config)
    with torch.device("meta"):  # no float weights allocated or initialised: the GGUF's replace them
        model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    model.generation_config = GenerationConfig.from_pretrained(str(files))
    head, embedding = model.get_output_embeddings(), model.get_input_embeddings()
    tied = getattr(config, "tie_word_embeddings", False)  # the GGUF has no output.weight: the head reads the table
    if not tied:
        tensor, entry = weights.entry_of("model.embed_tokens.weight")
        model.set_input_embeddings(BlockEmbedding(weights.source.raw(tensor), entry.ggml_type, entry.shape))
        weights.source.release(tensor)  # the embedding keeps a copy of its blocks
    cache = LayerCache(layer_cache.folder_for(cache_dir(), Path(files).name, round_to_4bit), str(path))
    # The head's float rows (0.9 GB for a 151,936-token vocabulary at width 1536) only to be replaced by the cached
    # layer: skipped, the load's peak memory lower by as much
    cached_head = not tied and not float_head and "lm_head" in cache.found \
        and weights.entry_of("lm_head.weight")[1].ggml_type not in FOUR_BIT
    for name, param in list(model.named_parameters()):
        owner, attr = name.rsplit(".", 1)
        module = model.get_submodule(owner)
        if module is head and attr == "weight" and tied:
            continue
        if isinstance(module, torch.nn.Linear) and attr == "weight" and (module is not head or cached_head):
            value = param.new_empty(module.out_features, 0, device="cpu")  # built from its blocks (or cache) below
        else:
            value = weights.float(name)
        setattr(module, attr, torch.nn.Parameter(value, requires_grad=False))
    if tied:  # one float table: the embedding's lookups and the head's rows, as a float model has it
        head.weight = embedding.weight
    _rebuild_buffers(model)
    counts = dict.fromkeys(COUNTS, 0)
    names = {module: name for name, module in model.named_modules()}

    def make(module: torch.nn.Linear) -> Any:
        name = names[module]
        layer, kinds = kernel_layer(module, lambda: weights.float(f"{name}.weight"), weights.levels(f"{name}.weight"),
                                    round_to_4bit, prompt, cache, name)
        add_counts(counts, kinds)
        return layer

    replace_linears(model.model, make)
    left = [n for n, t in [*model.named_parameters(), *model.named_buffers()] if t.device.type == "meta"]
    if left:
        raise ModelFilesError(f"the GGUF file {path} has no tensor for {left[0]}")
    head_entry = weights.entry_of("model.embed_tokens.weight" if tied else "lm_head.weight")[1]
    return GGUFModel(model.eval(), shared_tokenizer(Path(files)), counts, head_entry.ggml_type, head_entry.shape[0],
                     cache)


_TOKENIZERS: dict[str, Any] = {}  # by the digest of their files: a target and a draft of one family share theirs


def shared_tokenizer(files: Path) -> Any:
    """Return the tokenizer in the folder `files` (`model_files`). Its vocabulary and rules are read once per process
    for each set of tokenizer files; a folder whose only difference is its chat template gets a copy with its own.
    Why: transformers parses a 7 MB tokenizer.json in Python, about 1 s on a 2-core Xeon, and the default pair's
    GGUFs carry the same tokenizer (their chat templates differ)."""
    from transformers import AutoTokenizer

    digest = hashlib.sha256()
    for path in sorted(files.iterdir()):
        if path.is_file() and path.name.startswith(("tokenizer", "special_tokens")):
            digest.update(path.name.encode() + b"\0" + path.read_bytes())
    key = digest.hexdigest()
    template = files / "chat_template.jinja"
    if key not in _TOKENIZERS:
        _TOKENIZERS[key] = AutoTokenizer.from_pretrained(str(files))
        return _TOKENIZERS[key]
    tokenizer = copy.copy(_TOKENIZERS[key])  # shares the parsed vocabulary and rules (read-only)
    tokenizer.chat_template = template.read_text() if template.is_file() else None
    return tokenizer


def finish_gguf_model(model: Any, built: GGUFModel, backend: str, requested: str | None = None) -> None:
    """Route the float output layer of `model` (an `HFCausalLM` over `built`, whose head it may have sliced to a
    reduced draft head) as `use_int4_linears` routes an LM head (no prompt copy: a prompt's forward reads its last
    row only), and record `backend` ("int4" or "int4-rounded"; `requested`: what the user asked for, e.g. "auto")
    and the kernels on `model`. A head stored in 4-bit blocks (or tied to such an embedding) takes the float path's
    grid search: its float rows are all there is of it by now."""
    head, rounded = model.model.get_output_embeddings(), backend == "int4-rounded"
    counts = dict.fromkeys(COUNTS, 0)
    if built.head_type in FOUR_BIT:
        counts = use_int4_linears(head, lm_head=head, round_to_4bit=rounded)
    else:
        # a draft's reduced head (`ReducedHead`, or a sliced linear) is this load's own: not cached
        full = isinstance(head, torch.nn.Linear) and head.out_features == built.head_rows
        cache = built.layers if full else None

        def make(module: torch.nn.Linear) -> Any:
            layer, kinds = kernel_layer(module, lambda: module.weight, None, rounded, None, cache, "lm_head")
            add_counts(counts, kinds)
            return layer

        replace_linears(head, make, lm_head=head)
    built.layers.save()
    record_linear_backend(model, backend, requested or backend, add_counts(counts, built.counts))
    _return_freed_memory()


def _return_freed_memory() -> None:
    """Hand the load's freed temporaries back to the system. Why: glibc keeps freed heap memory for reuse, and after
    the 1.5B target's load it held 2.3 GB of float temporaries (dequantised layers, the LM head) beside the 1.4 GB
    model; `malloc_trim` returns it. Elsewhere (no glibc) this does nothing."""
    try:
        ctypes.CDLL(None).malloc_trim(0)
    except (OSError, AttributeError):
        pass


class _Weights:
    """The GGUF tensors behind a transformers model's parameters (names mapped by gguf's own tables)."""

    def __init__(self, source: GGUFFile) -> None:
        self.source = source
        self.config: Any = None
        self.names: Any = None

    def map_names(self, config: Any) -> None:
        """Map the parameters of a model of `config` (its layer count and heads) to the file's tensors."""
        arch = next(k for k, v in gguf.MODEL_ARCH_NAMES.items() if v == self.source.architecture)
        self.config, self.names = config, gguf.get_tensor_name_map(arch, config.num_hidden_layers)

    def entry_of(self, name: str) -> tuple[str, TensorEntry]:
        """Return (GGUF tensor name, its entry) of the transformers parameter `name`."""
        module, suffix = name.rsplit(".", 1)
        mapped = self.names.get_name(module)
        tensor = f"{mapped}.{suffix}" if mapped is not None else None
        if tensor not in self.source.tensors:
            raise ModelFilesError(f"the GGUF file {self.source.path} has no tensor for {name}"
                                  + (f" ({tensor})" if tensor else ""))
        return tensor, self.source.tensors[tensor]

    def rows(self, tensor: str) -> torch.Tensor | None:
        """The row order transformers gives a llama Q or K projection (llama.cpp interleaves each head's rotary
        halves), as an index into the stored rows; None for every other tensor."""
        if self.source.architecture != "llama" or not any(p in tensor for p in (".attn_q.", ".attn_k.")):
            return None
        heads = self.config.num_attention_heads if ".attn_q." in tensor else self.config.num_key_value_heads
        rows = self.source.tensors[tensor].shape[0]
        return torch.arange(rows).reshape(heads, rows // heads // 2, 2).transpose(1, 2).reshape(-1)

    def float(self, name: str) -> torch.Tensor:
        """The float32 value of parameter `name`."""
        tensor, entry = self.entry_of(name)
        value = dequantize(self.source.raw(tensor), entry.ggml_type, entry.shape)
        self.source.release(tensor)  # `value` is a copy
        order = self.rows(tensor)
        return value[order] if order is not None else value

    def levels(self, name: str) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor] | None:
        """The (q, scale, offset) of parameter `name` where the file stores it in 4-bit blocks, else None."""
        tensor, entry = self.entry_of(name)
        if entry.ggml_type not in FOUR_BIT:
            return None
        levels = four_bit_levels(self.source.raw(tensor), entry.ggml_type, entry.shape)
        self.source.release(tensor)  # the levels are copies
        order = self.rows(tensor)
        return tuple(part[order] for part in levels) if order is not None else levels


def _rebuild_buffers(model: Any) -> None:
    """Recompute the buffers a meta-device model holds no values for: the rotary embedding's inverse frequencies
    (not stored in checkpoints; transformers computes them at construction, from the config)."""
    for name, module in list(model.named_modules()):
        if any(b.device.type == "meta" for b in module.buffers(recurse=False)):
            if not type(module).__name__.endswith("RotaryEmbedding"):
                raise ConfigError(f"cannot rebuild the buffers of {name} ({type(module).__name__}) off the meta device")
            owner, _, attr = name.rpartition(".")
            setattr(model.get_submodule(owner) if owner else model, attr, type(module)(config=module.config))
