"""Traversal verification (Weng et al., arXiv 2505.12398) over K draft paths, as in docs/algorithms.md §2.9.

The procedure is deterministic except for one coin per visited leaf: take the first leaf in DFS order and accept
it with probability equal to its weight; on rejection delete it and update its parent (§2.9 steps 1–4). So its
exact law is one chain of "reject, reject, …, accept" steps (`leaf_visits`): `traversal_verify_law` sums the whole
chain, the sampler `traversal_verify` walks it with one coin per leaf.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import torch

from verispec.sampling import sample
from verispec.verify.common import MIN_DRAFT_PROB, positive_residual
from verispec.verify.tree import MultiPathResult, PrefixTree, build_prefix_tree, check_paths_shapes


@dataclass
class _Node:
    """The mutable state of one tree node during traversal."""

    path: int  # representative path index
    p: torch.Tensor  # [V] current target law (the residual after deletions)
    q: torch.Tensor  # [V] current draft law (deleted children zeroed, renormalised); unused at depth γ
    weight: float = 1.0
    children: list[int] = field(default_factory=list)  # distinct child tokens in DFS (path) order


def _reweigh(nodes: dict[tuple[int, ...], _Node], prefix: tuple[int, ...]) -> None:
    """Recompute the weights below `prefix`: w(child) = min(1, w(parent)·p(t)/q(t)) (§2.9 step 1)."""
    node = nodes[prefix]
    for t in node.children:
        child = prefix + (t,)
        ratio = node.p[t].item() / max(node.q[t].item(), MIN_DRAFT_PROB)
        nodes[child].weight = min(1.0, node.weight * ratio)
        _reweigh(nodes, child)


def leaf_visits(
    draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, tree: PrefixTree | None = None
) -> Iterator[tuple[tuple[int, ...], _Node, float]]:
    """Yield (leaf prefix, its node, acceptance probability) for the leaves traversal visits, in order (§2.9 steps
    2-4); resuming the iterator means the leaf was rejected, and deletes it and updates its parent first. The chain
    ends with an acceptance probability of 1. Shared by the exact law (every step) and the sampler (one coin a leaf).
    """
    check_paths_shapes(draft_tokens, q, p)
    p, q = p.to(torch.float64), q.to(torch.float64)
    gamma = draft_tokens.shape[1]
    by_prefix = build_prefix_tree(draft_tokens, tree)  # `tree`: the round's, where the caller has it
    nodes = {
        prefix: _Node(
            path=node.path,
            p=p[node.path, node.depth].clone(),
            q=q[node.path, node.depth].clone() if node.depth < gamma else p.new_zeros(0),
            children=list(node.children),
        )
        for prefix, node in by_prefix.items()
    }
    _reweigh(nodes, ())
    while True:
        leaf: tuple[int, ...] = ()
        while nodes[leaf].children:  # step 2: the first leaf in DFS order
            leaf += (nodes[leaf].children[0],)
        node = nodes[leaf]
        accept = 1.0 if not leaf else node.weight  # step 4: an isolated root is always accepted
        yield leaf, node, accept
        if accept >= 1.0:
            return
        parent = nodes[leaf[:-1]]
        parent.p, parent.q, parent.weight = after_rejection(parent.p, parent.q, parent.weight, leaf[-1])
        parent.children.remove(leaf[-1])
        del nodes[leaf]
        _reweigh(nodes, leaf[:-1])


def traversal_verify_law(draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor) -> dict[MultiPathResult, float]:
    """Return the exact law {outcome: probability} of traversal verification of K paths (§2.9 `traversal`).

    draft_tokens: [K, γ]; q: [K, γ, V]; p: [K, γ+1, V] (the contract of `verispec.verify.tree`).
    """
    law: dict[MultiPathResult, float] = {}
    for leaf, node, stop in leaf_stops(draft_tokens, q, p):
        for token, prob in enumerate((stop * node.p).tolist()):
            if prob > 0.0:
                outcome = MultiPathResult(path=node.path, accepted=len(leaf), token=token)
                law[outcome] = law.get(outcome, 0.0) + prob
    return law


def traversal_expected_accepted(draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor) -> float:
    """Return E[τ] of traversal verification of K paths: Σ over the visited leaves of P(stop there)·depth."""
    return sum(stop * len(leaf) for leaf, _, stop in leaf_stops(draft_tokens, q, p))


def leaf_stops(
    draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor
) -> Iterator[tuple[tuple[int, ...], _Node, float]]:
    """Yield (leaf prefix, its node, probability that traversal accepts this leaf) along `leaf_visits`' chain;
    the extra token then comes from the node's current p."""
    alive = 1.0  # the probability that every leaf visited so far was rejected
    for leaf, node, accept in leaf_visits(draft_tokens, q, p):
        yield leaf, node, alive * accept
        alive *= 1.0 - accept
        if alive <= 0.0:
            return


def after_rejection(
    p_u: torch.Tensor, q_u: torch.Tensor, weight: float, token: int
) -> tuple[torch.Tensor, torch.Tensor, float]:
    """Return the parent's (p, q, weight) after its child `token` was rejected and deleted (§2.9 step 3).

    Like a BV stop at the parent (§1.2–1.3): p ← norm((w·p − q)_+), w ← ρ/(ρ + 1 − w) with ρ = Σ(w·p − q)_+ (0 when
    ρ = 0, §1.4); and q loses the deleted token, renormalised, for the remaining children.
    """
    rho = (weight * p_u - q_u).clamp_min(0.0).sum().item()
    p_next = positive_residual(weight * p_u, q_u, fallback=p_u)
    weight_next = rho / (rho + (1.0 - weight)) if rho > 0.0 else 0.0  # parenthesised: 1 − w may be tiny
    q_next = q_u.clone()
    q_next[token] = 0.0
    total = q_next.sum()
    return p_next, (q_next / total if total > 0 else q_next), weight_next


def traversal_verify(
    draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, generator: torch.Generator | None = None,
    tree: PrefixTree | None = None,
) -> MultiPathResult:
    """Verify K paths with traversal verification (§2.9); return (path, accepted τ, extra token).

    It walks the chain of `leaf_visits` that `traversal_verify_law` sums, with one coin per leaf and one draw from
    the accepted leaf's p: the same law, without enumerating the vocabulary at every leaf. `tree`: these paths'
    `PrefixTree` where the caller has it (the round's, built once), else built here.
    """
    for leaf, node, accept in leaf_visits(draft_tokens, q, p, tree):
        if accept >= 1.0 or float(torch.rand((), generator=generator, dtype=torch.float64)) < accept:
            return MultiPathResult(path=node.path, accepted=len(leaf), token=sample(node.p, generator))
    raise AssertionError("the traversal chain ends with an acceptance")  # leaf_visits ends at accept = 1
