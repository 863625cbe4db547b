"""The tree-walk multi-path verifiers over K i.i.d. draft paths (docs/algorithms.md §2.9): NSS, SpecInfer, SpecTr.

The contract (shapes, prefix tree, `MultiPathResult`) is in `verispec.verify.tree`. All verifiers are lossless.
GBV is in `verispec.verify.gbv`.
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
from verispec.verify.common import MIN_DRAFT_PROB, positive_residual
from verispec.verify.tree import MultiPathResult, PrefixTree, build_prefix_tree, check_paths_shapes

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
    tree: PrefixTree | None = None,
) -> MultiPathResult:
    """Return one outcome of the walk of `tree_walk_law`, drawn node by node (visits ≤ γ+1 nodes). `tree`: the
    paths' `PrefixTree` where the caller has it (the round's, built once), else built here."""
    check_paths_shapes(draft_tokens, q, p)
    p, q = p.to(torch.float64), q.to(torch.float64)
    gamma = draft_tokens.shape[1]
    tree = build_prefix_tree(draft_tokens, tree)
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
    draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, generator: torch.Generator | None = None,
    tree: PrefixTree | None = None,
) -> MultiPathResult:
    """Verify K paths with naive speculative sampling (§2.9); return (path, accepted τ, extra token)."""
    return tree_walk(nss_node_law, draft_tokens, q, p, generator, tree)


def specinfer_verify(
    draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, generator: torch.Generator | None = None,
    tree: PrefixTree | None = None,
) -> MultiPathResult:
    """Verify K paths with SpecInfer's recursive rejection sampling (§2.9); return (path, accepted τ, extra token)."""
    return tree_walk(specinfer_node_law, draft_tokens, q, p, generator, tree)


def spectr_verify(
    draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, generator: torch.Generator | None = None,
    tree: PrefixTree | None = None,
) -> MultiPathResult:
    """Verify K paths with SpecTr's K-SEQ at every node (§2.9); return (path, accepted τ, extra token)."""
    return tree_walk(spectr_node_law, draft_tokens, q, p, generator, tree)
