"""How good a verifier is (docs/algorithms.md §3.8): ROC/AUC, accuracy vs the majority class, and the operating point.

Definitions (labels from the true p and q, label 1 = acceptable, q(x) ≤ λ·p(x)):
- η_FP = P(verifier accepts | label 0): the false-positive rate, the quality budget (§3.3: TV = η_FP·TV(p, q));
- η_TP = P(verifier accepts | label 1): the true-positive rate, which only changes the speed;
- π = P(verifier accepts): its acceptance rate, which sets the run length (§3.4).
The verifier accepts when score ≥ τ. All functions take scores `[N]` and labels `[N]` (0/1) as tensors.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from verispec import theory


def roc_curve(scores: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return (false-positive rates, true-positive rates, thresholds), each `[K+1]`, for accepting score ≥ threshold
    at every distinct score in decreasing order, starting from (0, 0) at threshold +inf."""
    scores, labels = scores.to(torch.float64).view(-1), labels.to(torch.float64).view(-1)
    order = torch.argsort(scores, descending=True, stable=True)
    scores, labels = scores[order], labels[order]
    tp, fp = torch.cumsum(labels, 0), torch.cumsum(1.0 - labels, 0)
    # keep the last index of each run of equal scores: tied scores are accepted together
    last = torch.ones_like(scores, dtype=torch.bool)
    last[:-1] = scores[1:] != scores[:-1]
    positives, negatives = max(float(labels.sum()), 1.0), max(float((1.0 - labels).sum()), 1.0)
    zero = torch.zeros(1, dtype=torch.float64)
    fpr = torch.cat([zero, fp[last] / negatives])
    tpr = torch.cat([zero, tp[last] / positives])
    thresholds = torch.cat([torch.tensor([float("inf")], dtype=torch.float64), scores[last]])
    return fpr, tpr, thresholds


def roc_auc(scores: torch.Tensor, labels: torch.Tensor) -> float:
    """Return the area under the ROC curve (trapezoids: ties count one half), or NaN with a single class."""
    labels = labels.view(-1)
    if labels.numel() == 0 or bool((labels == labels[0]).all()):
        return float("nan")
    fpr, tpr, _ = roc_curve(scores, labels)
    return float(torch.trapezoid(tpr, fpr))


def rates_at(scores: torch.Tensor, labels: torch.Tensor, tau: float) -> dict[str, float]:
    """Return the operating point at threshold τ: eta_fp, eta_tp, accept_rate (π), accuracy, label_rate (α),
    majority_accuracy (always predicting the more common class) and n."""
    accept = scores.view(-1) >= tau
    positive = labels.view(-1) > 0.5
    n = positive.numel()
    pos, neg = int(positive.sum()), n - int(positive.sum())
    nan = float("nan")
    return {
        "n": n,
        "eta_fp": float((accept & ~positive).sum()) / neg if neg else nan,
        "eta_tp": float((accept & positive).sum()) / pos if pos else nan,
        "accept_rate": float(accept.double().mean()) if n else nan,
        "accuracy": float((accept == positive).double().mean()) if n else nan,
        "label_rate": pos / n if n else nan,
        "majority_accuracy": max(pos, neg) / n if n else nan,
    }


def per_position_rates(
    scores: torch.Tensor, labels: torch.Tensor, positions: torch.Tensor, tau: float
) -> list[dict[str, float]]:
    """Return `rates_at` for each position in the run (1..max), each with its `position` (§3.8: the i.i.d.
    assumption says these should not depend on the position)."""
    out = []
    for position in sorted({int(v) for v in positions.view(-1).tolist()}):
        rows = positions.view(-1) == position
        out.append({"position": position, **rates_at(scores[rows], labels[rows], tau)})
    return out


def error_autocorrelation(errors: torch.Tensor, prompt_id: torch.Tensor, step: torch.Tensor) -> float:
    """Return the lag-1 autocorrelation of verifier errors `[N]` (0/1) between consecutive rows of the same
    trajectory (§3.8: the i.i.d. assumption says 0); NaN when undefined."""
    order = torch.argsort(prompt_id * (int(step.max()) + 1 if step.numel() else 1) + step)
    e, pid, st = errors.to(torch.float64)[order], prompt_id[order], step[order]
    pairs = (pid[1:] == pid[:-1]) & (st[1:] == st[:-1] + 1)
    if int(pairs.sum()) < 2:
        return float("nan")
    a, b = e[:-1][pairs], e[1:][pairs]
    a, b = a - a.mean(), b - b.mean()
    denominator = float((a.square().sum() * b.square().sum()).sqrt())
    return float((a * b).sum()) / denominator if denominator > 0 else float("nan")


@dataclass
class EvalReport:
    """A verifier on a labelled data set at its threshold τ (see the module docstring for the definitions)."""

    threshold: float
    lam: float
    auc: float
    rates: dict[str, float]  # rates_at(τ)
    per_position: list[dict[str, float]]
    error_autocorrelation: float
    predicted: dict[str, float]  # §3.3/§3.4 predictions from the measured rates: TV, E[T], E[N]
    roc: dict[str, list[float]] = field(default_factory=dict)  # fpr, tpr (at most ~200 points)

    def to_dict(self) -> dict[str, Any]:
        """Return the report as a JSON-able dict."""
        return asdict(self)


def predictions(
    scores: torch.Tensor, labels: torch.Tensor, q_x: torch.Tensor, p_x: torch.Tensor, tv: torch.Tensor,
    tau: float, cap: int | None,
) -> dict[str, float]:
    """Return §3.3/§3.4 predictions from measured rows: π, α, β (mean SD pass probability), the pass rate of
    rejected tokens, E[T], E[N] (i.i.d. decisions, cap C), mean TV(p, q), and the predicted TV(P_out, p) per
    drafted position, both the general ε and the mixture form η_FP·TV(p, q)."""
    accept = scores.view(-1) >= tau
    sd_pass = torch.clamp(p_x / q_x.clamp_min(1e-300), max=1.0)  # min(1, p(x)/q(x)) per drafted token
    rates = rates_at(scores, labels, tau)
    pi = rates["accept_rate"]
    beta = float(sd_pass.mean()) if sd_pass.numel() else float("nan")
    pass_rejected = float(sd_pass[~accept].mean()) if bool((~accept).any()) else beta
    mean_tv = float(tv.to(torch.float64).mean()) if tv.numel() else float("nan")
    return {
        "pi": pi,
        "alpha": rates["label_rate"],
        "beta": beta,
        "pass_rejected": pass_rejected,
        "expected_run_length": theory.expected_run_length(pi, cap),
        "expected_tokens_per_round": theory.expected_tokens_per_round(pi, cap, pass_rejected, beta),
        "mean_tv_pq": mean_tv,
        # ε = Σ_v a(v)·(q(v) − p(v))_+ = E_{x~q}[a(x)·(1 − p(x)/q(x))_+]: any verifier, any λ (§3.3 general form)
        "predicted_tv": float((accept * (1.0 - sd_pass)).mean()) if sd_pass.numel() else float("nan"),
        "predicted_tv_mixture": rates["eta_fp"] * mean_tv,  # η_FP·TV(p, q): the token-aware, λ = 1 form (§3.3)
        "eta_fp_lower_bound": theory.eta_fp_lower_bound(pi, rates["label_rate"]),
    }


def thin_roc(fpr: torch.Tensor, tpr: torch.Tensor, points: int = 200) -> dict[str, list[float]]:
    """Return at most `points` (+ the ends) ROC points as lists, for reports."""
    step = max(1, fpr.numel() // points)
    keep = list(range(0, fpr.numel(), step))
    if keep[-1] != fpr.numel() - 1:
        keep.append(fpr.numel() - 1)
    return {"fpr": fpr[keep].tolist(), "tpr": tpr[keep].tolist()}


def evaluate_verifier(verifier: Any, data: Any, lam: float | None = None, cap: int | None = 20) -> EvalReport:
    """Return the `EvalReport` of a `LearnedVerifier` on `VerifierData` (labels recomputed with λ = `lam`, default
    the verifier's λ) at the verifier's threshold."""
    from verispec.learned.verifier import feature_matrix

    lam = verifier.lam if lam is None else lam
    labels = data.labels(lam)
    features = feature_matrix(verifier.features, data.hidden, data.q_x, data.q_entropy, data.position)
    scores = verifier.score_features(features)
    tau = verifier.threshold
    accept = (scores >= tau).to(torch.float64)
    fpr, tpr, _ = roc_curve(scores, labels)
    return EvalReport(
        threshold=tau,
        lam=lam,
        auc=roc_auc(scores, labels),
        rates=rates_at(scores, labels, tau),
        per_position=per_position_rates(scores, labels, data.position, tau),
        error_autocorrelation=error_autocorrelation((accept != labels).to(torch.float64), data.prompt_id, data.step),
        predicted=predictions(scores, labels, data.q_x, data.p_x, data.tv, tau, cap),
        roc=thin_roc(fpr, tpr),
    )
