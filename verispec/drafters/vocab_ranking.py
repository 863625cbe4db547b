"""Build the token-frequency ranking of the reduced draft head from code, prose and the draft's own answers.

The ranking mixes up to three corpora by mass, so that no one of them decides the set alone (a chat model writes
prose around code, and code inside prose):
* **code**: the .py files of the Python standard library (code, comments, docstrings), counted token by token;
* **prose**: the word-frequency lists of the `wordfreq` package (English by default; each language gets an equal
  share of the prose mass). A word w of frequency f is counted as Qwen2's pre-tokenizer meets it in running text:
  " w" (share 0.75), " W" capitalised after a space (0.20: sentence starts, about one word in fifteen, and names,
  which the lower-cased lists fold in) and "W" at the start of a line (0.05), each tokenised and weighted f · share.
  wordfreq drops punctuation and splits numbers, so a short table of punctuation, digit, whitespace, Markdown and
  typographic strings adds them at typical rates per word (`PROSE_SYMBOLS`); they rank far above any cutoff, so
  the exact rates hardly matter.
* **the draft's answers** (optional, `--answers`): the draft's expected token mass over its own answers to
  instructions written for the ranking (`verispec.drafters.vocab_answers`), given `--answers-share` of the mass;
  code and prose share the rest equally. The shipped ranking gives it `ANSWERS_SHARE`.
Above them all come the special tokens and the tokens of the chat template, which every request contains. No
corpus is an evaluation prompt set. Ties rank by the smaller id; the result is deterministic for given inputs.

The commands that build it, with the draft's answers, and report its coverage: `verispec.drafters.vocab_cli`.
"""

from __future__ import annotations

import sysconfig
from collections import Counter
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from verispec.models.vocab import (
    reduced_vocabulary,
    special_token_ids,
)

CODE_CORPUS = ("the .py files of the Python standard library (sysconfig 'stdlib' path), sorted by path, test suites "
               "excluded")
PROSE_CORPUS = "wordfreq's 'large' word-frequency list of each language (data: CC-BY-SA 4.0, see wordfreq's README)"
# How a word of a lower-cased frequency list appears in running text: after a space (most words), capitalised after
# a space (sentence starts after ". ", names, titles), capitalised at the start of a line or message.
WORD_FORMS = ((" {w}", 0.75), (" {W}", 0.20), ("{W}", 0.05))
# Strings prose has besides words, with rough occurrences per word of English text (chat answers use Markdown).
PROSE_SYMBOLS = {
    ",": 0.05, ".": 0.04, ".\n": 0.005, ".\n\n": 0.005, "\n": 0.01, "\n\n": 0.005, "?": 0.003, "!": 0.002,
    ":": 0.003, ":\n": 0.002, ";": 0.001, " (": 0.002, ")": 0.002, " \"": 0.002, "\"": 0.002, "'": 0.001,
    " -": 0.001, "-": 0.002, " –": 0.001, " —": 0.001, "’s": 0.001, "’t": 0.001, " $": 0.001, "%": 0.001,
    "**": 0.002, "- ": 0.002, "### ": 0.001, "## ": 0.001, "1. ": 0.001, "2. ": 0.001, " `": 0.001, "`": 0.001,
    **{d: 0.002 for d in "0123456789"}, " 1": 0.001, " 2": 0.001, " ": 0.001,
    # typographic forms of edited text (web pages, news): curly quotes, dashes, currency, no-break space
    "’": 0.002, "“": 0.001, " “": 0.001, "”": 0.001, ".”": 0.001, ",”": 0.001, "’.": 0.0005, ".’": 0.0005,
    "–": 0.001, " £": 0.0005, " €": 0.0005, " ×": 0.0002, " μ": 0.0002, " °": 0.0002, "\u00a0": 0.001,
}
# The draft's answers' share of the mass in the shipped ranking: the best of 0.25 / 0.5 / 0.75 / 1 on Spec-Bench dev
# answers outside MT-Bench's categories (BENCHMARKS.md §9).
ANSWERS_SHARE = 0.75
# The ranking stops here: N beyond it takes the remaining ids in id order (`reduced_vocabulary`), and the file stays
# a few hundred KB.
KEEP = 65536


def corpus_files(stdlib: Path | None = None) -> list[Path]:
    """Return the code corpus: the standard library's .py files outside its test suites, sorted (reproducible)."""
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


def rank_tokens(counts: Mapping[int, float]) -> list[int]:
    """Return the counted token ids, most frequent first, ties broken by the smaller id."""
    return [token for token, _ in sorted(counts.items(), key=lambda item: (-item[1], item[0]))]


def weighted_counts(tokenizer: Any, weighted_texts: Mapping[str, float], batch: int = 4096) -> dict[int, float]:
    """Return token id -> Σ weight of the texts it occurs in (once per occurrence); texts are visited sorted."""
    counts: dict[int, float] = {}
    texts = sorted(weighted_texts)
    for start in range(0, len(texts), batch):
        chunk = texts[start : start + batch]
        for text, ids in zip(chunk, tokenizer(chunk, add_special_tokens=False)["input_ids"], strict=True):
            for token in ids:
                counts[token] = counts.get(token, 0.0) + weighted_texts[text]
    return counts


def prose_texts(word_freqs: Mapping[str, float]) -> dict[str, float]:
    """Return each running-text form of the words (`WORD_FORMS`) and of `PROSE_SYMBOLS` -> its weight per word."""
    texts: dict[str, float] = {}
    for word, freq in word_freqs.items():
        for form, share in WORD_FORMS:
            text = form.format(w=word, W=word[:1].upper() + word[1:])
            texts[text] = texts.get(text, 0.0) + freq * share
    total = sum(word_freqs.values())
    for symbol, rate in PROSE_SYMBOLS.items():
        texts[symbol] = texts.get(symbol, 0.0) + total * rate
    return texts


def normalised(counts: Mapping[int, float]) -> dict[int, float]:
    """Return the counts scaled to sum to 1 (an empty mapping stays empty)."""
    total = float(sum(counts.values()))
    return {token: c / total for token, c in counts.items()} if total else {}


def mix(parts: Iterable[tuple[Mapping[int, float], float]]) -> dict[int, float]:
    """Return Σ share · normalised(counts) over the (counts, share) parts."""
    mixed: dict[int, float] = {}
    for counts, share in parts:
        for token, mass in normalised(counts).items():
            mixed[token] = mixed.get(token, 0.0) + share * mass
    return mixed


def chat_template_ids(tokenizer: Any) -> list[int]:
    """Return the token ids of the chat template around an empty exchange (none without a template)."""
    if not getattr(tokenizer, "chat_template", None):
        return []
    messages = [{"role": "user", "content": ""}, {"role": "assistant", "content": ""}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=False)
    return sorted(set(tokenizer(text, add_special_tokens=False)["input_ids"]))


def build_ranking(tokenizer: Any, code_texts: Iterable[str], word_freqs: Mapping[str, Mapping[str, float]],
                  keep: int = KEEP, answers: Mapping[int, float] | None = None,
                  answers_share: float = 0.0) -> list[int]:
    """Return the ranking: the special and chat-template tokens (by id), then the tokens of the corpora mixed by
    mass (`mix`), at most `keep` ids. `answers`: the draft's expected token mass over its own answers
    (`verispec.drafters.vocab_answers`), given `answers_share` of the whole mass; code and prose share the rest
    equally (the prose part split evenly over the languages of `word_freqs`)."""
    if not 0.0 <= answers_share <= 1.0 or (answers_share > 0) != bool(answers):
        raise ValueError(f"answers_share must lie in [0, 1] and be > 0 exactly when answers are given, got "
                         f"{answers_share} with {'some' if answers else 'no'} answers")
    rest = 1.0 - answers_share
    prose = [(weighted_counts(tokenizer, prose_texts(freqs)), rest * 0.5 / len(word_freqs))
             for _, freqs in sorted(word_freqs.items())]
    mixed = mix([(count_tokens(tokenizer, code_texts), rest * (0.5 if prose else 1.0)), *prose,
                 *([(answers, answers_share)] if answers_share > 0 else [])])
    first = sorted(set(special_token_ids(tokenizer)) | set(chat_template_ids(tokenizer)))
    ranking = dict.fromkeys(first)
    ranking.update(dict.fromkeys(rank_tokens(mixed)))
    return list(ranking)[:keep]


def coverage(ranking: list[int], special_ids: Iterable[int], token_ids: Iterable[int], ns: Iterable[int],
             vocab_size: int) -> dict[int, float]:
    """Return N -> the share of `token_ids` inside the reduced vocabulary of N tokens."""
    tokens = list(token_ids)
    result = {}
    for n in ns:
        inside = set(reduced_vocabulary(n, vocab_size, ranking, special_ids))
        result[n] = sum(t in inside for t in tokens) / max(len(tokens), 1)
    return result
