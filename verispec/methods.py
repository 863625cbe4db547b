"""The registry of decoding methods: which model decodes, whether the draft proposes, and which verifier checks.

Every method runs through the one decode loop in `verispec.engine`; a method is only the pieces it plugs in.
`ar` is speculative sampling with no draft tokens: token verification of an empty block samples from p.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from verispec.errors import ConfigError
from verispec.verify import token_verify

Verifier = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Generator | None], Any]


@dataclass(frozen=True)
class MultiPathResult:
    """The outcome of verifying K draft paths: the prefix of path `path` of length `accepted`, then `token`."""

    path: int
    accepted: int
    token: int


@dataclass(frozen=True)
class Method:
    """How one decoding method uses the draft and target models."""

    name: str
    description: str
    decoder: str  # which model produces the output distribution: "target" or "draft" (the quality floor)
    speculative: bool  # whether the draft proposes gamma tokens per round
    verify: Verifier  # how a proposed block is checked against the decoder's distributions
    lossless: bool  # whether the output law equals the target's
    multipath: bool = False  # verify takes K paths ([K, γ], [K, γ, V], [K, γ+1, V]) and returns MultiPathResult


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("ar", "autoregressive decoding of the target (the baseline)", "target", False, token_verify, True),
        Method("draft", "autoregressive decoding of the draft alone (the quality floor)", "draft", False,
               token_verify, False),
        Method("sd", "speculative sampling: token-level verification (ALGORITHMS.md §0)", "target", True,
               token_verify, True),
    )
}


def get_method(name: str) -> Method:
    """Return the registered method called `name`, or raise ConfigError listing the known ones."""
    if name not in METHODS:
        raise ConfigError(f"unknown method {name!r}; choose one of: {', '.join(METHODS)}")
    return METHODS[name]
