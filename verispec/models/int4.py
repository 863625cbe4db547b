"""4-bit CPU linears: weights in 4 bits per group of 32 inputs where they already lie on such a grid, int8 elsewhere.

Why: a one-token CPU forward reads every weight once, so its time is the bytes read; 4-bit weights read half of
int8's. A model converted from a 4-bit GGUF (the default target: Q4_K_M) holds, in most of its linears, weights
that are exactly `scale * q + offset` with q in 0..15 for every group of 32 inputs (llama.cpp's Q4_K sub-blocks).
Those layers are repacked without rounding (`grid4.grid_4bit` recovers q, scale and offset; scale and offset kept in
float16) and run by verispec's own kernel (verispec/native/int4_linear.cpp: AVX-512 or AVX2, activations quantized to
int8 per token, a forward over a few tokens costing little more than one). Layers whose weights are on no 4-bit
grid (the GGUF's 6-bit layers, the LM head, any float model) go to int8 on the same kernel's 8-bit path in decode
and verify passes (`Int8RowLinear`; measured on 2 threads it read a 1536 x 8960 layer 1.4x and the 151,936 x 1536
LM head 1.2x faster than fbgemm's dynamic linear, which also pays a fixed cost per call that made a 256 x 1536 layer
take several times its 4-bit neighbour's time); fbgemm keeps only layers the kernel's shapes do not fit.

Causality: activations get one scale per token and the kernel's sums run in a fixed order, so every row's outputs
are bit-identical alone or inside any batch (tested).
"""

from __future__ import annotations

import math
import mmap
from pathlib import Path
from typing import Any

import torch

from verispec.models.grid4 import GROUP, grid_4bit
from verispec.models.prompt_linear import Bf16Linear, copy_format, onednn_bf16, prompt_copy, prompt_format, prompt_layer
from verispec.models.quantized import QuantizedLinear, quantized_engine, replace_linears
from verispec.native.build import load_native

ROWS = 16  # output rows per packed block (one AVX-512 vector)
QUAD = 4  # blocks stored interleaved, group by group
HUGE_PAGE = 2 << 20  # bytes; packed weights at least this large go to memory backed by huge pages
ON_GRID = 0.99  # a layer goes to 4 bits when at least this share of its groups lies exactly on a 4-bit grid
PROMPT_ROWS = 64  # forwards over more tokens than this (prompts) run a layer's prompt copy, if any (see KernelLinear)
# Off-grid layers with at most this many inputs run the kernel's 8-bit path (it sums in int32), wider ones fbgemm's.
MAX_INT8_INPUTS = 1 << 16
SOURCE = Path(__file__).resolve().parent.parent / "native" / "int4_linear.cpp"
# The kernel and its Python module, each compiled once and linked.
SOURCES = (SOURCE, SOURCE.parent / "int4_pack.cpp", SOURCE.parent / "int4_module.cpp")
# The header they share and the kernel's instruction-set paths: AVX-512 VNNI, AMX tiles (8-bit passes), AVX2 /
# AVX-VNNI (256-bit).
INCLUDES = tuple(SOURCE.parent / name for name in ("int4_linear.h", "int4_avx512.h", "int4_amx.h", "int4_avx2.h"))
# How describe() names each instruction-set level the kernel is compiled for (verispec.native.cpu).
ISA_NAMES = {"avx512-vnni": "AVX-512 VNNI", "avx-vnni": "AVX-VNNI (256-bit)", "avx2": "AVX2",
             "portable": "portable C++ (slow: no AVX2 here)"}


def extension(isa: str | None = None) -> Any:
    """Build (once per machine, source and level, cached) and return the 4-bit linear kernel's extension module for
    instruction-set level `isa` (verispec.native.cpu; None: the best this CPU runs, or $VERISPEC_ISA)."""
    return load_native(SOURCES, "int4", isa, instead="Use --linear-backend int8 instead.", includes=INCLUDES)


def pack(q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor) -> torch.Tensor:
    """Return the kernel's layout of 4-bit weights: [out/64, in/32, 4, 320] uint8, per quad of 16-row blocks, group
    and block: 256 bytes of packed levels, 16 float16 scales, 16 float16 offsets (described in int4_linear.cpp),
    written by the kernel's `pack4_into` (int4_pack.cpp) into memory on 2 MiB pages."""
    n, k = q.shape
    out = huge_page_empty((n // (QUAD * ROWS), k // GROUP, QUAD, 320), torch.uint8)
    extension().pack4_into(q.to(torch.uint8).contiguous(), scale.float().contiguous(), offset.float().contiguous(),
                           out)
    return out


def huge_page_empty(shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor:
    """Return an uninitialized contiguous tensor in memory backed by 2 MiB pages where the system allows it (Linux
    THP in "madvise" mode), else a plain one.

    Why: a decode step streams every weight once; with 4 KiB pages the stream misses the TLB every 4 KiB and the
    4-bit kernel read its weights at about 11 GB/s against fbgemm's 19 (measured on 24 layers of 1536 x 8960 that
    do not fit in cache); on 2 MiB pages, 15 GB/s and 0.83x of fbgemm's time per layer."""
    nbytes = math.prod(shape) * dtype.itemsize
    if nbytes < HUGE_PAGE or not hasattr(mmap, "MADV_HUGEPAGE"):
        return torch.empty(shape, dtype=dtype)
    region = mmap.mmap(-1, nbytes + HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    region.madvise(mmap.MADV_HUGEPAGE)
    raw = torch.frombuffer(region, dtype=torch.uint8)  # keeps `region` alive as long as the tensor lives
    start = (-raw.data_ptr()) % HUGE_PAGE
    return raw[start: start + nbytes].view(dtype).view(shape)


def huge_page_copy(t: torch.Tensor) -> torch.Tensor:
    """Return a contiguous copy of `t` on 2 MiB pages where the system allows it (`huge_page_empty`)."""
    out = huge_page_empty(tuple(t.shape), t.dtype)
    out.copy_(t)
    return out


class KernelLinear:
    """What the kernel's layers share: the call, the prompt-size switch and the output's dtype and shape.

    `prompt_linear`: the layer to run forwards of more than `PROMPT_ROWS` tokens instead, or None for the layer
    itself: a copy of the same weights in the host's fastest arithmetic for prompts (`verispec.models.prompt_linear`:
    int8 on this kernel's AMX tiles, bfloat16 on oneDNN, or int8 on fbgemm).
    Every method reads its prompt in one such forward, so prompt positions are computed alike for all and greedy
    `sd` still reproduces greedy `ar`.
    """

    out_features: int
    in_features: int
    prompt_linear: QuantizedLinear | Bf16Linear | None

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return x W^T + b for `x` of shape [..., in] in any float dtype (computed in fp32, returned in x's)."""
        rows = x.reshape(-1, self.in_features).float().contiguous()
        if self.prompt_linear is not None and rows.shape[0] > PROMPT_ROWS:
            return self.prompt_linear(x)
        return self._run(rows).to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def _run(self, rows: torch.Tensor) -> torch.Tensor:
        raise NotImplementedError

    def _prompts(self) -> str:
        if self.prompt_linear is None:
            return ""
        copy = prompt_copy(copy_format(self.prompt_linear))
        return f"; over {PROMPT_ROWS} tokens {copy}"

    def _isa(self) -> str:
        return ISA_NAMES[self.kernel.isa()]


def kernel_shape(out_features: int, in_features: int) -> bool:
    """Return whether the kernel's linears take this shape: outputs a multiple of 64, inputs a multiple of 32, and
    at most `MAX_INT8_INPUTS` inputs (the 8-bit path's int32 sums)."""
    return not (out_features % (QUAD * ROWS) or in_features % GROUP) and in_features <= MAX_INT8_INPUTS


def _check_shape(out_features: int, in_features: int) -> None:
    if out_features % (QUAD * ROWS) or in_features % GROUP:
        raise ValueError(f"the kernel's linears need outputs in multiples of {QUAD * ROWS} and inputs in multiples "
                         f"of {GROUP}; got {out_features} x {in_features}")


class Int4Linear(KernelLinear):
    """y = x W^T + b with W in 4 bits per group of 32 (float16 scale and offset) and x in int8 per token."""

    def __init__(self, q: torch.Tensor, scale: torch.Tensor, offset: torch.Tensor, bias: torch.Tensor | None,
                 prompt_linear: QuantizedLinear | Bf16Linear | None = None) -> None:
        self.out_features, self.in_features = q.shape
        self.prompt_linear = prompt_linear
        _check_shape(self.out_features, self.in_features)
        self.packed = pack(q, scale, offset)
        self.bias = bias.detach().float().contiguous() if bias is not None else torch.empty(0)
        self.kernel = extension()

    def _run(self, rows: torch.Tensor) -> torch.Tensor:
        return self.kernel.linear(rows, self.packed, self.bias)

    def state(self) -> dict[str, torch.Tensor]:
        """Return the tensors `from_state` rebuilds this layer from (its prompt copy is not among them)."""
        return {"packed": self.packed, "bias": self.bias}

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor]) -> Int4Linear:
        """Return the layer whose `state()` is `state`, without packing anything again."""
        layer = cls.__new__(cls)
        quads, groups = state["packed"].shape[:2]
        layer.out_features, layer.in_features = quads * QUAD * ROWS, groups * GROUP
        layer.packed, layer.bias = huge_page_copy(state["packed"]), state["bias"].float().contiguous()
        layer.prompt_linear, layer.kernel = None, extension()
        return layer

    def dequantized(self) -> torch.Tensor:
        """Return the float32 weights [out, in] this layer computes with (for tests and error reports)."""
        quads, groups = self.packed.shape[:2]
        cells = self.packed.reshape(quads, groups, QUAD, 320)
        nibbles = cells[..., :256].reshape(quads, groups, QUAD, 4, ROWS, 4)
        levels = torch.cat([nibbles & 0x0F, nibbles >> 4], dim=3)  # [quad, group, block, 8, row, 4]
        q = levels.permute(0, 2, 4, 1, 3, 5).reshape(self.out_features, groups, GROUP).float()

        def per_row(v: torch.Tensor) -> torch.Tensor:  # [quad, group, block, 32] bytes -> [out, groups, 1]
            return v.contiguous().view(torch.float16).float().permute(0, 2, 3, 1).reshape(self.out_features, groups, 1)

        scale, offset = per_row(cells[..., 256:288]), per_row(cells[..., 288:])
        return (q * scale + offset).reshape(self.out_features, self.in_features)

    def describe(self) -> str:
        """Return which kernel and number formats this layer runs."""
        least = self.kernel.amx4_min_tokens()
        tiles = f"; passes of {least}+ tokens on AMX tiles" if least else ""
        formats = "4-bit weights per 32 inputs, per-token dynamic 8-bit activations"
        return f"{formats} ({self._isa()}{tiles}){self._prompts()}"


def pack8(wq: torch.Tensor) -> torch.Tensor:
    """Return the kernel's layout of int8 weights [out, in]: [out/64, in/32, 4, 512] int8, per quad of 16-row blocks,
    chunk of 32 inputs and block: 8 vectors of 16 rows x 4 inputs (described in int4_linear.cpp)."""
    n, k = wq.shape
    cells = wq.reshape(n // (QUAD * ROWS), QUAD, ROWS, k // GROUP, 8, 4).permute(0, 3, 1, 4, 2, 5)
    return huge_page_copy(cells.reshape(n // (QUAD * ROWS), k // GROUP, QUAD, 512))


class Int8RowLinear(KernelLinear):
    """y = x W^T + b with W in int8 (one float32 scale per output row: max |w| / 127) and x in int8 per token, on
    the kernel's 8-bit path."""

    format = "int8-rows"  # its format as a prompt copy (`prompt_copy_of`)

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None,
                 prompt_linear: QuantizedLinear | Bf16Linear | None = None) -> None:
        self.out_features, self.in_features = weight.shape
        self.prompt_linear = prompt_linear
        _check_shape(self.out_features, self.in_features)
        scales, levels = [], []
        chunk = max(1, (1 << 22) // self.in_features)  # rows at a time: an LM head's float temporaries are GBs
        for start in range(0, self.out_features, chunk):
            w = weight[start: start + chunk].detach().float()
            scale = w.abs().amax(1) / 127
            scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero row stays zero
            scales.append(scale)
            levels.append(torch.round(w / scale[:, None]).clamp_(-127, 127).to(torch.int8))
        wq = torch.cat(levels)
        self.scale = torch.cat(scales).contiguous()
        self.rowsum = wq.sum(1, dtype=torch.int32).contiguous()
        self.packed = pack8(wq)
        self.bias = bias.detach().float().contiguous() if bias is not None else torch.empty(0)
        self.kernel = extension()

    def _run(self, rows: torch.Tensor) -> torch.Tensor:
        return self.kernel.linear8(rows, self.packed, self.scale, self.rowsum, self.bias)

    @classmethod
    def from_int4(cls, layer: Int4Linear, bias: torch.Tensor | None) -> Int8RowLinear:
        """Return the 8-bit layer of `layer`'s weights: `Int8RowLinear(layer.dequantized(), bias)`, bit for bit,
        computed by the kernel from the packed 4-bit weights without their float copy."""
        quads, groups = layer.packed.shape[:2]
        packed = huge_page_empty((quads, groups, QUAD, 512), torch.int8)
        scale = torch.empty(layer.out_features, dtype=torch.float32)
        rowsum = torch.empty(layer.out_features, dtype=torch.int32)
        layer.kernel.pack8_from4(layer.packed, packed, scale, rowsum)
        bias = bias.detach() if bias is not None else torch.empty(0)
        return cls._of_parts(packed, scale, rowsum, bias)

    def state(self) -> dict[str, torch.Tensor]:
        """Return the tensors `from_state` rebuilds this layer from (its prompt copy is not among them)."""
        return {"packed": self.packed, "scale": self.scale, "rowsum": self.rowsum, "bias": self.bias}

    @classmethod
    def from_state(cls, state: dict[str, torch.Tensor]) -> Int8RowLinear:
        """Return the layer whose `state()` is `state`, without quantizing or packing anything again."""
        return cls._of_parts(huge_page_copy(state["packed"]), state["scale"], state["rowsum"], state["bias"])

    @classmethod
    def _of_parts(cls, packed: torch.Tensor, scale: torch.Tensor, rowsum: torch.Tensor, bias: torch.Tensor
                  ) -> Int8RowLinear:
        """Return the layer of packed weights `packed` (kept as given), row scales and sums, and bias (empty: none)."""
        layer = cls.__new__(cls)
        quads, chunks = packed.shape[:2]
        layer.out_features, layer.in_features = quads * QUAD * ROWS, chunks * GROUP
        layer.packed, layer.scale, layer.rowsum = packed, scale.contiguous(), rowsum.contiguous()
        layer.bias, layer.prompt_linear, layer.kernel = bias.float().contiguous(), None, extension()
        return layer

    def dequantized(self) -> torch.Tensor:
        """Return the float32 weights [out, in] this layer computes with (for tests and error reports)."""
        quads, chunks = self.packed.shape[:2]
        cells = self.packed.reshape(quads, chunks, QUAD, 8, ROWS, 4).permute(0, 2, 4, 1, 3, 5)
        return cells.reshape(self.out_features, self.in_features).float() * self.scale[:, None]

    def describe(self) -> str:
        """Return which kernel and number formats this layer runs."""
        tiles = f"; passes of {self.kernel.amx_min_tokens()}+ tokens on AMX tiles" if self.kernel.amx() else ""
        return f"int8 weights per row, per-token dynamic 8-bit activations ({self._isa()}{tiles}){self._prompts()}"


class PromptSwitch(KernelLinear):
    """A layer the kernel does not take (off the 4-bit grid and too large for its 8-bit path, or of another shape):
    fbgemm's int8 linear in decode and verify passes, its bfloat16 copy for prompts."""

    def __init__(self, decode: QuantizedLinear, prompt_linear: Bf16Linear) -> None:
        self.out_features, self.in_features = decode.out_features, decode.in_features
        self.decode, self.prompt_linear = decode, prompt_linear

    def _run(self, rows: torch.Tensor) -> torch.Tensor:
        return self.decode(rows)

    def describe(self) -> str:
        """Return which kernel and number formats this layer runs."""
        return self.decode.describe() + self._prompts()


def prompt_copy_of(weight: torch.Tensor, bias: torch.Tensor | None, choice: str = "auto") -> Any:
    """Return the copy of a linear's weights that reads prompts, in `prompt_format(choice)`: an `Int8RowLinear` for
    int8-rows where the kernel takes the shape (else the copy the host makes without it: bf16 where oneDNN runs it,
    int8 elsewhere), any other format's from `prompt_layer`; None for "none"."""
    kind = prompt_format(choice)
    if kind == "int8-rows":
        if kernel_shape(*weight.shape):
            return Int8RowLinear(weight, bias)
        kind = "bf16" if onednn_bf16() else "int8"
    return prompt_layer(weight, bias, kind)


def reads_own_prompts(layer: KernelLinear, kind: str) -> bool:
    """Return whether `layer` reads prompts itself under prompt copy format `kind`: "none", or int8-rows for a layer
    on the 8-bit kernel already (its copy would be itself)."""
    return kind == "none" or (kind == "int8-rows" and isinstance(layer, Int8RowLinear))


def layer_prompt_copy(layer: Int4Linear | Int8RowLinear, bias: torch.Tensor | None, kind: str) -> Any:
    """Return the prompt copy of kernel layer `layer` in format `kind`: None where it reads prompts itself, an
    int8-rows copy of a 4-bit layer made by the kernel from its packed weights, any other from its dequantized
    weights (`prompt_copy_of`)."""
    if reads_own_prompts(layer, kind):
        return None
    if kind == "int8-rows" and isinstance(layer, Int4Linear):
        return Int8RowLinear.from_int4(layer, bias)
    return prompt_copy_of(layer.dequantized(), bias, kind)


def fits_4bit(module: torch.nn.Linear) -> bool:
    """Return whether the kernel's shapes allow `module`: outputs a multiple of 64, inputs a multiple of 32."""
    return module.out_features % (QUAD * ROWS) == 0 and module.in_features % GROUP == 0


@torch.no_grad()
def use_int4_linears(model: torch.nn.Module, lm_head: torch.nn.Module | None = None,
                     prompt: str = "auto", round_to_4bit: bool = False) -> dict[str, int]:
    """Route every fp32/bf16 CPU nn.Linear of `model` through `Int4Linear` where its weights lie on a 4-bit grid
    (at least `ON_GRID` of its groups), else through `Int8RowLinear` when it has at most `MAX_INT8_INPUTS` inputs,
    else through fbgemm's `QuantizedLinear` (also where the kernel's shapes do not fit); return how many went to each
    ("int4", "int8_rows", "int8": fbgemm; "int4_rounded": of the "int4" ones, those rounded). Prompt-sized forwards
    run a copy of each layer but the LM head in `prompt_format(prompt)` (fbgemm's int8 itself where that is int8).
    `round_to_4bit`: layers on no grid go to 4 bits too, each group of 32 weights rounded onto 16 levels between its
    minimum and maximum (an approximation of the model: for a draft, whose weights change only the acceptance).

    Placeholders and tied weights are handled as `use_int8_linears` does (the LM head gets its own copy)."""
    if quantized_engine() is None:
        return {"int4": 0, "int8_rows": 0, "int8": 0, "int4_rounded": 0}
    extension()  # build before the minutes of packing, and fail early with a clear error
    prompt_format(prompt)  # and a bad choice before them too

    def make(module: torch.nn.Linear) -> KernelLinear | QuantizedLinear:
        # The LM head reads one row per prompt (the last position's logits): its copy would never run.
        def copy_of(weight: torch.Tensor) -> QuantizedLinear | Bf16Linear | None:
            return prompt_copy_of(weight, module.bias, prompt) if module is not lm_head else None

        if fits_4bit(module):
            q, scale, offset, share = grid_4bit(module.weight)
            if share >= ON_GRID:
                return Int4Linear(q, scale, offset, module.bias, prompt_linear=copy_of(module.weight))
            if round_to_4bit:  # the prompt copy holds the rounded weights too: one model for prompts and decoding
                rounded.add(id(module))
                layer = Int4Linear(q, scale, offset, module.bias)
                layer.prompt_linear = copy_of(layer.dequantized())
                return layer
        if fits_4bit(module) and module.in_features <= MAX_INT8_INPUTS:
            # on int8-rows the layer's own kernel is the prompt copy's: no second copy
            own = prompt_format(prompt) == "int8-rows"
            return Int8RowLinear(module.weight, module.bias, prompt_linear=None if own else copy_of(module.weight))
        prompt_linear = copy_of(module.weight)
        if isinstance(prompt_linear, Bf16Linear):
            return PromptSwitch(QuantizedLinear(module.weight, module.bias), prompt_linear)
        return prompt_linear or QuantizedLinear(module.weight, module.bias)  # fbgemm's int8 for every forward

    rounded: set[int] = set()
    layers = replace_linears(model, make, lm_head)
    counts = {"int4": sum(isinstance(layer, Int4Linear) for layer in layers),
              "int8_rows": sum(isinstance(layer, Int8RowLinear) for layer in layers)}
    counts["int8"] = len(layers) - counts["int4"] - counts["int8_rows"]
    counts["int4_rounded"] = len(rounded)
    return counts
