"""logit_bias, presence_penalty and frequency_penalty on both endpoints, and the 400s of every new field, each
naming it (a real server over the tiny models)."""

from __future__ import annotations

import pytest

from tests.serve.conftest import PATHS, PROMPT, request
from verispec.engine import DecodeConfig
from verispec.serve import bounds
from verispec.serve.schemas import APIError, ChatRequest, parse, settings


@pytest.fixture(scope="module")
def server(tiny_server):
    return tiny_server


def body(kind: str, **fields) -> dict:
    prompt = {"messages": [{"role": "user", "content": PROMPT}]} if kind == "chat" else {"prompt": PROMPT}
    return {"model": "tiny", "max_tokens": 16} | prompt | fields


def post(url: str, kind: str, **fields) -> tuple[int, dict]:
    status, _, answer = request(url, "POST", PATHS[kind], body(kind, **fields))
    return status, answer


def text(url: str, kind: str, **fields) -> str:
    status, answer = post(url, kind, **fields)
    assert status == 200, answer
    choice = answer["choices"][0]
    return choice["message"]["content"] if kind == "chat" else choice["text"]


@pytest.mark.parametrize("kind", ["chat", "completion"])
@pytest.mark.parametrize("method", ["ar", "sd", "bv"])
def test_a_bias_of_minus_100_bans_a_token_and_plus_100_forces_one(server, decoder, kind, method):
    options = {"verispec": {"method": method}}
    plain = text(server, kind, **options)
    banned = plain[0]  # one character per token of the tiny tokenizer
    token = decoder.tokenizer.convert_tokens_to_ids(banned)
    without = text(server, kind, logit_bias={str(token): -100}, **options)
    assert banned not in without
    assert without == decoder.generate(PROMPT, method=method, max_new_tokens=16, logit_bias={token: -100}).text
    forced = decoder.tokenizer.convert_tokens_to_ids("z")
    assert text(server, kind, logit_bias={str(forced): 100}, **options) == "z" * 16
    assert text(server, kind, logit_bias={}, **options) == plain  # an empty bias asks for nothing


@pytest.mark.parametrize("kind", ["chat", "completion"])
@pytest.mark.parametrize("field", ["presence_penalty", "frequency_penalty"])
@pytest.mark.parametrize("method, temperature", [("ar", 0), ("sd", 0), ("sd", 1.0)])
def test_penalties_reach_the_engine(server, decoder, kind, field, method, temperature):
    fields = {"temperature": temperature, "seed": 5, "max_tokens": 24, "verispec": {"method": method}}
    plain = text(server, kind, **fields)
    penalised = text(server, kind, **{field: 2}, **fields)  # an integer is a number too
    offline = decoder.generate(PROMPT, method=method, temperature=temperature, seed=5, max_new_tokens=24,
                               **{field: 2.0})
    assert penalised == offline.text and penalised != plain
    assert text(server, kind, **{field: 0}, **fields) == plain


@pytest.mark.parametrize("kind", ["chat", "completion"])
@pytest.mark.parametrize("fields, param, words", [
    ({"logit_bias": {str(i): -1 for i in range(bounds.MAX_LOGIT_BIAS + 1)}}, "logit_bias", "at most 300 entries"),
    ({"logit_bias": {"44": 1}}, "logit_bias", "outside the vocabulary (44 tokens)"),
    ({"logit_bias": {"5": 101}}, "logit_bias", "[-100, 100]"),
    ({"logit_bias": {"5": -100.5}}, "logit_bias", "[-100, 100]"),
    ({"logit_bias": {"x": 1}}, "logit_bias", "token ids"),
    ({"logit_bias": {"-3": 1}}, "logit_bias", "token ids"),
    ({"logit_bias": {"²": 1}}, "logit_bias", "token ids"),  # a digit to str.isdigit, not to int()
    ({"logit_bias": {"9" * 5000: 1}}, "logit_bias", "token ids"),
    ({"logit_bias": {"5": 1, "05": 2}}, "logit_bias", "given twice"),
    ({"logit_bias": {"5": "1"}}, "logit_bias.5", "valid number"),
    ({"logit_bias": {"5": True}}, "logit_bias.5", "valid number"),
    ({"logit_bias": [5]}, "logit_bias", "valid dictionary"),
    ({"presence_penalty": 2.5}, "presence_penalty", "[-2, 2]"),
    ({"presence_penalty": "1"}, "presence_penalty", "valid number"),
    ({"frequency_penalty": -3}, "frequency_penalty", "[-2, 2]"),
])
def test_bad_processor_settings_are_400s_naming_the_field(server, kind, fields, param, words):
    status, answer = post(server, kind, **fields)
    assert status == 400, answer
    error = answer["error"]
    assert error["param"] == param and words in error["message"], error


@pytest.mark.parametrize("kind, fields, param, words", [
    ("chat", {"top_logprobs": 2}, "top_logprobs", "needs logprobs: true"),
    ("chat", {"logprobs": False, "top_logprobs": 1}, "top_logprobs", "needs logprobs: true"),
    ("chat", {"logprobs": True, "top_logprobs": 21}, "top_logprobs", "[0, 20]"),
    ("chat", {"logprobs": True, "top_logprobs": -1}, "top_logprobs", "[0, 20]"),
    ("chat", {"logprobs": 1}, "logprobs", "valid boolean"),
    ("chat", {"logprobs": True, "top_logprobs": 2.0}, "top_logprobs", "valid integer"),
    ("completion", {"logprobs": 21}, "logprobs", "[0, 20]"),
    ("completion", {"logprobs": -1}, "logprobs", "[0, 20]"),
    ("completion", {"logprobs": True}, "logprobs", "valid integer"),
    ("completion", {"top_logprobs": 2}, "top_logprobs", "Extra inputs"),  # a chat field
])
def test_bad_logprobs_settings_are_400s_naming_the_field(server, kind, fields, param, words):
    status, answer = post(server, kind, **fields)
    assert status == 400, answer
    error = answer["error"]
    assert error["param"] == param and words in error["message"], error


def test_the_largest_settings_are_accepted(server):
    status, answer = post(server, "chat", logprobs=True, top_logprobs=20, max_tokens=2)
    assert status == 200 and len(answer["choices"][0]["logprobs"]["content"][0]["top_logprobs"]) == 20
    status, answer = post(server, "completion", logprobs=20, max_tokens=2)
    assert status == 200 and len(answer["choices"][0]["logprobs"]["top_logprobs"][0]) == 20
    status, answer = post(server, "chat", logit_bias={str(i): -100 for i in range(1, 44)}, presence_penalty=-2,
                          frequency_penalty=2, max_tokens=2)
    assert status == 200, answer


def test_the_cap_of_logit_bias_is_300_entries():
    # The tiny vocabulary has 44 tokens: the cap itself is checked before the vocabulary (DecodeConfig keeps any id).
    def bias(n: int) -> dict:
        return {"messages": [{"role": "user", "content": "hi"}], "logit_bias": {str(i): 1 for i in range(n)}}

    assert len(settings(parse(ChatRequest, bias(300)), DecodeConfig()).config.logit_bias) == 300
    with pytest.raises(APIError, match="at most 300 entries") as caught:
        settings(parse(ChatRequest, bias(301)), DecodeConfig())
    assert caught.value.param == "logit_bias"


def test_an_id_outside_the_vocabulary_found_by_the_engine_is_a_400_naming_logit_bias(server, monkeypatch):
    import verispec.serve.app as app_module

    monkeypatch.setattr(app_module, "check_logit_bias", lambda decoder, config: None)  # skip the check on arrival
    for kind in ("chat", "completion"):
        status, answer = post(server, kind, logit_bias={"50": 1})
        assert status == 400 and answer["error"]["param"] == "logit_bias", answer
        assert "outside the vocabulary" in answer["error"]["message"]
        # streamed, the response has begun when the engine finds it: the error comes as an event of the stream
        status, raw = post(server, kind, logit_bias={"50": 1}, stream=True)
        assert status == 200 and '"param": "logit_bias"' in raw and "outside the vocabulary" in raw
