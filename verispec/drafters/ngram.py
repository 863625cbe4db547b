"""Prompt lookup (n-gram) drafting: continue the longest recent suffix of the context that occurred before.

The context is the prompt plus the output so far. For n from ngram_max down to ngram_min, the last n tokens are
looked up among the earlier n-grams; the longest n that matches wins, and among its occurrences the most recent
one. The tokens that followed it (up to γ) are the draft, with q a point mass on each (docs/algorithms.md §6.1),
so the drafter costs no model forward. With K > 1 it proposes up to K distinct candidates: further occurrences of
the same n-gram, then of shorter ones, each truncated to the first candidate's length.
"""

from __future__ import annotations

from collections.abc import Sequence

from verispec.drafters.base import DraftRequest, empty_block, point_mass_block, round_length
from verispec.drafting import DraftBlock

# Occurrences of one n-gram examined per round when collecting K > 1 distinct candidates: bounds a round's cost on
# repetitive text (a frequent token can occur thousands of times, mostly with the same continuation).
MAX_OCCURRENCES_SCANNED = 64


class NgramIndex:
    """The end positions of every n-gram (ngram_min ≤ n ≤ ngram_max) of a growing token sequence.

    Only n-grams followed by at least one token are indexed (an n-gram ending at the last token has nothing to
    propose yet), so the current suffix never matches itself. The index grows incrementally: each new token adds
    at most (ngram_max − ngram_min + 1) entries, and a lookup costs O(ngram_max) plus the candidates it reads.
    """

    def __init__(self, ngram_min: int, ngram_max: int) -> None:
        assert 1 <= ngram_min <= ngram_max, f"need 1 <= ngram_min={ngram_min} <= ngram_max={ngram_max}"
        self.ngram_min, self.ngram_max = ngram_min, ngram_max
        self.tokens: list[int] = []
        self.ends: dict[tuple[int, ...], list[int]] = {}  # n-gram -> exclusive end positions, oldest first
        self._indexed = 0  # every n-gram ending at a position ≤ this one is indexed

    def extend(self, tokens: Sequence[int]) -> None:
        """Catch up with `tokens`, the sequence seen so far followed by new tokens."""
        assert len(tokens) >= len(self.tokens), "the indexed sequence only grows within a decode"
        self.tokens.extend(int(t) for t in tokens[len(self.tokens) :])
        for end in range(self._indexed + 1, len(self.tokens)):  # end < len: the token at `end` follows it
            for n in range(self.ngram_min, min(self.ngram_max, end) + 1):
                self.ends.setdefault(tuple(self.tokens[end - n : end]), []).append(end)
        self._indexed = max(self._indexed, len(self.tokens) - 1)

    def candidates(self, n_paths: int, gamma: int, eos_token_ids: frozenset[int] = frozenset()) -> list[list[int]]:
        """Return up to `n_paths` distinct continuations of equal length ≤ `gamma`; [] when no suffix matches.

        The first is what followed the most recent occurrence of the longest matching suffix; its length (γ, or
        less where that occurrence is recent, or where an EOS ends it) is the length of every candidate.
        """
        if gamma < 1 or n_paths < 1:
            return []
        length = len(self.tokens)
        found: list[list[int]] = []
        for n in range(min(self.ngram_max, length - 1), self.ngram_min - 1, -1):
            ends = self.ends.get(tuple(self.tokens[length - n :]), [])
            for end in reversed(ends[-MAX_OCCURRENCES_SCANNED:]):  # the most recent occurrence first
                continuation = self._continuation(end, gamma if not found else len(found[0]), eos_token_ids)
                if found and len(continuation) < len(found[0]):
                    continue  # too short to share the first candidate's length
                if continuation not in found:
                    found.append(continuation)
                if len(found) == n_paths:
                    return found
        return found

    def _continuation(self, end: int, gamma: int, eos_token_ids: frozenset[int]) -> list[int]:
        """Return the ≤ `gamma` tokens after position `end`, cut after an EOS (nothing after it can be kept)."""
        continuation = self.tokens[end : end + gamma]
        for i, token in enumerate(continuation):
            if token in eos_token_ids:
                return continuation[: i + 1]
        return continuation


class NgramDrafter:
    """Drafts by prompt lookup; a round without a match drafts nothing (a plain target step)."""

    name = "ngram"

    def __init__(self, ngram_min: int, ngram_max: int, gamma: int | None = None) -> None:
        self.index = NgramIndex(ngram_min, ngram_max)
        self.gamma = gamma  # the most tokens a round drafts; None: the request's gamma

    def propose(self, request: DraftRequest) -> DraftBlock:
        """Return the lookup candidates for `request.tokens` as a point-mass block (K ≤ request.n_paths), of at most
        `self.gamma` tokens (cut, as the request's gamma is, so that the round cannot pass max_new_tokens)."""
        self.index.extend(request.tokens)
        gamma = request.gamma
        if self.gamma is not None and request.gamma > 0:
            gamma = round_length(self.gamma, request.remaining)
        if request.lookup_gamma is not None:  # what the adaptive rule lets a lookup round cost
            gamma = min(gamma, request.lookup_gamma)
        paths = self.index.candidates(request.n_paths, gamma, request.eos_token_ids)
        if not paths:
            return empty_block(1, request.vocab_size, deterministic=True)
        return point_mass_block(paths, request.vocab_size, self.name, request.laws)
