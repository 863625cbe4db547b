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

import sys
from pathlib import Path

import torch

from verispec.models.decoder_stack import set_amx_tiles
from verispec.models.int4 import extension
from verispec.models.loading import load_model

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quantized_models import (  # noqa: E402  (a sibling script: the same timing for every script)
    cached_context,
    settings_args,
    summarize_settings,
    time_settings,
    write_forward_times,
)

SETTINGS = {"vector": False, "tiles": True}
EVERY_PASS = 2  # the tiles' threshold while measuring: every multi-token pass


def main() -> None:
    args = settings_args(__doc__.split("\n\n")[0], reps=40, tokens=[1, 5, 9, 13])
    if not extension().amx():
        sys.exit("this CPU or OS gives no AMX tiles to the kernel: the vector path is the only one here")
    torch.set_num_threads(args.threads)
    models = {"target": load_model(None, "target", linear_backend="int4"),
              "draft": load_model(None, "draft", linear_backend="int4-rounded")}
    fresh = cached_context(models, args.context, max(args.tokens))
    for name, model in models.items():  # the same bits either way, or the comparison is void
        for k in args.tokens:
            logits = []
            for on in SETTINGS.values():
                set_amx_tiles(on, EVERY_PASS)
                model.truncate(args.context)
                logits.append(model.forward(fresh[:k], n_logits=k).logits.clone())
            if not torch.equal(*logits):
                sys.exit(f"the {name}'s {k}-token logits differ between the vector path and the tiles")
    times = time_settings(models, list(SETTINGS), lambda model, setting: set_amx_tiles(SETTINGS[setting], EVERY_PASS),
                          args, fresh)
    set_amx_tiles(True)
    write_forward_times(args, summarize_settings(times, "vector", args.tokens), times)


if __name__ == "__main__":
    main()
