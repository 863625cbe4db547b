"""The hybrid drafter: prompt lookup where the context has a match, the draft model elsewhere.

The draft model pays for its own prefill: before it drafts, its cache must catch up on every committed token it has
not seen (the whole prompt, the first time). On long prompts that costs more than the model drafter can save in a
short answer (BENCHMARKS.md §11: a 680-token prompt took the llama.cpp draft about 4 s, some 35 target steps, for a
128-token answer). So the model drafts a round only when that catch-up is at most `catchup` times the tokens the
decode may still emit; otherwise the round is a plain target step, as under `ngram` alone. The rule reads token
counts only, never timings or draws: the drafter chosen each round depends on the committed tokens alone, so every
verifier stays lossless and a seed gives the same tokens on any machine.

Under load (n sequences sharing every pass, `DraftRequest.sequences`) a catch-up is a prefill that all n sequences
wait for, while what it can save is this sequence's: the catch-up is weighed n times, `behind` × n against `catchup`
× remaining. The engine passes n > 1 only where a request's rounds may follow the load (at T = 0 or with keyed
draws, whose tokens do not depend on the drafter: `verispec.serve.batched.load_follows`).
"""

from __future__ import annotations

from verispec.drafters.base import DraftRequest, empty_block
from verispec.drafters.model import ModelDrafter
from verispec.drafters.ngram import NgramDrafter
from verispec.drafting import DraftBlock

# The default catch-up ratio. Catching up n tokens costs the draft a prefill of n tokens; drafting can save at most
# the remaining tokens times what sd saves per token. Measured on a 2-core CPU (llama.cpp draft prefill ~170
# tokens/s; sd over ar ~1.3x at ~120 ms per target step) the break-even ratio is about 5; a hybrid round saves less
# than a model-only round (lookup already serves the easy stretches), so the default keeps a margin.
HYBRID_CATCHUP = 2.0


class HybridDrafter:
    """Each round: the n-gram candidates if some suffix matches, else the model's paths when its catch-up is cheap
    enough (`DraftBlock.drafter` says which proposed; "none" for a plain step)."""

    name = "hybrid"

    def __init__(self, ngram: NgramDrafter, model: ModelDrafter, catchup: float = HYBRID_CATCHUP) -> None:
        self.ngram, self.model, self.catchup = ngram, model, catchup

    def propose(self, request: DraftRequest) -> DraftBlock:
        """Return the n-gram block when it drafts something, else the model drafter's block, or nothing when the
        draft model would first have to catch up on more than `catchup` × `request.remaining` / `request.sequences`
        tokens."""
        block = self.ngram.propose(request)
        if block.length > 0:
            return block
        if self.model.model is not None and request.remaining is not None:  # catchup = inf: never too far behind
            behind = len(request.tokens) - self.model.model.cache_length
            if behind * max(1, request.sequences) > self.catchup * request.remaining:
                return empty_block(request.n_paths, request.vocab_size)
        return self.model.propose(request)
