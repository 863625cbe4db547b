"""The OpenAI endpoints on a real server over the tiny models, through the official `openai` client and raw HTTP."""

from __future__ import annotations

import openai
import pytest

from tests.serve.conftest import request, running_server
from verispec.engine import MULTIPATH_PATHS, DecodeConfig
from verispec.serve import ServeConfig

PROMPT = "hello there"  # the tiny target continues it past 40 tokens without EOS
EOS_PROMPT = "def add(a, b):"  # the tiny target ends it with EOS after one character
CONFIG = ServeConfig(defaults=DecodeConfig(max_new_tokens=24), model_name="tiny")


@pytest.fixture(scope="module")
def server(decoder, one_thread):
    with running_server(decoder, CONFIG) as (url, _):
        yield url


@pytest.fixture(scope="module")
def client(server):
    return openai.OpenAI(base_url=server + "/v1", api_key="unused", max_retries=0)


def chat(client, stream=False, **kwargs):
    """Return (text, finish reason, usage, verispec block) of one chat completion, streamed or not."""
    kwargs = {"model": "tiny", "messages": [{"role": "user", "content": PROMPT}]} | kwargs
    if not stream:
        r = client.chat.completions.create(**kwargs)
        return r.choices[0].message.content, r.choices[0].finish_reason, r.usage, r.verispec
    parts, finish, usage, stats = [], None, None, None
    for chunk in client.chat.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs):
        if chunk.choices:
            parts.append(chunk.choices[0].delta.content or "")
            finish = chunk.choices[0].finish_reason or finish
        usage = chunk.usage or usage
        stats = getattr(chunk, "verispec", None) or stats
    return "".join(parts), finish, usage, stats


def complete(client, stream=False, **kwargs):
    kwargs = {"model": "tiny", "prompt": PROMPT} | kwargs
    if not stream:
        r = client.completions.create(**kwargs)
        return r.choices[0].text, r.choices[0].finish_reason, r.usage
    parts, finish, usage = [], None, None
    for chunk in client.completions.create(stream=True, stream_options={"include_usage": True}, **kwargs):
        if chunk.choices:
            parts.append(chunk.choices[0].text)
            finish = chunk.choices[0].finish_reason or finish
        usage = chunk.usage or usage
    return "".join(parts), finish, usage


@pytest.mark.parametrize("method, options", [("ar", {}), ("sd", {"gamma": 3}), ("bv", {"gamma": 5}),
                                             ("gbv", {"gamma": 3, "paths": 2})])
@pytest.mark.parametrize("prompt", [PROMPT, EOS_PROMPT])
def test_greedy_chat_equals_offline_generate_streamed_or_not(client, decoder, method, options, prompt):
    offline = decoder.generate(prompt, method=method, max_new_tokens=20, **options)
    extra = {"verispec": {"method": method} | options}
    messages = [{"role": "user", "content": prompt}]
    text, finish, usage, stats = chat(client, messages=messages, max_tokens=20, temperature=0, extra_body=extra)
    assert text == offline.text
    assert usage.prompt_tokens == offline.prompt_tokens and usage.completion_tokens == len(offline.tokens)
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    assert finish == ("stop" if offline.stopped_at_eos else "length")
    assert stats["method"] == method and stats["target_calls"] == offline.trace.target_calls
    assert stats["acceptance_rate"] == offline.trace.acceptance_rate
    streamed, s_finish, s_usage, s_stats = chat(client, stream=True, messages=messages, max_tokens=20, temperature=0,
                                                extra_body=extra)
    assert (streamed, s_finish, s_usage.completion_tokens) == (text, finish, usage.completion_tokens)
    assert s_stats["target_calls"] == stats["target_calls"]


def test_sampled_chat_is_seeded_and_streamed_text_equals_the_whole(client, decoder):
    kwargs = {"max_tokens": 20, "temperature": 1.0, "top_p": 0.9, "seed": 7, "extra_body": {"verispec": {"top_k": 20}}}
    text = chat(client, **kwargs)[0]
    assert chat(client, stream=True, **kwargs)[0] == text
    offline = decoder.generate(PROMPT, temperature=1.0, top_p=0.9, top_k=20, seed=7, max_new_tokens=20)
    assert text == offline.text


def test_completions_stream_and_not(client, decoder):
    offline = decoder.generate(PROMPT, method="sd", max_new_tokens=16, chat_template=False)
    text, finish, usage = complete(client, max_tokens=16)
    assert text == offline.text and usage.completion_tokens == len(offline.tokens)
    assert complete(client, stream=True, max_tokens=16)[:2] == (text, finish)


def test_max_completion_tokens_is_the_same_as_max_tokens(client):
    assert chat(client, max_completion_tokens=7)[2].completion_tokens == 7


def test_server_default_max_tokens_applies(client):
    assert chat(client)[2].completion_tokens == CONFIG.defaults.max_new_tokens


def test_stop_strings_end_the_output_before_them(client, decoder):
    offline = decoder.generate(PROMPT, max_new_tokens=30)
    full = offline.text
    stop = full[6:8]
    cut = full.find(stop)
    reaching = next(n for n in range(1, 31) if stop in decoder.tokenizer.decode(offline.tokens[:n]))
    for stream in (False, True):
        text, finish, usage, _ = chat(client, stream=stream, max_tokens=30, stop=[stop, "never here!"])
        assert (text, finish) == (full[:cut], "stop")
        assert usage.completion_tokens == reaching


def test_models_and_health(server):
    status, _, body = request(server, "GET", "/v1/models")
    assert status == 200 and [m["id"] for m in body["data"]] == ["tiny"]
    status, _, body = request(server, "GET", "/health")
    assert status == 200 and body["status"] == "ready"


GOOD = {"model": "tiny", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}


@pytest.mark.parametrize(
    "body, status, param, words",
    [
        (b"{not json", 400, None, "not valid JSON"),
        (b"[1, 2]", 400, None, "JSON object"),
        (GOOD | {"messages": "hi"}, 400, "messages", "valid list"),
        (GOOD | {"max_tokens": "4"}, 400, "max_tokens", "valid integer"),
        (GOOD | {"temperature": "hot"}, 400, "temperature", "valid number"),
        (GOOD | {"stream": "yes"}, 400, "stream", "valid boolean"),
        (GOOD | {"temperature": -1}, 400, "temperature", "temperature must be a number >= 0"),
        (GOOD | {"top_p": 0}, 400, "top_p", "top_p must be in (0, 1]"),
        (GOOD | {"top_p": 1.5}, 400, "top_p", "top_p must be in (0, 1]"),
        (GOOD | {"max_tokens": 0}, 400, "max_tokens", "max_tokens must be an integer >= 1"),
        (GOOD | {"verispec": {"gamma": 0}}, 400, "verispec.gamma", "gamma (draft length) must be an integer >= 1"),
        (GOOD | {"verispec": {"gamma": 2.5}}, 400, "verispec.gamma", "valid integer"),
        (GOOD | {"verispec": {"method": "beam"}}, 400, "verispec.method", "unknown method 'beam'"),
        (GOOD | {"verispec": {"tau": 2}}, 400, "verispec.tau", "tau"),
        (GOOD | {"verispec": {"method": "sd", "paths": 2}}, 400, "verispec.paths", "paths must be 1"),
        (GOOD | {"verispec": {"paths": 0}}, 400, "verispec.paths", "paths (K) must be an integer >= 1"),
        (GOOD | {"verispec": {"method": "gbv", "paths": 1}}, 400, "verispec.paths", "needs paths >= 2"),
        (GOOD | {"verispec": {"colour": 1}}, 400, "verispec.colour", "Extra inputs"),
        (GOOD | {"verispec": {"method": "sprinter"}}, 400, None, "learned verifier"),
        (GOOD | {"n": 2}, 400, "n", "n must be 1"),
        (GOOD | {"stop": ["a", "b", "c", "d", "e"]}, 400, "stop", "up to 4"),
        (GOOD | {"messages": []}, 400, "messages", "at least one"),
        (GOOD | {"messages": [{"role": "user", "content": "  "}]}, 400, "messages", "prompt is empty"),
        (GOOD | {"model": "gpt-4"}, 404, "model", "'gpt-4' does not exist"),
        (GOOD | {"max_tokens": 600}, 400, "max_tokens", "maximum context length is 512 tokens"),
    ],
)
def test_bad_requests_get_openai_errors(server, body, status, param, words):
    got, _, answer = request(server, "POST", "/v1/chat/completions", body)
    assert got == status, answer
    error = answer["error"]
    assert words in error["message"] and error["param"] == param and error["code"] == status
    assert error["type"] == ("not_found_error" if status == 404 else "invalid_request_error")


@pytest.mark.parametrize("fields, given, param", [
    ("top_p", {}, "top_p"),
    ("max_new_tokens", {}, "max_tokens"),
    ("gamma", {}, "verispec.gamma"),
    (("ngram_min", "ngram_max"), {"ngram_max": 2}, "verispec.ngram_max"),  # the one of the two the request gave
    (("ngram_min", "ngram_max"), {"ngram_min": 4, "ngram_max": 2}, "verispec.ngram_min"),
    ("dtype", {}, None),  # a setting of the server's, no request field
    (None, {}, None),
])
def test_a_config_errors_fields_become_the_param_whatever_its_message_says(server, monkeypatch, fields, given, param):
    from verispec.errors import ConfigError
    from verispec.serve import schemas

    def refuse(defaults, requested):
        raise ConfigError("a message that names no setting", field=fields)

    monkeypatch.setattr(schemas, "_decode_config", refuse)
    body = GOOD | ({"verispec": given} if given else {})
    status, _, answer = request(server, "POST", "/v1/chat/completions", body)
    assert status == 400 and answer["error"]["param"] == param, answer
    assert answer["error"]["message"] == "a message that names no setting"


def test_completion_prompt_errors(server):
    good = {"model": "tiny", "prompt": "hi", "max_tokens": 4}
    assert request(server, "POST", "/v1/completions", good)[0] == 200
    status, _, answer = request(server, "POST", "/v1/completions", good | {"prompt": ["a", "b"]})
    assert status == 400 and answer["error"]["param"] == "prompt"
    status, _, answer = request(server, "POST", "/v1/completions", good | {"prompt": 5})
    assert status == 400 and answer["error"]["param"].startswith("prompt")


def test_a_default_max_tokens_is_shortened_to_the_room_left(server):
    long_prompt = "ab " * 166  # 498 tokens of the 512-token context: the default 24 does not fit, 14 do
    status, _, body = request(server, "POST", "/v1/completions", {"model": "tiny", "prompt": long_prompt})
    assert status == 200 and body["usage"]["prompt_tokens"] == 498
    assert body["usage"]["completion_tokens"] <= 14


def test_the_openai_client_raises_its_own_errors(client):
    with pytest.raises(openai.BadRequestError, match="unknown method"):
        chat(client, extra_body={"verispec": {"method": "beam"}})
    with pytest.raises(openai.NotFoundError):
        chat(client, model="other")


def test_unknown_routes_answer_in_the_error_format(server):
    status, _, body = request(server, "GET", "/v1/nothing")
    assert status == 404 and "error" in body


def test_a_request_naming_a_multipath_method_without_paths_gets_its_default_paths(server):
    status, _, answer = request(server, "POST", "/v1/chat/completions", GOOD | {"verispec": {"method": "gbv"}})
    assert status == 200, answer
    assert answer["verispec"]["method"] == "gbv" and answer["verispec"]["paths"] == MULTIPATH_PATHS
