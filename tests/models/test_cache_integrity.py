"""The converted-model cache: a manifest of sizes and checksums, checked on load (sizes, and a checksum once after a
file changed) and by `models --verify` (every checksum); `verispec setup` rebuilds what does not match and
serialises concurrent runs with a file lock."""

from __future__ import annotations

import hashlib
import json
import multiprocessing
import os
import time
from dataclasses import replace
from pathlib import Path

import pytest

from verispec.cli import main
from verispec.errors import ModelFilesError
from verispec.models import default_pair, hf
from verispec.models.default_pair import DRAFT, TARGET, converted_dir, describe, prepare
from verispec.models.tiny import tiny_qwen2, tiny_tokenizer

STUB = b"stub"  # what the fake assembly writes as the GGUF; the toys' checksum is its
TOYS = {role: replace(model, gguf_name=f"toy-{role}.gguf", sha256=hashlib.sha256(STUB).hexdigest())
        for role, model in (("target", TARGET), ("draft", DRAFT))}


def fake_conversion(monkeypatch: pytest.MonkeyPatch, log: Path, delay: float = 0.0) -> None:
    """Make conversion cheap: "assembling" writes a stub GGUF and "loading" it returns a tiny model (and no
    tokenizer is read from the stub); every conversion appends a line to `log`, so tests count them."""

    def assemble(model, force=False):
        path = default_pair.gguf_path(model)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(STUB)
        return path

    def load_pretrained(name_or_path, gguf_file=None, dtype="float32", device="cpu"):
        with open(log, "a") as handle:
            handle.write(f"{os.getpid()} {name_or_path}\n")
        time.sleep(delay)  # a conversion takes a while: concurrent setups overlap
        tokenizer = tiny_tokenizer()
        return tiny_qwen2(len(tokenizer), seed=1, dtype=__import__("torch").float32), tokenizer

    monkeypatch.setattr(default_pair, "assemble", assemble)
    monkeypatch.setattr(default_pair, "model_files", lambda model, progress=True: default_pair.gguf_path(model).parent)
    monkeypatch.setattr(hf, "load_pretrained", load_pretrained)
    for role, toy in TOYS.items():
        monkeypatch.setitem(default_pair.DEFAULT_PAIR, role, toy)


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path / "cache"))
    log = tmp_path / "conversions.log"
    fake_conversion(monkeypatch, log)
    return log


def conversions(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def weights(model) -> Path:
    return converted_dir(model) / "model.safetensors"


def test_setup_records_sizes_and_checksums(cache, capsys):
    assert main(["setup", "--float"]) == 0
    assert conversions(cache) == 2
    marker = json.loads((converted_dir(TOYS["draft"]) / "verispec.json").read_text())
    entry = marker["files"]["model.safetensors"]
    assert entry["size"] == weights(TOYS["draft"]).stat().st_size and len(entry["sha256"]) == 64
    assert main(["setup", "--float"]) == 0 and conversions(cache) == 2  # a valid cache is reused, not converted again


def test_setup_without_float_assembles_and_converts_nothing(cache):
    assert main(["setup"]) == 0
    assert conversions(cache) == 0 and not converted_dir(TOYS["target"]).exists()
    assert default_pair.gguf_path(TOYS["target"]).exists()


def test_truncated_weights_are_detected_on_load_and_rebuilt_by_setup(cache, capsys):
    assert main(["setup", "--float"]) == 0
    path = weights(TOYS["draft"])
    size = path.stat().st_size
    os.truncate(path, size // 2)
    with pytest.raises(ModelFilesError, match=r"model\.safetensors.*verispec setup"):
        prepare(TOYS["draft"])
    assert describe(TOYS["draft"])["converted_present"] is False
    assert main(["setup", "--float"]) == 0  # a size mismatch needs no --verify
    assert conversions(cache) == 3 and path.stat().st_size == size  # only the damaged model was converted again
    prepare(TOYS["draft"])
    capsys.readouterr()
    assert main(["models", "--verify", "--json"]) == 0
    assert all(m["converted_ok"] for m in json.loads(capsys.readouterr().out)["models"])


def test_corrupt_weights_of_the_same_size_fail_verify_and_are_rebuilt(cache, capsys):
    assert main(["setup", "--float"]) == 0
    path = weights(TOYS["target"])
    data = bytearray(path.read_bytes())
    data[-100:] = bytes(100)  # same size, other bytes: only the checksum sees it
    path.write_bytes(bytes(data))
    capsys.readouterr()
    assert main(["models", "--verify", "--json"]) == 1  # a failed check
    target = next(m for m in json.loads(capsys.readouterr().out)["models"] if m["role"] == "target")
    assert target["converted_ok"] is False and "model.safetensors" in target["converted_problem"]
    assert main(["models", "--verify"]) == 1
    assert "setup --verify" in capsys.readouterr().out
    # The file failed its checksum, so even the quick check (a stat for files that passed) reads it again.
    assert main(["setup", "--float"]) == 0 and conversions(cache) == 3
    assert main(["setup", "--float", "--verify"]) == 0 and conversions(cache) == 3
    assert describe(TOYS["target"], verify=True)["converted_ok"] is True


def test_a_cache_without_a_manifest_keeps_working_and_setup_adds_one(cache):
    assert main(["setup", "--float"]) == 0
    marker = converted_dir(TOYS["draft"]) / "verispec.json"
    legacy = json.loads(marker.read_text())
    del legacy["files"]  # as written before manifests existed
    marker.write_text(json.dumps(legacy))
    assert prepare(TOYS["draft"]) == converted_dir(TOYS["draft"])  # still loads, no conversion
    assert conversions(cache) == 2
    assert main(["setup", "--float"]) == 0 and conversions(cache) == 2
    assert "files" in json.loads(marker.read_text())


def test_a_truncated_cache_without_a_manifest_is_still_detected(cache):
    assert main(["setup", "--float"]) == 0
    marker = converted_dir(TOYS["draft"]) / "verispec.json"
    marker.write_text(json.dumps({k: v for k, v in json.loads(marker.read_text()).items() if k != "files"}))
    os.truncate(weights(TOYS["draft"]), 1000)
    with pytest.raises(ModelFilesError, match=r"model\.safetensors"):
        prepare(TOYS["draft"])
    assert main(["setup", "--float"]) == 0 and conversions(cache) == 3


def _setup_in_process(cache_dir: str, log: str) -> None:
    """One `verispec setup` in its own process, on a tiny model that takes a while to convert."""
    os.environ["VERISPEC_CACHE"] = cache_dir
    with pytest.MonkeyPatch.context() as mp:
        fake_conversion(mp, Path(log), delay=1.0)
        raise SystemExit(main(["setup", "--float"]))


def test_concurrent_setups_both_succeed_and_convert_once(tmp_path):
    spawn = multiprocessing.get_context("spawn")  # a fresh interpreter, as two shells would start
    log = tmp_path / "conversions.log"
    runs = [spawn.Process(target=_setup_in_process, args=(str(tmp_path / "cache"), str(log))) for _ in range(2)]
    for run in runs:
        run.start()
    for run in runs:
        run.join(120)
    assert [run.exitcode for run in runs] == [0, 0]
    assert conversions(log) == 2  # target and draft once each: the second process waited and reused them
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VERISPEC_CACHE", str(tmp_path / "cache"))
        for toy in TOYS.values():
            assert describe(toy, verify=True)["converted_ok"] is True
        leftovers = [p.name for p in (tmp_path / "cache" / "converted").iterdir() if "partial" in p.name]
    assert leftovers == []
