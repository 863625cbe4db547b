"""The reduced draft vocabulary: the ranking, the subset, the sliced head, and exact losslessness of q_S."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from tests.device import on_test_device
from tests.stats import max_abs_diff, target_law
from tests.verify.exact import speculative_law
from verispec.drafters.vocab_ranking import count_tokens, rank_tokens
from verispec.errors import ConfigError
from verispec.models.hf import HFCausalLM
from verispec.models.tabular import TabularLM
from verispec.models.tiny import tiny_qwen2
from verispec.models.vocab import draft_vocabulary, reduced_vocabulary, special_token_ids
from verispec.sampling import SamplingConfig, process_logits
from verispec.verify import BlockLaw, block_verify_law, gbv_verify_law, token_verify_law


def test_ranking_is_by_count_then_id():
    assert rank_tokens(Counter({5: 2, 3: 7, 9: 2, 1: 1})) == [3, 5, 9, 1]


def test_counts_come_from_the_tokenizer(tokenizer):
    counts = count_tokens(tokenizer, ["abba", "b"])
    a, b = tokenizer.convert_tokens_to_ids(["a", "b"])
    assert counts == Counter({b: 3, a: 2})


def test_reduced_vocabulary_keeps_specials_then_the_best_ranked():
    assert reduced_vocabulary(4, 10, ranking=[7, 3, 8, 1], special_ids=[0]) == [0, 3, 7, 8]
    assert reduced_vocabulary(5, 10, ranking=[7], special_ids=[0, 9]) == [0, 1, 2, 7, 9]  # then ids in order
    for n, message in [(1, ">= 2"), (11, "exceeds the vocabulary"), (2, "smaller than the 3 special tokens")]:
        with pytest.raises(ConfigError, match=message):
            reduced_vocabulary(n, 10, ranking=[], special_ids=[0, 1, 2])


def test_a_tokenizer_without_a_shipped_ranking_is_a_clear_error(tokenizer):
    with pytest.raises(ConfigError, match="no token-frequency ranking ships for this tokenizer"):
        draft_vocabulary(tokenizer, 8, len(tokenizer))


def test_the_shipped_ranking_fits_the_default_pair_tokenizer():
    from verispec.models.default_pair import DEFAULT_PAIR, converted_dir

    folder = converted_dir(DEFAULT_PAIR["draft"])
    if not (folder / "tokenizer.json").is_file():
        pytest.skip("the default pair is not converted on this machine")
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(folder)
    ids = draft_vocabulary(tok, 16384, 151936)
    assert len(ids) == 16384 and ids == sorted(set(ids))
    assert set(special_token_ids(tok)) <= set(ids)
    assert {tok.convert_tokens_to_ids(t) for t in ["<|im_end|>", "def", "Ġthe", "Ġreturn"]} <= set(ids)


def test_sliced_head_gives_the_full_logits_on_its_tokens_and_minus_infinity_elsewhere(tokenizer):
    full_model = on_test_device(tiny_qwen2(len(tokenizer), seed=1))
    full = HFCausalLM(full_model, tokenizer)
    import copy

    keep = [0, 1, 5, 6, 20, 30]
    reduced = HFCausalLM(copy.deepcopy(full_model), tokenizer, vocab_ids=keep, context_vocab=False)
    assert reduced.vocab_size == full.vocab_size and reduced.draft_vocab == len(keep)
    assert reduced.model.get_output_embeddings().weight.shape[0] == len(keep)  # the head itself is smaller
    prompt = tokenizer("abc ab")["input_ids"]
    a, b = full.forward(prompt, n_logits=3).logits, reduced.forward(prompt, n_logits=3).logits  # [3, V]
    inside = torch.zeros(full.vocab_size, dtype=torch.bool)
    inside[keep] = True
    assert torch.allclose(b[:, inside], a[:, inside], atol=1e-9) and torch.all(b[:, ~inside] == float("-inf"))
    q = process_logits(b, SamplingConfig(temperature=0.7))
    expected = process_logits(a, SamplingConfig(temperature=0.7)) * inside
    assert torch.allclose(q, expected / expected.sum(-1, keepdim=True), atol=1e-12)
    with pytest.raises(ConfigError, match="needs >= 2 distinct token ids"):
        HFCausalLM(copy.deepcopy(full_model), tokenizer, vocab_ids=[3, 3])


def test_context_head_covers_each_positions_own_context_and_forgets_it_on_reset(tokenizer):
    full_model = on_test_device(tiny_qwen2(len(tokenizer), seed=1))
    full = HFCausalLM(full_model, tokenizer)
    import copy

    keep = [0, 1, 5, 6, 20, 30]
    reduced = HFCausalLM(copy.deepcopy(full_model), tokenizer, vocab_ids=keep)
    assert reduced.draft_vocab == len(keep)
    prompt = tokenizer("abc abd")["input_ids"]
    assert set(prompt) - set(keep)  # the prompt brings tokens the fixed head lacks
    a, b = full.forward(prompt, n_logits=len(prompt)).logits, reduced.forward(prompt, n_logits=len(prompt)).logits
    for row in range(len(prompt)):  # row r predicts the token after prompt[r]: its head is keep + prompt[:r + 1]
        inside = torch.zeros(full.vocab_size, dtype=torch.bool)
        inside[keep + prompt[: row + 1]] = True
        assert torch.allclose(b[row, inside], a[row, inside], atol=1e-9), row
        assert torch.all(b[row, ~inside] == float("-inf")), row
    # The same rows one token at a time: a position's head does not depend on what else shares its forward.
    reduced.reset()
    steps = torch.cat([reduced.forward([token]).logits for token in prompt])
    assert torch.equal(steps.isinf(), b.isinf()) and torch.allclose(steps, b, atol=1e-9)
    # A new sequence starts from the fixed head again.
    reduced.reset()
    other = tokenizer("a")["input_ids"]
    c = reduced.forward(other).logits[0]
    assert set(torch.nonzero(c > float("-inf")).flatten().tolist()) == set(keep) | set(other)


class Restricted:
    """A tabular draft whose conditionals are renormalised onto the token subset `support` (a reduced head), and
    with `context` onto `support` plus every token of the prefix (the head of `verispec.models.reduced_head`)."""

    def __init__(self, model: TabularLM, support: list[int], context: bool = False) -> None:
        self.model, self.vocab_size, self.context = model, model.vocab_size, context
        self.mask = torch.zeros(model.vocab_size, dtype=torch.float64)
        self.mask[support] = 1.0

    def conditional(self, prefix):
        mask = self.mask.clone()
        if self.context:
            mask[list(prefix)] = 1.0
        q = self.model.conditional(prefix) * mask
        return q / q.sum()

    def sequence_prob(self, context, continuation):
        prob, prefix = 1.0, list(context)
        for token in continuation:
            prob *= float(self.conditional(prefix)[token])
            prefix.append(int(token))
        return prob


CONTEXT = [0, 1]


def pair(seed: int):
    return TabularLM(3, seed=90 + seed), Restricted(TabularLM(3, seed=95 + seed, sharpness=2.0), [0, 2])


def context_pair(seed: int):
    """Vocabulary 4, a fixed support {0, 2} and the context [0, 1]: token 3 joins the head once the target emits it."""
    return TabularLM(4, seed=90 + seed), Restricted(TabularLM(4, seed=95 + seed, sharpness=2.0), [0, 2], context=True)


def error(law_fn, target, draft, gamma, k=None) -> float:
    law = speculative_law(law_fn, target, draft, CONTEXT, gamma, gamma + 1, k=k)
    assert abs(sum(law.values()) - 1.0) < 1e-12
    return max_abs_diff(law, target_law(target, CONTEXT, gamma + 1))


@pytest.mark.parametrize("law_fn,k", [(token_verify_law, None), (block_verify_law, None), (gbv_verify_law, 2)],
                         ids=["sd", "bv", "gbv"])
@pytest.mark.parametrize("gamma", [1, 2])
@pytest.mark.parametrize("seed", [0, 1])
def test_reduced_vocabulary_q_is_lossless(law_fn, k, gamma, seed):
    assert error(law_fn, *pair(seed), gamma, k) < 1e-12


@pytest.mark.parametrize("law_fn,k", [(token_verify_law, None), (block_verify_law, None), (gbv_verify_law, 2)],
                         ids=["sd", "bv", "gbv"])
@pytest.mark.parametrize("gamma", [1, 2])
def test_a_head_that_grows_with_the_context_is_lossless(law_fn, k, gamma):
    target, draft = context_pair(0)
    assert draft.conditional([0, 1])[3] == 0 and draft.conditional([0, 1, 3])[3] > 0  # the head does grow
    assert error(law_fn, target, draft, gamma, k) < 1e-12


class SupportOnlyResidual(BlockLaw):
    """A planted bug: the residual is kept only on the draft's support (a token outside the head never comes out)."""

    def residual(self, i):
        r = super().residual(i)
        if i == self.gamma:
            return r
        r = r * (self.q.sum(0) > 0)
        return r / r.sum()


@pytest.mark.parametrize("law_fn", [token_verify_law, block_verify_law], ids=["sd", "bv"])
@pytest.mark.parametrize("make_pair", [pair, context_pair], ids=["fixed", "context"])
def test_reduced_vocabulary_check_catches_a_residual_on_the_draft_support(law_fn, make_pair):
    buggy = lambda tokens, q, p: SupportOnlyResidual(**vars(law_fn(tokens, q, p)))  # noqa: E731
    assert error(buggy, *make_pair(0), 2) > 1e-3
