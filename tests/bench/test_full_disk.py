"""A disk that fills up during `verispec bench` costs at most the prompt being saved: the results file (and the
archive) keep what they held, no scratch file stays, the run ends with one line naming the file, the error and the
filesystem (exit 2, no traceback), and `--resume` goes on from what was kept."""

from __future__ import annotations

import errno
import gzip
import json
import os
import subprocess
from pathlib import Path

import pytest

from tests.bench.test_cli import bench
from verispec.bench import report, runner
from verispec.bench.files import ResultsWriteError, write_atomically

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


class FullDisk:
    """`os.write` as a disk under `root` with room for `files` more files: the next file gets half of its first
    write, then ENOSPC (or `code`), as a real full disk does. Files elsewhere are written as usual."""

    def __init__(self, root: Path, files: int, code: int = errno.ENOSPC) -> None:
        self.root, self.files, self.code = root.resolve(), files, code
        self.state: dict[str, str] = {}  # file (by its unique scratch name) -> "room", "filling" or "full"
        self.real = os.write

    def write(self, fd: int, data) -> int:
        try:
            path = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            return self.real(fd, data)
        if not Path(path).is_relative_to(self.root):
            return self.real(fd, data)
        if path not in self.state:
            self.state[path] = "room" if self.files > 0 else "filling"
            self.files -= 1
        if self.state[path] == "room":
            return self.real(fd, data)
        if self.state[path] == "filling":  # the file that meets the full disk: part of it lands, then the error
            self.state[path] = "full"
            return self.real(fd, memoryview(data)[: max(1, len(data) // 2)])
        raise OSError(self.code, os.strerror(self.code))


@pytest.fixture
def disk(tmp_path, monkeypatch):
    """Install a `FullDisk` on tmp_path/disk; the test sets how many files fit (`disk.files`), infinite first."""
    if not Path("/proc/self/fd").is_dir():
        pytest.skip("the fault injection finds a descriptor's file through /proc")
    full = FullDisk(tmp_path / "disk", files=10**9)
    (tmp_path / "disk").mkdir()
    monkeypatch.setattr(os, "write", full.write)
    return full


def test_a_failed_write_keeps_the_old_file_and_leaves_no_scratch_file(tmp_path, disk):
    path = tmp_path / "disk" / "results.json"
    write_atomically(path, "old")
    disk.files = 0
    with pytest.raises(ResultsWriteError) as info:
        write_atomically(path, "new" * 10_000, "the results file")
    message = str(info.value)
    assert message.startswith(f"cannot write the results file {path}: No space left on device (ENOSPC)")
    assert "free on the filesystem mounted at" in message and "\n" not in message
    assert info.value.errno == errno.ENOSPC
    assert path.read_text() == "old" and sorted(p.name for p in path.parent.iterdir()) == ["results.json"]


@pytest.mark.parametrize("code", [errno.EDQUOT, errno.EIO])
def test_an_error_found_only_when_flushing_keeps_the_old_file(tmp_path, monkeypatch, code):
    path = tmp_path / "results.json"
    write_atomically(path, "old")

    def fsync(fd):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "fsync", fsync)
    with pytest.raises(ResultsWriteError, match=errno.errorcode[code]):
        write_atomically(path, "new")
    assert path.read_text() == "old" and [p.name for p in tmp_path.iterdir()] == ["results.json"]


def error_lines(err: str) -> list[str]:
    assert "Traceback" not in err
    return [line for line in err.splitlines() if line.startswith("verispec: ")]


def prompts_in(path: Path) -> list[int]:
    data = path.read_bytes()
    records = json.loads(gzip.decompress(data) if path.suffix == ".gz" else data)["records"]
    return sorted({r["prompt_index"] for r in records})


def test_a_full_disk_keeps_the_finished_prompts_and_resume_goes_on(tiny_pair_folders, tmp_path, disk, capsys):
    out = tmp_path / "disk" / "results.json"
    disk.files = 1  # the first prompt's results fit, the second's do not
    assert bench(tiny_pair_folders, tmp_path, "--out", str(out)) == 2
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1
    assert f"cannot write the results file {out}: No space left on device (ENOSPC)" in lines[0]
    assert "keeps the 1 prompt finished before" in lines[0] and "--resume" in lines[0]
    assert prompts_in(out) == [0] and [p.name for p in out.parent.iterdir()] == ["results.json"]

    disk.files = 10**9  # room again
    assert bench(tiny_pair_folders, tmp_path, "--out", str(out), "--resume") == 0
    results = json.loads(out.read_text())
    assert prompts_in(out) == [0, 1] and [r["run"] for r in results["records"]] == [0, 0, 1, 1]


def test_a_full_disk_at_the_first_save_keeps_the_file_it_was_to_replace(tiny_pair_folders, tmp_path, disk, capsys):
    out = tmp_path / "disk" / "results.json"
    out.write_text("an older run")
    disk.files = 0
    assert bench(tiny_pair_folders, tmp_path, "--out", str(out), "--force") == 2
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "no finished prompt of this run is saved" in lines[0]
    assert out.read_text() == "an older run" and len(list(out.parent.iterdir())) == 1


def test_a_full_disk_at_the_archive_keeps_the_results_and_resume_rewrites_it(tiny_pair_folders, tmp_path, disk,
                                                                             capsys):
    out, archive = tmp_path / "results.json", tmp_path / "disk" / "results.json.gz"
    disk.files = 1  # the first prompt's archive fits, the second's does not (the results file is elsewhere)
    assert bench(tiny_pair_folders, tmp_path, "--out", str(out), "--archive", str(archive)) == 2
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and f"cannot write {archive}: No space left on device" in lines[0]
    assert f"{out} holds all 2 prompts finished" in lines[0]
    assert prompts_in(out) == [0, 1] and prompts_in(archive) == [0]
    assert [p.name for p in archive.parent.iterdir()] == [archive.name]

    disk.files = 10**9
    assert bench(tiny_pair_folders, tmp_path, "--out", str(out), "--archive", str(archive), "--resume") == 0
    assert prompts_in(archive) == [0, 1]


def test_a_report_that_cannot_be_written_says_the_results_are_saved(tiny_pair_folders, tmp_path, monkeypatch, capsys):
    def no_room(*args, **kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(report, "write_report", no_room)
    out = tmp_path / "results.json"
    assert bench(tiny_pair_folders, tmp_path, "--out", str(out), "--report") == 2
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "No space left on device" in lines[0] and f"verispec report {out}" in lines[0]
    assert prompts_in(out) == [0, 1]


@pytest.fixture
def tiny_filesystem(tmp_path):
    """A real 1 MB tmpfs at tmp_path/fs, where this process may mount one (root); else the test is skipped."""
    mount = tmp_path / "fs"
    mount.mkdir()
    try:
        subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=True,
                       capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError):
        pytest.skip("cannot mount a tmpfs here (needs root and a kernel that allows it)")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], check=False, capture_output=True, timeout=30)


def fill(folder: Path) -> Path:
    """Fill the filesystem of `folder` with one file, to its last byte; return the file."""
    filler = folder / "filler"
    with open(filler, "wb", buffering=0) as handle:
        try:
            while True:
                handle.write(bytes(4096))
        except OSError as exc:
            assert exc.errno == errno.ENOSPC
    return filler


def test_a_real_full_filesystem(tiny_filesystem):
    path = tiny_filesystem / "results.json"
    write_atomically(path, "old")
    filler = fill(tiny_filesystem)
    with pytest.raises(ResultsWriteError, match=r"No space left on device \(ENOSPC\)"):
        write_atomically(path, "x" * 200_000)
    assert path.read_text() == "old" and sorted(p.name for p in tiny_filesystem.iterdir()) == ["filler", path.name]
    filler.unlink()


def test_bench_on_a_real_filesystem_that_fills_up(tiny_pair_folders, tmp_path, tiny_filesystem, monkeypatch, capsys):
    out, filled = tiny_filesystem / "results.json", []
    timed = runner.decode_one

    def fill_before_the_second_prompt(*args, **kwargs):
        if args[4] == 1 and not filled:  # the first prompt's results are saved: now the disk is full
            filled.append(fill(tiny_filesystem))
        return timed(*args, **kwargs)

    monkeypatch.setattr(runner, "decode_one", fill_before_the_second_prompt)
    assert bench(tiny_pair_folders, tmp_path, "--out", str(out)) == 2
    lines = error_lines(capsys.readouterr().err)
    assert len(lines) == 1 and "No space left on device (ENOSPC)" in lines[0] and str(out) in lines[0]
    assert prompts_in(out) == [0] and sorted(p.name for p in tiny_filesystem.iterdir()) == ["filler", out.name]
    filled[0].unlink()
    assert bench(tiny_pair_folders, tmp_path, "--out", str(out), "--resume") == 0
    assert prompts_in(out) == [0, 1]
