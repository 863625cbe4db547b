"""Verification of fixed candidate trees (prompt lookup with K > 1): sample-and-match (docs/algorithms.md §6.1).

Distinct deterministic candidates are not i.i.d. draws from any q, so GBV, SpecInfer and SpecTr (which assume
i.i.d. paths) do not apply to them. The rule that holds for any candidate tree: at the root draw x ~ p(·|root); if
a child of the current node carries x, move there and draw again; otherwise emit x and stop; at a leaf the bonus
token is drawn from p. Every emitted token is a draw from p given the tokens emitted before it, whatever the tree,
so the output law is exactly the target's. That walk is naive speculative sampling's (§2.9 `nss`): its per-node law
is p itself and never reads q, which is why it stays exact when the candidates are not i.i.d.

Inputs follow the multi-path contract (`verispec.verify.tree`): draft_tokens [K, γ], q [K, γ, V] (a point mass on
each candidate token; unused by the rule), p [K, γ+1, V].
"""

from __future__ import annotations

import torch

from verispec.verify.multipath import nss_node_law, tree_walk, tree_walk_expected_accepted, tree_walk_law
from verispec.verify.tree import MultiPathResult, PrefixTree


def candidate_tree_law(draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor) -> dict[MultiPathResult, float]:
    """Return the exact law {(path, τ, token): probability} of sample-and-match on the candidate tree."""
    return tree_walk_law(nss_node_law, draft_tokens, q, p)


def candidate_tree_expected_accepted(draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor) -> float:
    """Return E[τ]: the sum over non-root candidate nodes of the product of p along the path to them."""
    return tree_walk_expected_accepted(nss_node_law, draft_tokens, q, p)


def candidate_tree_verify(
    draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, generator: torch.Generator | None = None,
    tree: PrefixTree | None = None,
) -> MultiPathResult:
    """Verify fixed candidates by sample-and-match; return (path, accepted τ, extra token). Visits ≤ γ+1 nodes.
    `tree`: the candidates' `PrefixTree` where the caller has it (the round's, built once), else built here."""
    return tree_walk(nss_node_law, draft_tokens, q, p, generator, tree)
