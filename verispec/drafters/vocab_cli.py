"""The commands of the reduced draft head's token ranking (`verispec.drafters.vocab_ranking`): `build` it, let the
draft write its `answers` for it, report its `coverage`. Command-line code: `answers` decodes through
`verispec.Decoder`, which the ranking itself (below the decoder) must not import.

    pip install -r requirements/ranking.txt   # wordfreq, needed only to build
    python -m verispec.drafters.vocab_cli answers --out answer-mass.npy   # the draft answers (about 10 min)
    python -m verispec.drafters.vocab_cli build --answers answer-mass.npy --answers-share 0.75 \\
        --tokenizer ~/.cache/verispec/converted/qwen2.5-coder-0.5b-instruct

`coverage` reports which share of the tokens of some prompts (a JSON-lines file with "turns") lie in the top N.
"""

from __future__ import annotations

import argparse
import json
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

import numpy as np

from verispec.drafters import vocab_ranking
from verispec.drafters.vocab_ranking import (
    ANSWERS_SHARE,
    CODE_CORPUS,
    KEEP,
    PROSE_CORPUS,
    build_ranking,
    corpus_files,
    coverage,
)
from verispec.models.vocab import DATA_DIR, load_ranking, ranking_path, special_token_ids, tokenizer_fingerprint


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
            "languages": list(args.languages), "word_forms": dict(vocab_ranking.WORD_FORMS),
            "versions": {"python": sys.version.split()[0], **{p: package_version(p) for p in
                                                               ("wordfreq", "tokenizers", "transformers")}},
            "ranked_tokens": len(ranking),
            "command": f"python -m verispec.drafters.vocab_cli build --tokenizer <folder of {name}> "
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
            "command": f"python -m verispec.drafters.vocab_cli answers --linear-backend {args.linear_backend} "
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
    description = "Build the token-frequency ranking of the reduced draft head, or report its coverage."
    parser = argparse.ArgumentParser(prog="python -m verispec.drafters.vocab_cli", description=description)
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
