"""The one decode loop: draft -> target pass -> verify -> commit -> roll back. Generic over methods.

Cache invariant: every model's KV cache holds a prefix of `tokens` (the committed sequence) plus, during a
round, the draft tokens. A forward feeds whatever of the committed sequence (and draft block) the cache lacks,
so after any rollback the next round simply re-feeds the missing tail: rollback is just moving a length.
"""

from __future__ import annotations

import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

import torch

from verispec.errors import ConfigError
from verispec.methods import get_method
from verispec.models.protocol import CausalLM
from verispec.sampling import SamplingConfig, process_logits, sample
from verispec.trace import RoundTrace, Trace


@dataclass(frozen=True)
class DecodeConfig:
    """Settings of one decode; the CLI and the API read their defaults from here."""

    method: str = "sd"  # a name in verispec.methods.METHODS
    gamma: int = 4  # draft tokens per round (speculative methods)
    max_new_tokens: int = 128  # generation stops after exactly this many tokens unless EOS comes first
    sampling: SamplingConfig = field(default_factory=SamplingConfig)
    seed: int = 0  # seeds the one torch.Generator used for every draw of the decode

    def __post_init__(self) -> None:
        get_method(self.method)
        if not isinstance(self.gamma, int) or isinstance(self.gamma, bool) or self.gamma < 1:
            raise ConfigError(f"gamma (draft length) must be an integer >= 1, got {self.gamma!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if not isinstance(self.seed, int):
            raise ConfigError(f"seed must be an integer, got {self.seed!r}")


@dataclass
class DecodeOutput:
    """The generated token ids (EOS included when it ended the output) and the trace."""

    tokens: list[int]
    trace: Trace
    stopped_at_eos: bool


class Engine:
    """Owns a target and an optional draft model and decodes with any registered method."""

    def __init__(self, target: CausalLM | None, draft: CausalLM | None = None, eos_token_ids: Iterable[int] = ()):
        self.target = target
        self.draft = draft
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)

    def _models_for(self, config: DecodeConfig) -> tuple[CausalLM, CausalLM | None]:
        method = get_method(config.method)
        decoder = self.target if method.decoder == "target" else self.draft
        if decoder is None:
            raise ConfigError(f"method {method.name!r} needs a {method.decoder} model, and none is loaded")
        if method.speculative and self.draft is None:
            raise ConfigError(f"method {method.name!r} needs a draft model, and none is loaded")
        return decoder, (self.draft if method.speculative else None)

    def decode(self, prompt_ids: Sequence[int], config: DecodeConfig) -> DecodeOutput:
        """Generate from `prompt_ids` with `config`; return the new tokens and the trace."""
        if len(prompt_ids) == 0:
            raise ConfigError("the prompt is empty: give at least one token")
        method = get_method(config.method)
        decoder, drafter = self._models_for(config)
        generator = torch.Generator().manual_seed(config.seed)
        trace = Trace(prefill_tokens=len(prompt_ids))
        decoder_is_draft = method.decoder == "draft"
        for model in (decoder, drafter):
            if model is not None:
                model.reset()

        start = time.perf_counter()
        tokens = [int(t) for t in prompt_ids]
        n_prompt = len(tokens)
        stopped_at_eos = False
        while len(tokens) - n_prompt < config.max_new_tokens:
            remaining = config.max_new_tokens - (len(tokens) - n_prompt)
            # A round emits at most gamma+1 tokens: never draft what cannot be kept (a rule on counts only,
            # so it keeps the method lossless, ALGORITHMS.md §1.4 "Variable γ").
            gamma = min(config.gamma, remaining - 1) if drafter is not None else 0

            # 1. Draft: gamma tokens from q, one at a time, stopping early at EOS.
            t0 = time.perf_counter()
            draft_tokens, q = self._draft(drafter, tokens, gamma, config.sampling, generator, trace)
            t1 = time.perf_counter()
            trace.time_draft += t1 - t0

            # 2. One decoder pass over the uncached committed tokens plus the block: gamma+1 distributions.
            n_block = len(draft_tokens)
            new = (tokens + draft_tokens)[decoder.cache_length :]
            logits = decoder.forward(new, n_logits=n_block + 1).logits  # [n_block+1, V]
            t2 = time.perf_counter()
            if decoder_is_draft:
                trace.draft_calls += 1
                trace.draft_tokens += len(new)
                trace.time_draft += t2 - t1
            else:
                trace.target_calls += 1
                trace.target_tokens += len(new)
                trace.time_target += t2 - t1

            # 3. Verify against the processed distributions actually sampled from.
            p = process_logits(logits, config.sampling)  # [n_block+1, V]
            result = method.verify(torch.tensor(draft_tokens, dtype=torch.long), q, p, generator)
            t3 = time.perf_counter()
            trace.time_verify += t3 - t2

            # 4. Commit the accepted prefix and the extra token, cut at EOS and at max_new_tokens.
            emitted = draft_tokens[: result.accepted] + [result.token]
            for i, token in enumerate(emitted):
                if token in self.eos_token_ids:
                    emitted = emitted[: i + 1]
                    stopped_at_eos = True
                    break
            emitted = emitted[:remaining]
            base = len(tokens)
            tokens.extend(emitted)
            trace.rounds.append(
                RoundTrace(n_block, result.accepted, len(emitted), len(new), t1 - t0, t2 - t1, t3 - t2)
            )

            # 5. Roll back: keep the committed tokens that both caches saw; the extra token is fed next round.
            keep = base + result.accepted
            for model in (decoder, drafter):
                if model is not None:
                    model.truncate(min(model.cache_length, keep))
            if stopped_at_eos:
                break
        trace.time_total = time.perf_counter() - start
        return DecodeOutput(tokens=tokens[n_prompt:], trace=trace, stopped_at_eos=stopped_at_eos)

    def _draft(
        self,
        drafter: CausalLM | None,
        tokens: list[int],
        gamma: int,
        sampling: SamplingConfig,
        generator: torch.Generator,
        trace: Trace,
    ) -> tuple[list[int], torch.Tensor]:
        """Return up to `gamma` draft tokens and their draft distributions q `[n, V]` (stops after an EOS)."""
        if drafter is None or gamma == 0:
            vocab = self.target.vocab_size if self.target is not None else self.draft.vocab_size
            return [], torch.empty(0, vocab, dtype=torch.float64)
        draft_tokens: list[int] = []
        rows = []
        for _ in range(gamma):
            new = (tokens + draft_tokens)[drafter.cache_length :]
            logits = drafter.forward(new, n_logits=1).logits  # [1, V]
            trace.draft_calls += 1
            trace.draft_tokens += len(new)
            q_row = process_logits(logits, sampling)[0]  # [V]
            token = sample(q_row, generator)
            draft_tokens.append(token)
            rows.append(q_row)
            if token in self.eos_token_ids:
                break  # §1.4: EOS ends the block; nothing after it can be kept
        return draft_tokens, torch.stack(rows)  # [n, V]
