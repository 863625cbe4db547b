"""One linear layer, several CPU kernels: time per call for 1, 2, 5 and 16 rows, error against fp32, causality.

The kernels: fp32 oneDNN (verispec's default), fbgemm / x86 / oneDNN dynamic int8 with one activation scale per
batch and per token (verispec's int8 path), torch's weight-only int8 and, where this torch has it, weight-only int4,
and verispec's own 4-bit kernel (the int4 path).

Prints a markdown table. Each kernel runs over `--copies` distinct weights in turn so that they stream from
memory as the layers of a real model do (one 8960x1536 int8 weight fits in a large L3 cache). The kernels are
interleaved rep by rep, so load from other processes falls on all alike; the figures are minima over reps (the
least-disturbed run).

    .venv/bin/python benchmarks/quantized_kernels.py [--threads 2] [--reps 15] [--copies 8]

Columns: t(1) in ms; f(n) = t(n)/t(1); `max |Δ|` = the largest output error against fp32 over 5 random rows;
`causal Δ` = how far row 0's outputs move when row 3 of the same batch is scaled 50x (0 = causal).
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable

import torch

from verispec.models.grid4 import grid_4bit
from verispec.models.int4 import Int4Linear
from verispec.models.quantized import QuantizedLinear, quantized_engine, reduce_range_needed

ROWS = (1, 2, 5, 16)
Kernel = Callable[[torch.Tensor], torch.Tensor]


def onednn_fp32(weight: torch.Tensor, bias: torch.Tensor) -> Kernel:
    """fp32 oneDNN with a packed weight, padded to 4 rows (verispec.models.fastpath)."""
    from verispec.models.fastpath import _packed_forward

    packed = torch.ops.mkldnn._reorder_linear_weight(weight, 4)
    return _packed_forward(packed, bias, weight.shape[0], 4)


def int8_per_tensor(engine: str, reduce_range: bool) -> Callable[[torch.Tensor, torch.Tensor], Kernel]:
    """The plain dynamic int8 linear: one activation scale for the whole batch (not causal)."""

    def make(weight: torch.Tensor, bias: torch.Tensor) -> Kernel:
        layer = QuantizedLinear(weight, bias, engine=engine, reduce_range=reduce_range, per_token=False)
        return layer.forward

    return make


def int8_per_token(engine: str, reduce_range: bool) -> Callable[[torch.Tensor, torch.Tensor], Kernel]:
    """The dynamic int8 linear with one activation scale per row (verispec.models.quantized)."""

    def make(weight: torch.Tensor, bias: torch.Tensor) -> Kernel:
        layer = QuantizedLinear(weight, bias, engine=engine, reduce_range=reduce_range)
        return layer.forward

    return make


def weight_only_int8(weight: torch.Tensor, bias: torch.Tensor) -> Kernel:
    """torch's weight-only int8 matmul (fp32 activations)."""
    scale = weight.abs().amax(1) / 127
    q = (weight / scale[:, None]).round().to(torch.int8)
    return lambda x: torch._weight_int8pack_mm(x, q, scale) + bias


def weight_only_int4(weight: torch.Tensor, bias: torch.Tensor, group: int = 128) -> Kernel:
    """torch's weight-only int4 matmul for CPU (groups of `group` input columns, one scale and offset each;
    bfloat16 activations, its fast path): 4-bit weights read half the bytes of int8."""
    out_f, in_f = weight.shape
    grouped = weight.view(out_f, in_f // group, group)
    low, high = grouped.amin(-1, keepdim=True), grouped.amax(-1, keepdim=True)
    scale = ((high - low) / 15).clamp(min=1e-8)
    q = ((grouped - low) / scale).round().clamp(0, 15).to(torch.int32).view(out_f, in_f)
    packed = torch.ops.aten._convert_weight_to_int4pack_for_cpu(q, 1)
    # The kernel dequantizes w = (q − 8)·scale + zero: zero is the value of code 8, as [in_f / group, out_f, 2].
    scale_zero = torch.stack([scale.view(out_f, -1).T, (low + 8 * scale).view(out_f, -1).T], -1).contiguous()
    scale_zero = scale_zero.to(torch.bfloat16)
    return lambda x: torch.ops.aten._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), packed, group,
                                                                scale_zero).float() + bias


def verispec_int4(weight: torch.Tensor, bias: torch.Tensor) -> Kernel:
    """verispec's 4-bit kernel (verispec.models.int4); random weights are rounded onto 16 levels per group of 32
    (a 4-bit GGUF's layers are already on such a grid and keep their values)."""
    q, scale, offset, _ = grid_4bit(weight)
    return Int4Linear(q, scale, offset, bias)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out-features", type=int, default=8960)
    p.add_argument("--in-features", type=int, default=1536)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--copies", type=int, default=8)
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    out_f, in_f = args.out_features, args.in_features
    weights = [torch.randn(out_f, in_f, generator=gen) * 0.02 for _ in range(args.copies)]
    bias = torch.randn(out_f, generator=gen) * 0.01
    engine = quantized_engine()
    rr = reduce_range_needed(engine)
    makers: dict[str, Callable[[torch.Tensor, torch.Tensor], Kernel]] = {"fp32 oneDNN (packed)": onednn_fp32}
    for eng in [e for e in ("fbgemm", "x86", "onednn") if e in torch.backends.quantized.supported_engines]:
        makers[f"int8 {eng}, per-tensor act."] = int8_per_tensor(eng, rr)
        makers[f"int8 {eng}, per-token act."] = int8_per_token(eng, rr)
    makers[f"int8 {engine}, per-token act., reduce_range={not rr}"] = int8_per_token(engine, not rr)
    makers["int8 weight-only (_weight_int8pack_mm)"] = weight_only_int8
    if hasattr(torch.ops.aten, "_weight_int4pack_mm_for_cpu") and in_f % 128 == 0:
        makers["int4 weight-only, bf16 act. (_weight_int4pack_mm_for_cpu)"] = weight_only_int4
    if out_f % 64 == 0 and in_f % 32 == 0:
        makers["4-bit per 32 inputs, per-token int8 act. (verispec's kernel)"] = verispec_int4
    kernels = {name: [make(w, bias) for w in weights] for name, make in makers.items()}
    inputs = {n: torch.randn(n, in_f, generator=gen) for n in ROWS}
    times: dict[tuple[str, int], list[float]] = {(k, n): [] for k in kernels for n in ROWS}
    with torch.inference_mode():
        for rep in range(args.reps + 1):
            for name, fns in kernels.items():
                for n in ROWS:
                    start = time.perf_counter()
                    for fn in fns:
                        fn(inputs[n])
                    if rep:  # rep 0 warms up
                        times[name, n].append((time.perf_counter() - start) / len(fns) * 1e3)
        x = torch.randn(5, in_f, generator=gen)
        wide = x.clone()
        wide[3] *= 50
        exact = x @ weights[0].T + bias
        print(f"{out_f}x{in_f} layer, {args.threads} threads, {args.copies} weights in turn, min of {args.reps} "
              f"reps; host CPU capability {torch.backends.cpu.get_cpu_capability()}, reduce_range needed: {rr}\n")
        print("| kernel | t(1) ms | f(2) | f(5) | f(16) | max abs err | causal err |")
        print("|---|---:|---:|---:|---:|---:|---:|")
        for name, fns in kernels.items():
            med = {n: min(times[name, n]) for n in ROWS}
            err = (fns[0](x) - exact).abs().max().item()
            causal = (fns[0](wide)[0] - fns[0](x[:1])[0]).abs().max().item()
            print(f"| {name} | {med[1]:.2f} | {med[2] / med[1]:.2f} | {med[5] / med[1]:.2f} | "
                  f"{med[16] / med[1]:.2f} | {err:.4f} | {causal:.4f} |")


if __name__ == "__main__":
    main()
