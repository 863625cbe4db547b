"""The embedded default pair through the server and the `openai` client: one streamed chat completion equals
offline `generate`; concurrent requests in one batch each get their offline completion.

Slow (loads the real pair); `make test` and CI run it.
"""

from __future__ import annotations

import openai
import pytest

from tests.serve.conftest import running_server
from verispec import Decoder
from verispec.serve.streaming import REPLACEMENT

pytestmark = pytest.mark.slow

PROMPT = "Say hello in Japanese and in French, in one short line."


@pytest.fixture(scope="module")
def decoder() -> Decoder:
    return Decoder()


def test_streamed_chat_from_the_default_pair_equals_offline_generate(decoder):
    offline = decoder.generate(PROMPT, method="sd", gamma=4, max_new_tokens=24)
    with running_server(decoder) as (url, _):
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0)
        chunks = list(client.chat.completions.create(
            model="verispec", messages=[{"role": "user", "content": PROMPT}], max_tokens=24, stream=True,
            stream_options={"include_usage": True}, extra_body={"verispec": {"method": "sd", "gamma": 4}}))
    deltas = [c.choices[0].delta.content or "" for c in chunks if c.choices]
    assert "".join(deltas) == offline.text
    assert all(REPLACEMENT not in d for d in deltas)  # no multi-byte character split across chunks
    assert chunks[-1].usage.completion_tokens == len(offline.tokens)
    assert chunks[-1].usage.prompt_tokens == offline.prompt_tokens
    assert chunks[-1].verispec["acceptance_rate"] > 0.3


# Mixed methods, drafters and temperatures, and prompts of different lengths (one over the 64 tokens of decode passes)
JOBS = [
    ("Write a Python function that returns the square of a number.", {"method": "sd"}, 0.0, 1),
    ("Name three colours.", {"method": "ar"}, 1.0, 2),
    ("Explain, in detail, what a hash map is, how collisions are resolved, and when one would use a tree map "
     "instead; give a short example in Python with a dictionary, and mention the average cost of a lookup.",
     {"method": "sd", "drafter": "model"}, 1.0, 3),
    ("def fibonacci(n):", {"method": "bv", "drafter": "ngram"}, 0.0, 4),
]


def test_concurrent_requests_on_the_default_pair_each_get_their_offline_completion(decoder):
    from concurrent.futures import ThreadPoolExecutor

    from tests.serve.conftest import request
    from verispec.serve import ServeConfig

    expected = [decoder.generate(prompt, max_new_tokens=24, temperature=t, seed=seed, **options).text
                for prompt, options, t, seed in JOBS]
    with running_server(decoder, ServeConfig(max_batch=4)) as (url, app):
        def ask(job: tuple) -> str:
            prompt, options, temperature, seed = job
            status, _, body = request(url, "POST", "/v1/chat/completions", {
                "model": "verispec", "messages": [{"role": "user", "content": prompt}], "max_tokens": 24,
                "temperature": temperature, "seed": seed, "verispec": options})
            assert status == 200, body
            return body["choices"][0]["message"]["content"]

        with ThreadPoolExecutor(len(JOBS)) as pool:
            got = list(pool.map(ask, JOBS))
        assert app.state.backend.batcher.batched_rows > 0  # passes were shared
    assert got == expected
