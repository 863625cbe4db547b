"""The int4 path's layers for a model built from GGUF blocks (`verispec.models.gguf_direct`): which kernel layer a
linear gets, prompt copies built when first needed, and an embedding that decodes its rows from their blocks.

Which layer: the decision `verispec.models.int4.use_int4_linears` makes on the float path, taken without its grid
search where the GGUF type already answers it: 4-bit blocks are a 4-bit grid (`Int4Linear` from their levels), and
5-, 6- and 8-bit blocks or float tensors are taken to lie on none (`Int8RowLinear`, or on "int4-rounded" the float
path's rounding, `grid_4bit`). Shapes the kernel does not take go through `use_int4_linears` itself.

Prompt copies (where the host makes them: `verispec.models.prompt_linear`, bfloat16 on CPUs with AMX; elsewhere the
kernels read prompts themselves): the float path builds each layer's copy at load. Here a layer gets a
`LazyPromptCopy`, built from the weights the layer computes with (`dequantized()`) on the first forward over more
than `PROMPT_ROWS` tokens: the first long prompt pays it (an int8 copy of the default target took 33 s on one thread
of a shared 2-core Xeon, against 2.3 s for the same 200-token prompt after), shorter prompts and decoding never do;
`build_prompt_copies` builds them up front where a timed run must not pay.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from verispec.models.gguf_blocks import dequantize
from verispec.models.grid4 import grid_4bit
from verispec.models.int4 import (
    MAX_INT8_INPUTS,
    ON_GRID,
    Int4Linear,
    Int8RowLinear,
    fits_4bit,
    layer_prompt_copy,
    reads_own_prompts,
    use_int4_linears,
)
from verispec.models.layer_cache import LayerCache
from verispec.models.prompt_linear import Bf16Linear, prompt_copy, prompt_format
from verispec.models.quantized import QuantizedLinear

COUNTS = ("int4", "int8_rows", "int8", "int4_rounded")  # the layer kinds, as `use_int4_linears` counts them


class LazyPromptCopy:
    """A layer's prompt copy in format `format`, built by `make()` on its first call (or by `build`)."""

    def __init__(self, make: Callable[[], Any], format: str) -> None:
        self._make, self.format = make, format
        self._layer: QuantizedLinear | Bf16Linear | Int8RowLinear | None = None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return x W^T + b from the copy, building it first if this is its first call."""
        return self.build()(x)

    def build(self) -> QuantizedLinear | Bf16Linear | Int8RowLinear:
        """Build the copy if it is not built yet; return it."""
        if self._layer is None:
            self._layer = self._make()
            self._make = None  # the layer's own weights stay reachable through the layer, not through this
        return self._layer

    @property
    def built(self) -> bool:
        return self._layer is not None

    def describe(self) -> str:
        """Return what reads prompts through this copy."""
        return prompt_copy(self.format)


def build_prompt_copies(model: torch.nn.Module) -> int:
    """Build every prompt copy of `model` not built yet (where a timed run must not pay for it: a benchmark's
    warm-up, a server's start); return how many were built."""
    copies = [getattr(getattr(m, "quantized", None), "prompt_linear", None) for m in model.modules()]
    todo = [c for c in copies if isinstance(c, LazyPromptCopy) and not c.built]
    for copy in todo:
        copy.build()
    return len(todo)


def lazy_prompt_copy(layer: Int4Linear | Int8RowLinear, bias: torch.Tensor | None, choice: str = "auto"
                     ) -> LazyPromptCopy | None:
    """Return the prompt copy of `layer`, to be built on its first call (an int8-rows copy of a 4-bit layer by the
    kernel from its packed weights, any other from `layer.dequantized()`); None where the layer reads prompts
    itself: the format is "none", or int8-rows for a layer on the 8-bit kernel already."""
    kind = prompt_format(choice)
    if reads_own_prompts(layer, kind):
        return None
    return LazyPromptCopy(lambda: layer_prompt_copy(layer, bias, kind), kind)


def kernel_layer(module: torch.nn.Linear, weight: Callable[[], torch.Tensor], levels: tuple | None = None,
                 round_to_4bit: bool = False, prompt: str | None = "auto", cache: LayerCache | None = None,
                 name: str = "") -> tuple[Any, dict[str, int]]:
    """Return (the int4 path's layer for the linear `module`, its count per kind). `weight()`: its float32 weight
    (called only where needed); `levels`: its (q, scale, offset) where the GGUF stores it in 4-bit blocks.
    `prompt`: the prompt copy's format, None for no copy (an LM head reads one row per prompt). `cache`: where a
    layer computed from `weight()` is found or kept, as `name` (`verispec.models.layer_cache`)."""
    counts = dict.fromkeys(COUNTS, 0)
    if fits_4bit(module) and levels is not None:
        layer, counts["int4"] = Int4Linear(*levels, module.bias), 1
    elif fits_4bit(module) and (round_to_4bit or module.in_features <= MAX_INT8_INPUTS):
        def compute() -> tuple[Any, dict[str, int]]:
            return _computed_layer(module, weight(), round_to_4bit)

        layer, counts = cache.layer(name, compute) if cache is not None else compute()
    else:  # a shape the kernel does not take: the float path's own layer (fbgemm), prompt copy included
        single = torch.nn.Linear(module.in_features, module.out_features, bias=False, device="meta")
        single.weight = torch.nn.Parameter(weight(), requires_grad=False)
        single.bias = module.bias
        counts = use_int4_linears(single, lm_head=single if prompt is None else None, prompt=prompt or "auto",
                                  round_to_4bit=round_to_4bit)
        return single.quantized, counts
    if prompt is not None:
        layer.prompt_linear = lazy_prompt_copy(layer, module.bias, prompt)
    return layer, counts


CACHED_LOOKUP = 64  # lookups of at most this many tokens go through the decoded rows kept per token
CACHED_ROWS = 4096  # the most decoded rows kept (24 MiB at 1536 wide); past it the kept rows are dropped


class BlockEmbedding(torch.nn.Module):
    """A token embedding kept in its GGUF blocks: a lookup decodes only the rows it reads (`dequantize`, bit for bit
    the float table's rows). Why: the float table of a 151,936-token vocabulary is 0.9 GB for a 1536-wide model and
    seconds to decode, for the few rows a forward reads."""

    def __init__(self, blocks: torch.Tensor, ggml_type: Any, shape: tuple[int, int]) -> None:
        super().__init__()
        self.num_embeddings, self.embedding_dim = shape
        self.ggml_type = ggml_type
        # [vocab, bytes per row] uint8; a buffer, not a parameter: no weights of its own to count or move
        self.register_buffer("blocks", blocks.reshape(self.num_embeddings, -1).clone(), persistent=False)
        self._rows: dict[int, torch.Tensor] = {}  # token id -> its decoded row, for lookups of a few tokens

    @property
    def weight(self) -> torch.Tensor:
        """The table's shape and dtype without its values (a meta tensor): for code that sizes an embedding by its
        weight (parameter counts); any computation with it fails loudly instead of reading zeros."""
        return torch.empty(self.num_embeddings, self.embedding_dim, device="meta")

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        """Return the float32 rows [..., dim] of token `ids` [...] (new tensors: the caller may write into them)."""
        flat = ids.reshape(-1)
        if flat.numel() > CACHED_LOOKUP:  # a prompt: decoded in one call
            return self._decode(flat).reshape(*ids.shape, -1)
        # A decode step's few rows, from the decoded rows kept per token: a row's decoding is about ten small ops
        # (0.3-0.4 ms a forward), and a decode reads the same common tokens again and again.
        wanted = flat.tolist()
        missing = sorted(set(wanted).difference(self._rows))
        new = dict(zip(missing, self._decode(flat.new_tensor(missing)).unbind(0), strict=True)) if missing else {}
        rows = torch.stack([new[token] if token in new else self._rows[token] for token in wanted])
        if len(self._rows) + len(new) > CACHED_ROWS:
            self._rows.clear()
        self._rows.update(new)
        return rows.reshape(*ids.shape, -1)

    def _decode(self, flat: torch.Tensor) -> torch.Tensor:
        rows = self.blocks.index_select(0, flat)
        return dequantize(rows, self.ggml_type, (rows.shape[0], self.embedding_dim))


def _computed_layer(module: torch.nn.Linear, weight: torch.Tensor, round_to_4bit: bool
                    ) -> tuple[Int4Linear | Int8RowLinear, dict[str, int]]:
    """Return (layer, counts) for a linear whose `weight` lies on no 4-bit grid the file states: rounded onto one
    (`round_to_4bit`, "int4-rounded") or in int8 per row."""
    counts = dict.fromkeys(COUNTS, 0)
    if round_to_4bit:
        q, scale, offset, share = grid_4bit(weight)
        counts["int4"], counts["int4_rounded"] = 1, int(share < ON_GRID)
        return Int4Linear(q, scale, offset, module.bias), counts
    counts["int8_rows"] = 1
    return Int8RowLinear(weight, module.bias), counts


def add_counts(total: dict[str, int], more: dict[str, int]) -> dict[str, int]:
    """Add `more` to `total` in place; return it."""
    for kind in COUNTS:
        total[kind] += more.get(kind, 0)
    return total

