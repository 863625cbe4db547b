"""The new drafters on the embedded default pair: greedy decoding writes what `ar` writes.

Slow (loads the real pair, and a second draft with a reduced head); `make test` and CI run it.
"""

from __future__ import annotations

import pytest

from verispec import Decoder

pytestmark = pytest.mark.slow

PROMPT = "Repeat this list twice, then sort it: banana, apple, cherry, banana, apple, cherry."


@pytest.fixture(scope="module")
def decoder():
    return Decoder()


@pytest.mark.parametrize(
    "settings",
    [
        dict(method="sd", drafter="ngram"),
        dict(method="bv", drafter="hybrid"),
        dict(method="gbv", drafter="ngram", paths=3),
        dict(method="specinfer", drafter="hybrid", paths=2),
        dict(method="sd", draft_vocab=16384),
        dict(method="bv", drafter="hybrid", draft_vocab=8192),
    ],
)
def test_greedy_drafters_equal_ar_on_the_default_pair(decoder, settings):
    ar = decoder.generate(PROMPT, method="ar", max_new_tokens=32)
    out = decoder.generate(PROMPT, gamma=4, max_new_tokens=32, ngram_min=1, **settings)
    assert out.tokens == ar.tokens
    if settings.get("drafter") in ("ngram", "hybrid"):
        assert out.trace.rounds_by_drafter().get("ngram", 0) > 0
