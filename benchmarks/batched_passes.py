"""What a batched pass costs: n sequences of r new tokens each, run as one call the way a batched server runs them
(`verispec.models.batched`: each sequence with its own cache, every linear over all n·r rows), on the default pair
as the server loads it. Prints min and median ms per pass and f = t / t(one sequence, one token) for the target and
the draft: the cost tables of the adaptive draft length (`verispec.drafters.adaptive`) are read from these.
`--compare-4bit-tiles`: each pass also with the 4-bit layers kept off AMX tiles, the two alternating rep by rep, and
the ratio (tiles / vector path; the same bits either way).

    PYTHONPATH=. .venv/bin/python benchmarks/batched_passes.py --reps 7 --compare-4bit-tiles \
        --out benchmarks/results/batched-passes.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from verispec.api import Decoder
from verispec.bench.files import write_atomically
from verispec.models.batched import ForwardBatcher, Pass, SlotLM, run_batch
from verispec.models.decoder_stack import set_amx4_tiles
from verispec.provenance import provenance


def timed(slots: list[SlotLM], rows: int, context: int) -> float:
    """Return the seconds of one pass of `rows` new tokens for each of `slots`, run as one call; then roll the
    caches back to `context` tokens."""
    passes = [Pass(slot, [7] * rows, rows, False, None) for slot in slots]
    start = time.perf_counter()
    run_batch(passes)
    elapsed = time.perf_counter() - start
    for slot in slots:
        slot.truncate(context)
    return elapsed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sequences", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--rows", type=int, nargs="+", default=[1, 2, 3, 4, 5, 6, 8])
    parser.add_argument("--context", type=int, default=100, help="cached tokens per sequence before the passes")
    parser.add_argument("--reps", type=int, default=9)
    parser.add_argument("--out", default=None)
    parser.add_argument("--compare-4bit-tiles", action="store_true",
                        help="also time each pass with the 4-bit layers off AMX tiles (alternating); print the ratio")
    args = parser.parse_args()
    decoder = Decoder()
    models = {role: decoder.model(role) for role in ("target", "draft")}
    batcher = ForwardBatcher(own_thread=False)
    results: dict[str, list[dict[str, float]]] = {}
    for role, model in models.items():
        slots = [SlotLM(model, batcher) for _ in range(max(args.sequences))]
        for i, slot in enumerate(slots):  # a context of its own per sequence
            ids = torch.randint(100, 20000, (args.context,), generator=torch.Generator().manual_seed(i)).tolist()
            run_batch([Pass(slot, ids, 1, False, None)])

        rows_out = []
        base = None
        for n in args.sequences:
            for rows in args.rows:
                timed(slots[:n], rows, args.context)  # warm-up
                times, vector = [], []
                for _ in range(args.reps):
                    times.append(timed(slots[:n], rows, args.context))
                    if args.compare_4bit_tiles:
                        set_amx4_tiles(0)
                        vector.append(timed(slots[:n], rows, args.context))
                        set_amx4_tiles(None)
                median = statistics.median(times)
                base = base or median
                row = {"sequences": n, "rows": rows, "total_rows": n * rows, "min_ms": min(times) * 1e3,
                       "median_ms": median * 1e3, "f": median / base}
                line = (f"{role}: {n} sequences x {rows} rows = {n * rows:3d}: median {median * 1e3:6.1f} ms, "
                        f"f = {median / base:.2f}")
                if vector:
                    row["vector_median_ms"] = statistics.median(vector) * 1e3
                    row["tiles_over_vector"] = median / statistics.median(vector)
                    line += (f"; 4-bit layers on the vector path {row['vector_median_ms']:6.1f} ms "
                             f"({row['tiles_over_vector']:.2f}x)")
                rows_out.append(row)
                print(line, flush=True)
        results[role] = rows_out
    if args.out:
        write_atomically(Path(args.out), json.dumps({**provenance(), "args": vars(args), "passes": results}, indent=1))
        print(f"results: {args.out}")


if __name__ == "__main__":
    main()
