"""`verispec bench` end to end on tiny model folders: --quality scores every output, --archive keeps the results."""

from __future__ import annotations

import json

import pytest

from verispec.bench.archive import unpack
from verispec.cli import main

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def bench(folders, tmp_path, *options: str) -> int:
    prompts = tmp_path / "prompts.txt"
    prompts.write_text("def add(a, b):\nhello there\n")
    return main(["bench", "--prompts", str(prompts), "--methods", "ar", "sd", "--target", folders["target"],
                 "--draft", folders["draft"], "--dtype", "float64", "--max-new-tokens", "5", "--gamma", "2",
                 "--warmup-tokens", "0", "--bootstrap-resamples", "20", "--no-progress", *options])


def test_bench_quality_and_archive_through_the_command(tiny_pair_folders, tmp_path, capsys):
    out, archive = tmp_path / "run" / "results.json", tmp_path / "kept" / "results.json.gz"
    assert bench(tiny_pair_folders, tmp_path, "--quality", "--archive", str(archive), "--out", str(out)) == 0
    printed = capsys.readouterr().out
    results = json.loads(out.read_text())
    assert results["config"]["quality"] is True and len(results["records"]) == 4
    for record in results["records"]:
        quality = record["quality"]
        assert quality["tokens"] == len(record["tokens"]) and quality["rouge_l_vs_ar"] == 1.0  # greedy sd is exact
    rows = {row["method"]: row for row in results["aggregate"]}
    assert rows["ar"]["nll_per_token"] == rows["sd"]["nll_per_token"] is not None
    assert "rouge" in printed.lower() and f"results: {out}" in printed  # the quality table is printed too
    # The archive holds the same run: unpacked (the prompt texts read back from the prompt file), it is the file.
    unpack(archive, tmp_path / "unpacked.json")
    assert json.loads((tmp_path / "unpacked.json").read_text()) == results
    assert "def add" not in archive.read_bytes().decode("latin-1")  # no prompt text in what gets committed

    plain = tmp_path / "plain.json"
    assert bench(tiny_pair_folders, tmp_path, "--out", str(plain)) == 0
    results = json.loads(plain.read_text())
    assert results["config"]["quality"] is False and all("quality" not in r for r in results["records"])
    assert not list(tmp_path.glob("plain*.gz"))  # no archive unless asked
