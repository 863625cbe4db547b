"""verispec's drafters as vLLM proposers (`method="custom_class"`): the n-gram lookup, and the hybrid.

vLLM builds the class named by `speculative_config.model` with its `VllmConfig`, and each step calls `propose` with
every running request's committed tokens (`token_ids_cpu[i, :num_tokens_no_spec[i]]`). Each request is looked up
with verispec's `NgramIndex` over its own context: the longest suffix of `ngram_min..ngram_max` tokens that occurred
before, its most recent occurrence, and at most γ = `num_speculative_tokens` of the tokens that followed it
(docs/algorithms.md §6.1). vLLM's own `ngram` method looks up the same kind of match; verispec's picks the longest
suffix and its latest occurrence, which is the rule its engine measures.

The index is built afresh from a request's tokens every step (vLLM's rows move between steps as requests come and
go, so per-row state would have to follow them): O(context × (ngram_max − ngram_min + 1)) dictionary inserts, about
a millisecond per thousand context tokens, small beside a target forward on a CPU.

`HybridProposer` is verispec's hybrid drafter (docs/algorithms.md §6.1): the lookup where a suffix matches, else
greedy drafts from a draft model that verispec loads and runs on its own kernels inside vLLM's worker
(`VERISPEC_VLLM_DRAFT`: the embedded default draft unless it names another; `verispec.vllm.draft_pool`).
"""

from __future__ import annotations

import os
from typing import Any

import numpy as np

from verispec.drafters.ngram import NgramIndex
from verispec.vllm import check_vllm_version
from verispec.vllm.draft_pool import DraftPool

NGRAM_MIN, NGRAM_MAX = 2, 4  # verispec's defaults (DecodeConfig.ngram_min / ngram_max)
DRAFT_ENV = "VERISPEC_VLLM_DRAFT"  # the hybrid's draft model: a verispec model spec ("default", a .gguf, a folder)


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
        return [self.lookup(*row) if row else [] for row in self.rows(sampled_token_ids, num_tokens_no_spec,
                                                                      token_ids_cpu)]

    def rows(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray,
             token_ids_cpu: np.ndarray) -> list[tuple[list[int], int] | None]:
        """Return each request's committed tokens and the most it may draft; None where it drafts nothing."""
        rows: list[tuple[list[int], int] | None] = []
        for row, sampled in enumerate(sampled_token_ids):
            length = int(num_tokens_no_spec[row])
            room = self.max_model_len - length
            rows.append((token_ids_cpu[row, :length].tolist(), min(self.gamma, room - 1))
                        if sampled and room > 1 else None)
        return rows

    def lookup(self, tokens: list[int], gamma: int) -> list[int]:
        """Return the n-gram continuation of `tokens` (≤ `gamma` tokens; [] without a match)."""
        index = NgramIndex(self.ngram_min, self.ngram_max)
        index.extend(tokens)
        paths = index.candidates(1, gamma)
        return paths[0] if paths else []

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Nothing to load: lookup needs no model (vLLM calls this on every proposer that has it)."""


class HybridProposer(NgramProposer):
    """The lookup for every request whose context has a match; greedy drafts from verispec's draft model, on its
    own kernels and caches, for the others (one point-mass path each, as for the lookup)."""

    def __init__(self, vllm_config: Any) -> None:
        super().__init__(vllm_config)
        self.draft_spec = os.environ.get(DRAFT_ENV, "").strip() or "default"
        self.capacity = int(vllm_config.scheduler_config.max_num_seqs)  # one cache per request vLLM runs at once
        self.vocab_size = int(vllm_config.model_config.get_vocab_size())
        self.pool: DraftPool | None = None

    def load_model(self, *args: Any, **kwargs: Any) -> None:
        """Load the draft model (vLLM calls this when it loads the target, so start-up pays for it)."""
        self.draft_pool()

    def draft_pool(self) -> DraftPool:
        """Return the pool of draft caches, loading the draft model the first time."""
        if self.pool is None:
            from verispec.models.loading import load_model

            model = load_model(self.draft_spec, "draft")
            self.pool = DraftPool(model, self.capacity, self.vocab_size)
        return self.pool

    def propose(self, sampled_token_ids: list[list[int]], num_tokens_no_spec: np.ndarray, token_ids_cpu: np.ndarray,
                slot_mappings: Any = None) -> list[list[int]]:
        """Return each request's lookup continuation where it has one, else its draft model's greedy draft."""
        rows = self.rows(sampled_token_ids, num_tokens_no_spec, token_ids_cpu)
        drafts = [self.lookup(*row) if row else [] for row in rows]
        misses = [(i, row) for i, row in enumerate(rows) if row is not None and not drafts[i]]
        if misses:
            modelled = self.draft_pool().draft([ctx for _, (ctx, _) in misses], [gamma for _, (_, gamma) in misses])
            for (i, _), draft in zip(misses, modelled, strict=True):
                drafts[i] = draft
        return drafts
