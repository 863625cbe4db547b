"""Reports from a results JSON (`runner.run_bench`): a markdown table and a speedup plot with 95% intervals."""

from __future__ import annotations

import json
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from verispec.errors import ConfigError

Column = tuple[str, Callable[[dict[str, Any]], str]]


def _fmt(value: Any, spec: str, suffix: str = "") -> str:
    return "-" if value is None else format(value, spec) + suffix


def _ci(row: dict[str, Any]) -> str:
    ci = row.get("speedup_ci95")
    return "-" if not ci else f"[{ci[0]:.2f}, {ci[1]:.2f}]"


# The table `verispec compare` prints (and always has).
COMPACT_COLUMNS: list[Column] = [
    ("method", lambda r: str(r["method"])),
    ("tokens", lambda r: str(r["tokens"])),
    ("tokens/s", lambda r: _fmt(r["tokens_per_second"], ".2f")),
    ("speedup", lambda r: _fmt(r["speedup"], ".2f", "x")),
    ("acceptance", lambda r: _fmt(r["acceptance_rate"], ".3f")),
    ("tokens/target call", lambda r: _fmt(r["tokens_per_target_call"], ".2f")),
]

# The full table of `verispec report`.
FULL_COLUMNS: list[Column] = [
    ("method", lambda r: str(r["method"])),
    ("prompts", lambda r: str(r["prompts"])),
    ("tokens", lambda r: str(r["tokens"])),
    ("ms/token", lambda r: _fmt(r["seconds_per_token"] and 1000 * r["seconds_per_token"], ".1f")),
    ("speedup", lambda r: _fmt(r["speedup"], ".2f", "x")),
    ("95% CI", _ci),
    ("tokens/target call", lambda r: _fmt(r["tokens_per_target_call"], ".2f")),
    ("acceptance", lambda r: _fmt(r["acceptance_rate"], ".3f")),
    ("α", lambda r: _fmt(r["alpha"], ".3f")),
    ("mean τ", lambda r: _fmt(r["mean_accepted"], ".2f")),
    ("target calls/token", lambda r: _fmt(r["target_calls_per_token"], ".3f")),
    ("draft calls/token", lambda r: _fmt(r["draft_calls_per_token"], ".3f")),
    ("c", lambda r: _fmt(r.get("cost_draft_c"), ".3f")),
    ("f", lambda r: _fmt(r.get("cost_block_f"), ".2f")),
    ("theoretical speedup", lambda r: _fmt(r.get("theoretical_speedup"), ".2f", "x")),
    ("same tokens as baseline", lambda r: _fmt(r.get("same_tokens_as_baseline"), ".0%")),
]


def format_table(rows: Sequence[dict[str, Any]], columns: Sequence[Column] = COMPACT_COLUMNS) -> str:
    """Return the aggregate rows as a markdown table with `columns` (header, formatter)."""
    lines = ["| " + " | ".join(h for h, _ in columns) + " |",
             "|---|" + "---:|" * (len(columns) - 1)]
    lines += ["| " + " | ".join(fmt(r) for _, fmt in columns) + " |" for r in rows]
    return "\n".join(lines)


def render_markdown(results: dict[str, Any]) -> str:
    """Return the markdown report: settings, machine, the full table and what the columns mean."""
    cfg, machine = results["config"], results["machine"]
    baseline = cfg.get("baseline") or ("ar" if "ar" in cfg["methods"] else cfg["methods"][0])
    n_prompts = len({r["prompt_index"] for r in results["records"]})
    category = f", categories {', '.join(cfg['category'])}" if cfg.get("category") else ""
    commit = (results.get("git_commit") or "unknown")[:12] + (" (dirty)" if results.get("git_dirty") else "")
    lines = [
        "# verispec benchmark",
        "",
        f"{n_prompts} prompts from `{cfg['prompts']}`{category}, up to {cfg['max_new_tokens']} new tokens, "
        f"γ = {cfg['gamma']}, temperature {cfg['temperature']}, top-k {cfg['top_k']}, top-p {cfg['top_p']}, "
        f"{cfg['dtype']} on {cfg.get('device', 'cpu')}; baseline `{baseline}`.",
        f"Machine: {machine['platform']}, {machine['processor']}, {machine['cpu_threads']} threads"
        f"{', ' + machine['gpu'] if machine.get('gpu') else ''}; torch {machine['torch']}, "
        f"transformers {machine['transformers']}; commit {commit}; started {results.get('started', '?')}.",
        "",
        format_table(results["aggregate"], FULL_COLUMNS),
        "",
        "Speedup: baseline seconds per token / method seconds per token, with a 95% percentile-bootstrap interval "
        "over prompts. α: per-position acceptance probability, accepted / (accepted + rejections). c: draft cost per "
        "drafted token and f: target cost of a γ+1-token block, both relative to a measured 1-token target forward; "
        "theoretical speedup (1 − α^{γ+1}) / ((1 − α)(γc + f)) (ALGORITHMS.md §3.4).",
    ]
    return "\n".join(lines) + "\n"


def plot_speedup(results: dict[str, Any], path: str | Path) -> Path:
    """Draw measured speedups (bars, 95% intervals) and theoretical ones (markers) per method; return the PNG path."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    rows = results["aggregate"]
    names = [r["method"] for r in rows]
    speed = [r["speedup"] or 0.0 for r in rows]
    lower = [s - r["speedup_ci95"][0] if r.get("speedup_ci95") else 0.0 for s, r in zip(speed, rows, strict=True)]
    upper = [r["speedup_ci95"][1] - s if r.get("speedup_ci95") else 0.0 for s, r in zip(speed, rows, strict=True)]
    fig = Figure(figsize=(1.4 * len(rows) + 2.5, 3.8), dpi=120)
    FigureCanvasAgg(fig)  # render without pyplot or a global backend
    ax = fig.add_subplot()
    ax.bar(names, speed, yerr=[lower, upper], capsize=5, color="#4c72b0", label="measured (95% CI)")
    theory = [(i, r["theoretical_speedup"]) for i, r in enumerate(rows) if r.get("theoretical_speedup")]
    if theory:
        ax.scatter([i for i, _ in theory], [t for _, t in theory], marker="D", color="#dd8452", zorder=3,
                   label="theoretical (measured α, c, f)")
    ax.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    cfg = results["config"]
    ax.set_ylabel("speedup vs baseline")
    ax.set_title(f"{len({r['prompt_index'] for r in results['records']})} prompts from {cfg['prompts']}, "
                 f"γ={cfg['gamma']}, T={cfg['temperature']}", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path


def write_report(
    results_path: str | Path, markdown_path: str | Path | None = None, plot_path: str | Path | None = None
) -> tuple[str, Path, Path]:
    """Render `results_path`; write the markdown (default: beside it, .md) and the plot (default: _speedup.png).

    Return (markdown text, markdown path, plot path).
    """
    results_path = Path(results_path)
    try:
        results = json.loads(results_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot read results file {results_path}: {exc}") from exc
    if "aggregate" not in results or "records" not in results:
        raise ConfigError(f"{results_path} is not a verispec bench results file (no 'aggregate' / 'records')")
    markdown = render_markdown(results)
    markdown_path = Path(markdown_path) if markdown_path else results_path.with_suffix(".md")
    plot_path = Path(plot_path) if plot_path else results_path.with_name(results_path.stem + "_speedup.png")
    plot_speedup(results, plot_path)
    link = f"\n![speedup]({plot_path.name})\n" if plot_path.parent.resolve() == markdown_path.parent.resolve() else ""
    markdown_path.parent.mkdir(parents=True, exist_ok=True)
    markdown_path.write_text(markdown + link)
    return markdown, markdown_path, plot_path
