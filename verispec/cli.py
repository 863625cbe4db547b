"""`verispec` command line: subcommands parse into the library's typed configs and call one library function."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from verispec.errors import VerispecError
from verispec.options import add_decode_options, add_model_options, add_processor_options, decode_config, model_spec


def cmd_generate(args: argparse.Namespace) -> int:
    """Generate from one prompt; print the text, or the whole result with --json."""
    from verispec.api import Decoder
    from verispec.inputs import check_prompt, decode_utf8

    if args.prompt == "-":
        prompt = decode_utf8(sys.stdin.buffer.read(), "standard input", args.replace_invalid_utf8)
    elif args.replace_invalid_utf8:  # undecodable argv bytes arrive as surrogates: back to bytes, then replaced
        prompt = decode_utf8(args.prompt.encode("utf-8", "surrogateescape"), "the prompt", replace=True)
    else:
        prompt = args.prompt
    check_prompt(prompt)  # before minutes of loading
    config = decode_config(args)
    decoder = Decoder(model_spec(args))
    gen = decoder.generate(prompt, config, chat_template=not args.no_chat_template)
    if args.json:
        print(json.dumps(gen.to_dict() | {"linear_kernels": decoder.linear_kernels()}, indent=2))
    else:
        print(gen.text)
        t = gen.trace
        stats = f"[{args.method}] {t.generated} tokens in {t.time_total:.2f} s ({t.generated / t.time_total:.2f} tok/s)"
        if t.acceptance_rate is not None:
            stats += f", acceptance {t.acceptance_rate:.3f}, {t.tokens_per_target_call:.2f} tokens/target call"
        if gen.verifier is not None:
            stats += f", verifier {gen.verifier['file']} at tau {gen.verifier['threshold']:.3f}"
        print(stats, file=sys.stderr)
        if gen.logprobs is not None:
            _print_logprobs(gen.logprobs, decoder.tokenizer)
    return 0


def _print_logprobs(logprobs: list, tokenizer) -> None:  # noqa: ANN001 (TokenLogprob entries; a tokenizer)
    """Print one line per generated token on standard error: its id, text and log-probability, then the likeliest
    tokens at its position."""
    def show(token: int, logprob: float) -> str:
        return f"{token} {tokenizer.decode([token])!r} {logprob:.4f}"

    for entry in logprobs:
        top = "; ".join(show(token, value) for token, value in entry.top)
        print(f"logprob {show(entry.token, entry.logprob)}" + (f"  | top: {top}" if top else ""), file=sys.stderr)


def cmd_models(args: argparse.Namespace) -> int:
    """Describe the embedded default pair: sources, cache paths, checksums. Return 1 when a cached file is damaged
    or (with --verify) missing, after one `verispec: error:` line per such file naming it and its repair, as a
    failed check does (`sha256sum --check`); 0 when every file checked matches."""
    from verispec.models.default_pair import DEFAULT_PAIR, cache_dir, describe

    infos = [describe(model, verify=args.verify) for model in DEFAULT_PAIR.values()]
    if args.json:
        print(json.dumps({"cache_dir": str(cache_dir()), "models": infos}, indent=2))
    else:
        _print_models(infos)
    problems = [problem for info in infos for problem in info["problems"]]
    for problem in problems:
        _say(f"error: {problem}")
    return 1 if problems else 0


def _print_models(infos: list[dict]) -> None:
    """Print `cmd_models`' table of the default pair's descriptions (`default_pair.describe`)."""
    from verispec.models.default_pair import cache_dir

    print(f"cache: {cache_dir()}  (set VERISPEC_CACHE to move it)")
    for info in infos:
        print(f"\n{info['role']}: {info['upstream']} (GGUF)")
        print(f"  packages:  {info['packages']}  installed: {info['parts_installed']}")
        print(f"  gguf:      {info['gguf']}  present: {info['gguf_present']}")
        print(f"  sha256:    {info['sha256_expected']}")
        if "sha256_ok" in info:
            print(f"  verified:  {'OK' if info['sha256_ok'] else 'MISMATCH ' + info['sha256_actual']}")
        print(f"  converted: {info['converted']}  present: {info['converted_present']}")
        if "converted_problem" in info:
            print(f"  files:     MISMATCH {info['converted_problem']}")
        elif info.get("converted_ok"):
            print("  files:     OK")
        elif "converted_ok" in info:  # no conversion is no damage: only the float paths need one
            print("  files:     none (`verispec setup --float` converts the pair)")


def cmd_setup(args: argparse.Namespace) -> int:
    """Assemble and verify the embedded default pair and cache its tokenizer and config (all the default path
    loads); with --float also convert it to float32 (what the float paths load); rebuild a damaged copy
    (idempotent)."""
    from verispec.models.default_pair import DEFAULT_PAIR, setup

    for model in DEFAULT_PAIR.values():
        print(f"{model.name}: {model.upstream} -> {setup(model, verify=args.verify, convert=args.float)}")
    return 0


def cmd_compare(args: argparse.Namespace) -> int:
    """Run methods side by side on the built-in prompts; print a table and write the results JSON."""
    from verispec.bench.compare import CompareConfig, bench_config, format_table, run_compare

    config = CompareConfig(
        methods=args.methods, gamma=args.gamma, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
        max_new_tokens=args.max_new_tokens, seed=args.seed, models=model_spec(args),
    )
    if args.prompts:
        from verispec.prompt_sets import read_source

        config.prompts = [prompt.text for prompt in read_source(args.prompts)]
    decoder, seconds = load_pair(args)
    print(f"loaded the target and the draft in {seconds:.1f} s (not timed below)", file=sys.stderr)
    result = run_compare(config, Path(args.out), decoder=decoder)
    machine = result["machine"]
    print(f"\n{len(config.prompts)} prompts x {config.max_new_tokens} new tokens, temperature={config.temperature}, "
          f"{machine['cpu_threads']} threads ({machine['platform']}); each method warmed up, then timed")
    for method in config.methods:
        print(f"  {method}: {describe_method(bench_config(config).decode_config(0, label=method))}")
    for role, kernel in decoder.linear_kernels().items():
        print(f"  {role}: {kernel}")
    print(format_table(result["aggregate"]))
    print(f"\nresults: {args.out}")
    return 0


def load_pair(args: argparse.Namespace):  # noqa: ANN201 (a Decoder: imported lazily)
    """Return the Decoder the model options of `args` (`add_model_options`) describe with both models loaded, and
    the seconds loading took (apart from any timed decode)."""
    import time

    from verispec.api import Decoder

    start = time.perf_counter()
    decoder = Decoder(model_spec(args))
    decoder.model("target")
    decoder.model("draft")
    decoder.build_prompt_copies()
    return decoder, time.perf_counter() - start


def describe_method(config) -> str:  # noqa: ANN001 (a DecodeConfig)
    """Return what a decode with `config` runs: its drafter and draft length (nothing for non-speculative methods)."""
    from verispec.drafters import lookup_length
    from verispec.methods import get_method

    if not get_method(config.method).speculative:
        return "no draft"
    length = f"gamma chosen per round up to {config.gamma}" if config.adaptive_gamma else f"gamma={config.gamma}"
    if config.drafter != "model" and lookup_length(config) != config.gamma:
        length += f", lookups up to {lookup_length(config)}"
    return f"drafter={config.drafter}, {length}"


class _Parser(argparse.ArgumentParser):
    """argparse with one-line errors (exit 2), like verispec's own; subcommand parsers inherit it."""

    def error(self, message: str):  # noqa: ANN201 (argparse's signature)
        _say(f"error: {self.prog}: {message} (see --help)")
        self.exit(2)


def _say(message: str) -> None:
    """Print one `verispec: ...` line on stderr; undecodable argv bytes (lone surrogates) are shown escaped."""
    print(f"verispec: {message}".encode("utf-8", "backslashreplace").decode("utf-8"), file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    """Return the argument parser of the `verispec` command."""
    parser = _Parser(prog="verispec", description="Speculative decoding, measured.")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("generate", help="generate text from one prompt")
    p.add_argument("prompt", help="the prompt text, or - to read it from standard input")
    add_model_options(p)
    add_decode_options(p)
    add_processor_options(p)
    p.add_argument("--no-chat-template", action="store_true", help="feed the prompt as raw text")
    p.add_argument("--replace-invalid-utf8", action="store_true",
                   help="decode invalid UTF-8 in the prompt as U+FFFD instead of refusing it")
    p.add_argument("--json", action="store_true", help="print the text, tokens, config and whole trace as JSON")
    p.set_defaults(func=cmd_generate)

    p = sub.add_parser("models", help="show the embedded default pair, where it is cached, and checksums")
    p.add_argument("--verify", action="store_true",
                   help="recompute the sha256 of every cached file; exit 1 when one is missing or differs")
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_models)

    p = sub.add_parser("setup", help="assemble and verify the embedded default pair (and convert it with --float)")
    p.add_argument("--verify", action="store_true",
                   help="check the sha256 of every cached file (not only its size) and rebuild what differs")
    p.add_argument("--float", action="store_true",
                   help="also convert the pair to float32 safetensors (about 9 GB), which the float paths "
                        "(--linear-backend onednn, int8, torch) load; the default path reads the GGUF itself")
    p.set_defaults(func=cmd_setup)

    p = sub.add_parser("compare", help="methods side by side on built-in prompts: table + results JSON")
    add_model_options(p)
    add_decode_options(p)
    from verispec.bench.compare import CompareConfig

    p.set_defaults(max_new_tokens=CompareConfig.max_new_tokens)
    p.add_argument("--methods", nargs="+", default=["ar", "sd"], help="methods; the first is the baseline")
    p.add_argument("--prompts", help="a text file with one prompt per line (default: built-in prompts)")
    p.add_argument("--out", default="results/compare.json", help="where to write the results JSON")
    p.set_defaults(func=cmd_compare)

    from verispec.bench.cli import register as register_bench
    from verispec.learned.cli import register as register_verifier
    from verispec.profile import register as register_profile
    from verispec.serve.cli import register as register_serve

    register_bench(sub)
    register_verifier(sub)
    register_profile(sub)
    register_serve(sub)
    return parser


def main(argv: list[str] | None = None) -> int:
    """Run the `verispec` command; return its exit status (2 on a user error, with a one-line message; 130 on
    Ctrl-C)."""
    try:
        args = build_parser().parse_args(argv)
        return args.func(args)
    except VerispecError as exc:
        _say(f"error: {exc}")
        return 2
    except KeyboardInterrupt as exc:  # Ctrl-C: one line and the shell's code for SIGINT, no traceback
        _say(str(exc) or "interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
