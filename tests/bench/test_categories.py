"""The per-category section of a bench report: speedups paired within each category, known answers."""

from __future__ import annotations

from tests.bench.results_dicts import results_dict
from verispec.bench.categories import by_category, render_by_category
from verispec.bench.report import render_markdown
from verispec.bench.runner import BenchConfig


def _record(method, index, category, seconds, calls, tokens=8):
    trace = dict(rounds=[], generated=tokens, time_total=seconds, target_calls=calls, draft_calls=0,
                 time_draft=0.0, time_target=seconds, time_verify=0.0)
    return dict(method=method, prompt_index=index, prompt_id=str(index), category=category,
                tokens=list(range(tokens)), trace=trace)


def _records():
    # rag prompts 0-1: lookup halves the time (4 tokens per target call); math prompts 2-3: it is 25% slower
    records = []
    for i, category in enumerate(["rag", "rag", "math", "math"]):
        records.append(_record("ar", i, category, 1.0 + i, 8))
        fast = category == "rag"
        records.append(_record("sd:drafter=ngram", i, category, (1.0 + i) * (0.5 if fast else 1.25), 2 if fast else 8))
    return records


def test_each_category_gets_its_own_paired_speedup_and_block_efficiency():
    table = by_category(_records(), ["ar", "sd:drafter=ngram"], "ar", resamples=200)
    assert list(table) == ["rag", "math"]
    rag, math = table["rag"]["sd:drafter=ngram"], table["math"]["sd:drafter=ngram"]
    assert rag["prompts"] == 2 and abs(rag["speedup"] - 2.0) < 1e-9 and rag["tokens_per_target_call"] == 4.0
    assert abs(math["speedup"] - 0.8) < 1e-9 and math["tokens_per_target_call"] == 1.0
    assert table["math"]["ar"]["speedup"] == 1.0


def test_the_report_has_the_section_only_for_several_categories():
    config = BenchConfig(methods=["ar", "sd:drafter=ngram"], gamma=4)
    results = results_dict(config, _records(), 200)
    section = render_by_category(results)
    assert "rag (n = 2)" in section and "math (n = 2)" in section
    assert "| sd:drafter=ngram | 2.00x [2.00, 2.00], 4.00 | 0.80x [0.80, 0.80], 1.00 |" in section
    assert section in render_markdown(results)
    one = results_dict(config, [r for r in _records() if r["category"] == "rag"], 200)
    assert render_by_category(one) == "" and "## By category" not in render_markdown(one)
