"""SPRINTER's target-side step (docs/algorithms.md §3.1): approximate verification, **not lossless**.

A SPRINTER round drafts T tokens, stopping when the learned verifier rejects a token or at the cap. The target
then checks only the last one: the first T−1 tokens are committed unchecked (the verifier already accepted them),
x_T gets the standard SD test min(1, p(x_T)/q(x_T)), and the round ends with the bonus token from p[T] on a pass
or with the residual norm((p − q)_+) at position T−1 on a fail. As a `BlockLaw` this is τ ∈ {T−1, T} with
TV's residuals (weights 1), so the draw is the shared `draw` and no token-verification code is repeated.

The drafting loop and the verifier's decisions belong to the engine; this module only sees the finished run.
"""

from __future__ import annotations

import torch

from verispec.verify.common import BlockLaw, VerifyResult, check_block_shapes, drafted_probs, draw


def sprinter_verify_law(draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor) -> BlockLaw:
    """Return the exact law of SPRINTER's verification of one drafted run (§3.1).

    draft_tokens: [T] long, the whole run (the last token is the one the verifier rejected, or the cap-th);
    q: [T, V] draft conditionals; p: [T+1, V] target conditionals (processed). P(τ = T) = min(1, p(x_T)/q(x_T)),
    P(τ = T−1) = the rest, P(τ < T−1) = 0. With T = 0 this is plain sampling from p[0], as for `token_verify`.
    """
    check_block_shapes(draft_tokens, q, p)
    p, q = p.to(torch.float64), q.to(torch.float64)
    length = draft_tokens.shape[0]
    stop = torch.zeros(length + 1, dtype=torch.float64)  # [T+1]
    if length == 0:
        stop[0] = 1.0
    else:
        p_x, q_x = drafted_probs(draft_tokens, q, p)
        accept_last = torch.clamp(p_x[-1] / q_x[-1], max=1.0)  # the SD test on x_T only (§3.1)
        stop[length] = accept_last  # commit all T, then the bonus from p[T]
        stop[length - 1] = 1.0 - accept_last  # commit T−1 unchecked, then the residual at T−1
    return BlockLaw(stop=stop, weights=torch.ones_like(stop), q=q, p=p)


def sprinter_verify(
    draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, generator: torch.Generator | None = None
) -> VerifyResult:
    """Verify one SPRINTER run; return (accepted τ ∈ {T−1, T}, the residual or bonus token).

    draft_tokens: [T]; q: [T, V]; p: [T+1, V]. Lossy: the first T−1 tokens are never checked against p.
    """
    return draw(sprinter_verify_law(draft_tokens, q, p), generator)
