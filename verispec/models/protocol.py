"""The small model protocol the engine needs: a forward that appends to a KV cache, and rollback; and what the
rest of verispec reads of a model (its context, hidden width, kernels, reduced head, thread pool), with the defaults
a backend that has none of these inherits from `ModelDefaults`."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

import torch

from verispec.models.openmp import forward_threads
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
    sequence. The data members below describe the model; `ModelDefaults` gives each a default.
    """

    name: str
    vocab_size: int  # V: the width of the logits every forward returns
    context_length: int | None  # positions the model handles (the pre-flight check's limit); None: it does not say
    hidden_size: int | None  # H of the hidden states `forward(return_hidden=True)` returns; None: it returns none
    dtype: torch.dtype  # its weights' and KV cache's dtype (the server's memory bound counts the cache in it)
    device: torch.device  # where it computes (logits always come back on the CPU)
    config: Any  # its transformers config (layer and head counts: FLOPs, memory bounds), None when unknown
    tokenizer: Any  # its Hugging Face tokenizer, None for a model without one
    generation_config: Any  # its transformers generation config (EOS ids beside the tokenizer's), None when unknown
    linear_backend: str  # the `--linear-backend` in effect ("torch": transformers' own; "llama.cpp": llama.cpp's)
    linear_kernel: str  # what runs its linears, as the outputs report it
    decoder_loop: str | None  # which decoder loop runs a transformers model; None: not a transformers model
    # forwards over more than this many tokens run other kernels than decode passes (the quantized paths' prompt
    # attention, and prompt copies where the host makes them), so the engine reads a prompt apart from a block
    # drafted on top of it; None: the same kernels at every length
    prompt_rows: int | None
    vocab_ids: torch.Tensor | None  # [N] long, sorted: the fixed token ids of a reduced head; None: the full head
    draft_vocab: int | None  # N of a reduced head, None for the full head
    own_thread_pool: bool  # computes on a thread pool of its own, not torch's (`verispec.models.threads`)

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


class ModelDefaults:
    """The `CausalLM` data members' defaults, for a backend without them: no stated context or hidden states, CPU
    float32, torch's threads, transformers' linears untouched, the full vocabulary. A backend inherits this and
    overrides what it knows (as attributes or properties)."""

    context_length: int | None = None
    hidden_size: int | None = None
    dtype: torch.dtype = torch.float32
    device: torch.device = torch.device("cpu")
    config: Any = None
    tokenizer: Any = None
    generation_config: Any = None
    linear_backend: str = "torch"
    linear_kernel: str = "the backend's own"
    decoder_loop: str | None = None
    prompt_rows: int | None = None
    vocab_ids: torch.Tensor | None = None
    draft_vocab: int | None = None
    own_thread_pool: bool = False


class TreeCachedLM(ModelDefaults):
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
            tree = None
        else:
            tree = self._tree.extend(parents)
        # torch's threads for a torch model's forward (verispec.models.openmp); a model with a pool of its own
        # leaves torch on the round's one thread
        with nullcontext() if self.own_thread_pool else forward_threads():
            return self._run(tokens, n_logits, return_hidden, tree)

    def _run(self, tokens: Sequence[int], n_logits: int, return_hidden: bool,
             tree: tuple[torch.Tensor, torch.Tensor] | None) -> ForwardOutput:
        """Compute the outputs of `tokens`, already recorded in the tree; `tree`: the new tokens' attention mask
        `[T, cache+T]` (bool) and depths `[T]` when they form a tree, None when they continue the sequence."""
        raise NotImplementedError
