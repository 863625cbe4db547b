"""Build verispec's C++ kernels once per machine, source and torch version, cached under verispec's cache folder."""

from __future__ import annotations

import functools
import hashlib
from pathlib import Path
from typing import Any

import torch

from verispec.errors import ConfigError


@functools.cache
def load_native(source: Path, name: str, portable: bool = False, instead: str = "",
                extra_flags: tuple[str, ...] = (), includes: tuple[Path, ...] = ()) -> Any:
    """Build (once, cached) and return the torch extension module compiled from `source`: for this CPU
    (`-march=native`), or `portable` (x86-64-v2: no AVX-512, to test that the generic code agrees). A failed build
    raises ConfigError naming the source, the first compiler error and `instead` (what the user can run without it).
    `extra_flags`: more compiler flags (part of the cache key). `includes`: the sources `source` includes (their
    text is part of the cache key too, so that editing one rebuilds)."""
    from torch.utils import cpp_extension  # imported here: it pulls in the compiler tooling

    from verispec.models.cache import cache_dir

    arch = "x86-64-v2" if portable else "native"
    # -fopenmp: at::parallel_for is inline, so without it a kernel's loops run on one thread whatever torch's
    # setting (measured: the 4-bit linear 1.9x slower per layer on 2 cores). No -fopenmp at link time: the OpenMP
    # calls resolve to the runtime torch itself loads, so torch.set_num_threads governs the kernels and no second
    # pool spins.
    flags = ["-O3", f"-march={arch}", "-fopenmp", *extra_flags]
    text = source.read_bytes() + b"".join(path.read_bytes() for path in includes)
    tag = hashlib.sha256(text + torch.__version__.encode() + " ".join(flags).encode()).hexdigest()[:12]
    build = cache_dir() / "native" / f"{name}-{tag}"
    build.mkdir(parents=True, exist_ok=True)
    try:
        return cpp_extension.load(name=f"verispec_{name}" + ("_portable" if portable else ""), sources=[str(source)],
                                  build_directory=str(build), extra_cflags=flags, verbose=False)
    except (RuntimeError, OSError, ImportError) as e:
        lines = str(e).splitlines()
        reason = next((line for line in lines if "error" in line.lower()), lines[-1] if lines else repr(e))
        raise ConfigError(
            f"verispec needs a C++ compiler (g++) and ninja to build its kernel once ({source.name} into {build}); "
            f"the build failed: {reason.strip()}" + (f" {instead}" if instead else "")
        ) from e
