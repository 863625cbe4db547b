"""The in-place KV cache: the same keys and values as concatenation through appends, growth, crops and keeps, and
the decoder loop on it bit-identical to transformers' forward on DynamicCache (rollbacks and tree paths included)."""

from __future__ import annotations

import pytest
import torch

import verispec.models.kv_cache as kv_cache
from tests.models.test_lean import check_equal, pair
from verispec.models.kv_cache import InPlaceKVCache


def test_appends_crops_and_keeps_hold_what_concatenation_holds() -> None:
    gen = torch.Generator().manual_seed(0)
    cache = InPlaceKVCache(layers=2, initial_positions=3)  # small: most appends grow it
    reference: list[list[torch.Tensor]] = [[torch.empty(1, 2, 0, 4), torch.empty(1, 2, 0, 4)] for _ in range(2)]
    for step in range(40):
        action = step % 5
        if action == 3 and cache.get_seq_length() > 2:
            cut = int(torch.randint(1, cache.get_seq_length(), (1,), generator=gen))
            cache.crop(-cut if step % 2 else cache.get_seq_length() - cut)
            reference = [[t[..., : t.shape[-2] - cut, :] for t in kv] for kv in reference]
        elif action == 4 and cache.get_seq_length() > 2:
            n = cache.get_seq_length()
            keep = torch.sort(torch.randperm(n, generator=gen)[: n // 2 + 1]).values
            cache.keep(keep)
            reference = [[t.index_select(-2, keep) for t in kv] for kv in reference]
        else:
            length = int(torch.randint(1, 7, (1,), generator=gen))
            for layer in range(2):
                k, v = torch.randn(1, 2, length, 4, generator=gen), torch.randn(1, 2, length, 4, generator=gen)
                reference[layer] = [torch.cat([reference[layer][0], k], -2), torch.cat([reference[layer][1], v], -2)]
                got_k, got_v = cache.update(k, v, layer)
                assert torch.equal(got_k, reference[layer][0]) and torch.equal(got_v, reference[layer][1]), step
        assert cache.get_seq_length() == reference[0][0].shape[-2]


def test_claim_makes_room_in_every_layer_and_keeps_what_was_filled() -> None:
    cache = InPlaceKVCache(layers=2, initial_positions=3)
    like = torch.empty(1, 2, 0, 4)
    keys, values, start = cache.claim(2, like)  # no buffers yet: made from `like`
    assert start == 0 and cache.lengths == [2, 2]
    assert all(b.shape == (1, 2, 3, 4) for b in keys + values)
    for layer in range(2):
        keys[layer][..., :2, :] = layer + 1.0
    keys, values, start = cache.claim(5, like)  # needs 7 positions: grows to 12, the two filled ones copied
    assert start == 2 and cache.get_seq_length() == 7 and all(b.shape[-2] == 12 for b in keys + values)
    assert all(torch.equal(keys[layer][..., :2, :], torch.full((1, 2, 2, 4), layer + 1.0)) for layer in range(2))
    cache.crop(1)
    assert cache.claim(1, like)[2] == 1 and cache.lengths == [2, 2]
    cache.lengths = [2, 3]
    with pytest.raises(ValueError, match="different numbers of positions"):
        cache.claim(1, like)


def test_bad_sizes_are_refused() -> None:
    with pytest.raises(ValueError, match="layer"):
        InPlaceKVCache(layers=0)


@pytest.mark.parametrize("kind", ["qwen2", "llama"])
def test_decoder_loop_on_it_matches_transformers_through_growth_and_rollback(kind: str,
                                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(kv_cache, "INITIAL_POSITIONS", 4)  # so the prompt and later blocks outgrow the buffers
    lean, plain = pair(kind, torch.float32)
    assert isinstance(lean._cache, InPlaceKVCache) and not isinstance(plain._cache, InPlaceKVCache)
    tokens = torch.randint(2, lean.vocab_size, (40,), generator=torch.Generator().manual_seed(1)).tolist()
    steps = [(tokens[:6], 3), (tokens[6:7], 1), (tokens[7:12], 5), ("truncate", 9), (tokens[9:25], 4),
             (tokens[25:26], 1), ("truncate", 20), (tokens[20:40], 2)]
    for chunk, n in steps:
        if chunk == "truncate":
            lean.truncate(n)
            plain.truncate(n)
            continue
        check_equal(lean.forward(chunk, n_logits=n).logits, plain.forward(chunk, n_logits=n).logits, torch.float32)
    assert lean._cache.keys[0].shape[-2] == 64  # grown 4 -> 8 -> 16 -> 32 -> 64


def test_tree_forward_then_keep_matches_transformers() -> None:
    lean, plain = pair("qwen2", torch.float32)
    prefix = [5, 9, 11, 4, 7, 20]
    tree_tokens, parents = [12, 13, 14, 15, 16], [5, 6, 5, 8, 9]  # branches (12, 13) and (14, 15, 16)
    for model in (lean, plain):
        model.forward(prefix)
    check_equal(lean.forward(tree_tokens, n_logits=5, parents=parents).logits,
                plain.forward(tree_tokens, n_logits=5, parents=parents).logits, torch.float32)
    chain = [*range(6), 8, 9, 10]  # the prefix and the branch 14, 15, 16
    lean.keep(chain)
    plain.keep(chain)
    assert lean.cache_length == plain.cache_length == 9
    check_equal(lean.forward([17, 18], n_logits=2).logits, plain.forward([17, 18], n_logits=2).logits, torch.float32)
