"""The reduced draft vocabulary: the N most frequent tokens of a fixed corpus, plus the special tokens.

A draft head over a subset S of the vocabulary computes N instead of V logits; q is the softmax over S, zero
elsewhere, so verification against it stays exact and only acceptance can drop (docs/algorithms.md §6.1). S comes
from a token-frequency ranking built once, never from evaluation prompts: the Python standard library's sources
(code), the `wordfreq` package's word-frequency lists (prose) and the draft's own answers to instructions written for
it (`verispec.drafters.vocab_answers`), mixed by mass (`verispec.drafters.vocab_ranking`, which also builds it).
The ranking is stored per tokenizer as package data (`data/<fingerprint>.npy`: token ids, best first; a `.json`
beside it says how it was built). This is the fixed part of S; the tokens of each decode's context join it there
(`verispec.models.reduced_head`).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from verispec.errors import ConfigError

DATA_DIR = Path(__file__).parent / "data"


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """Return a sha256 of the tokenizer's token-to-id map: the ranking is valid for exactly that map."""
    items = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return hashlib.sha256(json.dumps(items, ensure_ascii=False).encode()).hexdigest()


def special_token_ids(tokenizer: Any) -> list[int]:
    """Return the ids of the special and added tokens (EOS, chat-template markers): always in the subset."""
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    ids.update(int(i) for i in (getattr(tokenizer, "added_tokens_decoder", None) or {}))
    return sorted(ids)


def ranking_path(fingerprint: str) -> Path:
    """Return where the ranking of the tokenizer with `fingerprint` is stored."""
    return DATA_DIR / f"{fingerprint[:16]}.npy"


def load_ranking(tokenizer: Any) -> list[int]:
    """Return the shipped ranking for `tokenizer`; raise ConfigError when none was built for it."""
    path = ranking_path(tokenizer_fingerprint(tokenizer))
    if not path.is_file():
        raise ConfigError(f"no token-frequency ranking ships for this tokenizer ({type(tokenizer).__name__}, "
                          f"{len(tokenizer)} tokens): build one with `python -m verispec.drafters.vocab_cli build "
                          f"--tokenizer <model folder>`")
    return np.load(path).astype(np.int64).tolist()


def reduced_vocabulary(n: int, vocab_size: int, ranking: list[int], special_ids: Iterable[int]) -> list[int]:
    """Return the sorted ids of the reduced draft vocabulary: the special tokens, then the best-ranked tokens up to
    `n` in all. When the ranking is shorter than `n` (the corpus never used the rest), the remaining ids follow in
    ascending id order: byte-pair ids follow merge order, a rough frequency order of the tokenizer's own corpus."""
    if not isinstance(n, int) or isinstance(n, bool) or n < 2:
        raise ConfigError(f"draft_vocab (tokens of the reduced draft head) must be an integer >= 2, got {n!r}")
    if n > vocab_size:
        raise ConfigError(f"draft_vocab={n} exceeds the vocabulary ({vocab_size} tokens)")
    chosen = dict.fromkeys(t for t in special_ids if 0 <= t < vocab_size)
    if len(chosen) > n:
        raise ConfigError(f"draft_vocab={n} is smaller than the {len(chosen)} special tokens it must keep")
    for token in (*ranking, *range(vocab_size)):
        if len(chosen) == n:
            break
        if 0 <= token < vocab_size:
            chosen.setdefault(token)
    return sorted(chosen)


def draft_vocabulary(tokenizer: Any, n: int, vocab_size: int) -> list[int]:
    """Return the N token ids a reduced draft head covers for `tokenizer` (shipped ranking + special tokens)."""
    reduced_vocabulary(n, vocab_size, [], [])  # check n before reading the ranking
    return reduced_vocabulary(n, vocab_size, load_ranking(tokenizer), special_token_ids(tokenizer))
