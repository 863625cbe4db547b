"""The one decode loop: draft -> target pass -> verify -> commit -> roll back. Generic over methods.

Cache invariant: every model's KV cache holds a prefix of `tokens` (the committed sequence) plus, during a
round, the draft tokens. A forward feeds whatever of the committed sequence (and draft block) the cache lacks,
so after any rollback the next round simply re-feeds the missing tail: rollback is just moving a length.

Public surface (what measurement code such as `learned.collect` and `bench.fixed_blocks` may use; the loop itself
is built from the same pieces):
- `Engine`, `DecodeConfig` (from `verispec.config`), `DecodeOutput`: decode token ids with any method;
- `score_block(decoder, tokens, block, sampling, processors=None) -> ScoredBlock`: one decoder pass over a drafted
  block (a prefix tree when K > 1), with the processed law `p` `[K, γ'+1, V]` of every path position;
- `roll_back(decoder, draft_model, base, scored, path, accepted)`: return both caches to the committed tokens
  (these two, with the prompt's reading and the tree pass, live in `verispec.scoring`);
- `verify_block` / `verify_paths`: run a method's verifier on a scored block.
Drafts come from `verispec.drafters` (`make_drafter(...).propose(DraftRequest(...))`).
"""

from __future__ import annotations

import time
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

import torch

from verispec.config import MULTIPATH_PATHS, DecodeConfig
from verispec.diagnostics import RoundObserver, SprinterDiagnostics, record_relaxed
from verispec.drafters import DraftRequest, lookup_length, make_drafter, round_length, uses_draft_model
from verispec.drafters.adaptive import AdaptiveGamma
from verispec.drafters.confidence import ConfidenceStop
from verispec.drafting import DraftBlock, PrefixTree, StopRule
from verispec.errors import ConfigError
from verispec.logprobs import TokenLogprob
from verispec.methods import Method, MultiPathResult, get_method
from verispec.models.openmp import round_threads
from verispec.models.protocol import CausalLM
from verispec.models.threads import shared_cores
from verispec.native import laws as _laws  # noqa: F401  registers GBV's and BV's C++ law kernel (verify.kernels)
from verispec.processors import LogitProcessors
from verispec.sampling import KeyedNoise
from verispec.scoring import ScoredBlock, path_rows, read_prompt, roll_back, score_block, tree_pass
from verispec.trace import RoundTrace, Trace
from verispec.verify import PathLaws, candidate_tree_verify
from verispec.verify.kernels import counting_law_steps
from verispec.verify.keyed import greedy_verify, match_choices

__all__ = ["MULTIPATH_PATHS", "DecodeConfig", "DecodeOutput", "Engine", "ScoredBlock", "path_rows", "roll_back",
           "score_block", "tree_pass", "verify_block", "verify_paths"]


@dataclass
class DecodeOutput:
    """The generated token ids (EOS included when it ended the output) and the trace."""

    tokens: list[int]
    trace: Trace
    stopped_at_eos: bool
    logprobs: list[TokenLogprob] | None = None  # one per token when `DecodeConfig.logprobs` is set, else None


class Engine:
    """Owns a target and an optional draft model and decodes with any registered method."""

    def __init__(
        self,
        target: CausalLM | None,
        draft: CausalLM | None = None,
        eos_token_ids: Iterable[int] = (),
        verifier: StopRule | None = None,
        load: Callable[[], int] | None = None,
    ):
        self.target = target
        self.draft = draft
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.verifier = verifier  # SPRINTER's learned verifier (a `verispec.learned.LearnedVerifier`)
        # How many sequences share this engine's passes now (a batched server's); the adaptive draft length
        # (`verispec.drafters.adaptive`) and the hybrid's catch-up rule then follow the load. None: decoded alone.
        self.load = load

    def _models_for(self, config: DecodeConfig) -> tuple[CausalLM, CausalLM | None]:
        method = get_method(config.method)
        decoder = self.target if method.decoder == "target" else self.draft
        if decoder is None:
            raise ConfigError(f"method {method.name!r} needs a {method.decoder} model, and none is loaded")
        drafts = method.speculative and uses_draft_model(config.drafter)
        if drafts and self.draft is None:
            raise ConfigError(f"method {method.name!r} with drafter {config.drafter!r} needs a draft model, and none "
                              f"is loaded")
        if method.learned_stop and self.verifier is None:
            raise ConfigError(f"method {method.name!r} needs a learned verifier file (verifier=... / --verifier)")
        if config.draft_vocab is not None:
            head = self.draft.draft_vocab if self.draft is not None else None
            if config.draft_vocab > decoder.vocab_size:
                raise ConfigError(f"draft_vocab={config.draft_vocab} exceeds the vocabulary ({decoder.vocab_size} "
                                  f"tokens)")
            if head != config.draft_vocab:
                raise ConfigError(f"draft_vocab={config.draft_vocab} needs a draft model loaded with a head of "
                                  f"{config.draft_vocab} tokens (Decoder(...).generate(draft_vocab=...) loads one); "
                                  f"the loaded draft's head covers {head or 'the whole vocabulary'}")
        return decoder, (self.draft if drafts else None)

    def decode(
        self,
        prompt_ids: Sequence[int],
        config: DecodeConfig,
        on_commit: Callable[[list[int]], bool | None] | None = None,
        on_logprobs: Callable[[list[TokenLogprob]], None] | None = None,
    ) -> DecodeOutput:
        """Generate from `prompt_ids` with `config`; return the new tokens and the trace.

        `on_commit`, when given, is called after every round with the tokens that round committed; a true return
        ends the decode at that round boundary (streaming, stop strings and cancellation use it; it never changes
        which tokens are drawn). `on_logprobs` (with `config.logprobs` set) is called just before it with those
        tokens' log-probabilities, for streaming them.
        """
        if len(prompt_ids) == 0:
            raise ConfigError("the prompt is empty: give at least one token")
        decoder, draft_model = self._models_for(config)
        processors = LogitProcessors.of(config)
        if processors is not None:
            processors.check_vocab(decoder.vocab_size)
        # Round work on one thread, forwards on all (verispec.models.openmp): the same bits on any thread.
        with round_threads(), shared_cores(decoder, draft_model) as (decoder, draft_model), \
                counting_law_steps() as law_steps:
            output = self._decode(prompt_ids, config, on_commit, on_logprobs, decoder, draft_model, processors)
        output.trace.law_steps_kernel, output.trace.law_steps_torch = law_steps.kernel, law_steps.torch
        return output

    def _decode(self, prompt_ids: Sequence[int], config: DecodeConfig,
                on_commit: Callable[[list[int]], bool | None] | None,
                on_logprobs: Callable[[list[TokenLogprob]], None] | None, decoder: CausalLM,
                draft_model: CausalLM | None, processors: LogitProcessors | None) -> DecodeOutput:
        """The loop of `decode`, with the models it chose (wrapped by `shared_cores`)."""
        method = config.decoding_method()  # the registered method, a lossy rule at the configured knobs
        drafter = make_drafter(config, draft_model)
        stop_rule = None
        observers: list[RoundObserver] = []
        if method.learned_stop:
            stop_rule = self.verifier if config.tau is None else self.verifier.with_threshold(config.tau)
            observers.append(SprinterDiagnostics(stop_rule, lossless=method.lossless))
        elif config.draft_confidence is not None:
            stop_rule = ConfidenceStop(config.draft_confidence)
        generator = torch.Generator().manual_seed(config.seed)
        # Keyed draws (verispec.verify.keyed): at T = 0 every draw is already the argmax, so they change nothing.
        noise = KeyedNoise(config.seed, decoder.vocab_size) if config.keyed_draws and not config.sampling.greedy \
            else None
        matched = matches_tokens(method, config)  # then no drafted row needs its law (unless observed)
        # the lengths chosen per round: the draft model's, and the lookups' (with the draft model or alone)
        adaptive = config.adaptive_gamma and (draft_model is not None or config.drafter == "ngram")
        lengths = AdaptiveGamma(config.gamma, sequences=self.load, lookup_max=lookup_length(config),
                                row_laws=not matched) if adaptive else None
        trace = Trace(prefill_tokens=len(prompt_ids))
        decoder_is_draft = method.decoder == "draft"
        for model in (decoder, draft_model):
            if model is not None:
                model.reset()

        start = time.perf_counter()
        tokens = [int(t) for t in prompt_ids]
        n_prompt = len(tokens)
        if config.prompt_chunk is not None:
            readers = [(decoder, "draft" if decoder_is_draft else "target")]
            if draft_model is not None and config.drafter == "model":  # the drafters that read it at once
                readers.append((draft_model, "draft"))
            read_prompt(readers, tokens, config.prompt_chunk, trace)
        stopped_at_eos = False
        generated: Counter[int] = Counter()  # the penalties' counts: tokens committed so far, not the prompt
        logprobs: list[TokenLogprob] | None = [] if config.logprobs is not None else None
        while len(tokens) - n_prompt < config.max_new_tokens:
            remaining = config.max_new_tokens - (len(tokens) - n_prompt)
            # A round emits at most gamma+1 tokens: never draft what cannot be kept.
            length = config.cap if method.learned_stop else config.gamma
            gamma = round_length(length, remaining) if method.speculative else 0

            # 1. Draft: up to K paths of up to gamma tokens, with the q each token was drawn from.
            t0 = time.perf_counter()
            model_gamma = lengths.next() if lengths is not None else None
            lookup_gamma = lengths.lookup_next() if lengths is not None else None
            # The same processors, at the same counts, for the draft's q and the target's p (docs/algorithms.md §0).
            round_processors = processors.at(generated) if processors is not None else None
            block = drafter.propose(DraftRequest(
                tokens, config.paths, gamma, config.sampling, generator, self.eos_token_ids, decoder.vocab_size,
                stop_rule, remaining=remaining, model_gamma=model_gamma, processors=round_processors, noise=noise,
                lookup_gamma=lookup_gamma, sequences=self.load() if self.load is not None else 1,
                laws=bool(observers) or not matched,
            ))
            t1 = time.perf_counter()
            trace.draft_calls += block.forwards
            trace.draft_tokens += block.fed

            # 2. One decoder pass over the uncached committed tokens plus the block (a tree when K > 1).
            base = len(tokens)
            scored = score_block(decoder, tokens, block, config.sampling, round_processors)
            t2 = time.perf_counter()
            if decoder_is_draft:
                trace.draft_calls, trace.draft_tokens = trace.draft_calls + 1, trace.draft_tokens + scored.fed
            else:
                trace.target_calls, trace.target_tokens = trace.target_calls + 1, trace.target_tokens + scored.fed

            # 3. Verify against the processed distributions actually sampled from.
            result = verify_block(method, block, scored, generator, noise, base)
            t3 = time.perf_counter()

            # 4. Commit the accepted prefix of the chosen path and the extra token; cut at EOS, max_new_tokens.
            emitted = block.tokens[result.path][: result.accepted] + [result.token]
            for i, token in enumerate(emitted):
                if token in self.eos_token_ids:
                    emitted = emitted[: i + 1]
                    stopped_at_eos = True
                    break
            emitted = emitted[:remaining]
            tokens.extend(emitted)
            if noise is not None:
                noise.forget(before=len(tokens))
            if processors is not None:
                generated.update(emitted)
            if logprobs is not None:  # not part of the method: timed as neither drafting, target nor verification
                round_logprobs = scored.logprobs(result.path, emitted, config.logprobs)
                logprobs.extend(round_logprobs)
                if on_logprobs is not None:
                    on_logprobs(round_logprobs)
            if lengths is not None:
                lengths.observe(block.drafter, block.length, result.accepted)
            round_trace = RoundTrace(
                block.length, result.accepted, len(emitted), scored.fed, t1 - t0, t2 - t1, t3 - t2,
                paths=len(block.tokens), tree_nodes=len(scored.tree.tokens), drafter=block.drafter,
                model_gamma=model_gamma,
            )
            if method.relaxed:
                record_relaxed(round_trace, block, scored.p, result.accepted, result.leaks)
            if observers:  # measurements outside the method: timed apart, kept out of time_total
                t_diag = time.perf_counter()
                for observer in observers:
                    observer.on_round(block, scored.p, result, round_trace, gamma)
                trace.time_diagnostics += time.perf_counter() - t_diag
            trace.rounds.append(round_trace)
            trace.time_draft += t1 - t0 + (t2 - t1 if decoder_is_draft else 0.0)
            trace.time_target += 0.0 if decoder_is_draft else t2 - t1
            trace.time_verify += t3 - t2
            stop_requested = on_commit is not None and bool(on_commit(list(emitted)))
            if stopped_at_eos or stop_requested:
                break

            # 5. Roll back both caches to the committed tokens they saw: the prefix, then the kept path.
            roll_back(decoder, draft_model, base, scored, result.path, result.accepted)
        trace.time_total = time.perf_counter() - start - trace.time_diagnostics
        return DecodeOutput(tokens=tokens[n_prompt:], trace=trace, stopped_at_eos=stopped_at_eos, logprobs=logprobs)


def verify_block(method: Method, block: DraftBlock, scored: ScoredBlock, generator: torch.Generator,
                 noise: KeyedNoise | None = None, position: int = 0) -> MultiPathResult:
    """Verify `block` against the law p `[K, γ'+1, V]` of its pass with `method`'s verifier (as `PathLaws` where
    the verifier reads p by row), except that fixed candidates (K > 1, not i.i.d.) go through the candidate-tree
    rule whatever the multi-path method (docs/algorithms.md §6.1). A lossy rule's gates also read the unprocessed
    target law p̃ of the pass (docs/algorithms.md §6.2), and its result carries each position's leak. With keyed
    draws' `noise`, a keyable method's one path is matched against the target's races instead (verispec.verify.keyed),
    the block's first token at sequence `position`; at T = 0, against the target's argmaxes (`greedy_verify`)."""
    if noise is not None:  # each row's race on its log-weights, read up to the first mismatch: no law is made
        kept = match_choices(block.tokens[0], lambda i: scored.race_choice(i, noise.row(position + i)))
        return MultiPathResult(path=0, accepted=kept.accepted, token=kept.token)
    if method.keyable and scored.sampling.greedy and len(block.tokens) == 1:
        # Token verification of point masses is a match on the argmaxes: the same result without the float64 laws
        # and their draws (about 1.5 ms a round on a 151,936-token vocabulary, per sequence of a batched pass).
        kept = greedy_verify(block.tokens[0], scored.greedy_choices())
        return MultiPathResult(path=0, accepted=kept.accepted, token=kept.token)
    if block.deterministic and method.multipath:
        return candidate_tree_verify(block.as_tensor(), block.q, scored.p, generator, scored.tree)
    p_gate = scored.per_path(scored.gate_law()) if method.relaxed else None
    return verify_paths(method, block.as_tensor(), block.q, scored.laws if method.reads_rows else scored.p,
                        generator, p_gate, scored.tree)


def matches_tokens(method: Method, config: DecodeConfig) -> bool:
    """Return whether `verify_block` verifies every round of `config` by matching tokens (keyed draws; greedy
    sampling of a keyable method's one path): its drafts then need no law (`DraftRequest.laws`)."""
    return config.paths == 1 and (config.keyed_draws or (method.keyable and config.sampling.greedy))


def verify_paths(method: Method, draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor | PathLaws,
                 generator: torch.Generator, p_gate: torch.Tensor | None = None,
                 tree: PrefixTree | None = None) -> MultiPathResult:
    """Run `method`'s verifier on K paths (`[K, γ]`, `[K, γ, V]`, `[K, γ+1, V]`); single-path ones see path 0.
    `p_gate` `[K, γ+1, V]`: a lossy rule's unprocessed target law p̃ (None: p). `tree`: the paths' prefix tree, the
    round's one (the multi-path verifiers walk it; None: they build it from `draft_tokens`)."""
    if method.multipath:
        return method.verify(draft_tokens, q, p, generator, tree=tree)
    if method.relaxed:
        gated = method.verify(draft_tokens[0], q[0], p[0], generator, p_gate=None if p_gate is None else p_gate[0])
        return MultiPathResult(path=0, accepted=gated.accepted, token=gated.token, leaks=gated.leaks)
    result = method.verify(draft_tokens[0], q[0], p[0], generator)
    return MultiPathResult(path=0, accepted=result.accepted, token=result.token)
