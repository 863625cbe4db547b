"""What AMX tiles save on the int4 path's multi-token passes: the default pair (target on `int4`, draft on
`int4-rounded`), one-token and k-token forwards after a cached context, with the kernel's 8-bit layers on the vector
path and on AMX tiles (every pass of 2 or more tokens, whatever the default threshold), alternating rep by rep in one
process. Both give the same bits (checked here on every size:
the logits of each forward are compared); only the time differs. Prints min and median ms per forward, the tiles'
ratio to the vector path, and the target's f(k) = t(k) / t(1) under each.

On a CPU without AMX (or where the OS does not grant it) there is nothing to compare, and the script says so.

    .venv/bin/python benchmarks/tile_passes.py --reps 40 --tokens 1 5 9 13 --out benchmarks/results/tile-passes.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from verispec.models.decoder_stack import set_amx_tiles
from verispec.models.int4 import extension
from verispec.models.loading import load_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quantized_models import stat, timed_forward, write_forward_times  # noqa: E402  (a sibling script: the same timing for every script)

SETTINGS = {"vector": False, "tiles": True}
EVERY_PASS = 2  # the tiles' threshold while measuring: every multi-token pass


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=40, help="forwards per model, setting and size")
    parser.add_argument("--context", type=int, default=128, help="cached tokens before each timed forward")
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 5, 9, 13], help="forward sizes k")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="results JSON (written atomically)")
    args = parser.parse_args()
    if args.reps < 1 or args.context < 1 or min(args.tokens) < 1 or 1 not in args.tokens:
        parser.error("--reps and --context must be >= 1, and --tokens must include 1")
    if not extension().amx():
        sys.exit("this CPU or OS gives no AMX tiles to the kernel: the vector path is the only one here")
    torch.set_num_threads(args.threads)
    models = {"target": load_model(None, "target", linear_backend="int4"),
              "draft": load_model(None, "draft", linear_backend="int4-rounded")}
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(1000, 30000, (args.context,), generator=gen).tolist()
    fresh = torch.randint(1000, 30000, (max(args.tokens),), generator=gen).tolist()
    for model in models.values():
        model.reset()
        model.forward(prefix)
    for name, model in models.items():  # the same bits either way, or the comparison is void
        for k in args.tokens:
            logits = []
            for on in SETTINGS.values():
                set_amx_tiles(on, EVERY_PASS)
                model.truncate(args.context)
                logits.append(model.forward(fresh[:k], n_logits=k).logits.clone())
            if not torch.equal(*logits):
                sys.exit(f"the {name}'s {k}-token logits differ between the vector path and the tiles")
    times = {name: {s: {k: [] for k in args.tokens} for s in SETTINGS} for name in models}
    order = list(SETTINGS)
    for rep in range(args.reps):
        for name, model in models.items():
            for setting in order[rep % 2:] + order[: rep % 2]:  # alternate who goes first
                set_amx_tiles(SETTINGS[setting], EVERY_PASS)
                for k in args.tokens:
                    times[name][setting][k].append(timed_forward(model, fresh[:k], k, args.context)[0])
    set_amx_tiles(True)

    summary: dict = {}
    for name in models:
        for k in args.tokens:
            for setting in SETTINGS:
                row = {how: stat(times[name][setting][k], how) * 1e3 for how in ("min", "median")}
                base = {how: stat(times[name]["vector"][k], how) * 1e3 for how in ("min", "median")}
                row.update({f"vs_vector_{how}": row[how] / base[how] for how in ("min", "median")})
                summary[f"{name}/{setting}/t({k})"] = row
                print(f"{name:6s} {setting:6s} t({k:2d}) min {row['min']:7.2f} ms  median {row['median']:7.2f} ms  "
                      f"x vector {row['vs_vector_min']:.3f} / {row['vs_vector_median']:.3f}")
    for setting in SETTINGS:
        for how in ("min", "median"):
            one = stat(times["target"][setting][1], how)
            f = {k: stat(times["target"][setting][k], how) / one for k in args.tokens if k > 1}
            summary.update({f"{setting}/f({k})/{how}": v for k, v in f.items()})
            print(f"target {setting:6s} {how:6s} " + "  ".join(f"f({k}) {v:.2f}" for k, v in f.items()))
    write_forward_times(args, summary, times)


if __name__ == "__main__":
    main()
