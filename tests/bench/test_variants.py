"""Method-variant syntax for the lossy rules' knobs: short names per rule, full names, range errors."""

from __future__ import annotations

import math

import pytest

from verispec.engine import DecodeConfig
from verispec.errors import ConfigError
from verispec.variants import parse_method

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


class _Recorder:
    """A stand-in decoder that records what the bench asks it to generate."""

    def generate(self, text, config, **kwargs):
        self.config, self.kwargs = config, kwargs
        return kwargs


def test_the_bench_passes_a_variants_knobs_and_the_stop_rule_to_the_decoder():
    from verispec.bench.execution import humaneval_problems
    from verispec.bench.runner import BenchConfig, decode_one
    from verispec.prompt_sets import Prompt

    recorder = _Recorder()
    config = BenchConfig(methods=["typical:epsilon=0.3,delta=inf"])
    decode_one(recorder, config, "typical:epsilon=0.3,delta=inf", Prompt("p", "text"), 0)
    assert recorder.config.method == "typical"  # the DecodeConfig whole, not its fields as keywords
    assert recorder.config.typical_epsilon == 0.3 and recorder.config.typical_delta == math.inf
    assert recorder.kwargs["stop_text"] is None
    try:
        humaneval_problems()
    except Exception:  # noqa: BLE001 - the dataset package is optional
        return
    config = BenchConfig(methods=["sd"], stop_at_function_end=True)
    decode_one(recorder, config, "sd", Prompt("HumanEval/0", "text", "code", "humaneval"), 0)
    assert recorder.kwargs["stop_text"]("```python\ndef has_close_elements(a, b):\n    return 1\n```")


def test_a_results_file_that_predates_a_setting_resumes_as_its_default(tmp_path):
    """A file written before `stop_at_function_end` existed ran without it: resuming with the default is allowed,
    with the setting on it is refused."""
    import json

    from verispec.bench.runner import SCHEMA, BenchConfig, load_resumable
    from verispec.prompt_sets import Prompt

    config = BenchConfig(methods=["ar"])
    saved = config.to_dict()
    del saved["stop_at_function_end"]
    path = tmp_path / "old.json"
    path.write_text(json.dumps({"schema": SCHEMA, "config": saved, "records": [], "runs": []}))
    assert load_resumable(path, config, [Prompt("a", "a")]) == ([], [])
    with pytest.raises(ConfigError, match="stop_at_function_end"):
        load_resumable(path, BenchConfig(methods=["ar"], stop_at_function_end=True), [Prompt("a", "a")])


def test_a_llamacpp_peers_build_is_its_own_setting_not_a_decode_setting():
    known = {"sd", "llamacpp-generate", "llamacpp-speculative"}
    assert parse_method("llamacpp-generate:isa=avx2", known).overrides == {}
    assert parse_method("llamacpp-speculative:isa=avx2,gamma=4", known).overrides == {"gamma": 4}
    with pytest.raises(ConfigError, match="bad setting 'isa=avx2'"):
        parse_method("sd:isa=avx2", known)
