"""A bounded, seeded fuzz of both generation endpoints: random values, huge ones included, for every request field.

Every answer must be a 200 or an error in the OpenAI format below 500, and the process's resident memory must stay
within `RSS_CEILING` of where it started: a request may be refused, never crash the server or make it swell. The
server is the real app over the tiny models, with a short time limit so the valid requests stay cheap.
"""

from __future__ import annotations

import json
import random
import threading
import time
from typing import Any

import pytest

from tests.serve.conftest import request, running_server
from verispec.engine import DecodeConfig
from verispec.methods import METHODS
from verispec.serve import ServeConfig
from verispec.serve.schemas import IGNORED, MESSAGE_UNSUPPORTED, UNSUPPORTED, VerispecOptions

CASES = 600
SECONDS = 50  # the whole fuzz, on a shared two-core machine; it takes well under half of it alone
# bytes above the resident memory at the start: the client's bodies (up to 4 MiB), their parsing and the largest
# decode the caps allow the tiny models take tens of MB; a request that escaped the bounds took gigabytes
RSS_CEILING = 256 << 20
CONFIG = ServeConfig(defaults=DecodeConfig(max_new_tokens=8), model_name="tiny", time_limit=0.2)
BIG = 1 << 22  # characters of the largest strings: bodies around the server's 4 MiB limit

SCALARS: list[Any] = [
    None, True, False, 0, 1, 2, 3, -1, 7, 2**31, 2**63, 2**64, 10**30, -(10**30), 0.0, -0.0, 0.5, 1.0, 1.5, 1e308,
    -1e308, 1e-320, float("nan"), float("inf"), "", "x", "sd", "auto", "none", "text", "\udcff", "é∂😀",
]
HUGE: list[Any] = [[0] * 200_000, ["a"] * 10_000, "b" * BIG, {"type": "text"}, [{"type": "text", "text": "hi"}]]
STRINGS: list[Any] = ["", " ", "hello there", "a" * 100_000, "\x00", "\udcff", "😀" * 1000, "\n\n", "<|im_end|>"]
SETTINGS: dict[str, list[Any]] = {  # plausible values of the `verispec` object's fields, beside the random ones
    "method": [*METHODS, "beam"], "drafter": ["model", "ngram", "hybrid", "x"], "gamma": [1, 2, 4, 32, 33],
    "paths": [1, 2, 3, 16, 17, 10**6], "ngram_min": [1, 2, 16, 17], "ngram_max": [1, 4, 16, 17],
    "ngram_gamma": [1, 8, 64, 65], "top_k": [0, 1, 5, 10**9], "tau": [0.0, 0.5, 1.0, 2.0],
    "hybrid_catchup": [0.0, 1.0, 1e300], "draft_confidence": [0.0, 0.1, 0.9, 1.0], "adaptive_gamma": [True, False],
}
TOP: dict[str, list[Any]] = {  # plausible values of the top-level fields
    "model": ["tiny", "gpt-4", ""], "max_tokens": [1, 4, 8, 512, 513], "max_completion_tokens": [1, 3, 600],
    "temperature": [0, 0.7, 1.0, 2.0, -1], "top_p": [0.1, 0.9, 1.0, 0], "seed": [0, 5, 2**64 - 1, 2**64, -1],
    "stop": ["e", ["a", "b"], ["x"] * 5, "z" * 513, [""]], "n": [1, 2, None], "stream": [True, False],
    "stream_options": [{"include_usage": True}, {"include_usage": False, "include_obfuscation": True}, {"x": 1}],
    "logprobs": [True, False, 0, 2, 20, 21], "top_logprobs": [0, 1, 20, 21],
    "logit_bias": [{}, {"5": 100}, {"5": -100, "6": 2.5}, {"43": 1, "44": 1}, {"5": 101}, {"x": 1}, {"9" * 5000: 1},
                   {str(i): -1 for i in range(301)}],
    "presence_penalty": [0, 0.5, -2, 2, 2.5], "frequency_penalty": [0, 1.5, -2, 2, -2.5],
}
UNKNOWN = ["foo", "Model", "verispec_x", "", "messages ", "prompt"]
# prompt texts: plain, empty, a lone surrogate, and past the 64 characters per token of the tiny models' context
PROMPTS = ["hello there", "hi", "", " ", "\udcff", "a\udcffb", "😀" * 100, "ab " * 170, "a" * 40_000]


def random_value(rng: random.Random, depth: int = 0) -> Any:
    """Return a random JSON value: a scalar, a huge string or list, or a nested object."""
    kind = rng.random()
    if kind < 0.55 or depth > 2:
        return rng.choice(SCALARS)
    if kind < 0.7:
        return rng.choice(STRINGS)
    if kind < 0.8:
        return [random_value(rng, depth + 1) for _ in range(rng.choice([0, 1, 3, 50]))]
    if kind < 0.9 or depth > 0:  # one huge value per field at most: the client builds the body in this process
        return {rng.choice(["type", "text", "role", "content", "x"]): random_value(rng, depth + 1)
                for _ in range(rng.randrange(0, 4))}
    return rng.choice(HUGE)


def random_message(rng: random.Random) -> dict[str, Any]:
    message: dict[str, Any] = {"role": rng.choice(["user", "system", "developer", "assistant", "tool", "robot"]),
                               "content": rng.choice(PROMPTS)}
    for _ in range(rng.choice([0, 0, 1, 2])):
        name = rng.choice(["role", "content", "name", *MESSAGE_UNSUPPORTED, "x"])
        message[name] = random_value(rng, depth=1)  # a message may come 600 times: no huge values
    if rng.random() < 0.1:
        message["content"] = [{"type": "text", "text": rng.choice(STRINGS)}, {"type": rng.choice(["text", "image"])}]
    return message


def random_body(rng: random.Random, kind: str) -> dict[str, Any]:
    """Return a valid request with one to four fields set to random (often invalid) values, or removed."""
    body: dict[str, Any] = {"model": "tiny", "max_tokens": 4}
    if kind == "chat":
        body["messages"] = [{"role": "user", "content": "hello there"}]
    else:
        body["prompt"] = "hello there"
    fields = [*TOP, *(f for f, r in UNSUPPORTED.items() if kind in r.endpoints),
              *(f for f, r in IGNORED.items() if kind in r[0]), "verispec", "messages", "prompt", *UNKNOWN]
    for _ in range(rng.randrange(1, 5)):
        field = rng.choice(fields)
        if field == "verispec":
            options = body.setdefault("verispec", {})
            if rng.random() < 0.5:  # a multi-path method, so that paths and gamma are sizes, not errors
                options["method"] = rng.choice([name for name, method in METHODS.items() if method.multipath])
            name = rng.choice([*VerispecOptions.model_fields, "colour"])
            options[name] = rng.choice(SETTINGS.get(name, [None])) if rng.random() < 0.6 else random_value(rng)
        elif field == "messages" and kind == "chat" and rng.random() < 0.8:
            body["messages"] = [random_message(rng) for _ in range(rng.choice([0, 1, 2, 3, 600]))]
        elif rng.random() < 0.1:
            body.pop(field, None)
        elif field in TOP and rng.random() < 0.6:
            body[field] = rng.choice(TOP[field])
        elif field == "prompt" and kind == "completion" and rng.random() < 0.6:
            body["prompt"] = rng.choice([*PROMPTS, [rng.choice(PROMPTS)]])
        else:
            body[field] = random_value(rng)
    return body


class PeakRSS:
    """The largest resident set size of this process while it is entered, sampled every few milliseconds."""

    def __init__(self) -> None:
        self.peak, self._done = 0, threading.Event()

    @staticmethod
    def now() -> int:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmRSS:"))

    def _sample(self) -> None:
        while not self._done.is_set():
            self.peak = max(self.peak, self.now())
            time.sleep(0.002)

    def __enter__(self) -> PeakRSS:
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        self._thread.join()


def test_random_requests_never_get_a_500_and_memory_stays_bounded(decoder, one_thread):
    rng = random.Random(0)
    seen: dict[int, int] = {}
    with running_server(decoder, CONFIG) as (url, _):
        request(url, "POST", "/v1/completions", {"model": "tiny", "prompt": "hello", "max_tokens": 2})  # warm up
        start, before = time.monotonic(), PeakRSS.now()
        with PeakRSS() as rss:
            for case in range(CASES):
                kind = rng.choice(["chat", "completion"])
                body = random_body(rng, kind)
                raw = json.dumps(body).encode()  # NaN and Infinity too, and lone surrogates as \\u escapes
                path = "/v1/chat/completions" if kind == "chat" else "/v1/completions"
                status, _, answer = request(url, "POST", path, raw)
                seen[status] = seen.get(status, 0) + 1
                assert status < 500, (case, str(body)[:500], answer)
                if status != 200:
                    error = answer["error"]
                    assert set(error) == {"message", "type", "param", "code"} and error["code"] == status, answer
        elapsed = time.monotonic() - start
    assert elapsed < SECONDS, f"{CASES} cases took {elapsed:.1f} s"
    assert rss.peak - before < RSS_CEILING, f"resident memory grew by {(rss.peak - before) >> 20} MiB"
    assert seen.get(200, 0) >= CASES // 20 and seen.get(400, 0) >= CASES // 3, seen  # both kinds of outcome


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_every_field_reaches_the_fuzz(kind):
    # a field the fuzz never sends is a field it never checks
    rng = random.Random(1)
    sent: set[str] = set()
    for _ in range(2000):
        body = random_body(rng, kind)
        sent |= set(body) | {f"verispec.{name}" for name in body.get("verispec", {})}
    wanted = {*TOP, *(f for f, r in UNSUPPORTED.items() if kind in r.endpoints),
              *(f for f, r in IGNORED.items() if kind in r[0]),
              *(f"verispec.{name}" for name in VerispecOptions.model_fields)}
    assert wanted <= sent, wanted - sent
