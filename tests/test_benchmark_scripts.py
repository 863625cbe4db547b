"""`benchmarks/` keeps only the scripts that the documents cite for current figures: each one is named in
BENCHMARKS.md or docs/, so a script whose figures are gone from them goes too (git keeps it)."""

from __future__ import annotations

from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = sorted(p for p in (ROOT / "benchmarks").iterdir() if p.suffix in {".py", ".sh"})


def cited_text() -> str:
    documents = [ROOT / "BENCHMARKS.md", ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return "\n".join(path.read_text() for path in documents if path.exists())


@pytest.mark.skipif(not SCRIPTS, reason="no benchmarks/ folder beside the tests (an installed package)")
def test_every_benchmark_script_is_cited() -> None:
    text = cited_text()
    uncited = [path.name for path in SCRIPTS if f"benchmarks/{path.name}" not in text]
    assert not uncited, f"benchmark scripts no document cites: {uncited}"
