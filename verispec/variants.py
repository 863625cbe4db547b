"""Method variants for the bench: `name[:key=value,...]`, e.g. `sd:gamma=2`, `gbv:paths=3,gamma=8`,
`sprinter:tau=0.3`, `typical:epsilon=0.3,delta=0.09`, `fly:entropy=0.3,window=3`, `sd:drafter=ngram`,
`bv:drafter=hybrid,ngram_min=3`, `sd:draft_vocab=16384`, `sd:adaptive_gamma=true`, `sd:keyed_draws=true`, so
that several settings of one method run interleaved in one benchmark. A lossy rule's knobs go by their short names
after the rule (`typical`: epsilon, delta; `margin`: delta; `fuzzy`: threshold; `fly`: entropy, window, top_k) or by
their `DecodeConfig` names (typical_epsilon, ...); a knob out of range is a ConfigError naming it."""

from __future__ import annotations

from dataclasses import dataclass, field

from verispec.errors import ConfigError
from verispec.verify.relaxed import RelaxedKnobs


def _flag(value: str) -> bool:
    """Return the truth value written as true/false (also yes/no, on/off, 1/0); ValueError otherwise."""
    words = {"true": True, "yes": True, "on": True, "1": True, "false": False, "no": False, "off": False, "0": False}
    if value.lower() not in words:
        raise ValueError(value)
    return words[value.lower()]


# What a variant may override, with the type of its value.
OVERRIDES = {"gamma": int, "paths": int, "tau": float, "cap": int, "drafter": str, "ngram_min": int, "ngram_max": int,
             "ngram_gamma": int, "hybrid_catchup": float, "draft_vocab": int, "draft_confidence": float,
             "adaptive_gamma": _flag, "keyed_draws": _flag,
             **{name: type(getattr(RelaxedKnobs, name)) for name in RelaxedKnobs.__dataclass_fields__}}
# A peer's own settings, kept out of the decode settings: the llama.cpp build a llama.cpp peer runs
# (`llamacpp-generate:isa=avx2`; verispec.bench.llamacpp.peer_build reads and checks it) and vLLM's speculative
# method (`vllm-speculative:method=ngram`; verispec.bench.vllm.speculative_method).
PEER_SETTINGS = {"llamacpp-generate": ("isa",), "llamacpp-speculative": ("isa",), "vllm-speculative": ("method",)}
# The lossy rules' knobs by their short names after the rule (verify/relaxed.py): short name -> DecodeConfig field.
KNOB_NAMES = {
    "typical": {"epsilon": "typical_epsilon", "delta": "typical_delta"},
    "margin": {"delta": "margin_delta"},
    "fuzzy": {"threshold": "fuzzy_threshold"},
    "fly": {"entropy": "fly_entropy", "window": "fly_window", "top_k": "fly_top_k"},
}


@dataclass(frozen=True)
class MethodVariant:
    """One benchmarked method: a registered method or peer name plus the settings it overrides."""

    label: str  # as written by the user; the records' "method" key
    name: str  # the registered method (verispec.methods.METHODS) or peer (verispec.bench.peers.PEERS)
    overrides: dict[str, int | float | str | bool] = field(default_factory=dict)  # the keys of OVERRIDES


def parse_method(label: str, known: set[str] | list[str]) -> MethodVariant:
    """Return the variant written as `name[:key=value,...]`; raise ConfigError naming what is wrong."""
    name, _, rest = label.partition(":")
    if name not in known:
        raise ConfigError(f"unknown method {name!r} in {label!r}; choose from: {', '.join(sorted(known))}")
    overrides: dict[str, int | float | str | bool] = {}
    short = KNOB_NAMES.get(name, {})
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if eq and key in PEER_SETTINGS.get(name, ()):
            continue
        key = short.get(key, key)
        if not eq or key not in OVERRIDES:
            keys = ", ".join([*short, *PEER_SETTINGS.get(name, ()), *OVERRIDES])
            raise ConfigError(f"bad setting {item!r} in {label!r}: write key=value with key in {keys}")
        try:
            overrides[key] = OVERRIDES[key](value)
        except ValueError:
            raise ConfigError(f"bad value {value!r} for {key} in {label!r}") from None
    knobs = {key: value for key, value in overrides.items() if key in RelaxedKnobs.__dataclass_fields__}
    if knobs:
        try:
            RelaxedKnobs(**knobs)
        except ConfigError as error:
            raise ConfigError(f"{error} (in {label!r})") from None
    return MethodVariant(label, name, overrides)
