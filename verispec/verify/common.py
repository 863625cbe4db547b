"""Shared pieces of the single-path verifiers: the result, the exact law of a round, and the draw from it."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from verispec.sampling import sample

# The draft probability of a drafted token cannot be 0 in exact arithmetic; clamp it so that a rounding
# error cannot divide by zero (docs/algorithms.md §1.4, "q(x_i) = 0 for a drafted token").
MIN_DRAFT_PROB = 1e-300


@dataclass(frozen=True)
class VerifyResult:
    """The outcome of verifying one draft block."""

    accepted: int  # τ: number of draft tokens kept (0..γ)
    token: int  # the correction token (τ < γ) or the bonus token (τ = γ)


@dataclass(frozen=True)
class BlockLaw:
    """The exact law of one single-path verification: τ ~ stop, then y ~ residual(τ).

    The residual at i < γ is norm((w[i]·p[i] − q[i])_+) (TV: w ≡ 1, §0; BV: the cascaded weights, §1.3);
    at i = γ it is the bonus distribution p[γ].
    """

    stop: torch.Tensor  # [γ+1] float64, P(τ = i); sums to 1
    weights: torch.Tensor  # [γ+1] float64, the scale w_i of p in the residual at i
    q: torch.Tensor  # [γ, V] draft conditionals along the block
    p: torch.Tensor  # [γ+1, V] target conditionals along the block

    @property
    def gamma(self) -> int:
        """Return the block length γ."""
        return self.q.shape[0]

    def residual(self, i: int) -> torch.Tensor:
        """Return the distribution `[V]` of the extra token given τ = i."""
        if i == self.gamma:
            return self.p[i]
        return positive_residual(self.weights[i] * self.p[i], self.q[i], fallback=self.p[i])

    def expected_accepted(self) -> float:
        """Return E[τ] = Σ_i i·P(τ = i): the expected number of draft tokens kept (block efficiency − 1)."""
        return float((torch.arange(self.gamma + 1, dtype=torch.float64, device=self.stop.device) * self.stop).sum())

    def joint(self) -> torch.Tensor:
        """Return P(τ = i, y = v) as a `[γ+1, V]` tensor (for exact tests; costs γ+1 residuals)."""
        return torch.stack([self.stop[i] * self.residual(i) for i in range(self.gamma + 1)])


def positive_residual(scaled_p: torch.Tensor, q: torch.Tensor, fallback: torch.Tensor) -> torch.Tensor:
    """Return norm((scaled_p − q)_+), or `fallback` when that mass is 0 in floating point (§1.4 guard)."""
    mass = (scaled_p - q).clamp_min(0.0)
    total = mass.sum()
    if total <= 0:
        return fallback
    return mass / total


def check_block_shapes(draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor) -> None:
    """Assert the single-path contract: draft_tokens [γ], q [γ, V], p [γ+1, V]."""
    assert draft_tokens.dim() == 1, f"draft_tokens must be [gamma], got {tuple(draft_tokens.shape)}"
    gamma = draft_tokens.shape[0]
    assert q.dim() == 2 and q.shape[0] == gamma, f"q must be [gamma={gamma}, V], got {tuple(q.shape)}"
    assert p.dim() == 2 and p.shape[0] == gamma + 1, f"p must be [gamma+1={gamma + 1}, V], got {tuple(p.shape)}"
    assert p.shape[1] == q.shape[1], f"p and q have different vocabularies: {p.shape[1]} vs {q.shape[1]}"


def drafted_probs(draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Return (p(x_i|x^{i-1}), q(x_i|x^{i-1})) for i = 1..γ, float64, q clamped away from 0."""
    index = draft_tokens.view(-1, 1)
    # Gathered, then widened (exact): widening first would copy the whole [γ, V] block when it is float32.
    p_x = p[:-1].gather(1, index).view(-1).to(torch.float64)
    q_x = q.gather(1, index).view(-1).to(torch.float64).clamp_min(MIN_DRAFT_PROB)
    return p_x, q_x


def sequential_stop(accept: torch.Tensor) -> torch.Tensor:
    """Return P(τ = i) `[γ+1]` when position i is accepted with probability accept[i-1] `[γ]`, independently, and
    the first rejection ends the block: τ = i means accepted up to i and rejected at i+1 (or i = γ)."""
    survive = torch.cat([torch.ones(1, dtype=accept.dtype, device=accept.device), torch.cumprod(accept, 0)])  # [γ+1]
    stop = survive.clone()
    stop[:-1] = survive[:-1] * (1.0 - accept)
    return stop


def draw(law: BlockLaw, generator: torch.Generator | None = None) -> VerifyResult:
    """Return one verification outcome drawn from `law`: τ from its marginal, then the extra token."""
    stop = law.stop.clamp_min(0.0)
    tau = sample(stop, generator) if law.gamma else 0
    token = sample(law.residual(tau), generator)
    return VerifyResult(accepted=tau, token=token)
