"""/metrics parses as Prometheus text, and its counters move by exactly what the requests did."""

from __future__ import annotations

import os
from collections import defaultdict

import openai
import pytest
from prometheus_client.parser import text_string_to_metric_families

from tests.serve.conftest import request, running_server

COUNTERS = ("verispec_prompt_tokens_total", "verispec_generated_tokens_total")
BY_METHOD = ("verispec_target_forward_calls_total", "verispec_draft_forward_calls_total",
             "verispec_drafted_tokens_total", "verispec_accepted_tokens_total")
HISTOGRAMS = ("verispec_time_to_first_token_seconds_count", "verispec_request_latency_seconds_count",
              "verispec_inter_token_latency_seconds_count")


def scrape(url: str) -> dict[tuple, float]:
    """Return every sample of /metrics keyed by (name, sorted labels)."""
    status, headers, text = request(url, "GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain")
    return {(s.name, tuple(sorted(s.labels.items()))): s.value
            for family in text_string_to_metric_families(text) for s in family.samples}


def moved(before: dict, after: dict) -> dict[tuple, float]:
    return {key: value - before.get(key, 0.0) for key, value in after.items() if value != before.get(key, 0.0)}


@pytest.fixture(scope="module")
def server(decoder, one_thread):
    with running_server(decoder) as (url, _):
        yield url


def test_counters_move_by_exactly_what_the_requests_did(server):
    client = openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)
    before = scrape(server)
    done = []
    for method, stream in (("sd", False), ("ar", True), ("bv", False)):
        kwargs = {"model": "verispec", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 9,
                  "extra_body": {"verispec": {"method": method, "gamma": 3}}}
        if stream:
            chunks = list(client.chat.completions.create(stream=True, stream_options={"include_usage": True},
                                                         **kwargs))
            done.append((method, chunks[-1].usage, chunks[-1].verispec))
        else:
            r = client.chat.completions.create(**kwargs)
            done.append((method, r.usage, r.verispec))
    r = client.completions.create(model="verispec", prompt="abc", max_tokens=5)
    done.append(("sd", r.usage, r.verispec))
    assert request(server, "POST", "/v1/chat/completions", {"messages": "x"})[0] == 400
    assert request(server, "POST", "/v1/completions", {"model": "other", "prompt": "x"})[0] == 404
    delta = moved(before, scrape(server))

    expected: dict[tuple, float] = defaultdict(float)
    chat, completions = "/v1/chat/completions", "/v1/completions"
    expected[("verispec_requests_total", (("endpoint", chat), ("status", "200")))] = 3
    expected[("verispec_requests_total", (("endpoint", completions), ("status", "200")))] = 1
    expected[("verispec_requests_total", (("endpoint", chat), ("status", "400")))] = 1
    expected[("verispec_requests_total", (("endpoint", completions), ("status", "404")))] = 1
    for method, usage, stats in done:
        expected[("verispec_prompt_tokens_total", ())] += usage.prompt_tokens
        expected[("verispec_generated_tokens_total", ())] += usage.completion_tokens
        labels = (("method", method),)
        expected[("verispec_target_forward_calls_total", labels)] += stats["target_calls"]
        expected[("verispec_draft_forward_calls_total", labels)] += stats["draft_calls"]
        expected[("verispec_drafted_tokens_total", labels)] += stats["drafted_tokens"]
        expected[("verispec_accepted_tokens_total", labels)] += stats["accepted_tokens"]
        for name in HISTOGRAMS[:2]:
            expected[(name, labels)] += 1
    counted = {key: value for key, value in delta.items()
               if key[0] in ("verispec_requests_total", *COUNTERS, *BY_METHOD, *HISTOGRAMS[:2])}
    assert counted == {key: value for key, value in expected.items() if value}
    # Inter-token latency: one observation per token after the first round, so fewer than the tokens generated.
    itl = sum(v for k, v in delta.items() if k[0] == HISTOGRAMS[2])
    assert 0 < itl < expected[("verispec_generated_tokens_total", ())]


def test_gauges_are_zero_when_idle(server):
    samples = scrape(server)
    assert samples[("verispec_queue_length", ())] == 0 and samples[("verispec_requests_running", ())] == 0


def test_the_models_kernels_and_rounds_are_labelled(server):
    client = openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)
    before = scrape(server)
    r = client.chat.completions.create(model="verispec", messages=[{"role": "user", "content": "hello there"}],
                                       max_tokens=9, extra_body={"verispec": {"method": "sd", "gamma": 3,
                                                                               "adaptive_gamma": False}})
    delta = moved(before, scrape(server))
    rounds = {dict(labels)["drafter"]: value for (name, labels), value in delta.items()
              if name == "verispec_rounds_total"}
    assert sum(rounds.values()) == r.verispec["target_calls"]  # one target pass per round
    assert all(dict(labels)["gamma"] == "3" for (name, labels) in delta if name == "verispec_rounds_total")
    info = {dict(labels)["role"]: dict(labels) for (name, labels), value in scrape(server).items()
            if name == "verispec_model_info" and value == 1}
    assert set(info) == {"target", "draft"} and all(labels["kernel"] for labels in info.values())


def test_the_process_resident_memory_is_reported(server):
    samples = scrape(server)
    current, peak = samples[("process_resident_memory_bytes", ())], samples[("verispec_peak_resident_memory_bytes", ())]
    physical = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    assert 50e6 < current <= peak < physical  # torch alone takes more than 50 MB
