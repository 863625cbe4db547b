"""Split a resumed bench results file by the machine each sitting ran on: one results file per machine, its
aggregate recomputed from that machine's prompts only, for `verispec report` and `verispec pareto`.

Why: a run resumed in several sittings may have run them on different machines. Every prompt's methods run in one
sitting, so each per-prompt ratio is paired within a machine, but the pooled aggregate weighs the machines by their
prompts' time; the per-machine files show whether the machines agree.

    PYTHONPATH=. .venv/bin/python benchmarks/split_by_machine.py results/full/int4-lossy-humaneval-T1.json
    # writes results/full/int4-lossy-humaneval-T1.<machine>.json for each machine
"""

from __future__ import annotations

import argparse
import json
import re
from pathlib import Path
from typing import Any

from verispec.bench.files import write_atomically
from verispec.bench.metrics import summarize


def split(results: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """Return one results dict per machine (keyed by its CPU model), each with its sittings, records and a
    recomputed aggregate."""
    prompts: dict[str, set[int]] = {}
    sittings: dict[str, list[dict[str, Any]]] = {}
    for run in results["runs"]:
        machine = run["machine"].get("cpu_model") or "unknown"
        prompts.setdefault(machine, set()).update(run["prompts"])
        sittings.setdefault(machine, []).append(run)
    config = results["config"]
    out = {}
    for machine, mine in prompts.items():
        records = [r for r in results["records"] if r["prompt_index"] in mine]
        aggregate = summarize(records, config["methods"], config.get("baseline"), config.get("gamma"),
                              config.get("bootstrap_resamples", 2000), config.get("bootstrap_seed", 0),
                              config.get("compare_to"))
        out[machine] = {**results, "runs": sittings[machine], "machine": sittings[machine][-1]["machine"],
                        "records": records, "aggregate": aggregate}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("results", help="a results JSON written by `verispec bench`")
    args = p.parse_args()
    path = Path(args.results)
    parts = split(json.loads(path.read_text()))
    for machine, part in parts.items():
        slug = re.sub(r"[^a-z0-9]+", "-", machine.lower()).strip("-")
        target = path.with_name(f"{path.stem}.{slug}.json")
        write_atomically(target, json.dumps(part))
        print(f"{machine}: {len({r['prompt_index'] for r in part['records']})} prompts -> {target}")


if __name__ == "__main__":
    main()
