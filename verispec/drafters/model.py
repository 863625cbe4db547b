"""The model drafter: K i.i.d. paths from the draft model (`verispec.drafting.draft_paths`, docs/algorithms.md §2.1)."""

from __future__ import annotations

from verispec.drafters.base import DraftRequest, empty_block
from verispec.drafting import DraftBlock, draft_paths
from verispec.models.protocol import CausalLM


class ModelDrafter:
    """Samples the draft block from the draft model (None: drafts nothing, as `ar` and `draft` need)."""

    name = "model"

    def __init__(self, model: CausalLM | None) -> None:
        self.model = model

    def propose(self, request: DraftRequest) -> DraftBlock:
        """Return `request.n_paths` i.i.d. paths of up to `request.model_length` tokens with their q."""
        gamma = request.model_length
        if self.model is None or gamma == 0:
            return empty_block(request.n_paths, request.vocab_size)
        return draft_paths(
            self.model, request.tokens, request.n_paths, gamma, request.sampling, request.generator,
            request.eos_token_ids, request.vocab_size, request.stop_rule, request.keep_hidden, request.processors,
            request.noise, request.laws,
        )
