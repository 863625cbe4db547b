"""int8 CPU linears: int8 weights (one scale per output channel), activations quantized per token at run time.

Why: a CPU decode step reads every weight once, so its cost is the bytes read. int8 weights are 4x smaller than
fp32, and fbgemm's dynamic int8 linear keeps a forward over a few tokens close to the cost of one (its kernel is
compute-light at these sizes), which is what a speculative verify pass needs.

Causality: fbgemm's dynamic linear quantizes its input with ONE scale for the whole batch, so a row's outputs would
depend on the other rows (a later draft token with a wide range would coarsen an earlier position's logits). Here
each row is divided by its own max-abs (every row then lies in [-1, 1]), one fixed row holding +1 and -1 is
appended so that the batch's range is exactly [-1, 1] whatever the other rows hold, the linear runs without bias,
the fixed row is dropped, and each output row is multiplied back by its max-abs. The activation scale is then
max-abs(row) / 127.5 per token, and each row's result is bit-identical alone or inside any batch (the integer GEMM
is exact; the dequantization is elementwise). All-zero rows stay zero (their output is the bias).

Saturation: without VNNI, x86 int8 kernels add pairs of u8*s8 products in int16 (vpmaddubsw), which saturates
(measured with FBGEMM_ENABLE_INSTRUCTIONS=AVX2: 2.0 for an exact 256). `reduce_range` (7-bit activations) avoids it
at twice the quantization error; kernels with VNNI accumulate in int32 and keep all 8 bits. A probe at first use
decides (`reduce_range_needed`).
"""

from __future__ import annotations

import contextlib
import functools
import warnings
from collections.abc import Callable, Iterator
from typing import Any

import torch

# The quantized engines that pack weights for torch.ops.quantized.linear_dynamic on x86, best first (measured:
# benchmarks/quantized_kernels.py).
ENGINES = ("fbgemm", "x86")
FEW_ROWS = 64  # up to this many rows, the per-token scaling takes the few-operation path (see _scaled)
PEAK_FLOOR = torch.finfo(torch.float32).tiny  # the smallest row max-abs divided by (normal float32 rows exceed it)


def quantized_engine() -> str | None:
    """Return the quantized engine used for int8 linears on this torch build, or None if it has none."""
    supported = torch.backends.quantized.supported_engines
    return next((e for e in ENGINES if e in supported), None)


@functools.cache
def reduce_range_needed(engine: str | None = None) -> bool:
    """Return whether 8-bit activations saturate `engine`'s int8 kernel on this host (then 7 bits are used).

    A probe rather than a CPU-flag check: fbgemm picks its kernel from the CPU and from FBGEMM_ENABLE_INSTRUCTIONS,
    so only a run tells which one is in use. Every product at its largest: the exact outputs are +-256; a kernel
    that adds pairs of products in int16 returns about 2.
    """
    weight = torch.ones(2, 256)
    weight[1] = -1.0
    probe = QuantizedLinear(weight, None, engine=engine, reduce_range=False)
    out = probe(torch.ones(1, 256))  # [1, 2]
    return not torch.allclose(out, torch.tensor([[256.0, -256.0]]), rtol=0.02, atol=0)


@contextlib.contextmanager
def _engine(name: str) -> Iterator[None]:
    # The engine is global state; weights are packed for it at prepack time, and the packed object carries it.
    previous = torch.backends.quantized.engine
    torch.backends.quantized.engine = name
    try:
        yield
    finally:
        torch.backends.quantized.engine = previous


def _pin_rows(in_features: int) -> torch.Tensor:
    """Rows that fix a batch's range to exactly [-1, 1]: one row (+1, -1, 0, ...), two rows for 1 input."""
    if in_features == 1:
        return torch.tensor([[1.0], [-1.0]])
    pin = torch.zeros(1, in_features)
    pin[0, 0], pin[0, 1] = 1.0, -1.0
    return pin


class QuantizedLinear:
    """y = x W^T + b with W in int8 (per output channel) and x quantized per token; call it like a linear."""

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        engine: str | None = None,
        reduce_range: bool | None = None,
        per_token: bool = True,
    ) -> None:
        engine = engine or quantized_engine()
        assert engine is not None, "this torch build has no x86 quantized engine (fbgemm)"
        self.engine = engine
        self.reduce_range = reduce_range_needed(engine) if reduce_range is None else reduce_range
        self.per_token = per_token  # False: fbgemm's one scale per batch (not causal; kept for measurement)
        w = weight.detach().float()  # [out, in]
        self.out_features, self.in_features = w.shape
        scale = w.abs().amax(1) / 127  # [out]
        scale = torch.where(scale > 0, scale, torch.ones_like(scale)).double()  # an all-zero row stays zero
        zero = torch.zeros(self.out_features, dtype=torch.long)
        with warnings.catch_warnings(), _engine(engine):
            # quantize_per_channel warns that quantized tensors are deprecated; prepack still needs one.
            warnings.simplefilter("ignore", UserWarning)
            qweight = torch.quantize_per_channel(w, scale, zero, 0, torch.qint8)
            self.packed = torch.ops.quantized.linear_prepack(qweight, None)
        self.bias = bias.detach().float() if bias is not None else None
        self.pin = _pin_rows(self.in_features)

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Return x W^T + b for `x` of shape [..., in] in any float dtype (computed in fp32, returned in x's)."""
        rows = x.reshape(-1, self.in_features).float()  # [n, in]
        n = rows.shape[0]
        if self.per_token:
            scaled, peak = self._scaled(rows)
            y = torch.ops.quantized.linear_dynamic(scaled, self.packed, self.reduce_range)[:n]
            y = y.mul_(peak)  # [n, out]: back to each row's scale, in place (the kernel's output is ours)
        else:
            y = torch.ops.quantized.linear_dynamic(rows, self.packed, self.reduce_range)  # [n, out]
        if self.bias is not None:
            y = y.add_(self.bias)  # the kernel's output is ours: no copy
        return y.to(x.dtype).reshape(*x.shape[:-1], self.out_features)

    def _scaled(self, rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Return `rows` [n, in] divided by their max-abs, with the pin rows after them (the kernel's input), and
        the max-abs [n, 1]. An all-zero row is divided by the floor and stays zero (its output is
        the bias). Both branches give the same values: few operations for a decode's few rows, few passes over
        memory for a prompt's many (on a 678-token prefill the allocating version cost half as much as the GEMM)."""
        n = rows.shape[0]
        if n <= FEW_ROWS:
            peak = rows.abs().amax(1, keepdim=True).clamp_min_(PEAK_FLOOR)  # [n, 1]
            return torch.cat([rows / peak, self.pin]), peak
        # max(max x, -min x): two vectorised reductions, no |x| copy (torch.aminmax is slower than both)
        peak = torch.maximum(rows.amax(1, keepdim=True), rows.amin(1, keepdim=True).neg_()).clamp_min_(PEAK_FLOOR)
        scaled = rows.new_empty(n + self.pin.shape[0], self.in_features)
        torch.div(rows, peak, out=scaled[:n])
        scaled[n:] = self.pin
        return scaled, peak

    def describe(self) -> str:
        """Return which kernel and number formats this layer runs."""
        act = "per-token" if self.per_token else "per-tensor"
        bits = 7 if self.reduce_range else 8
        return f"int8 weights per channel, {act} dynamic {bits}-bit activations ({self.engine})"


@torch.no_grad()
def use_int8_linears(model: torch.nn.Module, lm_head: torch.nn.Module | None = None, per_token: bool = True) -> int:
    """Route every fp32/bf16 CPU nn.Linear of `model` through `QuantizedLinear`; return how many were changed.

    The dense weight is released (the int8 copy replaces it) and a zero-width placeholder keeps `weight.shape[0]`,
    dtype and device readable. A linear tied to an embedding (Qwen2.5's LM head) is quantized only when it is
    `lm_head`: it gets its own int8 copy and the embedding keeps the float weight for its lookups.
    `per_token=False` quantizes activations per batch instead (not causal: only to measure what that breaks).
    """
    if quantized_engine() is None:
        return 0
    return len(replace_linears(model, lambda module: QuantizedLinear(module.weight, module.bias, per_token=per_token),
                               lm_head))


def replace_linears(model: torch.nn.Module, make: Callable[[torch.nn.Linear], Any],
                    lm_head: torch.nn.Module | None = None) -> list[Any]:
    """Route every fp32/bf16 CPU nn.Linear of `model` (tied ones only if `lm_head`) through `make(module)`'s layer;
    return the layers. The dense weight is replaced by a zero-width placeholder (untied from any embedding)."""
    shared = {id(m.weight) for m in model.modules() if isinstance(m, torch.nn.Embedding)}
    layers = []
    for module in model.modules():
        if not isinstance(module, torch.nn.Linear) or (id(module.weight) in shared and module is not lm_head):
            continue
        weight = module.weight
        if weight.device.type != "cpu" or weight.dtype not in (torch.float32, torch.bfloat16):
            continue
        layer = make(module)
        module.forward = layer.forward
        module.quantized = layer  # reachable for inspection (kernel description, packed weights)
        # Untie: the placeholder is the module's own parameter, the embedding keeps the float weight.
        module.weight = torch.nn.Parameter(weight.new_empty(module.out_features, 0), requires_grad=False)
        layers.append(layer)
    return layers
