"""Writing a matplotlib figure to a file: shared by the report's plots and the speed-quality Pareto plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any


def save_figure(fig: Any, path: str | Path) -> Path:
    """Lay out `fig`, write it to `path` (creating the folder) and return the path."""
    fig.tight_layout()
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path)
    return path
