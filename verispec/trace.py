"""What a decode returns besides tokens: per-round counts, model-call counts and a wall-time split."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field


@dataclass
class RoundTrace:
    """One round of the decode loop."""

    drafted: int  # draft tokens proposed (0 for ar / draft)
    accepted: int  # of those, kept by the verifier (τ)
    emitted: int  # tokens committed this round after EOS / max_new_tokens cuts (≤ accepted + 1)
    fed: int = 0  # tokens the decoding model's pass processed this round (uncached committed tokens + the block)
    time_draft: float = 0.0  # seconds drafting this round
    time_decode: float = 0.0  # seconds in this round's pass of the decoding model (target, or draft for `draft`)
    time_verify: float = 0.0  # seconds verifying this round
    paths: int = 1  # K draft paths (multi-path methods)
    tree_nodes: int = 0  # distinct draft tokens in the tree the decoding pass verified (= drafted when K = 1)
    drafter: str = "model"  # which drafter proposed the block: model | ngram ("none": nothing was drafted)
    model_gamma: int | None = None  # the draft model's length chosen for this round by the adaptive rule (None: off)
    verifier_scores: list[float] = field(default_factory=list)  # SPRINTER: learned-verifier score of each token
    verifier_accepts: list[bool] = field(default_factory=list)  # SPRINTER: its decision on each token
    acceptable: list[bool] = field(default_factory=list)  # SPRINTER: q(x) ≤ p(x) for each token (from the target)
    tv_pq: list[float] = field(default_factory=list)  # SPRINTER, relaxed rules: TV(p, q) at each drafted position
    # SPRINTER: ε = Σ_v a(v)·(q(v) − p(v))_+ at each drafted position, the exact TV between that position's output
    # law and p given the verifier's decisions a(v) (§3.3); None where the token is verified whatever a says (the
    # last position a round can reach, and every position of a lossless method). Relaxed rules (verify/relaxed.py):
    # ε at each position the rule examined, None past the first rejection (fly: an unbiased estimate)
    leak: list[float | None] = field(default_factory=list)


@dataclass
class Trace:
    """Statistics of one decode, returned as data for reports (never printed by the engine)."""

    rounds: list[RoundTrace] = field(default_factory=list)
    target_calls: int = 0  # forward passes of the target model
    target_tokens: int = 0  # tokens those passes processed (prompt prefill included)
    draft_calls: int = 0
    draft_tokens: int = 0
    time_draft: float = 0.0  # seconds in draft forwards and draft sampling
    time_target: float = 0.0  # seconds in target forwards
    time_verify: float = 0.0  # seconds turning target logits into probabilities and verifying
    time_total: float = 0.0  # the whole decode, wall clock, less `time_diagnostics`
    # SPRINTER's online bookkeeping (acceptability, TV and leak of every drafted position): not part of the method,
    # so kept out of time_total and reported here
    time_diagnostics: float = 0.0
    prefill_tokens: int = 0  # prompt length
    # GBV's and BV's vocabulary-wide law steps (verispec.verify.kernels): run by the C++ kernel, and by the torch
    # reference where the kernel is not built or declines the tensors (not float64 on the CPU)
    law_steps_kernel: int = 0
    law_steps_torch: int = 0

    @property
    def time_other(self) -> float:
        """Return the wall time not spent in draft, target or verification (bookkeeping, rollback)."""
        return self.time_total - self.time_draft - self.time_target - self.time_verify

    @property
    def generated(self) -> int:
        """Return the number of tokens generated."""
        return sum(r.emitted for r in self.rounds)

    @property
    def acceptance_rate(self) -> float | None:
        """Return accepted / drafted tokens over the decode (None when nothing was drafted)."""
        drafted = sum(r.drafted for r in self.rounds)
        return sum(r.accepted for r in self.rounds) / drafted if drafted else None

    @property
    def tokens_per_target_call(self) -> float | None:
        """Return generated tokens per target forward (block efficiency; None without target calls)."""
        return self.generated / self.target_calls if self.target_calls else None

    @property
    def mean_accepted(self) -> float | None:
        """Return the mean accepted length τ per round (None without rounds)."""
        return sum(r.accepted for r in self.rounds) / len(self.rounds) if self.rounds else None

    def rounds_by_drafter(self) -> dict[str, int]:
        """Return how many rounds each drafter proposed ("none": rounds that drafted nothing)."""
        counts: dict[str, int] = {}
        for r in self.rounds:
            counts[r.drafter] = counts.get(r.drafter, 0) + 1
        return counts

    def verifier_rates(self) -> dict[str, float | int | None]:
        """Return the learned verifier's online operating point over all drafted tokens (SPRINTER methods).

        eta_fp = P(verifier accepts | token unacceptable), eta_tp = P(verifier accepts | token acceptable),
        acceptable meaning q(x) ≤ p(x) under the target pass of the same round.
        """
        pairs = [(a, ok) for r in self.rounds for a, ok in zip(r.verifier_accepts, r.acceptable, strict=True)]
        bad = [a for a, ok in pairs if not ok]
        good = [a for a, ok in pairs if ok]
        return {
            "tokens": len(pairs),
            "acceptable": len(good),
            "eta_fp": sum(bad) / len(bad) if bad else None,
            "eta_tp": sum(good) / len(good) if good else None,
            "mean_run_length": sum(r.drafted for r in self.rounds) / len(self.rounds) if self.rounds else None,
        }

    def to_dict(self) -> dict:
        """Return the whole trace, with its derived metrics, as a JSON-able dict."""
        data = asdict(self)
        data.update(
            time_other=self.time_other,
            generated=self.generated,
            acceptance_rate=self.acceptance_rate,
            tokens_per_target_call=self.tokens_per_target_call,
            mean_accepted=self.mean_accepted,
            rounds_by_drafter=self.rounds_by_drafter(),
            seconds_per_token=self.time_total / self.generated if self.generated else None,
        )
        if any(r.verifier_accepts for r in self.rounds):
            data["verifier_rates"] = self.verifier_rates()
        return data
