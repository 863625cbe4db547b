"""The hybrid drafter: prompt lookup where the context has a match, the draft model elsewhere."""

from __future__ import annotations

from verispec.drafters.base import DraftRequest
from verispec.drafters.model import ModelDrafter
from verispec.drafters.ngram import NgramDrafter
from verispec.drafting import DraftBlock


class HybridDrafter:
    """Each round: the n-gram candidates if some suffix matches, else the model's paths (`DraftBlock.drafter` says
    which proposed). Either proposal is lossless under the verifier the engine pairs it with."""

    name = "hybrid"

    def __init__(self, ngram: NgramDrafter, model: ModelDrafter) -> None:
        self.ngram, self.model = ngram, model

    def propose(self, request: DraftRequest) -> DraftBlock:
        """Return the n-gram block when it drafts something, else the model drafter's block."""
        block = self.ngram.propose(request)
        return block if block.length > 0 else self.model.propose(request)
