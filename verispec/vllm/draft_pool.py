"""Greedy drafts from a verispec draft model for the requests of a vLLM batch, each on a KV cache of its own.

vLLM's custom proposer is handed token ids only, and its rows move between steps as requests come and go, so a
cache cannot follow a row. Each cache (a `DraftCache`) remembers the tokens it holds instead, and a request's context
takes the cache that shares the longest prefix with it. After a step that is the same request's cache: it holds
the context up to the drafted tokens, so only what was committed since (the accepted drafts, vLLM's sampled token)
is fed again. A request with no such cache takes a new one while there are fewer than `capacity` (vLLM's
`max_num_seqs`), else the least recently used one, which then catches up from its common prefix.

Drafting runs in lock-step over the batch: depth 1 feeds each context's catch-up, each later depth one token per
request, and every depth's passes share one stacked call on verispec's kernels (`forward_together`). A drafted token
is the argmax of the draft's logits: a function of the context alone, so the point mass on it is its q, which is
what vLLM's rejection sampler assumes of a proposer that hands it no probabilities. A draft ends at the draft
model's end-of-sequence token.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import numpy as np

from verispec.models.batched import SlotLM, forward_together
from verispec.models.hf import HFCausalLM
from verispec.models.pair import eos_token_ids


@dataclass(eq=False)
class DraftCache:
    """One cache of the draft model and the tokens it holds."""

    slot: SlotLM
    tokens: list[int] = field(default_factory=list)
    used: int = 0  # the last call that drafted on it (least recently used goes first)


@dataclass(eq=False)
class Row:
    """One request being drafted this call."""

    cache: DraftCache
    feed: list[int]
    gamma: int
    draft: list[int] = field(default_factory=list)
    ended: bool = False  # drafted the draft model's end of sequence

    @property
    def drafting(self) -> bool:
        """Return whether the row drafts another token."""
        return len(self.draft) < self.gamma and not self.ended


def common_prefix(a: Sequence[int], b: Sequence[int]) -> int:
    """Return the length of the longest common prefix of `a` and `b`."""
    n = min(len(a), len(b))
    if n == 0:
        return 0
    differ = np.flatnonzero(np.asarray(a[:n]) != np.asarray(b[:n]))
    return int(differ[0]) if differ.size else n


class DraftPool:
    """Greedy drafts for many contexts at once on one loaded draft model (see the module's docstring).
    `vocab_size`: drafted ids stay below it (the target's vocabulary, where the draft's head is wider)."""

    def __init__(self, model: HFCausalLM, capacity: int, vocab_size: int | None = None) -> None:
        if capacity < 1:
            raise ValueError(f"need capacity >= 1 cache, got {capacity}")
        self.model, self.capacity = model, capacity
        self.vocab_size = min(model.vocab_size, vocab_size or model.vocab_size)
        self.eos = eos_token_ids(model)
        self.caches: list[DraftCache] = []
        self.calls = 0
        self.fed = 0  # tokens run through the draft model: catch-ups and drafts

    def draft(self, contexts: Sequence[Sequence[int]], gammas: Sequence[int]) -> list[list[int]]:
        """Return up to `gammas[i]` greedy draft tokens after each of `contexts` (one request each)."""
        self.calls += 1
        rows: list[Row | None] = [None] * len(contexts)
        wanted = [i for i, (ctx, gamma) in enumerate(zip(contexts, gammas, strict=True)) if gamma > 0 and ctx]
        for i, cache in self._assign([contexts[i] for i in wanted]).items():
            ctx = list(contexts[wanted[i]])
            keep = min(common_prefix(cache.tokens, ctx), len(ctx) - 1)  # feed one token at least: its logits
            cache.slot.truncate(keep)
            cache.tokens = ctx[:keep]
            cache.used = self.calls
            rows[wanted[i]] = Row(cache, ctx[keep:], int(gammas[wanted[i]]))
        live = [row for row in rows if row is not None]
        while live:
            outputs = forward_together([(row.cache.slot, row.feed) for row in live])
            for row, out in zip(live, outputs, strict=True):
                token = int(out.logits[-1, :self.vocab_size].argmax())
                self.fed += len(row.feed)
                row.cache.tokens += row.feed
                row.draft.append(token)
                row.feed = [token]
                row.ended = token in self.eos
            live = [row for row in live if row.drafting]
        return [row.draft if row is not None else [] for row in rows]

    def _assign(self, contexts: Sequence[Sequence[int]]) -> dict[int, DraftCache]:
        """Give each context a cache of its own: the longest common prefixes first, then new caches up to
        `capacity`, then the least recently used free ones (beyond `capacity` only when every cache is taken)."""
        pairs = sorted(((common_prefix(s.tokens, ctx), i, j) for i, ctx in enumerate(contexts)
                        for j, s in enumerate(self.caches)), key=lambda pair: -pair[0])
        taken: dict[int, DraftCache] = {}
        used: set[int] = set()
        for shared, i, j in pairs:
            if shared == 0:
                break
            if i not in taken and j not in used:
                taken[i] = self.caches[j]
                used.add(j)
        free = sorted((s for j, s in enumerate(self.caches) if j not in used), key=lambda s: s.used)
        for i in range(len(contexts)):
            if i in taken:
                continue
            if len(self.caches) < self.capacity or not free:
                cache = DraftCache(SlotLM(self.model, None))
                self.caches.append(cache)
            else:
                cache = free.pop(0)
            taken[i] = cache
        return taken
