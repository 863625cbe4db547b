"""The Hugging Face adapter on tiny random models: cache, exact rollback, hidden states, logits_to_keep."""

from __future__ import annotations

import torch

from tests.device import on_test_device
from verispec.models.hf import HFCausalLM
from verispec.models.tabular import TabularLM
from verispec.models.tiny import tiny_qwen2, tiny_tokenizer


def tiny_model(seed: int = 1) -> HFCausalLM:
    tokenizer = tiny_tokenizer()
    return HFCausalLM(on_test_device(tiny_qwen2(len(tokenizer), seed=seed)), tokenizer)


def fresh_logits(model: HFCausalLM, tokens: list[int], n: int) -> torch.Tensor:
    model.reset()
    return model.forward(tokens, n_logits=n).logits


def test_incremental_forward_matches_a_fresh_forward():
    model = tiny_model()
    seq = [3, 7, 11, 2, 9, 30, 4, 8]
    model.forward(seq[:5])
    incremental = model.forward(seq[5:], n_logits=3).logits
    assert model.cache_length == len(seq)
    torch.testing.assert_close(incremental, fresh_logits(model, seq, 3), rtol=0, atol=1e-6)


def test_rollback_is_exact():
    model = tiny_model()
    a, b, c = [5, 6, 7, 8, 9, 10], [20, 21, 22, 23, 24], [31, 32, 33]
    model.forward(a)
    model.forward(b, n_logits=5)
    model.truncate(len(a) + 2)  # drop b[2:]
    assert model.cache_length == len(a) + 2
    after_rollback = model.forward(c, n_logits=3).logits
    expected = fresh_logits(model, a + b[:2] + c, 3)
    torch.testing.assert_close(after_rollback, expected, rtol=0, atol=1e-6)
    # A rollback that is not undone would leave b's keys in the cache and change these logits.
    model.reset()
    model.forward(a + b)
    stale = model.forward(c, n_logits=3).logits
    assert (stale - expected).abs().max() > 1e-3


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
    model = tiny_model()
    prefix = [5, 9, 13, 2, 7]
    # Tree after the prefix: 20 -> 21 -> 22, 20 -> 23, 24 (a second root child), 24 -> 25.
    nodes = [20, 21, 22, 23, 24, 25]
    parent_node = [-1, 0, 1, 0, -1, 4]  # index into nodes; -1 = the last prefix token
    model.forward(prefix[:3])
    uncached = prefix[3:]
    base = model.cache_length
    parents = list(range(base - 1, base + len(uncached) - 1))
    last_prefix_position = base + len(uncached) - 1
    parents += [last_prefix_position if j < 0 else last_prefix_position + 1 + j for j in parent_node]
    tree_logits = model.forward(uncached + nodes, n_logits=len(nodes) + 1, parents=parents).logits
    for row, node in enumerate([None, *range(len(nodes))]):
        path, j = [], node
        while j is not None and j >= 0:
            path.insert(0, nodes[j])
            j = parent_node[j]
        expected = fresh_logits(tiny_model(), prefix + path, 1)[0]
        torch.testing.assert_close(tree_logits[row], expected, rtol=0, atol=1e-9)


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
