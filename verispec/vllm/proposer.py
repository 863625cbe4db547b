"""verispec's n-gram drafter as a vLLM proposer (`method="custom_class"`).

vLLM builds the class named by `speculative_config.model` with its `VllmConfig`, and each step calls `propose` with
every running request's committed tokens (`token_ids_cpu[i, :num_tokens_no_spec[i]]`). Each request is looked up
with verispec's `NgramIndex` over its own context: the longest suffix of `ngram_min..ngram_max` tokens that occurred
before, its most recent occurrence, and at most γ = `num_speculative_tokens` of the tokens that followed it
(docs/algorithms.md §6.1). vLLM's own `ngram` method looks up the same kind of match; verispec's picks the longest
suffix and its latest occurrence, which is the rule its engine measures.

The index is built afresh from a request's tokens every step (vLLM's rows move between steps as requests come and
go, so per-row state would have to follow them): O(context × (ngram_max − ngram_min + 1)) dictionary inserts, about
a millisecond per thousand context tokens, small beside a target forward on a CPU.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from verispec.drafters.ngram import NgramIndex
from verispec.vllm import check_vllm_version

NGRAM_MIN, NGRAM_MAX = 2, 4  # verispec's defaults (DecodeConfig.ngram_min / ngram_max)


class NgramProposer:
    """Prompt lookup for every request of a vLLM batch, one point-mass path each (vLLM's rejection sampler treats a
    proposer without draft probabilities as q = a point mass on each drafted token)."""

    def __init__(self, vllm_config: Any, ngram_min: int = NGRAM_MIN, ngram_max: int = NGRAM_MAX) -> None:
        check_vllm_version()
        spec = vllm_config.speculative_config
        self.gamma = int(spec.num_speculative_tokens)
        self.max_model_len = int(vllm_config.model_config.max_model_len)
        self.ngram_min, self.ngram_max = ngram_min, ngram_max

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray,
                slot_mappings: Any = None) -> list[list[int]]:
        """Return each request's draft (possibly empty): [] where it sampled nothing this step (it is still reading
        its prompt) or has reached the context length, else its lookup continuation."""
        drafts: list[list[int]] = []
        for row, sampled in enumerate(sampled_token_ids):
            length = int(num_tokens_no_spec[row])
            room = self.max_model_len - length
            if not sampled or room <= 1:
                drafts.append([])
                continue
            drafts.append(self.lookup(token_ids_cpu[row, :length].tolist(), min(self.gamma, room - 1)))
        return drafts

    def lookup(self, tokens: list[int], gamma: int) -> list[int]:
        """Return the n-gram continuation of `tokens` (≤ `gamma` tokens; [] without a match)."""
        index = NgramIndex(self.ngram_min, self.ngram_max)
        index.extend(tokens)
        paths = index.candidates(1, gamma)
        return paths[0] if paths else []

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load: lookup needs no model (vLLM calls this on every proposer that has it)."""
