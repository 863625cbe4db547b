"""Building llama.cpp for the peers: the smoke run tells a crash from a clean run, and a build that crashes on a CPU
with AMX is built once more without ggml's AMX kernels (cmake and the compiler are stood in for; the smoke run's
stand-in llama-bench is a real process that exits or kills itself)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from verispec.errors import ConfigError
from verispec.native import llamacpp_build


def _stand_in_bench(tmp_path: Path, body: str) -> None:
    tool = tmp_path / "bin" / "llama-bench"
    tool.parent.mkdir(exist_ok=True)
    tool.write_text(f"#!/bin/sh\n{body}\n")
    tool.chmod(0o755)


@pytest.mark.parametrize(("body", "expected"), [("exit 0", None), ("exit 3", "exit 3"),
                                                ("kill -SEGV $$", "killed by SIGSEGV")])
def test_smoke_run_reports_how_the_bench_ended(monkeypatch, tmp_path, body, expected):
    monkeypatch.setattr(llamacpp_build, "root", lambda: tmp_path)
    _stand_in_bench(tmp_path, f'echo "read $2"\n{body}')
    log = tmp_path / "build.log"
    assert llamacpp_build.smoke_run(tmp_path / "model.gguf", log) == expected
    assert "read " + str(tmp_path / "model.gguf") in log.read_text()  # the bench's output is kept in the log


def _fake_build(monkeypatch, tmp_path, features: list[str], outcomes: list[str | None]) -> list[tuple[str, ...]]:
    """Stand in for cmake (record each build's extra flags), the smoke run (pop `outcomes`) and the CPU's flags."""
    compiled: list[tuple[str, ...]] = []
    monkeypatch.setattr(llamacpp_build, "root", lambda: tmp_path)
    (tmp_path / "src" / "llama.cpp").mkdir(parents=True)
    (tmp_path / "build").mkdir()

    def compile_(src, base, log, jobs, extra):
        compiled.append(extra)
        for target in llamacpp_build.TARGETS:
            (base / "bin").mkdir(exist_ok=True)
            llamacpp_build.binary(target).write_text("")
        llamacpp_build.library().parent.mkdir(parents=True, exist_ok=True)
        llamacpp_build.library().write_text("")

    monkeypatch.setattr(llamacpp_build, "_compile", compile_)
    monkeypatch.setattr(llamacpp_build, "_smoke_model", lambda: tmp_path / "draft.gguf")
    monkeypatch.setattr(llamacpp_build, "smoke_run", lambda model, log: outcomes.pop(0))
    monkeypatch.setattr(llamacpp_build, "cpu_description", lambda: {"cpu_features": features})
    return compiled


def test_a_crash_on_an_amx_cpu_rebuilds_without_the_amx_kernels(monkeypatch, tmp_path):
    compiled = _fake_build(monkeypatch, tmp_path, ["avx512f", "amx_tile", "amx_int8"], ["killed by SIGSEGV", None])
    llamacpp_build.build(jobs=1)
    assert len(compiled) == 2
    assert not any("amx" in flag for flag in compiled[0])
    assert all(flag.endswith(llamacpp_build.NO_AMX_FLAGS) for flag in compiled[1])
    info = llamacpp_build.build_info()
    assert "SIGSEGV" in info["amx_kernels"] and info["smoke_run"] == "passed on draft.gguf"
    assert any(llamacpp_build.NO_AMX_FLAGS in flag for flag in info["cmake_flags"])
    assert llamacpp_build.is_built()


def test_a_clean_smoke_run_builds_once_with_the_native_flags(monkeypatch, tmp_path):
    compiled = _fake_build(monkeypatch, tmp_path, ["avx512f", "amx_int8"], [None])
    llamacpp_build.build(jobs=1)
    assert len(compiled) == 1 and not any("amx" in flag for flag in compiled[0])
    info = json.loads((tmp_path / "build_info.json").read_text())
    assert info["amx_kernels"] is None and not any("amx" in flag for flag in info["cmake_flags"])


@pytest.mark.parametrize(("features", "outcomes"), [(["avx512f"], ["killed by SIGILL"]),
                                                    (["amx_int8"], ["killed by SIGSEGV", "exit 1"])])
def test_a_build_that_still_crashes_is_an_error_and_not_marked_built(monkeypatch, tmp_path, features, outcomes):
    _fake_build(monkeypatch, tmp_path, features, outcomes)
    with pytest.raises(ConfigError, match=r"does not run: llama-bench on draft.gguf was .*; log: "):
        llamacpp_build.build(jobs=1)
    assert not llamacpp_build.is_built()
