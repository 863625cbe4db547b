"""The output layer of a reduced draft head: logits over a fixed token subset plus the tokens of the context.

A draft head over a subset S of the vocabulary computes |S| instead of V logits; q is the softmax over S, zero
elsewhere, and verification against it stays exact (docs/algorithms.md §6.1). A fixed S of the N most frequent
tokens misses what an answer copies from its prompt (names, identifiers, rare words): on the default pair's own
answers α fell 6 points at N = 32k and 10 at 16k. With `context`, S also holds every token the model has been fed
since its last reset (the prompt and the answer so far), at the cost of one small product per forward over those
few extra rows, and α stays within about 1-2 points of the full head (BENCHMARKS.md §9). S then depends only on the
model's input history, never on what the verifier does with q, so the rule is as lossless as with a fixed S.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F

from verispec.errors import ConfigError


class ReducedHead(torch.nn.Module):
    """`base`: an nn.Linear over the fixed token ids `base_ids` (sorted), sliced once from the full output layer; a CPU
    fast path packs it like any other linear. With `context`, `cover(tokens)` adds the full layer's rows of tokens
    outside the head (read from `full`'s weight: for a tied layer that is the input embedding, so nothing is
    copied up front) and `forward` appends their logits. `ids` names the token of each logit column."""

    def __init__(self, full: torch.nn.Linear, base_ids: Sequence[int], context: bool = True) -> None:
        super().__init__()
        ids = sorted({int(t) for t in base_ids})
        vocab_size = int(full.weight.shape[0])
        if len(ids) < 2 or ids[0] < 0 or ids[-1] >= vocab_size:
            raise ConfigError(f"a reduced head needs >= 2 distinct token ids in [0, {vocab_size}), got "
                              f"{len(ids)} in [{ids[0] if ids else None}, {ids[-1] if ids else None}]")
        if full.weight.shape[-1] == 0:
            raise ConfigError("the output layer is already packed; slice it before packing")
        weight, bias = full.weight.detach(), full.bias.detach() if full.bias is not None else None
        index = torch.tensor(ids, dtype=torch.long, device=weight.device)
        self.base = torch.nn.Linear(full.in_features, len(ids), bias=bias is not None, dtype=weight.dtype,
                                    device=weight.device)
        with torch.no_grad():
            self.base.weight.copy_(weight.index_select(0, index))
            if bias is not None:
                self.base.bias.copy_(bias.index_select(0, index))
        self.base_ids = index
        self.context = context
        # Plain attributes, not parameters: module traversals (fast paths, parameter counts) must not see them.
        self._rows, self._row_bias = (weight, bias) if context else (None, None)
        self._inside = torch.zeros(vocab_size, dtype=torch.bool)
        self._inside[ids] = True
        self._extra_ids = index.new_empty(0)
        self.clear()

    @property
    def weight(self) -> torch.Tensor:
        """The fixed subset's weight (what code reading the head's rows, dtype or device expects)."""
        return self.base.weight

    @property
    def ids(self) -> torch.Tensor:
        """`[N + m]` long: the token id of each logit column, the fixed subset first, then the context's."""
        return torch.cat([self.base_ids, self._extra_ids]) if len(self._extra_ids) else self.base_ids

    def clear(self) -> None:
        """Forget the context's tokens (a new sequence): the head is the fixed subset again."""
        self._inside[self._extra_ids.cpu()] = False
        self._extra_ids = self.base_ids.new_empty(0)
        self._extra = self.base.weight.new_empty(0, self.base.in_features)
        self._extra_bias = None if self._row_bias is None else self._row_bias.new_empty(0)

    def cover(self, tokens: Sequence[int]) -> torch.Tensor:
        """Add the tokens of one forward's input that the head lacks (none without `context`); return, for each
        added column (the last ones of `ids`), the input position where its token first occurs, for `causal`."""
        fed = torch.as_tensor(list(tokens), dtype=torch.long)
        if self._rows is None or len(fed) == 0:
            return fed.new_empty(0)
        unique, inverse = fed.unique(return_inverse=True)
        first = torch.full((len(unique),), len(fed), dtype=torch.long)
        first = first.scatter_reduce(0, inverse, torch.arange(len(fed)), reduce="amin")
        fresh = ~self._inside[unique]
        new, first = unique[fresh], first[fresh]
        if len(new):
            self._inside[new] = True
            index = new.to(self._rows.device)  # the rows, base_ids and extra ids share the layer's device
            self._extra_ids = torch.cat([self._extra_ids, index])
            self._extra = torch.cat([self._extra, self._rows.index_select(0, index)])
            if self._row_bias is not None:
                self._extra_bias = torch.cat([self._extra_bias, self._row_bias.index_select(0, index)])
        return first

    @staticmethod
    def causal(logits: torch.Tensor, first: torch.Tensor, fed: int) -> torch.Tensor:
        """Set to -inf, in `logits` [n, N + m] of the last n of `fed` input positions, each column added by this
        forward (`first`: where its token first occurs) on the rows before that position: a position's head covers
        the tokens up to its own, whatever else shares its forward."""
        if len(first) == 0:
            return logits
        rows = torch.arange(fed - logits.shape[0], fed).unsqueeze(1)  # [n, 1]: each row's input position
        hidden = rows < first.unsqueeze(0)  # [n, fresh]
        logits[:, logits.shape[1] - len(first):].masked_fill_(hidden.to(logits.device), float("-inf"))
        return logits

    def forward(self, hidden: torch.Tensor) -> torch.Tensor:
        """Logits `[..., N + m]` of the columns `ids`."""
        logits = self.base(hidden)
        if len(self._extra_ids) == 0:
            return logits
        return torch.cat([logits, F.linear(hidden, self._extra, self._extra_bias).to(logits.dtype)], dim=-1)
