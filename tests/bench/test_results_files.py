"""Results files are never lost: an existing file is not overwritten without --resume or --force, an unwritable
--out or --archive is refused before any model loads, Ctrl-C keeps the finished prompts and exits 130, and a file
of the wrong shape is a one-line error in every reader."""

from __future__ import annotations

import gzip
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from verispec.bench import runner
from verispec.cli import main

TINY_BENCH = ["--methods", "ar", "sd", "--max-new-tokens", "4", "--warmup-tokens", "0", "--bootstrap-resamples",
              "10", "--linear-backend", "torch", "--no-chat-template", "--no-progress"]


def prompts_file(tmp_path: Path, n: int = 2) -> Path:
    path = tmp_path / "prompts.txt"
    path.write_text("".join(f"prompt number {i} says hello\n" for i in range(n)))
    return path


def bench_argv(tiny_folder: Path, prompts: Path, out: Path, *extra: str) -> list[str]:
    return ["bench", "--target", str(tiny_folder), "--draft", str(tiny_folder), "--prompts", str(prompts),
            "--out", str(out), *TINY_BENCH, *extra]


def one_error_line(err: str, *words: str) -> None:
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("verispec: error:"), err
    assert "Traceback" not in err and all(w in lines[0] for w in words), err


@pytest.fixture
def no_model_loading(monkeypatch):
    """Fail the test if the bench gets as far as building a decoder."""
    def refuse(*args, **kwargs):
        raise AssertionError("models were loaded before the output paths were checked")
    monkeypatch.setattr(runner, "Decoder", refuse)


def test_an_existing_results_file_is_not_overwritten(tmp_path, tiny_folder, capsys, no_model_loading):
    out = tmp_path / "results.json"
    out.write_text('{"earlier": "results"}')
    assert main(bench_argv(tiny_folder, prompts_file(tmp_path), out)) == 2
    one_error_line(capsys.readouterr().err, str(out), "--resume", "--force")
    assert out.read_text() == '{"earlier": "results"}'
    archive = tmp_path / "results.json.gz"
    archive.write_bytes(b"committed")
    assert main(bench_argv(tiny_folder, prompts_file(tmp_path), tmp_path / "new.json", "--archive", str(archive))) == 2
    one_error_line(capsys.readouterr().err, str(archive), "--force")


def test_force_overwrites(tmp_path, tiny_folder, capsys):
    out = tmp_path / "results.json"
    out.write_text('{"earlier": "results"}')
    assert main(bench_argv(tiny_folder, prompts_file(tmp_path), out, "--force")) == 0
    assert len(json.loads(out.read_text())["records"]) == 4


@pytest.mark.parametrize("option", ["--out", "--archive"])
def test_an_unwritable_output_is_refused_before_models_load(tmp_path, tiny_folder, capsys, no_model_loading, option):
    blocker = tmp_path / "a-file"
    blocker.write_text("not a folder")
    bad = blocker / "results.json"  # its folder is a file: nothing can be written there, even as root
    out = bad if option == "--out" else tmp_path / "results.json"
    extra = ["--archive", str(bad)] if option == "--archive" else []
    assert main(bench_argv(tiny_folder, prompts_file(tmp_path), out, *extra)) == 2
    one_error_line(capsys.readouterr().err, str(bad), "cannot write")
    if option == "--out":
        os.chmod(tmp_path, 0o500)
        try:
            if os.access(tmp_path, os.W_OK):  # root writes anywhere: the permission case cannot be staged
                return
            assert main(bench_argv(tiny_folder, prompts_file(tmp_path), tmp_path / "r.json")) == 2
            one_error_line(capsys.readouterr().err, "cannot write")
        finally:
            os.chmod(tmp_path, 0o700)


def test_ctrl_c_during_a_bench_saves_finished_prompts_and_exits_130(tmp_path, tiny_folder):
    out = tmp_path / "results.json"
    argv = bench_argv(tiny_folder, prompts_file(tmp_path, 400), out)
    argv[argv.index("4")] = "100"  # max new tokens: long enough that the run is still going when interrupted
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path), "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1",
           "HF_HUB_DISABLE_PROGRESS_BARS": "1"}  # no "Loading weights" bars: stderr holds only what verispec says
    # A shell starts background jobs with SIGINT ignored, and a Python started so never raises KeyboardInterrupt:
    # give the bench the default disposition, as a terminal would, whatever ran the tests.
    run = subprocess.Popen([sys.executable, "-m", "verispec", *argv], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                           env=env, text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 180
    while not out.exists() and run.poll() is None and time.monotonic() < deadline:
        time.sleep(0.1)
    assert run.poll() is None, run.communicate()[1]
    run.send_signal(signal.SIGINT)
    _, err = run.communicate(timeout=60)
    assert run.returncode == 130, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "interrupted" in lines[0] and str(out) in lines[0] and "--resume" in lines[0], err
    saved = json.loads(out.read_text())
    assert saved["records"] and {r["method"] for r in saved["records"]} == {"ar", "sd"}
    assert not [p for p in tmp_path.iterdir() if "partial" in p.name]  # no scratch file left behind


def test_ctrl_c_anywhere_is_one_line_and_130(monkeypatch, capsys):
    from verispec import cli

    def interrupted(args):
        raise KeyboardInterrupt
    monkeypatch.setattr(cli, "cmd_models", interrupted)
    assert main(["models"]) == 130
    err = capsys.readouterr().err
    assert err.strip() == "verispec: interrupted"


WRONG_SHAPES = [  # wrong for every reader
    [],
    {"aggregate": [], "records": []},
    {"aggregate": [{"method": "ar"}], "records": [{}], "config": {}},
    {"aggregate": [], "records": [{"prompt_index": 0, "prompt_id": "1", "method": "ar", "prompt_sha256": 3}],
     "config": {"prompts": "builtin"}},
    {"aggregate": [], "records": [{"prompt_index": "0", "prompt_id": "1", "method": "ar", "prompt": "x"}],
     "config": {"prompts": "builtin"}},
]
WRONG_AGGREGATES = [  # wrong for the report, which reads the aggregate rows
    {"aggregate": "x", "records": [], "config": {"prompts": "builtin"}},
    {"aggregate": [1], "records": [], "config": {"prompts": "builtin"}},
    {"aggregate": [{"method": "ar", "speedup": "fast"}], "records": [], "config": {"prompts": "builtin"}},
]


@pytest.mark.parametrize("data", WRONG_SHAPES + WRONG_AGGREGATES)
def test_report_of_a_wrong_shape_is_one_line(tmp_path, capsys, data):
    path = tmp_path / "results.json"
    path.write_text(json.dumps(data))
    assert main(["report", str(path)]) == 2
    one_error_line(capsys.readouterr().err, str(path))


@pytest.mark.parametrize("data", WRONG_SHAPES)
def test_unpack_of_a_wrong_shape_is_one_line(tmp_path, capsys, data):
    path = tmp_path / "results.json.gz"
    path.write_bytes(gzip.compress(json.dumps(data).encode()))
    assert main(["archive", "unpack", str(path), str(tmp_path / "out.json")]) == 2
    one_error_line(capsys.readouterr().err, str(path))
    assert not (tmp_path / "out.json").exists()


@pytest.mark.parametrize("data", WRONG_SHAPES)
def test_pack_and_resume_of_a_wrong_shape_are_one_line(tmp_path, tiny_folder, capsys, no_model_loading, data):
    path = tmp_path / "results.json"
    path.write_text(json.dumps({"schema": runner.SCHEMA, **data} if isinstance(data, dict) else data))
    assert main(["archive", "pack", str(path), str(tmp_path / "a.json.gz")]) == 2
    one_error_line(capsys.readouterr().err, str(path))
    assert main(bench_argv(tiny_folder, prompts_file(tmp_path), path, "--resume")) == 2
    one_error_line(capsys.readouterr().err, str(path))


def test_atomic_writes_keep_the_usual_file_mode(tmp_path):
    from verispec.bench.files import write_atomically

    umask = os.umask(0o022)
    try:
        write_atomically(tmp_path / "r.json", "{}")
    finally:
        os.umask(umask)
    assert (tmp_path / "r.json").stat().st_mode & 0o777 == 0o644
    assert [p.name for p in tmp_path.iterdir()] == ["r.json"]
