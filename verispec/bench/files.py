"""Results files: written atomically, checked for writability before a run starts, and read with a check of their
shape, so that a run stopped mid-write never leaves half a file and a wrong file is a one-line error.

A write that fails (a full disk, a quota, an I/O error) leaves the previous file as it was, removes its scratch
file, and raises `ResultsWriteError`: one line naming the file, the error and the room left on its filesystem.
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import shutil
import tempfile
import zlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from verispec.errors import ConfigError, VerispecError
from verispec.models.manifest import scratch_file


class ResultsWriteError(VerispecError, OSError):
    """A results file (or its archive, report) could not be written; what was written before is kept."""

    def __str__(self) -> str:  # the message as written: OSError's own would be "[Errno N] strerror: filename"
        return str(self.args[0]) if self.args else ""


def _free_space(path: Path) -> str:
    """Return ", 1.2 MB free on the filesystem mounted at M" for the filesystem that holds `path` ("" if
    unknown)."""
    folder = path.parent.resolve()
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    mount = folder
    while not os.path.ismount(mount) and mount != mount.parent:
        mount = mount.parent
    try:
        free = shutil.disk_usage(folder).free
    except OSError:
        return ""
    size = next(f"{free / scale:.1f} {unit}" for scale, unit in ((1e9, "GB"), (1e6, "MB"), (1e3, "kB"), (1, "bytes"))
                if free >= scale or scale == 1)
    return f", {size} free on the filesystem mounted at {mount}"


def write_failure(path: Path, exc: OSError, what: str | None = None) -> ResultsWriteError:
    """Return the one-line error for `exc` raised while writing `what` (e.g. "the results file") at `path`: the
    file, the system's words for the error and its symbol (ENOSPC, EDQUOT, EIO...), and the room left there."""
    symbol = errno.errorcode.get(exc.errno or 0)
    reason = f"{exc.strerror or exc}{f' ({symbol})' if symbol else ''}"
    error = ResultsWriteError(f"cannot write {f'{what} ' if what else ''}{path}: {reason}{_free_space(path)}")
    error.errno, error.strerror, error.filename = exc.errno, exc.strerror, str(path)
    return error


def _write_all(fd: int, data: bytes) -> None:
    """Write all of `data` to the descriptor `fd`: os.write may write part of it (a disk filling up)."""
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


def write_atomically(path: Path, data: str | bytes, what: str | None = None) -> None:
    """Write `data` (text or bytes) to `path` through a unique scratch file in the same folder, flushed to the disk
    and renamed over it, so a run stopped mid-write leaves the previous file whole (and two writers never share a
    scratch file). An OSError (a full disk...) removes the scratch file and becomes a `ResultsWriteError` naming
    `what` at `path`."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, scratch = scratch_file(path)
    except OSError as exc:
        raise write_failure(path, exc, what) from exc
    try:
        try:
            _write_all(fd, data if isinstance(data, bytes) else data.encode("utf-8"))
            # Some filesystems (NFS, quotas, delayed allocation) report a full disk only when the data reaches it:
            # find out before the rename, which would otherwise put a file with holes over a whole one.
            os.fsync(fd)
        finally:
            os.close(fd)
        os.replace(scratch, path)
    except BaseException as exc:  # an error or Ctrl-C mid-write: the old file stays, the scratch file goes
        scratch.unlink(missing_ok=True)
        if isinstance(exc, OSError):
            raise write_failure(path, exc, what) from exc
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
