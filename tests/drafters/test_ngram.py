"""Prompt lookup: longest match wins, most recent occurrence wins, no match drafts nothing, lengths are bounded."""

from __future__ import annotations

import pytest
import torch

from verispec.drafters import DraftRequest, NgramDrafter, NgramIndex
from verispec.sampling import SamplingConfig

A, B, C, X, Y, Z = 10, 11, 12, 20, 21, 22


def candidates(tokens, n_paths=1, gamma=3, ngram_min=1, ngram_max=3, eos=frozenset()):
    index = NgramIndex(ngram_min, ngram_max)
    index.extend(tokens)
    return index.candidates(n_paths, gamma, eos)


def request(tokens, n_paths=1, gamma=3, vocab=32):
    return DraftRequest(list(tokens), n_paths, gamma, SamplingConfig(), torch.Generator(), frozenset(), vocab)


def test_longest_match_wins():
    # "B C" last occurred before Y, but the longer suffix "A B C" occurred (earlier) before X.
    tokens = [A, B, C, X, 1, 2, B, C, Y, 3, A, B, C]
    assert candidates(tokens) == [[X, 1, 2]]
    assert candidates(tokens, ngram_max=2) == [[Y, 3, A]]  # without 3-grams, "B C" is the longest match


def test_most_recent_occurrence_wins():
    tokens = [A, B, X, 1, A, B, Y, 2, A, B]
    assert candidates(tokens, gamma=2) == [[Y, 2]]


def test_no_match_drafts_nothing():
    assert candidates([A, B, C, X, Y]) == []
    block = NgramDrafter(1, 3).propose(request([A, B, C, X, Y]))
    assert block.length == 0 and block.drafter == "none" and block.forwards == 0


def test_ngram_min_is_respected():
    tokens = [A, X, B, A]  # only the 1-gram "A" recurs
    assert candidates(tokens, ngram_min=1) == [[X, B, A]]
    assert candidates(tokens, ngram_min=2) == []


def test_never_proposes_more_than_gamma_or_past_the_context():
    tokens = [A, B, X, Y, Z, 1, 2, 3, A, B]
    assert candidates(tokens, gamma=2) == [[X, Y]]
    assert candidates(tokens, gamma=0) == []
    assert candidates([A, A], gamma=5) == [[A]]  # the occurrence ends one token before the end: one token follows


def test_continuation_is_cut_after_an_eos():
    tokens = [A, B, X, 0, Y, A, B]
    assert candidates(tokens, gamma=4, eos=frozenset({0})) == [[X, 0]]


def test_several_candidates_are_distinct_equal_length_and_start_with_the_best():
    tokens = [A, B, X, 1, A, B, Y, 2, A, B, Y, 2, C, B, Z, 3, A, B]
    found = candidates(tokens, n_paths=3, gamma=2)
    assert found[0] == candidates(tokens, n_paths=1, gamma=2)[0] == [Y, 2]
    assert found == [[Y, 2], [X, 1], [Z, 3]]  # then the older "A B" occurrence, then the shorter suffix "B"
    assert len({tuple(c) for c in found}) == len(found)


def test_incremental_index_equals_a_fresh_one():
    tokens = [A, B, C, A, B, X, C, A, B, C, A]
    grown = NgramIndex(1, 3)
    for end in (3, 4, 8, len(tokens)):
        grown.extend(tokens[:end])
    fresh = NgramIndex(1, 3)
    fresh.extend(tokens)
    assert grown.ends == fresh.ends
    assert grown.candidates(3, 4) == fresh.candidates(3, 4)


def test_block_is_a_point_mass_on_each_candidate_token():
    tokens = [A, B, X, 1, A, B, Y, 2, A, B]
    block = NgramDrafter(1, 2).propose(request(tokens, n_paths=2, gamma=2))
    assert block.tokens == [[Y, 2], [X, 1]] and block.deterministic and block.drafter == "ngram"
    assert block.q.shape == (2, 2, 32)
    assert torch.equal(block.q.argmax(-1), block.as_tensor()) and torch.all(block.q.sum(-1) == 1.0)


def test_index_lengths_are_checked():
    with pytest.raises(AssertionError):
        NgramIndex(3, 2)


def test_own_lookup_length_overrides_the_requests_and_is_cut_by_what_remains():
    tokens = [A, B, X, Y, Z, 1, 2, 3, A, B]
    drafter = NgramDrafter(1, 3, gamma=6)
    assert drafter.propose(request(tokens, gamma=2)).tokens == [[X, Y, Z, 1, 2, 3]]
    cut = DraftRequest(list(tokens), 1, 2, SamplingConfig(), torch.Generator(), frozenset(), 32, remaining=4)
    assert NgramDrafter(1, 3, gamma=6).propose(cut).tokens == [[X, Y, Z]]  # 3 drafted + 1 from the target = 4
    assert NgramDrafter(1, 3).propose(request(tokens, gamma=2)).tokens == [[X, Y]]
    assert NgramDrafter(1, 3, gamma=6).propose(request(tokens, gamma=0)).length == 0  # not a speculative round
