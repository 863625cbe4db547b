"""Benchmark metrics against hand-computed values on hand-built records."""

from __future__ import annotations

import pytest

from verispec.bench.metrics import (
    alpha_estimate,
    decode_rounds,
    decode_split,
    efficiency,
    measured_costs,
    one_token_target_seconds,
    summarize,
    theoretical_speedup,
)


def rnd(drafted, accepted, emitted, fed, time_draft=0.0, time_decode=0.0, time_verify=0.0):
    return dict(drafted=drafted, accepted=accepted, emitted=emitted, fed=fed, time_draft=time_draft,
                time_decode=time_decode, time_verify=time_verify)


def record(method, index, seconds, rounds, draft_calls=0, tokens=None):
    generated = sum(r["emitted"] for r in rounds)
    trace = dict(rounds=rounds, generated=generated, time_total=seconds, target_calls=len(rounds),
                 draft_calls=draft_calls)
    return dict(method=method, prompt_index=index, tokens=tokens or list(range(generated)), trace=trace)


# ar: a 10-token prefill round (excluded from t1), then 1-token forwards of 10 ms and 12 ms: t1 = 11 ms.
AR = [record("ar", 0, 0.6, [rnd(0, 0, 1, 10, 0, 0.5), rnd(0, 0, 1, 1, 0, 0.010), rnd(0, 0, 1, 1, 0, 0.012)])]
# sd, γ = 4: first round (prefill) excluded from the costs; then 3 rounds, two of them full blocks (fed 5).
SD = [record("sd", 0, 0.2, [
    rnd(4, 4, 5, 14, 0.100, 0.400),
    rnd(4, 2, 3, 5, 0.044, 0.0132),
    rnd(4, 0, 1, 5, 0.044, 0.0154),
    rnd(2, 2, 3, 3, 0.022, 0.0120),
], draft_calls=14)]


def test_alpha_counts_one_rejection_per_cut_round():
    # accepted 4+2+0+2 = 8; rejections in rounds 2 and 3: α = 8 / 10.
    assert alpha_estimate(SD) == pytest.approx(0.8)
    assert alpha_estimate(AR) is None


def test_one_token_target_time_excludes_prefill_and_blocks():
    assert one_token_target_seconds(AR) == pytest.approx(0.011)
    assert one_token_target_seconds(SD) is None


def test_measured_costs_relative_to_one_token_forward():
    c, f = measured_costs(SD, gamma=4, t1=0.011)
    # draft: (0.044 + 0.044 + 0.022) s over 10 drafted tokens = 11 ms per token = 1.0 t1.
    assert c == pytest.approx(1.0)
    # blocks of γ+1 = 5 tokens: mean(13.2, 15.4) ms = 14.3 ms = 1.3 t1 (the 3-token round is not a full block).
    assert f == pytest.approx(1.3)
    assert measured_costs(SD, gamma=4, t1=None) == (None, None)


def test_theoretical_speedup_formula():
    # (1 - 0.8^5) / ((1 - 0.8)(4 * 0.1 + 1.2)) = 0.67232 / 0.32
    assert theoretical_speedup(0.8, 4, 0.1, 1.2) == pytest.approx(0.67232 / 0.32)
    assert theoretical_speedup(1.0, 4, 0.1, 1.0) == pytest.approx(5 / 1.4)  # α = 1: γ+1 tokens per round
    assert theoretical_speedup(0.0, 4, 0.0, 1.0) == pytest.approx(1.0)  # nothing accepted, free draft: AR
    assert theoretical_speedup(None, 4, 0.1, 1.0) is None


def test_summarize_single_prompt_rows():
    rows = {r["method"]: r for r in summarize(AR + SD, ["ar", "sd"], gamma=4)}
    ar, sd = rows["ar"], rows["sd"]
    assert ar["tokens"] == 3 and ar["seconds_per_token"] == pytest.approx(0.2) and ar["speedup"] == 1.0
    assert sd["tokens"] == 12 and sd["tokens_per_target_call"] == pytest.approx(3.0)
    assert sd["speedup"] == pytest.approx((0.6 / 3) / (0.2 / 12))
    assert sd["acceptance_rate"] == pytest.approx(8 / 14)
    assert sd["alpha"] == pytest.approx(0.8)
    assert sd["mean_accepted"] == pytest.approx(2.0)
    assert sd["target_calls_per_token"] == pytest.approx(4 / 12)
    assert sd["draft_calls_per_token"] == pytest.approx(14 / 12)
    assert sd["cost_draft_c"] == pytest.approx(1.0) and sd["cost_block_f"] == pytest.approx(1.3)
    assert sd["theoretical_speedup"] == pytest.approx((1 - 0.8**5) / (0.2 * (4 * 1.0 + 1.3)))
    assert ar["acceptance_rate"] is None and ar["theoretical_speedup"] is None
    assert sd["speedup_ci95"] is None  # one prompt: no interval
    assert sd["same_tokens_as_baseline"] == 0.0 and ar["same_tokens_as_baseline"] == 1.0


def _pair(index, base_seconds, seconds, tokens=10):
    rounds = [rnd(0, 0, 1, 1)] * tokens
    return [record("ar", index, base_seconds, rounds), record("sd", index, seconds, rounds)]


def test_speedup_is_a_ratio_of_totals_and_constant_ratios_give_a_point_interval():
    records = [r for i in range(5) for r in _pair(i, 1.0 + i, (1.0 + i) / 2)]
    sd = summarize(records, ["ar", "sd"])[1]
    assert sd["speedup"] == pytest.approx(2.0)
    assert sd["speedup_ci95"] == pytest.approx((2.0, 2.0))
    assert sd["same_tokens_as_baseline"] == 1.0


def test_speedup_uses_only_prompts_both_methods_decoded():
    records = _pair(0, 1.0, 0.5) + _pair(1, 1.0, 0.25)[:1]  # sd missing on prompt 1
    sd = summarize(records, ["ar", "sd"])[1]
    assert sd["speedup"] == pytest.approx(2.0)


def test_decode_split_separates_the_prompt_round_from_the_decode_rounds():
    # ar: the prompt round takes 0.5 + 0.02 s of 0.6 s; the 2 later tokens take the other 0.08 s.
    ar = record("ar", 0, 0.6, [rnd(0, 0, 1, 10, 0, 0.5, 0.02), rnd(0, 0, 1, 1, 0, 0.03), rnd(0, 0, 1, 1, 0, 0.03)])
    # sd: the prompt round (draft prefill + drafting 0.2 s, target 0.5 s) emits 5 of 12 tokens; 0.1 s for the rest.
    sd = record("sd", 0, 0.8, [rnd(4, 4, 5, 14, 0.2, 0.5), rnd(4, 2, 3, 5, 0.03, 0.02), rnd(4, 0, 1, 5, 0.02, 0.02),
                               rnd(2, 2, 3, 3, 0.01, 0.01)])
    assert decode_rounds(ar["trace"]) == (pytest.approx(0.08), 2)
    assert decode_rounds(sd["trace"]) == (pytest.approx(0.1), 7)
    rows = {r["method"]: r for r in decode_split([ar, sd], ["ar", "sd"])}
    assert rows["ar"]["prompt_round_share"] == pytest.approx(0.52 / 0.6)
    assert rows["sd"]["prompt_round_share"] == pytest.approx(0.7 / 0.8)
    assert rows["sd"]["decode_seconds_per_token"] == pytest.approx(0.1 / 7)
    assert rows["sd"]["decode_speedup"] == pytest.approx((0.08 / 2) / (0.1 / 7))  # 2.8x, against 3.0x whole
    assert rows["ar"]["decode_speedup"] == 1.0 and rows["sd"]["decode_speedup_ci95"] is None  # one prompt
    whole = {r["method"]: r for r in summarize([ar, sd], ["ar", "sd"], gamma=4)}
    assert whole["sd"]["speedup"] == pytest.approx((0.6 / 3) / (0.8 / 12))
    assert whole["sd"]["decode_speedup"] == rows["sd"]["decode_speedup"]  # summarize carries the split


def test_decode_speedup_interval_resamples_prompts():
    # The prompt rounds differ wildly, the decode rounds run exactly 2x faster on every prompt: a point interval.
    records = []
    for i in range(5):
        rounds = [rnd(0, 0, 1, 1, 0, 0.1)] * 10
        records.append(record("ar", i, 2.0 + i + 0.9, [rnd(0, 0, 1, 50, 0, 2.0 + i)] + rounds))
        records.append(record("sd", i, 0.3 + 0.45, [rnd(0, 0, 1, 50, 0, 0.3)] + rounds))
    sd = decode_split(records, ["ar", "sd"])[1]
    assert sd["decode_speedup"] == pytest.approx(2.0) and sd["decode_speedup_ci95"] == pytest.approx((2.0, 2.0))


def _timed(method, index, seconds, calls, tokens_per_call, parts=(0.0, 0.0, 0.0)):
    rounds = [rnd(tokens_per_call - 1, tokens_per_call - 1, tokens_per_call, tokens_per_call)] * calls
    rec = record(method, index, seconds, rounds)
    rec["trace"].update(time_draft=parts[0], time_target=parts[1], time_verify=parts[2])
    return rec


def test_efficiency_gives_block_efficiency_and_time_per_token_with_intervals():
    # bv: 4 tokens per call on every prompt; gbv: 5 on prompts 0-2 and 6 on prompt 3, so its paired ratio of block
    # efficiencies varies by prompt and the interval brackets the pooled ratio.
    records = []
    for i in range(4):
        records.append(_timed("bv", i, 1.0 + i, calls=3, tokens_per_call=4, parts=(0.5, 0.3, 0.1)))
        records.append(_timed("gbv", i, 2.0, calls=2, tokens_per_call=5 if i < 3 else 6, parts=(0.6, 0.4, 0.8)))
    rows = {r["method"]: r for r in efficiency(records, ["bv", "gbv"], compare_to="bv", resamples=4000, seed=1)}
    bv, gbv = rows["bv"], rows["gbv"]
    assert bv["prompts"] == 4 and bv["tokens_per_target_call"] == pytest.approx(4.0)
    assert bv["tokens_per_target_call_ci95"] == pytest.approx((4.0, 4.0))  # constant per prompt: a point interval
    assert bv["seconds_per_token"] == pytest.approx(10.0 / 48)
    lo, hi = bv["seconds_per_token_ci95"]
    assert 1.0 / 12 < lo < 10.0 / 48 < hi < 4.0 / 12  # per-prompt 1/12 ... 4/12 s per token
    assert gbv["tokens_per_target_call"] == pytest.approx(42 / 8)
    assert gbv["block_efficiency_vs"] == pytest.approx((42 / 8) / 4.0)
    lo, hi = gbv["block_efficiency_vs_ci95"]
    assert 5 / 4 <= lo < (42 / 8) / 4 < hi <= 6 / 4
    assert gbv["speedup_vs"] == pytest.approx((10.0 / 48) / (8.0 / 42))
    assert bv["block_efficiency_vs"] == 1.0 and bv["block_efficiency_vs_ci95"] == pytest.approx((1.0, 1.0))
    # Where the time goes, per token; `other` is what the three parts leave of the wall time.
    assert gbv["verify_seconds_per_token"] == pytest.approx(3.2 / 42)
    assert gbv["other_seconds_per_token"] == pytest.approx((8.0 - 4 * 1.8) / 42)
    assert gbv["tokens_per_target_pass"] == pytest.approx((3 * 5 + 6) / 4)  # the one decode round a prompt
    assert "block_efficiency_vs" not in efficiency(records, ["bv"])[0]


def test_the_speedup_per_answer_charges_a_method_for_longer_answers():
    # sd writes 16 tokens where ar writes 8, at the same time per token: 1x per token, 0.5x per answer
    def record(method, index, seconds, tokens):
        trace = dict(rounds=[], generated=tokens, time_total=seconds, target_calls=tokens, draft_calls=0,
                     time_draft=0.0, time_target=seconds, time_verify=0.0)
        return dict(method=method, prompt_index=index, prompt_id=str(index), tokens=list(range(tokens)), trace=trace)

    records = [r for i in range(3) for r in (record("ar", i, 1.0 + i, 8), record("sd", i, 2.0 * (1.0 + i), 16))]
    sd = summarize(records, ["ar", "sd"], "ar", None, 200, 0)[1]
    assert abs(sd["speedup"] - 1.0) < 1e-9
    assert abs(sd["answer_speedup"] - 0.5) < 1e-9 and sd["answer_speedup_ci95"] == (0.5, 0.5)
