"""Where verispec keeps what it builds and converts once per machine (models, kernels, llama.cpp)."""

from __future__ import annotations

import os
from pathlib import Path


def cache_dir() -> Path:
    """Return verispec's cache directory: $VERISPEC_CACHE, else $XDG_CACHE_HOME/verispec, else ~/.cache/verispec."""
    if os.environ.get("VERISPEC_CACHE"):
        return Path(os.environ["VERISPEC_CACHE"]).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(xdg) / "verispec"
