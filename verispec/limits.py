"""Context length: a decode needs prompt + max_new_tokens positions, and a model has only so many.

Beyond them a model does not fail loudly: rotary positions past the trained range give garbage, or a long prompt
runs for minutes first. So the decode is refused before it starts, with both numbers and the limit.
"""

from __future__ import annotations

from typing import Any

from verispec.errors import ConfigError


def context_length(model: Any) -> int | None:
    """Return how many positions `model` handles (its config's `max_position_embeddings`, or its own
    `context_length`), or None when it does not say."""
    own = getattr(model, "context_length", None)
    if isinstance(own, int):
        return own
    config = getattr(getattr(model, "model", None), "config", None)
    positions = getattr(config, "max_position_embeddings", None)
    return positions if isinstance(positions, int) and positions > 0 else None


def check_context(prompt_len: int, max_new_tokens: int, target: Any = None, draft: Any = None) -> None:
    """Raise ConfigError when `prompt_len + max_new_tokens` positions exceed the context of the target or the draft
    (either may be None: not used); the message names both numbers, their sum and the limit."""
    needed = prompt_len + max_new_tokens
    for role, model in (("target", target), ("draft", draft)):
        limit = context_length(model) if model is not None else None
        if limit is not None and needed > limit:
            name = getattr(model, "name", role)
            raise ConfigError(
                f"the prompt has {prompt_len} tokens and max_new_tokens {max_new_tokens}: {needed} positions, beyond "
                f"the {role} model's context of {limit} ({name}); shorten the prompt or lower --max-new-tokens"
            )
