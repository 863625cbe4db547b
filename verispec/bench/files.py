"""Writing result files so that a run stopped mid-write never leaves half a file."""

from __future__ import annotations

import os
from pathlib import Path


def write_atomically(path: Path, data: str | bytes) -> None:
    """Write `data` (text or bytes) to `path` through a scratch file, so a run stopped mid-write leaves the previous
    file whole."""
    path.parent.mkdir(parents=True, exist_ok=True)
    scratch = path.with_name(path.name + ".partial")
    if isinstance(data, bytes):
        scratch.write_bytes(data)
    else:
        scratch.write_text(data)
    os.replace(scratch, path)
