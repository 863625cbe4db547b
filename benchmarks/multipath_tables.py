"""The multi-path verification tables of BENCHMARKS.md from one results file of `benchmarks/run_full.sh multipath-T*`
(or its archive in benchmarks/results/).

Prints markdown: the prompts' facts, one row per method (wall time and block efficiency with 95% intervals, α,
block efficiency and speed against BV at the same γ and speed against `ar`, the time split, tokens per target
pass), BV against token verification per γ, and per category α and GBV's block efficiency against BV's. Every
number comes from `verispec.bench.metrics` (the report's "Block efficiency and wall time" section compares against
one method only; here each method is set against BV at its own γ).

    .venv/bin/python benchmarks/multipath_tables.py results/full/multipath-T0.6.json [--first N] [--divergence]
    .venv/bin/python benchmarks/multipath_tables.py benchmarks/results/int4-multipath-T1.0.json.gz

`--first N` keeps prompts 0..N-1 only (a table of a run's first N prompts). `--divergence` adds, per γ, where the
seed-sharing SD and BV decodes of each prompt part ways and how each fares after.
"""

from __future__ import annotations

import argparse
import re
import sys
from collections import Counter
from collections.abc import Sequence
from statistics import fmean
from typing import Any

from verispec.bench.files import read_results
from verispec.bench.metrics import alpha_estimate, efficiency, target_calls_and_tokens
from verispec.bench.tables import fmt, in_ms, with_ci
from verispec.errors import ConfigError
from verispec.stats import speedup_of_totals

RESAMPLES, SEED = 2000, 0


def parse_label(method: str) -> tuple[str, int, int]:
    """Return (family, K, γ) of a method label such as `gbv:paths=3,gamma=8` (K = 1, γ = 0 when absent)."""
    family, _, options = method.partition(":")
    values = dict(re.findall(r"(\w+)=(\d+)", options))
    return family, int(values.get("paths", 1)), int(values.get("gamma", 0))


def display(method: str) -> str:
    """Return the table's name of a method: `gbv K=3, γ=8`, `sd γ=4`, `ar`."""
    family, k, gamma = parse_label(method)
    if not gamma:
        return family
    return f"{family} K={k}, γ={gamma}" if k > 1 else f"{family} γ={gamma}"


def single_path(gamma: int) -> str:
    """Return the BV label at draft length γ: the comparison for every method with that γ."""
    return f"bv:gamma={gamma}"


def versus(records: list[dict[str, Any]], method: str, other: str, resamples: int = RESAMPLES) -> dict[str, Any]:
    """Return `method`'s efficiency row against `other` (block efficiency and speed ratios with intervals)."""
    return efficiency(records, [method, other], compare_to=other, resamples=resamples, seed=SEED)[0]


def prompt_facts(records: list[dict[str, Any]]) -> str:
    """Return one paragraph of facts on the prompts and the baseline's outputs."""
    ar = {r["prompt_index"]: r for r in records if r["method"] == "ar"}
    categories = Counter(r["category"] for r in ar.values())
    lengths = [r["prompt_tokens"] for r in ar.values()]
    eos = sum(r["stopped_at_eos"] for r in ar.values())
    return (f"{len(ar)} prompts ({', '.join(f'{c} {n}' for c, n in categories.most_common())}); "
            f"{min(lengths)}-{max(lengths)} prompt tokens (mean {fmean(lengths):.0f}); `ar` wrote "
            f"{sum(r['trace']['generated'] for r in ar.values()):,} tokens, {eos} of its "
            f"{len(ar)} outputs end at EOS; decodes finished {min(r['finished'] for r in records)} to "
            f"{max(r['finished'] for r in records)}.")


def run_speeds(records: list[dict[str, Any]], runs: list[dict[str, Any]]) -> str:
    """Return one line giving `ar`'s ms/token in each run of the file, to show how fast each run's machine was.

    A resumed run mixes machines; the ratios against BV and `ar` pair methods within a prompt (one machine), but the
    absolute ms/token of a row blends the runs' speeds.
    """
    parts = []
    for index, run in enumerate(runs):
        ar = [r for r in records if r["run"] == index and r["method"] == "ar"]
        if not ar:
            continue
        prompts = sorted(r["prompt_index"] for r in ar)
        row = efficiency(ar, ["ar"], resamples=1)[0]  # the same ms/token as the table's, this run's prompts only
        parts.append(f"run {index} (started {run['started']}, prompts {prompts[0]}-{prompts[-1]}): "
                     f"{fmt(row['seconds_per_token'] * 1e3, '.0f')}")
    return "`ar` ms/token by run: " + "; ".join(parts) + "."


def method_table(records: list[dict[str, Any]], methods: list[str]) -> list[str]:
    """Return the markdown rows of the per-method table."""
    lines = ["| method | ms/token [95% CI] | block efficiency [95% CI] | α | block efficiency vs bv, same γ [95% CI] "
             "| speed vs bv, same γ [95% CI] | speed vs ar [95% CI] | draft / target / verify ms per token "
             "| tokens per target pass |", "|---|" + "---:|" * 8]
    for row in efficiency(records, methods, compare_to="ar", resamples=RESAMPLES, seed=SEED):
        method = row["method"]
        family, _, gamma = parse_label(method)
        if gamma and method != single_path(gamma):
            same = versus(records, method, single_path(gamma))
            block_vs = with_ci(same, "block_efficiency_vs", ".3f")
            speed_vs = with_ci(same, "speedup_vs", ".2f", suffix="x")
        else:
            block_vs, speed_vs = ("1.000", "1.00x") if gamma else ("-", "-")
        alpha = alpha_estimate([r for r in records if r["method"] == method]) if gamma else None
        split = " / ".join(fmt(row[f"{part}_seconds_per_token"] * 1e3, ".1f") for part in ("draft", "target", "verify"))
        lines.append(" | ".join([
            f"| {display(method)}",
            with_ci(in_ms(row, "seconds_per_token"), "seconds_per_token", ".1f"),
            with_ci(row, "tokens_per_target_call", ".2f"),
            fmt(alpha, ".3f"), block_vs, speed_vs,
            with_ci(row, "speedup_vs", ".2f", suffix="x"),
            split, fmt(row["tokens_per_target_pass"], ".1f"),
        ]) + " |")
    return lines


def bv_against_sd(records: list[dict[str, Any]], methods: list[str]) -> list[str]:
    """Return one line per γ: BV's block efficiency and speed against token verification (SD) at that γ."""
    lines = []
    for gamma in sorted({parse_label(m)[2] for m in methods if parse_label(m)[0] == "bv"}):
        sd = f"sd:gamma={gamma}"
        if sd not in methods:
            continue
        row = versus(records, single_path(gamma), sd)
        lines.append(f"- BV vs SD at γ = {gamma}: block efficiency "
                     f"{with_ci(row, 'block_efficiency_vs', '.3f')}, "
                     f"speed {with_ci(row, 'speedup_vs', '.2f', suffix='x')}")
    return lines


def first_different_round(mine: dict[str, Any], base: dict[str, Any]) -> int | None:
    """Return the index of the round that emitted the first token where two decodes differ (None if they match).

    Up to that round both decodes emitted the same tokens in the same rounds, so the index is the same in both.
    """
    a, b = mine["tokens"], base["tokens"]
    if a == b:
        return None
    position = next((i for i, (x, y) in enumerate(zip(a, b, strict=False)) if x != y), min(len(a), len(b)))
    emitted = 0
    for index, round_ in enumerate(mine["trace"]["rounds"]):
        emitted += round_["emitted"]
        if emitted > position:
            return index
    return len(mine["trace"]["rounds"])


def mean_accepted_after(record: dict[str, Any], index: int) -> float | None:
    """Return the mean accepted tokens τ over the rounds after round `index` (None when there are none)."""
    later = [r["accepted"] for r in record["trace"]["rounds"][index + 1:]]
    return fmean(later) if later else None


def divergence_lines(records: list[dict[str, Any]], methods: list[str]) -> list[str]:
    """Return one line per γ on SD and BV decoded with one seed: how many prompts' outputs match, BV/SD block
    efficiency per prompt, and which method accepted more per round after the two parted."""
    lines = []
    for gamma in sorted({parse_label(m)[2] for m in methods if parse_label(m)[0] == "bv"}):
        sd, bv = f"sd:gamma={gamma}", single_path(gamma)
        if sd not in methods:
            continue
        by_prompt = {(r["method"], r["prompt_index"]): r for r in records if r["method"] in (sd, bv)}
        prompts = sorted({index for _, index in by_prompt})
        ratios, parted, bv_ahead, sd_ahead = [], [], 0, 0
        for index in prompts:
            mine, base = by_prompt[bv, index], by_prompt[sd, index]
            # BV/SD block efficiency of this prompt: the paired ratio of tokens per target call
            ratios.append(speedup_of_totals([target_calls_and_tokens(base["trace"])],
                                            [target_calls_and_tokens(mine["trace"])]))
            where = first_different_round(mine, base)
            if where is None:
                continue
            parted.append(ratios[-1])
            after = mean_accepted_after(mine, where), mean_accepted_after(base, where)
            if None not in after and after[0] != after[1]:
                bv_ahead += after[0] > after[1]
                sd_ahead += after[0] < after[1]
        parted_range = f"{min(parted):.2f}-{max(parted):.2f}" if parted else "-"
        lines.append(f"- SD and BV at γ = {gamma}: BV/SD block efficiency per prompt "
                     f"{min(ratios):.2f}-{max(ratios):.2f}; outputs identical on {len(prompts) - len(parted)} of "
                     f"{len(prompts)} prompts; on the {len(parted)} others BV/SD is {parted_range} "
                     f"({sum(r < 1 for r in parted)} below 1), and the mean τ after the first differing round is "
                     f"higher for BV on {bv_ahead}, for SD on {sd_ahead}")
    return lines


def category_table(records: list[dict[str, Any]], methods: list[str]) -> list[str]:
    """Return a markdown table per category: prompts, BV's α at each γ, and GBV/BV block efficiency per (K, γ)."""
    gbv = [m for m in methods if parse_label(m)[0] == "gbv"]
    gammas = sorted({parse_label(m)[2] for m in methods if parse_label(m)[0] == "bv"})
    head = ["category", "prompts"] + [f"α bv γ={g}" for g in gammas] + [f"gbv/bv {display(m)[4:]}" for m in gbv]
    lines = ["| " + " | ".join(head) + " |", "|---|" + "---:|" * (len(head) - 1)]
    for category, _ in Counter(r["category"] for r in records if r["method"] == "ar").most_common():
        mine = [r for r in records if r["category"] == category]
        cells = [category, str(len({r["prompt_index"] for r in mine}))]
        cells += [fmt(alpha_estimate([r for r in mine if r["method"] == single_path(g)]), ".2f") for g in gammas]
        for method in gbv:
            row = versus(mine, method, single_path(parse_label(method)[2]), resamples=1)  # the ratio only
            cells.append(fmt(row["block_efficiency_vs"], ".2f"))
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv: Sequence[str] | None = None) -> None:
    """Print the multi-path tables for one results file."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("results", help="a results file of `benchmarks/run_full.sh multipath-T*`")
    parser.add_argument("--first", type=int, default=None, help="keep prompts 0..N-1 only")
    parser.add_argument("--divergence", action="store_true",
                        help="also print where the seed-sharing SD and BV decodes part ways, per γ")
    args = parser.parse_args(argv)
    data = read_results(args.results)
    records = [r for r in data["records"] if args.first is None or r["prompt_index"] < args.first]
    methods = list(data["config"]["methods"])
    print(prompt_facts(records), "", run_speeds(records, data["runs"]), "", *method_table(records, methods), "",
          *bv_against_sd(records, methods), "",
          *category_table(records, methods), sep="\n")
    if args.divergence:
        print("", *divergence_lines(records, methods), sep="\n")


if __name__ == "__main__":
    try:
        main()
    except ConfigError as exc:  # a file that is not results: one line, not a traceback
        sys.exit(f"error: {exc}")
