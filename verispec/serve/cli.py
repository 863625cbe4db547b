"""Subcommands `verispec serve` (run the server) and `verispec bench-serve` (load-test a running one)."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from types import FrameType
from typing import TYPE_CHECKING

from verispec.serve.config import LOAD_GAMMA, ServeConfig

if TYPE_CHECKING:  # the web stack is imported on first use
    import uvicorn

    from verispec.serve.worker import Backend

# Once the engine is drained, shutting down only flushes the last chunks of the responses; a client that does not
# read them must not keep the process alive.
FLUSH_SECONDS = 5
STARTUP_FAILURE = 3  # uvicorn's exit status when the server could not start


def draining_server(config: uvicorn.Config, backend: Backend, grace: float) -> uvicorn.Server:
    """Return a `uvicorn.Server` for `config` that drains `backend` on SIGTERM or SIGINT.

    The first signal starts draining: new and waiting requests get 503, running generations may go on for `grace`
    seconds and then end at a round boundary; once none runs, uvicorn shuts down and `run()` returns. A second
    signal ends the grace at once; a third stops without waiting for responses to be flushed.
    """
    import uvicorn

    say = logging.getLogger("uvicorn.error")  # uvicorn's own log, where its "Shutting down" appears

    class DrainingServer(uvicorn.Server):
        def __init__(self) -> None:
            super().__init__(config)
            self.signals = 0  # SIGTERM/SIGINT received
            self.draining_for = 0  # the signal the current drain answers

        def handle_exit(self, sig: int, frame: FrameType | None) -> None:
            # Not uvicorn's: it stops at once, and after shutting down it raises the signal again, so the process
            # would die of it instead of exiting 0. Only counted here: the signal handler must do little.
            self.signals += 1
            if self.signals >= 3:
                self.should_exit = self.force_exit = True

        async def on_tick(self, counter: int) -> bool:
            if self.signals > self.draining_for:
                self.draining_for = self.signals
                seconds = grace if self.signals == 1 else 0.0
                say.info("Draining: no new requests; running generations end within %g s", seconds)
                backend.drain(seconds)
            if self.draining_for and backend.drained():
                self.should_exit = True
            return await super().on_tick(counter)

    return DrainingServer()


def serve_config(args: argparse.Namespace) -> ServeConfig:
    """Return the server settings `verispec serve`'s options describe. Prompts are read in one pass unless
    --prompt-chunk says otherwise: measured on dev prompts at 4 clients (BENCHMARKS.md §8), 64-token chunks beside
    the other requests' rounds gave 0.65x (`ar`) and 0.75x (`sd`) the tokens/s of prompts read whole, and a longer
    inter-token latency too: a chunk on the decode kernels costs every round of the batch far more than the prompt
    kernels' one pass."""
    from verispec.options import decode_config

    return ServeConfig(defaults=decode_config(args), model_name=args.model_name, max_queue=args.max_queue,
                       max_batch=args.max_batch, load_gamma=args.load_gamma, time_limit=args.time_limit,
                       shutdown_grace=args.shutdown_grace)


def cmd_serve(args: argparse.Namespace) -> int:
    """Load the pair once and serve the OpenAI API until SIGTERM or SIGINT, then drain and return 0."""
    import uvicorn

    from verispec.api import Decoder
    from verispec.options import model_spec
    from verispec.serve import create_app

    config = serve_config(args)
    decoder = Decoder(model_spec(args))
    app = create_app(decoder, config)
    server = draining_server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                            timeout_graceful_shutdown=FLUSH_SECONDS),
                             app.state.backend, config.shutdown_grace)
    server.run()
    return 0 if server.started else STARTUP_FAILURE


def cmd_bench_serve(args: argparse.Namespace) -> int:
    """Stream requests from concurrent clients to a running server; print throughput and latencies per method."""
    from verispec.serve.bench import ServeBenchConfig, format_table, run_serve_bench

    config = ServeBenchConfig(url=args.url, methods=args.methods, clients=args.clients, requests=args.requests,
                              max_tokens=args.max_tokens, gamma=args.gamma, temperature=args.temperature,
                              model=args.model, timeout=args.timeout, verispec_options=not args.other_server)
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
    p.add_argument("--max-batch", type=int, default=d.max_batch, metavar="N",
                   help="requests decoded at once, their model passes batched; each request's tokens are those it "
                        "gets alone (default: %(default)s; 1: one at a time)")
    p.add_argument("--load-gamma", default=d.load_gamma, choices=LOAD_GAMMA,
                   help="whether a batched request's adaptive draft length shortens as more requests share the "
                        "passes: invariant (where it cannot change the request's tokens: lossless methods at T = 0 or "
                        "with keyed draws), always (the same law, another sample at T > 0), off (default: "
                        "%(default)s)")
    p.add_argument("--time-limit", type=float, default=d.time_limit,
                   help="seconds one generation may run before it ends at a round boundary (default: %(default)s)")
    p.add_argument("--shutdown-grace", type=float, default=d.shutdown_grace, metavar="SECONDS",
                   help="on SIGTERM/SIGINT, seconds running generations may go on before they end at a round "
                        "boundary with finish_reason \"shutdown\" (default: %(default)s)")
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
    p.add_argument("--other-server", action="store_true",
                   help="the server is not verispec (vLLM's or llama.cpp's OpenAI server): send no `verispec` "
                        "field; --methods then only label the runs, and --model must be the id it serves")
    p.set_defaults(func=cmd_bench_serve)
