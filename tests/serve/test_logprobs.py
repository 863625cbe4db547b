"""Log-probabilities on both endpoints, streamed and not: the OpenAI shapes, the engine's values, speculative methods
equal to plain decoding at T = 0, chunks whose entries match their text; and the release of entries beside the
streamed text, token texts and bytes, and the −inf floor (no server)."""

from __future__ import annotations

import json
import math

import pytest

from tests.serve.conftest import PATHS, PROMPT, request
from verispec.logprobs import TokenLogprob
from verispec.serve.logprobs import Entry, LogprobStream, TokenText, token_text
from verispec.serve.responses import logprobs_body
from verispec.serve.streaming import TextStream

EOS_PROMPT = "def add(a, b):"  # the tiny target ends it with EOS after one character


@pytest.fixture(scope="module")
def server(tiny_server):
    return tiny_server


def body(kind: str, k: int | None, prompt: str = PROMPT, **fields) -> dict:
    """A request for `k` alternatives per token (None: no log-probabilities)."""
    if kind == "chat":
        asked = {} if k is None else {"logprobs": True, "top_logprobs": k}
        return {"model": "tiny", "messages": [{"role": "user", "content": prompt}]} | asked | fields
    return {"model": "tiny", "prompt": prompt} | ({} if k is None else {"logprobs": k}) | fields


def whole(url: str, kind: str, payload: dict) -> dict:
    status, _, answer = request(url, "POST", PATHS[kind], payload)
    assert status == 200, answer
    return answer


def chunks(url: str, kind: str, payload: dict) -> list[dict]:
    """Return the streamed chunks that carry a choice."""
    status, _, raw = request(url, "POST", PATHS[kind], payload | {"stream": True})
    assert status == 200, raw
    events = [line.removeprefix("data: ") for line in raw.split("\n\n") if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    return [event for event in map(json.loads, events[:-1]) if event["choices"]]


def entries(kind: str, logprobs: dict | None) -> list[tuple]:
    """Return (token, logprob, alternatives) per token of a `logprobs` object of either format."""
    if logprobs is None:
        return []
    if kind == "chat":
        return [(e["token"], e["logprob"], [(t["token"], t["logprob"]) for t in e["top_logprobs"]])
                for e in logprobs["content"]]
    return [(token, lp, list(top.items())) for token, lp, top in
            zip(logprobs["tokens"], logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True)]


def text_of(kind: str, choice: dict) -> str:
    return choice["message"]["content"] if kind == "chat" else choice["text"]


def test_chat_logprobs_have_openais_shape_and_the_engines_values(server, decoder):
    answer = whole(server, "chat", body("chat", 3, max_tokens=16, temperature=0))
    choice = answer["choices"][0]
    content = choice["logprobs"]["content"]
    assert len(content) == answer["usage"]["completion_tokens"] == 16
    assert "".join(e["token"] for e in content) == choice["message"]["content"]
    for entry in content:
        assert set(entry) == {"token", "logprob", "bytes", "top_logprobs"}
        assert entry["bytes"] == list(entry["token"].encode()) and entry["logprob"] <= 0
        top = entry["top_logprobs"]
        assert len(top) == 3 and [t["logprob"] for t in top] == sorted((t["logprob"] for t in top), reverse=True)
        assert top[0]["token"] == entry["token"] and top[0]["logprob"] == entry["logprob"]  # greedy: the likeliest
        assert all(t["bytes"] == list(t["token"].encode()) for t in top)
    offline = decoder.generate(PROMPT, max_new_tokens=16, logprobs=3)
    tokenizer = decoder.tokenizer
    assert [e["token"] for e in content] == [tokenizer.decode([t.token]) for t in offline.logprobs]
    assert [e["logprob"] for e in content] == pytest.approx([t.logprob for t in offline.logprobs], abs=1e-12)
    assert [[x["token"] for x in e["top_logprobs"]] for e in content] == [
        [tokenizer.decode([token]) for token, _ in t.top] for t in offline.logprobs]


def test_logprobs_are_null_unless_asked_and_true_alone_lists_no_alternatives(server):
    assert whole(server, "chat", body("chat", None, max_tokens=4))["choices"][0]["logprobs"] is None
    assert whole(server, "completion", body("completion", None, max_tokens=4))["choices"][0]["logprobs"] is None
    plain = whole(server, "chat", body("chat", None, max_tokens=4, logprobs=True))["choices"][0]["logprobs"]
    assert len(plain["content"]) == 4 and all(e["top_logprobs"] == [] for e in plain["content"])
    assert whole(server, "chat", body("chat", None, max_tokens=4, top_logprobs=0))["choices"][0]["logprobs"] is None
    legacy = whole(server, "completion", body("completion", 0, max_tokens=4))["choices"][0]["logprobs"]
    assert legacy["top_logprobs"] == [{}] * 4 and len(legacy["token_logprobs"]) == 4


def test_completion_logprobs_have_the_legacy_shape(server):
    choice = whole(server, "completion", body("completion", 2, max_tokens=12))["choices"][0]
    logprobs = choice["logprobs"]
    assert set(logprobs) == {"tokens", "token_logprobs", "top_logprobs", "text_offset"}
    tokens = logprobs["tokens"]
    assert len(tokens) == len(logprobs["token_logprobs"]) == len(logprobs["top_logprobs"]) == 12
    assert "".join(tokens) == choice["text"]
    # character offsets into the generated text: one character per token of the tiny tokenizer
    assert logprobs["text_offset"] == [len("".join(tokens[:i])) for i in range(12)]
    for token, logprob, top in zip(tokens, logprobs["token_logprobs"], logprobs["top_logprobs"], strict=True):
        assert len(top) == 2 and max(top.values()) == logprob and token in top


@pytest.mark.parametrize("kind", ["chat", "completion"])
@pytest.mark.parametrize("method, options", [("sd", {"gamma": 3}), ("bv", {"gamma": 5}),
                                             ("gbv", {"gamma": 3, "paths": 2})])
def test_speculative_logprobs_equal_plain_decodings_at_temperature_0(server, kind, method, options):
    # Each token is reported under the target's processed law at its own position, whichever round and method
    # committed it (a correction or bonus token included): at T = 0 the tokens and their laws are plain decoding's.
    fields = {"max_tokens": 16, "temperature": 0}
    plain = whole(server, kind, body(kind, 4, **fields, verispec={"method": "ar"}))["choices"][0]
    spec = whole(server, kind, body(kind, 4, **fields, verispec={"method": method} | options))["choices"][0]
    assert text_of(kind, spec) == text_of(kind, plain)
    got, want = entries(kind, spec["logprobs"]), entries(kind, plain["logprobs"])
    assert [(token, [t for t, _ in top]) for token, _, top in got] == [(token, [t for t, _ in top])
                                                                        for token, _, top in want]
    assert [lp for _, lp, _ in got] == pytest.approx([lp for _, lp, _ in want], abs=1e-9)
    assert [lp for *_, top in got for _, lp in top] == pytest.approx([lp for *_, top in want for _, lp in top],
                                                                      abs=1e-9)


@pytest.mark.parametrize("method", ["ar", "sd", "specinfer"])
def test_sampled_logprobs_equal_the_engines(server, decoder, method):
    answer = whole(server, "chat", body("chat", 2, max_tokens=12, temperature=1.0, seed=3, verispec={"method": method}))
    offline = decoder.generate(PROMPT, method=method, max_new_tokens=12, temperature=1.0, seed=3, logprobs=2)
    got = answer["choices"][0]["logprobs"]["content"]
    assert [e["logprob"] for e in got] == pytest.approx([t.logprob for t in offline.logprobs], abs=1e-12)


@pytest.mark.parametrize("kind", ["chat", "completion"])
@pytest.mark.parametrize("method", ["ar", "sd"])
@pytest.mark.parametrize("prompt, stop", [(PROMPT, None), (PROMPT, "stop"), (EOS_PROMPT, None)])
def test_streamed_logprobs_match_each_chunk_and_concatenate_to_the_whole(server, decoder, kind, method, prompt,
                                                                        stop):
    if stop == "stop":  # a stop string the greedy output holds, two characters from its fourth
        stop = decoder.generate(prompt, method=method, max_new_tokens=16).text[4:6]
    payload = body(kind, 2, prompt, max_tokens=16, temperature=0, stop=stop, verispec={"method": method})
    full = whole(server, kind, payload)
    streamed = chunks(server, kind, payload)
    text = "".join(c["choices"][0]["delta"].get("content") or "" if kind == "chat" else c["choices"][0]["text"]
                   for c in streamed)
    assert text == text_of(kind, full["choices"][0])
    listed = entries(kind, full["choices"][0]["logprobs"])
    assert len(listed) == full["usage"]["completion_tokens"]
    assert [e for c in streamed for e in entries(kind, c["choices"][0]["logprobs"])] == listed
    if kind == "completion":  # the offsets run on across chunks
        offsets = [o for c in streamed for o in (c["choices"][0]["logprobs"] or {}).get("text_offset", [])]
        assert offsets == full["choices"][0]["logprobs"]["text_offset"]
    eos = decoder.tokenizer.eos_token  # generated and reported, but no text of the output
    for c in streamed:  # one character per token: a chunk's tokens spell its text (the stop string's come after)
        choice = c["choices"][0]
        content = (choice["delta"].get("content") or "") if kind == "chat" else choice["text"]
        spelled = "".join(token for token, *_ in entries(kind, choice["logprobs"]) if token != eos)
        assert spelled.startswith(content) if stop else spelled == content
    if stop:
        assert full["choices"][0]["finish_reason"] == "stop"
        assert "".join(token for token, *_ in listed) == text_of(kind, full["choices"][0]) + stop
    if prompt == EOS_PROMPT:  # the end-of-sequence token is generated, counted and reported
        assert listed[-1][0] == decoder.tokenizer.eos_token


def test_logprobs_are_of_the_processed_law(server, decoder):
    z = decoder.tokenizer.convert_tokens_to_ids("z")
    content = whole(server, "chat", body("chat", 1, max_tokens=6, temperature=0, logit_bias={str(z): 100}))
    for entry in content["choices"][0]["logprobs"]["content"]:
        assert entry["token"] == "z" and entry["logprob"] == pytest.approx(0.0, abs=1e-6)


# -- without a server ------------------------------------------------------------------------------------------------


def byte_decode(ids: list[int]) -> str:
    return bytes(ids).decode("utf-8", errors="replace")


def describe(token: int) -> TokenText:
    return TokenText(byte_decode([token]), [token])


def test_entries_wait_for_the_character_their_bytes_complete():
    text = TextStream(byte_decode)
    stream = LogprobStream(text, describe)
    data = list("aé b".encode())  # a, 0xc3 0xa9, space, b
    released = []
    for round_tokens in (data[:2], data[2:4], data[4:]):
        stream.add([TokenLogprob(t, -0.5) for t in round_tokens])
        if text.push(round_tokens):
            released.append([(e.token.bytes[0], e.offset) for e in stream.release()])
    assert released == [[(97, 0)], [(0xC3, 1), (0xA9, 1), (32, 2)], [(98, 3)]]
    assert stream.rest() == []


def test_entries_past_a_stop_string_are_never_released_and_its_own_come_last():
    text = TextStream(lambda ids: "".join(map(chr, ids)), stop=["END"])
    stream = LogprobStream(text, lambda t: TokenText(chr(t), [t]))
    for part in ("abE", "NDxy"):
        ids = [ord(c) for c in part]
        stream.add([TokenLogprob(t, -1.0) for t in ids])
        if text.push(ids):
            assert [e.token.text for e in stream.release()] == ["a", "b"]
    text.finish()
    rest = stream.rest()
    assert [(e.token.text, e.offset) for e in rest] == [("E", 2), ("N", 2), ("D", 2)]  # where the output ends


class ByteLevelTokenizer:
    """A byte-level BPE vocabulary of three tokens: 'a', and the two bytes of 'é' (GPT-2's characters for them)."""

    pieces = {0: "a", 1: "Ã", 2: "©"}  # 0xC3 and 0xA9 under GPT-2's byte-to-character map

    def decode(self, ids: list[int]) -> str:
        return bytes(b for i in ids for b in {0: [97], 1: [0xC3], 2: [0xA9]}[i]).decode(errors="replace")

    def convert_ids_to_tokens(self, token: int) -> str:
        return self.pieces[token]


def test_a_partial_character_reports_its_own_bytes():
    tokenizer = ByteLevelTokenizer()
    assert token_text(tokenizer, 0) == TokenText("a", [97])
    assert token_text(tokenizer, 1) == TokenText("\ufffd", [0xC3])
    assert token_text(tokenizer, 2) == TokenText("\ufffd", [0xA9])


def test_a_token_of_probability_zero_is_written_as_minus_9999():
    name = TokenText("x", [120])
    entry = Entry(name, -math.inf, 0, [(name, -math.inf)])
    chat = logprobs_body("chat", [entry])
    assert chat["content"][0]["logprob"] == -9999.0 and chat["content"][0]["top_logprobs"][0]["logprob"] == -9999.0
    legacy = logprobs_body("completion", [entry])
    assert legacy["token_logprobs"] == [-9999.0] and legacy["top_logprobs"] == [{"x": -9999.0}]
    json.dumps(chat, allow_nan=False)
    assert logprobs_body("chat", None) is None
