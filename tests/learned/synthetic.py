"""Synthetic verifier data for the learned-verifier tests: labels that a linear probe can separate."""

from __future__ import annotations

import torch

from verispec.learned.collect import VerifierData


def separable_data(rows: int = 600, hidden: int = 8, prompts: int = 20, margin: float = 3.0, seed: int = 0,
                   draft: str = "synthetic-draft") -> VerifierData:
    """Return rows whose hidden states are two Gaussians `margin` apart along one direction; label = the class.

    q(x), p(x) are chosen so that the stored labels agree with q(x) <= p(x) (λ = 1)."""
    gen = torch.Generator().manual_seed(seed)
    label = (torch.rand(rows, generator=gen) < 0.6).long()
    direction = torch.randn(hidden, generator=torch.Generator().manual_seed(hidden))  # the same for every seed
    direction = direction / direction.norm()
    centre = (label.float() - 0.5).unsqueeze(1) * margin * direction  # [N, H]
    hidden_states = centre + torch.randn(rows, hidden, generator=gen) + 2.0  # offset: standardisation must cope
    q_x = 0.2 + 0.6 * torch.rand(rows, generator=gen, dtype=torch.float64)
    p_x = torch.where(label.bool(), q_x * 1.3, q_x * 0.5).clamp(max=1.0)
    step = torch.arange(rows) % (rows // prompts)
    return VerifierData(
        hidden=hidden_states.float(),
        token=torch.randint(0, 50, (rows,), generator=gen),
        q_x=q_x,
        p_x=p_x,
        q_entropy=torch.rand(rows, generator=gen, dtype=torch.float64),
        tv=0.3 * torch.rand(rows, generator=gen, dtype=torch.float64),
        position=1 + step % 5,
        label=label,
        committed=torch.randint(0, 50, (rows,), generator=gen),
        temperature=torch.ones(rows),
        prompt_id=torch.arange(rows) // (rows // prompts),
        step=step,
        manifest={"draft_model": draft, "target_model": "synthetic-target", "hidden_size": hidden, "lam": 1.0},
    )
