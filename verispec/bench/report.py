"""Reports from a results JSON (`runner.run_bench`): markdown tables and a speedup plot with 95% intervals; for a
`--quality` run also a speed-vs-quality (Pareto) plot (`bench.pareto`)."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from verispec.bench.categories import render_by_category
from verispec.bench.figures import save_figure
from verispec.bench.files import read_results, results_stem, shape_errors_named
from verispec.bench.metrics import (
    TIME_PARTS,
    decode_split,
    efficiency,
)
from verispec.bench.modelled import render_modelled
from verispec.bench.sprinter_online import sprinter_online
from verispec.bench.tables import Column, ci_cell, fmt, format_table, in_ms, value_column, with_ci
from verispec.errors import ConfigError
from verispec.stats import default_baseline

# The full table of `verispec report`.
FULL_COLUMNS: list[Column] = [
    ("method", lambda r: str(r["method"])),
    ("prompts", lambda r: str(r["prompts"])),
    ("tokens", lambda r: str(r["tokens"])),
    ("ms/token", lambda r: fmt(r["seconds_per_token"] and 1000 * r["seconds_per_token"], ".1f")),
    value_column("speedup", "speedup", ".2f", "x"),
    ("95% CI", ci_cell),
    value_column("tokens/target call", "tokens_per_target_call", ".2f"),
    value_column("acceptance", "acceptance_rate", ".3f"),
    value_column("α", "alpha", ".3f"),
    value_column("mean τ", "mean_accepted", ".2f"),
    value_column("target calls/token", "target_calls_per_token", ".3f"),
    value_column("draft calls/token", "draft_calls_per_token", ".3f"),
    value_column("c", "cost_draft_c", ".3f"),
    value_column("f", "cost_block_f", ".2f"),
    value_column("theoretical speedup", "theoretical_speedup", ".2f", "x"),
    value_column("same tokens as baseline", "same_tokens_as_baseline", ".0%"),
]


def full_columns(compare_to: str | None = None) -> list[Column]:
    """Return the columns of the report's main table; with `compare_to` (bench `--compare-to`), the speedup over
    that method and its interval follow the speedup over the baseline."""
    if compare_to is None:
        return FULL_COLUMNS
    key = f"speedup_vs_{compare_to}"
    versus: list[Column] = [
        value_column(f"vs {compare_to}", key, ".2f", "x"),
        (f"95% CI vs {compare_to}", lambda r: ci_cell(r, key)),
    ]
    at = [header for header, _ in FULL_COLUMNS].index("95% CI") + 1
    return [*FULL_COLUMNS[:at], *versus, *FULL_COLUMNS[at:]]


# Quality (bench --quality), FLOPs and SPRINTER's online operating point: the second table of `verispec report`.
QUALITY_COLUMNS: list[Column] = [
    ("method", lambda r: str(r["method"])),
    ("scored prompts", lambda r: str(r.get("quality_prompts") or 0)),
    ("speedup per answer [95% CI]", lambda r: with_ci(r, "answer_speedup", ".2f", suffix="x")),
    ("NLL/token [95% CI]", lambda r: with_ci(r, "nll_per_token", ".3f")),
    ("perplexity [95% CI]", lambda r: with_ci(r, "ppl", ".2f")),
    ("ROUGE-L vs ar [95% CI]", lambda r: with_ci(r, "rouge_l_vs_ar", ".3f", count=True)),
    ("ROUGE-L vs reference [95% CI]", lambda r: with_ci(r, "rouge_l_vs_reference", ".3f", count=True)),
    ("pass@1 [95% CI]", lambda r: with_ci(r, "pass_at_1", ".3f", count=True)),
    ("GFLOPs/token", lambda r: fmt(r.get("flops_per_token") and r["flops_per_token"] / 1e9, ".4g")),
    ("decode GFLOPs/token", lambda r: fmt(r.get("flops_per_token_decode") and r["flops_per_token_decode"] / 1e9,
                                           ".4g")),
    value_column("leak TV(out, p)/position", "leak_tv_out", ".4f"),
    value_column("η_FP", "eta_fp", ".3f"),
    value_column("η_TP", "eta_tp", ".3f"),
    ("verifier tokens", lambda r: str(r.get("verifier_tokens") or "-")),
]

QUALITY_NOTE = (
    "NLL/token: Σ NLL / Σ tokens of the outputs under the target given the same prompt ids (temperature-1 softmax "
    "of the raw logits: the model's perplexity, not that of the processed sampling law; EOS scored when it ended an "
    "output); perplexity = exp(NLL/token). ROUGE-L: LCS-based F1, vs the `ar` output of the same prompt and seed on "
    "token ids, vs reference answers on whitespace words; mean over the n prompts that have the comparison. "
    "Speedup per answer: the baseline's total time over the method's on the same prompts, whatever the answers' "
    "lengths (per token, a method that writes longer answers looks faster than it answers). "
    "pass@1: HumanEval problems whose output passes the problem's tests, run sandboxed (`verispec/bench/"
    "execution.py`), over the n problems scored. "
    "Intervals: 95% percentile bootstrap over prompts. `draft` (the draft alone) is the quality floor. FLOPs: "
    "2·N·tokens per forward of every model (N = linear-layer weights, LM head included) plus attention "
    "4·L·d_attn·context per token, plus 2·F per learned-verifier score; decode GFLOPs/token leaves out each model's "
    "prompt prefill (convention: `verispec/bench/flops.py`). η_FP / η_TP: the learned verifier's acceptance rate "
    "among unacceptable / acceptable drafted tokens (q(x) ≤ p(x)), measured online and pooled over prompts. "
    "Leak: the mean over drafted positions of ε = Σ_v a(v)·(q(v) − p(v))_+, the exact TV between that position's "
    "output law and p given the rule's acceptance a(v) of every token (docs/algorithms.md §3.3; SPRINTER: the "
    "positions its verifier steers; typical / margin / fuzzy / fly: the positions the rule examined, fly's ε an "
    "unbiased one-sample estimate, `verispec/verify/relaxed.py`); 0 for lossless methods, '-' for `draft`."
)


SPRINTER_COLUMNS: list[Column] = [
    ("method", lambda r: str(r["method"])),
    ("rounds (natural)", lambda r: f"{r['rounds']} ({r['natural_rounds']})"),
    ("cap", lambda r: str(r["cap"])),
    value_column("π", "pi", ".3f"),
    value_column("α (acceptable)", "alpha", ".3f"),
    value_column("η_TP", "eta_tp", ".3f"),
    value_column("η_FP", "eta_fp", ".3f"),
    value_column("pass rate", "pass_rate", ".3f"),
    value_column("T measured", "run_length", ".2f"),
    value_column("E[T] predicted", "run_length_predicted", ".2f"),
    value_column("N measured", "tokens_per_round", ".2f"),
    value_column("E[N] predicted", "tokens_per_round_predicted", ".2f"),
    value_column("error autocorrelation", "error_autocorrelation", ".3f"),
    value_column("TV(p, q)", "tv_pq", ".3f"),
    value_column("TV(out, p) measured", "tv_out", ".4f"),
    value_column("η_FP·TV(p, q) predicted", "tv_out_predicted", ".4f"),
]

SPRINTER_NOTE = (
    "Per SPRINTER method, pooled over prompts, from the decode traces (`bench/sprinter_online.py`): π = the "
    "verifier's acceptance rate on tokens below the cap; α = share of drafted tokens acceptable (q(x) ≤ p(x) in the "
    "round's target pass); pass rate = the checked token's SD pass rate; T = tokens drafted per round, N = tokens "
    "committed per round (T + 1 on a pass), over the rounds that ended at a rejection or at the cap; E[T] = "
    "(1 − π^C)/(1 − π) and E[N] = E[T] + pass rate (docs/algorithms.md §3.4, i.i.d. verifier decisions); error "
    "autocorrelation: lag-1 correlation of verifier errors (accept ≠ acceptable) between consecutive tokens of a run "
    "(i.i.d.: 0). TV columns, over the positions the verifier steers: TV(p, q); TV(out, p) = mean ε = Σ_v a(v)·"
    "(q(v) − p(v))_+, exact per position given the verifier's decision a(v) on every token (§3.3); predicted "
    "η_FP·TV(p, q) (§3.3, token-aware verifier, λ = 1); '-' for lossless methods. By position: the verifier's "
    "acceptance rate / the acceptable share at each position of a run (i.i.d.: flat); the last column pools the "
    "later positions."
)


def render_sprinter_online(rows: Sequence[tuple[str, dict[str, Any]]]) -> str:
    """Return the markdown section setting SPRINTER's §3.4 predictions against the traces: one row per
    (method, `sprinter_online` figures), then acceptance by position in the run."""
    table = format_table([{"method": m, **figures} for m, figures in rows], SPRINTER_COLUMNS)
    width = max(len(f["per_position"]) for _, f in rows)
    header = [f"{p['position']}{'+' if p['pooled'] else ''}" for _, f in rows for p in f["per_position"]]
    labels = list(dict.fromkeys(sorted(header, key=lambda h: int(h.rstrip("+")))))[:width]
    lines = ["| method | " + " | ".join(f"position {h}" for h in labels) + " |",
             "|---|" + "---:|" * len(labels)]
    for method, figures in rows:
        cells = {f"{p['position']}{'+' if p['pooled'] else ''}":
                 f"{p['accept_rate']:.2f} / {p['acceptable_rate']:.2f} (n = {p['tokens']})"
                 for p in figures["per_position"]}
        lines.append(f"| {method} | " + " | ".join(cells.get(h, "-") for h in labels) + " |")
    return "\n".join(["## SPRINTER: theory vs measurement (online)", "", table, "", "\n".join(lines), "",
                      SPRINTER_NOTE])


def _split_columns(baseline: str) -> list[Column]:
    return [
        ("method", lambda r: str(r["method"])),
        value_column("prompt round share of time", "prompt_round_share", ".0%"),
        ("decode-round ms/token", lambda r: fmt(r["decode_seconds_per_token"] and
                                                 1000 * r["decode_seconds_per_token"], ".1f")),
        value_column(f"decode-round speedup vs {baseline}", "decode_speedup", ".2f", "x"),
        ("95% CI", lambda r: ci_cell(r, "decode_speedup")),
        value_column(f"whole-decode speedup vs {baseline}", "speedup", ".2f", "x"),
        value_column("theoretical speedup", "theoretical_speedup", ".2f", "x"),
    ]


def render_decode_split(results: dict[str, Any], baseline: str) -> str:
    """Return the markdown section splitting each method's time into the prompt round and the decode rounds
    (`metrics.decode_split`, computed from the records), with the SD formula's speedup beside the decode rounds'."""
    cfg, records = results["config"], results["records"]
    split = decode_split(records, cfg["methods"], baseline, cfg.get("bootstrap_resamples", 2000),
                         cfg.get("bootstrap_seed", 0))
    aggregate = {r["method"]: r for r in results["aggregate"]}
    rows = [{**aggregate.get(r["method"], {}), **r} for r in split]
    lengths = [rec["trace"].get("prefill_tokens", 0) for rec in records if rec["method"] == baseline]
    return "\n".join([
        "## Prompt round and decode rounds", "",
        format_table(rows, _split_columns(baseline)), "",
        "A decode's first round processes the prompt (the target's prefill and, for speculative methods, the "
        "draft's own) and commits the first tokens; the decode rounds are all the later ones. Prompts here average "
        f"{sum(lengths) / max(len(lengths), 1):.0f} tokens (longest {max(lengths, default=0)}). The theoretical SD "
        "speedup prices decode rounds only, so it is to be read against the decode-round speedup; the "
        "whole-decode speedup is the main table's. Bookkeeping outside the rounds (and the peers' logits "
        "processing) counts as decode-round time.",
    ])


def _time_split(row: dict[str, Any]) -> str:
    """Milliseconds per token in each of `TIME_PARTS`, joined by ' / '."""
    per_token = (row[f"{part}_seconds_per_token"] for part in TIME_PARTS)
    return " / ".join(fmt(None if s is None else 1000 * s, ".1f") for s in per_token)


def _efficiency_columns(compare_to: str | None) -> list[Column]:
    columns: list[Column] = [
        ("method", lambda r: str(r["method"])),
        ("prompts", lambda r: str(r["prompts"])),
        ("ms/token [95% CI]", lambda r: with_ci(in_ms(r, "seconds_per_token"), "seconds_per_token", ".1f")),
        ("tokens/target call [95% CI]", lambda r: with_ci(r, "tokens_per_target_call", ".2f")),
    ]
    if compare_to is not None:
        columns += [
            (f"tokens/target call vs {compare_to} [95% CI]", lambda r: with_ci(r, "block_efficiency_vs", ".3f")),
            (f"speedup vs {compare_to} [95% CI]", lambda r: with_ci(r, "speedup_vs", ".2f", suffix="x")),
        ]
    columns += [
        (" / ".join(TIME_PARTS) + " ms/token", _time_split),
        value_column("tokens per target pass", "tokens_per_target_pass", ".1f"),
    ]
    return columns


def render_efficiency(results: dict[str, Any]) -> str:
    """Return the markdown section of block efficiency and wall time per token, each with its 95% interval, the
    paired ratios against the run's `--compare-to` method, and where each method's time goes
    (`metrics.efficiency`, computed from the records)."""
    cfg = results["config"]
    compare_to = cfg.get("compare_to")
    rows = efficiency(results["records"], cfg["methods"], compare_to, cfg.get("bootstrap_resamples", 2000),
                      cfg.get("bootstrap_seed", 0))
    versus = (f" 'vs {compare_to}': the ratio of this method's block efficiency (or speed) to `{compare_to}`'s "
              "over the prompts both decoded, with its paired interval." if compare_to else "")
    return "\n".join([
        "## Block efficiency and wall time", "",
        format_table(rows, _efficiency_columns(compare_to)), "",
        "Block efficiency: generated tokens / target calls. Intervals: 95% percentile bootstrap over prompts of the "
        f"ratio of totals.{versus} Time per generated token in draft forwards and sampling, target forwards, "
        "verification (logits to probabilities, the accept rule, residuals) and the rest (bookkeeping, cache "
        "updates). Tokens per target pass: mean tokens the target processed per call in the decode rounds, i.e. "
        "the block (γ + 1) or the tree's nodes (multi-path), plus any uncached committed token.",
    ])


def _has_quality_or_cost(rows: Sequence[dict[str, Any]]) -> bool:
    keys = ("flops_per_token", "nll_per_token", "rouge_l_vs_ar", "rouge_l_vs_reference", "eta_fp", "eta_tp")
    return any(r.get(k) is not None for r in rows for k in keys)


def _llamacpp_line(results: dict[str, Any]) -> list[str]:
    """The llama.cpp build the llamacpp-* peers ran (none when they did not run)."""
    info = (results.get("versions") or {}).get("llama.cpp")
    if not info:
        return []
    return [f"llama.cpp peers: {info.get('package')} (source commit {info.get('sdist_commit') or 'unrecorded'}), "
            f"built with {' '.join(info.get('cmake_flags') or []) or 'unrecorded flags'}."]


def render_markdown(results: dict[str, Any], profile: Any = None, peer_profile: Any = None) -> str:
    """Return the markdown report: settings, machine, the full table and what the columns mean; with a
    `costmodel.HardwareProfile`, also a separate section of modelled (not measured) times (`render_modelled`)."""
    cfg, machine = results["config"], results["machine"]
    baseline = default_baseline(cfg["methods"], cfg.get("baseline"))
    n_prompts = len({r["prompt_index"] for r in results["records"]})
    category = f", categories {', '.join(cfg['category'])}" if cfg.get("category") else ""
    commit = (results.get("git_commit") or "unknown")[:12] + (" (dirty)" if results.get("git_dirty") else "")
    runs = results.get("runs", [])
    draft_dtype = f" (draft {cfg['draft_dtype']})" if cfg.get("draft_dtype") not in (None, cfg["dtype"]) else ""
    parts = [f"{run['started']}, {len(run['prompts'])} prompts, commit {(run.get('git_commit') or '?')[:12]}"
             for run in runs]
    resumed = (f" Measured in {len(runs)} resumed runs (each prompt's methods within one run): "
               + "; ".join(parts) + ".") if len(runs) > 1 else ""
    lines = [
        "# verispec benchmark",
        "",
        f"{n_prompts} prompts from `{cfg['prompts']}`{category}, up to {cfg['max_new_tokens']} new tokens, "
        f"γ = {cfg['gamma']}, temperature {cfg['temperature']}, top-k {cfg['top_k']}, top-p {cfg['top_p']}, "
        f"{cfg['dtype']}{draft_dtype} on {cfg.get('device', 'cpu')}; baseline `{baseline}`.",
        f"Machine: {machine['platform']}, {machine['processor']}, {machine['cpu_threads']} threads"
        f"{', ' + machine['gpu'] if machine.get('gpu') else ''}; torch {machine['torch']}, "
        f"transformers {machine['transformers']}; commit {commit}; started {results.get('started', '?')}.{resumed}",
        *_llamacpp_line(results),
        "",
        format_table(results["aggregate"], full_columns(cfg.get("compare_to"))),
        "",
        "Speedup: baseline seconds per token / method seconds per token, with a 95% percentile-bootstrap interval "
        "over prompts" + (f"; 'vs {cfg['compare_to']}' is the same against `{cfg['compare_to']}`, over the prompts "
                          "both decoded" if cfg.get("compare_to") else "")
        + ". α: per-position acceptance probability, accepted / (accepted + rejections). c: draft cost per "
        "drafted token and f: target cost of a γ+1-token block, both relative to a measured 1-token target forward; "
        "theoretical speedup (1 − α^{γ+1}) / ((1 − α)(γc + f)) (docs/algorithms.md §3.4).",
    ]
    if any(r["trace"]["rounds"] for r in results["records"]):
        if baseline in cfg["methods"]:
            lines += ["", render_decode_split(results, baseline)]
        lines += ["", render_efficiency(results)]
    if section := render_by_category(results):
        lines += ["", section]
    if _has_quality_or_cost(results["aggregate"]):
        lines += ["", "## Quality and cost", "", format_table(results["aggregate"], QUALITY_COLUMNS), "", QUALITY_NOTE]
    online = [(m, figures) for m in cfg["methods"]
              if (figures := sprinter_online([r for r in results["records"] if r["method"] == m]))]
    if online:
        lines += ["", render_sprinter_online(online)]
    if profile is not None:
        lines += ["", render_modelled(results, profile, baseline, peer_profile)]
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
    return save_figure(fig, path)


def write_report(
    results_path: str | Path, markdown_path: str | Path | None = None, plot_path: str | Path | None = None,
    profile_path: str | Path | None = None, peer_profile_path: str | Path | None = None,
) -> tuple[str, Path, Path]:
    """Render `results_path` (a results file or its archive); write the markdown (default: beside it, its name
    without .json[.gz] + .md) and the plot (default: that name + _speedup.png); with quality scores also
    that name + _pareto.png beside the plot: speedup against ROUGE-L vs ar at temperature 0, against the target's NLL
    per token otherwise (or when `ar` did not run).
    With `profile_path` (a `verispec profile` JSON) the markdown gets a section of modelled times; the peers are
    priced with `peer_profile_path` when given.

    Return (markdown text, markdown path, plot path).
    """
    results_path = Path(results_path)
    results = read_results(results_path, aggregate=True)
    return shape_errors_named(results_path, lambda: _write_report(results, results_path, markdown_path, plot_path,
                                                                  profile_path, peer_profile_path))


def _write_report(
    results: dict[str, Any], results_path: Path, markdown_path: str | Path | None, plot_path: str | Path | None,
    profile_path: str | Path | None, peer_profile_path: str | Path | None,
) -> tuple[str, Path, Path]:
    from verispec.costmodel import HardwareProfile

    if peer_profile_path is not None and profile_path is None:
        raise ConfigError("a peer profile prices the peers next to a main profile: pass --profile too")
    profile = HardwareProfile.load(profile_path) if profile_path is not None else None
    peer_profile = HardwareProfile.load(peer_profile_path) if peer_profile_path is not None else None
    markdown = render_markdown(results, profile, peer_profile)
    stem = results_stem(results_path)
    markdown_path = Path(markdown_path) if markdown_path else stem.with_name(stem.name + ".md")
    plot_path = Path(plot_path) if plot_path else stem.with_name(stem.name + "_speedup.png")
    plot_speedup(results, plot_path)
    link = f"\n![speedup]({plot_path.name})\n" if plot_path.parent.resolve() == markdown_path.parent.resolve() else ""
    rows = results["aggregate"]
    # At temperature > 0 two samples of the same law differ, so ROUGE-L vs one ar sample says little: plot NLL.
    order = ("rouge_l_vs_ar", "nll_per_token") if results["config"].get("temperature") == 0 else ("nll_per_token",)
    y = next((k for k in order if any(r.get(k) is not None and r.get("speedup") is not None for r in rows)), None)
    if y is not None:  # a quality run: the speed-quality plot too, beside the speedup plot
        from verispec.bench.pareto import plot_pareto

        pareto = plot_pareto(results, plot_path.with_name(stem.name + "_pareto.png"), y=y)
        if pareto.parent.resolve() == markdown_path.parent.resolve():
            link += f"\n![speed vs quality]({pareto.name})\n"
    markdown_path.parent.mkdir(parents=True, exist_ok=True)
    markdown_path.write_text(markdown + link)
    return markdown, markdown_path, plot_path


