"""Request bodies of the OpenAI endpoints, their validation, and the OpenAI error format.

Types are checked strictly (a string where a number belongs is a 400, not a silent conversion); values are
checked by `DecodeConfig` itself, so a bad γ, temperature, top-p or method gets the same message as on the CLI.
Every field of a request is one of: implemented (the models below), accepted and ignored because it changes
nothing in the output (`IGNORED`), accepted only with a value that asks for nothing (`UNSUPPORTED`), or unknown
(a 400 naming it). Settings that size memory or time are bounded (`verispec.serve.bounds`).
"""

from __future__ import annotations

import re
from collections.abc import Collection
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError, field_validator

from verispec.engine import DecodeConfig
from verispec.errors import ConfigError, VerispecError
from verispec.processors import MAX_TOP_LOGPROBS
from verispec.serve import bounds


class APIError(Exception):
    """An error answered in the OpenAI format: {"error": {"message", "type", "param", "code"}}."""

    TYPES = {400: "invalid_request_error", 404: "not_found_error", 413: "invalid_request_error",
             429: "rate_limit_error", 503: "service_unavailable"}

    def __init__(self, status: int, message: str, param: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers or {}

    def body(self) -> dict[str, Any]:
        kind = self.TYPES.get(self.status, "server_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.status}}


CHAT, COMPLETION = frozenset({"chat"}), frozenset({"completion"})
BOTH = CHAT | COMPLETION


@dataclass(frozen=True)
class Unsupported:
    """An OpenAI field verispec does not implement: a request may send it only with a value that asks for nothing."""

    endpoints: frozenset[str]
    neutral: tuple[Any, ...]  # OpenAI's defaults, and values equal to them: accepted, as they change nothing
    lacks: str  # what verispec does not do, for the message


# The OpenAI request fields that are refused (400 naming the field) unless their value asks for nothing, by name.
# Implementing one removes its entry here and adds it to the request models.
UNSUPPORTED: dict[str, Unsupported] = {
    "response_format": Unsupported(CHAT, (None, {"type": "text"}), "structured output (JSON mode or schema)"),
    "tools": Unsupported(CHAT, (None, []), "tool calls"),
    "tool_choice": Unsupported(CHAT, (None, "none"), "tool calls"),
    "functions": Unsupported(CHAT, (None, []), "function calls"),
    "function_call": Unsupported(CHAT, (None, "none"), "function calls"),
    "echo": Unsupported(COMPLETION, (None, False), "echoing the prompt"),
    "suffix": Unsupported(COMPLETION, (None, ""), "text after the insertion point"),
    "best_of": Unsupported(COMPLETION, (None, 1), "several candidates per request"),
    "audio": Unsupported(CHAT, (None,), "audio output"),
    "modalities": Unsupported(CHAT, (None, ["text"]), "output other than text"),
    "reasoning_effort": Unsupported(CHAT, (None,), "reasoning effort"),
    "verbosity": Unsupported(CHAT, (None,), "a verbosity setting"),
    "web_search_options": Unsupported(CHAT, (None,), "web search"),
}

# OpenAI request fields that change nothing in the output of this server: accepted with a value of their type (or
# null) and ignored. Name -> (endpoints, the types accepted).
IGNORED: dict[str, tuple[frozenset[str], tuple[type, ...]]] = {
    "user": (BOTH, (str,)),  # an end-user id for abuse monitoring
    "safety_identifier": (CHAT, (str,)),  # the same, under its newer name
    "metadata": (CHAT, (dict,)),  # tags of a stored completion; nothing is stored
    "store": (CHAT, (bool,)),  # nothing is stored
    "service_tier": (CHAT, (str,)),  # one engine serves every request
    "parallel_tool_calls": (CHAT, (bool,)),  # with no tools there is nothing to call in parallel
    "prompt_cache_key": (CHAT, (str,)),  # a cache-routing hint
    "prediction": (CHAT, (dict,)),  # a predicted output speeds OpenAI's decoding up and never changes its output
}

# Fields of a chat message other than role, content and name, accepted only at their defaults (null, or empty):
# they carry tool calls, audio and refusals, which this server neither makes nor reads.
MESSAGE_UNSUPPORTED: dict[str, tuple[Any, ...]] = {
    "tool_calls": (None, []), "function_call": (None,), "tool_call_id": (None,), "audio": (None,),
    "refusal": (None,), "annotations": (None, []),
}

# Roles a message may have, and the role the chat template renders it as: `developer` is OpenAI's newer name for
# the system message. `tool` and `function` messages answer tool calls, which this server never makes.
ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}


def _same(value: Any, neutral: Any) -> bool:
    """Return whether `value` equals `neutral` as JSON values (false is not 0; 0 is 0.0)."""
    if isinstance(value, bool) or isinstance(neutral, bool):
        return type(value) is type(neutral) and value == neutral
    return value == neutral


def _check_fields(body: dict[str, Any], kind: str) -> None:
    """Remove the ignored and unsupported fields from `body`, checked; raise APIError 400 naming a field that asks
    for something this server does not do."""
    for name in [name for name in body if name in UNSUPPORTED and kind in UNSUPPORTED[name].endpoints]:
        value, rule = body.pop(name), UNSUPPORTED[name]
        if not any(_same(value, neutral) for neutral in rule.neutral):
            accepted = " or ".join("null" if n is None else repr(n) for n in rule.neutral)
            raise APIError(400, f"{name} is not supported: this server does not implement {rule.lacks} (only "
                           f"{accepted} is accepted)", param=name)
    for name in [name for name in body if name in IGNORED and kind in IGNORED[name][0]]:
        value, types = body.pop(name), IGNORED[name][1]
        if value is not None and not isinstance(value, types):
            raise APIError(400, f"{name}: expected {' or '.join(t.__name__ for t in types)} or null", param=name)
    messages = body.get("messages")
    for i, message in enumerate(messages if isinstance(messages, list) else []):
        if not isinstance(message, dict) or not isinstance(message.get("role"), str) or message["role"] not in ROLES:
            continue  # the model refuses it, naming its role (a tool message's tool_call_id is no news)
        for name in [name for name in message if name in MESSAGE_UNSUPPORTED]:
            value = message.pop(name)
            if not any(_same(value, neutral) for neutral in MESSAGE_UNSUPPORTED[name]):
                raise APIError(400, f"messages.{i}.{name} is not supported: this server makes no tool calls and "
                               f"produces text only", param=f"messages.{i}.{name}")


class VerispecOptions(BaseModel):
    """The `verispec` extension object of a request; its field names are `DecodeConfig.with_settings`'s."""

    model_config = ConfigDict(strict=True, extra="forbid")
    method: str | None = None
    gamma: int | None = None
    paths: int | None = None
    tau: float | None = None
    top_k: int | None = None
    drafter: str | None = None
    ngram_min: int | None = None
    ngram_max: int | None = None
    ngram_gamma: int | None = None
    hybrid_catchup: float | None = None
    draft_confidence: float | None = None
    adaptive_gamma: bool | None = None
    keyed_draws: bool | None = None


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    role: str
    content: str | list[TextPart] | None = None
    name: str | None = None  # a participant's name; chat templates do not render it, so it changes nothing

    @field_validator("role")
    @classmethod
    def _known_role(cls, role: str) -> str:
        if role in ("tool", "function"):
            raise ValueError(f"role {role!r} is not supported: its messages answer tool calls, which this server "
                             f"does not make")
        if role not in ROLES:
            raise ValueError(f"unknown role {role[:40]!r}; the roles are: {', '.join(ROLES)}")
        return role

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    include_usage: bool = False
    include_obfuscation: bool | None = None  # random padding of OpenAI's chunks; these carry none


class _Common(BaseModel):
    model_config = ConfigDict(strict=True, extra="forbid")
    model: str | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    # OpenAI's logit processors (verispec/processors.py); the ids of logit_bias are JSON object keys, so strings
    logit_bias: dict[str, float] | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    verispec: VerispecOptions | None = None


class ChatRequest(_Common):
    messages: list[Message]
    logprobs: bool | None = None  # report each token's log-probability
    top_logprobs: int | None = None  # and this many alternatives per token (needs logprobs: true)


class CompletionRequest(_Common):
    prompt: str | list[str]
    logprobs: int | None = None  # the legacy form: null = off, k = each token's log-probability and k alternatives


@dataclass(frozen=True)
class Settings:
    """What one request asks for, validated: the decode configuration and the output handling."""

    config: DecodeConfig
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    max_tokens_given: bool  # False: the server default applies, shortened to fit the context


_UNION_MEMBERS = {"str", "int", "float", "bool", "TextPart"}
# A logit_bias key: a decimal token id, of at most 18 digits (no vocabulary comes near), spaces around allowed
_TOKEN_ID = re.compile(r"\s*[0-9]{1,18}\s*")


def parse(model: type[BaseModel], body: Any) -> Any:
    """Validate a decoded JSON body against `model`; raise APIError 400 naming the first bad field."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    _check_fields(body, "chat" if model is ChatRequest else "completion")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        # a loc names the member of a union it tried (`prompt.str`, `content.list[TextPart]`): the field is the rest
        loc = [str(part) for part in first["loc"]]
        param = ".".join(loc[:1] + [part for part in loc[1:] if part not in _UNION_MEMBERS
                                    and not part.startswith(("function-", "list["))])
        raise APIError(400, f"{param or 'body'}: {first['msg']}", param=param or None) from None


# DecodeConfig's settings that are fields of the request itself (max_new_tokens is called max_tokens there); the
# others a request may set are fields of its `verispec` object.
_TOP_LEVEL = {"temperature": "temperature", "top_p": "top_p", "seed": "seed", "max_new_tokens": "max_tokens",
              "logit_bias": "logit_bias", "presence_penalty": "presence_penalty",
              "frequency_penalty": "frequency_penalty", "logprobs": "logprobs"}
# Server defaults that not every request can take: a request whose method, drafter or temperature rules one out
# runs without it (as it would run on a server without it) instead of being refused for a setting it cannot change.
_DEFAULTS_WHERE_THEY_FIT = ("drafter", "draft_vocab", "draft_confidence", "adaptive_gamma", "keyed_draws")


def error_param(error: VerispecError, given: Collection[str] = ()) -> str | None:
    """Return the request field a DecodeConfig / SamplingConfig `error` is about (its `param`): of the settings it
    names (`ConfigError.fields`), the first the request gave (`given`: the DecodeConfig names it set), else the
    first; None for an error about no request field (or not a ConfigError)."""
    fields = error.fields if isinstance(error, ConfigError) else ()
    names = [name for name in fields if name in given] or list(fields[:1])
    if not names:
        return None
    name = names[0]
    if name in _TOP_LEVEL:
        return _TOP_LEVEL[name]
    return f"verispec.{name}" if name in VerispecOptions.model_fields else None


def _decode_config(defaults: DecodeConfig, requested: dict[str, Any]) -> DecodeConfig:
    """Return `defaults` with the `requested` settings (DecodeConfig names, not None); raise ConfigError."""
    # A request that names another method without K gets that method's default K (`with_settings`).
    fitted = {name: getattr(DecodeConfig, name) for name in _DEFAULTS_WHERE_THEY_FIT}  # fit every request
    config = defaults.with_settings(**(fitted | requested))
    own = DecodeConfig(method=defaults.method)  # what the server's method takes when the server chose nothing
    for name in _DEFAULTS_WHERE_THEY_FIT:
        # a server default that is only its method's own default (sd's hybrid drafter) is no choice to carry over
        chosen = getattr(defaults, name) != getattr(own, name)
        if name not in requested and chosen and getattr(defaults, name) != getattr(config, name):
            try:
                config = config.with_settings(**{name: getattr(defaults, name)})
            except ConfigError:
                pass  # this request's method, drafter or temperature cannot take the server's default
    return config


def _stop_strings(stop: str | list[str] | None) -> tuple[str, ...]:
    """Return the request's stop strings; raise APIError 400 beyond the bounds (each one is searched every round)."""
    strings = (stop,) if isinstance(stop, str) else tuple(stop or ())
    if len(strings) > bounds.MAX_STOPS or any(not s for s in strings):
        raise APIError(400, f"stop must be up to {bounds.MAX_STOPS} non-empty strings, got {len(strings)}",
                       param="stop")
    longest = max(map(len, strings), default=0)
    if longest > bounds.MAX_STOP_CHARS:
        raise APIError(400, f"stop strings must be at most {bounds.MAX_STOP_CHARS} characters, got one of {longest}",
                       param="stop")
    return strings


def _check_caps(options: VerispecOptions) -> None:
    """Raise APIError 400 naming the first `verispec` setting beyond its cap (`bounds.CAPS`)."""
    for param, (cap, what) in bounds.CAPS.items():
        value = getattr(options, param.removeprefix("verispec."))
        if isinstance(value, int) and value > cap:
            raise APIError(400, f"{param} ({what}) must be at most {cap} on this server, got {value}", param=param)


def _logprobs(request: _Common) -> int | None:
    """Return the DecodeConfig `logprobs` a request asks for: None (off) or the alternatives reported per token; raise
    APIError 400 naming the field out of range (checked here: the engine's message names its own setting)."""
    most = MAX_TOP_LOGPROBS
    if isinstance(request, ChatRequest):
        top = request.top_logprobs
        if top is not None and not 0 <= top <= most:
            raise APIError(400, f"top_logprobs must be an integer in [0, {most}], got {top}", param="top_logprobs")
        if not request.logprobs:
            if top:  # 0 asks for nothing, as before log-probabilities were implemented
                raise APIError(400, "top_logprobs needs logprobs: true", param="top_logprobs")
            return None
        return top or 0
    given = getattr(request, "logprobs", None)
    if given is not None and not 0 <= given <= most:
        raise APIError(400, f"logprobs (the alternatives reported per token) must be an integer in [0, {most}] or "
                       f"null, got {given}", param="logprobs")
    return given


def _logit_bias(bias: dict[str, float] | None) -> dict[str, float] | None:
    """Return `bias` for DecodeConfig (which checks the values and duplicates); raise APIError 400 naming logit_bias
    past `bounds.MAX_LOGIT_BIAS` entries or for a key that is no decimal token id of a plausible size (int() refuses
    a key of thousands of digits with a ValueError, which would otherwise escape as a 500)."""
    if bias is None:
        return None
    if len(bias) > bounds.MAX_LOGIT_BIAS:
        raise APIError(400, f"logit_bias must hold at most {bounds.MAX_LOGIT_BIAS} entries on this server, got "
                       f"{len(bias)}", param="logit_bias")
    for key in bias:
        if not _TOKEN_ID.fullmatch(key):
            raise APIError(400, f"logit_bias: token ids must be integers >= 0 below the vocabulary size, got "
                           f"{key[:40]!r}", param="logit_bias")
    return bias


def settings(request: _Common, defaults: DecodeConfig) -> Settings:
    """Return the request's settings over the server's `defaults`; raise APIError 400 on a bad value."""
    if request.n not in (None, 1):
        raise APIError(400, f"n must be 1 (one choice per request), got {request.n}", param="n")
    stop = _stop_strings(request.stop)
    options = request.verispec or VerispecOptions()
    _check_caps(options)
    max_tokens = request.max_completion_tokens if request.max_completion_tokens is not None else request.max_tokens
    requested = options.model_dump(exclude_none=True) | {
        "seed": request.seed, "max_new_tokens": max_tokens, "temperature": request.temperature, "top_p": request.top_p,
        "logit_bias": _logit_bias(request.logit_bias), "presence_penalty": request.presence_penalty,
        "frequency_penalty": request.frequency_penalty, "logprobs": _logprobs(request),
    }
    requested = {name: value for name, value in requested.items() if value is not None}
    try:
        config = _decode_config(defaults, requested)
    except ConfigError as exc:
        param = error_param(exc, set(requested))
        message = str(exc)
        if exc.field == "max_new_tokens":  # the request calls the setting max_tokens
            message = message.replace("max_new_tokens", "max_tokens", 1)
        raise APIError(400, message, param=param) from None
    include_usage = bool(request.stream_options and request.stream_options.include_usage)
    return Settings(config, stop, bool(request.stream), include_usage, max_tokens is not None)
