"""Request bodies of the OpenAI endpoints, their validation, and the OpenAI error format.

Types are checked strictly (a string where a number belongs is a 400, not a silent conversion); values are
checked by `DecodeConfig` itself, so a bad γ, temperature, top-p or method gets the same message as on the CLI.
Fields of the OpenAI API that verispec does not implement are ignored, except `n`, which must be 1.
"""

from __future__ import annotations

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
    """The `verispec` extension object of a request."""

    model_config = ConfigDict(strict=True, extra="forbid")
    method: str | None = None
    gamma: int | None = None
    paths: int | None = None
    tau: float | None = None
    top_k: int | None = None


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


# The field of the request each DecodeConfig / SamplingConfig message starts with (for the error's `param`).
_PARAMS = {"gamma": "verispec.gamma", "paths": "verispec.paths", "tau": "verispec.tau", "top_k": "verispec.top_k",
           "unknown method": "verispec.method", "method": "verispec.method", "temperature": "temperature",
           "top_p": "top_p", "max_new_tokens": "max_tokens", "seed": "seed"}


def settings(request: _Common, defaults: DecodeConfig) -> Settings:
    """Return the request's settings over the server's `defaults`; raise APIError 400 on a bad value."""
    if request.n != 1:
        raise APIError(400, f"n must be 1 (one choice per request), got {request.n}", param="n")
    stop = (request.stop,) if isinstance(request.stop, str) else tuple(request.stop or ())
    if len(stop) > 4 or any(not s for s in stop):
        raise APIError(400, "stop must be up to 4 non-empty strings", param="stop")
    options = request.verispec or VerispecOptions()
    max_tokens = request.max_completion_tokens if request.max_completion_tokens is not None else request.max_tokens
    requested = {
        "method": options.method, "gamma": options.gamma, "paths": options.paths, "tau": options.tau,
        "seed": request.seed, "max_new_tokens": max_tokens, "temperature": request.temperature,
        "top_k": options.top_k, "top_p": request.top_p,
    }
    try:
        # A request that names another method without K gets that method's default K (`with_settings`).
        config = defaults.with_settings(**{name: value for name, value in requested.items() if value is not None})
    except ConfigError as exc:
        message = str(exc)
        param = next((p for prefix, p in _PARAMS.items() if message.startswith(prefix)), None)
        if "paths must be 1" in message or "needs paths >= 2" in message:  # K that the method cannot take
            param = "verispec.paths"
        if message.startswith("max_new_tokens"):
            message = "max_tokens" + message[len("max_new_tokens"):]
        raise APIError(400, message, param=param) from None
    include_usage = bool(request.stream_options and request.stream_options.include_usage)
    return Settings(config, stop, request.stream, include_usage, max_tokens is not None)


def _pick(value: Any, default: Any) -> Any:
    return default if value is None else value
