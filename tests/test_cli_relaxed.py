"""The command line with the lossy rules and SPRINTER's verifier file: bad input is one clear line, exit 2."""

from __future__ import annotations

import pytest
import torch

from verispec.cli import main
from verispec.learned.verifier import LearnedVerifier


def error_of(capsys, argv) -> str:
    assert main(argv) == 2
    err = capsys.readouterr().err  # model loading may draw progress bars first
    last = err.rstrip("\n").rsplit("\n", 1)[-1].rsplit("\r", 1)[-1]
    assert last.startswith("verispec: error:") and "Traceback" not in err
    return last


@pytest.mark.parametrize("method, message", [
    ("typical:epsilon=2", "typical_epsilon must be a number in [0, 1], got 2.0"),
    ("margin:delta=-0.5", "margin_delta must be a number in [0, inf]"),
    ("fuzzy:threshold=1", "fuzzy_threshold must be a number in [0, 0.693147]"),
    ("fly:window=0", "fly_window must be an integer >= 1"),
    ("fly:window=4", "fly_window (W) must be < gamma (4)"),
    ("margin:epsilon=0.1", "bad setting 'epsilon=0.1'"),
    ("typical:epsilon=abc", "bad value 'abc' for typical_epsilon"),
])
def test_lossy_knobs_out_of_range_exit_2_before_loading_models(capsys, method, message):
    assert message in error_of(capsys, ["generate", "hi", "--method", method])


@pytest.fixture(scope="module")
def pair_folders(tiny_pair, tmp_path_factory):
    folders = {}
    for role, key in (("target", "target"), ("draft", "partial")):
        folders[role] = tmp_path_factory.mktemp(role)
        tiny_pair[key].model.save_pretrained(folders[role])
        tiny_pair[key].tokenizer.save_pretrained(folders[role])
    return folders


def test_sprinter_with_a_verifier_for_another_draft_model_is_a_clear_error(capsys, tmp_path, tiny_pair,
                                                                           pair_folders):
    hidden = tiny_pair["partial"].model.config.hidden_size
    path = tmp_path / "other.safetensors"
    LearnedVerifier(torch.zeros(hidden, dtype=torch.float64), 0.0, "context", 0.5, 1.0, hidden,
                    "Qwen/some-other-draft").save(path)
    err = error_of(capsys, ["generate", "hi", "--target", str(pair_folders["target"]), "--draft",
                            str(pair_folders["draft"]), "--method", "sprinter", "--verifier", str(path),
                            "--max-new-tokens", "2"])
    assert "made for draft model 'Qwen/some-other-draft'" in err


def test_a_lossy_rule_with_knobs_runs_from_the_command_line(capsys, pair_folders):
    argv = ["generate", "hi", "--target", str(pair_folders["target"]), "--draft", str(pair_folders["draft"]),
            "--method", "margin:delta=2", "--temperature", "1", "--max-new-tokens", "4", "--json"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert '"margin_delta": 2.0' in out and '"method": "margin"' in out
