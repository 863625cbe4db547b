"""`DecodeConfig`: the one carrier of a decode's settings from the CLI, the API, the bench and the server to the
engine.

Every entry point builds a `DecodeConfig` (its defaults are read from here, never restated) and passes it on whole.
Users who prefer keywords give them to `DecodeConfig.with_settings`, which also takes the sampling settings
(temperature, top_k, top_p) by name and names any setting it does not know.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from verispec.drafters import (
    check_adaptive_gamma,
    check_draft_confidence,
    check_drafter_settings,
    default_adaptive_gamma,
    default_drafter,
)
from verispec.drafters.hybrid import HYBRID_CATCHUP
from verispec.errors import ConfigError
from verispec.methods import METHODS, Method, get_method
from verispec.processors import check_logit_bias, check_logprobs, check_penalty
from verispec.sampling import SamplingConfig
from verispec.verify.relaxed import RelaxedKnobs

# K of a multi-path method when none is given: the best K of `gbv` on the dev-short prompts at T = 1 (BENCHMARKS.md
# §5). At T = 0 the K paths are equal, so a multi-path method only pays for them.
MULTIPATH_PATHS = 3
# The largest seed: torch.Generator.manual_seed takes an unsigned 64-bit integer (beyond it, a ValueError). A
# negative seed would be read modulo 2**64 (-1 as 2**64 - 1), two spellings of one seed: negatives are refused.
# (The engine's CPU generator, a Mersenne Twister, is seeded by the low 32 bits: seeds that differ only above bit
# 31 draw the same.)
MAX_SEED = 2**64 - 1


@dataclass(frozen=True)
class DecodeConfig:
    """Settings of one decode; the CLI and the API read their defaults from here."""

    method: str = "sd"  # a name in verispec.methods.METHODS
    gamma: int = 4  # draft tokens per round (speculative methods); the path length for multi-path methods
    max_new_tokens: int = 128  # generation stops after exactly this many tokens unless EOS comes first
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    seed: int = 0  # seeds the one torch.Generator used for every draw of the decode
    paths: int | None = None  # K i.i.d. draft paths per round; None = 1, or MULTIPATH_PATHS for multi-path methods
    cap: int = 20  # SPRINTER: the longest draft run before the target is called (§3.1)
    tau: float | None = None  # SPRINTER: the verifier's acceptance threshold; None = the one stored in its file
    # a name in verispec.drafters.DRAFTERS: model | ngram | hybrid; None = the method's default (`default_drafter`)
    drafter: str | None = None
    ngram_min: int = 2  # prompt lookup: the shortest suffix of the context looked up
    ngram_max: int = 4  # prompt lookup: the longest suffix looked up (the longest match wins)
    # prompt lookup: the most tokens a lookup round drafts; None = 16 with adaptive_gamma (each lookup round then
    # drafts what its recent acceptance pays for), else gamma (`verispec.drafters.lookup_length`)
    ngram_gamma: int | None = None
    # hybrid: the draft model drafts only when the tokens it must catch up on are ≤ this × the tokens still to emit
    hybrid_catchup: float = HYBRID_CATCHUP
    draft_vocab: int | None = None  # N: the draft model's head covers only the N most frequent tokens; None = all
    # h: drafting stops after a token the draft drew with probability q(x) < h (single path, T > 0); None = never
    draft_confidence: float | None = None
    # the draft model's length per round chosen from its recent acceptance and a round's cost, up to gamma
    # (verispec.drafters.adaptive); None = the method's default (`default_adaptive_gamma`)
    adaptive_gamma: bool | None = None
    # Lossy relaxed-acceptance rules (verify/relaxed.py, docs/algorithms.md §6.2); defaults are deployed settings.
    typical_epsilon: float = RelaxedKnobs.typical_epsilon  # typical: keep x when p̃(x) > min(ε, δ·e^{−H(p̃)})
    typical_delta: float = RelaxedKnobs.typical_delta  # typical: δ (inf: the threshold is ε alone)
    margin_delta: float = RelaxedKnobs.margin_delta  # margin: keep x when log p̃(x) > max log p̃ − Δ (nats)
    fuzzy_threshold: float = RelaxedKnobs.fuzzy_threshold  # fuzzy: keep while JS(p, q) < θ (nats, ≤ ln 2)
    fly_entropy: float = RelaxedKnobs.fly_entropy  # fly: entropy gate θ on p̃'s top-k (nats)
    fly_window: int = RelaxedKnobs.fly_window  # fly: W draft tokens that must pass to keep a rejected one (< gamma)
    fly_top_k: int = RelaxedKnobs.fly_top_k  # fly: k of the entropy gate
    # OpenAI's logit processors (verispec/processors.py), added to both models' logits before temperature, top-k
    # and top-p; the penalties count the tokens generated so far (not the prompt). Every method takes them.
    logit_bias: dict[int, float] | None = None  # token id -> bias in [-100, 100] added to its logit; None = none
    presence_penalty: float = 0.0  # in [-2, 2]: subtracted from the logit of every token generated so far
    frequency_penalty: float = 0.0  # in [-2, 2]: times how often a token was generated so far, subtracted
    # None = off; k in 0..20: each emitted token's log-probability under the decoding model's processed law, and
    # the k likeliest tokens at its position (verispec/logprobs.py)
    logprobs: int | None = None
    # N: the prompt is read in passes of at most N tokens (`verispec.scoring.read_prompt`: a batched server's long
    # prompts then run beside the other requests' rounds, not before them); None = in one pass
    prompt_chunk: int | None = None
    # every draw at T > 0 a race on noise keyed by (seed, position) (verispec.verify.keyed): ar, draft, sd and
    # sprinter-exact then write, for a seed, the same tokens whatever the drafter, the draft length or the batch
    keyed_draws: bool = False

    def __post_init__(self) -> None:
        method = get_method(self.method)
        if not isinstance(self.gamma, int) or isinstance(self.gamma, bool) or self.gamma < 1:
            raise ConfigError(f"gamma (draft length) must be an integer >= 1, got {self.gamma!r}", field="gamma")
        if self.paths is None:
            object.__setattr__(self, "paths", MULTIPATH_PATHS if method.multipath else 1)  # frozen: set once here
        if self.drafter is None:
            object.__setattr__(self, "drafter", default_drafter(method))
        if self.adaptive_gamma is None:
            object.__setattr__(self, "adaptive_gamma", default_adaptive_gamma(method))
        if not isinstance(self.paths, int) or isinstance(self.paths, bool) or self.paths < 1:
            raise ConfigError(f"paths (K) must be an integer >= 1, got {self.paths!r}", field="paths")
        if self.paths > 1 and not method.multipath:
            raise ConfigError(f"method {self.method!r} verifies a single path; paths must be 1, got {self.paths}",
                              field="paths")
        if self.paths == 1 and method.multipath:
            # One path would silently run a single-path rule at the multi-path rule's cost (tree bookkeeping).
            hint = "with one path it is block verification: use --method bv" if self.method == "gbv" else (
                "for a single path use sd or bv")
            raise ConfigError(f"method {self.method!r} needs paths >= 2 ({hint})", field="paths")
        if not isinstance(self.cap, int) or isinstance(self.cap, bool) or self.cap < 1:
            raise ConfigError(f"cap (the longest SPRINTER draft run) must be an integer >= 1, got {self.cap!r}",
                              field="cap")
        if self.tau is not None and not (isinstance(self.tau, (int, float)) and 0.0 <= self.tau <= 1.0):
            raise ConfigError(f"tau (the verifier threshold) must be in [0, 1], got {self.tau!r}", field="tau")
        self.relaxed_knobs()  # validates the lossy rules' knobs
        if self.method == "fly" and self.fly_window >= self.gamma:
            raise ConfigError(f"fly_window (W) must be < gamma ({self.gamma}): a deferred rejection is confirmed by "
                              f"the W draft tokens after it, got {self.fly_window}", field="fly_window")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}",
                              field="max_new_tokens")
        if not isinstance(self.seed, int) or isinstance(self.seed, bool) or not 0 <= self.seed <= MAX_SEED:
            raise ConfigError(f"seed must be an integer in [0, 2**64 - 1] (0 to {MAX_SEED}), got {self.seed!r}",
                              field="seed")
        check_drafter_settings(self, method)
        check_draft_confidence(self, method)
        check_adaptive_gamma(self, method)
        object.__setattr__(self, "logit_bias", check_logit_bias(self.logit_bias))  # frozen: normalised once here
        check_penalty("presence_penalty", self.presence_penalty)
        check_penalty("frequency_penalty", self.frequency_penalty)
        check_logprobs(self.logprobs)
        if self.prompt_chunk is not None and (not isinstance(self.prompt_chunk, int) or isinstance(
                self.prompt_chunk, bool) or self.prompt_chunk < 1):
            raise ConfigError(f"prompt_chunk must be an integer >= 1 (tokens per prompt pass) or None, got "
                              f"{self.prompt_chunk!r}", field="prompt_chunk")

        if not isinstance(self.keyed_draws, bool):
            raise ConfigError(f"keyed_draws must be true or false, got {self.keyed_draws!r}", field="keyed_draws")
        if self.keyed_draws and not method.keyable:
            keyable = ", ".join(m.name for m in METHODS.values() if m.keyable)
            raise ConfigError(f"keyed_draws is taken by {keyable}: method {self.method!r} draws from its own "
                              f"residual laws, which a keyed race does not replace", field="keyed_draws")

    def relaxed_knobs(self) -> RelaxedKnobs:
        """Return the lossy rules' knobs (validated; ConfigError names a knob out of range)."""
        return RelaxedKnobs(**{name: getattr(self, name) for name in RelaxedKnobs.__dataclass_fields__})

    def decoding_method(self) -> Method:
        """Return the registered method with this configuration's settings: a lossy rule's verifier at its knobs."""
        return get_method(self.method).with_knobs(self.relaxed_knobs())

    def with_settings(self, **settings: Any) -> DecodeConfig:
        """Return this configuration with `settings` changed (validated): DecodeConfig field names, the sampling
        settings by name (temperature, top_k, top_p) and the lossy rules' knobs (typical_epsilon, ...). A setting
        of another name is a ConfigError that names it and lists the valid ones. Naming another method without
        `paths` gives that method's default K, as a fresh DecodeConfig would."""
        unknown = sorted(set(settings) - set(SETTINGS))
        if unknown:
            raise ConfigError(f"unknown decode setting(s) {', '.join(unknown)}; the settings are: "
                              f"{', '.join(SETTINGS)}")
        sampled = {name: settings.pop(name) for name in SAMPLING_SETTINGS if name in settings}
        if sampled:
            sampling = settings.get("sampling", self.sampling)
            settings["sampling"] = dataclasses.replace(sampling, **sampled)
        if settings.get("method", self.method) != self.method:
            settings.setdefault("paths", None)  # this K was the old method's; None resolves the new method's default
            # a drafter or length rule that was the old method's default becomes the new method's default
            old = get_method(self.method)
            if self.drafter == default_drafter(old):
                settings.setdefault("drafter", None)
            if self.adaptive_gamma == default_adaptive_gamma(old):
                settings.setdefault("adaptive_gamma", None)
        return dataclasses.replace(self, **settings) if settings else self


SAMPLING_SETTINGS = tuple(f.name for f in dataclasses.fields(SamplingConfig))  # temperature, top_k, top_p
# Every name `DecodeConfig.with_settings` (and so `Decoder.generate(**settings)`) takes.
SETTINGS = (*(f.name for f in dataclasses.fields(DecodeConfig)), *SAMPLING_SETTINGS)
