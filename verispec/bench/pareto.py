"""Speed vs quality: one point per method (and per run, e.g. one run per SPRINTER threshold), a Pareto front, PNG.

x = speedup vs the run's baseline (`ar` by default) with its 95% bootstrap interval; y = a quality aggregate of
`quality.summarize_quality` with its 95% interval: ROUGE-L vs the `ar` output (higher is better), ROUGE-L vs the
references, or the target's NLL per token / perplexity (lower is better). The front joins the points no other
point beats on both axes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verispec.bench.figures import save_figure
from verispec.errors import ConfigError

# y key -> (axis label, whether higher is better)
QUALITY_AXES: dict[str, tuple[str, bool]] = {
    "rouge_l_vs_ar": ("ROUGE-L F1 vs the target's ar output (token ids)", True),
    "rouge_l_vs_reference": ("ROUGE-L F1 vs reference answers (words)", True),
    "nll_per_token": ("target NLL per output token (nats)", False),
    "ppl": ("target perplexity of the output", False),
}


@dataclass(frozen=True)
class Point:
    """One method of one run on the speed-quality plane."""

    label: str  # the method, prefixed by the run's label when several runs are drawn
    speed: float  # speedup vs the run's baseline
    speed_ci: tuple[float, float] | None  # its 95% interval
    quality: float  # the chosen quality aggregate
    quality_ci: tuple[float, float] | None  # its 95% interval


def pareto_points(runs: Sequence[tuple[str, dict[str, Any]]], y: str = "rouge_l_vs_ar") -> list[Point]:
    """Return the points of every aggregate row of every (label, results) run that has a speedup and a `y` value."""
    if y not in QUALITY_AXES:
        raise ConfigError(f"unknown quality axis {y!r}; choose one of {', '.join(QUALITY_AXES)}")
    points = []
    for label, results in runs:
        for row in results["aggregate"]:
            if row.get("speedup") is None or row.get(y) is None:
                continue
            name = f"{label}: {row['method']}" if label else row["method"]
            speed_ci, quality_ci = row.get("speedup_ci95"), row.get(f"{y}_ci95")
            points.append(Point(name, row["speedup"], tuple(speed_ci) if speed_ci else None, row[y],
                                tuple(quality_ci) if quality_ci else None))
    return points


def pareto_front(points: Sequence[Point], higher_is_better: bool = True) -> list[Point]:
    """Return the points not dominated by another (at least as fast and as good, better in one), fastest last."""
    sign = 1.0 if higher_is_better else -1.0

    def dominates(a: Point, b: Point) -> bool:
        at_least = a.speed >= b.speed and sign * a.quality >= sign * b.quality
        return at_least and (a.speed > b.speed or sign * a.quality > sign * b.quality)

    front = [p for p in points if not any(dominates(o, p) for o in points)]
    return sorted(front, key=lambda p: p.speed)


def plot_pareto(
    results: dict[str, Any] | Sequence[tuple[str, dict[str, Any]]], path: str | Path, y: str = "rouge_l_vs_ar"
) -> Path:
    """Draw speedup vs quality with 95% intervals on both axes, labels, and the Pareto front; return the PNG path.

    `results`: one results dict, or (label, results) pairs, one per run. Raises ConfigError without any point.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    runs = [("", results)] if isinstance(results, dict) else list(results)
    points = pareto_points(runs, y)
    if not points:
        raise ConfigError(f"no method has both a speedup and {y!r}: run the bench with --quality (and `ar` for "
                          f"ROUGE-L vs ar)")
    label, higher = QUALITY_AXES[y]
    fig = Figure(figsize=(6.4, 4.6), dpi=120)
    FigureCanvasAgg(fig)  # render without pyplot or a global backend
    ax = fig.add_subplot()
    for p in points:
        xerr = [[p.speed - p.speed_ci[0]], [p.speed_ci[1] - p.speed]] if p.speed_ci else None
        yerr = [[p.quality - p.quality_ci[0]], [p.quality_ci[1] - p.quality]] if p.quality_ci else None
        ax.errorbar([p.speed], [p.quality], xerr=xerr, yerr=yerr, fmt="o", capsize=3, color="#4c72b0")
        ax.annotate(p.label, (p.speed, p.quality), textcoords="offset points", xytext=(5, 5), fontsize=8)
    front = pareto_front(points, higher)
    ax.plot([p.speed for p in front], [p.quality for p in front], linestyle="--", color="#dd8452",
            label="Pareto front")
    ax.axvline(1.0, color="grey", linewidth=0.8, linestyle=":")
    cfg = runs[0][1]["config"]
    prompts = len({r["prompt_index"] for r in runs[0][1]["records"]})
    baseline = cfg.get("baseline") or ("ar" if "ar" in cfg["methods"] else cfg["methods"][0])
    ax.set_xlabel(f"speedup vs {baseline} (95% CI over prompts)")
    ax.set_ylabel(label + (" ↑" if higher else " ↓"))
    ax.set_title(f"{prompts} prompts from {cfg['prompts']}, γ={cfg['gamma']}, T={cfg['temperature']}; "
                 f"error bars: 95% bootstrap intervals", fontsize=8)
    ax.legend(fontsize=8)
    return save_figure(fig, path)
