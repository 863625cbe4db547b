"""Pure verification algorithms of speculative decoding.

Glossary (docs/algorithms.md §0; p = target, q = draft, always):
- **draft block**: the γ tokens x_1..x_γ proposed by the draft in one round, with the draft conditionals
  q[i] = q(·|x^i) for i = 0..γ-1, and the target conditionals p[i] = p(·|x^i) for i = 0..γ from one target pass.
- **accepted tokens** (τ): the prefix x_1..x_τ of the block that is kept, 0 ≤ τ ≤ γ.
- **correction token**: when τ < γ, the extra token drawn from a residual distribution at x^τ
  (vLLM calls it "recovered"); **bonus token**: when τ = γ, the extra token drawn from p(·|x^γ).
  `VerifyResult.token` is whichever of the two the round produced, so every round emits τ + 1 tokens.
- **round**: one draft block + one target pass + one verification.
- **block efficiency**: tokens committed per target forward pass, E[τ] + 1 for single-path methods.
- **multi-path round** (§2.1): K i.i.d. draft paths `[K, γ]`, merged into a prefix tree; `MultiPathResult` names a
  path whose first τ tokens are kept, then the correction or bonus token, so it too emits τ + 1 tokens. Its law is
  (selected path, BlockLaw) for GBV, {MultiPathResult: probability} for the tree walks and traversal.

Every verifier here is a pure function of tensors (draft tokens, q, p, a torch.Generator): no models, no caches.
(GBV also takes p as `PathLaws`: the same tensor, each tree node's row computed from the logits when first read.)
Each one first computes its exact output law (`BlockLaw`: P(τ = i) and the residual at each i), then draws one
outcome from it; the law is what the exact-enumeration tests check, and the draw is shared by all verifiers.
Each law also gives E[τ] given the drafted block(s) exactly (`BlockLaw.expected_accepted`,
`tree_walk_expected_accepted`, `traversal_expected_accepted`; `Method.expected_accepted` per method), which
`verispec fixed-blocks` averages over shared drafted paths to compare verifiers without decoding noise.
The lossy rules (`approximate.py`: SPRINTER; `relaxed.py`: typical, margin, fuzzy, fly) follow the same pattern; a
relaxed rule's law is SD's with a gate that also keeps tokens, and it returns each position's leak TV(output, p).
Fixed candidates (prompt lookup, K > 1) are not i.i.d. draws: `candidate_tree_verify` walks them by sample-and-match.
Traversal is the exception: its sampler walks the same chain of leaf visits that its law sums (one coin a leaf),
since enumerating the vocabulary at every visited leaf costs far more than the draw; a Monte-Carlo test ties the two.
"""

from verispec.verify.approximate import sprinter_verify, sprinter_verify_law
from verispec.verify.block import block_verify, block_verify_law
from verispec.verify.common import BlockLaw, VerifyResult, draw
from verispec.verify.deterministic import candidate_tree_expected_accepted, candidate_tree_law, candidate_tree_verify
from verispec.verify.gbv import gbv_verify, gbv_verify_law
from verispec.verify.multipath import (
    NODE_LAWS,
    nss_verify,
    specinfer_verify,
    spectr_verify,
    tree_walk_expected_accepted,
    tree_walk_law,
)
from verispec.verify.relaxed import RelaxedKnobs, relaxed_law, relaxed_position_law, relaxed_verify
from verispec.verify.token import token_verify, token_verify_law
from verispec.verify.traversal import traversal_expected_accepted, traversal_verify, traversal_verify_law
from verispec.verify.tree import MultiPathResult, PathLaws, build_prefix_tree, draw_outcome

__all__ = [
    "NODE_LAWS",
    "BlockLaw",
    "MultiPathResult",
    "PathLaws",
    "VerifyResult",
    "block_verify",
    "block_verify_law",
    "RelaxedKnobs",
    "build_prefix_tree",
    "candidate_tree_expected_accepted",
    "candidate_tree_law",
    "candidate_tree_verify",
    "draw",
    "draw_outcome",
    "gbv_verify",
    "gbv_verify_law",
    "nss_verify",
    "specinfer_verify",
    "spectr_verify",
    "relaxed_law",
    "relaxed_position_law",
    "relaxed_verify",
    "sprinter_verify",
    "sprinter_verify_law",
    "token_verify",
    "token_verify_law",
    "traversal_expected_accepted",
    "traversal_verify",
    "traversal_verify_law",
    "tree_walk_expected_accepted",
    "tree_walk_law",
]
