"""`verispec generate --logit-bias / --presence-penalty / --frequency-penalty / --logprobs`: parsing, refusals with
exit status 2, and the log-probabilities in the output."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from verispec.cli import build_parser, main
from verispec.options import decode_config

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def run(*argv: str) -> tuple[int, str, str]:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            status = main(list(argv))
        except SystemExit as exc:  # argparse's own errors
            status = exc.code
    return status, out.getvalue(), err.getvalue()


def test_the_options_parse_into_the_decode_config():
    args = build_parser().parse_args(["generate", "hi", "--logit-bias", "5=-100", "7=2.5", "--logit-bias", "9=1",
                                      "--presence-penalty", "0.5", "--frequency-penalty", "-1", "--logprobs", "3"])
    config = decode_config(args)
    assert config.logit_bias == {5: -100.0, 7: 2.5, 9: 1.0}
    assert (config.presence_penalty, config.frequency_penalty, config.logprobs) == (0.5, -1.0, 3)
    plain = decode_config(build_parser().parse_args(["generate", "hi"]))
    assert (plain.logit_bias, plain.presence_penalty, plain.frequency_penalty, plain.logprobs) == (None, 0, 0, None)


@pytest.mark.parametrize(("options", "message"), [
    (["--logit-bias", "5"], "expected ID=BIAS"),
    (["--logit-bias", "x=1"], "expected ID=BIAS"),
    (["--logit-bias", "5=much"], "expected ID=BIAS"),
    (["--logit-bias", "5=200"], r"logit_bias: the bias of token 5 must be a number in [-100, 100]"),
    (["--presence-penalty", "3"], "presence_penalty must be a number in [-2, 2]"),
    (["--frequency-penalty", "-2.5"], "frequency_penalty must be a number in [-2, 2]"),
    (["--logprobs", "21"], "logprobs (the alternatives reported per token) must be an integer in [0, 20]"),
])
def test_bad_values_exit_2_before_loading_anything(options, message):
    status, out, err = run("generate", "hi", "--target", "/nonexistent", *options)
    assert status == 2 and out == ""
    assert message in err


@pytest.fixture(scope="module")
def folders(tiny_pair_folders):
    return tiny_pair_folders


def test_logprobs_in_the_json_and_on_standard_error(folders):
    common = ["generate", "def add(a, b):", "--target", folders["target"], "--draft", folders["draft"], "--dtype",
              "float64", "--max-new-tokens", "8", "--method", "sd", "--logprobs", "2", "--logit-bias", "3=-100",
              "--presence-penalty", "0.5", "--no-chat-template"]
    status, out, err = run(*common, "--json")
    assert status == 0, err
    result = json.loads(out)
    assert [entry["token"] for entry in result["logprobs"]] == result["tokens"]
    assert all(len(entry["top"]) == 2 and entry["logprob"] <= 0 for entry in result["logprobs"])
    assert result["config"]["logit_bias"] == {"3": -100.0} and 3 not in result["tokens"]
    status, out, err = run(*common)
    assert status == 0, err
    lines = [line for line in err.splitlines() if line.startswith("logprob ")]
    assert len(lines) == len(result["tokens"]) and all("| top: " in line for line in lines)
