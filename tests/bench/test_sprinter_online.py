"""SPRINTER's online theory-vs-measurement figures, checked on a hand-made trace."""

from __future__ import annotations

import pytest

from verispec.bench.report import render_sprinter_online
from verispec.bench.sprinter_online import sprinter_online


def _round(accepts, acceptable, accepted):
    return {"drafted": len(accepts), "accepted": accepted, "verifier_accepts": accepts, "acceptable": acceptable}


RECORDS = [
    {"config": {"cap": 3}, "trace": {"rounds": [
        _round([True, False], [True, True], 1),  # rejection at 2, the checked token fails
        _round([False], [False], 1),  # rejection at 1, passes
    ]}},
    {"config": {"cap": 3}, "trace": {"rounds": [
        _round([True, True, True], [True, False, True], 3),  # reaches the cap, passes
        _round([True], [True], 1),  # cut by max_new_tokens: not a natural round
        {"drafted": 0, "accepted": 0},  # a round without verifier decisions is ignored
    ]}},
]


def test_figures_of_a_hand_checked_trace():
    out = sprinter_online(RECORDS, max_positions=2)
    assert (out["rounds"], out["natural_rounds"], out["cap"]) == (4, 3, 3)
    assert out["pi"] == pytest.approx(4 / 6)  # decisions below the cap: T F | F | T T | T
    assert (out["alpha"], out["eta_tp"], out["eta_fp"]) == pytest.approx((5 / 7, 4 / 5, 1 / 2))
    assert out["run_length"] == pytest.approx(2.0) and out["pass_rate"] == pytest.approx(2 / 3)
    assert out["tokens_per_round"] == pytest.approx(2 + 2 / 3)
    assert out["run_length_predicted"] == pytest.approx((1 - (2 / 3) ** 3) / (1 - 2 / 3))
    assert out["tokens_per_round_predicted"] == pytest.approx((1 - (2 / 3) ** 3) / (1 - 2 / 3) + 2 / 3)
    assert out["per_position"] == [
        {"position": 1, "tokens": 4, "accept_rate": 0.75, "acceptable_rate": 0.75, "pooled": False},
        {"position": 2, "tokens": 3, "accept_rate": pytest.approx(2 / 3), "acceptable_rate": pytest.approx(2 / 3),
         "pooled": True},
    ]
    # errors by run: [0 1] [0] [0 1 0] [0]; consecutive pairs (0,1) (0,1) (1,0): perfectly anti-correlated
    assert out["error_autocorrelation"] == pytest.approx(-1.0)


def test_no_verifier_decisions_gives_none():
    assert sprinter_online([{"config": {"cap": 20}, "trace": {"rounds": [{"drafted": 4, "accepted": 2}]}}]) is None


def test_report_section_lists_predictions_and_positions():
    text = render_sprinter_online([("sprinter:tau=0.5", sprinter_online(RECORDS, max_positions=2))])
    assert "E[T] predicted" in text and "| sprinter:tau=0.5 | 4 (3) | 3 | 0.667 |" in text
    assert "| sprinter:tau=0.5 | 0.75 / 0.75 (n = 4) | 0.67 / 0.67 (n = 3) |" in text
    assert "position 2+" in text


def test_total_variation_measured_against_predicted():
    rounds = [
        {**_round([True, False], [True, False], 1), "tv_pq": [0.2, 0.4], "leak": [0.05, 0.1]},
        {**_round([True, True, True], [True, True, True], 3), "tv_pq": [0.1, 0.3, 0.5], "leak": [0.0, 0.2, None]},
    ]
    out = sprinter_online([{"config": {"cap": 3}, "trace": {"rounds": rounds}}])
    assert out["tv_positions"] == 4  # the cap-th position is verified whatever the verifier says: not steered
    assert out["tv_pq"] == pytest.approx((0.2 + 0.4 + 0.1 + 0.3) / 4)
    assert out["tv_out"] == pytest.approx((0.05 + 0.1 + 0.0 + 0.2) / 4)
    assert out["eta_fp"] == 0.0 and out["tv_out_predicted"] == 0.0  # the one unacceptable token was rejected
    assert sprinter_online(RECORDS)["tv_out"] is None  # traces without the record


def test_leak_online_pools_the_recorded_leaks_of_a_relaxed_rule():
    """The bench's leak figure is the mean ε over the positions a rule examined; None for a lossless method."""
    from verispec.bench.sprinter_online import leak_online
    from verispec.engine import DecodeConfig, Engine
    from verispec.models.tabular import TabularLM
    from verispec.sampling import SamplingConfig

    engine = Engine(TabularLM(6, seed=61), TabularLM(6, seed=62, sharpness=1.5))
    config = dict(gamma=3, max_new_tokens=30, sampling=SamplingConfig(temperature=1.0), margin_delta=2.0)
    records = [{"trace": engine.decode([0], DecodeConfig("margin", seed=s, **config)).trace.to_dict()}
               for s in range(2)]
    leaks = [v for rec in records for r in rec["trace"]["rounds"] for v in r["leak"] if v is not None]
    figures = leak_online(records)
    assert figures["leak_positions"] == len(leaks) > 0
    assert abs(figures["leak_tv_out"] - sum(leaks) / len(leaks)) < 1e-12 and figures["leak_tv_out"] > 0
    assert figures["leak_tv_out"] <= figures["leak_tv_pq"]
    sd = [{"trace": engine.decode([0], DecodeConfig("sd", gamma=3, max_new_tokens=30)).trace.to_dict()}]
    assert leak_online(sd) == {"leak_positions": 0, "leak_tv_pq": None, "leak_tv_out": None}
