"""Lossy relaxed-acceptance rules (docs/algorithms.md §6.2): speculative sampling with a gate that accepts more.

Each rule is standard token verification (§0) plus a **gate**. At drafted position i the token x_i is kept when
the gate fires for it, and otherwise by the usual SD test min(1, p(x_i)/q(x_i)); the first rejection ends the block
with the usual correction token y ~ norm((p − q)_+) at that position (a token from the target's side of the
residual, never x_i itself), and a fully kept block ends with the bonus token from p. So at one position with
context c, a gate that keeps v with probability a(v) (independent of the SD uniform) emits exactly §3.3's law
(`theory.position_law`, the same formula as SPRINTER's token-aware verifier):

    P_out = p + a·(q − p)_+ − ε·(p − q)_+ / Z,   Z = TV(p, q),   ε = Σ_v a(v)·(q(v) − p(v))_+ = TV(P_out, p).

A gate that never fires leaves SD's law, its draws and so its tokens unchanged: every rule has a lossless end.

Gates read the target's **unprocessed** distribution p̃ = softmax(logits) (temperature 1, no top-k / top-p; the
logit processors, logit_bias and penalties, applied), the model's own uncertainty, so that a knob means the same at
every temperature (at temperature 0 the processed p is a point mass and a gate on it could never relax anything).
The SD test, the residual and the bonus use the processed p and q as always. At temperature 1 without top-k /
top-p, p̃ = p. Fuzzy compares the processed p and q.

| rule      | gate at a position (p̃: unprocessed target; H: entropy in nats)          | lossless end        |
|-----------|--------------------------------------------------------------------------|---------------------|
| `typical` | keep v when p̃(v) > min(ε, δ·exp(−H(p̃)))  (Medusa's typical acceptance)  | ε = 1, δ = ∞        |
| `margin`  | keep v when log p̃(v) > max_u log p̃(u) − Δ  (a log-probability margin)  | Δ = 0               |
| `fuzzy`   | keep every v when JS(p, q) < θ  (FSD's divergence gate, Jensen-Shannon)  | θ = 0               |
| `fly`     | keep a natively rejected x_i when H_k(p̃) > θ and the next W tokens pass | θ ≥ ln k            |

The first three gates depend only on the position (a(v) ∈ {0, 1} known for every v), so their per-position leak ε
is exact. FLy's gate depends on the tokens drafted after x_i: see `fly_verify_law` and `fly_leaks`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch

from verispec.errors import ConfigError
from verispec.theory import leak, position_law
from verispec.verify.common import BlockLaw, VerifyResult, check_block_shapes, drafted_probs, draw, sequential_stop

RULES = ("typical", "margin", "fuzzy", "fly")


@dataclass(frozen=True)
class RelaxedKnobs:
    """The knobs of the lossy rules, validated; the defaults are deployed settings, not the lossless ends."""

    typical_epsilon: float = 0.09  # typical: the hard threshold ε (Medusa's posterior_threshold)
    typical_delta: float = 0.3  # typical: the entropy-scaled threshold δ (Medusa's posterior_alpha); inf = off
    margin_delta: float = 0.5  # margin: Δ in nats; 0 = never relax
    fuzzy_threshold: float = 0.1  # fuzzy: θ, keep while JS(p, q) < θ nats; 0 = never relax; ln 2 bounds JS
    fly_entropy: float = 0.3  # fly: θ on the entropy (nats) of p̃'s renormalised top-k; ≥ ln k = never relax
    fly_window: int = 3  # fly: W, the following draft tokens that must pass the SD test to keep a rejected one
    fly_top_k: int = 3  # fly: k, the largest target probabilities whose entropy is the gate

    def __post_init__(self) -> None:
        ranges = {"typical_epsilon": (0.0, 1.0), "typical_delta": (0.0, math.inf), "margin_delta": (0.0, math.inf),
                  "fuzzy_threshold": (0.0, math.log(2.0)), "fly_entropy": (0.0, math.inf)}
        for name, (low, high) in ranges.items():
            value = getattr(self, name)
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not (low <= value <= high):
                raise ConfigError(f"{name} must be a number in [{low:g}, {high:g}], got {value!r}", field=name)
        for name, low in (("fly_window", 1), ("fly_top_k", 2)):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < low:
                raise ConfigError(f"{name} must be an integer >= {low}, got {value!r}", field=name)


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Return the entropy in nats of each row of `probs` `[..., V]` -> `[...]` (0·log 0 = 0)."""
    return -torch.special.xlogy(probs, probs).sum(-1)


def typical_mask(p_gate: torch.Tensor, epsilon: float, delta: float) -> torch.Tensor:
    """Return typical acceptance's gate `[n, V]` bool: p̃(v) > min(ε, δ·exp(−H(p̃))) per row (Medusa, §6.2)."""
    scaled = torch.exp(-entropy(p_gate)) * delta if delta != math.inf else torch.full(p_gate.shape[:-1], math.inf)
    threshold = torch.clamp(scaled, max=epsilon)  # [n]
    return p_gate > threshold.unsqueeze(-1)


def margin_mask(p_gate: torch.Tensor, delta: float) -> torch.Tensor:
    """Return the margin gate `[n, V]` bool: log p̃(v) > max_u log p̃(u) − Δ, i.e. p̃(v) > max p̃ · e^{−Δ}.
    Strict, so Δ = 0 never fires."""
    return p_gate > p_gate.max(-1, keepdim=True).values * math.exp(-delta)


def js_divergence(p: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """Return JS(p, q) = ½KL(p‖m) + ½KL(q‖m), m = (p + q)/2, in nats, per row `[..., V]` -> `[...]`; in [0, ln 2]."""
    m = 0.5 * (p + q)
    kl = lambda a: (torch.special.xlogy(a, a) - torch.special.xlogy(a, m)).sum(-1)  # noqa: E731
    return 0.5 * kl(p) + 0.5 * kl(q)


def fuzzy_mask(p: torch.Tensor, q: torch.Tensor, threshold: float) -> torch.Tensor:
    """Return FSD's gate `[n, V]` bool: every token at a row where JS(p, q) < θ (strict: θ = 0 never fires)."""
    return (js_divergence(p, q) < threshold).unsqueeze(-1).expand_as(p)


def fly_gate(p_gate: torch.Tensor, entropy_threshold: float, top_k: int) -> torch.Tensor:
    """Return FLy's entropy gate `[n]` bool: H of p̃'s k largest probabilities, renormalised, exceeds θ (nats).
    H_k ≤ ln k, so θ ≥ ln k never opens it."""
    top = torch.topk(p_gate, min(top_k, p_gate.shape[-1]), dim=-1).values
    return entropy(top / top.sum(-1, keepdim=True)) > entropy_threshold


def gated_verify_law(draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, mask: torch.Tensor) -> BlockLaw:
    """Return the exact law of SD with a gate: x_i is kept with probability g_i + (1 − g_i)·min(1, p/q), g_i =
    mask[i, x_i]; then SD's residuals and bonus (module docstring). draft_tokens [γ]; q [γ, V]; p [γ+1, V];
    mask [γ, V] bool (or probabilities)."""
    check_block_shapes(draft_tokens, q, p)
    p, q = p.to(torch.float64), q.to(torch.float64)
    p_x, q_x = drafted_probs(draft_tokens, q, p)
    gate = mask.to(torch.float64).gather(1, draft_tokens.view(-1, 1)).view(-1)  # [γ]
    accept = gate + (1.0 - gate) * torch.clamp(p_x / q_x, max=1.0)  # g = 0 gives SD's a_i bit for bit
    return BlockLaw(stop=sequential_stop(accept), weights=torch.ones(len(accept) + 1, dtype=torch.float64), q=q, p=p)


def fly_verify_law(draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, gate: torch.Tensor,
                   window: int) -> BlockLaw:
    """Return the exact law of FLy's deferred rejection on one block (vLLM's `rejection_sample_method: "fly"`).

    Native rule: SD's test n_i = [U_i < min(1, p(x_i)/q(x_i))], independent uniforms. Scanning i = 1..γ: a natively
    accepted x_i is kept; a natively rejected x_i is kept anyway when gate[i] (the target is uncertain there) and
    the next W tokens x_{i+1..i+W} all exist in the block and pass natively (they are then kept and the scan
    resumes at i+W+1); otherwise the block ends at τ = i − 1 with SD's correction token norm((p − q)_+) at i.
    A rejection whose window runs past the block cannot be confirmed and stands. draft_tokens [γ]; q [γ, V];
    p [γ+1, V]; gate [γ] bool. A forward pass over P(scan reaches i) gives P(τ = j) exactly.
    """
    check_block_shapes(draft_tokens, q, p)
    p, q = p.to(torch.float64), q.to(torch.float64)
    p_x, q_x = drafted_probs(draft_tokens, q, p)
    accept = torch.clamp(p_x / q_x, max=1.0)  # [γ] native pass probabilities
    gamma = len(accept)
    if not bool(gate.any()):  # no deferral possible: SD's law, computed as SD computes it
        return BlockLaw(stop=sequential_stop(accept), weights=torch.ones(gamma + 1, dtype=torch.float64), q=q, p=p)
    reach = [0.0] * (gamma + 2)  # reach[i]: P(the scan examines position i), 1-based; reach[γ+1]: all kept
    reach[1] = 1.0
    stop = torch.zeros(gamma + 1, dtype=torch.float64)
    for i in range(1, gamma + 1):
        a, mass = float(accept[i - 1]), reach[i]
        reach[i + 1] += mass * a
        rejected = mass * (1.0 - a)
        if bool(gate[i - 1]) and i + window <= gamma:
            confirmed = float(torch.prod(accept[i : i + window]))  # x_{i+1..i+W} all pass natively
            reach[i + window + 1] += rejected * confirmed
            rejected *= 1.0 - confirmed
        stop[i - 1] += rejected
    stop[gamma] += reach[gamma + 1]
    return BlockLaw(stop=stop, weights=torch.ones(gamma + 1, dtype=torch.float64), q=q, p=p)


def fly_leaks(draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, gate: torch.Tensor,
              window: int) -> list[float]:
    """Return, per drafted position i, ε̂_i = (1 − a_i)·gate_i·Π_{j=i+1..i+W} a_j (a = native pass probability).

    FLy keeps a v that SD rejects with probability b(v) = gate·P(the next W drafted tokens pass | v), so the §3.3
    law holds at the position with a = b, and ε = Σ_v b(v)·(q(v) − p(v))_+. b(v) needs the continuations of
    every v, which one decode does not see; ε̂_i is the probability that the drafted x_i was rescued given the
    drafted continuation, whose mean over the draft (x_i ~ q, then its continuation) is exactly ε: an unbiased
    one-sample estimate, not the exact value. It leaves out the bias of the W window tokens themselves
    (conditioned on passing, they follow min(p, q) rather than p), so it understates FLy's distortion.
    """
    check_block_shapes(draft_tokens, q, p)
    p_x, q_x = drafted_probs(draft_tokens, q, p)
    accept = torch.clamp(p_x / q_x, max=1.0)
    gamma = len(accept)
    return [float((1.0 - accept[i]) * torch.prod(accept[i + 1 : i + 1 + window]))
            if bool(gate[i]) and i + window < gamma else 0.0 for i in range(gamma)]


def relaxed_law(rule: str, draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, p_gate: torch.Tensor,
                knobs: RelaxedKnobs) -> tuple[BlockLaw, list[float]]:
    """Return (the exact law of `rule` on one block, the per-position leak ε of each drafted position).

    draft_tokens [γ]; q [γ, V] and p [γ+1, V] processed; p_gate [γ+1, V] the unprocessed target softmax. The leak
    is exact for the position gates (typical, margin, fuzzy) and `fly_leaks`'s unbiased estimate for fly.
    """
    p64, q64, g64 = p.to(torch.float64), q.to(torch.float64), p_gate[:-1].to(torch.float64)
    if rule == "fly":
        gate = fly_gate(g64, knobs.fly_entropy, knobs.fly_top_k)
        law = fly_verify_law(draft_tokens, q64, p64, gate, knobs.fly_window)
        return law, fly_leaks(draft_tokens, q64, p64, gate, knobs.fly_window)
    mask = position_mask(rule, p64[:-1], q64, g64, knobs)
    leaks = [leak(p64[i], q64[i], mask[i]) for i in range(q64.shape[0])]  # ε = TV(P_out, p) per position (§3.3)
    return gated_verify_law(draft_tokens, q64, p64, mask), leaks


def position_mask(rule: str, p: torch.Tensor, q: torch.Tensor, p_gate: torch.Tensor, knobs: RelaxedKnobs
                  ) -> torch.Tensor:
    """Return the gate `[n, V]` of a position rule (typical, margin, fuzzy) at n positions: p, q processed and
    p_gate unprocessed, each `[n, V]`."""
    if rule == "typical":
        return typical_mask(p_gate, knobs.typical_epsilon, knobs.typical_delta)
    if rule == "margin":
        return margin_mask(p_gate, knobs.margin_delta)
    if rule == "fuzzy":
        return fuzzy_mask(p, q, knobs.fuzzy_threshold)
    raise ConfigError(f"unknown position rule {rule!r}; choose one of: typical, margin, fuzzy (fly defers)")


def relaxed_position_law(rule: str, p: torch.Tensor, q: torch.Tensor, p_gate: torch.Tensor, knobs: RelaxedKnobs
                         ) -> torch.Tensor:
    """Return the closed-form law `[V]` of the token a position rule emits at one position (p, q processed `[V]`,
    p_gate unprocessed `[V]`): §3.3's P_out with a = the gate (module docstring). FLy has no such closed form on
    one position: its a(v) depends on the continuations (`fly_leaks`)."""
    mask = position_mask(rule, p[None].to(torch.float64), q[None].to(torch.float64), p_gate[None].to(torch.float64),
                         knobs)[0]
    return position_law(p, q, mask)


def relaxed_verify(rule: str, draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, p_gate: torch.Tensor,
                   knobs: RelaxedKnobs, generator: torch.Generator | None = None) -> tuple[VerifyResult, list[float]]:
    """Verify one block with `rule`; return ((accepted τ, correction or bonus token), per-position leaks)."""
    law, leaks = relaxed_law(rule, draft_tokens, q, p, p_gate, knobs)
    return draw(law, generator), leaks


@dataclass(frozen=True)
class RelaxedResult(VerifyResult):
    """A lossy rule's outcome: τ and the extra token, and the leak ε of each drafted position (`relaxed_law`)."""

    leaks: list[float] = field(default_factory=list)


def rule_verifier(rule: str, knobs: RelaxedKnobs = RelaxedKnobs()):
    """Return `rule` at `knobs` as the method's verifier: (draft_tokens [γ], q [γ, V], p [γ+1, V], generator,
    p_gate [γ+1, V] or None) -> RelaxedResult. p_gate is the unprocessed target law p̃ the gates read; None reads p,
    which p̃ equals at temperature 1 without top-k / top-p. The registry holds each rule at the default knobs;
    `Method.with_knobs` (from `DecodeConfig.decoding_method`) gives it the configured ones."""

    def verify(draft_tokens: torch.Tensor, q: torch.Tensor, p: torch.Tensor, generator: torch.Generator | None = None,
               p_gate: torch.Tensor | None = None) -> RelaxedResult:
        result, leaks = relaxed_verify(rule, draft_tokens, q, p, p if p_gate is None else p_gate, knobs, generator)
        return RelaxedResult(result.accepted, result.token, leaks)

    verify.__name__ = f"{rule}_verify"
    verify.knobs = knobs  # type: ignore[attr-defined]  # what this verifier runs with, for a reader of the method
    return verify
