"""Standard token verification (TV, speculative sampling; docs/algorithms.md §0), lossless."""

from __future__ import annotations

import torch

from verispec.verify.common import BlockLaw, VerifyResult, check_block_shapes, drafted_probs, draw, sequential_stop


def token_verify_law(draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor) -> BlockLaw:
    """Return the exact law of token verification of one block.

    draft_tokens: [γ] long; q: [γ, V] draft conditionals; p: [γ+1, V] target conditionals (processed).
    """
    check_block_shapes(draft_tokens, q, p)
    p, q = p.to(torch.float64), q.to(torch.float64)
    p_x, q_x = drafted_probs(draft_tokens, q, p)
    accept = torch.clamp(p_x / q_x, max=1.0)  # [γ] a_i = min(1, p(x_i)/q(x_i)), §0 step 1
    stop = sequential_stop(accept)  # P(first i tokens accepted) = a_1···a_i, then a rejection
    # Residual at a rejection: norm((p − q)_+) (§0 step 2); bonus from p when all are accepted (§0 step 3).
    return BlockLaw(stop=stop, weights=torch.ones_like(stop), q=q, p=p)


def token_verify(
    draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, generator: torch.Generator | None = None
) -> VerifyResult:
    """Verify one draft block with standard speculative sampling; return (accepted τ, extra token).

    draft_tokens: [γ] long; q: [γ, V]; p: [γ+1, V]. With γ = 0 this is plain sampling from p[0]
    (the autoregressive step), which is how the engine runs `ar`.
    """
    return draw(token_verify_law(draft_tokens, q, p), generator)
