"""Shutting down: draining the engine, the grace period, SIGTERM/SIGINT, and a real server process exiting 0."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import uvicorn

from tests.serve.conftest import free_port, open_stream, request, running_server
from verispec.cli import build_parser
from verispec.errors import ConfigError
from verispec.serve import ServeConfig, create_app
from verispec.serve.cli import draining_server

CHAT = {"model": "verispec", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 6}
LONG = CHAT | {"max_tokens": 400, "verispec": {"method": "ar"}}  # one token a round: 400 rounds


@pytest.fixture
def held(decoder):
    """The module's decoder, slowed to 0.02 s a round (a 400-token generation lasts 8 s); reset afterwards."""
    decoder.round_delay = 0.02
    yield decoder
    decoder.decode_gate.set()
    decoder.round_delay = 0.0


def wait_for(condition, what: str, seconds: float = 60.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.005)


# One request at a time, so that a request sent while one runs waits in the queue (and is refused by draining).
ONE_AT_A_TIME = ServeConfig(max_batch=1)


def content(events: Iterator[dict | str], n: int) -> None:
    """Read events until `n` of them carried text."""
    seen = 0
    for event in events:
        seen += bool(event["choices"][0]["delta"].get("content"))
        if seen == n:
            return
    raise AssertionError("the stream ended early")


def assert_ended_by_shutdown(rest: list[dict | str]) -> None:
    """The stream's remaining events end with a final chunk saying "shutdown", then [DONE]."""
    assert rest[-1] == "[DONE]"
    final = rest[-2]
    assert final["choices"][0]["finish_reason"] == "shutdown"
    assert not final["verispec"]["time_limit_reached"]


def served(url: str, body: dict, into: list) -> threading.Thread:
    thread = threading.Thread(target=lambda: into.append(request(url, "POST", "/v1/chat/completions", body)))
    thread.start()
    return thread


def test_the_grace_is_a_number_of_seconds_at_least_zero():
    assert ServeConfig().shutdown_grace == 10.0 and ServeConfig(shutdown_grace=0).shutdown_grace == 0
    for bad in (-1.0, float("nan"), "10"):
        with pytest.raises(ConfigError, match="shutdown_grace"):
            ServeConfig(shutdown_grace=bad)
    assert build_parser().parse_args(["serve"]).shutdown_grace == ServeConfig().shutdown_grace
    assert build_parser().parse_args(["serve", "--shutdown-grace", "2.5"]).shutdown_grace == 2.5


def test_draining_lets_a_stream_run_for_the_grace_then_ends_it_and_refuses_the_rest(held, one_thread):
    with running_server(held, ONE_AT_A_TIME) as (url, app):
        backend = app.state.backend
        events = open_stream(url, LONG)
        content(events, 3)
        waiting: list = []
        queued = served(url, CHAT, waiting)
        wait_for(lambda: backend._queue.qsize() == 1, "the second request to wait in the queue")
        began = time.monotonic()
        backend.drain(0.5)
        status, _, body = request(url, "POST", "/v1/chat/completions", CHAT)
        assert status == 503 and body["error"]["type"] == "service_unavailable"
        assert "shutting down" in body["error"]["message"]
        status, _, body = request(url, "GET", "/health")
        assert status == 503 and body["status"] == "shutting down"  # a load balancer stops sending here
        queued.join(30)
        assert waiting[0][0] == 503  # it waited, never started: refused too
        rest = list(events)
        took = time.monotonic() - began
        assert_ended_by_shutdown(rest)
        assert any(e["choices"] and e["choices"][0]["delta"].get("content") for e in rest[:-2])  # it ran on
        assert 0.5 <= took < 4.0  # about the grace, far from the 8 s the whole generation takes
        wait_for(backend.drained, "the engine to be drained", 10)


def test_a_non_streamed_request_gets_its_partial_completion(held, one_thread):
    with running_server(held) as (url, app):
        decodes, result = len(held.rounds), []
        thread = served(url, LONG, result)
        wait_for(lambda: len(held.rounds) > decodes and held.rounds[-1] >= 3, "a few rounds")
        app.state.backend.drain(0.0)
        thread.join(30)
    status, _, body = result[0]
    assert status == 200 and body["choices"][0]["finish_reason"] == "shutdown"
    assert 0 < body["usage"]["completion_tokens"] < 400 and body["choices"][0]["message"]["content"]


def test_a_signal_drains_the_server_a_second_ends_the_grace_and_run_returns(held, one_thread):
    app = create_app(held, ONE_AT_A_TIME)
    port = free_port()
    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", timeout_graceful_shutdown=5)
    server = draining_server(config, app.state.backend, grace=60.0)
    thread = threading.Thread(target=server.run, daemon=True)  # signal handlers are the main thread's: called here
    thread.start()
    url = f"http://127.0.0.1:{port}"
    wait_for(lambda: server.started and request(url, "GET", "/health")[0] == 200, "the server to be ready")
    events = open_stream(url, LONG)
    content(events, 3)
    server.handle_exit(signal.SIGTERM, None)
    assert request(url, "POST", "/v1/chat/completions", CHAT)[0] == 503
    content(events, 3)  # within the 60 s grace the generation goes on
    server.handle_exit(signal.SIGINT, None)  # the second signal: no more grace
    assert_ended_by_shutdown(list(events))
    thread.join(30)
    assert not thread.is_alive() and held.rounds[-1] < 400


# A server whose rounds take 0.1 s more, so that a generation is still running when the signal comes.
SLOW_SERVER = """
import sys, time
from verispec.serve import streaming
push = streaming.TextStream.push
streaming.TextStream.push = lambda self, tokens: (time.sleep(0.1), push(self, tokens))[1]
from verispec.cli import main
sys.exit(main(sys.argv[1:]))
"""


def test_sigterm_drains_a_real_server_process_which_exits_0(tiny_pair_folders):
    port, grace = free_port(), 1.0
    command = [sys.executable, "-c", SLOW_SERVER, "serve", "--target", tiny_pair_folders["target"], "--draft",
               tiny_pair_folders["draft"], "--dtype", "float64", "--port", str(port), "--log-level", "warning",
               "--shutdown-grace", str(grace), "--max-batch", "1"]
    env = os.environ | {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    root = Path(__file__).parents[2]
    server = subprocess.Popen(command, env=env, cwd=root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    url = f"http://127.0.0.1:{port}"
    try:
        def ready() -> bool:
            assert server.poll() is None, server.stdout.read().decode()
            try:
                return request(url, "GET", "/health")[0] == 200
            except OSError:
                return False

        wait_for(ready, "the server to load the tiny pair", 180)
        # Greedy, this prompt runs for several seconds before EOS: the grace, not the end, must stop it.
        events = open_stream(url, CHAT | {"max_tokens": 300, "verispec": {"method": "ar"}})
        content(events, 3)
        sent = time.monotonic()
        server.send_signal(signal.SIGTERM)
        assert request(url, "POST", "/v1/chat/completions", CHAT)[0] == 503
        assert_ended_by_shutdown(list(events))
        assert grace - 0.5 < time.monotonic() - sent < grace + 5
        assert server.wait(timeout=30) == 0, server.stdout.read().decode()
    finally:
        if server.poll() is None:
            server.kill()
            server.wait()
