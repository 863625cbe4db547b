"""The speed-quality plot: the Pareto front by hand, PNGs from one or several runs, and the report's quality table."""

from __future__ import annotations

import json

import pytest

from tests.bench.results_dicts import results_dict
from verispec.bench.metrics import summarize
from verispec.bench.pareto import Point, pareto_front, pareto_points, plot_pareto
from verispec.bench.report import QUALITY_COLUMNS, write_report
from verispec.bench.runner import BenchConfig
from verispec.bench.tables import format_table
from verispec.cli import main
from verispec.errors import ConfigError

PNG = b"\x89PNG\r\n\x1a\n"


def _p(speed, quality, label="m"):
    return Point(label, speed, None, quality, None)


def test_pareto_front_by_hand():
    a, b, c, d = _p(1.0, 1.0, "a"), _p(2.0, 0.8, "b"), _p(1.5, 0.7, "c"), _p(0.5, 0.9, "d")
    assert pareto_front([a, b, c, d]) == [a, b]  # c is beaten by b, d by a
    # Lower is better (NLL): c has the lowest value and beats a and d (it is also faster); b is the fastest.
    assert pareto_front([a, b, c, d], higher_is_better=False) == [c, b]
    assert pareto_front([a, a]) == [a, a]  # equal points do not dominate each other


def _record(method, index, seconds, drafted, accepted, nll, rouge, reference=None):
    rounds = [dict(drafted=drafted, accepted=accepted, emitted=accepted + 1, fed=drafted + 1, time_draft=0.001,
                   time_decode=0.01, time_verify=0.0) for _ in range(4)]
    generated = sum(r["emitted"] for r in rounds)
    trace = dict(rounds=rounds, generated=generated, time_total=seconds, target_calls=4, draft_calls=4 * drafted,
                 time_draft=0.004, time_target=0.04, time_verify=0.0)
    quality = dict(nll=nll * generated, tokens=generated, rouge_l_vs_ar=rouge, rouge_l_vs_reference=reference)
    flops = dict(total=1e9 * generated, prefill=0)
    return dict(method=method, prompt_index=index, prompt_id=str(index), tokens=list(range(generated)), trace=trace,
                quality=quality, flops=flops)


def _results(sd_seconds=0.5, sd_rouge=1.0):
    records = [r for i in range(5) for r in (
        _record("ar", i, 1.0 + 0.1 * i, 0, 0, 2.0 + 0.1 * i, 1.0, 0.5),
        _record("sd", i, sd_seconds + 0.02 * i, 3, 2, 2.0 + 0.1 * i, sd_rouge - 0.05 * i, 0.5),
        _record("draft", i, 0.3, 0, 0, 3.0 + 0.2 * i, 0.4 + 0.02 * i))]
    config = BenchConfig(methods=["ar", "sd", "draft"], gamma=3)
    return results_dict(config, records, 300)


def test_points_carry_both_intervals_and_plot_is_a_png(tmp_path):
    results = _results()
    points = {p.label: p for p in pareto_points([("", results)])}
    assert set(points) == {"ar", "sd", "draft"}
    sd = points["sd"]
    assert sd.speed == results["aggregate"][1]["speedup"] and sd.speed_ci[0] <= sd.speed <= sd.speed_ci[1]
    assert sd.quality == pytest.approx(0.9) and sd.quality_ci[0] <= 0.9 <= sd.quality_ci[1]
    nll = {p.label: p.quality for p in pareto_points([("", results)], "nll_per_token")}
    assert nll["draft"] == pytest.approx(3.4) and nll["ar"] == pytest.approx(2.2)
    path = plot_pareto(results, tmp_path / "sub" / "pareto.png")
    data = path.read_bytes()
    assert data[:8] == PNG and len(data) > 5000


def test_several_runs_are_labelled(tmp_path):
    runs = [("tau0.3", _results(0.4, 0.8)), ("tau0.7", _results(0.6, 1.0))]
    labels = [p.label for p in pareto_points(runs)]
    assert labels == ["tau0.3: ar", "tau0.3: sd", "tau0.3: draft", "tau0.7: ar", "tau0.7: sd", "tau0.7: draft"]
    assert plot_pareto(runs, tmp_path / "two.png", y="ppl").read_bytes()[:8] == PNG


def test_bad_axis_or_no_points_is_a_config_error(tmp_path):
    with pytest.raises(ConfigError, match="unknown quality axis"):
        pareto_points([("", _results())], "bleu")
    results = _results()
    for row in results["aggregate"]:
        row["rouge_l_vs_ar"] = None
    with pytest.raises(ConfigError, match="--quality"):
        plot_pareto(results, tmp_path / "none.png")


def test_report_adds_the_quality_table_and_the_pareto_plot(tmp_path, monkeypatch):
    from verispec.bench import pareto as pareto_module

    axes = []
    original = pareto_module.plot_pareto
    monkeypatch.setattr(pareto_module, "plot_pareto", lambda r, p, y: axes.append(y) or original(r, p, y))
    results = _results()
    path = tmp_path / "results.json"
    path.write_text(json.dumps(dict(results, config=dict(results["config"], temperature=0.7))))
    write_report(path)
    path.write_text(json.dumps(results))
    markdown, md_path, _ = write_report(path)
    assert axes == ["nll_per_token", "rouge_l_vs_ar"]  # ROUGE-L vs one ar sample only at temperature 0
    assert "## Quality and cost" in markdown and format_table(results["aggregate"], QUALITY_COLUMNS) in markdown
    draft_row = next(line for line in markdown.splitlines() if line.startswith("| draft | 5 | ")
                     and "x [" in line.split("|")[3] and line.split("|")[4].startswith(" 3.400 ["))
    assert "0.440 [" in draft_row and ", n = 5 |" in draft_row and "| 1 | 1 |" in draft_row  # 1 GFLOP per token
    assert "95% percentile bootstrap over prompts" in markdown
    pareto = tmp_path / "results_pareto.png"
    assert pareto.read_bytes()[:8] == PNG and "![speed vs quality](results_pareto.png)" in md_path.read_text()


def test_pareto_cli(tmp_path, capsys):
    files = []
    for name, seconds in (("a", 0.4), ("b", 0.6)):
        files.append(tmp_path / f"{name}.json")
        files[-1].write_text(json.dumps(_results(seconds)))
    out = tmp_path / "p.png"
    assert main(["pareto", *map(str, files), "--out", str(out), "--y", "nll_per_token"]) == 0
    assert out.read_bytes()[:8] == PNG and str(out) in capsys.readouterr().out
    assert main(["pareto", str(tmp_path / "missing.json")]) == 2
    assert "cannot read results file" in capsys.readouterr().err


def test_sweep_methods_list_the_rules_over_their_knobs():
    from verispec.bench.pareto import SWEEPS, sweep_methods

    methods = sweep_methods(["typical", "fly"])
    assert methods[:4] == ["ar", "sd", "bv", "draft"]
    assert methods[4:] == SWEEPS["typical"][1:] + SWEEPS["fly"][1:]
    assert sweep_methods(["margin"], lossless_ends=True)[4] == "margin:delta=0"
    config = BenchConfig(methods=sweep_methods())  # every label parses, every knob is in range
    assert len(config.methods) == 4 + sum(len(v) - 1 for v in SWEEPS.values())
    with pytest.raises(ConfigError, match="no sweep for nope"):
        sweep_methods(["nope"])


def test_every_lossless_end_of_the_sweeps_is_the_lossless_end():
    """The first value of each sweep is the knob setting that the engine tests prove equal to `sd`."""
    import math

    from verispec.bench.pareto import SWEEPS
    from verispec.variants import parse_method
    from verispec.verify.relaxed import RelaxedKnobs

    ends = {"typical": {"typical_epsilon": 1.0, "typical_delta": math.inf}, "margin": {"margin_delta": 0.0},
            "fuzzy": {"fuzzy_threshold": 0.0}}
    for rule, labels in SWEEPS.items():
        overrides = parse_method(labels[0], {rule}).overrides
        if rule == "fly":
            assert overrides["fly_entropy"] >= math.log(RelaxedKnobs().fly_top_k)
        else:
            assert overrides == ends[rule]


def test_fronts_one_per_axis_with_tables(tmp_path):
    from verispec.bench.pareto import write_fronts

    results = _results()
    for record in results["records"]:
        record["quality"]["passed"] = {"ar": 1.0, "sd": 1.0, "draft": 0.0}[record["method"]]
    config = BenchConfig(methods=["ar", "sd", "draft"], gamma=3)
    results["aggregate"] = summarize(results["records"], config.methods, "ar", config.gamma, 300, 0)
    rows = {row["method"]: row for row in results["aggregate"]}
    assert rows["sd"]["leak_tv_out"] == 0.0 and rows["ar"]["leak_tv_out"] == 0.0  # lossless: no leak
    assert rows["draft"]["leak_tv_out"] is None  # lossy, but no position records a leak
    markdown, paths = write_fronts([("", results)], tmp_path)
    names = {p.name for p in paths}
    assert {"front_rouge_l_vs_ar.png", "front_nll_per_token.png", "front_pass_at_1.png"} <= names
    assert all(p.read_bytes()[:8] == PNG for p in paths)
    assert "### HumanEval pass@1 by execution (higher is better)" in markdown
    section = markdown.split("### HumanEval pass@1")[1].split("###")[0]
    # sd is the fastest here and as good as ar on pass@1: it alone is the front; draft (pass@1 0) is not on it.
    assert "Front, slowest to fastest: sd (" in section and "→" not in section
    assert "| sd |" in section and section.split("| draft |")[1].split("\n")[0].endswith("|  |")
    with pytest.raises(ConfigError, match="--quality"):
        write_fronts([("", {**results, "aggregate": [{"method": "ar", "speedup": 1.0}]})], tmp_path)


def test_cli_fronts_and_sweep(tmp_path, capsys, monkeypatch):
    from verispec.bench.pareto import REFERENCES, SWEEPS

    path = tmp_path / "results.json"
    path.write_text(json.dumps(_results()))
    assert main(["pareto", str(path), "--fronts", str(tmp_path / "fronts")]) == 0
    assert (tmp_path / "fronts" / "fronts.md").read_text().startswith("## Speedup per token against quality")
    benched = []
    monkeypatch.setattr("verispec.bench.runner.run_bench",
                        lambda config, out, **kw: benched.append(config) or {"records": [], "aggregate": []})
    assert main(["bench", "--sweep", "margin", "fuzzy", "--out", str(tmp_path / "sweep.json")]) == 0
    assert benched[0].methods == [*REFERENCES, *SWEEPS["margin"][1:], *SWEEPS["fuzzy"][1:]]
    assert main(["bench", "--sweep", "nope", "--out", str(tmp_path / "nope.json")]) == 2
    assert "no sweep for nope" in capsys.readouterr().err


def test_the_speed_axis_can_be_the_time_per_answer():
    from verispec.bench.pareto import front_table

    results = _results(sd_seconds=1.5)  # sd writes 12 tokens where ar writes 4, in more time per prompt
    per_token = {p.label: p for p in pareto_points([("", results)], "nll_per_token")}
    per_answer = {p.label: p for p in pareto_points([("", results)], "nll_per_token", x="answer_speedup")}
    ar_seconds, sd_seconds = sum(1.0 + 0.1 * i for i in range(5)), sum(1.5 + 0.02 * i for i in range(5))
    assert per_token["sd"].speed > 2.0
    assert per_answer["sd"].speed == pytest.approx(ar_seconds / sd_seconds) and per_answer["sd"].speed < 1.0
    assert "| method | speedup per answer [95% CI] |" in front_table(list(per_answer.values()), "nll_per_token",
                                                                      "answer_speedup")
    with pytest.raises(ConfigError, match="speed axis"):
        pareto_points([("", results)], "nll_per_token", x="tokens")


def test_a_report_with_its_plot_elsewhere_writes_nothing_beside_the_results(tmp_path):
    from verispec.bench.archive import write_archive

    results = _results()
    results["records"] = [{**record, "prompt": "x"} for record in results["records"]]
    kept = tmp_path / "kept"
    write_archive(results, kept / "lossy.json.gz")
    out = tmp_path / "out"
    _, md_path, plot_path = write_report(kept / "lossy.json.gz", out / "lossy.md", out / "lossy.png")
    assert sorted(p.name for p in kept.iterdir()) == ["lossy.json.gz"]
    assert (out / "lossy_pareto.png").read_bytes()[:8] == PNG
    assert "![speed vs quality](lossy_pareto.png)" in md_path.read_text() and plot_path == out / "lossy.png"
