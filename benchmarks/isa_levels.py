"""The int4 path's kernel compiled for each instruction-set level this CPU runs (verispec.native.cpu), side by side on
the default target's layer shapes: time per call for a few token counts, interleaved rep by rep, each level's time
over the best level's, and whether every level returns the best level's bits.

Each level is built once into verispec's cache and handed the same packed weights; each shape runs over copies of
its weights, `--stream-mb` of them in all (past the last-level cache), in turn, so that they stream from memory as a
model's layers do; the figures are minima over reps (the least-disturbed run). On a machine whose cores other work
shares, use --threads 1: a pass on 2 threads waits at its end for a descheduled thread (about 11 ms here, whatever
the level), which hides every difference between the levels.

    .venv/bin/python benchmarks/isa_levels.py --rows 1 4 5 8 --levels avx512-vnni avx-vnni avx2
"""

from __future__ import annotations

import argparse
import copy
import math
import sys
import time

import torch

from verispec.models.grid4 import grid_4bit
from verispec.models.int4 import Int4Linear, Int8RowLinear, extension, huge_page_copy
from verispec.native.cpu import supported_isas

# (out, in, bits): attention q/o, k/v, the MLP's gate/up and down projections, and an 8-bit down projection
SHAPES = [(1536, 1536, 4), (256, 1536, 4), (8960, 1536, 4), (1536, 8960, 4), (1536, 8960, 8)]


def call(kernel, lay: Int4Linear | Int8RowLinear, x: torch.Tensor) -> torch.Tensor:
    """One layer's forward through `kernel`, any build of the extension."""
    if isinstance(lay, Int8RowLinear):
        return kernel.linear8(x, lay.packed, lay.scale, lay.rowsum, lay.bias)
    return kernel.linear(x, lay.packed, lay.bias)


def layers(out_features: int, in_features: int, bits: int, gen: torch.Generator,
           stream_mb: float) -> list[Int4Linear | Int8RowLinear]:
    """One random layer of the shape and copies of it, each with its own packed weights, `stream_mb` MB in all."""
    weight = torch.randn(out_features, in_features, generator=gen) * 0.02
    if bits == 8:
        first: Int4Linear | Int8RowLinear = Int8RowLinear(weight, None)
    else:
        q, scale, offset, _ = grid_4bit(weight)
        first = Int4Linear(q, scale, offset, None)
    copies = max(1, math.ceil(stream_mb * 2**20 / first.packed.numel()))
    out = [first]
    for _ in range(copies - 1):
        other = copy.copy(first)
        other.packed = huge_page_copy(first.packed)
        out.append(other)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--levels", nargs="+", default=None, help="default: every level this CPU runs")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 4, 5, 8])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--stream-mb", type=float, default=160, help="packed weights per shape, all copies")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--bits", type=int, nargs="+", default=[4, 8], choices=[4, 8])
    args = parser.parse_args()
    if min(args.rows) < 1 or args.reps < 1 or args.stream_mb <= 0:
        parser.error("--rows and --reps must be >= 1, --stream-mb > 0")
    levels = args.levels or supported_isas()
    torch.set_num_threads(args.threads)
    kernels = {level: extension(level) for level in levels}
    gen = torch.Generator().manual_seed(0)
    first = levels[0]
    print("| layer | bits | rows | " + " | ".join(f"{level} (ms)" for level in levels) + " | "
          + " | ".join(f"{level} / {first}" for level in levels[1:]) + " |")
    print("|---|---:|---:|" + "---:|" * (2 * len(levels) - 1))
    same_bits = True
    for out_features, in_features, bits in SHAPES:
        if bits not in args.bits:
            continue
        shape_layers = layers(out_features, in_features, bits, gen, args.stream_mb)
        for rows in args.rows:
            x = torch.randn(rows, in_features, generator=gen)
            outputs = [call(k, shape_layers[0], x) for k in kernels.values()]
            same_bits &= all(torch.equal(outputs[0], out) for out in outputs[1:])
            best = {level: float("inf") for level in levels}
            for _ in range(args.reps):
                for level, kernel in kernels.items():
                    start = time.perf_counter()
                    for lay in shape_layers:
                        call(kernel, lay, x)
                    best[level] = min(best[level], (time.perf_counter() - start) / len(shape_layers) * 1e3)
            print(f"| {out_features} x {in_features} | {bits} | {rows} | "
                  + " | ".join(f"{best[level]:.3f}" for level in levels) + " | "
                  + " | ".join(f"{best[level] / best[first]:.2f}" for level in levels[1:]) + " |", flush=True)
    if not same_bits:
        sys.exit("the levels' kernels return different bits on some layer")


if __name__ == "__main__":
    main()
