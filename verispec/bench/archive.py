"""Results archives: a benchmark's results file, compressed and without the prompts' text, to commit beside the code.

Full-size runs take hours and resume prompt by prompt (`verispec bench --resume`), so their results files must
outlive the machine that wrote them. A results file repeats every prompt's text in each of its records; committing
it would copy the prompt sets into the repository. An archive holds each record's `prompt_sha256` instead, and
unpacking reads the text back from the prompt source named in the file's `config` (by `prompt_id`) and checks it
against that hash, so an unpacked file is the original: `--resume` accepts it and every metric reads the same.

The gzip stream is written without a timestamp or file name, so packing the same results twice gives the same bytes
(no spurious diffs in git).
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
from pathlib import Path
from typing import Any

from verispec.bench.files import EITHER, HASH, check_results_shape, read_results, shape_errors_named, write_atomically
from verispec.errors import ConfigError
from verispec.prompt_sets import read_source


def prompt_hash(text: str) -> str:
    """Return the hex SHA-256 of a prompt's UTF-8 text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def strip_prompts(results: dict[str, Any]) -> dict[str, Any]:
    """Return a copy of `results` whose records carry `prompt_sha256` in place of the prompt's text."""
    records = []
    for record in results["records"]:
        stripped = {key: value for key, value in record.items() if key != "prompt"}
        stripped["prompt_sha256"] = prompt_hash(record["prompt"]) if "prompt" in record else record["prompt_sha256"]
        records.append(stripped)
    return {**results, "records": records}


def restore_prompts(archived: dict[str, Any]) -> dict[str, Any]:
    """Return a copy of an archived results dict with each record's prompt text read back from its prompt source.

    Raises ConfigError when the source lacks a record's prompt id or holds a different text under it."""
    source = archived["config"]["prompts"]
    texts = {prompt.id: prompt.text for prompt in read_source(source)}
    records = []
    for record in archived["records"]:
        text = texts.get(record["prompt_id"])
        if text is None:
            raise ConfigError(f"cannot unpack: the prompt source {source!r} has no prompt {record['prompt_id']!r}")
        if prompt_hash(text) != record["prompt_sha256"]:
            raise ConfigError(f"cannot unpack: prompt {record['prompt_id']!r} of {source!r} is not the text the "
                              f"results were measured on (its SHA-256 differs)")
        restored = {key: value for key, value in record.items() if key != "prompt_sha256"}
        restored["prompt"] = text
        records.append(restored)
    return {**archived, "records": records}


def pack(results_path: str | Path, archive_path: str | Path) -> None:
    """Write the archive of the results file at `results_path` to `archive_path` (a `.json.gz`)."""
    results = read_results(results_path, EITHER)
    shape_errors_named(results_path, lambda: write_archive(results, archive_path))


def write_archive(results: dict[str, Any], archive_path: str | Path) -> None:
    """Write the archive of a results dict (records with their prompts' text) to `archive_path`, atomically."""
    payload = json.dumps(strip_prompts(results), indent=1).encode("utf-8")
    compressed = io.BytesIO()
    with gzip.GzipFile(fileobj=compressed, mode="wb", filename="", mtime=0) as out:
        out.write(payload)
    # The archive is what outlives the machine: a run killed mid-write must leave the previous archive whole.
    write_atomically(Path(archive_path), compressed.getvalue())


def unpack(archive_path: str | Path, results_path: str | Path) -> None:
    """Write the results file that the archive at `archive_path` was packed from to `results_path`."""
    try:
        with gzip.open(archive_path, "rt", encoding="utf-8") as handle:
            archived = json.load(handle)
    except (OSError, EOFError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"cannot unpack {archive_path}: not a gzipped results archive ({exc})") from exc
    check_results_shape(archived, archive_path, HASH)
    if not isinstance(archived["config"].get("prompts"), str):
        raise ConfigError(f"cannot unpack {archive_path}: its config names no prompt source")
    restored = shape_errors_named(archive_path, lambda: restore_prompts(archived))
    write_atomically(Path(results_path), json.dumps(restored, indent=1))
