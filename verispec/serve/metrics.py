"""The server's Prometheus metrics, in a registry of its own (several apps can live in one process)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from verispec.trace import Trace

# Latency buckets from 1 ms to 5 min: tiny models answer in milliseconds, a CPU 1.5B target in tens of seconds.
_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0, 300.0)


class ServerMetrics:
    """Counters, gauges and histograms of one server."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.requests = Counter("verispec_requests", "HTTP requests to the generation endpoints, by final status",
                                ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("verispec_prompt_tokens", "prompt tokens of completed requests", registry=r)
        self.generated_tokens = Counter("verispec_generated_tokens", "completion tokens returned", registry=r)
        self.target_calls = Counter("verispec_target_forward_calls", "target model forward passes", ["method"],
                                    registry=r)
        self.draft_calls = Counter("verispec_draft_forward_calls", "draft model forward passes", ["method"],
                                   registry=r)
        self.drafted = Counter("verispec_drafted_tokens", "draft tokens proposed for verification", ["method"],
                               registry=r)
        self.accepted = Counter("verispec_accepted_tokens", "draft tokens accepted by the verifier", ["method"],
                                registry=r)
        self.rounds = Counter("verispec_rounds", "decode rounds, by method, the drafter that proposed the block "
                              "(none: a plain step) and the most tokens the round could draft", ["method", "drafter",
                                                                                                 "gamma"], registry=r)
        self.model_info = Gauge("verispec_model_info", "1 per loaded model: its role, linear backend and kernels",
                                ["role", "linear_backend", "kernel"], registry=r)
        # Each gauge under its verispec name and the name vLLM's dashboards read (verispec:num_requests_*).
        self.queue_length = Gauges(Gauge("verispec_queue_length", "requests waiting for the engine", registry=r),
                                   Gauge("verispec:num_requests_waiting", "requests waiting for the engine",
                                         registry=r))
        self.running = Gauges(Gauge("verispec_requests_running", "requests being generated", registry=r),
                              Gauge("verispec:num_requests_running", "requests being generated", registry=r))
        self.queue_time = Histogram("verispec:request_queue_time_seconds", "request arrival to the engine taking it",
                                    buckets=_BUCKETS, registry=r)
        # Speculative decoding's counters as vLLM names them (spec_decode_*), over every method that drafts.
        self.spec_drafts = Counter("verispec:spec_decode_num_drafts", "rounds that verified a drafted block",
                                   registry=r)
        self.spec_draft_tokens = Counter("verispec:spec_decode_num_draft_tokens", "draft tokens verified",
                                         registry=r)
        self.spec_accepted = Counter("verispec:spec_decode_num_accepted_tokens", "draft tokens accepted", registry=r)
        self.spec_accepted_per_pos = Counter("verispec:spec_decode_num_accepted_tokens_per_pos",
                                             "draft tokens accepted at each position of their block (0: the first)",
                                             ["position"], registry=r)
        self.ttft = Histogram("verispec_time_to_first_token_seconds", "request arrival to its first committed token",
                              ["method"], buckets=_BUCKETS, registry=r)
        self.itl = Histogram("verispec_inter_token_latency_seconds",
                             "time between committed tokens (a round's wait shared by the tokens it commits)",
                             ["method"], buckets=_BUCKETS, registry=r)
        self.latency = Histogram("verispec_request_latency_seconds", "request arrival to its last token",
                                 ["method"], buckets=_BUCKETS, registry=r)
        r.register(MemoryCollector())

    def observe_models(self, decoder: Any) -> None:
        """Record which models `decoder` (a `verispec.Decoder`) has loaded and the kernels they run."""
        kernels = decoder.linear_kernels()
        for role, model in decoder.loaded_models().items():
            self.model_info.labels(role, model.linear_backend, kernels[role]).set(1)

    def observe_decode(self, method: str, trace: Trace, prompt_tokens: int, completion_tokens: int,
                       gamma: int | None = None) -> None:
        """Count one finished generation: its tokens, the engine work it took and its rounds (by drafter and by the
        draft length each round could use: the adaptive rule's choice, else `gamma`)."""
        for round_ in trace.rounds:
            length = round_.model_gamma if round_.model_gamma is not None and round_.drafter != "ngram" else gamma
            self.rounds.labels(method, round_.drafter, "-" if length is None else str(length)).inc()
        self.prompt_tokens.inc(prompt_tokens)
        self.generated_tokens.inc(completion_tokens)
        self.target_calls.labels(method).inc(trace.target_calls)
        self.draft_calls.labels(method).inc(trace.draft_calls)
        self.drafted.labels(method).inc(sum(r.drafted for r in trace.rounds))
        self.accepted.labels(method).inc(sum(r.accepted for r in trace.rounds))
        drafted = [r for r in trace.rounds if r.drafted]
        self.spec_drafts.inc(len(drafted))
        self.spec_draft_tokens.inc(sum(r.drafted for r in drafted))
        self.spec_accepted.inc(sum(r.accepted for r in drafted))
        for position in range(max((r.accepted for r in drafted), default=0)):
            self.spec_accepted_per_pos.labels(str(position)).inc(sum(r.accepted > position for r in drafted))

    def render(self) -> bytes:
        """Return the metrics in the Prometheus text format."""
        return generate_latest(self.registry)


class Gauges:
    """One value shown under several gauge names."""

    def __init__(self, *gauges: Gauge) -> None:
        self.gauges = gauges

    def set(self, value: float) -> None:
        for gauge in self.gauges:
            gauge.set(value)

    def inc(self, amount: float = 1) -> None:
        for gauge in self.gauges:
            gauge.inc(amount)

    def dec(self, amount: float = 1) -> None:
        for gauge in self.gauges:
            gauge.dec(amount)


def resident_memory() -> tuple[int | None, int | None]:
    """Return the process's (current, peak) resident set size in bytes; None where the platform does not say.

    Linux: VmRSS and VmHWM of /proc/self/status. Elsewhere only the peak is known, from getrusage.
    """
    try:
        lines = Path("/proc/self/status").read_text().splitlines()
    except OSError:
        lines = []
    fields = dict(line.split(":", 1) for line in lines if ":" in line)

    def kib(name: str) -> int | None:  # "VmRSS:\t  123456 kB"
        value = fields.get(name, "").split()
        return int(value[0]) * 1024 if value else None

    current, peak = kib("VmRSS"), kib("VmHWM")
    if peak is None:
        try:
            import resource
        except ImportError:  # Windows
            return current, None
        maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        peak = maxrss if sys.platform == "darwin" else maxrss * 1024  # bytes on macOS, KiB on Linux and the BSDs
    return current, peak


class MemoryCollector(Collector):
    """The process's resident memory, read at each scrape (the models' weights dominate it)."""

    def collect(self) -> Iterator[GaugeMetricFamily]:
        current, peak = resident_memory()
        if current is not None:  # the name of prometheus_client's own process collector, which dashboards know
            yield GaugeMetricFamily("process_resident_memory_bytes", "resident memory size in bytes", value=current)
        if peak is not None:
            yield GaugeMetricFamily("verispec_peak_resident_memory_bytes",
                                    "the most resident memory the process has had, in bytes", value=peak)
