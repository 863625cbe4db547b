"""`ModelSpec`: its defaults, its checks before anything loads, and the one set of model options every command that
loads models takes (`--device` among them)."""

from __future__ import annotations

import json

import pytest
import torch

from verispec import Decoder
from verispec.cli import build_parser, main
from verispec.errors import ConfigError, ModelFilesError
from verispec.models.loading import DEFAULT_LINEAR_BACKEND
from verispec.models.spec import MODEL_SETTINGS, ModelSpec
from verispec.options import model_spec


def test_the_defaults_are_the_embedded_pair_in_float32_on_the_cpu():
    spec = ModelSpec()
    assert (spec.target, spec.draft, spec.dtype, spec.device, spec.verifier) == (None, None, "float32", "cpu", None)
    assert spec.linear_backend == DEFAULT_LINEAR_BACKEND == "auto"
    assert spec.dtype_of("draft") == "float32" and spec.linear_backend_of("draft") == "auto"
    assert MODEL_SETTINGS == ("target", "draft", "dtype", "draft_dtype", "device", "linear_backend",
                              "draft_linear_backend", "verifier")


def test_the_draft_takes_its_own_settings_where_given():
    spec = ModelSpec(dtype="float32", draft_dtype="bfloat16", linear_backend="int4")
    assert spec.dtype_of("target") == "float32" and spec.dtype_of("draft") == "bfloat16"
    assert spec.linear_backend_of("target") == "int4" and spec.linear_backend_of("draft") == "int4-rounded"
    assert ModelSpec(linear_backend="int4", draft_linear_backend="int4").linear_backend_of("draft") == "int4"


@pytest.mark.parametrize("settings, field, words", [
    ({"dtype": "int3"}, "dtype", "unknown dtype 'int3'"),
    ({"draft_dtype": "int3"}, "draft_dtype", "unknown dtype 'int3'"),
    ({"device": "gpu"}, "device", "unknown device 'gpu'"),
    ({"device": 3.5}, "device", "unknown device"),
    ({"linear_backend": "int3"}, "linear_backend", "unknown linear backend 'int3'"),
    ({"draft_linear_backend": "int3"}, "draft_linear_backend", "unknown linear backend 'int3'"),
])
def test_bad_settings_are_config_errors_naming_their_field(settings, field, words):
    with pytest.raises(ConfigError, match=words) as caught:
        ModelSpec(**settings)
    assert caught.value.field == field and caught.value.fields == (field,)
    with pytest.raises(ConfigError, match=words):
        Decoder(**settings)  # the API's keywords build the same spec, checked before anything loads


def test_a_path_with_no_model_fails_when_the_spec_is_built(tmp_path):
    with pytest.raises(ModelFilesError, match="not found"):
        ModelSpec(draft=str(tmp_path / "missing.gguf"))


def test_with_settings_names_an_unknown_setting_and_checks_the_rest():
    spec = ModelSpec()
    assert spec.with_settings() is spec
    assert spec.with_settings(device="cuda:1").device == "cuda:1"
    with pytest.raises(ConfigError, match="unknown model setting.*colour.*the settings are: target, draft"):
        spec.with_settings(colour="red")
    with pytest.raises(ConfigError, match="unknown dtype"):
        spec.with_settings(dtype="int3")


def test_decoder_takes_a_spec_or_its_fields_by_name():
    spec = ModelSpec(target="some/model", dtype="bfloat16", device="cpu")
    assert Decoder(spec).models == spec
    assert Decoder("some/model", dtype="bfloat16").models == spec
    assert Decoder(spec, draft="other/model").models == ModelSpec("some/model", "other/model", dtype="bfloat16")
    with pytest.raises(ConfigError, match="unknown model setting"):
        Decoder(spec, temperature=1.0)  # a decode setting: given to `generate`, not to the pair


def test_to_dict_is_json_and_names_built_models(tiny_pair):
    spec = ModelSpec(target=tiny_pair["target"], dtype=torch.bfloat16)
    data = json.loads(json.dumps(spec.to_dict()))
    assert data["target"] == tiny_pair["target"].name and data["dtype"] == "bfloat16" and data["draft"] is None
    assert list(data) == list(MODEL_SETTINGS)


LOADING_COMMANDS = [
    ["generate", "hi"],
    ["compare"],
    ["serve"],
    ["bench"],
    ["fixed-blocks"],
    ["verifier", "collect"],
]


@pytest.mark.parametrize("command", LOADING_COMMANDS, ids=lambda c: " ".join(c))
def test_every_command_that_loads_models_takes_the_model_options(command):
    argv = [*command, "--device", "cuda:1", "--dtype", "bfloat16", "--draft-dtype", "float32", "--target", "t/t",
            "--draft", "d/d", "--linear-backend", "torch", "--draft-linear-backend", "onednn"]
    spec = model_spec(build_parser().parse_args(argv))
    assert spec == ModelSpec("t/t", "d/d", dtype="bfloat16", draft_dtype="float32", device="cuda:1",
                             linear_backend="torch", draft_linear_backend="onednn")
    assert model_spec(build_parser().parse_args(command)) == ModelSpec()  # the defaults are ModelSpec's


def test_profile_takes_a_device_too():  # its own model options: it also times architectures from a config.json
    assert build_parser().parse_args(["profile", "--device", "cuda:1"]).device == "cuda:1"


@pytest.mark.parametrize("command", LOADING_COMMANDS, ids=lambda c: " ".join(c))
def test_a_bad_device_is_one_line_before_anything_loads(command, capsys):
    assert main([*command, "--device", "gpu"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "unknown device 'gpu'" in err[0], err
