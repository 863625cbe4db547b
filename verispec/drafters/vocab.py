"""The reduced draft vocabulary: the N most frequent tokens of a fixed corpus, plus the special tokens.

A draft head over a subset S of the vocabulary computes N instead of V logits; q is the softmax over S, zero
elsewhere, so verification against it stays exact and only acceptance can drop (docs/algorithms.md §6.1). S comes
from a token-frequency ranking built once from a corpus every Python installation ships: the source files of the
Python standard library (code, comments and docstrings; `pydoc_data/topics.py` holds the language reference's
prose), never from evaluation prompts. The ranking is stored per tokenizer as package data (`data/<fingerprint>.npy`:
the token ids seen in the corpus, most frequent first, ties by id; a `.json` beside it says how it was built).

Build or rebuild the ranking for a tokenizer (a folder or hub id that AutoTokenizer loads):
    python -m verispec.drafters.vocab --tokenizer ~/.cache/verispec/converted/qwen2.5-coder-0.5b-instruct
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import sysconfig
from collections import Counter
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np

from verispec.errors import ConfigError

DATA_DIR = Path(__file__).parent / "data"
CORPUS = "the .py files of the Python standard library (sysconfig 'stdlib' path), sorted by path, test suites excluded"


def tokenizer_fingerprint(tokenizer: Any) -> str:
    """Return a sha256 of the tokenizer's token-to-id map: the ranking is valid for exactly that map."""
    items = sorted(tokenizer.get_vocab().items(), key=lambda item: item[1])
    return hashlib.sha256(json.dumps(items, ensure_ascii=False).encode()).hexdigest()


def special_token_ids(tokenizer: Any) -> list[int]:
    """Return the ids of the special and added tokens (EOS, chat-template markers): always in the subset."""
    ids = set(getattr(tokenizer, "all_special_ids", []) or [])
    ids.update(int(i) for i in (getattr(tokenizer, "added_tokens_decoder", None) or {}))
    return sorted(ids)


def corpus_files(stdlib: Path | None = None) -> list[Path]:
    """Return the corpus: the standard library's .py files outside its test suites, sorted (reproducible)."""
    root = Path(stdlib or sysconfig.get_paths()["stdlib"])
    skip = {"test", "tests", "idle_test", "site-packages", "dist-packages", "__pycache__"}
    return sorted(p for p in root.rglob("*.py") if not skip & set(p.relative_to(root).parts[:-1]))


def count_tokens(tokenizer: Any, texts: Iterable[str], batch: int = 256) -> Counter:
    """Return token id -> occurrences over `texts` (no special tokens added)."""
    counts: Counter = Counter()
    texts = list(texts)
    for start in range(0, len(texts), batch):
        for ids in tokenizer(texts[start : start + batch], add_special_tokens=False)["input_ids"]:
            counts.update(ids)
    return counts


def rank_tokens(counts: Counter) -> list[int]:
    """Return the counted token ids, most frequent first, ties broken by the smaller id."""
    return [token for token, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0]))]


def ranking_path(fingerprint: str) -> Path:
    """Return where the ranking of the tokenizer with `fingerprint` is stored."""
    return DATA_DIR / f"{fingerprint[:16]}.npy"


def load_ranking(tokenizer: Any) -> list[int]:
    """Return the shipped ranking for `tokenizer`; raise ConfigError when none was built for it."""
    path = ranking_path(tokenizer_fingerprint(tokenizer))
    if not path.is_file():
        raise ConfigError(f"no token-frequency ranking ships for this tokenizer ({type(tokenizer).__name__}, "
                          f"{len(tokenizer)} tokens): build one with `python -m verispec.drafters.vocab --tokenizer "
                          f"<model folder>`")
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


def build_ranking(tokenizer: Any, files: list[Path]) -> tuple[list[int], int]:
    """Return (ranking, tokens counted) over the text of `files`."""
    texts = [f.read_text(encoding="utf-8", errors="replace") for f in files]
    counts = count_tokens(tokenizer, texts)
    return rank_tokens(counts), sum(counts.values())


def main(argv: list[str] | None = None) -> int:
    """Build the ranking of a tokenizer from the standard-library corpus and store it as package data."""
    parser = argparse.ArgumentParser(prog="python -m verispec.drafters.vocab", description=main.__doc__)
    parser.add_argument("--tokenizer", required=True, help="a model folder or hub id AutoTokenizer loads")
    parser.add_argument("--out", default=str(DATA_DIR), help="where to write <fingerprint>.npy and .json")
    args = parser.parse_args(argv)
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    files = corpus_files()
    ranking, total = build_ranking(tokenizer, files)
    fingerprint = tokenizer_fingerprint(tokenizer)
    out = Path(args.out) / ranking_path(fingerprint).name
    out.parent.mkdir(parents=True, exist_ok=True)
    np.save(out, np.asarray(ranking, dtype=np.int32))
    meta = {"tokenizer": Path(args.tokenizer).name, "tokenizer_sha256": fingerprint, "vocab_size": len(tokenizer),
            "corpus": CORPUS, "python": sys.version.split()[0], "files": len(files), "tokens_counted": total,
            "distinct_tokens": len(ranking), "command": f"python -m verispec.drafters.vocab --tokenizer "
                                                         f"<folder of {Path(args.tokenizer).name}>"}
    out.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"{out}: {len(ranking)} distinct tokens ranked from {total} tokens in {len(files)} files")
    return 0


if __name__ == "__main__":
    sys.exit(main())
