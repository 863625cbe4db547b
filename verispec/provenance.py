"""Where a measurement came from: the code (git commit, uncommitted changes), the library versions, and the machine.

Every results file that holds timings records these (bench runs, fixed-block runs, hardware profiles, the serve
bench), under the same keys: `machine` (`machine_description`), `versions` (`versions`), `git_commit` and
`git_dirty` (`git_state`); `provenance(device)` returns all four. The llama.cpp build records `cpu_description`, the
features its native build targets.
"""

from __future__ import annotations

import os
import platform
import subprocess
from pathlib import Path
from typing import Any

import torch

# CPU features that decide which linear kernels run fast (oneDNN int8 needs VNNI; bf16 and AMX paths need theirs).
CPU_FEATURES = ("avx2", "fma", "avx512f", "avx512_vnni", "avx512_bf16", "avx_vnni", "amx_tile", "amx_int8", "amx_bf16")


def git_state() -> tuple[str | None, bool | None]:
    """Return (commit, whether the working tree has uncommitted changes) of the checkout verispec runs from."""
    def git(*args: str) -> str | None:
        try:
            done = subprocess.run(["git", *args], capture_output=True, text=True, cwd=Path(__file__).parent,
                                  timeout=5)
        except (OSError, subprocess.SubprocessError):
            return None
        return done.stdout.strip() if done.returncode == 0 else None

    commit = git("rev-parse", "HEAD")
    status = git("status", "--porcelain") if commit else None
    return commit or None, (bool(status) if status is not None else None)


def versions() -> dict[str, str | None]:
    """Return the versions of Python, verispec and the libraries that decide its speed."""
    from importlib.metadata import PackageNotFoundError, version

    import verispec

    out: dict[str, str | None] = {"python": platform.python_version(), "verispec": verispec.__version__,
                                  "torch": torch.__version__}
    for name in ("transformers", "tokenizers", "numpy"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            out[name] = None
    return out


def cpu_description(cpuinfo: str | None = None, meminfo: str | None = None) -> dict[str, Any]:
    """Return the CPU model, which of `CPU_FEATURES` it has, and the memory in GB, from Linux's /proc files (or
    the given texts of them); None for what cannot be read (other systems)."""
    cpuinfo = _read("/proc/cpuinfo") if cpuinfo is None else cpuinfo
    meminfo = _read("/proc/meminfo") if meminfo is None else meminfo
    fields: dict[str, str] = {}
    for line in (cpuinfo or "").splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())  # the first processor's entry
    flags = set(fields.get("flags", "").split())
    kib = next((int(line.split()[1]) for line in (meminfo or "").splitlines() if line.startswith("MemTotal:")), None)
    return {
        "cpu_model": fields.get("model name"),
        "cpu_features": [f for f in CPU_FEATURES if f in flags] if flags else None,
        "memory_gb": round(kib / 2**20, 1) if kib is not None else None,
    }


def _read(path: str) -> str | None:
    try:
        return Path(path).read_text()
    except OSError:
        return None


def machine_description(device: str = "cpu") -> dict[str, Any]:
    """Return the machine: platform, processor (model, features, memory), CPU count, torch threads, accelerator,
    versions and git commit."""
    import transformers

    commit, dirty = git_state()
    info: dict[str, Any] = {
        "platform": platform.platform(),
        "processor": platform.processor() or platform.machine(),
        **cpu_description(),
        "cpu_count": os.cpu_count(),
        "cpu_threads": torch.get_num_threads(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "device": device,
        "git_commit": commit,
        "git_dirty": dirty,
    }
    if device.startswith("cuda") and torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name(torch.device(device))
    return info


def provenance(device: str = "cpu") -> dict[str, Any]:
    """Return the provenance keys of a results file: machine, versions, git_commit, git_dirty."""
    commit, dirty = git_state()
    return {"machine": machine_description(device), "versions": versions(), "git_commit": commit,
            "git_dirty": dirty}
