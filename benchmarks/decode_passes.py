"""What the decoder loop's C++ paths save on decode and verify passes: the default pair on the int4 path, one-token
and k-token forwards after a cached context, each model with its layers step by step in Python ("loop": torch's
rotary embedding and norms), step by step with those in C++ ("small-ops") and all layers in one C++ call ("stack",
the default), the settings alternating rep by rep in one process (on a noisy machine, separate runs of the same code
differ more than the settings do). Prints min and median ms per forward, the ratios to "loop", the target's
f(k) = t(k) / t(1) and the draft's cost c = draft t(1) / target t(1) under each setting (min over min and median over
median).

    .venv/bin/python benchmarks/decode_passes.py --reps 60 --out benchmarks/results/decode-passes.json

The default loop's f(k) over many sizes (the adaptive draft length's table, verispec/drafters/adaptive.py):

    .venv/bin/python benchmarks/decode_passes.py --settings stack --reps 15 --tokens 1 2 3 4 5 6 7 8 9 10 11 12 13 \
        14 15 16 17 21 25 33 --out benchmarks/results/decode-passes-by-size.json
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch

from verispec.models.loading import load_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quantized_models import (  # noqa: E402  (a sibling script: the same timing for every script)
    HOWS,
    cached_context,
    settings_args,
    stat,
    summarize_settings,
    time_settings,
    write_forward_times,
)

SETTINGS = {"loop": (False, False), "small-ops": (True, False), "stack": (True, True)}  # (small_ops, whole_stack)


def set_loop(model, setting: str) -> None:
    """Switch `model`'s decoder loop to `setting` (a key of SETTINGS)."""
    model._lean.small_ops, model._lean.whole_stack = SETTINGS[setting]


def main() -> None:
    args = settings_args(__doc__.split("\n\n")[0], reps=60, tokens=[1, 5],
                         settings=list(SETTINGS))
    torch.set_num_threads(args.threads)
    models = {"target": load_model(None, "target", linear_backend="int4"),
              "draft": load_model(None, "draft", linear_backend="int4-rounded")}
    for name, model in models.items():
        if model._lean is None or model._lean.stack is None:
            sys.exit(f"the {name}'s decoder loop has no C++ stack here ({model.decoder_loop}); nothing to compare")
    fresh = cached_context(models, args.context, max(args.tokens))
    times = time_settings(models, args.settings, set_loop, args, fresh)
    for model in models.values():
        set_loop(model, "stack")
    summary = summarize_settings(times, args.settings[0], args.tokens)
    for setting in args.settings:
        for how in HOWS:
            c = stat(times["draft"][setting][1], how) / stat(times["target"][setting][1], how)
            summary[f"{setting}/c/{how}"] = c
            print(f"{setting:9s} {how:6s} c {c:.3f}")
    write_forward_times(args, summary, times)


if __name__ == "__main__":
    main()
