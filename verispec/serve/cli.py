"""Subcommands `verispec serve` (run the server) and `verispec bench-serve` (load-test a running one)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from verispec.serve.config import ServeConfig


def cmd_serve(args: argparse.Namespace) -> int:
    """Load the pair once and serve the OpenAI API until interrupted."""
    import uvicorn

    from verispec.api import Decoder
    from verispec.options import decode_config
    from verispec.serve import create_app

    config = ServeConfig(defaults=decode_config(args), model_name=args.model_name, max_queue=args.max_queue,
                         time_limit=args.time_limit)
    decoder = Decoder(args.target, args.draft, dtype=args.dtype, verifier=args.verifier,
                      linear_backend=args.linear_backend, draft_dtype=args.draft_dtype,
                      draft_linear_backend=args.draft_linear_backend)
    uvicorn.run(create_app(decoder, config), host=args.host, port=args.port, log_level=args.log_level)
    return 0


def cmd_bench_serve(args: argparse.Namespace) -> int:
    """Stream requests from concurrent clients to a running server; print throughput and latencies per method."""
    from verispec.serve.bench import ServeBenchConfig, format_table, run_serve_bench

    config = ServeBenchConfig(url=args.url, methods=args.methods, clients=args.clients, requests=args.requests,
                              max_tokens=args.max_tokens, gamma=args.gamma, temperature=args.temperature,
                              model=args.model, timeout=args.timeout)
    if args.prompts:
        config.prompts = [line for line in Path(args.prompts).read_text().splitlines() if line.strip()]
    result = run_serve_bench(config)
    print(format_table(result["methods"]))
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(json.dumps(result, indent=2))
        print(f"\nresults: {args.out}")
    return 0


def register(sub: argparse._SubParsersAction) -> None:
    """Add `verispec serve` and `verispec bench-serve` to the `verispec` command's subparsers."""
    from verispec.options import add_decode_options, add_model_options
    from verispec.serve.bench import ServeBenchConfig

    d = ServeConfig()  # the defaults, read once
    p = sub.add_parser("serve", help="serve the OpenAI API (chat/completions, streaming) with acceptance metrics")
    add_model_options(p)
    add_decode_options(p)  # server-side defaults; a request overrides them field by field
    p.add_argument("--host", default="127.0.0.1", help="(default: %(default)s)")
    p.add_argument("--port", type=int, default=8000, help="(default: %(default)s)")
    p.add_argument("--model-name", default=d.model_name, help="the model id clients send (default: %(default)s)")
    p.add_argument("--max-queue", type=int, default=d.max_queue,
                   help="requests that may wait for the engine; more get 429 (default: %(default)s)")
    p.add_argument("--time-limit", type=float, default=d.time_limit,
                   help="seconds one generation may run before it ends at a round boundary (default: %(default)s)")
    p.add_argument("--log-level", default="info", choices=["critical", "error", "warning", "info", "debug"])
    p.set_defaults(func=cmd_serve)

    b = ServeBenchConfig()
    p = sub.add_parser("bench-serve", help="load-test a running server: requests/s, TTFT, inter-token latency")
    p.add_argument("--url", default=b.url, help="the server's base URL (default: %(default)s)")
    p.add_argument("--methods", nargs="+", default=b.methods, help="methods, one after another (default: %(default)s)")
    p.add_argument("--clients", type=int, default=b.clients, help="concurrent streaming clients (default: %(default)s)")
    p.add_argument("--requests", type=int, default=b.requests, help="requests per method (default: %(default)s)")
    p.add_argument("--max-tokens", type=int, default=b.max_tokens, help="(default: %(default)s)")
    p.add_argument("--gamma", type=int, default=b.gamma, help="draft length; omit for the server's default")
    p.add_argument("--temperature", type=float, default=b.temperature, help="(default: %(default)s)")
    p.add_argument("--model", default=b.model, help="the served model id (default: %(default)s)")
    p.add_argument("--timeout", type=float, default=b.timeout, help="seconds per request (default: %(default)s)")
    p.add_argument("--prompts", help="a text file with one prompt per line (default: the built-in prompts)")
    p.add_argument("--out", help="write the per-request records and the summary as JSON here")
    p.set_defaults(func=cmd_bench_serve)
