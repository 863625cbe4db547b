"""Context length: a decode needs prompt + max_new_tokens positions, and a model has only so many.

Beyond them a model does not fail loudly: rotary positions past the trained range give garbage, or a long prompt
runs for minutes first. So the decode is refused before it starts, with both numbers and the limit.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from verispec.errors import ConfigError

if TYPE_CHECKING:  # the protocol lies in a layer above this check
    from verispec.models.protocol import CausalLM


def check_context(prompt_len: int, max_new_tokens: int, target: CausalLM | None = None,
                  draft: CausalLM | None = None) -> None:
    """Raise ConfigError when `prompt_len + max_new_tokens` positions exceed the context of the target or the draft
    (either may be None: not used; a model whose `context_length` is None states no limit); the message names both
    numbers, their sum and the limit."""
    needed = prompt_len + max_new_tokens
    for role, model in (("target", target), ("draft", draft)):
        limit = model.context_length if model is not None else None
        if limit is not None and needed > limit:
            name = model.name
            raise ConfigError(
                f"the prompt has {prompt_len} tokens and max_new_tokens {max_new_tokens}: {needed} positions, beyond "
                f"the {role} model's context of {limit} ({name}); shorten the prompt or lower --max-new-tokens"
            )
