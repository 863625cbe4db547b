"""How long loading the default pair takes, and its peak memory, on the default path (no flags), each load in a
fresh process as a user's `verispec` command starts: the imports (torch, transformers, verispec), then
`Decoder().model("target")` and `.model("draft")`, each timed, and the process's peak resident memory (VmHWM).

The first load after the cache was made reads the GGUFs and the layer cache from the disk (or the page cache when
they were just written); later ones from the page cache. One untimed load runs first (it also builds anything the
cache lacks), then `--loads` timed ones; the summary gives the median and the range of each step.

    PYTHONPATH=. .venv/bin/python benchmarks/load_pair.py --loads 5 --out benchmarks/results/load-pair.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

from verispec.bench.files import write_atomically
from verispec.provenance import machine_description

CHILD = r"""
import json, time
t0 = time.perf_counter()
import torch  # noqa: F401
t1 = time.perf_counter()
import transformers  # noqa: F401
t2 = time.perf_counter()
from verispec.api import Decoder
t3 = time.perf_counter()
decoder = Decoder()
decoder.model("target")
t4 = time.perf_counter()
decoder.model("draft")
t5 = time.perf_counter()
status = dict(line.split(":", 1) for line in open("/proc/self/status") if ":" in line)
kib = lambda key: int(status[key].split()[0])
print(json.dumps({"import_torch_s": t1 - t0, "import_transformers_s": t2 - t1, "import_verispec_s": t3 - t2,
                  "target_s": t4 - t3, "draft_s": t5 - t4, "pair_s": t5 - t3, "process_s": t5 - t0,
                  "peak_rss_gb": kib("VmHWM") / 2**20, "rss_gb": kib("VmRSS") / 2**20,
                  "kernels": decoder.linear_kernels()}))
"""
STEPS = ("import_torch_s", "import_transformers_s", "import_verispec_s", "target_s", "draft_s", "pair_s",
         "process_s", "peak_rss_gb", "rss_gb")


def load_once() -> dict:
    """Load the pair in a fresh Python process; return its timings and memory."""
    done = subprocess.run([sys.executable, "-c", CHILD], capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"the load failed:\n{done.stderr[-2000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def summary(runs: list[dict]) -> dict:
    return {step: {"median": statistics.median(r[step] for r in runs), "min": min(r[step] for r in runs),
                   "max": max(r[step] for r in runs)} for step in STEPS}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--loads", type=int, default=5, help="timed loads, each in a fresh process (default 5)")
    parser.add_argument("--out", type=Path, default=Path("results/load-pair.json"))
    args = parser.parse_args()
    print("untimed first load (builds what the cache lacks) ...", file=sys.stderr, flush=True)
    first = load_once()
    runs = []
    for i in range(args.loads):
        runs.append(load_once())
        print(f"load {i + 1}/{args.loads}: pair {runs[-1]['pair_s']:.2f} s, whole process "
              f"{runs[-1]['process_s']:.2f} s, peak {runs[-1]['peak_rss_gb']:.2f} GB", file=sys.stderr, flush=True)
    result = {"machine": machine_description(), "first": first, "runs": runs, "summary": summary(runs)}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    write_atomically(args.out, json.dumps(result, indent=1) + "\n", "the load timings")
    for step, values in result["summary"].items():
        print(f"{step:24s} median {values['median']:6.2f}  [{values['min']:.2f}, {values['max']:.2f}]")


if __name__ == "__main__":
    main()
