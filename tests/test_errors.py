"""`ConfigError.fields`: a bad setting's error names the setting it is about, so that callers (the server's `param`)
need not read it out of the message."""

from __future__ import annotations

import pytest

from verispec.config import DecodeConfig
from verispec.errors import ConfigError


@pytest.mark.parametrize("settings, fields", [
    ({"gamma": 0}, ("gamma",)),
    ({"method": "beam"}, ("method",)),
    ({"method": "sd", "paths": 2}, ("paths",)),
    ({"method": "gbv", "paths": 1}, ("paths",)),
    ({"cap": 0}, ("cap",)),
    ({"tau": 2.0}, ("tau",)),
    ({"max_new_tokens": 0}, ("max_new_tokens",)),
    ({"seed": -1}, ("seed",)),
    ({"temperature": -1.0}, ("temperature",)),
    ({"top_k": -1}, ("top_k",)),
    ({"top_p": 0.0}, ("top_p",)),
    ({"drafter": "oracle"}, ("drafter",)),
    ({"method": "ar", "drafter": "ngram"}, ("drafter", "method")),
    ({"drafter": "ngram", "ngram_min": 4, "ngram_max": 2}, ("ngram_min", "ngram_max")),
    ({"ngram_gamma": 0}, ("ngram_gamma",)),
    ({"hybrid_catchup": -1.0}, ("hybrid_catchup",)),
    ({"draft_vocab": 1}, ("draft_vocab",)),
    ({"draft_confidence": 0.5}, ("draft_confidence",)),  # needs temperature > 0
    ({"method": "gbv", "adaptive_gamma": True}, ("adaptive_gamma",)),
    ({"typical_epsilon": 2.0}, ("typical_epsilon",)),
    ({"method": "fly", "gamma": 2, "fly_window": 3}, ("fly_window",)),
    ({"logit_bias": {"x": 1}}, ("logit_bias",)),
    ({"presence_penalty": 3.0}, ("presence_penalty",)),
    ({"logprobs": 21}, ("logprobs",)),
    ({"prompt_chunk": 0}, ("prompt_chunk",)),
])
def test_a_bad_decode_setting_names_its_field(settings, fields):
    with pytest.raises(ConfigError) as caught:
        DecodeConfig().with_settings(**settings)
    assert caught.value.fields == fields and caught.value.field == fields[0]


def test_an_error_about_no_setting_in_particular_has_no_field():
    with pytest.raises(ConfigError) as caught:
        DecodeConfig().with_settings(colour="red")
    assert caught.value.fields == () and caught.value.field is None
    assert ConfigError("plain").field is None and str(ConfigError("plain", field="gamma")) == "plain"
