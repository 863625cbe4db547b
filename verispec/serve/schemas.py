"""Request bodies of the OpenAI endpoints, their validation, and the OpenAI error format.

Types are checked strictly (a string where a number belongs is a 400, not a silent conversion); values are
checked by `DecodeConfig` itself, so a bad γ, temperature, top-p or method gets the same message as on the CLI.
Fields of the OpenAI API that verispec does not implement are ignored, except `n`, which must be 1.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, ValidationError

from verispec.engine import DecodeConfig
from verispec.errors import ConfigError


class APIError(Exception):
    """An error answered in the OpenAI format: {"error": {"message", "type", "param", "code"}}."""

    TYPES = {400: "invalid_request_error", 404: "not_found_error", 429: "rate_limit_error", 503: "service_unavailable"}

    def __init__(self, status: int, message: str, param: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.headers = status, message, param, headers or {}

    def body(self) -> dict[str, Any]:
        kind = self.TYPES.get(self.status, "server_error")
        return {"error": {"message": self.message, "type": kind, "param": self.param, "code": self.status}}


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


class TextPart(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    type: Literal["text"]
    text: str


class Message(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    role: str
    content: str | list[TextPart] | None = None

    def text(self) -> str:
        if isinstance(self.content, list):
            return "".join(part.text for part in self.content)
        return self.content or ""


class StreamOptions(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    include_usage: bool = False


class _Common(BaseModel):
    model_config = ConfigDict(strict=True, extra="ignore")
    model: str | None = None
    max_tokens: int | None = None
    max_completion_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    seed: int | None = None
    stop: str | list[str] | None = None
    n: int = 1
    stream: bool = False
    stream_options: StreamOptions | None = None
    verispec: VerispecOptions | None = None


class ChatRequest(_Common):
    messages: list[Message]


class CompletionRequest(_Common):
    prompt: str | list[str]


@dataclass(frozen=True)
class Settings:
    """What one request asks for, validated: the decode configuration and the output handling."""

    config: DecodeConfig
    stop: tuple[str, ...]
    stream: bool
    include_usage: bool
    max_tokens_given: bool  # False: the server default applies, shortened to fit the context


def parse(model: type[BaseModel], body: Any) -> Any:
    """Validate a decoded JSON body against `model`; raise APIError 400 naming the first bad field."""
    if not isinstance(body, dict):
        raise APIError(400, "the request body must be a JSON object")
    try:
        return model.model_validate(body)
    except ValidationError as exc:
        first = exc.errors()[0]
        param = ".".join(str(part) for part in first["loc"] if not str(part).startswith(("function-", "list[")))
        raise APIError(400, f"{param or 'body'}: {first['msg']}", param=param or None) from None


# DecodeConfig's settings that are fields of the request itself (max_new_tokens is called max_tokens there); the
# others a request may set are fields of its `verispec` object.
_TOP_LEVEL = {"temperature": "temperature", "top_p": "top_p", "seed": "seed", "max_new_tokens": "max_tokens"}
# Server defaults that not every request can take: a request whose method, drafter or temperature rules one out
# runs without it (as it would run on a server without it) instead of being refused for a setting it cannot change.
_DEFAULTS_WHERE_THEY_FIT = ("drafter", "draft_vocab", "draft_confidence", "adaptive_gamma")


def _param(message: str, given: set[str]) -> str | None:
    """Return the request field that a DecodeConfig / SamplingConfig error `message` is about (its `param`).

    The messages start with the setting they are about ("gamma (draft length) must ...", "unknown drafter ...");
    a message about two settings names the one the request gave (`given`: the DecodeConfig names it set).
    """
    match = re.match(r"(?:unknown )?(\w+)", message)
    name = match.group(1) if match else ""
    if name == "method" and ("paths must be 1" in message or "needs paths >= 2" in message):  # a K it cannot take
        name = "paths"
    elif name == "method" and "takes no drafter" in message and "drafter" in given:
        name = "drafter"
    elif name == "ngram_min" and "must not exceed" in message and "ngram_min" not in given:
        name = "ngram_max"
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


def settings(request: _Common, defaults: DecodeConfig) -> Settings:
    """Return the request's settings over the server's `defaults`; raise APIError 400 on a bad value."""
    if request.n != 1:
        raise APIError(400, f"n must be 1 (one choice per request), got {request.n}", param="n")
    stop = (request.stop,) if isinstance(request.stop, str) else tuple(request.stop or ())
    if len(stop) > 4 or any(not s for s in stop):
        raise APIError(400, "stop must be up to 4 non-empty strings", param="stop")
    options = request.verispec or VerispecOptions()
    max_tokens = request.max_completion_tokens if request.max_completion_tokens is not None else request.max_tokens
    requested = options.model_dump(exclude_none=True) | {
        "seed": request.seed, "max_new_tokens": max_tokens, "temperature": request.temperature, "top_p": request.top_p,
    }
    requested = {name: value for name, value in requested.items() if value is not None}
    try:
        config = _decode_config(defaults, requested)
    except ConfigError as exc:
        message = str(exc)
        if message.startswith("max_new_tokens"):
            message = "max_tokens" + message[len("max_new_tokens"):]
        raise APIError(400, message, param=_param(str(exc), set(requested))) from None
    include_usage = bool(request.stream_options and request.stream_options.include_usage)
    return Settings(config, stop, request.stream, include_usage, max_tokens is not None)
