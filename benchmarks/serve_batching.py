"""Continuous batching against one request at a time: the same prompts streamed by 1, 2, 4 and 8 concurrent
clients to two servers over one loaded pair, `--max-batch N` and `--max-batch 1`, run alternately per concurrency
level and method (the order flips from level to level), so both see the same machine state. Prints, per method and
level, aggregate tokens/s of each server and their ratio, p50/p95 time to first token and inter-token latency.
Each server runs in a process of its own (`verispec serve`), loading the default pair.

    PYTHONPATH=. .venv/bin/python benchmarks/serve_batching.py --source humaneval --prompts 16 --max-tokens 64 \
        --out benchmarks/results/serve-batching-humaneval-T0.json

The requests at each level: max(4, 2 x clients) prompts of `--source`, the same for both servers.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.serve_overhead import free_port, wait_ready
from verispec.bench.datasets import load_prompts
from verispec.bench.files import write_atomically
from verispec.provenance import provenance
from verispec.serve.bench import ServeBenchConfig, run_serve_bench


def start(max_batch: int, max_tokens: int, log: Path) -> tuple[subprocess.Popen, str]:
    """Start `verispec serve --max-batch N` on a free port in a process of its own (so that each server's OpenMP
    pool is alone in its process); return it and its URL once ready."""
    port = free_port()
    command = [sys.executable, "-m", "verispec", "serve", "--port", str(port), "--max-batch", str(max_batch),
               "--max-queue", "64", "--max-new-tokens", str(max_tokens), "--log-level", "warning"]
    server = subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT,
                              env=os.environ | {"HF_HUB_OFFLINE": "1"})
    wait_ready(port, lambda: server.poll() is None)  # (its log: `log`)
    return server, f"http://127.0.0.1:{port}"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default="humaneval", help="prompt source (verispec.bench.datasets)")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--methods", nargs="+", default=["ar", "sd"])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--max-batch", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--out", default="benchmarks/results/serve-batching.json")
    args = parser.parse_args()
    prompts = [p.text for p in load_prompts(args.source, limit=args.prompts)]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.gettempdir())  # the servers' own logs, not results
    servers = {name: start(batch, args.max_tokens, logs / f"{out.stem}.{name}.log")
               for name, batch in (("batched", args.max_batch), ("one-at-a-time", 1))}
    urls = {name: url for name, (_, url) in servers.items()}
    try:
        rows, records = measure(args, prompts, urls)
    finally:
        for server, _ in servers.values():
            server.terminate()
            server.wait(60)
    write_atomically(out, json.dumps({**provenance(), "args": vars(args), "rows": rows, "records": records},
                                     indent=1))
    print(f"results: {out}")


def measure(args: argparse.Namespace, prompts: list[str], urls: dict[str, str]) -> tuple[list, list]:
    """Run every level and method on both servers (alternating which goes first); return the rows and records."""
    rows, records = [], []
    for index, clients in enumerate(args.clients):
        requests = max(4, 2 * clients)
        for method in args.methods:
            order = list(urls) if index % 2 == 0 else list(urls)[::-1]
            row = {"clients": clients, "method": method, "requests": requests}
            for name in order:
                config = ServeBenchConfig(url=urls[name], methods=[method], clients=clients, requests=requests,
                                          max_tokens=args.max_tokens, temperature=args.temperature,
                                          prompts=prompts[:requests] if len(prompts) >= requests else prompts)
                result = run_serve_bench(config)
                row[name] = result["methods"][method]
                records += [dict(r, server=name, clients=clients) for r in result["records"]]
            row["batched_over_one_at_a_time"] = row["batched"]["tokens_per_s"] / row["one-at-a-time"]["tokens_per_s"]
            rows.append(row)
            b, s = row["batched"], row["one-at-a-time"]
            print(f"{clients} clients {method:>3}: batched {b['tokens_per_s']:6.1f} tok/s, one at a time "
                  f"{s['tokens_per_s']:6.1f} tok/s, ratio {row['batched_over_one_at_a_time']:.2f}x; TTFT p50 "
                  f"{1e3 * b['ttft_p50']:.0f} / {1e3 * s['ttft_p50']:.0f} ms; ITL p50 {1e3 * b['itl_p50']:.1f} / "
                  f"{1e3 * s['itl_p50']:.1f} ms", flush=True)
    return rows, records


if __name__ == "__main__":
    main()
