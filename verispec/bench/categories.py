"""Speedups per prompt category: where a method pays and where it does not (Spec-Bench's summarization and RAG
prompts favour prompt lookup; its math and translation prompts do not).

`by_category` aggregates a bench run's records per category, each method against the baseline over the category's
prompts that both decoded (paired, with a 95% bootstrap interval over those prompts), with its tokens per target
call; `render_by_category` is the report's section, one row per method and one column per category, left out for a
run of one category.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from verispec.bench.metrics import paired_speedup
from verispec.stats import default_baseline


def by_category(records: Sequence[dict[str, Any]], methods: Sequence[str], baseline: str, resamples: int = 2000,
                seed: int = 0) -> dict[str, dict[str, dict[str, Any]]]:
    """Return {category: {method: {"prompts", "speedup", "speedup_ci95", "tokens_per_target_call"}}}, categories in
    order of first appearance; a record without a category counts as "uncategorised"."""
    out: dict[str, dict[str, dict[str, Any]]] = {}
    categories = list(dict.fromkeys(rec.get("category") or "uncategorised" for rec in records))
    for category in categories:
        mine = [rec for rec in records if (rec.get("category") or "uncategorised") == category]
        per_method = {m: {rec["prompt_index"]: rec for rec in mine if rec["method"] == m} for m in methods}
        base = per_method.get(baseline, {})
        rows: dict[str, dict[str, Any]] = {}
        for method, decoded in per_method.items():
            if not decoded:
                continue
            speedup, ci = paired_speedup(base, decoded, resamples, seed) if base else (None, None)
            calls = sum(rec["trace"]["target_calls"] for rec in decoded.values())
            tokens = sum(rec["trace"]["generated"] for rec in decoded.values())
            rows[method] = {"prompts": len(decoded), "speedup": speedup, "speedup_ci95": ci,
                            "tokens_per_target_call": tokens / calls if calls else None}
        out[category] = rows
    return out


def _cell(row: dict[str, Any] | None) -> str:
    if row is None or row["speedup"] is None:
        return "-"
    ci = row["speedup_ci95"]
    interval = f" [{ci[0]:.2f}, {ci[1]:.2f}]" if ci else ""
    calls = row["tokens_per_target_call"]
    return f"{row['speedup']:.2f}x{interval}" + (f", {calls:.2f}" if calls is not None else "")


def render_by_category(results: dict[str, Any]) -> str:
    """Return the report's per-category section ('' when the run has fewer than two categories)."""
    cfg, records = results["config"], results["records"]
    baseline = default_baseline(cfg["methods"], cfg.get("baseline"))
    table = by_category(records, cfg["methods"], baseline, cfg.get("bootstrap_resamples", 2000),
                        cfg.get("bootstrap_seed", 0))
    if len(table) < 2:
        return ""
    categories = list(table)
    prompts = {c: max((row["prompts"] for row in table[c].values()), default=0) for c in categories}
    lines = ["## By category", "",
             f"Speedup over `{baseline}` [95% CI over the category's prompts], tokens per target call.", "",
             "| method | " + " | ".join(f"{c} (n = {prompts[c]})" for c in categories) + " |",
             "|---|" + "---:|" * len(categories)]
    lines += [f"| {m} | " + " | ".join(_cell(table[c].get(m)) for c in categories) + " |" for m in cfg["methods"]]
    return "\n".join(lines)
