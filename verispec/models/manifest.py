"""What a cached model folder should hold: the size and sha256 of every file, recorded when it is written.

Loading and `verispec setup` check the sizes, and the sha256 of a file once after it was written, replaced or moved:
a record beside the files (`VERIFIED`) keeps the size, modification time and inode at which each one last matched
its checksum, and a file that still has them is trusted at the cost of a stat. A damaged file of the right size
thus fails its first load after the damage changed its modification time, instead of decoding with wrong weights.
`verispec models --verify` and `verispec setup --verify` hash every file whatever the record says (they read every
byte, some GB for the default pair), which also catches damage that left the modification time alone. Folders
written before manifests existed are checked structurally instead: each safetensors file must be as long as its
own header says (`safetensors_problem`), which catches truncation. Writes go to a unique temporary name in the same
folder and are renamed into place, and a file lock (`cache_lock`) serialises the processes that write one entry.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import struct
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from verispec.errors import ModelFilesError

MARKER = "verispec.json"  # the folder's record: where it came from and, under "files", its manifest
VERIFIED = "verispec.verified"  # {file: {"sha256", "size", "mtime_ns", "ino"}} at the last matching checksum


def sha256_file(path: Path, chunk: int = 1 << 24) -> str:
    """Return the hex sha256 of a file."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def file_stat(path: Path) -> dict[str, int]:
    """Return what tells one state of the file at `path` from another without reading it: its size, modification
    time and inode (a file replaced by a copy keeping the old time, e.g. `cp -p` or a move over it, gets another
    inode)."""
    stat = path.stat()
    return {"size": stat.st_size, "mtime_ns": stat.st_mtime_ns, "ino": stat.st_ino}


def file_manifest(folder: Path) -> dict[str, dict[str, Any]]:
    """Return {relative path: {"size", "sha256"}} of every file in `folder` except the marker and the record of
    verified files."""
    return {
        path.relative_to(folder).as_posix(): {"size": path.stat().st_size, "sha256": sha256_file(path)}
        for path in sorted(folder.rglob("*")) if path.is_file() and path.name not in (MARKER, VERIFIED)
    }


def read_verified(folder: Path) -> dict[str, Any]:
    """Return the folder's record of verified files ({} when it is absent or unreadable: every file is then
    hashed once more)."""
    try:
        record = json.loads((folder / VERIFIED).read_text())
    except (OSError, ValueError):
        return {}
    return record if isinstance(record, dict) else {}


def write_verified(folder: Path, record: dict[str, Any]) -> None:
    """Replace the folder's record of verified files atomically. A cache this process may not write (read-only,
    full) keeps its old record: its files are then hashed on each load, which is slower but as safe."""
    try:
        fd, scratch = scratch_file(folder / VERIFIED)
    except OSError:
        return
    try:
        with os.fdopen(fd, "w") as handle:
            handle.write(json.dumps(record))
        os.replace(scratch, folder / VERIFIED)
    except OSError:
        scratch.unlink(missing_ok=True)


def manifest_problem(folder: Path, manifest: dict[str, Any], checksum: bool | None = False) -> str | None:
    """Return what differs between `folder` and its recorded `manifest`, naming the file; None when it matches.

    Every file's presence and size are checked; its sha256 when its size, modification time or inode differ from
    the last time it matched (`VERIFIED`), with `checksum` True always, with None never (a look that reads and
    writes nothing more). A match is recorded, a mismatch forgets the file's record, so the next check (a load,
    `verispec setup`) hashes it again rather than trusting it."""
    if not isinstance(manifest, dict):
        return f"the manifest in {folder / MARKER} is not a mapping of files"
    verified = read_verified(folder) if checksum is not None else {}
    before = dict(verified)
    problem = None
    for name, entry in manifest.items():
        path = folder / name
        if not path.is_file():
            problem = f"{path} is missing"
            break
        state = {"sha256": entry.get("sha256"), **file_stat(path)}
        if state["size"] != entry.get("size"):
            problem = f"{path} has {state['size']} bytes, {entry.get('size')} were written (truncated or replaced?)"
            break
        if checksum is None:
            continue  # a quick look: sizes only
        if not checksum and verified.get(name) == state:
            continue  # the very file that matched before: a stat instead of reading gigabytes
        if sha256_file(path) != entry.get("sha256"):
            verified.pop(name, None)
            problem = f"{path} has another sha256 than was written (corrupt?)"
            break
        verified[name] = state
    if verified != before and checksum is not None:
        write_verified(folder, verified)
    return problem


def safetensors_problem(folder: Path) -> str | None:
    """Return the first safetensors file in `folder` whose length differs from what its header promises, or that
    has no readable header; None when all are whole (the check for folders without a manifest; reads headers
    only)."""
    for path in sorted(folder.glob("*.safetensors")):
        size = path.stat().st_size
        try:
            with open(path, "rb") as handle:
                (header_len,) = struct.unpack("<Q", handle.read(8))
                if header_len > size:
                    raise ValueError("header longer than the file")
                header = json.loads(handle.read(header_len))
            end = max((t["data_offsets"][1] for k, t in header.items() if k != "__metadata__"), default=0)
        except (struct.error, ValueError, KeyError, TypeError, IndexError) as exc:
            return f"{path} is not a readable safetensors file ({exc})"
        if size != 8 + header_len + end:
            return f"{path} has {size} bytes, its header describes {8 + header_len + end} (truncated?)"
    return None


def read_marker(folder: Path) -> dict[str, Any] | None:
    """Return the folder's marker record, or None when it is absent or unreadable (an unfinished folder)."""
    try:
        marker = json.loads((folder / MARKER).read_text())
    except (OSError, ValueError):
        return None
    return marker if isinstance(marker, dict) else None


def scratch_file(path: Path) -> tuple[int, Path]:
    """Return (open descriptor, path) of a new, uniquely named file beside `path`, to write and then `os.replace`
    over it. Its mode is what a plain `open` would give (mkstemp's own is owner-only)."""
    fd, name = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".partial")
    umask = os.umask(0)
    os.umask(umask)
    os.fchmod(fd, 0o666 & ~umask)
    return fd, Path(name)


def write_marker(folder: Path, record: dict[str, Any]) -> None:
    """Write the marker record atomically (a unique temporary file renamed over it)."""
    fd, scratch = scratch_file(folder / MARKER)
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps(record))
    os.replace(scratch, folder / MARKER)


def scratch_folder(out_dir: Path) -> Path:
    """Return a new, unique, empty folder beside `out_dir` to write it into before `publish_folder`."""
    out_dir.parent.mkdir(parents=True, exist_ok=True)
    return Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=out_dir.name + ".partial-"))


def publish_folder(scratch: Path, out_dir: Path) -> None:
    """Put the finished `scratch` folder at `out_dir`: an old folder is moved aside first (a rename) and deleted
    after, so `out_dir` is at every moment either the old folder or the new one, never half of one."""
    old = None
    if out_dir.exists():
        old = Path(tempfile.mkdtemp(dir=out_dir.parent, prefix=out_dir.name + ".old-"))
        os.replace(out_dir, old / out_dir.name)
    os.replace(scratch, out_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


@contextlib.contextmanager
def cache_lock(path: Path, what: str) -> Iterator[None]:
    """Hold an exclusive lock on the file `path` (created if needed) while the block runs; a second process
    waits for it (saying so on stderr), then finds the first one's result. POSIX only; elsewhere no lock."""
    try:
        import fcntl
    except ImportError:  # Windows: no flock; concurrent setups are then the user's to avoid
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as handle:
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"verispec: waiting for another process that is preparing {what} ...", file=sys.stderr)
            fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def check_folder(folder: Path, checksum: bool | None = False, rebuild: str = "verispec setup") -> None:
    """Raise ModelFilesError naming the first file of a cached model folder that is missing, truncated or corrupt
    (`manifest_problem`: hashed once after a change, with `checksum` True always, None never) and the command that
    rebuilds it (`rebuild`; with `checksum` it gets --verify, which a file damaged without a new modification time
    needs). Folders without a manifest get the structural safetensors check."""
    marker = read_marker(folder) or {}
    if "files" in marker:
        problem = manifest_problem(folder, marker["files"], checksum)
    elif not any(folder.glob("*.safetensors")):
        problem = f"{folder} holds no model.safetensors"
    else:
        problem = safetensors_problem(folder)
    if problem:
        command = rebuild.replace("verispec setup", "verispec setup --verify", 1) if checksum else rebuild
        error = ModelFilesError(f"the cached model is damaged: {problem}; run `{command}` to rebuild it")
        error.problem = problem  # for `verispec setup`, which rebuilds it rather than advise it
        raise error
