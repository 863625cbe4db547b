"""Build verispec's C++ kernels once per machine, source, instruction-set level and torch version, cached under
verispec's cache folder."""

from __future__ import annotations

import functools
import hashlib
import sys
from pathlib import Path
from typing import Any

import torch

from verispec.errors import ConfigError
from verispec.native.cpu import best_isa, isa_flags


@functools.cache
def load_native(sources: Path | tuple[Path, ...], name: str, isa: str | None = None, instead: str = "",
                extra_flags: tuple[str, ...] = (), includes: tuple[Path, ...] = (),
                objects: tuple[Path, ...] = ()) -> Any:
    """Build (once, cached) and return the torch extension module linked from `sources` (one translation unit
    each, compiled once) for instruction-set level `isa` (see verispec.native.cpu; None: the best this CPU runs, or
    $VERISPEC_ISA). A level the CPU cannot run, or a failed build, raises ConfigError; the latter names the sources,
    the first compiler error and `instead` (what the user can run without it). `extra_flags`: more compiler flags.
    `includes`: the headers the sources include (their text is part of the cache key with every source's, so that
    editing any one rebuilds). `objects`: translation units another build already compiled for the same level and
    flags, linked in rather than compiled again (their bytes are part of the cache key too)."""
    from torch.utils import cpp_extension  # imported here: it pulls in the compiler tooling

    from verispec.cache import cache_dir

    level = isa or best_isa()
    # -ffp-contract=off: every float multiply and add is rounded as written (the kernels' fused ones are explicit
    # fma calls), so that a level with FMA instructions returns the portable level's bits: without it, g++ fuses
    # a * b + c in the attention loops wherever FMA exists. -fopenmp: at::parallel_for is inline, so without it a
    # kernel's loops run on one thread whatever torch's setting (measured: the 4-bit linear 1.9x slower per layer on
    # 2 cores). No -fopenmp at link time: the OpenMP calls resolve to the runtime torch itself loads, so
    # torch.set_num_threads governs the kernels and no second pool spins. -fvisibility=hidden: where one process
    # loads a source's builds for several levels (tests, benchmarks), each calls its own functions.
    flags = ["-O3", *isa_flags(level), "-ffp-contract=off", "-fvisibility=hidden", "-fopenmp", *extra_flags]
    sources = (sources,) if isinstance(sources, Path) else tuple(sources)
    # Every file's name and text: a source added, removed, renamed or edited is another build.
    text = b"".join(path.name.encode() + b"\0" + path.read_bytes() for path in (*sources, *includes, *objects))
    tag = hashlib.sha256(text + torch.__version__.encode() + " ".join(flags).encode()).hexdigest()[:12]
    # The level and a digest of the flags name the module and its folder: a cache copied from another machine is
    # only reused where the same level's same flags were asked for, i.e. where this CPU runs that code.
    flag_tag = hashlib.sha256(" ".join(flags).encode()).hexdigest()[:8]
    module = f"verispec_{name}_{level.replace('-', '_')}_{flag_tag}"
    build = cache_dir() / "native" / f"{name}-{level}-{tag}"
    build.mkdir(parents=True, exist_ok=True)
    if not any(build.glob("*.so")):  # minutes on a small CPU, with no output of its own: say what is happening
        print(f"verispec: compiling the {name} kernel for {level} (once per machine; cached in {build})",
              file=sys.stderr, flush=True)
    try:
        return cpp_extension.load(name=module, sources=[str(path) for path in sources], build_directory=str(build),
                                  extra_cflags=flags, extra_ldflags=[str(path) for path in objects], verbose=False)
    except (RuntimeError, OSError, ImportError) as e:
        lines = str(e).splitlines()
        reason = next((line for line in lines if "error" in line.lower()), lines[-1] if lines else repr(e))
        raise ConfigError(
            f"verispec needs a C++ compiler (g++) and ninja to build its kernel once "
            f"({', '.join(path.name for path in sources)} into {build}); "
            f"the build failed: {reason.strip()}" + (f" {instead}" if instead else "")
        ) from e
