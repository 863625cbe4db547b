"""benchmarks/multipath_tables.py on an archive that benchmarks/results/ keeps: the tables of BENCHMARKS.md §5 print
from a fresh clone, without the prompt set the run read."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
ARCHIVE = ROOT / "benchmarks" / "results" / "int4-multipath-T1.0-distinct-prefixes-repeat.json.gz"


def test_the_tables_print_from_an_archive():
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "multipath_tables.py"), str(ARCHIVE)],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 0, run.stderr
    gbv = next(line for line in run.stdout.splitlines() if line.startswith("| gbv K=3, γ=4 |"))
    # the archive's figures as BENCHMARKS.md §5 gives them: block efficiency 1.229x BV's, speed 0.95x BV's
    assert "| 1.229 [" in gbv and "| 0.95x [0.87, 1.04] |" in gbv
    assert run.stdout.startswith("20 prompts (")


def test_a_file_that_is_not_results_is_one_line(tmp_path):
    path = tmp_path / "notes.json.gz"
    path.write_bytes(b"\x1f\x8b\x08\x00 not really gzip")
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "multipath_tables.py"), str(path)],
                         capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert run.returncode == 1 and len(run.stderr.strip().splitlines()) == 1
    assert run.stderr.startswith("error: ") and "is not a results file of `verispec bench`" in run.stderr
