"""What one request may ask for: the caps on settings that size memory or time, the memory estimate, seeds, and the
OpenAI fields that are refused, ignored or unknown (a real server over the tiny models)."""

from __future__ import annotations

import json

import pytest

from tests.serve.conftest import request, running_server
from verispec.cli import main
from verispec.engine import DecodeConfig
from verispec.errors import ConfigError
from verispec.serve import ServeConfig, bounds
from verispec.serve.schemas import IGNORED, UNSUPPORTED

CONFIG = ServeConfig(defaults=DecodeConfig(max_new_tokens=4), model_name="tiny")
CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "hello there"}], "max_tokens": 4}
COMPLETION = {"model": "tiny", "prompt": "hello there", "max_tokens": 4}
ENDPOINTS = {"chat": ("/v1/chat/completions", CHAT), "completion": ("/v1/completions", COMPLETION)}


@pytest.fixture(scope="module")
def server(decoder, one_thread):
    with running_server(decoder, CONFIG) as (url, _):
        yield url


def post(url: str, body: dict | bytes, kind: str = "chat") -> tuple[int, dict]:
    status, _, answer = request(url, "POST", ENDPOINTS[kind][0], body)
    return status, answer


def refused(url: str, body: dict | bytes, kind: str = "chat", status: int = 400) -> dict:
    """Post `body`; assert an OpenAI-format error with `status`; return the error object."""
    got, answer = post(url, body, kind)
    assert got == status, answer
    error = answer["error"]
    assert error["code"] == status and error["type"] == "invalid_request_error" and error["message"]
    return error


@pytest.mark.parametrize("options, param, limit", [
    ({"method": "specinfer", "paths": 1_000_000}, "verispec.paths", bounds.MAX_PATHS),
    ({"gamma": 10**9}, "verispec.gamma", bounds.MAX_GAMMA),
    ({"drafter": "ngram", "ngram_gamma": 10**9}, "verispec.ngram_gamma", bounds.MAX_NGRAM_GAMMA),
    ({"ngram_min": 100, "ngram_max": 100}, "verispec.ngram_min", bounds.MAX_NGRAM),
    ({"ngram_max": 10**6}, "verispec.ngram_max", bounds.MAX_NGRAM),
])
def test_settings_that_size_a_round_are_capped(server, options, param, limit):
    error = refused(server, CHAT | {"verispec": options})
    assert error["param"] == param and f"at most {limit}" in error["message"]


def test_the_caps_themselves_are_accepted(server):
    status, answer = post(server, CHAT | {"verispec": {"method": "gbv", "paths": bounds.MAX_PATHS, "gamma": 2}})
    assert status == 200, answer
    status, answer = post(server, CHAT | {"verispec": {"gamma": bounds.MAX_GAMMA}})
    assert status == 200, answer


def test_stop_strings_are_bounded_in_number_and_length(server):
    error = refused(server, CHAT | {"stop": ["a", "b", "c", "d", "e"]})
    assert error["param"] == "stop" and "up to 4" in error["message"]
    error = refused(server, CHAT | {"stop": "x" * (bounds.MAX_STOP_CHARS + 1)})
    assert error["param"] == "stop" and str(bounds.MAX_STOP_CHARS) in error["message"]
    assert post(server, CHAT | {"stop": ["x" * bounds.MAX_STOP_CHARS] * 4})[0] == 200


def test_max_tokens_is_bounded_by_the_context(server):
    error = refused(server, CHAT | {"max_tokens": 10**30})
    assert error["param"] == "max_tokens" and "512 tokens" in error["message"]


def test_a_prompt_too_long_for_any_tokenization_is_refused_before_tokenizing(server):
    most = 512 * bounds.MAX_CHARS_PER_TOKEN
    error = refused(server, COMPLETION | {"prompt": "a" * (most + 1)}, "completion")
    assert error["param"] == "prompt" and str(most) in error["message"]
    error = refused(server, CHAT | {"messages": [{"role": "user", "content": "hi"}] * 513})
    assert error["param"] == "messages" and "513 messages" in error["message"]


def test_a_body_past_the_limit_is_refused_without_reading_it_all(server):
    body = json.dumps(COMPLETION | {"prompt": "a" * bounds.MAX_BODY_BYTES}).encode()
    error = refused(server, body, "completion", status=413)
    assert str(bounds.MAX_BODY_BYTES) in error["message"]


def test_a_request_beyond_its_share_of_free_memory_is_refused(server, monkeypatch):
    monkeypatch.setattr(bounds, "available_bytes", lambda devices: 4 << 20)
    big = {"method": "gbv", "paths": bounds.MAX_PATHS, "gamma": bounds.MAX_GAMMA}
    error = refused(server, CHAT | {"verispec": big})
    assert error["param"] == "verispec.paths" and "memory" in error["message"] and "GiB" in error["message"]
    assert post(server, CHAT | {"verispec": {"method": "ar"}})[0] == 200  # a small request still fits


def test_the_memory_estimate_of_a_million_paths_is_terabytes():
    # A 1.5B Qwen2.5 target (V 151,936, 28 layers of 2 KV heads of 128, float32), `specinfer` with a million paths.
    target = bounds.ModelShape(vocab=151936, kv_bytes=2 * 28 * 2 * 128 * 4, heads=12, hidden=1536,
                               intermediate=8960, dtype_bytes=4)
    huge = DecodeConfig(method="specinfer", paths=1_000_000)
    assert bounds.request_bytes([target], huge, 10, 138) > 3.6e12
    one = bounds.request_bytes([target], DecodeConfig(method="specinfer", paths=2), 10, 138)
    two = bounds.request_bytes([target], DecodeConfig(method="specinfer", paths=4), 10, 138)
    longer = bounds.request_bytes([target], DecodeConfig(method="specinfer", paths=2), 10, 1000)
    assert one < two and one < longer < 1 << 30


def test_the_shape_of_a_model_and_the_free_memory_are_read(tiny_pair):
    import torch

    shape = bounds.model_shape(tiny_pair["target"])  # 2 layers of 2 KV heads of 8, float64; 4 heads, hidden 32
    assert (shape.vocab, shape.kv_bytes, shape.heads, shape.hidden, shape.dtype_bytes) == (44, 2 * 2 * 2 * 8 * 8, 4,
                                                                                         32, 8)
    free = bounds.available_bytes([torch.device("cpu")])
    assert free is None or free > 0


@pytest.mark.parametrize("seed", [0, 2**63 - 1, 2**63, 2**64 - 1])
def test_seeds_up_to_2_64_minus_1_are_accepted(server, seed):
    status, answer = post(server, CHAT | {"seed": seed, "temperature": 1.0})
    assert status == 200, answer
    DecodeConfig(seed=seed)


@pytest.mark.parametrize("seed", [2**64, 10**30, -1])
def test_seeds_outside_0_to_2_64_minus_1_are_refused(server, seed, capsys):
    error = refused(server, CHAT | {"seed": seed})
    assert error["param"] == "seed" and "2**64 - 1" in error["message"]
    with pytest.raises(ConfigError, match=r"seed must be an integer in \[0, 2\*\*64 - 1\]"):
        DecodeConfig(seed=seed)
    assert main(["generate", "hello", "--seed", str(seed)]) == 2  # the CLI's one-line error, before any loading
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "seed must be an integer in [0, 2**64 - 1]" in err[0]


def test_a_boolean_seed_is_not_a_seed():
    with pytest.raises(ConfigError, match="seed"):
        DecodeConfig(seed=True)


ASKING = {  # a value of each unsupported field that asks for something
    "response_format": {"type": "json_object"}, "tools": [{"type": "function", "function": {"name": "f"}}],
    "tool_choice": "auto", "functions": [{"name": "f"}], "function_call": "auto", "echo": True, "suffix": "x",
    "best_of": 2, "audio": {"voice": "alloy", "format": "wav"}, "modalities": ["text", "audio"],
    "reasoning_effort": "low", "verbosity": "low", "web_search_options": {},
}


@pytest.mark.parametrize("kind, field", [(kind, field) for field, rule in UNSUPPORTED.items()
                                         for kind in sorted(rule.endpoints)])
def test_unsupported_fields_asking_for_something_are_refused(server, kind, field):
    error = refused(server, ENDPOINTS[kind][1] | {field: ASKING[field]}, kind)
    assert error["param"] == field and "not supported" in error["message"]


@pytest.mark.parametrize("kind", ["chat", "completion"])
def test_unsupported_fields_at_their_defaults_and_ignored_fields_are_accepted(server, kind):
    neutral = {field: rule.neutral[-1] for field, rule in UNSUPPORTED.items() if kind in rule.endpoints}
    example = {str: "someone", dict: {"k": "v"}, bool: True}
    ignored = {field: example[types[0]] for field, (endpoints, types) in IGNORED.items() if kind in endpoints}
    status, answer = post(server, ENDPOINTS[kind][1] | neutral | ignored | {"n": None, "stream": None}, kind)
    assert status == 200, answer
    plain = post(server, ENDPOINTS[kind][1], kind)[1]
    assert answer["choices"] == plain["choices"]  # they change nothing


@pytest.mark.parametrize("body, kind, param", [
    (CHAT | {"colour": "blue"}, "chat", "colour"),
    (CHAT | {"echo": False}, "chat", "echo"),  # a completions field
    (COMPLETION | {"messages": []}, "completion", "messages"),
    (CHAT | {"user": 5}, "chat", "user"),
    (CHAT | {"stream_options": {"include_usage": True, "extra": 1}}, "chat", "stream_options.extra"),
])
def test_unknown_fields_and_wrong_types_of_ignored_ones_are_refused(server, body, kind, param):
    assert refused(server, body, kind)["param"] == param


@pytest.mark.parametrize("message, param, words", [
    ({"role": "robot", "content": "hi"}, "messages.0.role", "unknown role 'robot'"),
    ({"role": "tool", "content": "hi", "tool_call_id": "x"}, "messages.0.role", "tool calls"),
    ({"role": "function", "content": "hi"}, "messages.0.role", "tool calls"),
    ({"role": "assistant", "content": "hi", "tool_calls": [{"id": "1"}]}, "messages.0.tool_calls", "not supported"),
    ({"role": "user", "content": "hi", "colour": 1}, "messages.0.colour", "Extra inputs"),
    ({"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}, "messages.0.content", ""),
])
def test_messages_the_server_cannot_render_are_refused(server, message, param, words):
    error = refused(server, CHAT | {"messages": [message]})
    assert error["param"].startswith(param) and words in error["message"]


def test_developer_messages_and_neutral_message_fields_are_accepted(server):
    messages = [{"role": "developer", "content": "be brief", "name": "ops"},
                {"role": "user", "content": "hello there", "refusal": None, "tool_calls": []}]
    status, answer = post(server, CHAT | {"messages": messages})
    assert status == 200, answer


@pytest.mark.parametrize("raw", [
    b'{"model": "tiny", "prompt": "hi", "temperature": NaN}',
    b'{"model": "tiny", "prompt": "hi", "top_p": Infinity}',
    b'{"model": "tiny", "prompt": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"model": "tiny", "prompt": "a\\udcffb"}',
    b'{"model": "tiny", "prompt": "hi", "user": "\\ud800"}',
])
def test_bodies_that_are_not_json_are_refused(server, raw):
    assert "not valid JSON" in refused(server, raw, "completion")["message"]


class TemplatedTokenizer:
    """A tokenizer with a chat template that records the turns it renders, or refuses them like a strict one."""

    chat_template = "{{ messages }}"

    def __init__(self, refuse: bool = False) -> None:
        self.refuse, self.turns = refuse, None

    def apply_chat_template(self, turns, add_generation_prompt, tokenize):
        from jinja2 import TemplateError

        if self.refuse:
            raise TemplateError("Conversation roles must alternate user/assistant/user/assistant/...")
        self.turns = turns
        return [1, 2, 3]


def test_a_developer_message_is_rendered_as_a_system_message():
    from verispec.serve.prompts import chat_prompt_ids
    from verispec.serve.schemas import Message

    tokenizer = TemplatedTokenizer()
    messages = [Message(role="developer", content="be brief"), Message(role="user", content="hi")]
    assert chat_prompt_ids(tokenizer, messages) == [1, 2, 3]
    assert [turn["role"] for turn in tokenizer.turns] == ["system", "user"]


def test_a_chat_template_refusing_the_messages_is_a_400():
    from verispec.serve.prompts import chat_prompt_ids
    from verispec.serve.schemas import APIError, Message

    with pytest.raises(APIError, match="chat template refused") as caught:
        chat_prompt_ids(TemplatedTokenizer(refuse=True), [Message(role="user", content="hi")])
    assert caught.value.status == 400 and caught.value.param == "messages"


def test_models_that_state_no_context_get_the_servers_own_bound():
    from verispec.serve.prompts import fit_max_tokens
    from verispec.serve.schemas import APIError

    assert fit_max_tokens(10, 100, bounds.UNSTATED_CONTEXT, True, stated=False) == 100
    with pytest.raises(APIError, match=f"longest sequence this server decodes is {bounds.UNSTATED_CONTEXT}"):
        fit_max_tokens(10, 10**30, bounds.UNSTATED_CONTEXT, True, stated=False)
