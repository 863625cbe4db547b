"""The small model protocol the engine needs: a forward that appends to a KV cache, and rollback."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch


@dataclass
class ForwardOutput:
    """What one forward over new tokens returns (all on the CPU)."""

    # [n_logits, V] next-token logits at the last n_logits new positions; float32 (float64 for float64 models)
    logits: torch.Tensor
    hidden: torch.Tensor | None = None  # [n_logits, H] last-layer hidden states at those positions, if asked


@runtime_checkable
class CausalLM(Protocol):
    """A causal language model with an internal KV cache of `cache_length` tokens.

    `forward(tokens)` runs the model over `tokens` as a continuation of the cached ones and appends them to the
    cache; `truncate(n)` rolls the cache back to its first n tokens; `keep(positions)` keeps one path of a tree.
    Rollback is exact: after truncate(n) and a re-feed, the logits equal those of a fresh forward over the same
    sequence.
    """

    name: str
    vocab_size: int

    @property
    def cache_length(self) -> int:
        """Return the number of tokens held in the KV cache."""
        ...

    def forward(
        self,
        tokens: Sequence[int],
        n_logits: int = 1,
        return_hidden: bool = False,
        parents: Sequence[int] | None = None,
    ) -> ForwardOutput:
        """Run over `tokens` (appending them to the cache); return the last `n_logits` positions' outputs.

        `parents` (optional): the absolute cache position of each new token's parent; the new tokens then form a
        tree and each one sees only its ancestors (tree attention). Without it they continue the sequence.
        """
        ...

    def keep(self, positions: Sequence[int]) -> None:
        """Keep only the cache entries at `positions`, a root-to-node path (tree rollback)."""
        ...

    def truncate(self, length: int) -> None:
        """Roll the cache back to its first `length` tokens (no-op if it holds no more)."""
        ...

    def reset(self) -> None:
        """Empty the cache."""
        ...
