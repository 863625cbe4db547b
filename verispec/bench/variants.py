"""Method variants for the bench: `name[:key=value,...]`, e.g. `sd:gamma=2`, `gbv:paths=3,gamma=8`,
`sprinter:tau=0.3`, `sd:drafter=ngram`, `bv:drafter=hybrid,ngram_min=3`, `sd:draft_vocab=16384`, so that several
settings of one method run interleaved in one benchmark."""

from __future__ import annotations

from dataclasses import dataclass, field

from verispec.errors import ConfigError

# What a variant may override, with the type of its value.
OVERRIDES = {"gamma": int, "paths": int, "tau": float, "cap": int, "drafter": str, "ngram_min": int, "ngram_max": int,
             "draft_vocab": int}


@dataclass(frozen=True)
class MethodVariant:
    """One benchmarked method: a registered method or peer name plus the settings it overrides."""

    label: str  # as written by the user; the records' "method" key
    name: str  # the registered method (verispec.methods.METHODS) or peer (verispec.bench.peers.PEERS)
    overrides: dict[str, int | float | str] = field(default_factory=dict)  # the keys of OVERRIDES


def parse_method(label: str, known: set[str] | list[str]) -> MethodVariant:
    """Return the variant written as `name[:key=value,...]`; raise ConfigError naming what is wrong."""
    name, _, rest = label.partition(":")
    if name not in known:
        raise ConfigError(f"unknown method {name!r} in {label!r}; choose from: {', '.join(sorted(known))}")
    overrides: dict[str, int | float | str] = {}
    for item in filter(None, rest.split(",")):
        key, eq, value = item.partition("=")
        if not eq or key not in OVERRIDES:
            raise ConfigError(f"bad setting {item!r} in {label!r}: write key=value with key in {', '.join(OVERRIDES)}")
        try:
            overrides[key] = OVERRIDES[key](value)
        except ValueError:
            raise ConfigError(f"bad value {value!r} for {key} in {label!r}") from None
    return MethodVariant(label, name, overrides)
