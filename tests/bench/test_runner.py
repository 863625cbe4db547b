"""The runner: methods interleaved prompt by prompt, warm-up excluded, one JSON with everything; the CLI presets."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest

from verispec import Decoder
from verispec.bench import runner
from verispec.bench.compare import CompareConfig, run_compare
from verispec.bench.runner import SCHEMA, BenchConfig, run_bench
from verispec.cli import build_parser, main
from verispec.errors import ConfigError
from verispec.options import config_from_args
from verispec.prompt_sets import Prompt

PROMPTS = [Prompt("a", "def add(a, b):", "code"), Prompt("b", "hello there", "chat"), Prompt("c", "one two three")]
SD = "sd:adaptive_gamma=false"  # a fixed γ, as hf-assisted drafts: the same rounds at T = 0
METHODS = ["ar", SD, "hf-assisted"]


@pytest.fixture(scope="module")
def decoder(tiny_pair):
    return Decoder(tiny_pair["target"], tiny_pair["partial"])


@pytest.fixture(scope="module")
def calls_and_result(decoder, tmp_path_factory):
    """Run the bench once, logging every decode the runner makes."""
    calls = []
    original = runner.decode_one

    def logged(decoder, config, method, prompt, index, max_new_tokens=None, peer_decoder=None):
        calls.append((method, prompt.id, max_new_tokens))
        return original(decoder, config, method, prompt, index, max_new_tokens, peer_decoder)

    out = tmp_path_factory.mktemp("bench") / "sub" / "results.json"
    config = BenchConfig(methods=METHODS, max_new_tokens=10, gamma=3, warmup_tokens=2, bootstrap_resamples=200)
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runner, "decode_one", logged)
        result = run_bench(config, out, decoder=decoder, prompts=PROMPTS, progress=False)
    return config, calls, result, out


def test_warm_up_first_then_methods_interleaved_prompt_by_prompt(calls_and_result):
    config, calls, result, _ = calls_and_result
    assert calls[:3] == [(m, "a", 2) for m in METHODS]  # one short warm-up per method, excluded from the records
    assert calls[3:] == [(m, p.id, None) for p in PROMPTS for m in METHODS]
    records = result["records"]
    assert [(r["prompt_id"], r["method"]) for r in records] == [(p.id, m) for p in PROMPTS for m in METHODS]
    assert [r["order"] for r in records] == list(range(9))


def test_results_json_schema(calls_and_result):
    config, _, result, out = calls_and_result
    on_disk = json.loads(out.read_text())
    assert on_disk == json.loads(json.dumps(result))
    assert set(on_disk) == {"schema", "config", "machine", "versions", "git_commit", "git_dirty", "started",
                            "wall_seconds", "runs", "aggregate", "records"}
    assert len(on_disk["runs"]) == 1 and on_disk["runs"][0]["prompts"] == [0, 1, 2]
    assert {r["run"] for r in on_disk["records"]} == {0}
    assert on_disk["schema"] == SCHEMA and on_disk["config"] == config.to_dict()
    assert {"platform", "processor", "cpu_threads", "torch", "transformers"} <= set(on_disk["machine"])
    assert {"python", "verispec", "torch", "transformers"} <= set(on_disk["versions"])
    record = on_disk["records"][1]
    assert {"prompt_index", "prompt_id", "category", "prompt", "method", "text", "tokens", "trace", "config"} <= set(
        record)
    assert record["category"] == "code" and record["trace"]["generated"] == len(record["tokens"])
    assert [row["method"] for row in on_disk["aggregate"]] == METHODS


def _seconds_per_token(traces):
    return sum(t["time_total"] for t in traces) / sum(t["generated"] for t in traces)


def test_greedy_methods_agree_and_speculative_ones_are_traced(calls_and_result):
    _, _, result, _ = calls_and_result
    rows = {row["method"]: row for row in result["aggregate"]}
    assert rows["ar"]["speedup"] == 1.0
    for method in (SD, "hf-assisted"):
        assert rows[method]["same_tokens_as_baseline"] == 1.0  # lossless at temperature 0
        assert rows[method]["tokens_per_target_call"] > 1.0 and rows[method]["acceptance_rate"] is not None
        # Time per token of ar over the method's, summed over the same prompts; the interval resamples prompts,
        # so it lies within the extreme per-prompt rates.
        base = [r["trace"] for r in result["records"] if r["method"] == "ar"]
        mine = [r["trace"] for r in result["records"] if r["method"] == method]
        assert rows[method]["speedup"] == pytest.approx(_seconds_per_token(base) / _seconds_per_token(mine))
        lo, hi = rows[method]["speedup_ci95"]
        base_rates = [_seconds_per_token([t]) for t in base]
        rates = [_seconds_per_token([t]) for t in mine]
        assert min(base_rates) / max(rates) <= lo <= hi <= max(base_rates) / min(rates)
    assert rows[SD]["tokens_per_target_call"] == pytest.approx(rows["hf-assisted"]["tokens_per_target_call"])


@pytest.mark.parametrize("kwargs, message", [
    ({"methods": ["ar", "beam"]}, "unknown method"),
    ({"methods": ["ar", "ar"]}, "twice"),
    ({"methods": ["sd"], "baseline": "ar"}, "baseline"),
    ({"gamma": 0}, "gamma"),
    ({"temperature": -1.0}, "temperature"),
    ({"warmup_tokens": -1}, "warmup_tokens"),
])
def test_bad_config_is_a_config_error(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        BenchConfig(**kwargs)


def test_baseline_defaults_to_ar_else_first():
    assert BenchConfig(methods=["sd", "ar"]).baseline_method == "ar"
    assert BenchConfig(methods=["sd", "hf-assisted"]).baseline_method == "sd"


def test_cli_bench_defaults_come_from_the_dataclass_and_options_reach_the_run(tmp_path, monkeypatch, capsys):
    args = build_parser().parse_args(["bench"])
    assert config_from_args(BenchConfig, args) == BenchConfig()
    benched = []
    monkeypatch.setattr("verispec.bench.runner.run_bench",
                        lambda config, out, **kw: benched.append((config, out)) or {"records": [], "aggregate": []})
    out = str(tmp_path / "r.json")
    assert main(["bench", "--prompts", "mt-bench", "--category", "coding", "math", "--limit", "5", "--subset-seed",
                 "3", "--no-chat-template", "--methods", "sd", "ar", "--baseline", "sd", "--out", out]) == 0
    assert benched == [(BenchConfig(prompts="mt-bench", category=["coding", "math"], limit=5, subset_seed=3,
                                    chat_template=False, methods=["sd", "ar"], baseline="sd"), out)]
    assert "baseline sd" in capsys.readouterr().out


def test_cli_bench_user_errors_exit_2(capsys):
    assert main(["bench", "--methods", "ar", "beam"]) == 2
    assert "unknown method" in capsys.readouterr().err
    assert main(["bench", "--prompts", "/nonexistent.jsonl"]) == 2
    assert "prompt file not found" in capsys.readouterr().err


def test_compare_is_a_preset_with_its_old_table(decoder, tmp_path):
    config = CompareConfig(prompts=["hello", "world"], max_new_tokens=6, warmup_tokens=0)
    result = run_compare(config, tmp_path / "compare.json", progress=False, decoder=decoder)
    assert json.loads((tmp_path / "compare.json").read_text())["schema"] == SCHEMA
    assert [(r["prompt"], r["method"]) for r in result["records"]] == [
        ("hello", "ar"), ("hello", "sd"), ("world", "ar"), ("world", "sd")]
    from verispec.bench.compare import format_table

    table = format_table(result["aggregate"])
    assert table.splitlines()[0] == ("| method | tokens | tokens/s | ms/token | speedup | acceptance | "
                                     "tokens/target call |")
    assert table.splitlines()[2].startswith("| ar | ") and "1.00x" in table.splitlines()[2]


def test_method_variants_run_with_their_own_settings(decoder):
    from verispec.errors import ConfigError
    from verispec.variants import parse_method

    methods = ["ar", "sd:gamma=1", "sd:gamma=3", "gbv:paths=2,gamma=2"]
    config = BenchConfig(methods=methods, max_new_tokens=8, warmup_tokens=0, bootstrap_resamples=50,
                         compare_to="sd:gamma=1")
    result = run_bench(config, None, decoder=decoder, prompts=PROMPTS[:2], progress=False)
    by_method = {m: [r for r in result["records"] if r["method"] == m] for m in methods}
    assert all(r["config"]["gamma"] == 1 for r in by_method["sd:gamma=1"])
    assert all(max(x["drafted"] for x in r["trace"]["rounds"]) <= 3 for r in by_method["sd:gamma=3"])
    assert all(r["config"]["paths"] == 2 for r in by_method["gbv:paths=2,gamma=2"])
    rows = {row["method"]: row for row in result["aggregate"]}
    assert "speedup_vs_sd:gamma=1" in rows["ar"]
    assert parse_method("sprinter:tau=0.3,cap=8", {"sprinter"}).overrides == {"tau": 0.3, "cap": 8}
    for bad in ["sd:gamma", "sd:beta=2", "sd:gamma=x", "zz"]:
        with pytest.raises(ConfigError):
            parse_method(bad, {"sd"})


def _logged_run(decoder, config, out, prompts, resume):
    """Run the bench; return (result, the (method, prompt id) of every measured decode)."""
    calls = []
    original = runner.decode_one

    def logged(decoder, config, method, prompt, index, max_new_tokens=None, peer_decoder=None):
        if max_new_tokens is None:
            calls.append((method, prompt.id))
        return original(decoder, config, method, prompt, index, max_new_tokens, peer_decoder)

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(runner, "decode_one", logged)
        result = run_bench(config, out, decoder=decoder, prompts=prompts, progress=False, resume=resume)
    return result, calls


def test_resume_runs_only_the_missing_prompts_and_keeps_the_rest(decoder, tmp_path):
    out = tmp_path / "r.json"
    config = BenchConfig(methods=["ar", "sd"], max_new_tokens=6, warmup_tokens=1, bootstrap_resamples=50, limit=2)
    first, calls = _logged_run(decoder, config, out, PROMPTS[:2], resume=True)  # no file yet: a fresh run
    assert calls == [(m, p) for p in "ab" for m in ("ar", "sd")]
    grown = replace(config, limit=3)  # the limit may grow on resume
    second, calls = _logged_run(decoder, grown, out, PROMPTS, resume=True)
    assert calls == [("ar", "c"), ("sd", "c")]
    assert second["records"][:4] == first["records"]
    assert [(r["prompt_id"], r["run"], r["order"]) for r in second["records"][4:]] == [("c", 1, 4), ("c", 1, 5)]
    assert [run["prompts"] for run in second["runs"]] == [[0, 1], [2]]
    assert json.loads(out.read_text()) == json.loads(json.dumps(second))
    assert second["aggregate"][0]["prompts"] == 3
    third, calls = _logged_run(decoder, grown, out, PROMPTS, resume=True)  # nothing left: nothing decoded
    assert calls == [] and third["records"] == second["records"] and len(third["runs"]) == 2
    fresh, calls = _logged_run(decoder, grown, out, PROMPTS, resume=False)  # without resume: start over
    assert len(calls) == 6 and len(fresh["runs"]) == 1


def test_resume_reruns_an_incomplete_prompt(decoder, tmp_path):
    out = tmp_path / "r.json"
    config = BenchConfig(methods=["ar", "sd"], max_new_tokens=5, warmup_tokens=0, bootstrap_resamples=50)
    result, _ = _logged_run(decoder, config, out, PROMPTS[:2], resume=False)
    result["records"] = result["records"][:3]  # as if stopped inside prompt "b"
    out.write_text(json.dumps(result))
    resumed, calls = _logged_run(decoder, config, out, PROMPTS[:2], resume=True)
    assert calls == [("ar", "b"), ("sd", "b")]
    assert [(r["prompt_id"], r["method"]) for r in resumed["records"]] == [
        ("a", "ar"), ("a", "sd"), ("b", "ar"), ("b", "sd")]


@pytest.mark.parametrize("change, message", [
    ({"max_new_tokens": 7}, "max_new_tokens: 5 there, 7 now"),
    ({"methods": ["ar"]}, "methods"),
    ({"temperature": 1.0}, "temperature"),
])
def test_resume_refuses_other_settings(decoder, tmp_path, change, message):
    out = tmp_path / "r.json"
    config = BenchConfig(methods=["ar", "sd"], max_new_tokens=5, warmup_tokens=0, bootstrap_resamples=50)
    run_bench(config, out, decoder=decoder, prompts=PROMPTS[:2], progress=False)
    with pytest.raises(ConfigError, match=message):
        run_bench(replace(config, **change), out, decoder=decoder, prompts=PROMPTS[:2],
                  progress=False, resume=True)


def test_resume_refuses_other_prompts_or_a_foreign_file(decoder, tmp_path):
    out = tmp_path / "r.json"
    config = BenchConfig(methods=["ar"], max_new_tokens=4, warmup_tokens=0, bootstrap_resamples=50)
    run_bench(config, out, decoder=decoder, prompts=PROMPTS[:2], progress=False)
    with pytest.raises(ConfigError, match="its prompt 1 is 'a', now it is 'b'"):
        run_bench(config, out, decoder=decoder, prompts=PROMPTS[1:], progress=False, resume=True)
    with pytest.raises(ConfigError, match="raise --limit"):
        run_bench(config, out, decoder=decoder, prompts=PROMPTS[:1], progress=False, resume=True)
    out.write_text("{not json")
    with pytest.raises(ConfigError, match="cannot resume"):
        run_bench(config, out, decoder=decoder, prompts=PROMPTS[:1], progress=False, resume=True)
    out.write_text(json.dumps({"schema": "other"}))
    with pytest.raises(ConfigError, match="not a verispec.bench/1 results file"):
        run_bench(config, out, decoder=decoder, prompts=PROMPTS[:1], progress=False, resume=True)
