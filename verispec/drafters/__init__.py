"""Drafters: what proposes each round's draft block. A decoding method is a (drafter, verifier) pair.

- `model`: K i.i.d. paths sampled from the draft model (the default; its output layer may be reduced to the N most
  frequent tokens and the context's, `verispec.models.vocab`, `verispec.models.reduced_head`).
- `ngram`: prompt lookup; fixed candidates with a point-mass q, no model forward (docs/algorithms.md §6.1).
- `hybrid`: the n-gram candidates where the context has a match, the draft model elsewhere (when catching its cache
  up is cheap enough for the tokens left, `verispec.drafters.hybrid`).

Every drafter returns the exact q its tokens were drawn from, so the verifiers' contract does not change. Distinct
deterministic candidates are not i.i.d. draws, so multi-path methods verify them with the candidate-tree rule
(`verispec.verify.deterministic`); single-path methods (sd, bv) use a point-mass q as it is.
"""

from __future__ import annotations

from typing import Any

from verispec.drafters.adaptive import ADAPTIVE_LOOKUP_GAMMA
from verispec.drafters.base import Drafter, DraftRequest, round_length
from verispec.drafters.hybrid import HybridDrafter
from verispec.drafters.model import ModelDrafter
from verispec.drafters.ngram import NgramDrafter, NgramIndex
from verispec.errors import ConfigError
from verispec.models.protocol import CausalLM

__all__ = ["DRAFTERS", "Drafter", "DraftRequest", "HybridDrafter", "ModelDrafter", "NgramDrafter", "NgramIndex",
           "check_adaptive_gamma", "check_drafter_settings", "default_adaptive_gamma", "default_drafter",
           "lookup_length", "make_drafter", "round_length", "takes_adaptive_gamma", "uses_draft_model"]

DRAFTERS: dict[str, str] = {
    "model": "K i.i.d. paths sampled from the draft model",
    "ngram": "prompt lookup: what followed the longest earlier match of the context's suffix (point-mass q)",
    "hybrid": "prompt lookup where the context has a match, the draft model elsewhere",
}


def default_drafter(method: Any) -> str:
    """Return the drafter a decode with `method` (a `verispec.methods.Method`) uses when none is named: `hybrid` for
    the single-path lossless rules (sd, bv: on the int4 path it was the fastest drafter on every prompt set measured,
    BENCHMARKS.md summary), `model` for every other method (multi-path rules draw i.i.d. paths; SPRINTER and the
    lossy rules are defined and measured on the draft model's own tokens)."""
    return "hybrid" if takes_adaptive_gamma(method) else "model"


def takes_adaptive_gamma(method: Any) -> bool:
    """Return whether `method` can choose its draft length per round (`verispec.drafters.adaptive`): the single-path
    lossless speculative rules without a learned stop."""
    return method.speculative and method.lossless and not method.multipath and not method.learned_stop


def default_adaptive_gamma(method: Any) -> bool:
    """Return whether a decode with `method` chooses its draft length per round when the settings do not say: yes
    wherever it can (`takes_adaptive_gamma`: sd, bv). Measured on the default path (BENCHMARKS.md, "Default path"),
    with the hybrid drafter: 1.07x of a fixed γ = 4 on Spec-Bench dev at T = 1, where acceptance is low, and the
    same speed on HumanEval at T = 0, where it is high; lossless either way (a round's length is chosen before it
    drafts, from earlier rounds only)."""
    return takes_adaptive_gamma(method)


def check_adaptive_gamma(config: Any, method: Any) -> None:
    """Raise ConfigError when `config.adaptive_gamma` (a DecodeConfig's) is not a bool or `method` cannot take it."""
    if not isinstance(config.adaptive_gamma, bool):
        raise ConfigError(f"adaptive_gamma must be true or false, got {config.adaptive_gamma!r}",
                          field="adaptive_gamma")
    if config.adaptive_gamma and not takes_adaptive_gamma(method):
        raise ConfigError(f"adaptive_gamma chooses a single draft path's length per round; method {method.name!r} "
                          f"takes no such length (use sd or bv)", field="adaptive_gamma")


def uses_draft_model(drafter: str) -> bool:
    """Return whether the drafter `drafter` samples from the draft model."""
    return drafter != "ngram"


def _positive_int(name: str, what: str, value: Any) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"{name} ({what}) must be an integer >= 1, got {value!r}", field=name)


def check_drafter_settings(config: Any, method: Any) -> None:
    """Raise ConfigError naming what is wrong with the drafter settings of `config` (a DecodeConfig) for `method`."""
    if config.drafter not in DRAFTERS:
        raise ConfigError(f"unknown drafter {config.drafter!r}; choose one of: {', '.join(DRAFTERS)}",
                          field="drafter")
    _positive_int("ngram_min", "the shortest n-gram looked up", config.ngram_min)
    _positive_int("ngram_max", "the longest n-gram looked up", config.ngram_max)
    if config.ngram_gamma is not None:
        _positive_int("ngram_gamma", "the most tokens a lookup round drafts", config.ngram_gamma)
    if config.ngram_min > config.ngram_max:
        raise ConfigError(f"ngram_min ({config.ngram_min}) must not exceed ngram_max ({config.ngram_max})",
                          field=("ngram_min", "ngram_max"))
    catchup = config.hybrid_catchup
    if not isinstance(catchup, (int, float)) or isinstance(catchup, bool) or not catchup >= 0:
        raise ConfigError(f"hybrid_catchup (the most tokens the hybrid's draft model may catch up on, per token still "
                          f"to generate) must be a number >= 0 (inf: no limit), got {catchup!r}",
                          field="hybrid_catchup")
    if config.drafter != "model" and (not method.speculative or method.learned_stop):
        raise ConfigError(f"method {method.name!r} takes no drafter other than 'model' (got {config.drafter!r}): "
                          f"only speculative methods without a learned stop rule draft through a drafter",
                          field=("drafter", "method"))
    if config.draft_vocab is not None:
        if not isinstance(config.draft_vocab, int) or isinstance(config.draft_vocab, bool) or config.draft_vocab < 2:
            raise ConfigError(f"draft_vocab (tokens of the reduced draft head) must be an integer >= 2, got "
                              f"{config.draft_vocab!r}", field="draft_vocab")
        drafts = method.decoder == "draft" or (method.speculative and uses_draft_model(config.drafter))
        if not drafts:
            raise ConfigError(f"draft_vocab={config.draft_vocab} reduces the draft model's head, which method "
                              f"{method.name!r} with drafter {config.drafter!r} does not use", field="draft_vocab")


def check_draft_confidence(config: Any, method: Any) -> None:
    """Raise ConfigError naming what is wrong with `config.draft_confidence` (a DecodeConfig's) for `method`."""
    h = config.draft_confidence
    if h is None:
        return
    if not isinstance(h, (int, float)) or isinstance(h, bool) or not 0.0 < h <= 1.0:
        raise ConfigError(f"draft_confidence (the least q(x) after which drafting goes on) must be in (0, 1], got "
                          f"{h!r}", field="draft_confidence")
    if not method.speculative or method.multipath or method.learned_stop or not uses_draft_model(config.drafter):
        raise ConfigError(f"draft_confidence ends a draft model's single path early; method {method.name!r} with "
                          f"drafter {config.drafter!r} drafts none (use sd or bv with drafter model or hybrid)",
                          field="draft_confidence")
    if config.sampling.temperature == 0.0:
        raise ConfigError("draft_confidence needs temperature > 0: at temperature 0 the draft's law is a point mass "
                          "(q = 1 for every drafted token), so it would never stop drafting", field="draft_confidence")


def lookup_length(config: Any) -> int:
    """Return the most tokens a lookup round drafts under `config` (a DecodeConfig): `ngram_gamma` where given, else
    ADAPTIVE_LOOKUP_GAMMA where the draft length is chosen per round (each lookup round then drafts what its recent
    acceptance pays for, `AdaptiveGamma.lookup_next`), else gamma."""
    if config.ngram_gamma is not None:
        return int(config.ngram_gamma)
    return ADAPTIVE_LOOKUP_GAMMA if config.adaptive_gamma else int(config.gamma)


def make_drafter(config: Any, draft_model: CausalLM | None) -> Drafter:
    """Return a fresh drafter for one decode with `config` (a DecodeConfig); `draft_model` None drafts nothing."""
    if config.drafter == "ngram":
        return NgramDrafter(config.ngram_min, config.ngram_max, lookup_length(config))
    if config.drafter == "hybrid":
        return HybridDrafter(NgramDrafter(config.ngram_min, config.ngram_max, lookup_length(config)),
                             ModelDrafter(draft_model),
                             float(config.hybrid_catchup))
    return ModelDrafter(draft_model)
