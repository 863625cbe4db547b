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
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

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


# The verifiers' view of the prefix tree: prefix (a token tuple) -> node, the root is (), parents before their children
# (`PrefixTree.by_prefix`).
NodesByPrefix = dict[tuple[int, ...], TreeNode]


@dataclass
class PrefixTree:
    """K paths merged by common prefix (§2.1): identical prefixes share a node, duplicate paths share all of theirs.

    Built once per round, a depth at a time as the draft draws (`grow`), and read by all three users: the draft feeds
    each depth's new nodes in one forward, the target's pass feeds every node under the tree mask `parents` gives,
    and the multi-path verifiers walk it by prefix (`by_prefix`). Nodes are numbered breadth first, within a depth in
    the order of the first path through each: the order both caches hold them in.
    """

    tokens: list[int] = field(default_factory=list)  # [N] token of each node
    parents: list[int] = field(default_factory=list)  # [N] parent node index, -1 for children of the root
    node_of: list[list[int]] = field(default_factory=list)  # [K][γ'] node index of path k's i-th token
    # (parent node, token) -> node: where a path's next token already has a node
    _children: dict[tuple[int, int], int] = field(default_factory=dict, repr=False, compare=False)
    _by_prefix: NodesByPrefix | None = field(default=None, repr=False, compare=False)

    @classmethod
    def of(cls, paths: Sequence[Sequence[int]]) -> PrefixTree:
        """Return the tree of `paths` (equal lengths), grown a depth at a time."""
        tree = cls(node_of=[[] for _ in paths])
        for depth in range(len(paths[0]) if paths else 0):
            tree.grow([int(path[depth]) for path in paths])
        return tree

    def grow(self, next_tokens: Sequence[int]) -> list[int]:
        """Extend every path k by `next_tokens[k]`; return the nodes this added, in order (one per distinct new
        prefix: what the draft feeds at this depth)."""
        assert len(next_tokens) == len(self.node_of), f"{len(next_tokens)} tokens for {len(self.node_of)} paths"
        self._by_prefix = None
        added = []
        for nodes, token in zip(self.node_of, next_tokens, strict=True):
            key = (nodes[-1] if nodes else -1, token)
            if key not in self._children:
                self._children[key] = len(self.tokens)
                self.tokens.append(token)
                self.parents.append(key[0])
                added.append(self._children[key])
            nodes.append(self._children[key])
        return added

    @property
    def is_chain(self) -> bool:
        """Return whether the tree is one path (K = 1): its nodes then follow the committed tokens in order, so a
        pass needs no tree attention, the nodes are the path's rows, and rolling back is moving a length. The one
        place the K = 1 fast paths of `verispec.engine` are chosen."""
        return len(self.node_of) == 1

    def paths(self) -> list[list[int]]:
        """Return the K paths' tokens `[K][γ']`."""
        return [[self.tokens[node] for node in nodes] for nodes in self.node_of]

    def by_prefix(self) -> NodesByPrefix:
        """Return the verifiers' view: each distinct prefix (the root () included) -> its depth, the lowest path
        through it and the next token of every path through it, depth by depth (computed once)."""
        if self._by_prefix is None:
            paths = [tuple(path) for path in self.paths()]
            gamma = len(paths[0]) if paths else 0
            nodes: NodesByPrefix = {}
            for depth in range(gamma + 1):
                through: dict[tuple[int, ...], list[int]] = {}  # prefix -> indices of the paths through it, in order
                for k, path in enumerate(paths):
                    through.setdefault(path[:depth], []).append(k)
                for prefix, ks in through.items():
                    draws = tuple(paths[k][depth] for k in ks) if depth < gamma else ()
                    nodes[prefix] = TreeNode(depth=depth, path=ks[0], draws=draws)
            self._by_prefix = nodes
        return self._by_prefix


def build_prefix_tree(draft_tokens: torch.Tensor, tree: PrefixTree | None = None) -> NodesByPrefix:
    """Return the prefix tree of the K paths `[K, γ]` by prefix: identical prefixes merge into one node (§2.1).
    `tree`: the round's tree of these paths, when the caller has it (the engine's: built once as the draft drew)."""
    assert draft_tokens.dim() == 2, f"draft_tokens must be [K, gamma], got {tuple(draft_tokens.shape)}"
    if tree is None:
        tree = PrefixTree.of(draft_tokens.tolist())
    return tree.by_prefix()


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
