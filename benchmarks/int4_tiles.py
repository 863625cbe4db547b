"""The 4-bit layers on AMX tiles against the vector path, layer by layer: the default target's 4-bit shapes (q, k, v
as one call; gate and up as one; down) with random levels, per token count the median time of each path (the two
alternating rep by rep, with every pass of the size on tiles or none) and their ratio, and whether both return the
same bits. Where the CPU has no AMX tiles it says so and stops. Whole passes of a batched server:
`benchmarks/batched_passes.py --compare-4bit-tiles`.

    PYTHONPATH=. .venv/bin/python benchmarks/int4_tiles.py --out benchmarks/results/int4-tiles.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from verispec.bench.files import write_atomically
from verispec.models.int4 import extension, pack
from verispec.provenance import provenance

SHAPES = [(2048, 1536), (17920, 1536), (1536, 8960)]  # (out, in): q+k+v, gate+up, down


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tokens", type=int, nargs="+", default=[4, 6, 8, 10, 12, 16, 20, 24, 32, 40, 48])
    parser.add_argument("--reps", type=int, default=7)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    kernel = extension()
    if not kernel.amx():
        sys.exit("no AMX tiles on this CPU (or not granted by the OS): nothing to compare")
    gen = torch.Generator().manual_seed(0)
    rows = []
    for out_features, in_features in SHAPES:
        groups = (out_features, in_features // 32)
        levels = torch.randint(0, 16, (out_features, in_features), generator=gen, dtype=torch.uint8)
        scale, offset = torch.rand(groups, generator=gen) * 0.01, torch.randn(groups, generator=gen) * 0.01
        packed = pack(levels, scale.half(), offset.half())
        bias = torch.empty(0)
        for tokens in args.tokens:
            x = torch.randn(tokens, in_features, generator=gen)
            times: dict[int, list[float]] = {1: [], -1: []}  # set_amx4: every size on tiles / none
            outputs = {}
            for _ in range(args.reps + 1):  # the first round warms up
                for setting, spent in times.items():
                    kernel.set_amx4(setting)
                    start = time.perf_counter()
                    outputs[setting] = kernel.linear(x, packed, bias)
                    spent.append(time.perf_counter() - start)
            kernel.set_amx4(0)
            tiles, vector = statistics.median(times[1][1:]), statistics.median(times[-1][1:])
            row = {"out": out_features, "in": in_features, "tokens": tokens, "tiles_ms": tiles * 1e3,
                   "vector_ms": vector * 1e3, "tiles_over_vector": tiles / vector,
                   "same_bits": torch.equal(outputs[1], outputs[-1])}
            rows.append(row)
            print(f"{out_features} x {in_features}, {tokens:2d} tokens: tiles {row['tiles_ms']:6.2f} ms, vector "
                  f"{row['vector_ms']:6.2f} ms ({row['tiles_over_vector']:.2f}x), same bits: {row['same_bits']}",
                  flush=True)
    if args.out:
        write_atomically(Path(args.out), json.dumps({**provenance(), "args": vars(args), "layers": rows}, indent=1))
        print(f"results: {args.out}")


if __name__ == "__main__":
    main()
