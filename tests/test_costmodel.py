"""The cost model: t(k, L) interpolation, predictions on hand-built traces, the accelerator profile, bench rows."""

from __future__ import annotations

import json

import pytest

from tests.bench.results_dicts import results_dict
from verispec.bench.metrics import alpha_estimate, one_token_target_seconds, summarize, theoretical_speedup
from verispec.bench.report import write_report
from verispec.bench.runner import BenchConfig
from verispec.cli import main
from verispec.costmodel import (
    KIND_MODELLED,
    HardwareProfile,
    ModelCost,
    Overheads,
    accelerator_like,
    accelerator_profile,
    breakdown,
    cost_ratios,
    modelled_speedup,
    other_drafter_rounds,
    predict,
    predict_per_token,
)
from verispec.engine import DecodeConfig, Engine
from verispec.errors import ConfigError
from verispec.models.protocol import ModelDefaults
from verispec.models.spec import ModelSpec
from verispec.trace import RoundTrace, Trace

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def hand_profile() -> HardwareProfile:
    target = ModelCost("T", [1, 2, 4, 8], [1.0, 1.5, 2.0, 4.0], context=10, context_slope=0.01, prefill_tokens=20,
                       prefill_seconds=10.0, params=1000, streamed_params=800)
    draft = ModelCost("D", [1, 2, 4, 8], [0.2, 0.25, 0.3, 0.5], context=10, prefill_tokens=20, prefill_seconds=2.0,
                      params=300, streamed_params=200)
    overheads = Overheads(sample_row=0.02, verify_round=0.1, verify_row=0.01, other_round=0.001)
    return HardwareProfile({"target": target, "draft": draft}, overheads, description="hand-built")


def test_forward_seconds_interpolates_the_curve_the_context_and_the_prefill_point():
    t = hand_profile().models["target"]
    assert t.forward_seconds(2, 10) == 1.5 and t.forward_seconds(3, 10) == pytest.approx(1.75)
    assert t.forward_seconds(4, 20) == pytest.approx(2.1)  # + slope · (20 − 10)
    # Between the curve's end (k = 8) and the 20-token prompt forward (measured on an empty cache).
    assert t.forward_seconds(14, 0) == pytest.approx(3.9 + (10.0 - 3.9) * 6 / 12)
    assert t.forward_seconds(20, 0) == pytest.approx(10.0)
    assert t.forward_seconds(40, 5) == pytest.approx((10.0 + 0.05) * 2)  # beyond: proportional to k
    assert t.f(4) == pytest.approx(2.0)
    with pytest.raises(ConfigError):
        t.forward_seconds(0.5, 10)
    with pytest.raises(ConfigError, match="start at 1"):
        ModelCost("x", [2, 4], [1.0, 1.0], context=1)


def test_long_prompts_cost_more_per_token_through_the_second_prefill_point():
    t = hand_profile().models["target"]  # prompt forwards: 20 tokens in 10 s (0.5 s a token)
    t.long_prefill_tokens, t.long_prefill_seconds = 40, 24.0  # 0.6 s a token: u grows 0.005 s per prompt token
    assert t.forward_seconds(20, 0) == pytest.approx(10.0) and t.forward_seconds(14, 0) == pytest.approx(6.95)
    assert t.forward_seconds(30, 0) == pytest.approx(30 * 0.55)
    assert t.forward_seconds(60, 0) == pytest.approx(60 * 0.7)  # extrapolated: 0.5 + 0.005 * 40
    assert t.forward_seconds(60, 10) == pytest.approx(60 * 0.7 + 0.01 * 10)
    t.long_prefill_seconds = 16.0  # cheaper per token at 40: interpolated up to 40, held beyond
    assert t.forward_seconds(30, 0) == pytest.approx(30 * 0.45) and t.forward_seconds(80, 0) == pytest.approx(32.0)


def test_predict_an_autoregressive_trace_by_hand():
    rounds = [RoundTrace(0, 0, 1, fed=3), RoundTrace(0, 0, 1, fed=1), RoundTrace(0, 0, 1, fed=1)]
    trace = Trace(rounds, target_calls=3, target_tokens=5, prefill_tokens=3)
    # Contexts 0, 3, 4: t(3) − 0.1, t(1) − 0.07, t(1) − 0.06; three rounds of one verified row each.
    target = 1.75 - 0.1 + 0.93 + 0.94
    expected = target + 3 * (0.1 + 0.01 * 1) + 3 * 0.001
    parts = breakdown(trace, hand_profile())
    assert parts.target == pytest.approx(target) and parts.draft == 0.0
    assert predict(trace, hand_profile()) == pytest.approx(expected)
    assert predict(trace.to_dict(), hand_profile()) == pytest.approx(expected)
    assert predict_per_token(trace, hand_profile()) == pytest.approx(expected / 3)


def test_predict_a_speculative_trace_by_hand():
    # γ = 2, prompt of 3: round 0 accepts 1 of 2, round 1 accepts both, round 2 drafts one (the length limit).
    rounds = [RoundTrace(2, 1, 2, fed=5, tree_nodes=2), RoundTrace(2, 2, 3, fed=3, tree_nodes=2),
              RoundTrace(1, 0, 1, fed=2, tree_nodes=1)]
    # Draft forwards: (prompt 3, then 1), (1, 1), (2): 5 forwards, 8 tokens.
    trace = Trace(rounds, target_calls=3, target_tokens=10, draft_calls=5, draft_tokens=8, prefill_tokens=3)
    target = (2.5 - 0.1) + (1.75 - 0.06) + (1.5 - 0.03)  # t(5) at context 0, t(3) at 4, t(2) at 7
    draft = 0.275 + 2 * 0.225 + 2 * 0.2 + 0.02 * 5  # t(3), two first forwards of 1.5 on average, two later, sampling
    verify = 3 * 0.1 + 0.01 * (3 + 3 + 2)
    parts = breakdown(trace, hand_profile())
    assert (parts.target, parts.draft, parts.verify, parts.other) == pytest.approx((target, draft, verify, 0.003))
    assert predict(trace, hand_profile()) == pytest.approx(target + draft + verify + 0.003)


def test_a_draft_decoded_trace_is_priced_with_the_draft_model():
    trace = Trace([RoundTrace(0, 0, 1, fed=3), RoundTrace(0, 0, 1, fed=1)], draft_calls=2, draft_tokens=4,
                  prefill_tokens=3)
    parts = breakdown(trace, hand_profile())
    assert parts.target == 0.0 and parts.draft == pytest.approx(0.275 + 0.2)
    with pytest.raises(ConfigError, match="no draft model"):
        breakdown(Trace([RoundTrace(2, 0, 1, fed=5)], 1, 5, 2, 4, prefill_tokens=3),
                  HardwareProfile({"target": hand_profile().models["target"]}))


class Recording(ModelDefaults):
    """A CausalLM wrapper recording (new tokens, cached tokens) of every forward."""

    def __init__(self, inner):
        self.inner, self.calls = inner, []
        self.name, self.vocab_size = inner.name, inner.vocab_size

    @property
    def cache_length(self):
        return self.inner.cache_length

    def forward(self, tokens, n_logits=1, return_hidden=False, parents=None):
        self.calls.append((len(tokens), self.inner.cache_length))
        return self.inner.forward(tokens, n_logits, return_hidden, parents)

    def truncate(self, length):
        self.inner.truncate(length)

    def keep(self, positions):
        self.inner.keep(positions)

    def reset(self):
        self.inner.reset()


@pytest.mark.parametrize("method, paths, drafter", [("sd", 1, "model"), ("gbv", 3, "model"), ("sd", 1, "ngram"),
                                                    ("sd", 1, "hybrid")])
def test_the_forwards_a_trace_implies_are_the_forwards_the_engine_made(tiny_pair, method, paths, drafter):
    # Linear in k (so mean first-forward sizes are exact); the target's context slope checks its contexts exactly.
    target = ModelCost("T", [1, 2, 16], [1.0, 1.25, 4.75], context=8, context_slope=0.125)
    draft = ModelCost("D", [1, 2, 16], [0.5, 0.625, 2.375], context=8)
    profile = HardwareProfile({"target": target, "draft": draft}, Overheads(sample_row=0.03))
    t, d = Recording(tiny_pair["target"]), Recording(tiny_pair["partial"])
    prompt = [3, 4, 5, 6, 7] * 3 if drafter != "model" else list(range(3, 12))  # repeats for prompt lookup
    out = Engine(t, d).decode(prompt, DecodeConfig(method=method, gamma=3, paths=paths, max_new_tokens=25,
                                                   drafter=drafter))
    parts = breakdown(out.trace, profile)
    assert parts.target == pytest.approx(sum(target.forward_seconds(k, ctx) for k, ctx in t.calls))
    rows = sum(r.drafted * r.paths for r in out.trace.rounds if r.drafter == "model")
    assert parts.draft == pytest.approx(sum(draft.forward_seconds(k, 8) for k, _ in d.calls) + 0.03 * rows)
    assert len(d.calls) == out.trace.draft_calls and len(t.calls) == out.trace.target_calls
    expected_kinds = {"ngram", "model"} if drafter == "hybrid" else {drafter}  # each kind of round was priced
    assert {r.drafter for r in out.trace.rounds if r.drafted} == expected_kinds
    assert other_drafter_rounds([out.trace]) == (drafter != "model")


def test_profile_json_round_trip_and_schema_check(tmp_path):
    profile = hand_profile()
    loaded = HardwareProfile.load(profile.save(tmp_path / "p" / "profile.json"))
    assert loaded == profile
    (tmp_path / "bad.json").write_text(json.dumps({"schema": "other"}))
    with pytest.raises(ConfigError, match="not a verispec hardware profile"):
        HardwareProfile.load(tmp_path / "bad.json")


def test_accelerator_profile_is_flat_up_to_16_and_c_is_the_size_ratio():
    profile = accelerator_profile(1_000_000_000, 250_000_000, bytes_per_param=2, bandwidth=1e12, flops=1e14)
    target = profile.models["target"]
    assert profile.kind == KIND_MODELLED and "modelled" in profile.description
    assert all(target.f(k) == 1.0 for k in range(1, 17))
    assert target.forward_seconds(1, 0) == pytest.approx(2e-3)  # 2 GB at 1 TB/s
    assert target.forward_seconds(512, 0) == pytest.approx(2 * 1e9 * 512 / 1e14)  # the prompt: compute-bound
    assert cost_ratios(profile, 4) == pytest.approx((0.25, 1.0))
    # From a measured profile's model sizes: c = 200 / 800.
    assert cost_ratios(accelerator_like(hand_profile()), 4) == pytest.approx((0.25, 1.0))


def _record(method, index, rounds, prefill=1):
    trace = Trace(rounds, target_calls=len(rounds), target_tokens=sum(r.fed for r in rounds), prefill_tokens=prefill,
                  time_total=0.01 * len(rounds) * (1 + 2 * (method == "ar")))
    drafting = [r for r in rounds if r.drafted]
    trace.draft_calls = sum(r.drafted for r in drafting)
    trace.draft_tokens = prefill + 2 * (len(drafting) - 1) + sum(r.drafted - 1 for r in drafting)
    return {"method": method, "prompt_index": index, "prompt_id": str(index), "tokens": [0] * trace.generated,
            "trace": trace.to_dict()}


@pytest.fixture()
def bench_records():
    gamma = 3  # sd accepts every draft token: 4 tokens a round; ar makes one token a round
    ar = [_record("ar", i, [RoundTrace(0, 0, 1, fed=1)] + [RoundTrace(0, 0, 1, fed=1) for _ in range(11)])
          for i in range(3)]
    sd = [_record("sd", i, [RoundTrace(gamma, gamma, gamma + 1, fed=1 + gamma, tree_nodes=gamma)]
                  + [RoundTrace(gamma, gamma, gamma + 1, fed=1 + gamma, tree_nodes=gamma) for _ in range(2)])
          for i in range(3)]
    return ar + sd


def test_modelled_speedup_on_a_memory_bound_profile_equals_the_speedup_formula(bench_records):
    profile = accelerator_profile(1000, 250)
    rows = {r["method"]: r for r in modelled_speedup(bench_records, profile)}
    sd = [r for r in bench_records if r["method"] == "sd"]
    # f = 1 and c = 0.25: each round costs 1 + 3c target forwards and emits 4 tokens.
    assert rows["sd"]["modelled_speedup"] == pytest.approx(4 / 1.75)
    assert rows["sd"]["modelled_speedup"] == pytest.approx(theoretical_speedup(alpha_estimate(sd), 3, 0.25, 1.0))
    assert rows["ar"]["modelled_speedup"] == pytest.approx(1.0)
    assert rows["sd"]["measured_speedup"] == pytest.approx((1.08 / 36) / (0.09 / 36))
    assert rows["sd"]["modelled_seconds_per_token"] == pytest.approx(1.75 * 1000 * 2 / 4.8e12 / 4)


def _results_file(tmp_path, records):
    config = BenchConfig(methods=["ar", "sd"], gamma=3, models=ModelSpec(linear_backend="torch"))
    results = results_dict(config, records, 100)
    path = tmp_path / "results.json"
    path.write_text(json.dumps(results))
    return path


def test_report_adds_a_labelled_modelled_section_only_with_a_profile(tmp_path, bench_records, capsys):
    path = _results_file(tmp_path, bench_records)
    assert "Modelled" not in write_report(path)[0]
    accel = accelerator_profile(1000, 250).save(tmp_path / "accel.json")
    markdown = write_report(path, profile_path=accel)[0]
    section = markdown[markdown.index("## Modelled (accelerator profile)"):]
    assert "**Modelled, not measured.**" in section and "modelled / measured" not in section
    sd_row = next(line for line in section.splitlines() if line.startswith("| sd |"))
    assert f"| {4 / 1.75:.2f}x |" in sd_row  # the modelled speedup (and the formula at the profile's c, f)
    here = hand_profile()
    here.machine = {"platform": "TestOS"}  # the results' machine: the model is checked against the measurement
    assert main(["report", str(path), "--profile", str(here.save(tmp_path / "cpu.json"))]) == 0
    out = capsys.readouterr().out
    assert "## Modelled (measured profile) vs measured" in out and "| modelled / measured |" in out
    t1_run = one_token_target_seconds([r for r in bench_records if r["method"] == "ar"])
    assert (f"1-token target forwards (`ar`'s decode rounds) took {1e3 * t1_run:.{1 if t1_run >= 0.01 else 3}f} ms "
            f"on average, the profile's 1000.0 ms ({t1_run:.2f}x)") in out  # hand_profile: t(1) = 1 s
    assert "Warning" not in out
    here.models["target"].dtype = "bfloat16"
    assert "Warning: the profile was measured with bfloat16" in write_report(path, profile_path=here.save(
        tmp_path / "bf16.json"))[0]
    gpu = hand_profile()
    gpu.models["target"].device = "cuda"  # measured, but on another device: a prediction only
    markdown = write_report(path, profile_path=gpu.save(tmp_path / "gpu.json"))[0]
    assert "## Modelled (accelerator profile)" in markdown and "modelled / measured" not in markdown


def test_peers_are_priced_with_their_own_profile(tmp_path, bench_records):
    peers = [{**r, "method": "hf-generate"} for r in bench_records if r["method"] == "ar"]
    records = bench_records + peers
    fast, slow = accelerator_profile(1000, 250), accelerator_profile(2000, 500)  # twice the bytes: twice the time
    plain = {r["method"]: r for r in modelled_speedup(records, fast)}
    mixed = {r["method"]: r for r in modelled_speedup(records, fast, method_profiles={"hf-generate": slow})}
    per_token = {m: row["modelled_seconds_per_token"] for m, row in plain.items()}
    assert per_token["hf-generate"] == pytest.approx(per_token["ar"])
    assert mixed["hf-generate"]["modelled_seconds_per_token"] == pytest.approx(
        2 * plain["hf-generate"]["modelled_seconds_per_token"])
    assert mixed["hf-generate"]["modelled_speedup"] == pytest.approx(0.5)
    assert mixed["sd"] == plain["sd"]  # the engine's methods keep the main profile

    config = BenchConfig(methods=["ar", "sd", "hf-generate"], gamma=3, models=ModelSpec(linear_backend="onednn"))
    path = _results_file(tmp_path, records)
    results = json.loads(path.read_text())
    results["config"] = config.to_dict()
    path.write_text(json.dumps(results))
    here, peer = hand_profile(), hand_profile()
    here.machine = peer.machine = {"platform": "TestOS"}
    here.models["target"].linear_backend = "onednn"
    main_file, peer_file = here.save(tmp_path / "onednn.json"), peer.save(tmp_path / "torch.json")
    markdown = write_report(path, profile_path=main_file)[0]
    assert "priced with this profile: pass a profile of that path" in markdown
    markdown = write_report(path, profile_path=main_file, peer_profile_path=peer_file)[0]
    assert "The transformers peers (hf-generate) are priced with a second profile" in markdown
    assert "Warning" not in markdown
    with pytest.raises(ConfigError, match="pass --profile too"):
        write_report(path, peer_profile_path=peer_file)


def test_modelled_theory_uses_each_methods_own_gamma(tmp_path, bench_records):
    records = [{**r, "method": "sd:gamma=1"} if r["method"] == "sd" else r for r in bench_records]
    config = BenchConfig(methods=["ar", "sd:gamma=1"], gamma=3, models=ModelSpec(linear_backend="torch"))
    path = _results_file(tmp_path, records)
    results = json.loads(path.read_text())
    results["config"] = config.to_dict()
    results["aggregate"] = summarize(records, config.methods, "ar", {"ar": 3, "sd:gamma=1": 1}, 100, 0)
    path.write_text(json.dumps(results))
    accel = accelerator_profile(1000, 250)
    alpha = alpha_estimate([r for r in records if r["method"] == "sd:gamma=1"])
    expected = theoretical_speedup(alpha, 1, *cost_ratios(accel, 1))
    wrong = theoretical_speedup(alpha, 3, *cost_ratios(accel, 3))
    assert f"{expected:.2f}" != f"{wrong:.2f}"  # the check can tell γ = 1 from the run's γ = 3
    section = write_report(path, profile_path=accel.save(tmp_path / "accel.json"))[0].split("## Modelled")[1]
    row = next(line for line in section.splitlines() if line.startswith("| sd:gamma=1 |"))
    assert f"| {expected:.2f}x |" in row
