"""Response bodies in the OpenAI formats: chat.completion(.chunk) and text_completion, plus the `verispec` block."""

from __future__ import annotations

import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from verispec.engine import DecodeConfig
from verispec.serve.logprobs import LOGPROB_FLOOR, Entry, TokenText
from verispec.trace import Trace


@dataclass(frozen=True)
class ResponseHeader:
    """What every body (or chunk) of one response repeats."""

    kind: str  # "chat" or "completion"
    model: str
    id: str = field(default_factory=lambda: uuid.uuid4().hex)
    created: int = field(default_factory=lambda: int(time.time()))

    def base(self, chunk: bool) -> dict[str, Any]:
        if self.kind == "chat":
            prefix, obj = "chatcmpl-", "chat.completion.chunk" if chunk else "chat.completion"
        else:
            prefix, obj = "cmpl-", "text_completion"
        return {"id": prefix + self.id, "object": obj, "created": self.created, "model": self.model}


def usage(prompt_tokens: int, completion_tokens: int) -> dict[str, int]:
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens}


def verispec_block(config: DecodeConfig, trace: Trace, timed_out: bool) -> dict[str, Any]:
    """Return the method and the round statistics of one generation."""
    return {
        "method": config.method,
        "drafter": config.drafter,
        "gamma": config.gamma,
        "paths": config.paths,
        "keyed_draws": config.keyed_draws,
        "rounds": len(trace.rounds),
        "drafted_tokens": sum(r.drafted for r in trace.rounds),
        "accepted_tokens": sum(r.accepted for r in trace.rounds),
        "acceptance_rate": trace.acceptance_rate,
        "tokens_per_target_call": trace.tokens_per_target_call,
        "target_calls": trace.target_calls,
        "draft_calls": trace.draft_calls,
        "decode_seconds": trace.time_total,
        "time_limit_reached": timed_out,
    }


def _finite(logprob: float) -> float:
    """Return `logprob` for JSON: −inf (and anything below the floor) as OpenAI's −9999."""
    return logprob if logprob > LOGPROB_FLOOR else LOGPROB_FLOOR


def _item(name: TokenText, logprob: float) -> dict[str, Any]:
    return {"token": name.text, "logprob": _finite(logprob), "bytes": name.bytes}


def logprobs_body(kind: str, entries: Sequence[Entry] | None) -> dict[str, Any] | None:
    """Return a choice's `logprobs` object for `entries` (None: not asked for, written as null).

    Chat: {"content": [{"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]}], "refusal"}.
    Completions (the legacy format): {"tokens", "token_logprobs", "top_logprobs": [{text: logprob}], "text_offset"},
    `text_offset` counting characters of the generated text (no prompt: this server does not echo it). Two
    alternatives with the same text (e.g. two partial characters, both U+FFFD) share a key there: the likelier stays.
    """
    if entries is None:
        return None
    if kind == "chat":
        content = [_item(e.token, e.logprob) | {"top_logprobs": [_item(n, lp) for n, lp in e.top]} for e in entries]
        return {"content": content, "refusal": None}
    top: list[dict[str, float]] = []
    for entry in entries:
        alternatives: dict[str, float] = {}
        for name, logprob in entry.top:  # likeliest first: setdefault keeps the likelier of a shared text
            alternatives.setdefault(name.text, _finite(logprob))
        top.append(alternatives)
    return {"tokens": [e.token.text for e in entries], "token_logprobs": [_finite(e.logprob) for e in entries],
            "top_logprobs": top, "text_offset": [e.offset for e in entries]}


def full_body(header: ResponseHeader, text: str, finish_reason: str, usage_: dict[str, int],
              stats: dict[str, Any], logprobs: Sequence[Entry] | None = None) -> dict[str, Any]:
    """Return a whole (non-streamed) response; `logprobs`: the entries of every kept token, or None (not asked)."""
    body = logprobs_body(header.kind, logprobs)
    if header.kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": text}, "logprobs": body,
                  "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text, "logprobs": body, "finish_reason": finish_reason}
    return header.base(chunk=False) | {"choices": [choice], "usage": usage_, "verispec": stats}


def chunk(header: ResponseHeader, text: str | None, finish_reason: str | None = None,
          first: bool = False, logprobs: Sequence[Entry] | None = None) -> dict[str, Any]:
    """Return one streamed chunk carrying `text` (and/or the finish reason), with the entries of its tokens."""
    body = logprobs_body(header.kind, logprobs)
    if header.kind == "chat":
        delta: dict[str, Any] = {"role": "assistant", "content": text or ""} if first else {}
        if text and not first:
            delta["content"] = text
        choice = {"index": 0, "delta": delta, "logprobs": body, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": body, "finish_reason": finish_reason}
    return header.base(chunk=True) | {"choices": [choice]}


def usage_chunk(header: ResponseHeader, usage_: dict[str, int], stats: dict[str, Any]) -> dict[str, Any]:
    """Return the last chunk of a stream asked for `stream_options.include_usage`: no choices, the usage."""
    return header.base(chunk=True) | {"choices": [], "usage": usage_, "verispec": stats}
