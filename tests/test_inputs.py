"""Inputs are checked before any model loads: prompt type and encoding, model paths, verifier files; errors are one
line naming the problem, never a library traceback."""

from __future__ import annotations

import io
import sys

import pytest

from verispec import Decoder
from verispec.cli import main
from verispec.errors import ConfigError, ModelFilesError, VerifierFileError
from verispec.inputs import check_prompt, decode_utf8

INVALID = b"def f(x):\n    return '\xff\xfe'\n"  # \xff (byte 22) can never occur in UTF-8


def one_error_line(err: str, *words: str) -> str:
    lines = [line for line in err.splitlines() if line.strip() and "Loading weights" not in line]  # progress bars
    assert len(lines) == 1 and lines[0].startswith("verispec: error:") and "Traceback" not in err, err
    assert all(w in lines[0] for w in words), err
    return lines[0]


def test_invalid_utf8_names_the_byte_offset_or_is_replaced_on_request():
    with pytest.raises(ConfigError, match=r"standard input is not valid UTF-8: byte 22 \(0xff\)"):
        decode_utf8(INVALID, "standard input")
    assert decode_utf8(INVALID, "x", replace=True) == "def f(x):\n    return '\ufffd\ufffd'\n"


@pytest.mark.parametrize("prompt, message", [
    (["hello"], "must be a str"),
    (b"hello", "must be a str"),
    (None, "must be a str"),
    ("   ", "prompt is empty"),
    ("ab\udcffcd", r"not valid UTF-8: byte 2 \(0xff\)"),
    ("ab\ud800cd", "invalid UTF-8 at character 2"),
])
def test_bad_prompts_are_named(prompt, message):
    with pytest.raises(ConfigError, match=message):
        check_prompt(prompt)


def test_the_api_says_what_is_wrong_with_a_list_prompt(tiny_pair):
    decoder = Decoder(tiny_pair["target"], tiny_pair["partial"])
    with pytest.raises(ConfigError, match="must be a str, got list"):
        decoder.generate(["hello"], max_new_tokens=2)
    with pytest.raises(ConfigError, match="must be a str, got list"):
        decoder.encode_prompt(["hello"])


def stdin_bytes(monkeypatch, data: bytes) -> None:
    monkeypatch.setattr(sys, "stdin", io.TextIOWrapper(io.BytesIO(data), encoding="utf-8"))


def test_cli_invalid_utf8_from_stdin_and_argv(tiny_folder, monkeypatch, capsys):
    models = ["--target", str(tiny_folder), "--draft", str(tiny_folder), "--linear-backend", "torch",
              "--max-new-tokens", "3", "--no-chat-template"]
    stdin_bytes(monkeypatch, INVALID)
    assert main(["generate", "-", *models]) == 2
    one_error_line(capsys.readouterr().err, "byte 22", "--replace-invalid-utf8")
    stdin_bytes(monkeypatch, INVALID)
    assert main(["generate", "-", "--replace-invalid-utf8", *models]) == 0
    capsys.readouterr()
    argv_prompt = INVALID.decode("utf-8", "surrogateescape")  # how Python hands over undecodable argv bytes
    assert main(["generate", argv_prompt, *models]) == 2
    one_error_line(capsys.readouterr().err, "byte 22")


def test_a_prompt_file_with_invalid_utf8_is_one_line(tmp_path, capsys):
    path = tmp_path / "prompts.txt"
    path.write_bytes(b"fine\n" + INVALID)
    assert main(["bench", "--prompts", str(path), "--out", str(tmp_path / "r.json")]) == 2
    assert "--replace" not in one_error_line(capsys.readouterr().err, str(path), "byte 27")


@pytest.mark.parametrize("kind", ["empty folder", "missing path", "relative missing path", "a plain file"])
def test_a_path_with_no_model_is_named_before_loading(tmp_path, capsys, kind):
    empty = tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "notes.txt").write_text("not a model")
    spec = {"empty folder": str(empty), "missing path": str(tmp_path / "nowhere"),
            "relative missing path": "models/x/y", "a plain file": str(tmp_path / "notes.txt")}[kind]
    with pytest.raises(ModelFilesError, match="no model|not a model|not found|neither"):
        Decoder(spec)  # at construction: before any other model loads
    assert main(["generate", "hi", "--target", spec]) == 2
    line = one_error_line(capsys.readouterr().err)
    assert "Repo id" not in line


def test_a_bad_verifier_file_is_reported_before_models_load(tmp_path, capsys):
    bad = tmp_path / "verifier.safetensors"
    bad.write_bytes(b"not safetensors")
    with pytest.raises(VerifierFileError, match="not a readable safetensors"):
        Decoder("never/loaded", verifier=str(bad))
    with pytest.raises(VerifierFileError, match="not found"):
        Decoder("never/loaded", verifier=str(tmp_path / "missing.safetensors"))
    assert main(["generate", "hi", "--method", "sprinter", "--verifier", str(bad), "--target", "never/loaded"]) == 2
    one_error_line(capsys.readouterr().err, str(bad))


def test_tiny_temperature_runs_as_the_greedy_limit(tiny_folder, capsys):
    models = ["--target", str(tiny_folder), "--draft", str(tiny_folder), "--linear-backend", "torch",
              "--max-new-tokens", "6", "--no-chat-template", "--json"]
    assert main(["generate", "hello", "--temperature", "1e-320", "--method", "sd", *models]) == 0
    tiny = __import__("json").loads(capsys.readouterr().out)
    assert main(["generate", "hello", "--method", "ar", *models]) == 0
    greedy = __import__("json").loads(capsys.readouterr().out)
    assert tiny["tokens"] == greedy["tokens"]


def test_compare_prompt_file_errors_are_one_line(tmp_path, capsys):
    assert main(["compare", "--prompts", str(tmp_path / "missing.txt")]) == 2
    one_error_line(capsys.readouterr().err, "prompt file not found")
    bad = tmp_path / "bad.txt"
    bad.write_bytes(INVALID)
    assert main(["compare", "--prompts", str(bad)]) == 2
    one_error_line(capsys.readouterr().err, "byte 22")


def test_a_truncated_model_folder_is_named_before_loading(tiny_folder, tmp_path, capsys):
    import shutil

    copy = tmp_path / "truncated"
    shutil.copytree(tiny_folder, copy)
    weights = copy / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:-1000])
    with pytest.raises(ModelFilesError, match=r"model\.safetensors.*truncated"):
        Decoder(str(copy))
    assert main(["generate", "hi", "--target", str(copy)]) == 2
    one_error_line(capsys.readouterr().err, "model.safetensors")
