"""Per-round diagnostics that are not part of any method: observers the decode loop calls after each round.

An observer reads what a round produced (the draft block, the target's rows p, the verifier's result) and writes
measurements into that round's `RoundTrace`. The engine times the calls into `Trace.time_diagnostics`, which is
kept out of `Trace.time_total`: measuring never counts as decoding.
"""

from __future__ import annotations

from typing import Protocol

import torch

from verispec.drafting import DraftBlock, StopRule
from verispec.theory import leak
from verispec.trace import RoundTrace
from verispec.verify.tree import MultiPathResult


class RoundObserver(Protocol):
    """Called by `Engine.decode` once per round, after the round's tokens are committed."""

    def on_round(self, block: DraftBlock, p: torch.Tensor, result: MultiPathResult, round_trace: RoundTrace,
                 reachable: int) -> None:
        """Record measurements of one round into `round_trace`.

        block: the drafted paths and q `[K, γ', V]`; p: the target's rows `[K, γ'+1, V]`; result: the verifier's
        outcome; reachable: the most tokens the round could draft (the cap, or the room left before
        max_new_tokens).
        """
        ...


class SprinterDiagnostics:
    """SPRINTER's online measurements: the learned verifier's scores and decisions, whether each drafted token was
    acceptable, TV(p, q) and the leak ε at each drafted position (docs/algorithms.md §3.3, §3.8)."""

    def __init__(self, stop_rule: StopRule, lossless: bool) -> None:
        self.stop_rule = stop_rule
        self.lossless = lossless  # a lossless method verifies every position whatever the rule says: no leak

    def on_round(self, block: DraftBlock, p: torch.Tensor, result: MultiPathResult, round_trace: RoundTrace,
                 reachable: int) -> None:
        """Fill `verifier_scores`, `verifier_accepts`, `acceptable`, `tv_pq` and `leak` of `round_trace`."""
        # The target pass covers every drafted token, so whether each one was acceptable (q(x) ≤ p(x), λ = 1) is
        # known for free: η_FP and η_TP are measured online at the deployed threshold (§3.8).
        index = block.as_tensor()[0].view(-1, 1)
        p_x, q_x = p[0, :-1].gather(1, index).view(-1), block.q[0].gather(1, index).view(-1)
        round_trace.verifier_scores = block.scores
        round_trace.verifier_accepts = block.accepted_by_rule
        round_trace.acceptable = (q_x <= p_x).tolist()
        round_trace.tv_pq, round_trace.leak = position_leaks(self.stop_rule, block, p[0, :-1], reachable,
                                                             self.lossless)


def position_leaks(
    stop_rule: StopRule, block: DraftBlock, p_rows: torch.Tensor, reachable: int, lossless: bool
) -> tuple[list[float], list[float | None]]:
    """Return (TV(p, q), ε) at each drafted position of a SPRINTER round (`RoundTrace.tv_pq`, `.leak`).

    ε = Σ_v a(v)·(q(v) − p(v))_+ with a(v) the verifier's decision had v been drawn (§3.3, `theory.leak`); the
    position at `reachable` (the cap, or the room left before max_new_tokens) is verified whatever a says, and so is
    every position of a lossless method: None there.
    """
    q_rows = block.q[0]  # [γ', V]
    tv = path_tv(p_rows, q_rows)
    if lossless:
        return tv, [None] * len(tv)
    leaks: list[float | None] = []
    for i, hidden in enumerate(block.hiddens):
        if i + 1 >= reachable:
            leaks.append(None)
            continue
        leaks.append(leak(p_rows[i], q_rows[i], stop_rule.accept_mask(hidden, q_rows[i], i + 1)))
    return tv, leaks


def record_relaxed(round_trace: RoundTrace, block: DraftBlock, p: torch.Tensor, accepted: int,
                   leaks: list[float | None]) -> None:
    """Record a relaxed rule's round (verify/relaxed.py): ε at each position the rule examined (1..τ+1), the TV
    between that position's output law and p (§3.3), None at drafted positions past the first rejection; and
    TV(p, q) at every drafted position. `p` is `[K, γ'+1, V]`; `leaks` as `relaxed_verify` returns them."""
    examined = min(accepted + 1, block.length)
    round_trace.tv_pq = path_tv(p[0, :-1], block.q[0])
    round_trace.leak = leaks[:examined] + [None] * (block.length - examined)


def path_tv(p_rows: torch.Tensor, q_rows: torch.Tensor) -> list[float]:
    """Return TV(p, q) of each row pair of `[γ', V]` p and q rows."""
    return (0.5 * (p_rows - q_rows).abs().sum(-1)).tolist()
