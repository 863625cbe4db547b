"""Block verification (BV, Sun et al. 2024; docs/algorithms.md §1), lossless and optimal among single-path verifiers."""

from __future__ import annotations

import torch

from verispec.verify.common import BlockLaw, VerifyResult, check_block_shapes, drafted_probs, draw
from verispec.verify.kernels import law_kernel


def block_verify_law(draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor,
                     use_kernel: bool = True) -> BlockLaw:
    """Return the exact law of block verification of one block.

    draft_tokens: [γ] long; q: [γ, V] draft conditionals q(·|x^i); p: [γ+1, V] target conditionals p(·|x^i).
    `q` may be any draft law the block was actually drawn from (GBV passes its skewed draft, §2.4).
    use_kernel=False: ρ by torch only (a registered kernel, `verispec.verify.kernels`, computes the same sums in one
    pass per row).
    """
    check_block_shapes(draft_tokens, q, p)
    p, q = p.to(torch.float64), q.to(torch.float64)
    gamma = draft_tokens.shape[0]
    p_x, q_x = drafted_probs(draft_tokens, q, p)  # [γ], [γ]
    # The γ-long recurrences below run on Python floats (the same float64 operations): per-element tensor steps cost
    # more than the arithmetic here.
    # §1.2: cascaded, clipped likelihood ratio w_i = min(1, w_{i-1}·p(x_i|x^{i-1}) / q(x_i|x^{i-1})), w_0 = 1.
    w = [1.0]
    for p_i, q_i in zip(p_x.tolist(), q_x.tolist(), strict=True):
        w.append(min(w[-1] * p_i / q_i, 1.0))
    weights = torch.tensor(w, dtype=torch.float64, device=p.device)  # [γ+1]
    # §1.2: ρ_i = Σ_v (w_i·p(v|x^i) − q(v|x^i))_+ is the target mass left over at node x^i (i = 1..γ-1).
    kernel = law_kernel(p, q) if use_kernel and gamma > 1 else None
    if kernel is not None:
        rho = kernel.positive_mass(weights[1:gamma], p[1:gamma], q[1:gamma])  # [γ-1]
    else:
        rho = (weights[1:gamma, None] * p[1:gamma] - q[1:gamma]).clamp_min(0.0).sum(-1)  # [γ-1]
    # h_i = ρ_i / (ρ_i + 1 − w_i), with 0/0 → 0 (§1.4: ρ_i = 0 makes τ = i a null event); 1 − w_i ≥ 0 since w_i ≤ 1.
    # h_0 = 1 makes τ = 0 the default when no test passes; h_γ = w_γ (§1.2).
    tiny = torch.finfo(torch.float64).tiny
    h = [1.0] + [r / max(r + (1.0 - w_i), tiny) if r > 0 else 0.0
                 for r, w_i in zip(rho.tolist(), w[1:gamma], strict=True)]
    if gamma:
        h.append(w[gamma])
    h = torch.tensor(h, dtype=torch.float64, device=p.device).clamp_(0.0, 1.0)
    return BlockLaw(stop=stop_from_hazards(h), weights=weights, q=q, p=p)


def stop_from_hazards(h: torch.Tensor) -> torch.Tensor:
    """Return P(τ = i) = h_i·Π_{j>i}(1 − h_j) `[γ+1]`, τ being the LAST i with η_i ≤ h_i (§1.2, backward selection).

    h: [γ+1] float64 with h_0 = 1, so the probabilities sum to 1.
    """
    # later[i] = Π_{j>i}(1 − h_j): the probability that every test after position i fails.
    survive = torch.flip(torch.cumprod(torch.flip(1.0 - h[1:], [0]), 0), [0])  # [γ], survive[i-1] = Π_{j≥i}
    later = torch.cat([survive, h.new_ones(1)])  # [γ+1]
    return h * later


def block_verify(
    draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, generator: torch.Generator | None = None
) -> VerifyResult:
    """Verify one draft block with block verification; return (accepted τ, extra token).

    draft_tokens: [γ] long; q: [γ, V]; p: [γ+1, V]. The extra token is drawn from norm((w_τ·p − q)_+) at
    τ < γ (§1.3) and from p(·|x^γ) at τ = γ (the bonus, §1.4).
    """
    return draw(block_verify_law(draft_tokens, q, p), generator)
