"""Cases of the model protocol that every backend's tests run, each returning what the backend computed next to
what it must equal; the test compares them with its backend's tolerance (bit-identical or a stated atol)."""

from __future__ import annotations

from collections.abc import Callable

import torch

from verispec.models.hf import HFCausalLM


def fresh_logits(model: HFCausalLM, tokens: list[int], n: int) -> torch.Tensor:
    """The last `n` rows of logits of `tokens` fed to `model` from an empty cache."""
    model.reset()
    return model.forward(tokens, n_logits=n).logits


def rollback_case(model: HFCausalLM) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Feed a, then b, roll back to a + b[:2] and feed c. Return (c's logits after the rollback, c's logits after
    a + b[:2] fed fresh, c's logits after a + b with no rollback): the first two must agree, and the third must
    differ from them, or the case could not see a rollback that is not undone."""
    a, b, c = [5, 6, 7, 8, 9, 10], [20, 21, 22, 23, 24], [31, 32, 33]
    model.reset()
    model.forward(a)
    model.forward(b, n_logits=5)
    model.truncate(len(a) + 2)
    assert model.cache_length == len(a) + 2
    after_rollback = model.forward(c, n_logits=3).logits
    expected = fresh_logits(model, a + b[:2] + c, 3)
    model.reset()
    model.forward(a + b)
    stale = model.forward(c, n_logits=3).logits
    return after_rollback, expected, stale


# A tree after the prefix: 20 -> 21 -> 22, 20 -> 23, 24 (a second child of the prefix), 24 -> 25. Each node's parent
# is an index into the nodes, -1 the prefix's last token.
TREE_NODES, TREE_PARENTS = [20, 21, 22, 23, 24, 25], [-1, 0, 1, 0, -1, 4]


def tree_case(model: HFCausalLM, fresh_model: Callable[[], HFCausalLM], prefix: list[int], cached: int,
              ) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Feed `prefix[:cached]`, then the rest of the prefix and the tree's nodes in one pass with tree attention.
    Return, per row of that pass (the prefix's last token, then each node), (its logits, the logits of the prefix
    plus the node's path fed plainly to `fresh_model()`), which must agree."""
    nodes, parent_node = TREE_NODES, TREE_PARENTS
    model.reset()
    model.forward(prefix[:cached])
    uncached = prefix[cached:]
    assert uncached, "the pass feeds at least the prefix's last token"
    parents = list(range(cached - 1, len(prefix) - 1))
    last = len(prefix) - 1
    parents += [last if j < 0 else last + 1 + j for j in parent_node]
    tree = model.forward(uncached + nodes, n_logits=len(nodes) + 1, parents=parents).logits
    pairs = []
    for row, node in enumerate([None, *range(len(nodes))]):
        path, j = [], node
        while j is not None and j >= 0:
            path.insert(0, nodes[j])
            j = parent_node[j]
        pairs.append((tree[row], fresh_logits(fresh_model(), prefix + path, 1)[0]))
    return pairs
