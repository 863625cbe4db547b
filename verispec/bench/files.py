"""Results files: written atomically, checked for writability before a run starts, and read with a check of their
shape, so that a run stopped mid-write never leaves half a file and a wrong file is a one-line error."""

from __future__ import annotations

import gzip
import json
import os
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from verispec.errors import ConfigError, VerispecError
from verispec.models.manifest import scratch_file


def write_atomically(path: Path, data: str | bytes) -> None:
    """Write `data` (text or bytes) to `path` through a unique scratch file in the same folder, renamed over it, so
    a run stopped mid-write leaves the previous file whole (and two writers never share a scratch file)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, scratch = scratch_file(path)
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data if isinstance(data, bytes) else data.encode("utf-8"))
        os.replace(scratch, path)
    except BaseException:  # an error or Ctrl-C mid-write: the old file stays, the scratch file goes
        scratch.unlink(missing_ok=True)
        raise


def check_writable(path: str | Path, what: str = "the results file") -> None:
    """Raise ConfigError unless a file can be written at `path`: not a folder, and its folder exists (or can be
    created) and takes a new file. Meant to run before a long job, not after it."""
    path = Path(path)
    if path.is_dir():
        raise ConfigError(f"cannot write {what} {path}: it is a folder")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=path.parent):
            pass
    except OSError as exc:
        raise ConfigError(f"cannot write {what} {path}: {exc.strerror or exc}") from exc


def check_new_output(path: str | Path, what: str, may_replace: bool) -> None:
    """Raise ConfigError when `path` exists and may not be replaced; then check it is writable."""
    if Path(path).exists() and not may_replace:
        raise ConfigError(f"{what} {path} exists: pass --resume to continue it or --force to replace it")
    check_writable(path, what)


# What a results file's records hold for every reader: their prompt's index and id, and the method.
RECORD_FIELDS = {"prompt_index": int, "prompt_id": str, "method": str}
TEXT = ("prompt",)  # a results file's records carry the prompt's text
HASH = ("prompt_sha256",)  # an archive's carry the SHA-256 of that text instead
EITHER = TEXT + HASH


def results_shape_problem(results: Any, prompt_keys: tuple[str, ...] = (), aggregate: bool = False) -> str | None:
    """Return what is wrong with the shape of a results dict, or None: a mapping with a `config` mapping and a
    `records` list whose `RECORD_FIELDS` have their types and which carry one of `prompt_keys` (if any) as a string;
    with `aggregate`, an `aggregate` list of rows that name their method."""
    if not isinstance(results, dict):
        return f"a JSON object was expected, found {type(results).__name__}"
    for key, kind in (("config", dict), ("records", list), *((("aggregate", list),) if aggregate else ())):
        if not isinstance(results.get(key), kind):
            return f"its {key!r} is missing or not a {'mapping' if kind is dict else 'list'}"
    for i, row in enumerate(results.get("aggregate", []) if aggregate else []):
        if not isinstance(row, dict) or not isinstance(row.get("method"), str):
            return f"aggregate row {i} is not a mapping with a method"
    for i, record in enumerate(results["records"]):
        if not isinstance(record, dict):
            return f"record {i} is not a mapping"
        for key, kind in RECORD_FIELDS.items():
            if not isinstance(record.get(key), kind) or isinstance(record.get(key), bool):
                return f"record {i} has no {kind.__name__} {key!r}"
        if prompt_keys and not any(isinstance(record.get(key), str) for key in prompt_keys):
            return f"record {i} has no {' or '.join(repr(k) for k in prompt_keys)} text"
    return None


def check_results_shape(results: Any, source: str | Path, prompt_keys: tuple[str, ...] = (),
                        aggregate: bool = False) -> dict[str, Any]:
    """Return `results` when it has the shape of a results file (`results_shape_problem`); else raise ConfigError
    naming `source`."""
    problem = results_shape_problem(results, prompt_keys, aggregate)
    if problem:
        raise ConfigError(f"{source} is not a results file of `verispec bench`: {problem}")
    return results


GZIP_MAGIC = b"\x1f\x8b"


def read_results(path: str | Path, prompt_keys: tuple[str, ...] = (), aggregate: bool = False) -> dict[str, Any]:
    """Return the results dict in the JSON file at `path`, or in a `verispec archive` of one (gzipped; its records
    carry their prompts' SHA-256 in place of the text, which tables and reports do not need); raise ConfigError (one
    line) when it cannot be read, is not JSON or has the wrong shape (`results_shape_problem`)."""
    try:
        data = Path(path).read_bytes()
    except OSError as exc:
        raise ConfigError(f"cannot read results file {path}: {exc.strerror or exc}") from exc
    try:
        if data.startswith(GZIP_MAGIC):
            data = gzip.decompress(data)
        results = json.loads(data.decode("utf-8"))
    except (OSError, EOFError, zlib.error, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{path} is not a results file of `verispec bench`: {exc}") from exc
    return check_results_shape(results, path, prompt_keys, aggregate)


def results_stem(path: str | Path) -> Path:
    """`path` without its `.json` or `.json.gz` ending: where files derived from a results file go by default."""
    path = Path(path)
    for ending in (".json.gz", ".json"):
        if path.name.endswith(ending) and len(path.name) > len(ending):
            return path.with_name(path.name[: -len(ending)])
    return path.with_suffix("")


def shape_errors_named(source: str | Path, render: Callable[[], Any]) -> Any:
    """Return `render()`; a KeyError or TypeError (a field missing or of another type deep in a file that passed
    the shape check) becomes a ConfigError naming `source`, not a traceback."""
    try:
        return render()
    except VerispecError:
        raise
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise ConfigError(f"{source} is not a results file of `verispec bench` that this version reads: "
                          f"{type(exc).__name__} {exc}") from exc
