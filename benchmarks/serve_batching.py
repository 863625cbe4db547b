"""Continuous batching against one request at a time, and against llama.cpp's server: the same prompts streamed by
1, 2, 4 and 8 concurrent clients to two verispec servers over one loaded pair, `--max-batch N` and `--max-batch 1`
(`--against whole-prompts`: `--max-batch N` reading prompts in one pass instead of in 64-token chunks), and to
llama.cpp's `llama-server` peers over the same GGUF pair. Prints, per method and level, aggregate tokens/s
of each server and their ratios, p50/p95 time to first token and inter-token latency. Each server runs in a process
of its own (`verispec serve` loading the default pair; `llama-server` its GGUF files).

    PYTHONPATH=. .venv/bin/python benchmarks/serve_batching.py --source humaneval --prompts 16 --max-tokens 128 \
        --out benchmarks/results/serve-batching-humaneval-T0-128.json

The requests at each level: max(4, 2 x clients) prompts of `--source`, the same for every server. At each level
the servers run one after another (verispec's per method, each peer once: its method is its own), in an order
that flips from level to level, so all see the same machine state.

Peers (`--peers`, named as in `verispec bench`; `--peers` with no name runs none), each one `llama-server`
started once, with as many parallel slots (`-np`) as the largest level has clients, so that no client ever waits
for a slot, continuous batching, the threads verispec's servers use, no prompt cache, no web UI
(`verispec.bench.llamacpp.server_command`, the command lines are in the results):
* `llamacpp-generate`: the target GGUF only;
* `llamacpp-speculative`: with the draft GGUF, drafting γ tokens per round (verispec's default γ; llama.cpp's
  sample-and-match at T > 0, see verispec.bench.llamacpp).
Their requests carry llama.cpp's sampler settings for verispec's (temperature, top-k, top-p, nothing else). Both
sides render the same Qwen chat template (llama-server the GGUF's, verispec the tokenizer's): the records'
`usage.prompt_tokens` agree. Each row adds the better peer's tokens/s and `batched_over_best_llamacpp`.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.serve_overhead import free_port, wait_ready
from verispec.bench.files import write_atomically
from verispec.bench.llamacpp import LLAMACPP_PEERS, LlamaCppError, LlamaCppPeers, sampler_fields
from verispec.config import DecodeConfig
from verispec.prompt_sets import load_prompts
from verispec.provenance import provenance
from verispec.sampling import SamplingConfig
from verispec.serve.bench import ServeBenchConfig, run_serve_bench

# The second verispec server each batched one is compared with (`--against`): one request at a time, or batched
# with every prompt read in one pass (`--prompt-chunk 0`) instead of the batched server's 64-token chunks.
AGAINST = {"one-at-a-time": ["--max-batch", "1"], "whole-prompts": ["--prompt-chunk", "0"]}


@contextlib.contextmanager
def verispec_servers(max_batch: int, max_tokens: int, logs: Path, against: str) -> Iterator[dict[str, str]]:
    """Start `verispec serve --max-batch N` and the server it is compared with (`AGAINST`) on free ports, each in a
    process of its own (so that each server's OpenMP pool is alone in its process); yield their URLs once ready,
    stop them on exit."""
    processes: list[subprocess.Popen] = []
    urls = {}
    try:
        for name, extra in (("batched", []), (against, AGAINST[against])):
            port = free_port()
            command = [sys.executable, "-m", "verispec", "serve", "--port", str(port), "--max-batch", str(max_batch),
                       "--max-queue", "64", "--max-new-tokens", str(max_tokens), "--log-level", "warning", *extra]
            log = Path(f"{logs}.{name}.log")
            processes.append(subprocess.Popen(command, stdout=log.open("w"), stderr=subprocess.STDOUT,
                                              env=os.environ | {"HF_HUB_OFFLINE": "1"}))
            wait_ready(port, lambda p=processes[-1]: p.poll() is None)  # (its log: `log`)
            urls[name] = f"http://127.0.0.1:{port}"
        yield urls
    finally:
        for process in processes:
            process.terminate()
            process.wait(60)


def start_peers(llamacpp: LlamaCppPeers, peers: list[str], gamma: int) -> dict[str, dict[str, Any]]:
    """Start every peer's `llama-server`; return each one's URL and command line. A server that does not start is
    a SystemExit naming its log."""
    started = {}
    for name in peers:
        try:
            server = llamacpp.server(name, gamma)
        except LlamaCppError as error:
            raise SystemExit(f"the llama.cpp peer {name} did not start: {error}") from None
        started[name] = {"url": f"http://127.0.0.1:{server.port}", "command": server.command}
    return started


def verispec_threads() -> int:
    """Return the threads a fresh verispec process computes with: torch's default, in the same environment."""
    import torch

    return torch.get_num_threads()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default="humaneval", help="prompt source (verispec.prompt_sets)")
    parser.add_argument("--prompts", type=int, default=16)
    parser.add_argument("--subset-seed", type=int, default=None, help="shuffle the prompts with it (default: in order)")
    parser.add_argument("--methods", nargs="+", default=["ar", "sd"])
    parser.add_argument("--clients", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--max-batch", type=int, default=4)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--peers", nargs="*", choices=list(LLAMACPP_PEERS), default=list(LLAMACPP_PEERS),
                        help="llama.cpp peers (default: all); none with an empty list")
    parser.add_argument("--against", choices=list(AGAINST), default="one-at-a-time",
                        help="the second verispec server: --max-batch 1, or batched with prompts read whole")
    parser.add_argument("--out", default="benchmarks/results/serve-batching.json")
    args = parser.parse_args()
    # SIGTERM (a `timeout`, a job's end) unwinds like Ctrl-C, so that the servers are stopped, not orphaned
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    prompts = [p.text for p in load_prompts(args.source, limit=args.prompts, seed=args.subset_seed)]
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    logs = Path(tempfile.gettempdir()) / out.stem  # the servers' own logs, not results
    gamma, threads = DecodeConfig().gamma, verispec_threads()
    with contextlib.ExitStack() as stack:
        peers: dict[str, dict[str, Any]] = {}
        version = None
        if args.peers:
            # -np: a slot per client of the largest level, so no client ever waits for a slot (an idle slot costs
            # only its KV memory, never compute); each slot has the one-slot peers' context (server_command)
            llamacpp = stack.enter_context(LlamaCppPeers(args.peers, None, None, threads, slots=max(args.clients)))
            peers = start_peers(llamacpp, args.peers, gamma)
            version = llamacpp.version()
        urls = stack.enter_context(verispec_servers(args.max_batch, args.max_tokens, logs, args.against))
        rows, levels, records = measure(args, prompts, urls, {name: p["url"] for name, p in peers.items()})
    setup = {"threads": threads, "gamma": gamma, "slots": max(args.clients),
             "commands": {name: p["command"] for name, p in peers.items()}, "version": version}
    write_atomically(out, json.dumps({**provenance(), "args": vars(args), "llamacpp": setup, "rows": rows,
                                      "levels": levels, "records": records}, indent=1))
    print(f"results: {out}")


def peer_config(temperature: float) -> dict[str, Any]:
    """Return the request fields that make a llama.cpp peer sample as verispec's servers do by default at
    `temperature`."""
    default = DecodeConfig().sampling
    return sampler_fields(SamplingConfig(temperature, default.top_k, default.top_p))


def measure(args: argparse.Namespace, prompts: list[str], urls: dict[str, str], peers: dict[str, str],
            ) -> tuple[list, list, list]:
    """Run every level: each method on both verispec servers and each peer once (the order of all flips from
    level to level); return the rows (per level and method), the levels (with the peers' summaries) and records."""
    rows, levels, records = [], [], []
    for index, clients in enumerate(args.clients):
        requests = max(4, 2 * clients)
        base = ServeBenchConfig(clients=clients, requests=requests, max_tokens=args.max_tokens,
                                temperature=args.temperature,
                                prompts=prompts[:requests] if len(prompts) >= requests else prompts)
        runs = [(name, urls[name], method) for method in args.methods for name in urls]
        runs += [(name, url, None) for name, url in peers.items()]
        summaries: dict[tuple[str, str | None], dict[str, Any]] = {}
        for name, url, method in runs if index % 2 == 0 else runs[::-1]:
            extra = {} if method else {"verispec_options": False, "extra_body": peer_config(args.temperature)}
            result = run_serve_bench(dataclasses.replace(base, url=url, methods=[method or name], **extra))
            summaries[name, method] = result["methods"][method or name]
            records += [dict(r, server=name, clients=clients) for r in result["records"]]
        level = level_summary(clients, requests, {name: summaries[name, None] for name in peers}, records)
        levels.append(level)
        for method in args.methods:
            rows.append(row(level, method, {name: summaries[name, method] for name in urls}, args.against))
    return rows, levels, records


def level_summary(clients: int, requests: int, peers: dict[str, dict[str, Any]],
                  records: list[dict[str, Any]]) -> dict[str, Any]:
    """Return one level's peers: their summaries, with llama.cpp's draft acceptance (its own counts) where it
    drafted; print them."""
    for name, summary in peers.items():
        timings = [r["timings"] for r in records if r["server"] == name and r["clients"] == clients and r["timings"]]
        drafted = sum(t.get("draft_n", 0) for t in timings)
        summary["draft_acceptance"] = sum(t.get("draft_n_accepted", 0) for t in timings) / drafted if drafted else None
        acceptance = "" if drafted == 0 else f", draft acceptance {summary['draft_acceptance']:.2f}"
        print(f"{clients} clients {name}: {summary['tokens_per_s']:6.1f} tok/s ({summary['ok']}/{requests} ok); "
              f"TTFT p50 {_ms(summary['ttft_p50'])} ms; ITL p50 {_ms(summary['itl_p50'])} ms{acceptance}", flush=True)
    best = max(peers, key=lambda name: peers[name]["tokens_per_s"], default=None)
    return {"clients": clients, "requests": requests, "peers": peers, "best_llamacpp": best}


def row(level: dict[str, Any], method: str, servers: dict[str, dict[str, Any]],
        against: str = "one-at-a-time") -> dict[str, Any]:
    """Return (and print) one level's row of `method`: both verispec servers, their ratio, and batched's ratio
    over the better llama.cpp peer of the level."""
    b, s = servers["batched"], servers[against]
    ratio = f"batched_over_{against.replace('-', '_')}"
    result = {"clients": level["clients"], "method": method, "requests": level["requests"], **servers,
              ratio: b["tokens_per_s"] / s["tokens_per_s"]}
    line = (f"{level['clients']} clients {method:>3}: batched {b['tokens_per_s']:6.1f} tok/s, {against} "
            f"{s['tokens_per_s']:6.1f} tok/s, ratio {result[ratio]:.2f}x; TTFT p50 "
            f"{_ms(b['ttft_p50'])} / {_ms(s['ttft_p50'])} ms; ITL p50 {_ms(b['itl_p50'])} / {_ms(s['itl_p50'])} ms")
    if level["best_llamacpp"]:
        best = level["peers"][level["best_llamacpp"]]["tokens_per_s"]
        result |= {"best_llamacpp": level["best_llamacpp"], "best_llamacpp_tokens_per_s": best,
                   "batched_over_best_llamacpp": b["tokens_per_s"] / best}
        line += f"; best llama.cpp ({level['best_llamacpp']}) {best:.1f} tok/s, batched over it " \
                f"{result['batched_over_best_llamacpp']:.2f}x"
    print(line, flush=True)
    return result


def _ms(seconds: float | None) -> str:
    return "-" if seconds is None else f"{1e3 * seconds:.1f}"


if __name__ == "__main__":
    main()
