"""Log-probabilities of emitted tokens (OpenAI's `logprobs` / `top_logprobs`), from the decoding model's rows.

Each emitted token is reported under the decoding model's processed law at its own position: the row its round
verified it against (row i of the kept path for its i-th token, the correction or bonus token included), after the
logit processors, temperature, top-k and top-p. Under a lossless method that is the law the token has, given the
tokens before it. At temperature 0 that law is a point mass (log-probabilities 0 and −inf), which says nothing, so
there the report is the log-softmax of the processed logits at temperature 1 (logit processors applied, no top-k /
top-p): the model's own distribution, as OpenAI reports it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

import torch

from verispec.processors import RowOffsets
from verispec.sampling import SamplingConfig, adjust_logits, process_logits


@dataclass
class TokenLogprob:
    """One emitted token's log-probability and the likeliest tokens at its position."""

    token: int
    # natural log of the token's probability at its position (−inf where it has none: a lossy rule kept a token
    # that top-k / top-p cut; JSON has no −inf, so a server writes a floor such as OpenAI's −9999 for it)
    logprob: float
    # the k likeliest tokens at the position and their log-probabilities, likeliest first (lowest id on ties);
    # tokens of probability 0 are left out, so at T > 0 with top-k / top-p the list may be shorter than k
    top: list[tuple[int, float]] = field(default_factory=list)


def log_laws(logits: torch.Tensor, sampling: SamplingConfig, offsets: RowOffsets | None = None) -> torch.Tensor:
    """Return the log-probabilities `[n, V]` (float64) reported for rows of `logits` `[n, V]` (see the module)."""
    if sampling.greedy:
        return torch.log_softmax(adjust_logits(logits, offsets).to(torch.float64), dim=-1)
    return process_logits(logits, sampling, offsets=offsets).log()


def token_logprobs(log_p: torch.Tensor, tokens: Sequence[int], k: int) -> list[TokenLogprob]:
    """Return each of `tokens` with its log-probability in its row of `log_p` `[n ≥ len(tokens), V]` and the `k`
    likeliest tokens of that row."""
    assert log_p.dim() == 2 and log_p.shape[0] >= len(tokens), f"need a row per token, got {tuple(log_p.shape)}"
    rows = log_p[: len(tokens)]
    chosen = rows.gather(1, torch.tensor(list(tokens), dtype=torch.long, device=rows.device).view(-1, 1))[:, 0]
    out = [TokenLogprob(int(token), float(value)) for token, value in zip(tokens, chosen.tolist(), strict=True)]
    if k > 0:
        kth = torch.topk(rows, min(k, rows.shape[1]), dim=-1).values[:, -1:]  # [n, 1]
        for entry, row, floor in zip(out, rows, kth, strict=True):
            # The tokens of probability > 0 at or above the k-th value (not a sort of the whole row), ordered by
            # value and then id, so that ties list the lowest id first whatever method reports the same row.
            ids = torch.nonzero((row >= floor) & (row > float("-inf"))).view(-1).tolist()
            ranked = sorted(zip(ids, row[ids].tolist(), strict=True), key=lambda pair: (-pair[1], pair[0]))
            entry.top = ranked[:k]
    return out
