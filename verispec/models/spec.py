"""`ModelSpec`: which draft/target pair to load and how, the one carrier of those settings from the CLI, the API,
the bench and the server to the loader.

Every entry point builds a `ModelSpec` (its defaults are read from here, never restated) and passes it on whole;
`verispec.options.add_model_options` adds its fields to a command line. Everything that can be checked without
loading a model is checked when it is built, not after minutes of loading. (Whether a verifier file is one, and fits
the draft, is checked where it loads: `verispec.api.Decoder`.)
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from verispec.errors import ConfigError
from verispec.models.fastpath import check_linear_backend, draft_backend_for
from verispec.models.hf import HFCausalLM, check_model_spec, parse_dtype
from verispec.models.loading import DEFAULT, DEFAULT_LINEAR_BACKEND, load_model
from verispec.models.protocol import CausalLM

ROLES = ("target", "draft")


@dataclass(frozen=True)
class ModelSpec:
    """The model pair and how it runs; the CLI and the API read their defaults from here."""

    # None or "default": the embedded Qwen2.5-Coder model of that role; a hub id, a local folder, a .gguf file,
    # "llamacpp:FILE.gguf" (run by llama.cpp), or an already built model (the API's: `HFCausalLM`)
    target: str | HFCausalLM | None = None
    draft: str | HFCausalLM | None = None  # the draft model, likewise
    dtype: str | torch.dtype = "float32"  # float32 | bfloat16 | float16 | float64
    # the draft's dtype where it differs; None = dtype (lossless methods keep the target's law whatever q is)
    draft_dtype: str | torch.dtype | None = None
    device: str = "cpu"  # torch device of both models: cpu, cuda, cuda:1, mps, ...
    linear_backend: str = DEFAULT_LINEAR_BACKEND  # CPU linears: auto | torch | onednn | int8 | int4 | int4-rounded
    # the draft's linears where they differ; None = `fastpath.draft_backend_for(linear_backend)` (an int4 target:
    # an int4-rounded draft)
    draft_linear_backend: str | None = None
    # SPRINTER: the learned verifier file (or a loaded `LearnedVerifier`); None = the one shipped for the draft
    verifier: str | Path | Any = None

    def __post_init__(self) -> None:
        for name in ("dtype", "draft_dtype"):
            value = getattr(self, name)
            if value is not None or name == "dtype":
                _as_field(name, parse_dtype, value)
        check_device(self.device)
        for name in ("linear_backend", "draft_linear_backend"):
            value = getattr(self, name)
            if value is not None or name == "linear_backend":
                _as_field(name, check_linear_backend, value)
        for role in ROLES:
            model = getattr(self, role)
            if isinstance(model, str) and model != DEFAULT:
                check_model_spec(model)  # a missing folder or file: ModelFilesError, before anything loads

    def dtype_of(self, role: str) -> str | torch.dtype:
        """Return the dtype the model of `role` ("target" or "draft") loads in."""
        return self.draft_dtype if role == "draft" and self.draft_dtype is not None else self.dtype

    def linear_backend_of(self, role: str) -> str:
        """Return the linear backend the model of `role` runs."""
        if role == "draft":
            return self.draft_linear_backend or draft_backend_for(self.linear_backend)
        return self.linear_backend

    def load(self, role: str, draft_vocab: int | None = None) -> CausalLM:
        """Return the model of `role` loaded as this spec says (`verispec.models.loading.load_model`); a model given
        already built is returned as it is. `draft_vocab`: the draft's head sliced to N tokens (`load_model`)."""
        model = getattr(self, _role(role))
        if model is not None and not isinstance(model, str):
            return model
        return load_model(model, role, dtype=self.dtype_of(role), device=self.device,
                          linear_backend=self.linear_backend_of(role), draft_vocab=draft_vocab)

    def with_settings(self, **settings: Any) -> ModelSpec:
        """Return this spec with `settings` (ModelSpec field names) changed, checked; a setting of another name is a
        ConfigError naming it and listing the valid ones."""
        unknown = sorted(set(settings) - set(MODEL_SETTINGS))
        if unknown:
            raise ConfigError(f"unknown model setting(s) {', '.join(unknown)}; the settings are: "
                              f"{', '.join(MODEL_SETTINGS)}")
        return dataclasses.replace(self, **settings) if settings else self

    def to_dict(self) -> dict[str, Any]:
        """Return the settings as a JSON-able dict: a model given built by its name, a dtype by its name, a loaded
        verifier by its class name."""
        return {name: _jsonable(getattr(self, name)) for name in MODEL_SETTINGS}


MODEL_SETTINGS = tuple(f.name for f in dataclasses.fields(ModelSpec))  # every name `with_settings` takes


def check_device(device: Any) -> None:
    """Raise ConfigError (field "device") unless `device` names a torch device (cpu, cuda, cuda:1, mps, ...)."""
    try:
        torch.device(device)
    except (RuntimeError, TypeError, ValueError):
        raise ConfigError(f"unknown device {device!r}; give a torch device such as cpu, cuda, cuda:1 or mps",
                          field="device") from None


def flat_dict(config: Any) -> dict[str, Any]:
    """Return the dataclass `config` as a JSON-able dict with its ModelSpec field `models` spread into the top level:
    the flat layout results files and data manifests have always had."""
    out = {f.name: copy.deepcopy(getattr(config, f.name)) for f in dataclasses.fields(config) if f.name != "models"}
    return out | config.models.to_dict()


def _role(role: str) -> str:
    if role not in ROLES:
        raise ConfigError(f"unknown model role {role!r}; the roles are: {', '.join(ROLES)}")
    return role


def _as_field(name: str, check: Callable[[Any], Any], value: Any) -> None:
    """Run `check(value)`, giving its ConfigError the field `name`."""
    try:
        check(value)
    except ConfigError as exc:
        raise ConfigError(str(exc), field=name) from None


def _jsonable(value: Any) -> Any:
    if value is None or isinstance(value, (str, int, float, bool)):
        return value
    if isinstance(value, (Path, torch.dtype)):
        return str(value).removeprefix("torch.")
    return getattr(value, "name", None) or type(value).__name__
