"""The command line: user errors exit 2 with a one-line message, never a traceback."""

from __future__ import annotations

import json

import pytest

from verispec.cli import main


@pytest.mark.parametrize(
    "argv, message",
    [
        (["generate", "hi", "--method", "nope"], "unknown method 'nope'"),
        (["generate", "hi", "--temperature", "-1"], "temperature"),
        (["generate", "hi", "--top-p", "2"], "top_p"),
        (["generate", "hi", "--gamma", "0"], "gamma"),
        (["generate", "", "--method", "ar"], "prompt is empty"),
        (["generate", "hi", "--dtype", "int3"], "unknown dtype"),
    ],
)
def test_user_errors_exit_2_with_a_message(capsys, argv, message):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.startswith("verispec: error:") and message in err
    assert "Traceback" not in err


def test_models_json_lists_the_default_pair(capsys):
    assert main(["models", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    roles = {m["role"]: m for m in data["models"]}
    assert roles["target"]["upstream"] == "Qwen/Qwen2.5-Coder-1.5B-Instruct"
    assert roles["draft"]["sha256_expected"].startswith("1d9614638d18")
