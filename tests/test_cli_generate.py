"""`verispec generate` end to end on tiny model folders: the text, the JSON, and what the trace says happened."""

from __future__ import annotations

import contextlib
import io
import json

import pytest

from verispec.cli import main
from verispec.engine import MULTIPATH_PATHS

PROMPT = "def add(a, b):"
NEW = 16  # new tokens per decode
GAMMA = 3
METHODS = {  # label -> the options that select it
    "ar": ["--method", "ar"],
    "sd": ["--method", "sd", "--gamma", str(GAMMA)],
    "bv": ["--method", "bv", "--gamma", str(GAMMA)],
    "gbv": ["--method", "gbv", "--gamma", str(GAMMA), "--paths", "3"],
    "gbv-sampled": ["--method", "gbv", "--gamma", str(GAMMA), "--paths", "3", "--temperature", "1", "--seed", "5"],
}

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def folders(tiny_pair_folders):
    """The tiny pair's folders (tests/conftest.py: a float64 target, a perturbed copy as the draft) and the tokenizer
    as the command loads it from them (transformers picks the tokenizer class from the model type, so the saved
    character tokenizer comes back as a Qwen2 one: the expectations below use what the command really uses)."""
    from transformers import AutoTokenizer

    return {**tiny_pair_folders, "tokenizer": AutoTokenizer.from_pretrained(tiny_pair_folders["target"])}


def run_cli(folders, *options: str) -> tuple[int, str, str]:
    """Run `verispec generate PROMPT` on the tiny pair; return (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    argv = ["generate", PROMPT, "--target", folders["target"], "--draft", folders["draft"], "--dtype", "float64",
            "--max-new-tokens", str(NEW), *options]
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(argv)
    return status, out.getvalue(), err.getvalue()


@pytest.fixture(scope="module")
def runs(folders):
    """The --json output of each method (one decode each, shared by the tests below)."""
    results = {}
    for label, options in METHODS.items():
        status, out, err = run_cli(folders, "--json", *options)
        assert status == 0, err
        results[label] = json.loads(out)
    return results


def test_json_has_the_text_tokens_config_and_trace(runs, folders):
    tokenizer = folders["tokenizer"]
    for label, data in runs.items():
        assert set(data) == {"text", "tokens", "prompt_tokens", "stopped_at_eos", "config", "trace",
                             "linear_kernels"}, label
        assert "float64" in data["linear_kernels"]["target"], data["linear_kernels"]  # tiny float64: no int8
        assert len(data["tokens"]) == NEW or (data["stopped_at_eos"] and data["tokens"][-1] == tokenizer.eos_token_id)
        assert data["text"] == tokenizer.decode(data["tokens"], skip_special_tokens=True)
        # The tokenizer has no chat template: the prompt is encoded as raw text.
        assert data["prompt_tokens"] == len(tokenizer(PROMPT, add_special_tokens=False)["input_ids"])
        config = data["config"]
        assert config["method"] == label.split("-")[0] and config["max_new_tokens"] == NEW
        assert config["sampling"]["temperature"] == (1.0 if label.endswith("sampled") else 0.0)
    assert runs["gbv"]["config"]["paths"] == 3 and runs["bv"]["config"]["paths"] == 1
    assert runs["sd"]["config"]["gamma"] == GAMMA


def test_greedy_speculative_methods_emit_ar_tokens(runs):
    for label in ("sd", "bv", "gbv"):
        assert runs[label]["tokens"] == runs["ar"]["tokens"], label
    # The pair really drafted and disagreed at times, so the equality above is not the trivial all-accepted case.
    sd = runs["sd"]["trace"]
    assert 0 < sum(r["accepted"] for r in sd["rounds"]) < sum(r["drafted"] for r in sd["rounds"])


@pytest.mark.parametrize("label", list(METHODS))
def test_trace_counts_are_consistent(runs, label):
    data = runs[label]
    trace, rounds = data["trace"], data["trace"]["rounds"]
    speculative = label != "ar"
    paths = 3 if label.startswith("gbv") else 1
    assert sum(r["emitted"] for r in rounds) == trace["generated"] == len(data["tokens"])
    assert trace["target_calls"] == len(rounds) >= 1  # one target pass per round
    assert trace["target_tokens"] == sum(r["fed"] for r in rounds)
    assert trace["prefill_tokens"] == data["prompt_tokens"]
    assert rounds[0]["fed"] == data["prompt_tokens"] + rounds[0]["tree_nodes"]  # the prompt, then the block
    for r in rounds:
        assert 0 <= r["accepted"] <= r["drafted"] <= (GAMMA if speculative else 0)
        assert 1 <= r["emitted"] <= r["accepted"] + 1
        assert r["paths"] == paths
        assert r["drafted"] <= r["tree_nodes"] <= paths * r["drafted"]
    # The draft makes one forward per drafted position (all K paths in one batch); ar never runs it.
    assert trace["draft_calls"] == sum(r["drafted"] for r in rounds)
    assert (trace["draft_calls"] > 0) == speculative
    drafted = sum(r["drafted"] for r in rounds)
    accepted = sum(r["accepted"] for r in rounds)
    assert trace["acceptance_rate"] == (pytest.approx(accepted / drafted) if speculative else None)
    assert trace["tokens_per_target_call"] == pytest.approx(len(data["tokens"]) / len(rounds))


def test_sampled_gbv_verifies_a_branching_tree(runs):
    rounds = runs["gbv-sampled"]["trace"]["rounds"]
    assert any(r["tree_nodes"] > r["drafted"] for r in rounds)  # at T = 1 the 3 paths differ
    assert all(r["paths"] == 3 for r in rounds)


def test_text_output_is_the_generated_text_and_stats_go_to_stderr(folders, runs):
    status, out, err = run_cli(folders, *METHODS["sd"])
    assert status == 0
    assert out == runs["sd"]["text"] + "\n"  # the same decode as the --json run, printed as text
    trace = runs["sd"]["trace"]
    stats = err.splitlines()[-1]  # after the loading progress bars
    assert stats.startswith(f"[sd] {trace['generated']} tokens in ")
    assert stats.endswith(f"acceptance {trace['acceptance_rate']:.3f}, {trace['tokens_per_target_call']:.2f} tokens/"
                          f"target call")


def test_prompt_from_stdin_and_without_chat_template(folders, runs, monkeypatch):
    monkeypatch.setattr("sys.stdin", io.TextIOWrapper(io.BytesIO(PROMPT.encode("utf-8")), encoding="utf-8"))
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        status = main(["generate", "-", "--target", folders["target"], "--draft", folders["draft"], "--dtype",
                       "float64", "--max-new-tokens", str(NEW), "--no-chat-template", "--json", *METHODS["ar"]])
    assert status == 0, err.getvalue()
    assert json.loads(out.getvalue())["tokens"] == runs["ar"]["tokens"]


def test_multipath_methods_default_to_several_paths_and_refuse_one(folders):
    status, out, _ = run_cli(folders, "--json", "--method", "gbv", "--gamma", "2")
    assert status == 0
    trace = json.loads(out)["trace"]
    assert {r["paths"] for r in trace["rounds"]} == {MULTIPATH_PATHS} and MULTIPATH_PATHS >= 2
    status, out, err = run_cli(folders, "--method", "gbv", "--paths", "1")
    assert status == 2 and out == ""
    assert err.strip() == ("verispec: error: method 'gbv' needs paths >= 2 (with one path it is block verification: "
                           "use --method bv)")
    status, _, err = run_cli(folders, "--method", "specinfer", "--paths", "1")
    assert status == 2 and "method 'specinfer' needs paths >= 2" in err
