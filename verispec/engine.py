"""The one decode loop: draft -> target pass -> verify -> commit -> roll back. Generic over methods.

Cache invariant: every model's KV cache holds a prefix of `tokens` (the committed sequence) plus, during a
round, the draft tokens. A forward feeds whatever of the committed sequence (and draft block) the cache lacks,
so after any rollback the next round simply re-feeds the missing tail: rollback is just moving a length.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field

import torch

from verispec.drafters import DraftRequest, check_drafter_settings, make_drafter, uses_draft_model
from verispec.drafting import DraftBlock, PrefixTree, StopRule, merge_paths
from verispec.errors import ConfigError
from verispec.methods import Method, MultiPathResult, get_method
from verispec.models.protocol import CausalLM
from verispec.sampling import SamplingConfig, process_logits
from verispec.theory import leak
from verispec.trace import RoundTrace, Trace
from verispec.verify import candidate_tree_verify
from verispec.verify.relaxed import RelaxedKnobs, relaxed_verify

# K of a multi-path method when none is given: the best K of `gbv` on the dev-short prompts at T = 1 (BENCHMARKS.md
# §5). At T = 0 the K paths are equal, so a multi-path method only pays for them.
MULTIPATH_PATHS = 3


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
    drafter: str = "model"  # a name in verispec.drafters.DRAFTERS: model | ngram | hybrid
    ngram_min: int = 2  # prompt lookup: the shortest suffix of the context looked up
    ngram_max: int = 4  # prompt lookup: the longest suffix looked up (the longest match wins)
    draft_vocab: int | None = None  # N: the draft model's head covers only the N most frequent tokens; None = all
    # Lossy relaxed-acceptance rules (verify/relaxed.py, docs/algorithms.md §6.2); defaults are deployed settings.
    typical_epsilon: float = RelaxedKnobs.typical_epsilon  # typical: keep x when p̃(x) > min(ε, δ·e^{−H(p̃)})
    typical_delta: float = RelaxedKnobs.typical_delta  # typical: δ (inf: the threshold is ε alone)
    margin_delta: float = RelaxedKnobs.margin_delta  # margin: keep x when log p̃(x) > max log p̃ − Δ (nats)
    fuzzy_threshold: float = RelaxedKnobs.fuzzy_threshold  # fuzzy: keep while JS(p, q) < θ (nats, ≤ ln 2)
    fly_entropy: float = RelaxedKnobs.fly_entropy  # fly: entropy gate θ on p̃'s top-k (nats)
    fly_window: int = RelaxedKnobs.fly_window  # fly: W draft tokens that must pass to keep a rejected one (< gamma)
    fly_top_k: int = RelaxedKnobs.fly_top_k  # fly: k of the entropy gate

    def __post_init__(self) -> None:
        method = get_method(self.method)
        if not isinstance(self.gamma, int) or isinstance(self.gamma, bool) or self.gamma < 1:
            raise ConfigError(f"gamma (draft length) must be an integer >= 1, got {self.gamma!r}")
        if self.paths is None:
            object.__setattr__(self, "paths", MULTIPATH_PATHS if method.multipath else 1)  # frozen: set once here
        if not isinstance(self.paths, int) or isinstance(self.paths, bool) or self.paths < 1:
            raise ConfigError(f"paths (K) must be an integer >= 1, got {self.paths!r}")
        if self.paths > 1 and not method.multipath:
            raise ConfigError(f"method {self.method!r} verifies a single path; paths must be 1, got {self.paths}")
        if self.paths == 1 and method.multipath:
            # One path would silently run a single-path rule at the multi-path rule's cost (tree bookkeeping).
            hint = "with one path it is block verification: use --method bv" if self.method == "gbv" else (
                "for a single path use sd or bv")
            raise ConfigError(f"method {self.method!r} needs paths >= 2 ({hint})")
        if not isinstance(self.cap, int) or isinstance(self.cap, bool) or self.cap < 1:
            raise ConfigError(f"cap (the longest SPRINTER draft run) must be an integer >= 1, got {self.cap!r}")
        if self.tau is not None and not (isinstance(self.tau, (int, float)) and 0.0 <= self.tau <= 1.0):
            raise ConfigError(f"tau (the verifier threshold) must be in [0, 1], got {self.tau!r}")
        self.relaxed_knobs()  # validates the lossy rules' knobs
        if self.method == "fly" and self.fly_window >= self.gamma:
            raise ConfigError(f"fly_window (W) must be < gamma ({self.gamma}): a deferred rejection is confirmed by "
                              f"the W draft tokens after it, got {self.fly_window}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise ConfigError(f"max_new_tokens must be an integer >= 1, got {self.max_new_tokens!r}")
        if not isinstance(self.seed, int):
            raise ConfigError(f"seed must be an integer, got {self.seed!r}")
        check_drafter_settings(self, method)

    def relaxed_knobs(self) -> RelaxedKnobs:
        """Return the lossy rules' knobs (validated; ConfigError names a knob out of range)."""
        return RelaxedKnobs(**{name: getattr(self, name) for name in RelaxedKnobs.__dataclass_fields__})


@dataclass
class DecodeOutput:
    """The generated token ids (EOS included when it ended the output) and the trace."""

    tokens: list[int]
    trace: Trace
    stopped_at_eos: bool


class Engine:
    """Owns a target and an optional draft model and decodes with any registered method."""

    def __init__(
        self,
        target: CausalLM | None,
        draft: CausalLM | None = None,
        eos_token_ids: Iterable[int] = (),
        verifier: StopRule | None = None,
    ):
        self.target = target
        self.draft = draft
        self.eos_token_ids = frozenset(int(t) for t in eos_token_ids)
        self.verifier = verifier  # SPRINTER's learned verifier (a `verispec.learned.LearnedVerifier`)

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
            head = getattr(self.draft, "draft_vocab", None)
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
    ) -> DecodeOutput:
        """Generate from `prompt_ids` with `config`; return the new tokens and the trace.

        `on_commit`, when given, is called after every round with the tokens that round committed; a true return
        ends the decode at that round boundary (streaming, stop strings and cancellation use it; it never changes
        which tokens are drawn).
        """
        if len(prompt_ids) == 0:
            raise ConfigError("the prompt is empty: give at least one token")
        method = get_method(config.method)
        decoder, draft_model = self._models_for(config)
        drafter = make_drafter(config, draft_model)
        stop_rule = None
        if method.learned_stop:
            stop_rule = self.verifier if config.tau is None else self.verifier.with_threshold(config.tau)
        generator = torch.Generator().manual_seed(config.seed)
        trace = Trace(prefill_tokens=len(prompt_ids))
        decoder_is_draft = method.decoder == "draft"
        knobs = config.relaxed_knobs() if method.relaxed else None  # validated once, read every round
        for model in (decoder, draft_model):
            if model is not None:
                model.reset()

        start = time.perf_counter()
        tokens = [int(t) for t in prompt_ids]
        n_prompt = len(tokens)
        stopped_at_eos = False
        while len(tokens) - n_prompt < config.max_new_tokens:
            remaining = config.max_new_tokens - (len(tokens) - n_prompt)
            # A round emits at most gamma+1 tokens: never draft what cannot be kept (a rule on counts only,
            # so it keeps the method lossless, docs/algorithms.md §1.4 "Variable γ").
            length = config.cap if method.learned_stop else config.gamma
            gamma = min(length, remaining - 1) if method.speculative else 0

            # 1. Draft: up to K paths of up to gamma tokens, with the q each token was drawn from.
            t0 = time.perf_counter()
            block = drafter.propose(DraftRequest(
                tokens, config.paths, gamma, config.sampling, generator, self.eos_token_ids, decoder.vocab_size,
                stop_rule,
            ))
            t1 = time.perf_counter()
            trace.draft_calls += block.forwards
            trace.draft_tokens += block.fed

            # 2. One decoder pass over the uncached committed tokens plus the block (a tree when K > 1).
            base = len(tokens)
            logits, tree, fed = tree_pass(decoder, tokens, block)
            t2 = time.perf_counter()
            if decoder_is_draft:
                trace.draft_calls, trace.draft_tokens = trace.draft_calls + 1, trace.draft_tokens + fed
            else:
                trace.target_calls, trace.target_tokens = trace.target_calls + 1, trace.target_tokens + fed

            # 3. Verify against the processed distributions actually sampled from.
            p = path_rows(process_logits(logits, config.sampling), tree)  # [K, γ'+1, V]
            if method.relaxed:  # the gates read the unprocessed target law p̃ (docs/algorithms.md §6.2)
                p_gate = path_rows(torch.softmax(logits.to(torch.float64), dim=-1), tree)
                single, leaks = relaxed_verify(method.name, block.as_tensor()[0], block.q[0], p[0], p_gate[0],
                                               knobs, generator)
                result = MultiPathResult(path=0, accepted=single.accepted, token=single.token)
            else:
                result = verify_block(method, block, p, generator)
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
            round_trace = RoundTrace(
                block.length, result.accepted, len(emitted), fed, t1 - t0, t2 - t1, t3 - t2,
                paths=len(block.tokens), tree_nodes=len(tree.tokens), drafter=block.drafter,
            )
            if stop_rule is not None:
                t_diag = time.perf_counter()
                # The target pass covers every drafted token, so whether each one was acceptable (q(x) ≤ p(x),
                # λ = 1) is known for free: η_FP and η_TP are measured online at the deployed threshold (§3.8).
                index = block.as_tensor()[0].view(-1, 1)
                p_x, q_x = p[0, :-1].gather(1, index).view(-1), block.q[0].gather(1, index).view(-1)
                round_trace.verifier_scores = block.scores
                round_trace.verifier_accepts = block.accepted_by_rule
                round_trace.acceptable = (q_x <= p_x).tolist()
                round_trace.tv_pq, round_trace.leak = position_leaks(
                    stop_rule, block, p[0, :-1], gamma, lossless=method.lossless)
                trace.time_diagnostics += time.perf_counter() - t_diag
            if method.relaxed:
                # ε at each position the rule examined (1..τ+1): the TV between that position's output law and p
                # (§3.3); None at drafted positions past the first rejection. TV(p, q) at every drafted position.
                examined = min(result.accepted + 1, block.length)
                round_trace.tv_pq = (0.5 * (p[0, :-1] - block.q[0]).abs().sum(-1)).tolist()
                round_trace.leak = leaks[:examined] + [None] * (block.length - examined)
            trace.rounds.append(round_trace)
            trace.time_draft += t1 - t0 + (t2 - t1 if decoder_is_draft else 0.0)
            trace.time_target += 0.0 if decoder_is_draft else t2 - t1
            trace.time_verify += t3 - t2
            stop_requested = on_commit is not None and bool(on_commit(list(emitted)))
            if stopped_at_eos or stop_requested:
                break

            # 5. Roll back both caches to the committed tokens they saw: the prefix, then the kept path.
            kept_nodes = [tree.node_of[result.path][i] for i in range(result.accepted)]
            self._roll_back(decoder, base, [base + node for node in kept_nodes], len(block.tokens))
            if draft_model is not None and block.forwards:  # a round the draft model did not draft left it as it was
                kept_draft = block.positions[result.path][: result.accepted]
                self._roll_back(draft_model, base, kept_draft, len(block.tokens))
        trace.time_total = time.perf_counter() - start - trace.time_diagnostics
        return DecodeOutput(tokens=tokens[n_prompt:], trace=trace, stopped_at_eos=stopped_at_eos)

    @staticmethod
    def _roll_back(model: CausalLM, base: int, kept: list[int], n_paths: int) -> None:
        """Keep the first `base` cached tokens and then the cache positions `kept` (one path)."""
        if n_paths == 1:  # the path follows the prefix contiguously: rolling back is moving a length
            model.truncate(min(model.cache_length, base + len(kept)))
        else:
            model.keep(list(range(min(base, model.cache_length))) + kept)


def tree_pass(decoder: CausalLM, tokens: list[int], block: DraftBlock) -> tuple[torch.Tensor, PrefixTree, int]:
    """Run one decoder pass over the committed `tokens` its cache lacks plus the draft paths of `block`, merged into
    a prefix tree (tree attention when K > 1); return (logits `[N+1, V]`: the root, then each tree node; the tree;
    the number of tokens fed). The cache must lack at least the last committed token (the root's logits)."""
    base = len(tokens)
    tree = merge_paths(block.tokens)
    new = tokens[decoder.cache_length :]
    if len(block.tokens) == 1:
        logits = decoder.forward(new + block.tokens[0], n_logits=block.length + 1).logits  # [γ'+1, V]
    else:
        parents = list(range(base - len(new) - 1, base - 1))  # the committed tokens continue the chain
        parents += [base - 1 if parent < 0 else base + parent for parent in tree.parents]
        logits = decoder.forward(new + tree.tokens, n_logits=len(tree.tokens) + 1, parents=parents).logits
    return logits, tree, len(new) + len(tree.tokens)


def path_rows(node_rows: torch.Tensor, tree: PrefixTree) -> torch.Tensor:
    """Return the rows `[N+1, ...]` of the root and the tree nodes (from `tree_pass`) laid out per path,
    `[K, γ'+1, ...]`: row i of path k is the node after its first i tokens (the multi-path contract)."""
    if len(tree.node_of) == 1:
        return node_rows.unsqueeze(0)  # one path: the nodes are the path
    rows = [[0] + [1 + node for node in nodes] for nodes in tree.node_of]
    return node_rows[torch.tensor(rows)]


def position_leaks(
    stop_rule: StopRule, block: DraftBlock, p_rows: torch.Tensor, reachable: int, lossless: bool
) -> tuple[list[float], list[float | None]]:
    """Return (TV(p, q), ε) at each drafted position of a SPRINTER round (`RoundTrace.tv_pq`, `.leak`).

    ε = Σ_v a(v)·(q(v) − p(v))_+ with a(v) the verifier's decision had v been drawn (§3.3, `theory.leak`); the
    position at `reachable` (the cap, or the room left before max_new_tokens) is verified whatever a says, and so is
    every position of a lossless method: None there.
    """
    q_rows = block.q[0]  # [γ', V]
    tv = (0.5 * (p_rows - q_rows).abs().sum(-1)).tolist()
    if lossless:
        return tv, [None] * len(tv)
    leaks: list[float | None] = []
    for i, hidden in enumerate(block.hiddens):
        if i + 1 >= reachable:
            leaks.append(None)
            continue
        leaks.append(leak(p_rows[i], q_rows[i], stop_rule.accept_mask(hidden, q_rows[i], i + 1)))
    return tv, leaks


def verify_block(method: Method, block: DraftBlock, p: torch.Tensor, generator: torch.Generator) -> MultiPathResult:
    """Verify `block` against p `[K, γ'+1, V]` with `method`'s verifier, except that fixed candidates (K > 1, not
    i.i.d.) go through the candidate-tree rule whatever the multi-path method (docs/algorithms.md §6.1)."""
    if block.deterministic and method.multipath:
        return candidate_tree_verify(block.as_tensor(), block.q, p, generator)
    return verify_paths(method, block.as_tensor(), block.q, p, generator)


def verify_paths(method: Method, draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
                 generator: torch.Generator) -> MultiPathResult:
    """Run `method`'s verifier on K paths (`[K, γ]`, `[K, γ, V]`, `[K, γ+1, V]`); single-path ones see path 0."""
    if method.multipath:
        return method.verify(draft_tokens, q, p, generator)
    result = method.verify(draft_tokens[0], q[0], p[0], generator)
    return MultiPathResult(path=0, accepted=result.accepted, token=result.token)
