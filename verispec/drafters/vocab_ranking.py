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

    pip install -r requirements/ranking.txt   # wordfreq, needed only to build
    python -m verispec.drafters.vocab_ranking answers --out answer-mass.npy   # the draft answers (about 10 min)
    python -m verispec.drafters.vocab_ranking build --answers answer-mass.npy --answers-share 0.75 \
        --tokenizer ~/.cache/verispec/converted/qwen2.5-coder-0.5b-instruct

`coverage` reports which share of the tokens of some prompts (a JSON-lines file with "turns") lie in the top N.
"""

from __future__ import annotations

import argparse
import json
import sys
import sysconfig
from collections import Counter
from collections.abc import Iterable, Mapping
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

from verispec.drafters.vocab import (
    DATA_DIR,
    load_ranking,
    ranking_path,
    reduced_vocabulary,
    special_token_ids,
    tokenizer_fingerprint,
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


def package_version(name: str) -> str | None:
    """Return the installed version of distribution `name`, None when it is not installed."""
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def build(args: argparse.Namespace) -> int:
    """Build the ranking of a tokenizer from the standard library and wordfreq, and store it as package data."""
    import wordfreq
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    files = corpus_files()
    code = (f.read_text(encoding="utf-8", errors="replace") for f in files)
    word_freqs = {lang: wordfreq.get_frequency_dict(lang, wordlist="large") for lang in args.languages}
    answers, answers_meta = load_answer_mass(args.answers) if args.answers else ({}, None)
    share = args.answers_share if args.answers else 0.0
    ranking = build_ranking(tokenizer, code, word_freqs, keep=args.keep, answers=answers, answers_share=share)
    fingerprint = tokenizer_fingerprint(tokenizer)
    out = Path(args.out) / ranking_path(fingerprint).name
    out.parent.mkdir(parents=True, exist_ok=True)
    np.save(out, np.asarray(ranking, dtype=np.int32))
    name = Path(args.tokenizer).name
    meta = {"tokenizer": name, "tokenizer_sha256": fingerprint, "vocab_size": len(tokenizer),
            "mix": f"{share:g} of the mass the draft's answers, the rest 1/2 code, 1/2 prose split evenly over the "
                   f"languages; special and chat-template tokens first; ties by id",
            "code_corpus": CODE_CORPUS, "code_files": len(files), "prose_corpus": PROSE_CORPUS,
            "answers_corpus": answers_meta,
            "languages": list(args.languages), "word_forms": dict(WORD_FORMS),
            "versions": {"python": sys.version.split()[0], **{p: package_version(p) for p in
                                                               ("wordfreq", "tokenizers", "transformers")}},
            "ranked_tokens": len(ranking),
            "command": f"python -m verispec.drafters.vocab_ranking build --tokenizer <folder of {name}> "
                       f"--languages {' '.join(args.languages)} --keep {args.keep}"
                       + (f" --answers <answers .npy> --answers-share {share:g}" if args.answers else "")}
    out.with_suffix(".json").write_text(json.dumps(meta, indent=1, ensure_ascii=False) + "\n")
    print(f"{out}: {len(ranking)} tokens ranked ({len(files)} code files; prose: {', '.join(args.languages)})")
    return 0


def load_answer_mass(path: str) -> tuple[dict[int, float], dict[str, Any]]:
    """Return (token id -> mass, how it was made) from an `answers` .npy and the .json beside it."""
    mass = np.load(path)
    meta_path = Path(path).with_suffix(".json")
    meta = json.loads(meta_path.read_text()) if meta_path.is_file() else {}
    return {int(t): float(mass[t]) for t in np.flatnonzero(mass > 0)}, meta


def answers(args: argparse.Namespace) -> int:
    """Let the draft answer the ranking's instructions and store its expected token mass (.npy, .json beside):
    the draft's law at every answer position, or with `--weight acceptance` min(target's law, draft's law)."""
    from tqdm import tqdm

    from verispec.api import Decoder
    from verispec.drafters.vocab_answers import (
        acceptance_probs,
        answer_mass,
        ranking_instructions,
        teacher_forced_probs,
    )
    from verispec.models.pair import encode_prompt

    instructions = ranking_instructions(args.count, args.seed)
    decoder = Decoder(args.target, args.draft, linear_backend=args.linear_backend)
    draft = decoder.model("draft")
    acceptance = args.weight == "acceptance"
    if acceptance:
        target = decoder.model("target")

        def score(ids: list[int], n: int) -> Any:
            return acceptance_probs(target, draft, ids, n)
    else:
        def score(ids: list[int], n: int) -> Any:
            return teacher_forced_probs(draft, ids, n)
    settings = {"method": "draft", "max_new_tokens": args.max_new_tokens, "temperature": args.temperature}

    bar = tqdm(total=len(instructions), desc="draft answers", unit="answer")
    mass, positions = answer_mass(
        # one seed per answer, distinct across --seed values for any --count below 100,003
        lambda text, index: decoder.generate(text, seed=args.seed * 100_003 + index, **settings),
        score,
        lambda text: encode_prompt(draft.tokenizer, text, True), instructions,
        progress=lambda done, total: bar.update(1) or bar.set_postfix(positions=total))
    bar.close()
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    np.save(out, mass)
    meta = {"draft": args.draft or "default", "linear_backend": args.linear_backend, "weight": args.weight,
            **({"target": args.target or "default"} if acceptance else {}), "instructions": len(instructions),
            "instruction_seed": args.seed, "temperature": args.temperature, "max_new_tokens": args.max_new_tokens,
            "positions": positions, "source": "verispec.drafters.vocab_answers (templates written for the ranking; "
                                              "no evaluation prompts)",
            "command": f"python -m verispec.drafters.vocab_ranking answers --linear-backend {args.linear_backend} "
                       f"--count {args.count} --max-new-tokens {args.max_new_tokens} --temperature "
                       f"{args.temperature:g} --seed {args.seed}" + (f" --draft {args.draft}" if args.draft else "")
                       + (" --weight acceptance" + (f" --target {args.target}" if args.target else "")
                          if acceptance else "")}
    out.with_suffix(".json").write_text(json.dumps(meta, indent=1) + "\n")
    print(f"{out}: {'the acceptance' if acceptance else 'the draft'}'s expected token mass over {positions} answer "
          f"positions of {len(instructions)} instructions")
    return 0


def report_coverage(args: argparse.Namespace) -> int:
    """Print the share of the prompts' tokens inside the top-N set, for each N, per category and overall."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(args.tokenizer)
    ranking = np.load(args.ranking).astype(np.int64).tolist() if args.ranking else load_ranking(tokenizer)
    by_category: dict[str, list[int]] = {}
    for line in Path(args.prompts).read_text().splitlines():
        record = json.loads(line)
        ids = tokenizer("\n".join(record["turns"]), add_special_tokens=False)["input_ids"]
        by_category.setdefault(record.get("category", "all"), []).extend(ids)
    by_category["(all)"] = [t for ids in list(by_category.values()) for t in ids]
    for category, ids in by_category.items():
        shares = coverage(ranking, special_token_ids(tokenizer), ids, args.n, len(tokenizer))
        print(f"{category:16s} {len(ids):7d} tokens  " + "  ".join(f"N={n}: {s:.4f}" for n, s in shares.items()))
    return 0


def main(argv: list[str] | None = None) -> int:
    """Run `build` or `coverage`."""
    description = __doc__.split("\n")[0]
    parser = argparse.ArgumentParser(prog="python -m verispec.drafters.vocab_ranking", description=description)
    commands = parser.add_subparsers(dest="command", required=True)
    b = commands.add_parser("build", help=build.__doc__)
    b.add_argument("--tokenizer", required=True, help="a model folder or hub id AutoTokenizer loads")
    b.add_argument("--languages", nargs="+", default=["en"], help="wordfreq languages of the prose half")
    b.add_argument("--keep", type=int, default=KEEP, help="ranked ids to store (larger N fill up in id order)")
    b.add_argument("--out", default=str(DATA_DIR), help="where to write <fingerprint>.npy and .json")
    b.add_argument("--answers", help="the draft's answer mass (.npy written by `answers`) to mix in")
    b.add_argument("--answers-share", type=float, default=ANSWERS_SHARE,
                   help="its share of the mass (with --answers; default: the shipped ranking's)")
    a = commands.add_parser("answers", help=answers.__doc__)
    a.add_argument("--draft", help="the draft model (default: the embedded pair's)")
    a.add_argument("--linear-backend", default="int4", help="the models' linear backend")
    a.add_argument("--weight", choices=("draft", "acceptance"), default="draft",
                   help="what each answer position adds: the draft's law, or min(target's law, draft's law)")
    a.add_argument("--target", help="the target model of --weight acceptance (default: the embedded pair's)")
    a.add_argument("--count", type=int, default=200, help="instructions answered")
    a.add_argument("--max-new-tokens", type=int, default=192, help="tokens per answer at most")
    a.add_argument("--temperature", type=float, default=1.0, help="the answers' sampling temperature")
    a.add_argument("--seed", type=int, default=0, help="orders the instructions and seeds the answers")
    a.add_argument("--out", default="answer-mass.npy", help="where to write the mass (.npy; .json beside it)")
    c = commands.add_parser("coverage", help=report_coverage.__doc__)
    c.add_argument("--tokenizer", required=True, help="a model folder or hub id AutoTokenizer loads")
    c.add_argument("--prompts", required=True, help='a JSON-lines file of {"turns": [...], "category": ...}')
    c.add_argument("--ranking", help="a ranking .npy (default: the shipped one for the tokenizer)")
    c.add_argument("--n", type=int, nargs="+", default=[32768, 16384, 8192], help="sizes N of the draft head")
    args = parser.parse_args(argv)
    if args.command == "build" and args.answers and not 0.0 < args.answers_share <= 1.0:
        parser.error(f"--answers-share must lie in (0, 1], got {args.answers_share}")
    if args.command == "answers":
        from verispec.drafters.vocab_answers import ranking_instructions

        try:
            ranking_instructions(args.count, args.seed)  # a bad count fails before minutes of loading
        except ValueError as error:
            parser.error(f"--count: {error}")
        if args.target and args.weight != "acceptance":
            parser.error("--target is the target of --weight acceptance; add --weight acceptance or drop --target")
        if args.max_new_tokens < 1 or args.temperature < 0:
            parser.error("--max-new-tokens must be >= 1 and --temperature >= 0")
    return {"build": build, "answers": answers, "coverage": report_coverage}[args.command](args)


if __name__ == "__main__":
    sys.exit(main())
