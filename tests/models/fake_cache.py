"""A default-pair cache made of small fake files, for tests of how the cache is checked and repaired.

Each toy model's GGUF is assembled by the real `assemble` from two fake part files, its "conversion" is a folder of
two small files with a real manifest (written the way `hf.save_converted` writes one: a scratch folder put in
place whole), and reading the tokenizer from the GGUF is skipped. Nothing loads a model; every file is a few kB.
"""

from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest

from verispec.models import default_pair, manifest
from verispec.models.default_pair import DRAFT, TARGET, EmbeddedModel, converted_dir
from verispec.models.manifest import file_manifest, publish_folder, scratch_folder, write_marker


def _parts(role: str) -> list[bytes]:
    return [f"{role} gguf part {i};".encode() * 400 for i in (1, 2)]


# The toys' sha256 is that of their fake parts joined, as the real models' is of their real parts.
TOYS = {
    role: replace(model, gguf_name=f"toy-{role}.gguf", sha256=hashlib.sha256(b"".join(_parts(role))).hexdigest())
    for role, model in (("target", TARGET), ("draft", DRAFT))
}


@dataclass
class FakeCache:
    """What a test reads back: the toys, how many conversions ran, and which files were hashed."""

    root: Path
    conversions: list[str] = field(default_factory=list)
    hashed: list[Path] = field(default_factory=list)

    def weights(self, role: str) -> Path:
        return converted_dir(TOYS[role]) / "model.safetensors"

    def gguf(self, role: str) -> Path:
        return default_pair.gguf_path(TOYS[role])


def _convert(cache: FakeCache, model: EmbeddedModel, progress: bool = True) -> Path:
    out = converted_dir(model)
    scratch = scratch_folder(out)
    (scratch / "model.safetensors").write_bytes(os.urandom(4096))
    (scratch / "config.json").write_text('{"model_type": "toy"}')
    write_marker(scratch, {"sha256": model.sha256, "upstream": model.upstream, "files": file_manifest(scratch)})
    publish_folder(scratch, out)
    cache.conversions.append(model.name)
    return out


def install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> FakeCache:
    """Point the cache at `tmp_path`, put the toys in the default pair, and count conversions and hashes."""
    cache = FakeCache(tmp_path / "cache")
    monkeypatch.setenv("VERISPEC_CACHE", str(cache.root))
    part_files = {}
    for role in TOYS:
        part_files[role] = [tmp_path / "parts" / role / f"part{i:02d}.bin" for i in (1, 2)]
        for path, data in zip(part_files[role], _parts(role), strict=True):
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
        monkeypatch.setitem(default_pair.DEFAULT_PAIR, role, TOYS[role])
    monkeypatch.setattr(default_pair, "part_paths", lambda model: part_files[model.name])
    monkeypatch.setattr(default_pair, "_convert", lambda model, progress=True: _convert(cache, model, progress))
    monkeypatch.setattr(default_pair, "model_files", lambda model, progress=True: default_pair.gguf_path(model).parent)
    real = manifest.sha256_file

    def counted(path: Path, chunk: int = 1 << 24) -> str:
        cache.hashed.append(Path(path))
        return real(path, chunk)

    monkeypatch.setattr(manifest, "sha256_file", counted)
    monkeypatch.setattr(default_pair, "sha256_file", counted)
    return cache


def flip_byte(path: Path, keep_time: bool = False) -> None:
    """Invert one byte of `path` in place (same size, same inode). Its modification time moves on by a second (a
    file system with coarse timestamps may not move it by itself), or with `keep_time` stays as it was."""
    stat = path.stat()
    with open(path, "r+b") as handle:
        handle.seek(stat.st_size // 2)
        byte = handle.read(1)
        handle.seek(stat.st_size // 2)
        handle.write(bytes([byte[0] ^ 0xFF]))
    mtime = stat.st_mtime_ns if keep_time else stat.st_mtime_ns + 1_000_000_000
    os.utime(path, ns=(stat.st_atime_ns, mtime))
