"""Requests -> prompt token ids, and the checks that a request fits: its prompt, context, memory and logit bias.

Chat messages go through the tokenizer's chat template. A tokenizer without one (the tiny test models) gets the
messages' contents joined by newlines as raw text: one user message is then encoded exactly as
`verispec generate --no-chat-template` (and as `verispec generate` with such a tokenizer) encodes it.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from verispec.engine import DecodeConfig
from verispec.errors import ConfigError
from verispec.methods import get_method
from verispec.processors import LogitProcessors
from verispec.serve import bounds
from verispec.serve.schemas import ROLES, APIError, Message, error_param


def chat_prompt_ids(tokenizer: Any, messages: Sequence[Message]) -> list[int]:
    """Return the ids of `messages` rendered for generation (the assistant's turn is next)."""
    if not messages:
        raise APIError(400, "messages must hold at least one message", param="messages")
    turns = [{"role": ROLES[m.role], "content": m.text()} for m in messages]
    if not any(turn["content"].strip() for turn in turns):
        raise APIError(400, "the prompt is empty: the messages hold no text", param="messages")
    if getattr(tokenizer, "chat_template", None):
        from jinja2 import TemplateError

        try:
            ids = tokenizer.apply_chat_template(turns, add_generation_prompt=True, tokenize=True)
        except TemplateError as exc:  # templates refuse what they cannot render, e.g. roles out of turn
            raise APIError(400, f"the model's chat template refused the messages: {exc}", param="messages") from None
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
    limits = [m.context_length for m in decoder.models_for(config).values() if m.context_length is not None]
    return min(limits) if limits else None


def check_prompt_size(texts: Sequence[str], limit: int, param: str) -> None:
    """Raise APIError 400 when a prompt (the `texts` of its messages, or of the prompt: `param`) cannot fit `limit`
    tokens whatever its tokens: more messages than tokens, or more than `bounds.MAX_CHARS_PER_TOKEN` characters per
    token. Checked before tokenizing, which would take seconds for text that is refused anyway."""
    if param == "messages" and len(texts) > limit:
        raise APIError(400, f"{len(texts)} messages cannot fit a context of {limit} tokens", param=param)
    chars, most = sum(map(len, texts)), limit * bounds.MAX_CHARS_PER_TOKEN
    if chars > most:
        raise APIError(400, f"the prompt has {chars} characters; a context of {limit} tokens takes at most {most} "
                       f"({bounds.MAX_CHARS_PER_TOKEN} per token)", param=param)


def check_memory(decoder: Any, config: DecodeConfig, n_prompt: int, n_context: int, given: str) -> None:
    """Raise APIError 400 when the decode `config` asks for (`n_prompt` tokens read, `n_context` positions in all)
    needs more than `bounds.MEMORY_SHARE` of the memory free now, by `bounds.request_bytes`'s estimate. `given`:
    the request field to name when the request set neither paths nor gamma (max_tokens, or None)."""
    models = decoder.models_for(config).values()
    need = bounds.request_bytes(map(bounds.model_shape, models), config, n_prompt, n_context)
    free = bounds.available_bytes({model.device for model in models})
    if free is None or need <= bounds.MEMORY_SHARE * free:
        return
    param = "verispec.paths" if config.paths > 1 else "verispec.gamma" if bounds.draft_length(config) > 1 else given
    raise APIError(400, f"this request would need about {bounds.gib(need)} of memory (paths {config.paths}, draft "
                   f"length {bounds.draft_length(config)}, {n_context} positions); a request may take at most "
                   f"{bounds.MEMORY_SHARE:.0%} of the {bounds.gib(free)} free: lower {param or 'the prompt length'}",
                   param=param)


def fit_max_tokens(n_prompt: int, max_tokens: int, limit: int | None, given: bool, stated: bool = True) -> int:
    """Return the generation budget: `max_tokens` when prompt + max_tokens fits in `limit`, else a 400 saying the
    limit. A server default (`given` False) is shortened to the room left instead, as long as some is left.
    `stated` False: the models state no context and `limit` is the server's own bound."""
    if limit is None or n_prompt + max_tokens <= limit:
        return max_tokens
    if not given and n_prompt < limit:
        return limit - n_prompt
    whose = "this model's maximum context length" if stated else "the longest sequence this server decodes"
    raise APIError(
        400, f"{whose} is {limit} tokens; the prompt has {n_prompt} tokens and "
        f"max_tokens is {max_tokens if given else 'at least 1'} ({n_prompt + (max_tokens if given else 1)} in all)",
        param="max_tokens" if given else None,
    )


def check_logit_bias(decoder: Any, config: DecodeConfig) -> None:
    """Raise APIError 400 naming logit_bias when a biased token id is outside the vocabulary of the model that
    decodes with `config`: checked before the request waits in the queue (the engine checks again when it decodes)."""
    processors = LogitProcessors.of(config)
    if processors is None:
        return
    model = decoder.models_for(config)[get_method(config.method).decoder]
    try:
        processors.check_vocab(model.vocab_size)
    except ConfigError as exc:
        raise APIError(400, str(exc), param=error_param(exc)) from None
