"""The small model protocol the engine needs: a forward that appends to a KV cache, and rollback."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

import torch

from verispec.models.tree import CacheTree


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

    def forward(self, tokens: Sequence[int], n_logits: int = 1, return_hidden: bool = False,
                parents: Sequence[int] | None = None) -> ForwardOutput:
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


class TreeCachedLM:
    """The part of a `CausalLM` that tracks the cache's ancestry in a `CacheTree` (`self._tree`, which subclasses
    reset, truncate and rebuild with their own cache): the cache length, and a `forward` that records the new
    tokens in the tree before `_run` computes their outputs."""

    _tree: CacheTree

    @property
    def cache_length(self) -> int:
        """Return the number of tokens held in the cache."""
        return len(self._tree.parents)

    def forward(self, tokens: Sequence[int], n_logits: int = 1, return_hidden: bool = False,
                parents: Sequence[int] | None = None) -> ForwardOutput:
        """Run over `tokens` after the cached ones; return the last `n_logits` positions' outputs (`CausalLM`).

        With `parents` (absolute cache position of each new token's parent, -1 for none), the new tokens form a
        tree: each attends only to its ancestors, at position id = its depth (tree attention).
        """
        assert len(tokens) >= n_logits >= 1, f"need 1 <= n_logits={n_logits} <= len(tokens)={len(tokens)}"
        if parents is None:
            self._tree.extend_chain(len(tokens))
            return self._run(tokens, n_logits, return_hidden, None)
        return self._run(tokens, n_logits, return_hidden, self._tree.extend(parents))

    def _run(self, tokens: Sequence[int], n_logits: int, return_hidden: bool,
             tree: tuple[torch.Tensor, torch.Tensor] | None) -> ForwardOutput:
        """Compute the outputs of `tokens`, already recorded in the tree; `tree`: the new tokens' attention mask
        `[T, cache+T]` (bool) and depths `[T]` when they form a tree, None when they continue the sequence."""
        raise NotImplementedError
