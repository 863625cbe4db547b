"""The Hugging Face adapter on tiny random models: cache, exact rollback, hidden states, logits_to_keep."""

from __future__ import annotations

import torch

from tests.device import on_test_device
from tests.models.protocol_cases import fresh_logits, rollback_case, tree_case
from verispec.models.hf import HFCausalLM
from verispec.models.tabular import TabularLM
from verispec.models.tiny import tiny_qwen2, tiny_tokenizer


def tiny_model(seed: int = 1) -> HFCausalLM:
    tokenizer = tiny_tokenizer()
    return HFCausalLM(on_test_device(tiny_qwen2(len(tokenizer), seed=seed)), tokenizer)


def test_incremental_forward_matches_a_fresh_forward():
    model = tiny_model()
    seq = [3, 7, 11, 2, 9, 30, 4, 8]
    model.forward(seq[:5])
    incremental = model.forward(seq[5:], n_logits=3).logits
    assert model.cache_length == len(seq)
    torch.testing.assert_close(incremental, fresh_logits(model, seq, 3), rtol=0, atol=1e-6)


def test_rollback_is_exact():
    after_rollback, expected, stale = rollback_case(tiny_model())
    torch.testing.assert_close(after_rollback, expected, rtol=0, atol=1e-6)
    assert (stale - expected).abs().max() > 1e-3  # a rollback not undone would leave b's keys and show here


def test_truncate_beyond_the_cache_is_a_no_op():
    model = tiny_model()
    model.forward([1, 2, 3])
    model.truncate(10)
    assert model.cache_length == 3


def test_hidden_states_are_the_last_layers_at_the_kept_positions():
    model = tiny_model()
    model.forward([4, 5])
    out = model.forward([6, 7, 8], n_logits=2, return_hidden=True)  # continues the cache
    with torch.no_grad():
        full = model.model(input_ids=torch.tensor([[4, 5, 6, 7, 8]], device=model.device), output_hidden_states=True)
    assert out.hidden.shape == (2, model.model.config.hidden_size)
    assert out.hidden.device.type == out.logits.device.type == "cpu"  # the protocol's outputs live on the CPU
    torch.testing.assert_close(out.hidden, full.hidden_states[-1][0, -2:].cpu(), atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(out.logits, full.logits[0, -2:].cpu(), atol=1e-5, rtol=1e-5)
    with torch.no_grad():  # and they are what the output layer reads
        head = model.model.get_output_embeddings()(out.hidden.to(model.device))
    torch.testing.assert_close(out.logits, head.cpu(), atol=1e-5, rtol=1e-5)


def test_tabular_model_rollback_and_logits():
    model = TabularLM(3, seed=0)
    model.forward([0, 1, 2])
    model.truncate(1)
    logits = model.forward([2], n_logits=1).logits[0]
    torch.testing.assert_close(logits.double().exp(), model.conditional([0, 2]), rtol=0, atol=1e-6)


def test_tree_attention_logits_equal_plain_forwards_over_each_path():
    for row, expected in tree_case(tiny_model(), tiny_model, [5, 9, 13, 2, 7], cached=3):
        torch.testing.assert_close(row, expected, rtol=0, atol=1e-9)


def test_keeping_one_tree_path_leaves_an_exact_cache():
    model = tiny_model()
    prefix = [3, 4, 5]
    model.forward(prefix)
    # Two branches after the prefix: [10, 11] and [12, 13]; keep the second.
    parents = [2, 3, 2, 5]
    model.forward([10, 11, 12, 13], n_logits=4, parents=parents)
    model.keep([0, 1, 2, 5, 6])
    assert model.cache_length == 5
    logits = model.forward([30], n_logits=1).logits
    torch.testing.assert_close(logits, fresh_logits(tiny_model(), prefix + [12, 13, 30], 1), rtol=0, atol=1e-9)
