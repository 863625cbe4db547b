"""What a cached model folder should hold: the size and sha256 of every file, recorded when it is written.

Loading and `verispec setup` check the sizes (a stat per file: free), `verispec models --verify` and `verispec setup
--verify` the checksums (they read every byte, some GB for the default pair). Folders written before manifests
existed are checked structurally instead: each safetensors file must be as long as its own header says
(`safetensors_problem`), which catches truncation. Writes go to a unique temporary name in the same folder and
are renamed into place, and a file lock (`cache_lock`) serialises the processes that write one cache entry.
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


def sha256_file(path: Path, chunk: int = 1 << 24) -> str:
    """Return the hex sha256 of a file."""
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            digest.update(block)
    return digest.hexdigest()


def file_manifest(folder: Path) -> dict[str, dict[str, Any]]:
    """Return {relative path: {"size", "sha256"}} of every file in `folder` except the marker."""
    return {
        path.relative_to(folder).as_posix(): {"size": path.stat().st_size, "sha256": sha256_file(path)}
        for path in sorted(folder.rglob("*")) if path.is_file() and path.name != MARKER
    }


def manifest_problem(folder: Path, manifest: dict[str, Any], checksum: bool = False) -> str | None:
    """Return what differs between `folder` and its recorded `manifest` (a missing file, a size, with `checksum`
    a sha256), naming the file; None when it matches."""
    if not isinstance(manifest, dict):
        return f"the manifest in {folder / MARKER} is not a mapping of files"
    for name, entry in manifest.items():
        path = folder / name
        if not path.is_file():
            return f"{path} is missing"
        size = path.stat().st_size
        if size != entry.get("size"):
            return f"{path} has {size} bytes, {entry.get('size')} were written (truncated or replaced?)"
        if checksum and sha256_file(path) != entry.get("sha256"):
            return f"{path} has another sha256 than was written (corrupt?)"
    return None


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


def check_folder(folder: Path, checksum: bool = False) -> None:
    """Raise ModelFilesError naming the first file of a cached model folder that is missing, truncated or (with
    `checksum`) corrupt. Folders without a manifest get the structural safetensors check."""
    marker = read_marker(folder) or {}
    if "files" in marker:
        problem = manifest_problem(folder, marker["files"], checksum)
    elif not any(folder.glob("*.safetensors")):
        problem = f"{folder} holds no model.safetensors"
    else:
        problem = safetensors_problem(folder)
    if problem:
        rebuild = "verispec setup --verify" if checksum else "verispec setup"
        raise ModelFilesError(f"the cached model is damaged: {problem}; run `{rebuild}` to rebuild it")
