"""Load-test a running server: concurrent streaming clients, then requests/s, time to first token and
inter-token latency (p50/p95) per method. Standard library HTTP only, so the client adds nothing to measure.

Inter-token latency of one request = (time of its last text − time of its first text) / (completion tokens − 1):
the server sends a round's tokens together, so per-chunk gaps would mix rounds of different sizes.

Another OpenAI-compatible server (a peer, e.g. llama.cpp's `llama-server`) is measured the same way with
`verispec_options` off: its requests carry no `verispec` field, `method` only labels them, and `extra_body` holds
its own request fields. Completion tokens are counted from the `usage` of the stream's last chunk
(`stream_options.include_usage`), which llama-server sends too; its `timings` are kept in the records.
"""

from __future__ import annotations

import http.client
import json
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import numpy as np

from verispec.methods import METHODS
from verispec.prompt_sets import BUILTIN_PROMPTS
from verispec.provenance import provenance
from verispec.variants import parse_method


@dataclass
class ServeBenchConfig:
    """What the load test sends."""

    url: str = "http://127.0.0.1:8000"
    methods: list[str] = field(default_factory=lambda: ["ar", "sd"])
    clients: int = 4  # concurrent streaming clients
    requests: int = 16  # requests per method
    max_tokens: int = 64
    gamma: int | None = None  # None: the server's default
    temperature: float = 0.0
    model: str = "verispec"
    timeout: float = 600.0  # seconds per request
    prompts: list[str] = field(default_factory=lambda: list(BUILTIN_PROMPTS))
    verispec_options: bool = True  # send the `verispec` field (method, γ); off for a peer, which decodes its own way
    extra_body: dict[str, Any] = field(default_factory=dict)  # more fields in every request (a peer's sampler)


def chat_body(config: ServeBenchConfig, method: str, prompt: str) -> dict[str, Any]:
    """Return the streaming chat request for `prompt`: with `method` (and γ) in its `verispec` field unless
    `config.verispec_options` is off, then `config.extra_body`."""
    body = {"model": config.model, "messages": [{"role": "user", "content": prompt}], "stream": True,
            "stream_options": {"include_usage": True}, "max_tokens": config.max_tokens,
            "temperature": config.temperature}
    if config.verispec_options:  # a variant's settings (`sd:keyed_draws=true`) go in the `verispec` field too
        variant = parse_method(method, METHODS)
        body["verispec"] = {"method": variant.name, **variant.overrides} | ({"gamma": config.gamma} if config.gamma
                                                                            else {})
    return body | config.extra_body


def stream_chat(config: ServeBenchConfig, method: str, prompt: str) -> dict[str, Any]:
    """Send one streaming chat request; return its timings, token count and the server's statistics."""
    url = urlsplit(config.url)
    body = chat_body(config, method, prompt)
    conn = http.client.HTTPConnection(url.hostname, url.port or 80, timeout=config.timeout)
    start = time.perf_counter()
    record: dict[str, Any] = {"method": method, "status": None, "text_times": [], "usage": None, "verispec": None,
                              "timings": None}
    try:
        conn.request("POST", url.path.rstrip("/") + "/v1/chat/completions", json.dumps(body),
                     {"Content-Type": "application/json"})
        response = conn.getresponse()
        record["status"] = response.status
        if response.status != 200:
            record["error"] = response.read().decode(errors="replace")
            return record
        for line in response:
            line = line.strip()
            if not line.startswith(b"data: ") or line == b"data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if chunk.get("choices") and chunk["choices"][0].get("delta", {}).get("content"):
                record["text_times"].append(time.perf_counter() - start)
            record["usage"] = chunk.get("usage") or record["usage"]
            record["verispec"] = chunk.get("verispec") or record["verispec"]
            record["timings"] = chunk.get("timings") or record["timings"]  # llama-server's own counts and times
    finally:
        record["seconds"] = time.perf_counter() - start
        conn.close()
    return record


def summarize(records: list[dict[str, Any]], wall: float) -> dict[str, Any]:
    """Return throughput and latency percentiles of one method's requests."""
    ok = [r for r in records if r["status"] == 200 and r["usage"]]
    ttft = [r["text_times"][0] for r in ok if r["text_times"]]
    itl = [(r["text_times"][-1] - r["text_times"][0]) / (r["usage"]["completion_tokens"] - 1)
           for r in ok if len(r["text_times"]) > 1 and r["usage"]["completion_tokens"] > 1]
    tokens = sum(r["usage"]["completion_tokens"] for r in ok)
    per_call = [r["verispec"]["tokens_per_target_call"] for r in ok if r["verispec"]]
    per_call = [x for x in per_call if x is not None]

    def pct(values: list[float], q: float) -> float | None:
        return float(np.percentile(values, q)) if values else None

    return {
        "requests": len(records), "ok": len(ok), "wall_seconds": wall, "requests_per_s": len(ok) / wall,
        "tokens_per_s": tokens / wall, "ttft_p50": pct(ttft, 50), "ttft_p95": pct(ttft, 95),
        "itl_p50": pct(itl, 50), "itl_p95": pct(itl, 95),
        "tokens_per_target_call": float(np.mean(per_call)) if per_call else None,
    }


def run_serve_bench(config: ServeBenchConfig) -> dict[str, Any]:
    """Run `config.requests` requests per method from `config.clients` threads; return records and summaries, with
    the provenance of the client's machine (the server's too when `config.url` is local)."""
    result: dict[str, Any] = {"config": {k: v for k, v in vars(config).items() if k != "prompts"}, **provenance(),
                              "methods": {}, "records": []}
    for method in config.methods:
        prompts = [config.prompts[i % len(config.prompts)] for i in range(config.requests)]
        start = time.perf_counter()
        with ThreadPoolExecutor(config.clients) as pool:
            records = list(pool.map(lambda p, m=method: stream_chat(config, m, p), prompts))
        result["methods"][method] = summarize(records, time.perf_counter() - start)
        result["records"] += records
    return result


def format_table(methods: dict[str, dict[str, Any]]) -> str:
    """Return the per-method summary as a plain-text table (latencies in milliseconds)."""
    def ms(x: float | None) -> str:
        return "-" if x is None else f"{1000 * x:.1f}"

    lines = [f"{'method':<12}{'ok':>6}{'req/s':>8}{'tok/s':>8}{'TTFT p50':>10}{'TTFT p95':>10}{'ITL p50':>9}"
             f"{'ITL p95':>9}{'tok/call':>10}"]
    for name, s in methods.items():
        per_call = "-" if s["tokens_per_target_call"] is None else f"{s['tokens_per_target_call']:.2f}"
        lines.append(f"{name:<12}{s['ok']:>3}/{s['requests']:<2}{s['requests_per_s']:>8.2f}{s['tokens_per_s']:>8.1f}"
                     f"{ms(s['ttft_p50']):>10}{ms(s['ttft_p95']):>10}{ms(s['itl_p50']):>9}{ms(s['itl_p95']):>9}"
                     f"{per_call:>10}")
    return "\n".join(lines)
