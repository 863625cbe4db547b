"""`verispec models [--verify]` fails (exit 1) on a damaged or missing cached file, with one line naming it."""

from __future__ import annotations

import json
import os

import pytest

from tests.models.fake_cache import flip_byte, install
from verispec.cli import main


@pytest.fixture
def cache(tmp_path, monkeypatch, capsys):
    cache = install(monkeypatch, tmp_path)
    assert main(["setup", "--float"]) == 0
    capsys.readouterr()
    return cache


def errors(err: str) -> list[str]:
    return [line for line in err.splitlines() if line.startswith("verispec: error:")]


@pytest.mark.parametrize("as_json", [False, True])
def test_a_whole_cache_verifies(cache, capsys, as_json):
    assert main(["models", "--verify", *(["--json"] if as_json else [])]) == 0
    out, err = capsys.readouterr()
    assert errors(err) == []
    if as_json:
        assert all(m["sha256_ok"] and m["converted_ok"] and m["problems"] == [] for m in json.loads(out)["models"])
    else:
        assert "MISMATCH" not in out


DAMAGE = {
    "truncated": lambda path: os.truncate(path, path.stat().st_size // 2),
    "flipped byte": flip_byte,
    "flipped byte, time kept": lambda path: flip_byte(path, keep_time=True),
    "missing": os.unlink,
}


@pytest.mark.parametrize("as_json", [False, True])
@pytest.mark.parametrize("damage", list(DAMAGE))
@pytest.mark.parametrize("which", ["converted", "gguf"])
def test_any_damage_exits_1_with_a_line_naming_the_file(cache, capsys, damage, which, as_json):
    path = cache.weights("target") if which == "converted" else cache.gguf("target")
    DAMAGE[damage](path)
    assert main(["models", "--verify", *(["--json"] if as_json else [])]) == 1
    out, err = capsys.readouterr()
    lines = errors(err)
    assert len(lines) == 1 and str(path) in lines[0] and "verispec setup" in lines[0]
    if as_json:  # stdout stays the JSON document
        target = next(m for m in json.loads(out)["models"] if m["role"] == "target")
        assert target["problems"] == [lines[0].removeprefix("verispec: error: ")]
    elif damage != "missing":
        assert "MISMATCH" in out


def test_without_verify_a_size_mismatch_still_fails(cache, capsys):
    os.truncate(cache.weights("draft"), 10)
    assert main(["models"]) == 1
    lines = errors(capsys.readouterr().err)
    assert len(lines) == 1 and str(cache.weights("draft")) in lines[0]


def test_no_conversion_is_not_a_failure(cache, capsys):
    for role in ("target", "draft"):
        (cache.weights(role).parent / "verispec.json").unlink()  # an unfinished folder: not converted
    assert main(["models", "--verify"]) == 0
    out, err = capsys.readouterr()
    assert errors(err) == [] and "MISMATCH" not in out and "setup --float" in out


def test_without_verify_only_sizes_are_compared(cache, capsys):
    for role in ("target", "draft"):
        (cache.weights(role).parent / "verispec.verified").unlink()  # as if every file had changed since
    cache.hashed.clear()
    assert main(["models"]) == 0
    assert cache.hashed == [] and not (cache.weights("target").parent / "verispec.verified").exists()
