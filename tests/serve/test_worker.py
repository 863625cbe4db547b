"""Scheduling: concurrent clients, a full queue, clients that leave, the time limit, and readiness."""

from __future__ import annotations

import http.client
import json
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest

from tests.serve.conftest import HeldDecoder, request, running_server
from verispec import Decoder
from verispec.engine import DecodeConfig
from verispec.serve import ServeConfig

CHAT = {"model": "verispec", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 6}


@pytest.fixture
def held(decoder):
    """The module's decoder, with its gates open and no delay again after each test."""
    decoder.decoding.clear()
    yield decoder
    decoder.decode_gate.set()
    decoder.round_delay = 0.0


def wait_for(condition, what, seconds=60.0):
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


def metric(url: str, name: str) -> float:
    from prometheus_client.parser import text_string_to_metric_families

    text = request(url, "GET", "/metrics")[2]
    return next(s.value for f in text_string_to_metric_families(text) for s in f.samples if s.name == name)


def statuses(url: str) -> dict[str, float]:
    from prometheus_client.parser import text_string_to_metric_families

    text = request(url, "GET", "/metrics")[2]
    return {s.labels["status"]: s.value for f in text_string_to_metric_families(text) for s in f.samples
            if s.name == "verispec_requests_total"}


def test_concurrent_clients_all_get_their_own_correct_output(held, one_thread):
    jobs = [(p, m) for p in ("hello there", "the quick brown fox", "once upon a time", "abc") for m in ("ar", "sd")]
    expected = {job: held.generate(job[0], method=job[1], gamma=3, max_new_tokens=15).text for job in jobs}
    assert len(set(expected.values())) == 4  # the prompts lead to different outputs: a mix-up would show

    with running_server(held, ServeConfig(max_queue=8)) as (url, _):
        def run(job):
            prompt, method = job
            client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
            chunks = client.chat.completions.create(
                model="verispec", messages=[{"role": "user", "content": prompt}], max_tokens=15, stream=True,
                extra_body={"verispec": {"method": method, "gamma": 3}})
            return "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)

        with ThreadPoolExecutor(4) as pool:
            got = dict(zip(jobs, pool.map(run, jobs), strict=True))
    assert got == expected


def test_a_full_queue_answers_429_with_retry_after(held, one_thread):
    with running_server(held, ServeConfig(max_queue=1, max_batch=1)) as (url, _):
        held.decode_gate.clear()  # the engine will hold the first request
        results: list[int] = []
        first = threading.Thread(target=lambda: results.append(request(url, "POST", "/v1/chat/completions", CHAT)[0]))
        first.start()
        wait_for(held.decoding.is_set, "the engine to take the first request")
        second = threading.Thread(target=lambda: results.append(request(url, "POST", "/v1/chat/completions", CHAT)[0]))
        second.start()
        wait_for(lambda: metric(url, "verispec_queue_length") == 1, "the second request to wait in the queue")
        status, headers, body = request(url, "POST", "/v1/chat/completions", CHAT)
        assert status == 429 and int(headers["retry-after"]) >= 1
        assert body["error"]["type"] == "rate_limit_error" and "busy" in body["error"]["message"]
        held.decode_gate.set()
        first.join(60)
        second.join(60)
        assert results == [200, 200]  # both queued requests were served, first come first served
        assert metric(url, "verispec_queue_length") == 0


def open_stream(url: str, max_tokens: int) -> http.client.HTTPConnection:
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    body = CHAT | {"max_tokens": max_tokens, "stream": True, "verispec": {"method": "ar"}}
    conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
    return conn


def test_a_client_dropping_mid_stream_frees_the_engine_at_a_round_boundary(held, one_thread):
    held.round_delay = 0.02  # 400 rounds would take 8 s
    with running_server(held) as (url, _):
        conn = open_stream(url, max_tokens=400)
        response = conn.getresponse()
        assert response.status == 200
        content = 0
        for line in response:
            if line.startswith(b"data: ") and json.loads(line[6:])["choices"][0]["delta"].get("content"):
                content += 1
                if content == 3:
                    break
        rounds_when_dropped = held.rounds[-1]
        conn.sock.close()  # the client goes away
        conn.close()
        status, _, body = request(url, "POST", "/v1/chat/completions", CHAT)
        assert status == 200 and body["usage"]["completion_tokens"] == 6
        dropped_rounds = held.rounds[-2]
        assert dropped_rounds < rounds_when_dropped + 10 < 400  # it stopped within a few rounds, not at 400


def test_a_client_leaving_a_non_streamed_request_frees_the_engine(held, one_thread):
    held.round_delay = 0.02
    with running_server(held) as (url, _):
        body = CHAT | {"max_tokens": 400, "verispec": {"method": "ar"}}
        host, port = url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        conn.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json"})
        wait_for(lambda: held.rounds and held.rounds[-1] >= 3, "a few rounds")
        rounds_when_dropped = held.rounds[-1]
        conn.sock.close()
        conn.close()
        wait_for(lambda: metric(url, "verispec_requests_running") == 0, "the engine to be free")
        assert held.rounds[-1] < rounds_when_dropped + 10  # polled every 0.1 s: about 5 rounds of 0.02 s
        assert request(url, "POST", "/v1/chat/completions", CHAT)[0] == 200


def test_a_request_whose_client_left_while_queued_is_never_decoded(held, one_thread):
    decodes = len(held.rounds)
    with running_server(held, ServeConfig(max_queue=2, max_batch=1)) as (url, app):
        held.decode_gate.clear()
        first = threading.Thread(target=lambda: request(url, "POST", "/v1/chat/completions", CHAT))
        first.start()
        wait_for(held.decoding.is_set, "the engine to take the first request")
        host, port = url.removeprefix("http://").split(":")
        conn = http.client.HTTPConnection(host, int(port), timeout=60)
        conn.request("POST", "/v1/chat/completions", json.dumps(CHAT), {"Content-Type": "application/json"})
        wait_for(lambda: metric(url, "verispec_queue_length") == 1, "the second request to wait in the queue")
        conn.sock.close()
        conn.close()
        waiting = app.state.backend._queue.queue[0]
        wait_for(waiting.cancelled.is_set, "the server to notice the client left")
        held.decode_gate.set()
        first.join(60)
        assert request(url, "POST", "/v1/chat/completions", CHAT)[0] == 200
        assert len(held.rounds) == decodes + 2  # the first and the last request; the departed one was skipped
        wait_for(lambda: statuses(url) == {"200": 2, "499": 1}, "the departed request to be counted as 499")


def test_the_time_limit_ends_a_generation_at_a_round_boundary(held, one_thread):
    held.round_delay = 0.02
    with running_server(held, ServeConfig(time_limit=0.2)) as (url, _):
        status, _, body = request(url, "POST", "/v1/chat/completions", CHAT | {"max_tokens": 400,
                                                                               "verispec": {"method": "ar"}})
    assert status == 200 and body["choices"][0]["finish_reason"] == "length"
    assert body["verispec"]["time_limit_reached"] and body["usage"]["completion_tokens"] < 400


def test_503_until_the_models_are_loaded(tiny_pair, one_thread):
    slow = HeldDecoder(tiny_pair["target"], tiny_pair["partial"])
    slow.load_gate.clear()
    with running_server(slow, wait_ready=False) as (url, _):
        status, _, body = request(url, "GET", "/health")
        assert status == 503 and body["status"] == "loading"
        status, headers, body = request(url, "POST", "/v1/chat/completions", CHAT)
        assert status == 503 and body["error"]["type"] == "service_unavailable" and "retry-after" in headers
        slow.load_gate.set()
        wait_for(lambda: request(url, "GET", "/health")[0] == 200, "the models to load")
        assert request(url, "POST", "/v1/chat/completions", CHAT)[0] == 200


def test_a_failed_load_is_reported_not_raised(tmp_path, one_thread):
    broken_folder = tmp_path / "broken-model"  # passes the checks made before loading; loading it fails
    broken_folder.mkdir()
    (broken_folder / "config.json").write_text("{}")
    broken = Decoder(str(broken_folder), str(broken_folder))
    with running_server(broken, ServeConfig(defaults=DecodeConfig()), wait_ready=False) as (url, _):
        wait_for(lambda: request(url, "GET", "/health")[2]["status"] == "failed", "the load to fail")
        status, _, body = request(url, "POST", "/v1/chat/completions", CHAT)
        assert status == 503 and "loading the models failed" in body["error"]["message"]
