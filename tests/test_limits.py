"""Context length: a prompt plus max_new_tokens beyond a model's positions is refused before decoding."""

from __future__ import annotations

import pytest

from verispec import Decoder
from verispec.cli import main
from verispec.errors import ConfigError
from verispec.limits import check_context
from verispec.models.tabular import TabularLM


def test_context_length_reads_the_models_positions(tiny_pair):
    assert tiny_pair["target"].context_length == 512
    assert TabularLM(3, seed=0).context_length is None  # unknown: not checked
    check_context(10**6, 10**6, TabularLM(3, seed=0), None)


def test_check_context_names_both_numbers_and_the_limit(tiny_pair):
    check_context(412, 100, tiny_pair["target"], tiny_pair["partial"])  # exactly fills the context
    with pytest.raises(ConfigError, match=r"420 tokens.*max_new_tokens 600.*1020.*512") as info:
        check_context(420, 600, tiny_pair["target"], tiny_pair["partial"])
    assert "target" in str(info.value)
    with pytest.raises(ConfigError, match="draft"):
        check_context(420, 600, None, tiny_pair["partial"])


def test_an_over_long_prompt_is_refused_before_decoding(tiny_pair, monkeypatch):
    from verispec import api

    decoder = Decoder(tiny_pair["target"], tiny_pair["partial"])

    def no_decoding(*args, **kwargs):
        raise AssertionError("decoding started")
    monkeypatch.setattr(api.Engine, "decode", no_decoding)
    for method in ("ar", "sd"):
        with pytest.raises(ConfigError, match="1020"):
            decoder.generate("a" * 420, method=method, max_new_tokens=600, chat_template=False)


def test_cli_refuses_an_over_long_prompt_with_one_line(tiny_folder, capsys):
    argv = ["generate", "a" * 420, "--target", str(tiny_folder), "--draft", str(tiny_folder), "--max-new-tokens",
            "600", "--no-chat-template", "--linear-backend", "torch"]
    assert main(argv) == 2
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip() and "Loading weights" not in line]
    assert len(err) == 1 and err[0].startswith("verispec: error:") and "420" in err[0] and "512" in err[0]
