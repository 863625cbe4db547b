"""Reports: a markdown table from a results file, and a speedup plot written as a PNG."""

from __future__ import annotations

import json

import pytest

from tests.bench.results_dicts import results_dict
from verispec.bench.metrics import summarize
from verispec.bench.report import FULL_COLUMNS, format_table, full_columns, write_report
from verispec.bench.runner import BenchConfig
from verispec.cli import main
from verispec.errors import ConfigError


def _record(method, index, seconds, drafted=0, accepted=0, tokens=8):
    rounds = [dict(drafted=drafted, accepted=accepted, emitted=accepted + 1, fed=drafted + 1, time_draft=0.001,
                   time_decode=0.01, time_verify=0.0) for _ in range(tokens // (accepted + 1))]
    generated = sum(r["emitted"] for r in rounds)
    trace = dict(rounds=rounds, generated=generated, time_total=seconds, target_calls=len(rounds),
                 draft_calls=drafted * len(rounds), time_draft=0.001 * len(rounds), time_target=0.01 * len(rounds),
                 time_verify=0.0)
    return dict(method=method, prompt_index=index, prompt_id=str(index), tokens=list(range(generated)), trace=trace)


@pytest.fixture()
def results_file(tmp_path):
    records = [r for i in range(4) for r in (_record("ar", i, 1.0 + 0.1 * i), _record("sd", i, 0.5, 4, 3))]
    config = BenchConfig(methods=["ar", "sd"], gamma=4)
    results = results_dict(config, records, 500)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results))
    return path, results


def test_report_writes_markdown_table_and_png(results_file):
    path, results = results_file
    markdown, md_path, png_path = write_report(path)
    assert md_path == path.with_suffix(".md") and md_path.read_text().startswith(markdown)
    assert format_table(results["aggregate"], FULL_COLUMNS) in markdown
    sd_row = next(line for line in markdown.splitlines() if line.startswith("| sd |"))
    assert "| 4 | 32 |" in sd_row and "| 0.750 |" in sd_row  # 4 prompts, 32 tokens, acceptance 3/4
    speedup = results["aggregate"][1]["speedup"]
    assert f"| {speedup:.2f}x |" in sd_row
    assert "4 prompts from `builtin`" in markdown and "commit 0123456789ab" in markdown
    data = png_path.read_bytes()
    assert png_path.name == "results_speedup.png" and data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 5000
    assert "![speedup](results_speedup.png)" in md_path.read_text()


def test_report_splits_the_prompt_round_from_the_decode_rounds(results_file):
    _, results = results_file
    markdown, _, _ = write_report(results_file[0])
    section = markdown[markdown.index("## Prompt round and decode rounds"):]
    assert "| decode-round speedup vs ar | 95% CI | whole-decode speedup vs ar | theoretical speedup |" in section
    sd = results["aggregate"][1]
    sd_row = next(line for line in section.splitlines() if line.startswith("| sd |"))
    # The section recomputes the split from the records; it must agree with the aggregate stored at run time.
    assert f"| {sd['prompt_round_share']:.0%} |" in sd_row and f"| {sd['decode_speedup']:.2f}x |" in sd_row
    assert f"| {sd['theoretical_speedup']:.2f}x |" in sd_row


def test_report_shows_the_speedup_over_the_compare_to_method(results_file, tmp_path):
    _, results = results_file
    config = BenchConfig(methods=["ar", "sd"], gamma=4, compare_to="sd")
    results["config"] = config.to_dict()
    results["aggregate"] = summarize(results["records"], config.methods, "ar", 4, 500, 0, compare_to="sd")
    path = tmp_path / "versus.json"
    path.write_text(json.dumps(results))
    markdown, _, _ = write_report(path)
    header = next(line for line in markdown.splitlines() if line.startswith("| method |"))
    assert "| speedup | 95% CI | vs sd | 95% CI vs sd |" in header
    ar_row = next(line for line in markdown.splitlines() if line.startswith("| ar |"))
    versus, ci = results["aggregate"][0]["speedup_vs_sd"], results["aggregate"][0]["speedup_vs_sd_ci95"]
    assert versus < 1 and f"| {versus:.2f}x | [{ci[0]:.2f}, {ci[1]:.2f}] |" in ar_row  # ar is slower than sd
    assert full_columns(None) == FULL_COLUMNS and "'vs sd' is the same against `sd`" in markdown


def test_report_gives_block_efficiency_and_wall_time_with_intervals(results_file, tmp_path):
    _, results = results_file
    results["config"] = BenchConfig(methods=["ar", "sd"], gamma=4, compare_to="ar").to_dict()
    path = tmp_path / "efficiency.json"
    path.write_text(json.dumps(results))
    markdown, _, _ = write_report(path)
    section = markdown[markdown.index("## Block efficiency and wall time"):]
    header = next(line for line in section.splitlines() if line.startswith("| method |"))
    assert "| ms/token [95% CI] | tokens/target call [95% CI] | tokens/target call vs ar [95% CI] |" in header
    sd_row = next(line for line in section.splitlines() if line.startswith("| sd |"))
    # sd: 2 calls of 4 tokens on every prompt, ar: 8 calls of 1; sd takes 0.5 s per prompt for 8 tokens.
    assert "| 62.5 [62.5, 62.5] | 4.00 [4.00, 4.00] | 4.000 [4.000, 4.000] |" in sd_row
    assert f"| {results['aggregate'][1]['speedup']:.2f}x [" in sd_row


def test_report_cli_prints_the_table_and_takes_paths(results_file, tmp_path, capsys):
    path, _ = results_file
    assert main(["report", str(path), "--markdown", str(tmp_path / "r" / "x.md"), "--plot",
                 str(tmp_path / "p" / "x.png")]) == 0
    out = capsys.readouterr().out
    assert "| method | prompts | tokens | ms/token | speedup | 95% CI |" in out
    assert (tmp_path / "r" / "x.md").is_file() and (tmp_path / "p" / "x.png").is_file()


def test_report_rejects_a_file_that_is_not_results(tmp_path, capsys):
    path = tmp_path / "other.json"
    path.write_text('{"a": 1}')
    with pytest.raises(ConfigError, match="not a results file of `verispec bench`"):
        write_report(path)
    assert main(["report", str(tmp_path / "missing.json")]) == 2
    assert "cannot read results file" in capsys.readouterr().err


def test_report_of_an_archive_matches_the_report_of_its_results_file(results_file, tmp_path, capsys):
    from verispec.bench.archive import write_archive

    path, results = results_file
    results["records"] = [{**record, "prompt": f"prompt {record['prompt_index']}"} for record in results["records"]]
    path.write_text(json.dumps(results))
    archive = tmp_path / "kept" / "results.json.gz"
    write_archive(results, archive)
    from_file, _, _ = write_report(path)
    from_archive, md_path, png_path = write_report(archive)
    assert from_archive == from_file
    # beside the archive, named after it without `.json.gz`
    assert (md_path, png_path) == (tmp_path / "kept" / "results.md", tmp_path / "kept" / "results_speedup.png")
    archive.write_bytes(archive.read_bytes()[:40])  # cut off mid-stream
    assert main(["report", str(archive)]) == 2
    err = capsys.readouterr().err
    assert len(err.strip().splitlines()) == 1 and "is not a results file of `verispec bench`" in err
