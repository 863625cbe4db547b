"""Subcommands of the benchmark harness, registered into the `verispec` parser: `bench`, `report`, `pareto`,
`archive` and `fixed-blocks`.

They parse into `BenchConfig` (whose defaults they read, never restate) and call one library function each.
"""

from __future__ import annotations

import argparse
from typing import Any

from verispec.models.fastpath import LINEAR_BACKENDS
from verispec.options import add_model_options, config_from_args


def optional_int(text: str) -> int | None:
    """Parse an int option that also takes "none"."""
    return None if text.lower() == "none" else int(text)


def cmd_bench(args: argparse.Namespace) -> int:
    """Run the benchmark; print the table and write the results JSON (and the report with --report)."""
    from verispec.bench.files import check_new_output
    from verispec.bench.report import FULL_COLUMNS
    from verispec.bench.runner import BenchConfig, run_bench
    from verispec.bench.tables import format_table

    if getattr(args, "sweep", None):  # the lossy rules over their knobs, with the lossless references (bench/pareto.py)
        from verispec.bench.pareto import sweep_methods

        args.methods = sweep_methods(args.sweep)
    config = config_from_args(BenchConfig, args)
    # Measured results are hours of work: replacing them must be asked for.
    check_new_output(args.out, "the results file", args.resume or args.force)
    if args.archive is not None:
        check_new_output(args.archive, "the archive", args.resume or args.force)
    try:
        result = run_bench(config, args.out, progress=not args.no_progress, resume=args.resume,
                           archive_path=args.archive)
    except KeyboardInterrupt:
        raise KeyboardInterrupt(_interrupted_message(args.out)) from None
    n = len({r["prompt_index"] for r in result["records"]})
    print(f"\n{n} prompts from {config.prompts}, up to {config.max_new_tokens} new tokens, gamma={config.gamma}, "
          f"temperature={config.temperature}, {config.models.dtype} on {config.models.device}; "
          f"baseline {config.baseline_method}")
    print(format_table(result["aggregate"], FULL_COLUMNS))
    if config.quality:
        from verispec.bench.report import QUALITY_COLUMNS

        print("\n" + format_table(result["aggregate"], QUALITY_COLUMNS))
    print(f"\nresults: {args.out}")
    if args.report:
        _, markdown_path, plot_path = _report_after_bench(args.out)
        print(f"report: {markdown_path}\nplot: {plot_path}")
    return 0


def _report_after_bench(out: str) -> tuple[str, Any, Any]:
    """`write_report(out)`; a failed write (a full disk...) is one line that says the results are saved and how to
    render the report later, not a traceback after hours of measuring."""
    from pathlib import Path

    from verispec.bench.files import write_failure
    from verispec.bench.report import write_report
    from verispec.errors import VerispecError

    try:
        return write_report(out)
    except VerispecError:
        raise
    except OSError as exc:
        failure = (write_failure(Path(exc.filename), exc, "the report") if exc.filename
                   else write_failure(Path(out), exc, "the report of"))
        raise type(failure)(f"{failure}; the results are saved in {out}: once there is room, render the report "
                            f"with `verispec report {out}`") from exc


def _interrupted_message(out: str) -> str:
    """Say what an interrupted bench kept: the results file is rewritten after every finished prompt."""
    import json
    from pathlib import Path

    try:
        done = len({r["prompt_index"] for r in json.loads(Path(out).read_text())["records"]})
    except (OSError, ValueError, KeyError, TypeError):
        return "interrupted before the first prompt finished; nothing was saved"
    return f"interrupted; {done} finished prompts are saved in {out} (run again with --resume to continue)"


def cmd_report(args: argparse.Namespace) -> int:
    """Render a results JSON as a markdown table (printed and written) and a speedup plot (PNG)."""
    from verispec.bench.report import write_report

    markdown, markdown_path, plot_path = write_report(args.results, args.markdown, args.plot, args.profile,
                                                      args.peer_profile)
    print(markdown)
    print(f"report: {markdown_path}\nplot: {plot_path}")
    return 0


def cmd_pareto(args: argparse.Namespace) -> int:
    """Plot speedup vs quality for one or more results files (one point per method and file) as a PNG."""
    from pathlib import Path

    from verispec.bench.files import read_results, results_stem
    from verispec.bench.pareto import plot_pareto

    runs = [(results_stem(name).name if len(args.results) > 1 else "", read_results(name)) for name in args.results]
    if args.fronts:
        from verispec.bench.pareto import write_fronts

        markdown, paths = write_fronts(runs, args.fronts, args.x)
        (Path(args.fronts) / "fronts.md").write_text(markdown)
        print(markdown)
        print("plots: " + ", ".join(str(p) for p in paths) + f"\ntables: {Path(args.fronts) / 'fronts.md'}")
        return 0
    print(f"plot: {plot_pareto(runs, args.out, y=args.y, x=args.x)}")
    return 0


def cmd_archive(args: argparse.Namespace) -> int:
    """Pack a results file into a prompt-free archive, or unpack an archive back into its results file."""
    from pathlib import Path

    from verispec.bench.archive import pack, unpack
    from verispec.errors import ConfigError

    source, destination = Path(args.source), Path(args.destination)
    if not source.is_file():
        raise ConfigError(f"cannot {args.action}: {source} does not exist")
    if args.action == "unpack" and destination.exists() and not args.force:
        raise ConfigError(f"{destination} exists; unpacking would replace it (pass --force to do so)")
    (pack if args.action == "pack" else unpack)(source, destination)
    print(f"{args.action}ed {source} -> {destination}")
    return 0


def add_prompt_options(g: argparse._ArgumentGroup, d: Any) -> None:
    """Add the prompt selection options, defaults read from the config `d` (BenchConfig, FixedBlocksConfig)."""
    g.add_argument("--prompts", default=d.prompts,
                   help="builtin | mt-bench | humaneval | spec-bench:PATH | a .jsonl (Spec-Bench or plain) or "
                        ".txt file (default: %(default)s)")
    g.add_argument("--category", nargs="+", default=d.category, help="keep only these categories (default: all)")
    g.add_argument("--limit", type=optional_int, default=d.limit,
                   help="number of prompts (default: %(default)s = all)")
    g.add_argument("--offset", type=int, default=d.offset, help="skip this many prompts first (default: %(default)s)")
    g.add_argument("--subset-seed", type=optional_int, default=d.subset_seed,
                   help="shuffle prompts with this seed before offset/limit (default: %(default)s = file order)")


def add_sampling_options(g: argparse._ArgumentGroup, d: Any) -> None:
    """Add the sampling options and --no-chat-template, defaults read from the config `d`."""
    g.add_argument("--temperature", type=float, default=d.temperature, help="0 = greedy (default: %(default)s)")
    g.add_argument("--top-k", type=int, default=d.top_k, help="0 = off (default: %(default)s)")
    g.add_argument("--top-p", type=float, default=d.top_p, help="1 = off (default: %(default)s)")
    g.add_argument("--no-chat-template", dest="chat_template", action="store_false", default=d.chat_template,
                   help="feed prompts as raw text")


def add_bootstrap_options(g: argparse._ArgumentGroup, d: Any) -> None:
    """Add the options of the 95% intervals' bootstrap (`verispec.stats`), defaults read from the config `d`."""
    g.add_argument("--bootstrap-resamples", type=int, default=d.bootstrap_resamples,
                   help="resamples of the prompts for the 95%% intervals (default: %(default)s)")
    g.add_argument("--bootstrap-seed", type=int, default=d.bootstrap_seed, help="(default: %(default)s)")


def cmd_fixed_blocks(args: argparse.Namespace) -> int:
    """Compare verifiers on the same drafted blocks; print the table, write the results JSON and its markdown."""
    from pathlib import Path

    from verispec.bench.fixed_blocks import FixedBlocksConfig, render_fixed_blocks, run_fixed_blocks

    config = config_from_args(FixedBlocksConfig, args)
    results = run_fixed_blocks(config, args.out, progress=not args.no_progress)
    markdown = render_fixed_blocks(results)
    markdown_path = Path(args.out).with_suffix(".md")
    markdown_path.write_text(markdown)
    print(markdown)
    print(f"results: {args.out}\nreport: {markdown_path}")
    return 0


def _register_fixed_blocks(sub: argparse._SubParsersAction) -> None:
    from verispec.bench.fixed_blocks import DEFAULT_OUT, FixedBlocksConfig

    d = FixedBlocksConfig()
    p = sub.add_parser("fixed-blocks", help="compare verifiers' exact expected accepted tokens on the same drafted "
                                            "blocks (paired, no decoding noise): results JSON and markdown table")
    add_prompt_options(p.add_argument_group("prompts"), d)
    g = p.add_argument_group("verifiers and blocks")
    g.add_argument("--methods", nargs="+", default=d.methods,
                   help="lossless speculative verifiers to compare (default: %(default)s)")
    g.add_argument("--gammas", nargs="+", type=int, default=d.gammas,
                   help="block lengths; each is a prefix of the longest drafted path (default: %(default)s)")
    g.add_argument("--paths", nargs="+", type=int, default=d.paths,
                   help="K for the multi-path methods (default: %(default)s)")
    g.add_argument("--draws", type=int, default=d.draws,
                   help="i.i.d. draft paths per context, a multiple of every K (default: %(default)s)")
    g.add_argument("--contexts", type=int, default=d.contexts, help="contexts per prompt (default: %(default)s)")
    g.add_argument("--stride", type=int, default=d.stride,
                   help="tokens between contexts along the target's continuation (default: %(default)s)")
    add_sampling_options(g, d)
    g.add_argument("--seed", type=int, default=d.seed, help="prompt i: trajectory seed + i (default: %(default)s)")
    add_model_options(p.add_argument_group("models"), verifier=False)
    g = p.add_argument_group("output")
    add_bootstrap_options(g, d)
    g.add_argument("--out", default=DEFAULT_OUT, help="results JSON; the table goes next to it as .md "
                                                      "(default: %(default)s)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_fixed_blocks)


def register(sub: argparse._SubParsersAction) -> None:
    """Add the benchmark subcommands to the `verispec` command's subparsers."""
    from verispec.bench.llamacpp import LLAMACPP_PEERS
    from verispec.bench.peers import PEERS
    from verispec.bench.runner import DEFAULT_OUT, BenchConfig
    from verispec.bench.vllm import VLLM_PEERS
    from verispec.methods import METHODS

    d = BenchConfig()  # the defaults, read once
    p = sub.add_parser("bench", help="benchmark methods and peers on a prompt set: results JSON, table, report")
    add_prompt_options(p.add_argument_group("prompts"), d)
    g = p.add_argument_group("methods")
    names = ", ".join([*METHODS, *PEERS, *LLAMACPP_PEERS, *VLLM_PEERS])
    g.add_argument("--methods", nargs="+", default=d.methods,
                   help=f"run in this order on each prompt; from {names} "
                        "(the llamacpp-* peers need `make peers`, the vllm-* ones `make vllm`), each optionally "
                        "with settings, e.g. sd:gamma=2 gbv:paths=3,gamma=8 sprinter:tau=0.3 (default: %(default)s)")
    g.add_argument("--baseline", default=d.baseline, help="speedups are against it (default: ar if run, else first)")
    g.add_argument("--compare-to", default=d.compare_to, help="also report speedups against this method (e.g. sd)")
    g.add_argument("--gamma", type=int, default=d.gamma, help="draft tokens per round (default: %(default)s)")
    add_sampling_options(g, d)
    g.add_argument("--max-new-tokens", type=int, default=d.max_new_tokens, help="(default: %(default)s)")
    g.add_argument("--seed", type=int, default=d.seed, help="prompt i is decoded with seed + i (default: %(default)s)")
    g = p.add_argument_group("models")
    add_model_options(g)
    g.add_argument("--peer-linear-backend", default=d.peer_linear_backend, choices=LINEAR_BACKENDS,
                   help="the transformers peers' linears (default: %(default)s: transformers as users run it)")
    g = p.add_argument_group("measurement and output")
    g.add_argument("--warmup-tokens", type=int, default=d.warmup_tokens,
                   help="tokens of the excluded warm-up decode per method (default: %(default)s)")
    add_bootstrap_options(g, d)
    g.add_argument("--out", default=DEFAULT_OUT, help="results JSON (default: %(default)s)")
    g.add_argument("--quality", action="store_true", default=d.quality,
                   help="after the timed runs, score every output: target NLL / perplexity, ROUGE-L vs the ar output "
                        "and vs reference answers (HumanEval, MT-Bench)")
    g.add_argument("--sweep", nargs="+", default=None, metavar="RULE",
                   help="run the lossy rules RULE... (typical margin fuzzy fly) over their knobs with ar, sd, bv and "
                        "draft as references, instead of --methods (bench/pareto.py SWEEPS)")
    g.add_argument("--stop-at-function-end", action="store_true", default=d.stop_at_function_end,
                   help="HumanEval prompts: end each decode once the function is complete (a closed code fence, or "
                        "a HumanEval stop sequence after it), where more text could not change its pass@1")
    g.add_argument("--resume", action="store_true",
                   help="keep the prompts already complete in --out (same settings; --limit may grow) and run the "
                        "rest; the file is written after every prompt, so a stopped run loses at most one prompt")
    g.add_argument("--force", action="store_true",
                   help="replace an existing --out (and --archive); without it (or --resume) bench refuses to")
    g.add_argument("--archive", default=None, metavar="PATH.json.gz",
                   help="also rewrite the compressed archive of --out (`verispec archive pack`: no prompt text, "
                        "meant to be committed) after every prompt, so a run cut off keeps what it measured")
    g.add_argument("--report", action="store_true", help="also write the markdown report and the speedup plot")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.set_defaults(func=cmd_bench)

    p = sub.add_parser("report", help="render a bench results JSON: markdown table and speedup plot (PNG)")
    p.add_argument("results", help="a results JSON written by `verispec bench` or `verispec compare`, or its archive "
                                   "(`verispec archive pack`)")
    p.add_argument("--markdown", default=None,
                   help="where to write the markdown (default: beside RESULTS, its name without .json[.gz] + .md)")
    p.add_argument("--plot", default=None,
                   help="where to write the plot (default: beside RESULTS, its name without .json[.gz] + _speedup.png)")
    p.add_argument("--profile", default=None,
                   help="a `verispec profile` JSON: add a section of modelled (not measured) times and speedups")
    p.add_argument("--peer-profile", default=None,
                   help="a `verispec profile` JSON of the peers' linear path (e.g. --linear-backend torch): the "
                        "transformers peers are priced with it in the modelled section")
    p.set_defaults(func=cmd_report)

    from verispec.bench.pareto import QUALITY_AXES, SPEED_AXES

    p = sub.add_parser("pareto", help="plot speedup vs quality (PNG) from results of `verispec bench --quality`")
    p.add_argument("results", nargs="+",
                   help="results JSON files or their archives (e.g. one per SPRINTER threshold); labelled by name")
    p.add_argument("--y", default="rouge_l_vs_ar", choices=list(QUALITY_AXES),
                   help="quality axis (default: %(default)s)")
    p.add_argument("--x", default="speedup", choices=list(SPEED_AXES),
                   help="speed axis: per generated token, or answer_speedup, the whole time on the same prompts "
                        "(a rule that writes longer answers pays for it) (default: %(default)s)")
    p.add_argument("--out", default="results/pareto.png", help="PNG path (default: %(default)s)")
    p.add_argument("--fronts", default=None, metavar="DIR",
                   help="instead, one front per quality axis the results hold: DIR/front_<axis>.png and the tables "
                        "in DIR/fronts.md")
    p.set_defaults(func=cmd_pareto)

    p = sub.add_parser("archive", help="pack a results JSON into a prompt-free .json.gz to commit, or unpack one")
    p.add_argument("action", choices=["pack", "unpack"],
                   help="pack: RESULTS -> ARCHIVE (prompt texts replaced by their SHA-256); unpack: ARCHIVE -> "
                        "RESULTS (texts read back from the prompt source and checked)")
    p.add_argument("source", help="pack: the results JSON; unpack: the .json.gz archive")
    p.add_argument("destination", help="pack: the .json.gz to write; unpack: the results JSON to write")
    p.add_argument("--force", action="store_true", help="unpack over an existing results file")
    p.set_defaults(func=cmd_archive)

    _register_fixed_blocks(sub)
