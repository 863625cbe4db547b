"""What the decoder loop's C++ paths save on decode and verify passes: the default pair on the int4 path, one-token
and k-token forwards after a cached context, each model with its layers step by step in Python ("loop": torch's
rotary embedding and norms), step by step with those in C++ ("small-ops") and all layers in one C++ call ("stack",
the default), the settings alternating rep by rep in one process (on a noisy machine, separate runs of the same code
differ more than the settings do). Prints min and median ms per forward, the ratios to "loop", the target's
f(k) = t(k) / t(1) and the draft's cost c = draft t(1) / target t(1) under each setting (min over min and median over
median).

    .venv/bin/python benchmarks/decode_passes.py --reps 60 --out benchmarks/results/decode-passes.json
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

from verispec.models.loading import load_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quantized_models import stat, timed_forward, write_forward_times  # noqa: E402  (a sibling script: the same timing for every script)

SETTINGS = {"loop": (False, False), "small-ops": (True, False), "stack": (True, True)}  # (small_ops, whole_stack)


def set_loop(model, setting: str) -> None:
    """Switch `model`'s decoder loop to `setting` (a key of SETTINGS)."""
    model._lean.small_ops, model._lean.whole_stack = SETTINGS[setting]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=60, help="forwards per model, setting and size")
    parser.add_argument("--context", type=int, default=128, help="cached tokens before each timed forward")
    parser.add_argument("--tokens", type=int, nargs="+", default=[1, 5], help="forward sizes k")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="results JSON (written atomically)")
    args = parser.parse_args()
    if args.reps < 1 or args.context < 1 or min(args.tokens) < 1 or 1 not in args.tokens:
        parser.error("--reps and --context must be >= 1, and --tokens must include 1")
    torch.set_num_threads(args.threads)
    models = {"target": load_model(None, "target", linear_backend="int4"),
              "draft": load_model(None, "draft", linear_backend="int4-rounded")}
    for name, model in models.items():
        if model._lean is None or model._lean.stack is None:
            sys.exit(f"the {name}'s decoder loop has no C++ stack here ({model.decoder_loop}); nothing to compare")
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(1000, 30000, (args.context,), generator=gen).tolist()
    fresh = torch.randint(1000, 30000, (max(args.tokens),), generator=gen).tolist()
    times = {name: {s: {k: [] for k in args.tokens} for s in SETTINGS} for name in models}
    for model in models.values():
        model.reset()
        model.forward(prefix)
    order = list(SETTINGS)
    for rep in range(args.reps):
        for name, model in models.items():
            for setting in order[rep % len(order):] + order[: rep % len(order)]:  # rotate who goes first
                set_loop(model, setting)
                for k in args.tokens:
                    times[name][setting][k].append(timed_forward(model, fresh[:k], k, args.context)[0])
    for model in models.values():
        set_loop(model, "stack")

    summary: dict = {}
    for name in models:
        for setting in SETTINGS:
            for k in args.tokens:
                row = {how: stat(times[name][setting][k], how) * 1e3 for how in ("min", "median")}
                base = {how: stat(times[name]["loop"][k], how) * 1e3 for how in ("min", "median")}
                row.update({f"vs_loop_{how}": row[how] / base[how] for how in ("min", "median")})
                summary[f"{name}/{setting}/t({k})"] = row
                print(f"{name:6s} {setting:9s} t({k}) min {row['min']:7.2f} ms  median {row['median']:7.2f} ms  "
                      f"x loop {row['vs_loop_min']:.3f} / {row['vs_loop_median']:.3f}")
    for setting in SETTINGS:
        for how in ("min", "median"):
            target_one = stat(times["target"][setting][1], how)
            c = stat(times["draft"][setting][1], how) / target_one
            f = {k: stat(times["target"][setting][k], how) / target_one for k in args.tokens if k > 1}
            summary[f"{setting}/c/{how}"] = c
            summary.update({f"{setting}/f({k})/{how}": v for k, v in f.items()})
            print(f"{setting:9s} {how:6s} c {c:.3f}  " + "  ".join(f"f({k}) {v:.2f}" for k, v in f.items()))
    write_forward_times(args, summary, times)


if __name__ == "__main__":
    main()
