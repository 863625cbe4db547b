"""Greedy multi-path block verification (GBV, docs/algorithms.md §2.2–2.6): select one of K i.i.d. draft paths by a
fixed greedy order, then run BV on it against the skewed draft law q_skew that the selection induces.

The contract (shapes, prefix tree, `MultiPathResult`) is in `verispec.verify.tree`; the exact law is
`gbv_verify_law`. Lossless for any per-node total order shared by the selection (Step A) and q_skew (Step B); the
order used here, and why, is `NodeOrder`.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch

from verispec.verify.block import block_verify_law
from verispec.verify.common import MIN_DRAFT_PROB, BlockLaw, draw
from verispec.verify.kernels import law_kernel
from verispec.verify.tree import MultiPathResult, PathLaws, PrefixTree, build_prefix_tree, check_paths_shapes

# A token is ranked by its ratio key when its draft probability at the node is at least
# min(RANKED_MIN_Q, RANKED_MIN_SHARE · max_t q(t|u)); every other token ranks below all ranked ones, in token-id order
# (docs/algorithms.md §2.2). Why: sorting the whole vocabulary at every node on the path was most of GBV's cost (a
# 151,936-entry sort per node), while a token below 1e-6 is drafted about once in a million draws; the order stays one
# fixed total order per node, a function of q(·|u) and p(·|u) only, so GBV stays exactly lossless. On the default
# pair's blocks (benchmarks/gbv_order.py) this kept E[τ] within 0.1% of the full order's at a fifth of the time;
# on four of those prompts a 1e-4 threshold lost 0.4%. The share keeps the ranked set from being empty when q is flat.
RANKED_MIN_Q = 1e-6
RANKED_MIN_SHARE = 1e-2


def ratio_key(p_u: torch.Tensor, q_u: torch.Tensor) -> torch.Tensor:
    """Return the primary key p(t|u)/q(t|u) `[V]` of every token at node u (§2.2; larger = better).

    A token with q = 0 is never drafted and carries no q-mass, so where it ranks does not matter.
    """
    return p_u / q_u.clamp_min(MIN_DRAFT_PROB)


def key_bits(key: torch.Tensor) -> torch.Tensor:
    """Return `key` (≥ 0) as int64 bit patterns, ordered like the float64 keys, ties included.

    A non-negative float64's bit pattern read as an int64 is ordered like the float, and torch sorts int64 about 2x
    faster than float64 on the CPU. `+ 0.0` turns a -0.0 into +0.0, the only sign bit a ratio p/q can carry.
    """
    return (key.to(torch.float64).clamp_min(0.0) + 0.0).contiguous().view(torch.int64)


@dataclass(frozen=True)
class NodeOrder:
    """One node's total order of §2.2 and the q-mass each token has below it (Steps A and B read only this).

    The order, ascending: first the unranked tokens (q(t|u) < `threshold`, see `node_order`), by token id; then the
    ranked tokens by (p/q, token id). `below[t]` = F_u(t) − q(t|u), the q-mass ranked strictly below t.
    """

    p_u: torch.Tensor  # [V] float64
    q_u: torch.Tensor  # [V] float64
    threshold: float  # the least q(t|u) that ranks t by its ratio key
    below: torch.Tensor | None  # [V] float64; None where the kernel kept it (it returns the children's only)

    @property
    def is_ranked(self) -> torch.Tensor:
        """Return `[V]` bool: which tokens the order ranks by their ratio key."""
        return self.q_u >= self.threshold

    def sort_key(self, token: int) -> tuple[int, int, int]:
        """Return a tuple that compares like `token`'s place in the order (larger = ranked higher)."""
        return self.sort_keys([token])[0]

    def sort_keys(self, tokens: Sequence[int]) -> list[tuple[int, int, int]]:
        """Return `sort_key` of each of `tokens`, computed together (one gather, not tensor steps per token)."""
        index = torch.tensor(tokens, dtype=torch.long, device=self.q_u.device)
        q_t = self.q_u.index_select(0, index)
        bits = key_bits(ratio_key(self.p_u.index_select(0, index), q_t)).tolist()
        ranked = (q_t >= self.threshold).tolist()
        return [(1, b, t) if r else (0, 0, t) for t, b, r in zip(tokens, bits, ranked, strict=True)]


def ranked_threshold(q: torch.Tensor, min_q: float = RANKED_MIN_Q,
                     min_share: float = RANKED_MIN_SHARE) -> torch.Tensor:
    """Return the least draft probability that ranks a token by its ratio key, min(min_q, min_share · max q), for
    each row of q `[..., V]`, as `[..., 1]`."""
    return (min_share * q.max(-1, keepdim=True).values).clamp_max(min_q)


def node_order(p_u: torch.Tensor, q_u: torch.Tensor, min_q: float = RANKED_MIN_Q,
               min_share: float = RANKED_MIN_SHARE) -> NodeOrder:
    """Return the order of §2.2 at node u and the q-mass below each token under it (p_u, q_u: [V] float64).

    Tokens with q(t|u) ≥ min(min_q, min_share · max q(·|u)) are ranked by their ratio key; min_q = 0 ranks every
    token, the plain ratio order of the reference code.
    """
    threshold = float(ranked_threshold(q_u, min_q, min_share))
    is_ranked = q_u >= threshold  # [V]
    below = torch.where(is_ranked, 0.0, q_u)  # [V] the unranked tokens' q, in token-id order
    # exclusive prefix sum in token-id order: the unranked mass below each unranked token
    inclusive = torch.cumsum(below, 0)
    unranked_mass = float(inclusive[-1])
    below[1:] = inclusive[:-1]
    below[0] = 0.0
    ranked = torch.nonzero(is_ranked).view(-1)  # [M] ascending ids
    bits = key_bits(ratio_key(p_u[ranked], q_u[ranked]))  # [M]
    ascending = ranked[torch.sort(bits, stable=True).indices]  # ranked ids in order; ties by id, as `ranked` ascends
    q_sorted = q_u[ascending]
    below[ascending] = torch.cumsum(q_sorted, 0) - q_sorted + unranked_mass
    return NodeOrder(p_u=p_u, q_u=q_u, threshold=threshold, below=below)


def select_child(children: Sequence[int], order: NodeOrder) -> int:
    """Return the child token ranked highest in the node's order: the greedy descent of §2.2.

    It compares by the same order that `below` (and so q_skew) is built from, so selection and skew cannot disagree
    on ties (the trap of §2.2).
    """
    keys = order.sort_keys(children)
    return max(zip(keys, children, strict=True))[1]


def skewed_draft(q_u: torch.Tensor, below: torch.Tensor, mass_a: float, mass_x: float, k: int) -> torch.Tensor:
    """Return q_skew(·|u) `[V]`, the law of the next token of the best of K paths given it passes through u (§2.3).

    q_u: [V] float64; below: [V] q-mass ranked strictly below each token; mass_a = A, the q-mass of the length-γ
    paths ranked below every path through u; mass_x = x = Q(u), the draft probability of u's prefix.
    """
    if k == 1:
        return q_u  # §2.6: with one path q_skew = q, and GBV is exactly BV
    # §2.3 "Stable evaluation": a^K − b^K = (a − b)·Σ_j a^j b^(K−1−j), a − b = x·q(t); divide a and b by (A + x) so
    # that every term lies in [0, 1] (float64); the normalisation over t removes the common scale.
    scale = max(mass_a + mass_x, MIN_DRAFT_PROB)  # > 0: the selected prefix was drafted
    b = torch.mul(below, mass_x / scale).add_(mass_a / scale)  # [V] (A + y_t)/(A + x)
    a = torch.add(b, q_u, alpha=mass_x / scale).clamp_(0.0, 1.0)  # [V] (A + y_t + z_t)/(A + x)
    b.clamp_(0.0, 1.0)
    # Σ_{j<K} a^j b^(K−1−j) by S_1 = 1, S_{m+1} = a·S_m + b^m
    powers = a + b
    b_power = b
    for _ in range(2, k):
        b_power = b_power * b
        powers = torch.addcmul(b_power, powers, a)
    weights = powers.mul_(q_u)
    total = float(weights.sum())
    return weights.div_(total) if total > 0 else q_u  # the guard is for underflow only (§1.4 spirit)


def node_step(p_u: torch.Tensor, q_u: torch.Tensor, children: Sequence[int], mass_a: float, mass_x: float, k: int,
              min_q: float, min_share: float, skew_out: torch.Tensor, use_kernel: bool = True) -> tuple[int, float]:
    """Write q_skew(·|u) (§2.3) to `skew_out` [V] and return (the child selected at node u, the q-mass below it).

    By the registered kernel where it runs (`use_kernel` and `verispec.verify.kernels`), else by `node_order`,
    `skewed_draft` and `select_child`, the reference. Both select by one `NodeOrder`, so selection and skew share
    one total order (§2.2).
    """
    kernel = law_kernel(p_u, q_u) if use_kernel else None
    if kernel is None:
        order = node_order(p_u, q_u, min_q, min_share)
        skew_out.copy_(skewed_draft(q_u, order.below, mass_a, mass_x, k))
        child = select_child(children, order)
        return child, float(order.below[child])
    below, _, keys = kernel.skewed_draft_row(p_u, q_u, min_q, min_share, mass_a, mass_x, k, skew_out,
                                             torch.tensor(children, dtype=torch.long))
    # (key, id) compares like `NodeOrder.sort_key`: the unranked children (key -1) by id below the ranked ones
    _, child, index = max(zip(keys.tolist(), children, range(len(children)), strict=True))
    return child, float(below[index])


def gbv_verify_law(draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor | PathLaws,
                   min_q: float = RANKED_MIN_Q, min_share: float = RANKED_MIN_SHARE,
                   use_kernel: bool = True, tree: PrefixTree | None = None) -> tuple[int, BlockLaw]:
    """Return (k, law): the selected path k and the exact law of BV on it with q := q_skew (§2.4).

    draft_tokens: [K, γ] long; q: [K, γ, V]; p: [K, γ+1, V] (the contract of `verispec.verify.tree`), dense or as
    `PathLaws`: only the γ+1 rows of the selected path are read.
    `law.q` holds q_skew along the selected path; the kept prefix is draft_tokens[k, :τ]. min_q, min_share: which
    tokens the order ranks by ratio (`node_order`; min_q = 0: all of them). use_kernel=False: the torch reference
    only, for every vocabulary-wide step (the kernel computes the same law; tests compare the two). `tree`: these
    paths' `PrefixTree` where the caller has it (the round's, built once), else built here.
    """
    check_paths_shapes(draft_tokens, q, p)
    laws = p if isinstance(p, PathLaws) else PathLaws.of(p)
    q = q.to(torch.float64)
    k, gamma = draft_tokens.shape  # duplicate paths still count: K is the number of draws (§2.6)
    nodes = build_prefix_tree(draft_tokens, tree)
    prefix: tuple[int, ...] = ()
    mass_a, mass_x = 0.0, 1.0  # §2.3: A_root = 0, x_root = 1
    q_skew = torch.empty(gamma, q.shape[-1], dtype=torch.float64, device=q.device)  # [γ, V]
    for depth in range(gamma):
        node = nodes[prefix]
        q_u, p_u = q[node.path, depth], laws.row(node.path, depth)  # [V], [V]
        # Step B (the skew) and Step A (greedy descent over the distinct children) by one order (§2.2)
        child, below = node_step(p_u, q_u, list(node.children), mass_a, mass_x, k, min_q, min_share, q_skew[depth],
                                 use_kernel)
        # §2.3: A_child = A_parent + x_parent·CDF(strictly below child); x_child = x_parent·q(child|parent).
        mass_a, mass_x = mass_a + mass_x * below, mass_x * float(q_u[child])
        prefix += (child,)
    chosen = nodes[prefix].path
    law = block_verify_law(draft_tokens[chosen], q_skew, laws.path(chosen), use_kernel)  # Step C: BV, q := q_skew
    return chosen, law


def gbv_verify(
    draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor | PathLaws, generator: torch.Generator | None = None,
    tree: PrefixTree | None = None,
) -> MultiPathResult:
    """Verify K draft paths with greedy multi-path block verification; return (path, accepted τ, extra token).

    draft_tokens: [K, γ]; q: [K, γ, V]; p: [K, γ+1, V]. The extra token is the BV residual norm((w_τ·p − q_skew)_+)
    at τ < γ, or the bonus from p at the selected leaf (§2.5). `tree`: as `gbv_verify_law`'s.
    """
    chosen, law = gbv_verify_law(draft_tokens, q, p, tree=tree)
    result = draw(law, generator)
    return MultiPathResult(path=chosen, accepted=result.accepted, token=result.token)
