"""Logits -> the distribution actually sampled from (temperature, top-k, top-p), and seeded sampling.

Draft and target logits go through the same `process_logits`, and verification always sees these processed
distributions (docs/algorithms.md §0: "verification must use exactly the distributions that were sampled"). The
logit processors (logit_bias, presence and frequency penalties, `verispec.processors`) come first, as offsets that
`process_logits` adds before temperature, top-k and top-p, so that both models' rows take them the same way.
Probabilities are float64: the verification rules divide and subtract them, and the vocabularies are small
enough (γ+1 rows) that the extra precision costs nothing measurable.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
import torch

from verispec.errors import ConfigError

if TYPE_CHECKING:
    from verispec.processors import RowOffsets


@dataclass(frozen=True)
class SamplingConfig:
    """How a model's logits become the distribution that is sampled from."""

    temperature: float = 0.0  # 0 = greedy: a point mass on the argmax (lowest token id on ties)
    top_k: int = 0  # keep the k largest logits (ties at the k-th value kept); 0 = off
    top_p: float = 1.0  # nucleus: smallest set of tokens whose mass reaches top_p; 1 = off

    def __post_init__(self) -> None:
        if not isinstance(self.temperature, (int, float)) or math.isnan(self.temperature) or self.temperature < 0:
            raise ConfigError(f"temperature must be a number >= 0 (0 = greedy), got {self.temperature!r}",
                              field="temperature")
        if math.isinf(self.temperature):
            raise ConfigError("temperature must be finite", field="temperature")
        if not isinstance(self.top_k, int) or isinstance(self.top_k, bool) or self.top_k < 0:
            raise ConfigError(f"top_k must be an integer >= 0 (0 = off), got {self.top_k!r}", field="top_k")
        if not isinstance(self.top_p, (int, float)) or not (0.0 < self.top_p <= 1.0):
            raise ConfigError(f"top_p must be in (0, 1], got {self.top_p!r}", field="top_p")

    @property
    def greedy(self) -> bool:
        """Whether sampling is a deterministic argmax."""
        return self.temperature == 0.0


def softmax_rows(logits: torch.Tensor, out: torch.Tensor | None = None, overwrite: bool = False) -> torch.Tensor:
    """Return softmax over the last dimension of `logits`, in their dtype (in `out` when given; with `overwrite`,
    `logits` may be overwritten and returned instead, else they are not modified).

    torch.softmax splits its work by rows, so one row (what GBV processes at a time, and a drafter per drafted token)
    runs on one thread: a 151,936-token float64 row took 0.27 ms, against 0.17 ms for elementwise passes that run on
    both threads of a 2-core machine. For several rows torch.softmax is the faster (0.20 against 0.24 ms per row).
    """
    if logits.shape[:-1].numel() != 1:
        return torch.softmax(logits, dim=-1) if out is None else out.copy_(torch.softmax(logits, dim=-1))
    peak = logits.amax(dim=-1, keepdim=True)
    probs = logits.sub_(peak) if overwrite else torch.sub(logits, peak, out=out)
    probs.exp_()
    return probs.div_(probs.sum(dim=-1, keepdim=True))


def process_logits(logits: torch.Tensor, config: SamplingConfig, out: torch.Tensor | None = None,
                   offsets: RowOffsets | None = None) -> torch.Tensor:
    """Return the float64 probabilities sampled from, for logits `[..., V]` (rows sum to 1); written into `out`
    (float64, of the logits' shape) and returned as it, when given. `offsets`: the logit processors' offsets of
    these rows (`verispec.processors`), added before everything else; None: no processor is set."""
    probs = _process_logits(logits, config, out, offsets)
    if out is not None and probs.data_ptr() != out.data_ptr():
        out.copy_(probs)
        return out
    return probs


def adjust_logits(logits: torch.Tensor, offsets: RowOffsets | None) -> torch.Tensor:
    """Return `logits` `[..., V]` with the processors' `offsets` added (float64), or as they are when None."""
    return logits if offsets is None else offsets.apply(logits)


def _process_logits(logits: torch.Tensor, config: SamplingConfig, out: torch.Tensor | None,
                    offsets: RowOffsets | None) -> torch.Tensor:
    if config.greedy:
        # A point mass: the verification rules then reduce to "accept iff the argmaxes agree". The argmax is taken
        # on the logits as they come (widening to float64 is exact, so it is the same index), without a float64
        # copy of them: 0.26 against 1.26 ms per 151,936-token row, once per drafted token and verified row. With
        # processors, `RowOffsets.argmax` keeps that: it widens only the offset columns.
        probs = torch.zeros(logits.shape, dtype=torch.float64, device=logits.device)
        probs.scatter_(-1, greedy_tokens(logits, offsets), 1.0)
        return probs
    adjusted = adjust_logits(logits, offsets)
    # One float64 copy of the rows, which every step below overwrites: `out` itself where it will hold the law (a
    # drafted row's q), so that a row makes no other tensor of the vocabulary's size (each one a fresh allocation
    # whose pages the round then touches first: about 0.5 ms of a drafted row's 1.2 ms, measured in decodes).
    direct = out is not None and config.top_p == 1.0
    scaled = out.copy_(adjusted) if direct else adjusted.to(torch.float64, copy=True)
    if config.temperature != 1.0:
        scaled.div_(config.temperature)
    # Dividing by T < 1 can overflow a finite logit (T ≈ 1e-320), and inf - inf would make softmax NaN; division
    # keeps infinities and NaNs as they are, so an overflow shows as fewer finite entries (counted: cheaper than
    # selecting the finite ones). Shifting the row max to 0 first gives the T -> 0 limit of the tempered law
    # exactly: all mass on the maxima.
    if config.temperature < 1.0 and int(torch.isfinite(scaled).sum()) != int(torch.isfinite(adjusted).sum()):
        widened = adjusted.to(torch.float64)
        scaled.copy_((widened - widened.max(dim=-1, keepdim=True).values) / config.temperature)
    if config.top_k and config.top_k < scaled.shape[-1]:
        kth = torch.topk(scaled, config.top_k, dim=-1).values[..., -1:]
        scaled.masked_fill_(scaled < kth, -math.inf)
    probs = softmax_rows(scaled, overwrite=True)
    if config.top_p < 1.0:
        sorted_probs, order = torch.sort(probs, dim=-1, descending=True)
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        # Keep a token while the mass strictly before it is below top_p: the token that crosses top_p stays.
        drop_sorted = mass_before >= config.top_p
        drop = torch.zeros_like(drop_sorted).scatter(-1, order, drop_sorted)
        probs = probs.masked_fill(drop, 0.0)
        probs = probs / probs.sum(dim=-1, keepdim=True)
    return probs


def first_argmax(rows: torch.Tensor) -> torch.Tensor:
    """Return the index of each row's largest value, the lowest on ties, `[..., 1]` long, for `rows` `[..., V]`.

    On the CPU through numpy's argmax (the same first-maximum rule): 0.01 ms per 151,936-token float32 row against
    0.2 ms for torch's, and a greedy decode takes one per drafted token and per verified row."""
    if rows.device.type == "cpu" and rows.dtype in (torch.float32, torch.float64):
        return torch.as_tensor(np.asarray(np.argmax(rows.detach().numpy(), axis=-1)), dtype=torch.long).unsqueeze(-1)
    return rows.argmax(dim=-1, keepdim=True)


def greedy_tokens(logits: torch.Tensor, offsets: RowOffsets | None = None) -> torch.Tensor:
    """Return the token greedy sampling takes from each row of `logits` `[..., V]`, `[..., 1]` long: the first
    argmax with the processors' `offsets` added (`RowOffsets.argmax`: no float64 copy of the rows), where the
    point mass `process_logits` makes at T = 0 puts all its mass."""
    return first_argmax(logits) if offsets is None else offsets.argmax(logits)


def draw(probs: torch.Tensor, config: SamplingConfig, generator: torch.Generator | None = None) -> int:
    """Return the token drawn from `probs` `[V]`, a law `process_logits(..., config)` returned: under greedy
    sampling its point mass's token, with no random draw; otherwise `sample`."""
    if config.greedy:
        return int(first_argmax(probs)[0])
    return sample(probs, generator)


def sample(probs: torch.Tensor, generator: torch.Generator | None = None) -> int:
    """Return one index drawn from `probs` `[V]` (non-negative weights, normalised here) with the given generator.

    By the inverse of the float64 cumulative sum at one uniform draw: the index i with
    cumsum[i-1] <= u * total < cumsum[i], so an index of zero weight is never drawn. Why not torch.multinomial: it
    draws one exponential per entry, 3.5 ms per call over a 151,936-token vocabulary on one thread against about
    0.3 ms here, and a decode draws once per target round and once per drafted token.
    """
    weights = probs.reshape(-1).to(torch.float64)
    cumulative = weights.cumsum(0)
    total = cumulative[-1]
    if not bool(torch.isfinite(total)) or not total > 0 or bool(weights.min() < 0):
        raise ValueError("cannot sample: the weights must be finite, >= 0 and not all 0")
    u = torch.rand(1, dtype=torch.float64, generator=generator) * total
    index = int(torch.searchsorted(cumulative, u, right=True))
    if index >= weights.numel():  # u rounded up to the total: the last index with weight
        index = int(torch.nonzero(weights)[-1])
    return index


def race_scores(logits: torch.Tensor, config: SamplingConfig, offsets: RowOffsets | None = None) -> torch.Tensor:
    """Return the log-weights `[..., V]` float64 a keyed race reads for `logits` (the processors' `offsets` added
    first): the log of `process_logits`'s law up to a constant per row, -inf where the law is 0.

    Why not the law: a race only compares tokens, so with temperature alone (the usual T > 0 case) the weights are
    the logits shifted to a row maximum of 0 and divided by T (the T -> 0 limit kept, as there), three passes over
    the row where a float64 softmax takes six and a law's race two more. Top-k and top-p cut the law itself: its
    log is taken."""
    if config.top_k or config.top_p < 1.0:
        return process_logits(logits, config, offsets=offsets).log()
    widened = adjust_logits(logits, offsets).to(torch.float64)
    scores = widened - widened.amax(dim=-1, keepdim=True)
    return scores if config.temperature == 1.0 else scores.div_(config.temperature)


def race(scores: torch.Tensor, gumbel: torch.Tensor) -> int:
    """Return argmax_v scores[v] + G[v] for log-weights `scores` `[V]` (`race_scores`, or a law's log) and `gumbel`
    = G `[V]` (finite): a token of weight 0 (-inf) is never chosen, and the choice is distributed as the normalised
    weights when G is i.i.d. standard Gumbel (the exponential race argmax_v w[v] / E[v], E = exp(-G), in logs)."""
    total = np.add(scores.detach().to("cpu", torch.float64).numpy(), gumbel.numpy())
    return int(np.argmax(total))  # numpy's argmax: 0.01 ms a 151,936-token row against torch's 0.2


class KeyedNoise:
    """The noise of keyed draws (`verispec.verify.keyed`): at each position t of a decode, G_t(v) = -log E_t(v) for
    every token v, E_t i.i.d. Exp(1) and a fixed function of (seed, t), so that a seed gives the same tokens whatever
    the method, the drafter, the draft length or the batch.

    Each row comes from numpy's PCG64 seeded with the pair (seed, t), its full 64 bits each (torch's CPU generator
    keeps only 32 bits of a seed, so positions could share noise), as uniforms u, E = -log(1 - u) and G = -log E (a
    standard Gumbel: races add it to log-weights, `race`). A row costs about 1 ms for 151,936 tokens; the rows a
    round drafts on are the rows it verifies on, so they are kept until `forget` drops the positions the decode has
    passed."""

    def __init__(self, seed: int, vocab_size: int) -> None:
        self.seed, self.vocab_size = int(seed), int(vocab_size)
        self._rows: dict[int, torch.Tensor] = {}

    def row(self, position: int) -> torch.Tensor:
        """Return G_position `[V]` float64 (finite: E is kept above 1e-300)."""
        row = self._rows.get(position)
        if row is None:
            uniform = np.random.Generator(np.random.PCG64([self.seed, position])).random(self.vocab_size)
            noise = np.log1p(-uniform, out=uniform)
            np.negative(noise, out=noise)
            np.maximum(noise, 1e-300, out=noise)
            np.log(noise, out=noise)
            row = self._rows[position] = torch.from_numpy(np.negative(noise, out=noise))
        return row

    def rows(self, start: int, count: int) -> list[torch.Tensor]:
        """Return the rows of positions start..start+count-1 (the cached tensors, not a stacked copy)."""
        return [self.row(start + i) for i in range(count)]

    def choose(self, logits: torch.Tensor, position: int, config: SamplingConfig,
               offsets: RowOffsets | None = None) -> int:
        """Return the token a keyed draw takes from `logits` `[V]` (with the processors' `offsets` of that row) at
        `position`: under greedy sampling the first argmax, with no noise; otherwise the race on this position's
        row over the log-weights of the law `process_logits` would give."""
        if config.greedy:
            return int(greedy_tokens(logits, offsets)[0])
        return race(race_scores(logits, config, offsets).view(-1), self.row(position))

    def forget(self, before: int) -> None:
        """Drop the rows of positions before `before` (a decode's committed tokens never need noise again)."""
        for position in [p for p in self._rows if p < before]:
            del self._rows[position]
