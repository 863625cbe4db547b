"""Speed vs quality: one point per method (and per run, e.g. one run per SPRINTER threshold), a Pareto front, PNG.

x = speedup vs the run's baseline (`ar` by default) with its 95% bootstrap interval; y = a quality aggregate of
`quality.summarize_quality` with its 95% interval: ROUGE-L vs the `ar` output (higher is better), ROUGE-L vs the
references, HumanEval pass@1 by execution, the online leak of lossy rules, or the target's NLL per token /
perplexity (lower is better). The front joins the points no other point beats on both axes.

`sweep_methods` lists the lossy rules of `verify/relaxed.py` swept over their knobs (`SWEEPS`, lossless end first)
with the lossless methods and `draft` as reference points, for `verispec bench --sweep`; `write_fronts` draws one
front per quality axis the results hold (PNG) and returns the markdown tables, each with the front's methods from
slowest to fastest (which rule dominates where).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from verispec.bench.figures import save_figure
from verispec.errors import ConfigError
from verispec.stats import default_baseline

# y key -> (axis label, whether higher is better)
QUALITY_AXES: dict[str, tuple[str, bool]] = {
    "rouge_l_vs_ar": ("ROUGE-L F1 vs the target's ar output (token ids)", True),
    "rouge_l_vs_reference": ("ROUGE-L F1 vs reference answers (words)", True),
    "nll_per_token": ("target NLL per output token (nats)", False),
    "ppl": ("target perplexity of the output", False),
    "pass_at_1": ("HumanEval pass@1 by execution", True),
    "leak_tv_out": ("online leak: mean TV(output law, p) per position", False),
}

# Each lossy rule's knob values for a sweep, in the bench's variant syntax: the lossless end first, then looser.
SWEEPS: dict[str, list[str]] = {
    "typical": ["typical:epsilon=1,delta=inf", "typical:epsilon=0.3,delta=0.6", "typical:epsilon=0.09,delta=0.3",
                "typical:epsilon=0.03,delta=0.1"],
    "margin": ["margin:delta=0", "margin:delta=0.5", "margin:delta=1", "margin:delta=2"],
    "fuzzy": ["fuzzy:threshold=0", "fuzzy:threshold=0.05", "fuzzy:threshold=0.15", "fuzzy:threshold=0.3"],
    "fly": ["fly:entropy=1.1", "fly:entropy=0.6", "fly:entropy=0.3", "fly:entropy=0.1"],
}
# x key -> axis words: per generated token, or per answer (whole time on the same prompts, whatever the lengths)
SPEED_AXES: dict[str, str] = {"speedup": "speedup per token", "answer_speedup": "speedup per answer"}
REFERENCES = ("ar", "sd", "bv", "draft")  # the lossless references and the draft-only quality floor


def sweep_methods(rules: Sequence[str] = tuple(SWEEPS), references: Sequence[str] = REFERENCES,
                  lossless_ends: bool = False) -> list[str]:
    """Return the bench methods of a sweep: `references`, then each rule's knob values (its lossless end, which
    decodes exactly as `sd`, only with `lossless_ends`)."""
    unknown = [rule for rule in rules if rule not in SWEEPS]
    if unknown:
        raise ConfigError(f"no sweep for {', '.join(unknown)}; choose from {', '.join(SWEEPS)}")
    return [*references, *(label for rule in rules for label in SWEEPS[rule][0 if lossless_ends else 1:])]


@dataclass(frozen=True)
class Point:
    """One method of one run on the speed-quality plane."""

    label: str  # the method, prefixed by the run's label when several runs are drawn
    speed: float  # speedup vs the run's baseline
    speed_ci: tuple[float, float] | None  # its 95% interval
    quality: float  # the chosen quality aggregate
    quality_ci: tuple[float, float] | None  # its 95% interval


def pareto_points(runs: Sequence[tuple[str, dict[str, Any]]], y: str = "rouge_l_vs_ar",
                  x: str = "speedup") -> list[Point]:
    """Return the points of every aggregate row of every (label, results) run that has an `x` speedup and a `y`
    value."""
    if y not in QUALITY_AXES:
        raise ConfigError(f"unknown quality axis {y!r}; choose one of {', '.join(QUALITY_AXES)}")
    if x not in SPEED_AXES:
        raise ConfigError(f"unknown speed axis {x!r}; choose one of {', '.join(SPEED_AXES)}")
    points = []
    for label, results in runs:
        for row in results["aggregate"]:
            if row.get(x) is None or row.get(y) is None:
                continue
            name = f"{label}: {row['method']}" if label else row["method"]
            speed_ci, quality_ci = row.get(f"{x}_ci95"), row.get(f"{y}_ci95")
            points.append(Point(name, row[x], tuple(speed_ci) if speed_ci else None, row[y],
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
    results: dict[str, Any] | Sequence[tuple[str, dict[str, Any]]], path: str | Path, y: str = "rouge_l_vs_ar",
    x: str = "speedup",
) -> Path:
    """Draw speedup vs quality with 95% intervals on both axes, labels, and the Pareto front; return the PNG path.

    `results`: one results dict, or (label, results) pairs, one per run. Raises ConfigError without any point.
    """
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    runs = [("", results)] if isinstance(results, dict) else list(results)
    points = pareto_points(runs, y, x)
    if not points:
        raise ConfigError(f"no method has both a {SPEED_AXES[x]} and {y!r}: run the bench with --quality (and `ar` for "
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
    baseline = default_baseline(cfg["methods"], cfg.get("baseline"))
    ax.set_xlabel(f"{SPEED_AXES[x]} vs {baseline} (95% CI over prompts)")
    ax.set_ylabel(label + (" ↑" if higher else " ↓"))
    ax.set_title(f"{prompts} prompts from {cfg['prompts']}, γ={cfg['gamma']}, T={cfg['temperature']}; "
                 f"error bars: 95% bootstrap intervals", fontsize=8)
    ax.legend(fontsize=8)
    return save_figure(fig, path)


def front_table(points: Sequence[Point], y: str, x: str = "speedup") -> str:
    """Return the markdown table of `points` on axis `y` (fastest first), marking the Pareto front, then the front
    from slowest to fastest: where each rule dominates."""
    label, higher = QUALITY_AXES[y]
    front = pareto_front(points, higher)
    on_front = {p.label for p in front}

    def ci(value: float, interval: tuple[float, float] | None, spec: str) -> str:
        return format(value, spec) + (f" [{interval[0]:{spec}}, {interval[1]:{spec}}]" if interval else "")

    lines = [f"### {label} ({'higher' if higher else 'lower'} is better)", "",
             f"| method | {SPEED_AXES[x]} [95% CI] | quality [95% CI] | on the front |", "|---|---:|---:|:---:|"]
    for p in sorted(points, key=lambda p: -p.speed):
        lines.append(f"| {p.label} | {ci(p.speed, p.speed_ci, '.2f')} | {ci(p.quality, p.quality_ci, '.3f')} | "
                     f"{'yes' if p.label in on_front else ''} |")
    lines += ["", "Front, slowest to fastest: " + " → ".join(f"{p.label} ({p.speed:.2f}x, {p.quality:.3f})"
                                                             for p in front)]
    return "\n".join(lines)


def write_fronts(runs: Sequence[tuple[str, dict[str, Any]]], out_dir: str | Path,
                 x: str = "speedup") -> tuple[str, list[Path]]:
    """Draw one front per quality axis that the runs hold (`front_<axis>.png` in `out_dir`) against the `x` speedup;
    return the markdown of every axis's `front_table` and the PNG paths. Raises ConfigError when no axis has a
    point."""
    out_dir = Path(out_dir)
    sections, paths = [], []
    for y in QUALITY_AXES:
        points = pareto_points(runs, y, x)
        if not points:
            continue
        paths.append(plot_pareto(runs, out_dir / f"front_{y}.png", y, x))
        sections.append(front_table(points, y, x))
    if not sections:
        raise ConfigError("no method has both a speedup and a quality figure: run the bench with --quality")
    title = f"## {SPEED_AXES[x].capitalize()} against quality, one front per metric"
    return "\n\n".join([title, *sections]) + "\n", paths
