"""ROC/AUC, the operating point (η_FP, η_TP), per-position rates, and threshold calibration."""

from __future__ import annotations

import math

import pytest
import torch

from tests.learned.synthetic import separable_data
from verispec import theory
from verispec.errors import ConfigError
from verispec.learned import calibrate, evaluate_verifier, rates_at, roc_auc, roc_curve, train_verifier
from verispec.learned.evaluate import error_autocorrelation, per_position_rates


def scored(n: int = 400, seed: int = 0, ties: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    labels = (torch.rand(n, generator=gen) < 0.4).long()
    scores = torch.sigmoid(labels * 1.0 + torch.randn(n, generator=gen, dtype=torch.float64))
    return (scores * 10).round() / 10 if ties else scores, labels


@pytest.mark.parametrize("ties", [False, True])
def test_auc_is_the_mann_whitney_probability(ties):
    scores, labels = scored(ties=ties)
    pos, neg = scores[labels == 1], scores[labels == 0]
    wins = (pos[:, None] > neg[None, :]).double() + 0.5 * (pos[:, None] == neg[None, :]).double()
    assert roc_auc(scores, labels) == pytest.approx(float(wins.mean()), abs=1e-12)


def test_roc_curve_ends_and_extremes():
    scores, labels = scored()
    fpr, tpr, thresholds = roc_curve(scores, labels)
    assert (fpr[0], tpr[0], fpr[-1], tpr[-1]) == (0.0, 0.0, 1.0, 1.0)
    assert bool((fpr[1:] >= fpr[:-1]).all()) and bool((tpr[1:] >= tpr[:-1]).all())
    assert thresholds[0] == float("inf")
    labels = torch.tensor([0, 0, 1, 1])
    assert roc_auc(torch.tensor([0.1, 0.2, 0.8, 0.9]), labels) == 1.0
    assert roc_auc(torch.tensor([0.9, 0.8, 0.2, 0.1]), labels) == 0.0
    assert math.isnan(roc_auc(torch.tensor([0.5, 0.7]), torch.tensor([1, 1])))  # one class: undefined


def test_rates_at_definitions():
    scores = torch.tensor([0.9, 0.6, 0.4, 0.7, 0.2, 0.1])
    labels = torch.tensor([1, 1, 1, 0, 0, 0])
    r = rates_at(scores, labels, 0.5)
    assert r["eta_tp"] == pytest.approx(2 / 3)  # P(accept | label 1)
    assert r["eta_fp"] == pytest.approx(1 / 3)  # P(accept | label 0)
    assert r["accept_rate"] == pytest.approx(0.5) and r["accuracy"] == pytest.approx(4 / 6)
    assert r["majority_accuracy"] == 0.5 and r["label_rate"] == 0.5
    rows = per_position_rates(scores, labels, torch.tensor([1, 2, 1, 2, 1, 2]), 0.5)
    assert [row["position"] for row in rows] == [1, 2] and rows[0]["n"] == 3
    assert rows[0]["eta_tp"] == pytest.approx(0.5) and rows[1]["eta_fp"] == pytest.approx(0.5)


def test_error_autocorrelation():
    steps = torch.arange(200) % 100
    prompts = torch.arange(200) // 100
    alternating = (steps % 2).double()
    assert error_autocorrelation(alternating, prompts, steps) == pytest.approx(-1.0)
    blocks = ((steps // 10) % 2).double()
    assert error_autocorrelation(blocks, prompts, steps) > 0.7


@pytest.mark.parametrize("eta", [0.0, 0.05, 0.2, 0.5])
def test_calibrate_to_a_false_positive_rate(eta):
    scores, labels = scored(seed=2)
    tau = calibrate(scores, labels, target_fp_rate=eta)
    assert rates_at(scores, labels, tau)["eta_fp"] <= eta
    lower = scores[scores < tau]
    if lower.numel():  # the smallest such τ: the next lower score breaks the budget
        assert rates_at(scores, labels, float(lower.max()))["eta_fp"] > eta


@pytest.mark.parametrize("length,cap", [(3.0, 20), (1.5, None), (6.0, 8)])
def test_calibrate_to_a_run_length(length, cap):
    scores, labels = scored(n=1000, seed=3)
    tau = calibrate(scores, labels, target_run_length=length, cap=cap)
    pi = rates_at(scores, labels, tau)["accept_rate"]
    assert abs(pi - theory.acceptance_rate_for_run_length(length, cap)) <= 1e-3
    assert theory.expected_run_length(pi, cap) == pytest.approx(length, rel=0.02)


def test_calibrate_defaults_and_errors():
    scores, labels = scored()
    assert calibrate(scores, labels) == 0.5
    with pytest.raises(ConfigError, match="not both"):
        calibrate(scores, labels, target_fp_rate=0.1, target_run_length=3.0)
    with pytest.raises(ConfigError, match="target_fp_rate"):
        calibrate(scores, labels, target_fp_rate=1.5)
    with pytest.raises(ConfigError, match="target_run_length"):
        calibrate(scores, labels, target_run_length=30.0, cap=20)


def test_evaluate_report_on_held_out_data():
    verifier, _ = train_verifier(separable_data(), seed=0)
    report = evaluate_verifier(verifier, separable_data(seed=5), cap=20)
    assert report.auc > 0.95 and report.rates["accuracy"] > report.rates["majority_accuracy"]
    assert 1 <= len(report.per_position) <= 5
    pred = report.predicted
    assert pred["expected_run_length"] == pytest.approx(theory.expected_run_length(report.rates["accept_rate"], 20))
    data = separable_data(seed=5)
    accept = verifier.score_features(data.hidden.double()) >= verifier.threshold
    leak = accept * (1 - (data.p_x / data.q_x).clamp(max=1.0))  # a(x)·(1 − p(x)/q(x))_+ per row (§3.3)
    assert pred["predicted_tv"] == pytest.approx(float(leak.mean()), abs=1e-12)
    assert pred["predicted_tv_mixture"] == pytest.approx(report.rates["eta_fp"] * float(data.tv.mean()))
    assert set(report.to_dict()) >= {"auc", "rates", "per_position", "predicted", "roc", "error_autocorrelation"}
