"""The drafter contract: what one round asks of a drafter and what it gets back (a `DraftBlock`).

A drafter proposes K paths of up to γ tokens and the exact distribution q each token was drawn from, so every
verifier's contract stays as it is (docs/algorithms.md §6.1). A deterministic drafter (n-gram lookup) draws from a
point mass: q is one-hot on its token, and its K candidates are fixed, not i.i.d. draws (`DraftBlock.deterministic`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import torch

from verispec.drafting import DraftBlock, StopRule
from verispec.processors import RoundProcessors
from verispec.sampling import KeyedNoise, SamplingConfig


@dataclass(frozen=True)
class DraftRequest:
    """What the decode loop gives a drafter each round."""

    tokens: list[int]  # the committed sequence: prompt + output so far
    n_paths: int  # K: the most paths the round may verify
    gamma: int  # the most tokens a path may hold (already cut so that the round cannot pass max_new_tokens)
    sampling: SamplingConfig  # how model logits become q
    generator: torch.Generator  # every draw of the decode
    eos_token_ids: frozenset[int]
    vocab_size: int  # V of the decoding model: q rows are [V]
    stop_rule: StopRule | None = None  # SPRINTER's learned verifier (model drafter only)
    keep_hidden: bool = False  # keep the draft model's hidden state behind each q (`DraftBlock.hiddens`; one path)
    remaining: int | None = None  # tokens the decode may still emit (None: not bounded); the hybrid's catch-up rule
    # the most tokens the draft model may draft this round (≤ gamma; None: gamma), set by an adaptive length rule
    # (`verispec.drafters.adaptive`); lookup rounds have their own
    model_gamma: int | None = None
    # the most tokens a lookup round may draft (≤ its drafter's most; None: that most), set by the adaptive rule
    lookup_gamma: int | None = None
    # the round's logit processors (logit_bias, penalties), applied to the draft model's logits as to the target's;
    # None: none set
    processors: RoundProcessors | None = None
    # keyed draws (`verispec.verify.keyed`): the draft model draws each token by a race on its position's noise;
    # None: from `generator`
    noise: KeyedNoise | None = None
    # how many sequences share the round's passes (a batched server's load, where the request's rounds may follow
    # it: `Engine.load`); 1: decoded alone. The hybrid's catch-up rule weighs a catch-up by it
    sequences: int = 1
    # whether the block must carry its laws q; False where the round's verifier matches tokens only (keyed draws,
    # greedy matching: `verispec.engine.matches_tokens`), so no float64 law is made of any drafted row
    laws: bool = True

    @property
    def model_length(self) -> int:
        """Return the most tokens the draft model may draft this round."""
        return self.gamma if self.model_gamma is None else min(self.gamma, self.model_gamma)


def round_length(length: int, remaining: int | None) -> int:
    """Return the most tokens a round may draft: `length`, cut so that the round (its drafted tokens plus the one
    the target adds) cannot emit more than the `remaining` tokens (None: unbounded). A rule on counts only, so it
    keeps every method lossless (docs/algorithms.md §1.4 "Variable γ")."""
    return length if remaining is None else max(0, min(length, remaining - 1))


class Drafter(Protocol):
    """Proposes the draft block of each round of one decode (a fresh drafter per decode)."""

    name: str

    def propose(self, request: DraftRequest) -> DraftBlock:
        """Return K ≥ 1 paths of equal length γ' ≤ request.gamma (γ' = 0: nothing drafted) and their q."""
        ...


def empty_block(n_paths: int, vocab_size: int, deterministic: bool = False) -> DraftBlock:
    """Return a block that drafts nothing: the round is a plain decoding step."""
    q = torch.empty(n_paths, 0, vocab_size, dtype=torch.float64)  # [K, 0, V]
    return DraftBlock([[] for _ in range(n_paths)], q, [[] for _ in range(n_paths)], 0, 0, drafter="none",
                      deterministic=deterministic)


def point_mass_block(paths: list[list[int]], vocab_size: int, drafter: str, laws: bool = True) -> DraftBlock:
    """Return a block of fixed candidate `paths` (equal lengths) whose q is a point mass on each drafted token
    (`laws` False: no q, for a verifier that matches tokens only)."""
    q = None
    if laws:
        tokens = torch.tensor(paths, dtype=torch.long).view(len(paths), -1)  # [K, γ']
        q = torch.zeros(*tokens.shape, vocab_size, dtype=torch.float64)  # [K, γ', V]
        q.scatter_(2, tokens.unsqueeze(-1), 1.0)
    return DraftBlock([list(p) for p in paths], q, [[] for _ in paths], 0, 0, drafter=drafter, deterministic=True)
