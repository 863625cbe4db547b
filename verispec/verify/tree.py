"""The multi-path contract (docs/algorithms.md §2.1): K i.i.d. draft paths, merged into a prefix tree.

Every multi-path verifier takes
- draft_tokens: [K, γ] long, K paths drawn i.i.d. from the draft, each autoregressively;
- q: [K, γ, V], q[k, i] = q(·|first i tokens of path k);
- p: [K, γ+1, V], p[k, i] = p(·|first i tokens of path k).
Rows of paths that share a prefix are identical, so a tree node reads its rows from any one path through it.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass

import torch

from verispec.sampling import sample


@dataclass(frozen=True)
class MultiPathResult:
    """The outcome of verifying K draft paths: a kept prefix of one path, then one extra token."""

    path: int  # index k of a path whose first `accepted` tokens were kept
    accepted: int  # τ: number of draft tokens kept (0..γ)
    token: int  # the correction token (τ < γ, or a token off every path) or the bonus token (τ = γ)


@dataclass(frozen=True)
class TreeNode:
    """A node of the prefix tree: a distinct prefix of the K paths."""

    depth: int  # length of the prefix
    path: int  # representative: the lowest index k of a path through this node (its rows hold p, q here)
    draws: tuple[int, ...]  # the next token of every path through this node, in path order; () at depth γ

    @property
    def children(self) -> Counter:
        """Return token -> number of paths that continue with it (duplicates kept: they are separate draws)."""
        return Counter(self.draws)


# The verifiers' view of the prefix tree: prefix (a token tuple) -> node, the root is (). The model's view, the nodes
# in the order a tree-attention pass feeds them, is `verispec.drafting.PrefixTree`.
NodesByPrefix = dict[tuple[int, ...], TreeNode]


def build_prefix_tree(draft_tokens: torch.Tensor) -> NodesByPrefix:
    """Return the prefix tree of the K paths `[K, γ]`: identical prefixes merge into one node (§2.1)."""
    assert draft_tokens.dim() == 2, f"draft_tokens must be [K, gamma], got {tuple(draft_tokens.shape)}"
    paths = [tuple(row) for row in draft_tokens.tolist()]
    gamma = draft_tokens.shape[1]
    tree: NodesByPrefix = {}
    for depth in range(gamma + 1):
        through: dict[tuple[int, ...], list[int]] = {}  # prefix -> indices of the paths through it, in order
        for k, path in enumerate(paths):
            through.setdefault(path[:depth], []).append(k)
        for prefix, ks in through.items():
            draws = tuple(paths[k][depth] for k in ks) if depth < gamma else ()
            tree[prefix] = TreeNode(depth=depth, path=ks[0], draws=draws)
    return tree


def check_paths_shapes(draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor) -> None:
    """Assert the multi-path contract: draft_tokens [K, γ], q [K, γ, V], p [K, γ+1, V], K ≥ 1."""
    assert draft_tokens.dim() == 2 and draft_tokens.shape[0] >= 1, (
        f"draft_tokens must be [K >= 1, gamma], got {tuple(draft_tokens.shape)}"
    )
    k, gamma = draft_tokens.shape
    assert q.dim() == 3 and q.shape[:2] == (k, gamma), f"q must be [K={k}, gamma={gamma}, V], got {tuple(q.shape)}"
    assert p.dim() == 3 and p.shape[:2] == (k, gamma + 1), (
        f"p must be [K={k}, gamma+1={gamma + 1}, V], got {tuple(p.shape)}"
    )
    assert p.shape[2] == q.shape[2], f"p and q have different vocabularies: {p.shape[2]} vs {q.shape[2]}"


def draw_outcome(law: dict[MultiPathResult, float], generator: torch.Generator | None = None) -> MultiPathResult:
    """Return one outcome drawn from an exact multi-path law {outcome: probability} (e.g. `tree_walk_law`)."""
    outcomes = list(law)
    probs = torch.tensor([law[o] for o in outcomes], dtype=torch.float64).clamp_min(0.0)
    return outcomes[sample(probs, generator)]
