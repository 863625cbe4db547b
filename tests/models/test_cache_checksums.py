"""A cached file's checksum is read once after it was written, replaced or moved, then trusted by its size,
modification time and inode: a damaged file of the right size fails its next load, an unchanged one costs a stat."""

from __future__ import annotations

import json
import os
import shutil

import pytest

from tests.models.fake_cache import TOYS, flip_byte, install
from verispec.cli import main
from verispec.errors import ModelFilesError
from verispec.models import default_pair
from verispec.models.default_pair import assembled, converted_dir, prepare
from verispec.models.manifest import VERIFIED, file_stat


@pytest.fixture
def cache(tmp_path, monkeypatch, capsys):
    cache = install(monkeypatch, tmp_path)
    assert main(["setup", "--float"]) == 0
    capsys.readouterr()
    cache.hashed.clear()
    return cache


def test_setup_leaves_every_file_verified_so_loads_hash_nothing(cache):
    for role, toy in TOYS.items():
        assert prepare(toy) == converted_dir(toy)
        assert assembled(toy) == cache.gguf(role)
    assert cache.hashed == []  # a stat per file, not a read of gigabytes
    record = json.loads((converted_dir(TOYS["draft"]) / VERIFIED).read_text())
    assert record["model.safetensors"] == {"sha256": record["model.safetensors"]["sha256"],
                                           **file_stat(cache.weights("draft"))}


def test_a_flipped_byte_of_the_same_size_fails_the_next_load_and_setup_rebuilds_it(cache, capsys):
    path = cache.weights("target")
    size = path.stat().st_size
    flip_byte(path)
    assert path.stat().st_size == size
    with pytest.raises(ModelFilesError) as info:
        prepare(TOYS["target"])
    message = str(info.value)
    assert "\n" not in message and str(path) in message and "`verispec setup --float`" in message
    assert cache.hashed == [path]  # only the changed file was read
    with pytest.raises(ModelFilesError):  # a failed check is not remembered as a pass
        prepare(TOYS["target"])
    assert main(["setup", "--float"]) == 0  # no --verify needed: the changed file is hashed again
    assert cache.conversions.count("target") == 2 and cache.conversions.count("draft") == 1
    assert prepare(TOYS["target"]) == converted_dir(TOYS["target"])


def test_a_copy_put_in_place_with_the_old_time_is_hashed_again(cache):
    path = cache.weights("draft")
    stat = path.stat()
    copy = path.with_name("copy")
    shutil.copyfile(path, copy)
    flip_byte(copy)
    os.utime(copy, ns=(stat.st_atime_ns, stat.st_mtime_ns))  # as `cp -p` or a restore from a backup keeps it
    os.replace(copy, path)  # same size, same time, another inode
    with pytest.raises(ModelFilesError, match="model.safetensors has another sha256"):
        prepare(TOYS["draft"])


def test_damage_that_keeps_the_time_is_found_by_verify_and_then_by_every_load(cache, capsys):
    path = cache.weights("draft")
    flip_byte(path, keep_time=True)  # nothing but a checksum can tell: loads trust the stat
    assert prepare(TOYS["draft"]) == converted_dir(TOYS["draft"])
    assert main(["models", "--verify"]) == 1
    assert str(path) in capsys.readouterr().err
    with pytest.raises(ModelFilesError, match="model.safetensors"):  # --verify forgot the file's record
        prepare(TOYS["draft"])
    assert main(["setup", "--float"]) == 0 and cache.conversions.count("draft") == 2


def test_an_unchanged_gguf_is_not_hashed_on_load(cache, monkeypatch):
    def no_hash(path, chunk=1 << 24):
        raise AssertionError(f"{path} was hashed again")

    monkeypatch.setattr(default_pair, "sha256_file", no_hash)
    for role, toy in TOYS.items():
        assert assembled(toy) == cache.gguf(role)


def test_a_damaged_gguf_is_assembled_again_on_load_with_a_line_naming_it(cache, capsys):
    path = cache.gguf("target")
    whole = path.read_bytes()
    flip_byte(path)
    assert assembled(TOYS["target"]) == path
    assert path.read_bytes() == whole
    err = capsys.readouterr().err
    assert len(err.splitlines()) == 1 and str(path) in err and "damaged" in err
    assert cache.hashed.count(path) == 1  # the damaged copy; the new one is hashed as it is written (scratch name)
    cache.hashed.clear()
    assert assembled(TOYS["target"]) == path and cache.hashed == []


def test_a_damaged_gguf_whose_parts_are_gone_is_one_clear_error(cache, monkeypatch):
    path = cache.gguf("draft")
    flip_byte(path)

    def missing(model):
        raise ModelFilesError(f"the {model.name} model is missing 2 of its 2 part packages")

    monkeypatch.setattr(default_pair, "part_paths", missing)
    with pytest.raises(ModelFilesError) as info:
        assembled(TOYS["draft"])
    message = str(info.value)
    assert str(path) in message and "damaged" in message and "part packages" in message
    assert path.exists()  # nothing to rebuild it from: the file stays for the user to look at


def test_a_record_from_before_inodes_were_recorded_is_checked_once(cache):
    record = cache.gguf("target").with_name(TOYS["target"].gguf_name + ".verified")
    old = json.loads(record.read_text())
    del old["ino"]
    record.write_text(json.dumps(old))
    assert assembled(TOYS["target"]) == cache.gguf("target")
    assert cache.hashed == [cache.gguf("target")]
    assert json.loads(record.read_text())["ino"] == cache.gguf("target").stat().st_ino


def test_a_cache_that_cannot_record_still_checks(cache, monkeypatch):
    path = cache.weights("target")
    (converted_dir(TOYS["target"]) / VERIFIED).unlink()

    def read_only(*args, **kwargs):
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr("verispec.models.manifest.scratch_file", read_only)
    for _ in range(2):  # no record can be written: each load hashes, and passes
        assert prepare(TOYS["target"]) == converted_dir(TOYS["target"])
    assert cache.hashed.count(path) == 2
