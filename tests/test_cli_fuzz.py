"""A bounded, seeded fuzz of the command line's parsing and validation: random and truncated argument lists.

Every outcome must be exit 0, or exit 2 with one line on stderr, or reaching model loading (stubbed out here:
validation passed); never a traceback. Model loading and `setup` are replaced by a marker exception, so the fuzz
exercises everything before them in seconds.
"""

from __future__ import annotations

import io
import random
import sys

import pytest

from verispec.cli import main

CASES = 300


class WouldLoad(Exception):
    """Raised where a model would load: everything before it accepted the arguments."""


SUBCOMMANDS = ["generate", "models", "setup", "compare", "bench", "report", "pareto", "archive", "fixed-blocks",
               "verifier", "gen", "", "--x"]
OPTIONS = ["--gamma", "--temperature", "--top-k", "--top-p", "--max-new-tokens", "--seed", "--paths", "--method",
           "--methods", "--out", "--prompts", "--limit", "--offset", "--target", "--draft", "--dtype", "--verifier",
           "--resume", "--force", "--archive", "--json", "--verify", "--no-chat-template", "--replace-invalid-utf8",
           "--category", "--baseline", "--tau", "--cap", "--device", "--linear-backend", "--subset-seed", "-h"]
VALUES = ["0", "-1", "1", "3", "1e-320", "nan", "inf", "-0.5", "2", "0.9", "x", "none", "sd", "ar", "gbv", "zzz",
          "sd:gamma=2", "sd:gamma=x", "builtin", "mt-bench", "float32", "int3", "onednn", "-", "", " ", "\udcff",
          "ü∂ß", "a" * 300, "pack", "unpack", "train", "eval", "collect"]


def paths(tmp_path):
    empty = tmp_path / "empty-folder"
    empty.mkdir(exist_ok=True)
    plain = tmp_path / "plain.txt"
    plain.write_text("a prompt\n")
    results = tmp_path / "results.json"
    results.write_text('{"records": [{"prompt_index": "x"}]}')
    return [str(empty), str(plain), str(results), str(tmp_path / "missing.json"), str(plain / "below-a-file.json"),
            str(tmp_path / "out" / "new.json"), "models/x/y", "~/nowhere.gguf"]


def random_argv(rng: random.Random, path_values: list[str]) -> list[str]:
    argv = [rng.choice(SUBCOMMANDS)]
    if argv[0] == "archive":
        argv.append(rng.choice(["pack", "unpack", "zip"]))
    if argv[0] == "verifier":
        argv.append(rng.choice(["train", "eval", "collect", "nope"]))
    for _ in range(rng.randrange(0, 8)):
        kind = rng.random()
        if kind < 0.45:
            argv.append(rng.choice(OPTIONS))
        elif kind < 0.8:
            argv.append(rng.choice(VALUES))
        else:
            argv.append(rng.choice(path_values))
    if rng.random() < 0.3:  # truncated: cut anywhere, even inside an option's name
        cut = rng.randrange(0, len(" ".join(argv)) + 1)
        argv = " ".join(argv)[:cut].split(" ")
    return argv


@pytest.fixture
def sandbox(tmp_path, monkeypatch):
    """Model loading and setup replaced by WouldLoad; cache and working folder in a temporary folder."""
    from verispec.models import default_pair, loading, spec

    def would_load(*args, **kwargs):
        raise WouldLoad

    monkeypatch.setattr(spec, "load_model", would_load)
    monkeypatch.setattr(loading, "load_model", would_load)
    monkeypatch.setattr(default_pair, "setup", would_load)
    monkeypatch.setenv("VERISPEC_CACHE", str(tmp_path / "cache"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_random_and_truncated_argv_never_give_a_traceback(sandbox, monkeypatch, capsys):
    rng = random.Random(0)
    path_values = paths(sandbox)
    outcomes = {"ok": 0, "error": 0, "would load": 0}
    for case in range(CASES):
        argv = random_argv(rng, path_values)
        stdin = bytes(rng.randrange(256) for _ in range(rng.randrange(0, 40)))
        monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(stdin), encoding="utf-8"))
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse: --help (0) and usage errors (2)
            code = exc.code
        except WouldLoad:
            outcomes["would load"] += 1
            capsys.readouterr()
            continue
        except Exception as exc:  # noqa: BLE001 - the point: nothing else may escape
            pytest.fail(f"case {case}: {argv!r} raised {type(exc).__name__}: {exc}")
        err = capsys.readouterr().err
        assert "Traceback" not in err, (case, argv, err)
        if code == 0:
            outcomes["ok"] += 1
            continue
        lines = [line for line in err.splitlines() if line.strip()]
        assert code == 2 and len(lines) == 1 and lines[0].startswith("verispec: error:"), (case, argv, code, err)
        outcomes["error"] += 1
    assert all(outcomes.values()), outcomes  # the fuzz reached every kind of outcome
