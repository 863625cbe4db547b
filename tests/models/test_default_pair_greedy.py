"""On the quantized paths (int8, int4) greedy speculative decoding of the embedded default pair writes exactly the
tokens greedy `ar` writes: every linear computes each token on its own and attention runs one query at a time
(verispec.models.query_attention), so a verify pass scores a drafted block with the bits of one-token forwards.
With torch's fused attention the block's shape moved logits by up to 1.6 there and greedy `sd` parted from `ar` at
near-ties (BENCHMARKS.md §3).

Slow (loads the real pair on each path); `make test` and CI run it.
"""

from __future__ import annotations

import pytest

from verispec.api import Decoder
from verispec.models.quantized import quantized_engine

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(quantized_engine() is None, reason="this torch build has no fbgemm engine")]

PROMPTS = [
    "Write a Python function that returns the sum of the squares of a list of numbers.",
    "Explain in two sentences what a hash map is.",
]


@pytest.fixture(scope="module", params=["int8", "int4"])
def quantized(request):
    return Decoder(linear_backend=request.param)


@pytest.mark.parametrize("prompt", PROMPTS)
@pytest.mark.parametrize("settings", [dict(method="sd"), dict(method="gbv", paths=3),
                                      dict(method="sd", drafter="ngram", ngram_min=1)])
def test_greedy_speculative_decoding_writes_ars_tokens(quantized, prompt, settings):
    ar = quantized.generate(prompt, method="ar", max_new_tokens=48)
    out = quantized.generate(prompt, gamma=4, max_new_tokens=48, **settings)
    target = quantized.model("target")
    assert target.per_query_attention and "one query at a time" in target.decoder_loop
    assert out.tokens == ar.tokens
