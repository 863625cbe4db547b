"""Multi-path verifiers over K i.i.d. draft paths (docs/algorithms.md §2): GBV, and the baselines of §2.9.

The contract (shapes, prefix tree, `MultiPathResult`) is in `verispec.verify.tree`. All verifiers are lossless.
- GBV (§2.2–2.6) selects one path greedily, then runs BV on it against the skewed draft law of the selection;
  its exact law is `gbv_verify_law`.
- The OT-style baselines (§2.9: nss, specinfer, spectr) walk down the prefix tree: at each node a per-node solver
  emits a token whose law is p(·|node) given that the node's children are i.i.d. draws from q(·|node); the walk
  descends while that token is a child, and at a leaf (depth γ) the bonus token is drawn from p. Their exact law
  is `tree_walk_law`; the samplers draw node by node from the same per-node laws.
Traversal verification (§2.9, non-OT) is in `verispec.verify.traversal`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from verispec.sampling import sample
from verispec.verify.block import block_verify_law
from verispec.verify.common import MIN_DRAFT_PROB, BlockLaw, draw, positive_residual
from verispec.verify.tree import MultiPathResult, build_prefix_tree, check_paths_shapes

# ---------------------------------------------------------------------------------------------------------------
# GBV (§2.2–2.6)
# ---------------------------------------------------------------------------------------------------------------


def ratio_key(p_u: torch.Tensor, q_u: torch.Tensor) -> torch.Tensor:
    """Return the primary key p(t|u)/q(t|u) `[V]` of every token at node u (§2.2; larger = better).

    A token with q = 0 is never drafted and carries no q-mass, so where it ranks does not matter.
    """
    return p_u / q_u.clamp_min(MIN_DRAFT_PROB)


def token_order(key: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (order, rank), both `[V]` long: the tokens in the ascending order of (key(t), t) (§2.2 total order)
    and its inverse, rank[t] = the position of t in that order.

    The stable sort keeps equal keys in token-id order, so ties go to the larger token id. One sort gives both:
    selection reads `rank`, the skew reads `order`, so they cannot disagree on ties (the trap of §2.2).
    """
    # This sort is most of GBV's cost. A non-negative float64's bit pattern read as an int64 is ordered like the
    # float, and torch sorts int64 about 2x faster than float64 on the CPU (~7 against ~14 ms at V = 151,936).
    # Same order, ties included; `+ 0.0` turns a -0.0 into +0.0, the only sign bit a ratio p/q can carry.
    bits = (key.to(torch.float64).clamp_min(0.0) + 0.0).contiguous().view(torch.int64)
    order = torch.sort(bits, stable=True).indices  # [V]
    rank = torch.empty_like(order)
    rank[order] = torch.arange(key.shape[0], device=key.device)
    return order, rank


def select_child(children: Sequence[int], key: torch.Tensor, rank: torch.Tensor) -> int:
    """Return the child token with the largest (key, token id): the greedy descent of §2.2.

    It reads `rank`, the same order that `mass_below` uses for q_skew, so selection and skew cannot disagree
    on ties (the trap of §2.2).
    """
    return max(children, key=lambda t: int(rank[t]))


def mass_below(q_u: torch.Tensor, order: torch.Tensor) -> torch.Tensor:
    """Return F_u(t) − q(t|u) `[V]`: the q-mass at node u of the tokens ranked strictly below t (§2.3), with
    `order` the tokens in ascending rank (`token_order`)."""
    inclusive = torch.cumsum(q_u[order], 0)
    exclusive = torch.cat([inclusive.new_zeros(1), inclusive[:-1]])  # [V] mass strictly below, in rank order
    below = torch.empty_like(q_u)
    below[order] = exclusive
    return below


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
    a = ((mass_a + mass_x * (below + q_u)) / scale).clamp(0.0, 1.0)  # [V] (A + y_t + z_t)/(A + x)
    b = ((mass_a + mass_x * below) / scale).clamp(0.0, 1.0)  # [V] (A + y_t)/(A + x)
    powers = sum(a**j * b ** (k - 1 - j) for j in range(k))
    weights = q_u * powers
    total = weights.sum()
    return weights / total if total > 0 else q_u  # the guard is for underflow only (§1.4 spirit)


def gbv_verify_law(draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor) -> tuple[int, BlockLaw]:
    """Return (k, law): the selected path k and the exact law of BV on it with q := q_skew (§2.4).

    draft_tokens: [K, γ] long; q: [K, γ, V]; p: [K, γ+1, V] (the contract of `verispec.verify.tree`).
    `law.q` holds q_skew along the selected path; the kept prefix is draft_tokens[k, :τ].
    """
    check_paths_shapes(draft_tokens, q, p)
    p, q = p.to(torch.float64), q.to(torch.float64)
    k, gamma = draft_tokens.shape  # duplicate paths still count: K is the number of draws (§2.6)
    tree = build_prefix_tree(draft_tokens)
    prefix: tuple[int, ...] = ()
    mass_a, mass_x = 0.0, 1.0  # §2.3: A_root = 0, x_root = 1
    skew_rows = []
    for depth in range(gamma):
        node = tree[prefix]
        q_u, p_u = q[node.path, depth], p[node.path, depth]  # [V], [V]
        key = ratio_key(p_u, q_u)
        order, rank = token_order(key)  # §2.2: one total order, shared by Step A (selection) and Step B (skew)
        below = mass_below(q_u, order)
        skew_rows.append(skewed_draft(q_u, below, mass_a, mass_x, k))
        child = select_child(list(node.children), key, rank)  # Step A: greedy descent over distinct children
        # §2.3: A_child = A_parent + x_parent·CDF(strictly below child); x_child = x_parent·q(child|parent).
        mass_a, mass_x = mass_a + mass_x * float(below[child]), mass_x * float(q_u[child])
        prefix += (child,)
    chosen = tree[prefix].path
    q_skew = torch.stack(skew_rows) if gamma else q[chosen]  # [γ, V]
    return chosen, block_verify_law(draft_tokens[chosen], q_skew, p[chosen])  # Step C: BV with q := q_skew


def gbv_verify(
    draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, generator: torch.Generator | None = None
) -> MultiPathResult:
    """Verify K draft paths with greedy multi-path block verification; return (path, accepted τ, extra token).

    draft_tokens: [K, γ]; q: [K, γ, V]; p: [K, γ+1, V]. The extra token is the BV residual norm((w_τ·p − q_skew)_+)
    at τ < γ, or the bonus from p at the selected leaf (§2.5).
    """
    chosen, law = gbv_verify_law(draft_tokens, q, p)
    result = draw(law, generator)
    return MultiPathResult(path=chosen, accepted=result.accepted, token=result.token)


# ---------------------------------------------------------------------------------------------------------------
# OT-style baselines (§2.9): per-node laws and the walk down the prefix tree
# ---------------------------------------------------------------------------------------------------------------

# A per-node law: (draws, p_u [V], q_u [V]) -> [V], the exact law of the token a per-node solver emits given the
# node's children `draws` (one per path through the node, in path order, duplicates included). Averaged over i.i.d.
# draws from q_u it must be p_u (§2.9). Solvers scan the draws in path order: the draws are i.i.d., so that order
# has the same law as the uniformly random order of the reference code, and the output law is the same.
NodeLaw = Callable[[Sequence[int], torch.Tensor, torch.Tensor], torch.Tensor]


def nss_node_law(draws: Sequence[int], p_u: torch.Tensor, q_u: torch.Tensor) -> torch.Tensor:
    """Return p_u: naive speculative sampling draws straight from the target; the draws only decide descent."""
    return p_u


def rrs_step(p_cur: torch.Tensor, q_cur: torch.Tensor, rejected: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (p, q) after a rejection in recursive rejection sampling (§2.9 specinfer).

    p ← norm((p − q)_+); q stays as it is, because the children are i.i.d. draws with replacement.
    """
    return positive_residual(p_cur, q_cur, fallback=p_cur), q_cur


def specinfer_node_law(draws: Sequence[int], p_u: torch.Tensor, q_u: torch.Tensor) -> torch.Tensor:
    """Return the law `[V]` of SpecInfer's recursive rejection sampling over the children (§2.9)."""
    masses = []  # P(child i is the first accepted), in scan order
    p_cur, q_cur, alive = p_u, q_u, 1.0  # alive: the probability that every child so far was rejected
    for t in draws:
        accept = min(1.0, p_cur[t].item() / max(q_cur[t].item(), MIN_DRAFT_PROB))  # min(1, p_cur(t)/q(t))
        masses.append(alive * accept)
        alive *= 1.0 - accept
        if alive == 0.0:
            break
        p_cur, q_cur = rrs_step(p_cur, q_cur, t)
    law = alive * p_cur if alive > 0.0 else torch.zeros_like(p_u)  # every child rejected: the current residual
    return law.index_add_(0, torch.tensor(draws[: len(masses)], device=law.device), law.new_tensor(masses))


def kseq_rho(p_u: torch.Tensor, q_u: torch.Tensor, k: int, rtol: float = 1e-12) -> float:
    """Return the K-SEQ scale ρ ∈ [1, k] (SpecTr, §2.9 step 1): the smallest root of 1 − (1 − β)^k = ρβ, to rtol.

    β(ρ) = Σ_v min(p(v)/ρ, q(v)). The returned ρ satisfies 1 − (1 − β)^k ≤ ρβ, which keeps the residual of step 3
    non-negative, so the solver is exact whatever the precision of ρ (a larger ρ only costs acceptance); the
    condition holds at ρ = k by Bernoulli's inequality. Between consecutive ratios p/q (the knots), β = s_q + s_p/ρ,
    so the search tests every knot at once, then bisects inside one piece with scalar arithmetic.
    """
    beta_one = torch.minimum(p_u, q_u).sum().item()
    if 1.0 - (1.0 - beta_one) ** k <= beta_one:
        return 1.0  # k = 1 (token verification), p = q (β = 1) or disjoint supports (β = 0)
    ratio, order = torch.sort(p_u / q_u.clamp_min(MIN_DRAFT_PROB))  # [V] ascending
    cum = torch.cumsum(torch.stack([p_u, q_u])[:, order], 1)  # [2, V] p- and q-mass of the j+1 smallest ratios
    total_q = cum[1, -1].item()
    # At ρ = ratio[j], β = Σ_{i≤j} p_i/ρ + Σ_{i>j} q_i (β is continuous in ρ, so ties among the ratios are harmless).
    beta = cum[0] / ratio + (total_q - cum[1])  # [V]
    feasible = 1.0 - (1.0 - beta) ** k <= ratio * beta  # [V]
    first, end = torch.searchsorted(ratio, ratio.new_tensor([1.0, float(k)]), right=True).tolist()  # knots in (1, k]
    hits = torch.nonzero(feasible[first:end])[:1].view(-1).tolist()
    j = first + hits[0] if hits else end  # the first feasible knot; j = end stands for ρ = k
    hi = ratio[j].item() if j < end else float(k)
    lo = ratio[j - 1].item() if j > first else 1.0  # the candidate before it, infeasible
    sp, sq = cum[:, j - 1].tolist() if j else (0.0, 0.0)  # on (lo, hi) the tokens with p/q ≤ ρ are the first j
    sq = total_q - sq
    while hi - lo > rtol * hi:
        mid = 0.5 * (lo + hi)
        b = sq + sp / mid  # β(mid)
        lo, hi = (lo, mid) if 1.0 - (1.0 - b) ** k <= mid * b else (mid, hi)
    return hi


def spectr_node_law(draws: Sequence[int], p_u: torch.Tensor, q_u: torch.Tensor) -> torch.Tensor:
    """Return the law `[V]` of SpecTr's K-SEQ over the children (§2.9 steps 1–3)."""
    k = len(draws)
    rho = kseq_rho(p_u, q_u, k)
    index = torch.tensor(draws, device=p_u.device)
    p_t, q_t = torch.stack([p_u, q_u])[:, index].tolist()
    masses, alive = [], 1.0  # P(child i is the first accepted); P(all rejected so far)
    for pt, qt in zip(p_t, q_t, strict=True):  # step 2: accept t with probability min(1, p(t)/(ρ·q(t)))
        accept = min(1.0, pt / (rho * max(qt, MIN_DRAFT_PROB)))
        masses.append(alive * accept)
        alive *= 1.0 - accept
    law = torch.zeros_like(p_u)
    if alive > 0.0:
        # Step 3: on average the scan emits t with mass min(p/ρ, q)·(1 − (1 − β)^k)/β; the rest of p is the residual.
        capped = torch.minimum(p_u / rho, q_u)  # [V]
        beta = capped.sum().item()
        accepted_mass = capped * ((1.0 - (1.0 - beta) ** k) / beta) if beta > 0 else law
        law = alive * positive_residual(p_u, accepted_mass, fallback=p_u)
    return law.index_add_(0, index, law.new_tensor(masses))


def tree_walk_law(
    node_law: NodeLaw, draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor
) -> dict[MultiPathResult, float]:
    """Return the exact law {outcome: probability} of walking the prefix tree with `node_law` (§2.9).

    draft_tokens: [K, γ]; q: [K, γ, V]; p: [K, γ+1, V]. At each node the emitted token is drawn from the node law;
    the walk descends while it is a child, and at a leaf (depth γ) the bonus comes from p. Descending is lossless
    whatever the solver looked at: the paths through that child continue with fresh i.i.d. draws from q(·|child).
    """
    check_paths_shapes(draft_tokens, q, p)
    p, q = p.to(torch.float64), q.to(torch.float64)
    gamma = draft_tokens.shape[1]
    tree = build_prefix_tree(draft_tokens)
    law: dict[MultiPathResult, float] = {}
    stack = [((), 1.0)]  # (prefix, probability that the walk reaches it)
    while stack:
        prefix, reach = stack.pop()
        node = tree[prefix]
        p_u = p[node.path, node.depth]
        emit = p_u if node.depth == gamma else node_law(node.draws, p_u, q[node.path, node.depth])  # [V]
        for token, prob in enumerate(emit.tolist()):
            if prob <= 0.0:
                continue
            if node.depth < gamma and token in node.draws:
                stack.append((prefix + (token,), reach * prob))
            else:
                outcome = MultiPathResult(path=node.path, accepted=node.depth, token=token)
                law[outcome] = law.get(outcome, 0.0) + reach * prob
    return law


def tree_walk_expected_accepted(
    node_law: NodeLaw, draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor
) -> float:
    """Return E[τ] of the walk of `tree_walk_law`, without enumerating its outcomes over the vocabulary.

    τ ≥ d exactly when the walk reaches a node at depth d, so E[τ] = Σ over the non-root nodes of the probability
    that the walk reaches them: reach(child) = reach(node)·emit(child), emit being the node law.
    """
    check_paths_shapes(draft_tokens, q, p)
    p, q = p.to(torch.float64), q.to(torch.float64)
    gamma = draft_tokens.shape[1]
    reach = {(): 1.0}
    for prefix, node in build_prefix_tree(draft_tokens).items():  # parents come before their children
        if node.depth == gamma or reach[prefix] == 0.0:
            reach.update({prefix + (token,): 0.0 for token in node.children})
            continue
        emit = node_law(node.draws, p[node.path, node.depth], q[node.path, node.depth])  # [V]
        for token in node.children:
            reach[prefix + (token,)] = reach[prefix] * float(emit[token])
    return sum(reach.values()) - 1.0  # the root is always reached and adds nothing to τ


def tree_walk(
    node_law: NodeLaw,
    draft_tokens: torch.Tensor,
    q: torch.Tensor,
    p: torch.Tensor,
    generator: torch.Generator | None = None,
) -> MultiPathResult:
    """Return one outcome of the walk of `tree_walk_law`, drawn node by node (visits ≤ γ+1 nodes)."""
    check_paths_shapes(draft_tokens, q, p)
    p, q = p.to(torch.float64), q.to(torch.float64)
    gamma = draft_tokens.shape[1]
    tree = build_prefix_tree(draft_tokens)
    prefix: tuple[int, ...] = ()
    while True:
        node = tree[prefix]
        p_u = p[node.path, node.depth]  # [V]
        emit = p_u if node.depth == gamma else node_law(node.draws, p_u, q[node.path, node.depth])
        token = sample(emit.clamp_min(0.0), generator)
        if node.depth == gamma or token not in node.draws:  # the bonus, or a correction token: stop here
            return MultiPathResult(path=node.path, accepted=node.depth, token=token)
        prefix += (token,)


# The per-node laws of the §2.9 baselines, by the names the GBV reference code uses.
NODE_LAWS: dict[str, NodeLaw] = {"nss": nss_node_law, "specinfer": specinfer_node_law, "spectr": spectr_node_law}


def nss_verify(
    draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, generator: torch.Generator | None = None
) -> MultiPathResult:
    """Verify K paths with naive speculative sampling (§2.9); return (path, accepted τ, extra token)."""
    return tree_walk(nss_node_law, draft_tokens, q, p, generator)


def specinfer_verify(
    draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, generator: torch.Generator | None = None
) -> MultiPathResult:
    """Verify K paths with SpecInfer's recursive rejection sampling (§2.9); return (path, accepted τ, extra token)."""
    return tree_walk(specinfer_node_law, draft_tokens, q, p, generator)


def spectr_verify(
    draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, generator: torch.Generator | None = None
) -> MultiPathResult:
    """Verify K paths with SpecTr's K-SEQ at every node (§2.9); return (path, accepted τ, extra token)."""
    return tree_walk(spectr_node_law, draft_tokens, q, p, generator)
