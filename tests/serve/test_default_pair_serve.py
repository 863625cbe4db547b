"""One streamed chat completion from the embedded default pair, through the server and the `openai` client.

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


def test_streamed_chat_from_the_default_pair_equals_offline_generate():
    decoder = Decoder()
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
