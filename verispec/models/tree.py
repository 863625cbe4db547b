"""The ancestry of the positions in a KV cache, for tree attention.

The committed sequence is a chain (each position's parent is the one before it); a round of multi-path drafting
or verification appends a tree of candidate tokens after it. A token attends to its ancestors only, and its
position id is its depth, so that its logits equal those of a plain forward over its own path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch


@dataclass
class CacheTree:
    """Parent and depth of every cached position (parent -1: none)."""

    parents: list[int] = field(default_factory=list)
    depths: list[int] = field(default_factory=list)
    chain_length: int = 0  # positions [0, chain_length) form a chain: each is an ancestor of every later one

    @classmethod
    def chain(cls, length: int) -> CacheTree:
        """Return the tree of a plain sequence of `length` positions."""
        return cls(list(range(-1, length - 1)), list(range(length)), length)

    def extend_chain(self, n: int) -> None:
        """Append `n` positions continuing the sequence (a plain forward)."""
        assert self.chain_length == len(self.parents), "a plain forward needs a cache without an open tree"
        start = len(self.parents)
        self.parents.extend(range(start - 1, start + n - 1))
        self.depths.extend(range(start, start + n))
        self.chain_length += n

    def extend(self, parents: Sequence[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """Append positions with the given parents; return (attention mask [n, total] bool, depths [n] long)."""
        start, n = len(self.parents), len(parents)
        mask = torch.zeros(n, start + n, dtype=torch.bool)  # [n, cache + n]
        for j, parent in enumerate(parents):
            position = start + j
            assert -1 <= parent < position, f"parent {parent} of position {position} is not an earlier position"
            self.parents.append(parent)
            self.depths.append(self.depths[parent] + 1 if parent >= 0 else 0)
            mask[j, position] = True
            ancestor = parent
            while ancestor >= self.chain_length:  # walk up the (short) tree part
                mask[j, ancestor] = True
                ancestor = self.parents[ancestor]
            if ancestor >= 0:
                mask[j, : ancestor + 1] = True  # the chain up to the branching point
        if all(parent == start + j - 1 for j, parent in enumerate(parents)) and self.chain_length == start:
            self.chain_length += n  # the new positions merely continue the chain
        depths = torch.tensor(self.depths[start:], dtype=torch.long)
        return mask, depths

    def truncate(self, length: int) -> None:
        """Drop positions from `length` on."""
        del self.parents[length:], self.depths[length:]
        self.chain_length = min(self.chain_length, length)

    def check_chain(self, positions: Sequence[int]) -> None:
        """Assert that `positions` is a root-to-node path: each one's parent is the previous one."""
        previous = -1
        for position in positions:
            assert self.parents[position] == previous, f"position {position} does not continue the kept path"
            previous = position
