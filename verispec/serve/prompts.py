"""Requests -> prompt token ids, and the context-length check.

Chat messages go through the tokenizer's chat template. A tokenizer without one (the tiny test models) gets the
messages' contents joined by newlines as raw text: one user message is then encoded exactly as
`verispec generate --no-chat-template` (and as `verispec generate` with such a tokenizer) encodes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from verispec.limits import context_length
from verispec.serve.schemas import APIError, Message


def chat_prompt_ids(tokenizer: Any, messages: Sequence[Message]) -> list[int]:
    """Return the ids of `messages` rendered for generation (the assistant's turn is next)."""
    if not messages:
        raise APIError(400, "messages must hold at least one message", param="messages")
    turns = [{"role": m.role, "content": m.text()} for m in messages]
    if not any(turn["content"].strip() for turn in turns):
        raise APIError(400, "the prompt is empty: the messages hold no text", param="messages")
    if getattr(tokenizer, "chat_template", None):
        ids = tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=True)
        if isinstance(ids, dict) or hasattr(ids, "input_ids"):  # some versions return a BatchEncoding
            ids = ids["input_ids"]
        return [int(t) for t in ids]
    return raw_prompt_ids(tokenizer, "\n".join(turn["content"] for turn in turns))


def raw_prompt_ids(tokenizer: Any, prompt: str | list[str]) -> list[int]:
    """Return the ids of a completion prompt (one string, or a list holding one), as raw text."""
    if isinstance(prompt, list):
        if len(prompt) != 1:
            raise APIError(400, f"prompt must be one string (a list of exactly one), got {len(prompt)}", param="prompt")
        prompt = prompt[0]
    if not prompt.strip():
        raise APIError(400, "the prompt is empty: give some text to continue", param="prompt")
    return [int(t) for t in tokenizer(prompt, add_special_tokens=False)["input_ids"]]


def context_limit(decoder: Any, config: Any) -> int | None:
    """Return the longest sequence (prompt + generated tokens) every model a decode with `config` (a DecodeConfig)
    runs accepts, or None."""
    limits = [n for n in map(context_length, decoder.models_for(config).values()) if n is not None]
    return min(limits) if limits else None


def fit_max_tokens(n_prompt: int, max_tokens: int, limit: int | None, given: bool) -> int:
    """Return the generation budget: `max_tokens` when prompt + max_tokens fits in `limit`, else a 400 saying the
    limit. A server default (`given` False) is shortened to the room left instead, as long as some is left."""
    if limit is None or n_prompt + max_tokens <= limit:
        return max_tokens
    if not given and n_prompt < limit:
        return limit - n_prompt
    raise APIError(
        400, f"this model's maximum context length is {limit} tokens; the prompt has {n_prompt} tokens and "
        f"max_tokens is {max_tokens if given else 'at least 1'} ({n_prompt + (max_tokens if given else 1)} in all)",
        param="max_tokens" if given else None,
    )
