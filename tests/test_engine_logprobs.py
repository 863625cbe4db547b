"""Log-probabilities in the decode loop: every emitted token's comes from the decoding model's processed row at its
own position (the correction and bonus tokens included), whatever the method."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from tests.test_engine_processors import Processed
from tests.test_engine_processors import constant_verifier as _constant_verifier
from verispec.engine import DecodeConfig, Engine
from verispec.models.tabular import TabularLM
from verispec.sampling import SamplingConfig, process_logits

PROCESSORS = {"logit_bias": {5: 2.0, 9: -3.0}, "presence_penalty": 0.6, "frequency_penalty": 0.4}
METHODS = {
    "sd": {"method": "sd", "drafter": "model"},
    "bv": {"method": "bv", "drafter": "model"},
    "gbv": {"method": "gbv", "paths": 3},
    "specinfer": {"method": "specinfer", "paths": 2},
    "sd-ngram": {"method": "sd", "drafter": "ngram", "ngram_min": 1},
    "bv-hybrid": {"method": "bv", "drafter": "hybrid", "ngram_min": 1},
}
TOL = {"rtol": 0, "atol": 1e-5}  # two float32 passes of the tiny model over the same tokens (cached vs one pass)

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def prompt(tokenizer):
    return tokenizer("def add(a, b):\n    return a + b\n\ndef add(a, b):")["input_ids"]


def recompute(model, prompt: list[int], tokens: list[int], sampling: SamplingConfig, processors: dict) -> torch.Tensor:
    """Return `[n, V]` log-probabilities of the n positions of `tokens`, from one forward of `model` over the whole
    sequence: each row offset by OpenAI's formula (written out densely here), then processed as sampled (T > 0), or
    log-softmaxed at temperature 1 (T = 0)."""
    model.reset()
    logits = model.forward(prompt + tokens[:-1], n_logits=len(tokens)).logits.to(torch.float64)
    model.reset()
    bias = processors.get("logit_bias") or {}
    rows = []
    for i in range(len(tokens)):
        row = logits[i].clone()
        for token, amount in bias.items():
            row[token] += amount
        for token, count in Counter(tokens[:i]).items():
            row[token] -= processors.get("presence_penalty", 0.0) + processors.get("frequency_penalty", 0.0) * count
        rows.append(torch.log_softmax(row, -1) if sampling.greedy else process_logits(row, sampling).log())
    return torch.stack(rows)


def chosen(out) -> torch.Tensor:
    return torch.tensor([entry.logprob for entry in out.logprobs], dtype=torch.float64)


@pytest.mark.parametrize("processors", [{}, PROCESSORS], ids=["plain", "processed"])
@pytest.mark.parametrize("case", list(METHODS))
def test_greedy_logprobs_equal_ar_and_the_temperature_one_log_softmax(tiny_pair, prompt, case, processors):
    config = DecodeConfig(gamma=4, max_new_tokens=24, logprobs=3, **processors)
    ar = Engine(tiny_pair["target"]).decode(prompt, config.with_settings(method="ar"))
    out = Engine(tiny_pair["target"], tiny_pair["partial"]).decode(prompt, config.with_settings(**METHODS[case]))
    assert out.tokens == ar.tokens and len(out.logprobs) == len(out.tokens)
    torch.testing.assert_close(chosen(out), chosen(ar), **TOL)
    for mine, theirs in zip(out.logprobs, ar.logprobs, strict=True):
        assert [token for token, _ in mine.top] == [token for token, _ in theirs.top]
        assert mine.top[0][0] == mine.token  # at T = 0 the emitted token is the processed argmax
    expected = recompute(tiny_pair["target"], prompt, out.tokens, config.sampling, processors)
    torch.testing.assert_close(chosen(out), expected[torch.arange(len(out.tokens)), out.tokens], **TOL)


@pytest.mark.parametrize("case", list(METHODS))
def test_sampled_logprobs_equal_one_target_forward_over_the_output(tiny_pair, prompt, case):
    sampling = SamplingConfig(temperature=0.8, top_p=0.95)
    config = DecodeConfig(gamma=4, max_new_tokens=24, logprobs=2, sampling=sampling, seed=3, **PROCESSORS)
    out = Engine(tiny_pair["target"], tiny_pair["partial"]).decode(prompt, config.with_settings(**METHODS[case]))
    expected = recompute(tiny_pair["target"], prompt, out.tokens, sampling, PROCESSORS)
    assert torch.isfinite(chosen(out)).all()  # a lossless method emits only tokens its law gives mass to
    torch.testing.assert_close(chosen(out), expected[torch.arange(len(out.tokens)), out.tokens], **TOL)
    for entry, row in zip(out.logprobs, expected, strict=True):
        values, ids = row.topk(2)
        kept = values > float("-inf")  # top-p may leave a single token: tokens it cut are not listed
        assert [token for token, _ in entry.top] == ids[kept].tolist()
        torch.testing.assert_close(torch.tensor([value for _, value in entry.top], dtype=torch.float64), values[kept],
                                   **TOL)


@pytest.mark.parametrize("settings", [
    {"method": "ar"}, {"method": "sd", "drafter": "model"}, {"method": "bv", "drafter": "model"},
    {"method": "gbv", "paths": 2}, {"method": "nss", "paths": 3}, {"method": "traversal", "paths": 2},
    {"method": "typical"}, {"method": "fly", "fly_window": 1}, {"method": "sprinter"},
])
def test_tabular_logprobs_are_the_processed_target_row_of_each_position(settings):
    """Exact tables, whose law changes with every prefix: an off-by-one row, q instead of p, or a row without its
    drafted prefix's counts is off by far more than the tolerance. Lossy methods report the target's law as well."""
    target, draft = TabularLM(5, seed=21), TabularLM(5, seed=22, sharpness=2.0)
    engine = Engine(target, draft, verifier=_constant_verifier(True))
    processors = {"logit_bias": {1: 0.8}, "presence_penalty": 0.7, "frequency_penalty": 0.5}
    law = Processed(target, 1)
    for seed in range(4):
        config = DecodeConfig(gamma=3, max_new_tokens=15, sampling=SamplingConfig(temperature=1.0), seed=seed,
                              logprobs=5, **processors).with_settings(**settings)
        out = engine.decode([0], config)
        for i, entry in enumerate(out.logprobs):
            row = law.conditional([0, *out.tokens[:i]]).log()
            assert entry.token == out.tokens[i]
            assert abs(entry.logprob - float(row[entry.token])) < 1e-12
            assert [token for token, _ in entry.top] == row.argsort(descending=True).tolist()


def test_top_logprobs_are_the_k_likeliest_in_order(tiny_pair, prompt):
    engine = Engine(tiny_pair["target"], tiny_pair["partial"])
    out = engine.decode(prompt, DecodeConfig("sd", gamma=3, max_new_tokens=12, logprobs=20, drafter="model",
                                             sampling=SamplingConfig(temperature=1.0)))
    for entry in out.logprobs:
        values = [value for _, value in entry.top]
        assert len(entry.top) == 20 and len({token for token, _ in entry.top}) == 20
        assert values == sorted(values, reverse=True)
        assert entry.logprob <= values[0]
        if entry.token in dict(entry.top):
            assert dict(entry.top)[entry.token] == entry.logprob
    none = engine.decode(prompt, DecodeConfig("sd", gamma=3, max_new_tokens=12, logprobs=0))
    assert len(none.logprobs) == 12 and all(entry.top == [] for entry in none.logprobs)
    assert engine.decode(prompt, DecodeConfig("sd", gamma=3, max_new_tokens=12)).logprobs is None


def test_top_logprobs_leave_out_tokens_that_top_k_cut():
    target, draft = TabularLM(6, seed=3), TabularLM(6, seed=4)
    out = Engine(target, draft).decode([0], DecodeConfig("sd", gamma=3, max_new_tokens=8, logprobs=5, drafter="model",
                                                         sampling=SamplingConfig(temperature=1.0, top_k=2)))
    assert all(len(entry.top) == 2 for entry in out.logprobs)


def test_logprobs_follow_the_eos_and_length_cuts_and_stream_with_the_tokens(tiny_pair, prompt):
    reference = Engine(tiny_pair["target"]).decode(prompt, DecodeConfig("ar", max_new_tokens=30)).tokens
    eos = reference[7]
    engine = Engine(tiny_pair["target"], tiny_pair["same"], eos_token_ids=[eos])
    committed, streamed = [], []
    out = engine.decode(prompt, DecodeConfig("sd", gamma=4, max_new_tokens=30, logprobs=1, drafter="model"),
                        on_commit=committed.append, on_logprobs=streamed.append)
    assert out.stopped_at_eos and out.tokens == reference[: reference.index(eos) + 1]
    assert [entry.token for entry in out.logprobs] == out.tokens
    assert [[entry.token for entry in chunk] for chunk in streamed] == committed
    short = engine.decode(prompt, DecodeConfig("sd", gamma=4, max_new_tokens=3, logprobs=1, drafter="model"))
    assert [entry.token for entry in short.logprobs] == short.tokens == reference[:3]
