"""The instruction sets verispec's kernels are compiled for, chosen at run time from the CPU's feature flags.

Why: a kernel built with `-march=native` runs only on CPUs with every instruction of the build machine, and a build
cache copied to another machine could run instructions that CPU lacks. Instead each kernel is compiled for one named
level, whose flags say exactly which instructions it may use; the level (and its flags) is part of the build's
name and cache key. Levels, best first:

- "avx512-vnni": 512-bit vpdpbusd (and AMX tiles for the 8-bit path where the CPU has them);
- "avx-vnni": 256-bit vpdpbusd, as on CPUs with AVX-VNNI but no AVX-512 (Alder Lake and later client cores); on an
  AVX-512 host it compiles the same instruction in its EVEX form, so the same source is tested there;
- "avx2": 256-bit vpmaddubsw / vpmaddwd;
- "portable": plain C++ (x86-64-v2 on x86-64), the reference every other level returns the same bits as.

`VERISPEC_ISA` names a level to use instead of the best one (to measure a lower level on a bigger CPU).
"""

from __future__ import annotations

import functools
import os
import platform
from collections.abc import Iterable

from verispec.errors import ConfigError

LEVELS = ("avx512-vnni", "avx-vnni", "avx2", "portable")  # best first
ENV = "VERISPEC_ISA"

_AVX2 = frozenset({"avx2", "fma", "f16c"})
# Per level, the alternative sets of /proc/cpuinfo flags that let it run (any one suffices), each with the flags
# that compile for it beyond x86-64-v2. The number in -DVERISPEC_ISA_LEVEL tells the sources which path to compile
# (an AVX-512 host's avx-vnni build defines __AVX512F__ too, so the sources cannot tell the level from the compiler).
_X86_64 = ("-march=x86-64-v2",)
_AVX2_FLAGS = ("-mavx2", "-mfma", "-mf16c")
_VARIANTS: dict[str, tuple[tuple[frozenset[str], tuple[str, ...]], ...]] = {
    "avx512-vnni": ((_AVX2 | {"avx512f", "avx512bw", "avx512vl", "avx512_vnni"},
                     (*_AVX2_FLAGS, "-mavx512f", "-mavx512bw", "-mavx512vl", "-mavx512vnni",
                      "-mprefer-vector-width=512", "-DVERISPEC_ISA_LEVEL=3")),),
    "avx-vnni": ((_AVX2 | {"avx_vnni"}, (*_AVX2_FLAGS, "-mavxvnni", "-DVERISPEC_ISA_LEVEL=2")),
                 (_AVX2 | {"avx512_vnni", "avx512vl"},
                  (*_AVX2_FLAGS, "-mavx512vnni", "-mavx512vl", "-DVERISPEC_ISA_LEVEL=2"))),
    "avx2": ((_AVX2, (*_AVX2_FLAGS, "-DVERISPEC_ISA_LEVEL=1")),),
    "portable": ((frozenset(), ()),),
}
_AMX = frozenset({"amx_tile", "amx_int8"})  # the 8-bit path's tile unit, compiled in at the avx512-vnni level


@functools.cache
def cpu_features() -> frozenset[str]:
    """Return this CPU's feature flags as Linux names them (/proc/cpuinfo's `flags`: "avx2", "avx512_vnni", ...).

    Elsewhere (no /proc/cpuinfo, or a CPU that lists no such flags) the set is empty, and the kernels build their
    portable level."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as f:
            for line in f:
                if line.startswith("flags"):
                    return frozenset(line.partition(":")[2].split())
    except OSError:
        pass
    return frozenset()


def _x86() -> bool:
    return platform.machine().lower() in ("x86_64", "amd64")


def _check_name(isa: str) -> None:
    if isa not in _VARIANTS:
        raise ConfigError(f"unknown instruction-set level {isa!r}; choose one of {', '.join(LEVELS)}")


def missing_flags(isa: str, features: Iterable[str] | None = None) -> list[str]:
    """Return the CPU flags that level `isa` needs and the CPU (`features`, default this one's) lacks: empty where it
    can run (for a level with alternatives, the first alternative's missing flags)."""
    _check_name(isa)
    have = cpu_features() if features is None else frozenset(features)
    gaps = [sorted(needs - have) for needs, _ in _VARIANTS[isa]]
    return [] if any(not gap for gap in gaps) else gaps[0]


def supported_isas(features: Iterable[str] | None = None) -> list[str]:
    """Return the levels the CPU (`features`, default this one's) can run, best first; "portable" always."""
    return [isa for isa in LEVELS if not missing_flags(isa, features)]


def best_isa(features: Iterable[str] | None = None) -> str:
    """Return the level the kernels are built for: $VERISPEC_ISA where it is set (a ConfigError where the CPU cannot
    run it, or it names no level), else the best the CPU (`features`, default this one's) can run."""
    forced = os.environ.get(ENV, "").strip()
    if forced:
        _check_name(forced)
        gaps = missing_flags(forced, features)
        if gaps:
            raise ConfigError(f"{ENV}={forced}: this CPU cannot run that level; it lacks {', '.join(gaps)}")
        return forced
    return supported_isas(features)[0]


def amx_tiles(isa: str, features: Iterable[str] | None = None) -> bool:
    """Return whether the kernels built for level `isa` on the CPU (`features`, default this one's) have the 8-bit
    path's AMX tile code."""
    have = cpu_features() if features is None else frozenset(features)
    return isa == "avx512-vnni" and _AMX <= have


def isa_flags(isa: str, features: Iterable[str] | None = None) -> tuple[str, ...]:
    """Return the compiler flags for level `isa` on the CPU (`features`, default this one's): a ConfigError naming
    the missing flags where it cannot run that level."""
    gaps = missing_flags(isa, features)
    if gaps:
        raise ConfigError(f"this CPU cannot run the {isa} level of verispec's kernels; it lacks {', '.join(gaps)}")
    have = cpu_features() if features is None else frozenset(features)
    flags = next(flags for needs, flags in _VARIANTS[isa] if needs <= have)
    if amx_tiles(isa, have):
        flags = (*flags, "-mamx-tile", "-mamx-int8")
    return (*_X86_64, *flags) if _x86() else flags
