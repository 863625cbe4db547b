"""What the server adds to a request: the same prompts decoded offline (`Decoder.generate`) and through
`verispec serve` (one streaming client), interleaved prompt by prompt on one loaded pair, so both see the same
machine state. Prints, per method, the paired ratio of seconds per generated token (server / offline) with a 95%
bootstrap interval over prompts, the server's time to first token and inter-token latency, and the sd / ar ratios.

    PYTHONPATH=. .venv/bin/python benchmarks/serve_overhead.py --prompts 3 --max-tokens 64 --out results/serve.json
"""

from __future__ import annotations

import argparse
import json
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

from verispec.api import Decoder
from verispec.bench.files import write_atomically
from verispec.engine import DecodeConfig
from verispec.prompt_sets import BUILTIN_PROMPTS
from verispec.provenance import provenance
from verispec.serve import create_app
from verispec.serve.bench import ServeBenchConfig, stream_chat
from verispec.serve.config import ServeConfig
from verispec.stats import bootstrap_ratio


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_server(decoder: Decoder, port: int) -> None:
    import uvicorn

    app = create_app(decoder, ServeConfig(defaults=DecodeConfig()))
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    threading.Thread(target=server.run, daemon=True).start()
    wait_ready(port)


def wait_ready(port: int, running: Callable[[], bool] = lambda: True, seconds: float = 600.0) -> None:
    """Wait until the server on `port` answers /health with 200 (the models load in the background); exit if
    `running()` turns false or after `seconds`."""
    import http.client

    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not running():
            raise SystemExit("the server stopped before it was ready")
        try:
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
            conn.request("GET", "/health")
            if conn.getresponse().status == 200:
                return
        except OSError:
            pass
        time.sleep(0.5)
    raise SystemExit(f"the server did not become ready in {seconds:.0f} s")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", type=int, default=6, help="built-in prompts to use (default: %(default)s)")
    parser.add_argument("--methods", nargs="+", default=["ar", "sd"])
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--out", default="results/serve_overhead.json")
    args = parser.parse_args()
    decoder = Decoder()
    port = free_port()
    start_server(decoder, port)
    client = ServeBenchConfig(url=f"http://127.0.0.1:{port}", max_tokens=args.max_tokens, model="verispec")
    records = []
    prompts = list(BUILTIN_PROMPTS)[: args.prompts]
    for i, prompt in enumerate(prompts):
        for method in args.methods:
            gen = decoder.generate(prompt, method=method, max_new_tokens=args.max_tokens)
            served = stream_chat(client, method, prompt)
            assert served["status"] == 200, served
            tokens, times = served["usage"]["completion_tokens"], served["text_times"]
            records.append({
                "prompt": i, "method": method, "offline_tokens": len(gen.tokens),
                "offline_s_per_token": gen.trace.time_total / len(gen.tokens),
                "server_tokens": tokens, "server_s_per_token": served["seconds"] / tokens,
                "ttft": times[0], "itl": (times[-1] - times[0]) / (tokens - 1) if tokens > 1 else None,
            })
            print(json.dumps(records[-1]))
    summary = {}
    for method in args.methods:
        rows = [r for r in records if r["method"] == method]
        pairs = [(r["server_s_per_token"], r["offline_s_per_token"]) for r in rows]
        summary[method] = {
            "server_over_offline": sum(a for a, _ in pairs) / sum(b for _, b in pairs),
            "ci95": bootstrap_ratio(pairs, 2000, 0),
            "offline_ms_per_token": 1e3 * float(np.mean([r["offline_s_per_token"] for r in rows])),
            "server_ms_per_token": 1e3 * float(np.mean([r["server_s_per_token"] for r in rows])),
            "ttft_ms_p50": 1e3 * float(np.median([r["ttft"] for r in rows])),
            "itl_ms_p50": 1e3 * float(np.median([r["itl"] for r in rows if r["itl"] is not None])),
            "same_tokens": sum(r["server_tokens"] == r["offline_tokens"] for r in rows), "prompts": len(rows),
        }
    if {"ar", "sd"} <= set(args.methods):
        pairs = [(a, s) for a in records if a["method"] == "ar" for s in records
                 if s["method"] == "sd" and s["prompt"] == a["prompt"]]
        summary["sd_vs_ar"] = {
            "offline": float(np.mean([a["offline_s_per_token"] / s["offline_s_per_token"] for a, s in pairs])),
            "server_itl": float(np.mean([a["itl"] / s["itl"] for a, s in pairs])),
        }
    print(json.dumps(summary, indent=2))
    Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    write_atomically(Path(args.out), json.dumps({**provenance(), "records": records, "summary": summary}, indent=2))


if __name__ == "__main__":
    main()
