"""Method-variant syntax for the lossy rules' knobs: short names per rule, full names, range errors."""

from __future__ import annotations

import math

import pytest

from verispec.bench.variants import parse_method
from verispec.engine import DecodeConfig
from verispec.errors import ConfigError

KNOWN = {"typical", "margin", "fuzzy", "fly", "sd"}


@pytest.mark.parametrize("label,overrides", [
    ("typical:epsilon=0.3,delta=0.09", {"typical_epsilon": 0.3, "typical_delta": 0.09}),
    ("typical:delta=inf", {"typical_delta": math.inf}),
    ("margin:delta=1.5", {"margin_delta": 1.5}),
    ("fuzzy:threshold=0.2,gamma=6", {"fuzzy_threshold": 0.2, "gamma": 6}),
    ("fly:entropy=0.3,window=2,top_k=4", {"fly_entropy": 0.3, "fly_window": 2, "fly_top_k": 4}),
    ("fly:fly_window=2", {"fly_window": 2}),
])
def test_knobs_parse_to_decode_config_fields(label, overrides):
    variant = parse_method(label, KNOWN)
    assert variant.overrides == overrides
    DecodeConfig(method=variant.name, **variant.overrides)  # the fields exist and the values are in range


@pytest.mark.parametrize("label,message", [
    ("typical:epsilon=1.5", "typical_epsilon"),
    ("margin:delta=-1", "margin_delta"),
    ("fuzzy:threshold=0.9", "fuzzy_threshold"),
    ("fly:window=0", "fly_window"),
    ("fly:window=1.5", "fly_window"),
    ("margin:epsilon=0.3", "bad setting"),  # epsilon is typical's knob, not margin's
    ("sd:threshold=0.1", "bad setting"),
])
def test_bad_knobs_are_one_line_config_errors(label, message):
    with pytest.raises(ConfigError, match=message):
        parse_method(label, KNOWN)
