"""Exact tabular models over a tiny vocabulary, for distribution tests.

`TabularLM.conditional(prefix)` is the closed-form next-token law after the whole token sequence `prefix`:
a Dirichlet-like draw seeded by (seed, prefix), so every prefix has its own context-dependent distribution and
the same prefix always has the same one. The model also implements `CausalLM`, so the real engine can run on it.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

import torch

from verispec.models.protocol import ForwardOutput, TreeCachedLM
from verispec.models.tree import CacheTree


class TabularLM(TreeCachedLM):
    """An autoregressive model whose conditionals are an explicit function of the prefix."""

    hidden_size = 1  # its hidden states are zeros, one per position: what SPRINTER's tests feed a verifier

    def __init__(self, vocab_size: int, seed: int, sharpness: float = 1.0, name: str = "tabular") -> None:
        assert vocab_size >= 2, "a tabular model needs at least 2 tokens"
        self.vocab_size = vocab_size
        self.seed = seed
        self.sharpness = sharpness  # exponent on the exponential draws: > 1 gives peakier conditionals
        self.name = name
        self._table: dict[tuple[int, ...], torch.Tensor] = {}
        self.reset()

    def conditional(self, prefix: Sequence[int]) -> torch.Tensor:
        """Return p(·|prefix) as a float64 tensor `[V]` (strictly positive, sums to 1)."""
        key = tuple(int(t) for t in prefix)
        if key not in self._table:
            digest = hashlib.blake2b(repr((self.seed, key)).encode(), digest_size=8).digest()
            gen = torch.Generator().manual_seed(int.from_bytes(digest, "little") >> 1)
            uniform = torch.rand(self.vocab_size, generator=gen, dtype=torch.float64).clamp_min(1e-12)
            weights = (-uniform.log()) ** self.sharpness
            self._table[key] = weights / weights.sum()
        return self._table[key]

    def sequence_prob(self, context: Sequence[int], continuation: Sequence[int]) -> float:
        """Return the probability of `continuation` after `context`."""
        prob, prefix = 1.0, list(context)
        for token in continuation:
            prob *= float(self.conditional(prefix)[token])
            prefix.append(int(token))
        return prob

    def _run(self, tokens: Sequence[int], n_logits: int, return_hidden: bool,
             tree: tuple[torch.Tensor, torch.Tensor] | None) -> ForwardOutput:
        """Append `tokens` to the token list (the 'cache'); return log-probabilities of the last `n_logits`, each
        the conditional after its own path in the tree."""
        self._tokens.extend(int(t) for t in tokens)
        end = len(self._tokens)
        rows = [self.conditional(self._path(position)).log() for position in range(end - n_logits, end)]
        logits = torch.stack(rows).float()
        return ForwardOutput(logits=logits, hidden=torch.zeros(n_logits, 1) if return_hidden else None)

    def _path(self, position: int) -> list[int]:
        """Return the tokens from the root to `position`, following the cache tree."""
        path = []
        while position >= 0:
            path.append(self._tokens[position])
            position = self._tree.parents[position]
        return path[::-1]

    def truncate(self, length: int) -> None:
        """Drop all but the first `length` tokens."""
        del self._tokens[length:]
        self._tree.truncate(length)

    def keep(self, positions: Sequence[int]) -> None:
        """Keep only the tokens at `positions` (a root-to-node path)."""
        self._tree.check_chain(positions)
        self._tokens = [self._tokens[i] for i in positions]
        self._tree = CacheTree.chain(len(self._tokens))

    def reset(self) -> None:
        """Empty the token list."""
        self._tokens = []
        self._tree = CacheTree.chain(0)
