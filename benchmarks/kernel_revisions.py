"""The int4 path's kernel as it is against the kernel of another git revision, on the default target's layer shapes,
in one process: time per call for 1..k rows, interleaved rep by rep, and whether both return the same bits.

The other revision's `verispec/native/int4_linear.cpp` (and the headers it includes) is read with `git show`, built
into verispec's cache once, and handed the same packed weights, so the two revisions must share the packed layout
(the script refuses when their outputs' shapes differ). Each kernel runs over `--copies` distinct weights in turn, so
that they stream from memory as a model's layers do; the figures are minima over reps (the least-disturbed run).

    .venv/bin/python benchmarks/kernel_revisions.py --against HEAD~2 --rows 1 5 9 13 \
        --out benchmarks/results/kernel-revisions.json
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from verispec.bench.files import write_atomically
from verispec.cache import cache_dir
from verispec.models.int4 import INCLUDES, SOURCE, Int4Linear, Int8RowLinear, extension, grid_4bit
from verispec.native.build import load_native
from verispec.provenance import provenance

REPO = SOURCE.parent.parent.parent
# (out, in, bits): the target's MLP up/gate and down projections, attention q/o, and an 8-bit slice of its head
# (a quarter of the 151,936 rows, so that a few copies fit in memory)
SHAPES = [(8960, 1536, 4), (1536, 8960, 4), (1536, 1536, 4), (1536, 8960, 8), (37952, 1536, 8)]


def kernel_at(revision: str):
    """Build (once, cached) and return the kernel module of `revision`."""
    commit = subprocess.run(["git", "-C", str(REPO), "rev-parse", "--short=12", revision], capture_output=True,
                            text=True)
    if commit.returncode != 0:
        sys.exit(f"--against {revision!r} is not a revision of {REPO}: {commit.stderr.strip()}")
    folder = cache_dir() / "native" / f"source-{commit.stdout.strip()}"
    folder.mkdir(parents=True, exist_ok=True)
    includes = []
    for path in (SOURCE, *INCLUDES):
        relative = path.relative_to(REPO).as_posix()
        shown = subprocess.run(["git", "-C", str(REPO), "show", f"{revision}:{relative}"], capture_output=True)
        if shown.returncode == 0:
            (folder / path.name).write_bytes(shown.stdout)
            includes.append(folder / path.name)
        elif path == SOURCE:
            sys.exit(f"{revision} has no {relative}")
    return load_native(includes[0], f"int4_{commit.stdout.strip()}", includes=tuple(includes[1:]))


def layer(out_features: int, in_features: int, bits: int, gen: torch.Generator) -> Int4Linear | Int8RowLinear:
    weight = torch.randn(out_features, in_features, generator=gen) * 0.02
    if bits == 8:
        return Int8RowLinear(weight, None)
    q, scale, offset, _ = grid_4bit(weight)
    return Int4Linear(q, scale, offset, None)


def call(kernel, lay: Int4Linear | Int8RowLinear, x: torch.Tensor) -> torch.Tensor:
    if isinstance(lay, Int8RowLinear):
        return kernel.linear8(x, lay.packed, lay.scale, lay.rowsum, lay.bias)
    return kernel.linear(x, lay.packed, lay.bias)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", required=True, help="the git revision whose kernel to compare with")
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 5, 9, 13])
    parser.add_argument("--reps", type=int, default=10)
    parser.add_argument("--copies", type=int, default=6, help="distinct weights per shape (8-bit head slice: 2)")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="results JSON (written atomically)")
    args = parser.parse_args()
    if min(args.rows) < 1 or args.reps < 1 or args.copies < 1:
        parser.error("--rows, --reps and --copies must be >= 1")
    torch.set_num_threads(args.threads)
    kernels = {"this": extension(), args.against: kernel_at(args.against)}
    gen = torch.Generator().manual_seed(0)
    rows_out, same_bits = [], True
    print("| layer | bits | rows | this (ms) | " + args.against + " (ms) | this / other | same bits |")
    print("|---|---:|---:|---:|---:|---:|---|")
    for out_features, in_features, bits in SHAPES:
        copies = 2 if out_features > 20000 else args.copies
        layers = [layer(out_features, in_features, bits, gen) for _ in range(copies)]
        for rows in args.rows:
            x = torch.randn(rows, in_features, generator=gen)
            outputs = [call(k, layers[0], x) for k in kernels.values()]
            if outputs[0].shape != outputs[1].shape:
                sys.exit(f"the revisions' kernels disagree on the output's shape ({out_features} x {in_features})")
            same = torch.equal(*outputs)
            same_bits &= same
            best = {name: float("inf") for name in kernels}
            for _ in range(args.reps):
                for name, kernel in kernels.items():
                    start = time.perf_counter()
                    for lay in layers:
                        call(kernel, lay, x)
                    best[name] = min(best[name], (time.perf_counter() - start) / copies * 1e3)
            this, other = best.values()
            rows_out.append({"out": out_features, "in": in_features, "bits": bits, "rows": rows, "this_ms": this,
                             "other_ms": other, "ratio": this / other, "same_bits": same})
            print(f"| {out_features} x {in_features} | {bits} | {rows} | {this:.3f} | {other:.3f} | "
                  f"{this / other:.2f} | {'yes' if same else 'NO'} |")
    if args.out is not None:
        record = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
                  "provenance": provenance(), "amx": kernels["this"].amx(), "rows": rows_out}
        write_atomically(args.out, json.dumps(record, indent=1))
        print(f"wrote {args.out}")
    if not same_bits:
        sys.exit("the two revisions' kernels return different bits on some layer (see the table)")


if __name__ == "__main__":
    main()
