"""The multi-path contract (docs/algorithms.md §2.1): K i.i.d. draft paths, merged into a prefix tree.

Every multi-path verifier takes
- draft_tokens: [K, γ] long, K paths drawn i.i.d. from the draft, each autoregressively;
- q: [K, γ, V], q[k, i] = q(·|first i tokens of path k);
- p: [K, γ+1, V], p[k, i] = p(·|first i tokens of path k).
Rows of paths that share a prefix are identical, so a tree node reads its rows from any one path through it.
A verifier that reads only a few of those rows (GBV reads the γ+1 of the path it selects) may also take p as
`PathLaws`, which computes each tree node's row on first read.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass

import torch

from verispec.sampling import sample


@dataclass(frozen=True)
class MultiPathResult:
    """The outcome of verifying K draft paths: a kept prefix of one path, then one extra token."""

    path: int  # index k of a path whose first `accepted` tokens were kept
    accepted: int  # τ: number of draft tokens kept (0..γ)
    token: int  # the correction token (τ < γ, or a token off every path) or the bonus token (τ = γ)
    leaks: list[float] | None = None  # a lossy rule's leak ε per drafted position (verify/relaxed.py), else None


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


class PathLaws:
    """p `[K, γ+1, V]` of the contract, read by row: `row(k, i)` = p[k, i], `path(k)` = p[k].

    Built on a dense tensor (`PathLaws.of`) it hands out views of it. Built on the tree's nodes, each node's row is
    computed on first read by `rows(node ids, out) -> [n, V]` and kept: processing the logits of a 3-path tree's 9-11
    nodes into float64 laws, and laying them out per path, was most of GBV's verification step, which reads 5.
    The first node read at each depth is computed into that depth's row of one `[γ+1, V]` buffer (`out`, where
    `rows` writes when given one), so a path read root to leaf, as GBV reads its selected one, is that buffer: no
    copy of its rows.
    """

    def __init__(self, rows: Callable[[list[int], torch.Tensor | None], torch.Tensor] | None, node_of: torch.Tensor,
                 vocab_size: int, dense: torch.Tensor | None = None) -> None:
        assert (rows is None) != (dense is None), "PathLaws reads either node rows or a dense tensor"
        self._rows = rows  # (node ids, out [n, V] or None) -> their laws [n, V] (float64; `out` when given)
        self.node_of = node_of  # [K, γ+1] long: the node whose row is p[k, i]
        self.vocab_size = vocab_size
        self._dense = dense
        self._computed: dict[int, torch.Tensor] = {}
        self._paths: list[list[int]] = node_of.tolist()  # node_of as lists: read per row, cheaper than the tensor
        self._depth = {node: i for path in self._paths for i, node in enumerate(path)}
        self._slots: torch.Tensor | None = None  # [γ+1, V]: row i holds the first node read at depth i
        self._slot_node: list[int | None] = [None] * node_of.shape[1]

    @classmethod
    def of(cls, p: torch.Tensor) -> PathLaws:
        """Wrap a dense p `[K, γ+1, V]` (widened to float64 once)."""
        p = p.to(torch.float64)
        k, rows, vocab_size = p.shape
        return cls(None, torch.arange(k * rows).view(k, rows), vocab_size, p)

    @property
    def shape(self) -> torch.Size:
        """`(K, γ+1, V)`, as the dense tensor's."""
        return torch.Size((*self.node_of.shape, self.vocab_size))

    def dim(self) -> int:
        """3, as the dense tensor's."""
        return 3

    def _nodes(self, nodes: list[int]) -> list[torch.Tensor]:
        missing = [node for node in dict.fromkeys(nodes) if node not in self._computed]
        if len(missing) == 1 and self._slot_node[self._depth[missing[0]]] is None:
            depth = self._depth[missing[0]]
            if self._slots is None:
                self._slots = torch.empty(len(self._slot_node), self.vocab_size, dtype=torch.float64)
            self._computed[missing[0]] = self._rows(missing, self._slots[depth : depth + 1])[0]
            self._slot_node[depth] = missing[0]
        elif missing:  # one call for all the missing rows: a batch of rows is cheaper than rows one by one
            for node, row in zip(missing, self._rows(missing, None), strict=True):
                self._computed[node] = row
        return [self._computed[node] for node in nodes]

    def row(self, k: int, i: int) -> torch.Tensor:
        """Return p[k, i] `[V]` (float64)."""
        if self._dense is not None:
            return self._dense[k, i]
        return self._nodes([self._paths[k][i]])[0]

    def path(self, k: int) -> torch.Tensor:
        """Return p[k] `[γ+1, V]` (float64)."""
        if self._dense is not None:
            return self._dense[k]
        nodes = self._paths[k]
        rows = self._nodes(nodes)
        if self._slot_node == nodes:  # read root to leaf, each row in its depth's slot
            return self._slots
        return torch.stack(rows)

    def tensor(self) -> torch.Tensor:
        """Return the whole p `[K, γ+1, V]` (every node computed)."""
        if self._dense is not None:
            return self._dense
        return torch.stack([self.path(k) for k in range(self.node_of.shape[0])])


def check_paths_shapes(draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor | PathLaws) -> None:
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
