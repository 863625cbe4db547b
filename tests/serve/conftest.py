"""A real server on 127.0.0.1 (a free port) over the tiny models, and a Decoder whose engine a test can hold."""

from __future__ import annotations

import http.client
import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import uvicorn

from verispec import Decoder
from verispec.engine import DecodeConfig
from verispec.serve import ServeConfig, create_app


class HeldDecoder(Decoder):
    """A Decoder whose loading and decoding a test can pause, and whose rounds it can slow down.

    `load_gate`: model loading waits for it. `decode_gate`: each decode waits for it (after setting `decoding`).
    `round_delay`: seconds added after every round, so a generation lasts long enough to be interrupted.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.load_gate = threading.Event()
        self.load_gate.set()
        self.decode_gate = threading.Event()
        self.decode_gate.set()
        self.decoding = threading.Event()
        self.round_delay = 0.0
        self.rounds: list[int] = []  # rounds run by each decode so far

    def model(self, role: str) -> Any:
        self.load_gate.wait()
        return super().model(role)

    def engine(self, config: Any, views: Any = None, load: Any = None) -> Any:
        engine, held = super().engine(config, views, load), self

        class Held:
            def decode(self, prompt_ids: list[int], config: Any, on_commit: Any = None, on_logprobs: Any = None) -> Any:
                held.decoding.set()
                held.decode_gate.wait()
                held.rounds.append(0)

                def slowed(tokens: list[int]) -> bool | None:
                    held.rounds[-1] += 1
                    time.sleep(held.round_delay)
                    return on_commit(tokens) if on_commit is not None else None

                return engine.decode(prompt_ids, config, slowed, on_logprobs=on_logprobs)

        return Held()


def request(url: str, method: str, path: str, body: bytes | dict | None = None) -> tuple[int, dict, Any]:
    """Send one HTTP request with the standard library; return (status, headers, decoded JSON or text)."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=60)
    data = json.dumps(body).encode() if isinstance(body, dict) else body
    try:
        conn.request(method, path, data, {"Content-Type": "application/json"} if data is not None else {})
        response = conn.getresponse()
        raw = response.read().decode()
        headers = {k.lower(): v for k, v in response.getheaders()}
    finally:
        conn.close()
    try:
        return response.status, headers, json.loads(raw)
    except ValueError:
        return response.status, headers, raw


def open_stream(url: str, body: dict, timeout: float = 60.0) -> Iterator[dict | str]:
    """POST a streamed chat request; yield its events (JSON chunks, then "[DONE]"). Closing the generator closes
    the connection: a client that leaves."""
    host, port = url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=timeout)
    try:
        conn.request("POST", "/v1/chat/completions", json.dumps(body | {"stream": True}),
                     {"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200
        for line in response:
            if line.startswith(b"data: "):
                payload = line[6:].strip().decode()
                yield payload if payload == "[DONE]" else json.loads(payload)
    finally:
        conn.close()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def running_server(decoder: Decoder, config: ServeConfig | None = None, wait_ready: bool = True) -> Iterator[Any]:
    """Run the app on uvicorn in a thread; yield (base URL, app); stop it afterwards."""
    app = create_app(decoder, config)
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 60
    while not server.started:
        assert time.monotonic() < deadline, "the server did not start"
        time.sleep(0.01)
    while wait_ready and request(url, "GET", "/health")[0] != 200:
        assert time.monotonic() < deadline, "the server did not become ready"
        time.sleep(0.01)
    try:
        yield url, app
    finally:
        server.should_exit = True
        thread.join(30)


@pytest.fixture(scope="module")
def decoder(tiny_pair):
    return HeldDecoder(tiny_pair["target"], tiny_pair["partial"])


PATHS = {"chat": "/v1/chat/completions", "completion": "/v1/completions"}  # the two generating endpoints by kind
PROMPT = "hello there"  # the tiny target continues it past 40 tokens without EOS
TINY_CONFIG = ServeConfig(defaults=DecodeConfig(max_new_tokens=16), model_name="tiny")


@pytest.fixture(scope="module")
def tiny_server(decoder, one_thread):
    """A server of the tiny pair with 16-token answers, shared by a test module."""
    with running_server(decoder, TINY_CONFIG) as (url, _):
        yield url
