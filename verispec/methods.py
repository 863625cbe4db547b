"""The registry of decoding methods: which model decodes, whether the draft proposes, and which verifier checks.

Every method runs through the one decode loop in `verispec.engine`; a method is only the pieces it plugs in.
`ar` is speculative sampling with no draft tokens: token verification of an empty block samples from p.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from verispec.errors import ConfigError
from verispec.verify import (
    NODE_LAWS,
    BlockLaw,
    MultiPathResult,
    block_verify,
    block_verify_law,
    gbv_verify,
    gbv_verify_law,
    nss_verify,
    specinfer_verify,
    spectr_verify,
    sprinter_verify,
    token_verify,
    token_verify_law,
    traversal_expected_accepted,
    traversal_verify,
    tree_walk_expected_accepted,
)
from verispec.verify.relaxed import RelaxedKnobs, rule_verifier

__all__ = ["METHODS", "Method", "MultiPathResult", "get_method"]

Verifier = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, torch.Generator | None], Any]
ExpectedAccepted = Callable[[torch.Tensor, torch.Tensor, torch.Tensor], float]  # same inputs as Verifier -> E[τ]


def _law_mean(law: Callable[[torch.Tensor, torch.Tensor, torch.Tensor], BlockLaw]) -> ExpectedAccepted:
    """Return the E[τ] function of a single-path verifier from its exact law."""
    return lambda draft_tokens, q, p: law(draft_tokens, q, p).expected_accepted()


def _gbv_expected_accepted(draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor) -> float:
    """Return GBV's E[τ]: that of BV with q_skew on the path its greedy selection keeps (§2.4)."""
    return gbv_verify_law(draft_tokens, q, p)[1].expected_accepted()


def _walk_mean(name: str) -> ExpectedAccepted:
    """Return the E[τ] function of one of the tree-walk baselines of §2.9."""
    return lambda draft_tokens, q, p: tree_walk_expected_accepted(NODE_LAWS[name], draft_tokens, q, p)


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
    learned_stop: bool = False  # the draft run ends at the learned verifier's first rejection or at the cap (§3.1)
    # a lossy gate of verify/relaxed.py: verify runs at the knobs `with_knobs` gives it, also takes p̃ (p_gate=)
    # and returns each position's leak (RelaxedResult)
    relaxed: bool = False
    reads_rows: bool = False  # verify reads few rows of p: the engine passes p as `PathLaws`, computed per row
    # Exact E[τ] of one round given the drafted block(s), the verifier's own randomness integrated out (same inputs
    # as `verify`); None where a method drafts no block or decides its length as it drafts (SPRINTER).
    expected_accepted: ExpectedAccepted | None = None
    # keyed draws (`DecodeConfig.keyed_draws`) can replace its verifier: token verification of one path (or a plain
    # draw), which keyed verification matches token by token (verispec.verify.keyed)
    keyable: bool = False

    def with_knobs(self, knobs: RelaxedKnobs) -> Method:
        """Return this method with its verifier at the lossy rules' `knobs` (itself for every other method)."""
        return replace(self, verify=rule_verifier(self.name, knobs)) if self.relaxed else self


METHODS: dict[str, Method] = {
    m.name: m
    for m in (
        Method("ar", "autoregressive decoding of the target (the baseline)", "target", False, token_verify, True,
               keyable=True),
        Method("draft", "autoregressive decoding of the draft alone (the quality floor)", "draft", False,
               token_verify, False, keyable=True),
        Method("sd", "speculative sampling: token-level verification (docs/algorithms.md §0)", "target", True,
               token_verify, True, expected_accepted=_law_mean(token_verify_law), keyable=True),
        Method("bv", "block verification: a joint accept rule over the whole block (§1)", "target", True,
               block_verify, True, expected_accepted=_law_mean(block_verify_law)),
        Method("gbv", "greedy multi-path block verification over K i.i.d. paths (§2)", "target", True,
               gbv_verify, True, multipath=True, reads_rows=True, expected_accepted=_gbv_expected_accepted),
        Method("specinfer", "multi-path recursive rejection sampling (SpecInfer, §2.9)", "target", True,
               specinfer_verify, True, multipath=True, expected_accepted=_walk_mean("specinfer")),
        Method("spectr", "multi-path K-SEQ optimal-transport verification (SpecTr, §2.9)", "target", True,
               spectr_verify, True, multipath=True, expected_accepted=_walk_mean("spectr")),
        Method("nss", "multi-path naive speculative sampling: a token from p, kept if some child matches (§2.9)",
               "target", True, nss_verify, True, multipath=True, expected_accepted=_walk_mean("nss")),
        Method("traversal", "traversal verification of the path tree, leaves first (§2.9)", "target", True,
               traversal_verify, True, multipath=True, expected_accepted=traversal_expected_accepted),
        Method("sprinter", "SPRINTER: a learned verifier ends the draft run; only its last token is checked "
               "(§3.1; approximate)", "target", True, sprinter_verify, False, learned_stop=True),
        Method("typical", "typical acceptance (Medusa): SD, and also keep x when p̃(x) > min(ε, δ·e^{−H(p̃)}) "
               "(§6.2; lossy)", "target", True, rule_verifier("typical"), False, relaxed=True),
        Method("margin", "log-probability margin: SD, and also keep x when log p̃(x) > max log p̃ − Δ (§6.2; lossy)",
               "target", True, rule_verifier("margin"), False, relaxed=True),
        Method("fuzzy", "fuzzy SD (FSD): keep x while JS(p, q) < θ at its position, else SD (§6.2; lossy)",
               "target", True, rule_verifier("fuzzy"), False, relaxed=True),
        Method("fly", "FLy: keep an SD-rejected x when the target's top-k entropy is high and the next W draft "
               "tokens pass (§6.2; lossy)", "target", True, rule_verifier("fly"), False, relaxed=True),
        Method("sprinter-exact", "SPRINTER's learned run length with every token verified by TV (lossless; "
               "a deviation from the paper)", "target", True, token_verify, True, learned_stop=True, keyable=True),
    )
}


def get_method(name: str) -> Method:
    """Return the registered method called `name`, or raise ConfigError listing the known ones."""
    if name not in METHODS:
        raise ConfigError(f"unknown method {name!r}; choose one of: {', '.join(METHODS)}", field="method")
    return METHODS[name]
