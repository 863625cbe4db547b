"""OpenAI's logit processors: `logit_bias` and the presence and frequency penalties, as additive logit offsets.

For a row whose context has generated token t `c[t]` times (the tokens generated in this request, not the prompt):

    logit'[t] = logit[t] + bias[t] − presence · 1[c[t] > 0] − frequency · c[t]

(OpenAI's formula), before temperature, top-k and top-p. Both models' rows get the same offsets at every position,
and a speculative row's counts include the drafted tokens before it (the same prefix for p and q), so that p is the
target's law of plain autoregressive decoding with the same processors and every lossless rule stays lossless
(docs/algorithms.md §0, "Logit processors").

`LogitProcessors.of(config)` is None when nothing is set: the decode then never builds an offset (no overhead).
"""

from __future__ import annotations

import math
import numbers
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from verispec.errors import ConfigError
from verispec.sampling import first_argmax

MAX_LOGIT_BIAS = 100.0  # |bias| ≤ 100, as OpenAI: ±100 bans or forces a token in practice
MAX_PENALTY = 2.0  # presence and frequency penalties lie in [−2, 2], as OpenAI's
MAX_TOP_LOGPROBS = 20  # the most alternatives a position may report, as OpenAI's top_logprobs


def _number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def check_logit_bias(value: Any) -> dict[int, float] | None:
    """Return `value` (a mapping token id -> bias in [−100, 100]; ids may be decimal strings, as JSON gives them) as a
    dict of int ids sorted by id, None when it is None or empty; raise ConfigError naming what is wrong."""
    if value is None:
        return None
    if not isinstance(value, Mapping):
        raise ConfigError(f"logit_bias must map token ids to biases in [-100, 100], got {value!r}",
                          field="logit_bias")
    bias: dict[int, float] = {}
    for key, amount in value.items():
        token = key
        if isinstance(key, str) and key.strip().isdigit():  # JSON object keys are strings
            token = int(key)
        elif isinstance(key, numbers.Integral) and not isinstance(key, bool):  # numpy and torch integers too
            token = int(key)
        if not isinstance(token, int) or isinstance(token, bool) or token < 0:
            raise ConfigError(f"logit_bias: token ids must be integers >= 0, got {key!r}", field="logit_bias")
        if not _number(amount) or not -MAX_LOGIT_BIAS <= amount <= MAX_LOGIT_BIAS:
            raise ConfigError(f"logit_bias: the bias of token {token} must be a number in [-100, 100], got {amount!r}",
                              field="logit_bias")
        if token in bias:
            raise ConfigError(f"logit_bias: token {token} is given twice", field="logit_bias")
        bias[token] = float(amount)
    return dict(sorted(bias.items())) or None


def check_penalty(name: str, value: Any) -> None:
    """Raise ConfigError unless `value` (the setting `name`) is a number in [−2, 2]."""
    if not _number(value) or not -MAX_PENALTY <= value <= MAX_PENALTY:
        raise ConfigError(f"{name} must be a number in [-2, 2] (0 = off), got {value!r}", field=name)


def check_logprobs(value: Any) -> None:
    """Raise ConfigError unless `value` is None (off) or an integer k in [0, 20] (the k likeliest tokens)."""
    if value is not None and (not isinstance(value, int) or isinstance(value, bool)
                              or not 0 <= value <= MAX_TOP_LOGPROBS):
        raise ConfigError(f"logprobs (the alternatives reported per token) must be an integer in [0, "
                          f"{MAX_TOP_LOGPROBS}], or None for no log-probabilities, got {value!r}", field="logprobs")


@dataclass(frozen=True)
class LogitProcessors:
    """The processors of one decode (validated by `DecodeConfig`)."""

    logit_bias: Mapping[int, float]  # token id -> bias added to its logit
    presence_penalty: float  # subtracted once from every token generated so far
    frequency_penalty: float  # subtracted per occurrence of a token generated so far

    @classmethod
    def of(cls, config: Any) -> LogitProcessors | None:
        """Return the processors a DecodeConfig `config` sets, None when it sets none."""
        bias = config.logit_bias or {}
        if not bias and config.presence_penalty == 0.0 and config.frequency_penalty == 0.0:
            return None
        return cls(bias, float(config.presence_penalty), float(config.frequency_penalty))

    def check_vocab(self, vocab_size: int) -> None:
        """Raise ConfigError when a biased token id is outside a vocabulary of `vocab_size` tokens."""
        outside = [token for token in self.logit_bias if token >= vocab_size]
        if outside:
            raise ConfigError(f"logit_bias: token id {outside[0]} is outside the vocabulary ({vocab_size} tokens)",
                              field="logit_bias")

    def at(self, counts: Mapping[int, int]) -> RoundProcessors:
        """Return the processors of a round whose committed output holds token t `counts[t]` times."""
        return RoundProcessors(self, counts)


class RoundProcessors:
    """The processors at one round: the counts of the tokens generated before it, copied (the decode goes on
    counting while the round's laws may still be computed)."""

    def __init__(self, processors: LogitProcessors, counts: Mapping[int, int]) -> None:
        self.processors = processors
        # Without penalties the offsets are the bias alone, the same in every row: no counting.
        self.penalised = processors.presence_penalty != 0.0 or processors.frequency_penalty != 0.0
        self.counts = {token: n for token, n in counts.items() if n} if self.penalised else {}
        # Every column a row of this round offsets whatever its prefix: biased or generated tokens.
        self._base = set(processors.logit_bias) | set(self.counts)
        self._columns = sorted(self._base)

    def rows(self, prefixes: Sequence[Sequence[int]]) -> RowOffsets:
        """Return the offsets of rows whose contexts end with the drafted tokens `prefixes[r]` (the tokens between
        the committed output and row r's position: [] for the round's first position)."""
        extra = {token for prefix in prefixes for token in prefix} - self._base if self.penalised else set()
        columns = sorted(self._base | extra) if extra else self._columns
        index = {token: j for j, token in enumerate(columns)}
        base = torch.tensor([float(self.counts.get(token, 0)) for token in columns], dtype=torch.float64)
        counts = base.expand(len(prefixes), len(columns)).clone()  # [R, U]
        cells = [(r, index[token]) for r, prefix in enumerate(prefixes) for token in prefix] if self.penalised else []
        if cells:
            where = torch.tensor(cells, dtype=torch.long).T
            counts.index_put_((where[0], where[1]), torch.ones(len(cells), dtype=torch.float64), accumulate=True)
        bias = torch.tensor([self.processors.logit_bias.get(token, 0.0) for token in columns], dtype=torch.float64)
        # One formula for every row, whatever share of its counts the prefix holds: a speculative row's offsets are
        # bit for bit those autoregressive decoding computes at the same context.
        values = (bias - self.processors.presence_penalty * (counts > 0).to(torch.float64)
                  - self.processors.frequency_penalty * counts)
        return RowOffsets(torch.tensor(columns, dtype=torch.long), values)


@dataclass(frozen=True)
class RowOffsets:
    """What the processors add to the logits of R rows: `values[r, j]` at column `columns[j]`."""

    columns: torch.Tensor  # [U] long: the token ids offset in some row (distinct)
    values: torch.Tensor  # [R, U] float64

    def apply(self, logits: torch.Tensor) -> torch.Tensor:
        """Return `logits` `[..., V]` (R rows in all; not modified) as float64 with the offsets added."""
        rows = logits.reshape(-1, logits.shape[-1])
        assert rows.shape[0] == self.values.shape[0], (
            f"offsets for {self.values.shape[0]} rows applied to {rows.shape[0]}")
        adjusted = rows.to(torch.float64, copy=True)
        if self.columns.numel():
            adjusted.index_add_(1, self.columns.to(adjusted.device), self.values.to(adjusted.device))
        return adjusted.view(logits.shape)

    def argmax(self, logits: torch.Tensor) -> torch.Tensor:
        """Return `first_argmax` of `apply(logits)`, `[..., 1]` long, without the float64 copy of every row: the
        adjusted argmax is the best of the offset columns and of the best column that no offset touches (lowest id
        on ties, as over the whole row). Greedy decoding takes one per drafted token and per verified row."""
        rows = logits.reshape(-1, logits.shape[-1])
        best = first_argmax(rows)  # [R, 1] of the rows as they are
        if not self.columns.numel():
            return best.view(*logits.shape[:-1], 1)
        columns = self.columns.to(rows.device)
        touched = set(self.columns.tolist())
        offset = rows.index_select(1, columns).to(torch.float64) + self.values.to(rows.device)  # [R, U]
        # The lowest column no offset touches: the untouched argmax of a row whose untouched columns are all −inf.
        first_free = next((token for token in range(rows.shape[1]) if token not in touched), None)
        chosen = []
        for r in range(rows.shape[0]):
            untouched = int(best[r])
            if untouched in touched:  # the row's own argmax is offset: find the best column no offset touches
                masked = rows[r].clone()
                masked[columns] = -math.inf
                untouched = int(first_argmax(masked.unsqueeze(0))[0])
                if untouched in touched:  # every untouched column is −inf (or there is none)
                    untouched = first_free
            values, ids = offset[r], columns
            if untouched is not None:
                values = torch.cat([rows[r, untouched : untouched + 1].to(torch.float64), values])
                ids = torch.cat([torch.tensor([untouched], device=columns.device), ids])
            chosen.append(int(ids[values == values.max()].min()))
        return torch.tensor(chosen, dtype=torch.long, device=logits.device).view(*logits.shape[:-1], 1)

    def select(self, rows: Sequence[int]) -> RowOffsets:
        """Return the offsets of the rows `rows` only."""
        return RowOffsets(self.columns, self.values[list(rows)])


def tree_prefixes(tokens: Sequence[int], parents: Sequence[int]) -> list[list[int]]:
    """Return the drafted prefix of each row of a tree pass, `[N+1]`: [] at the root, then for node j the tokens on
    the path from the root to j, j included (`verispec.drafting.PrefixTree`: `parents[j]` < j, −1 at the root)."""
    prefixes: list[list[int]] = [[]]
    for token, parent in zip(tokens, parents, strict=True):
        prefixes.append(prefixes[parent + 1] + [token])
    return prefixes
