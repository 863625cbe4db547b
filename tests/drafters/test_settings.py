"""Drafter settings from the command line, the API and bench variants reach `DecodeConfig`; bad ones exit cleanly."""

from __future__ import annotations

import pytest

import verispec.api as api
from verispec.cli import main
from verispec.engine import DecodeConfig
from verispec.errors import ConfigError
from verispec.variants import parse_method


def test_cli_flags_parse_into_the_decode_config(monkeypatch, capsys):
    seen = {}

    def fake_generate(self, prompt, config=None, *, chat_template=True, stop_text=None, **settings):
        seen["config"] = (config or DecodeConfig()).with_settings(**settings)  # what the CLI hands the API
        raise ConfigError("stop here")

    monkeypatch.setattr(api.Decoder, "generate", fake_generate)
    argv = ["generate", "hi", "--method", "bv", "--drafter", "hybrid", "--ngram-min", "1", "--ngram-max", "5",
            "--draft-vocab", "8192", "--hybrid-catchup", "0.5"]
    assert main(argv) == 2
    config = seen["config"]
    assert (config.method, config.drafter, config.ngram_min, config.ngram_max, config.draft_vocab,
            config.hybrid_catchup) == ("bv", "hybrid", 1, 5, 8192, 0.5)
    assert main(["generate", "hi"]) == 2
    assert seen["config"].drafter == DecodeConfig().drafter and seen["config"].draft_vocab is None


@pytest.mark.parametrize(
    "argv, message",
    [
        (["--drafter", "nope"], "unknown drafter 'nope'"),
        (["--drafter", "ngram", "--ngram-min", "4", "--ngram-max", "2"], "must not exceed ngram_max"),
        (["--drafter", "ngram", "--ngram-min", "0"], "ngram_min"),
        (["--draft-vocab", "1"], "draft_vocab"),
        (["--drafter", "hybrid", "--hybrid-catchup", "-2"], "hybrid_catchup"),
        (["--drafter", "ngram", "--ngram-gamma", "0"], "ngram_gamma"),
        (["--method", "ar", "--drafter", "ngram"], "takes no drafter other than 'model'"),
    ],
)
def test_bad_drafter_flags_exit_2_with_a_message(capsys, argv, message):
    assert main(["generate", "hi", *argv]) == 2  # checked before any model loads
    err = capsys.readouterr().err
    assert err.startswith("verispec: error:") and message in err and "Traceback" not in err


def test_bench_variants_carry_drafter_settings():
    variant = parse_method("bv:drafter=hybrid,ngram_min=3,ngram_max=5,gamma=6", {"bv"})
    assert variant.overrides == {"drafter": "hybrid", "ngram_min": 3, "ngram_max": 5, "gamma": 6}
    assert parse_method("sd:draft_vocab=16384", {"sd"}).overrides == {"draft_vocab": 16384}
    assert parse_method("sd:drafter=hybrid,ngram_gamma=8", {"sd"}).overrides == {"drafter": "hybrid", "ngram_gamma": 8}
    assert parse_method("sd:drafter=hybrid,hybrid_catchup=inf", {"sd"}).overrides == {
        "drafter": "hybrid", "hybrid_catchup": float("inf")}
    config = DecodeConfig("bv", **variant.overrides)
    assert config.drafter == "hybrid" and config.ngram_max == 5
    with pytest.raises(ConfigError, match="bad value"):
        parse_method("sd:draft_vocab=lots", {"sd"})
