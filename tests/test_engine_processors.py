"""Logit processors in the decode loop: every method keeps its law (lossless ones: the target's with the same
processors, as plain autoregressive decoding), the draft's q and the target's p take them at the same counts, and
greedy decoding still equals `ar`'s tokens."""

from __future__ import annotations

from collections import Counter

import pytest
import torch

from tests.stats import FALSE_ALARM, chi_square_pvalue, decode_counts, max_abs_diff, target_law
from tests.verify.exact import speculative_law
from verispec.drafting import draft_paths
from verispec.engine import DecodeConfig, Engine, score_block
from verispec.learned import LearnedVerifier
from verispec.models.tabular import TabularLM
from verispec.processors import LogitProcessors
from verispec.sampling import SamplingConfig
from verispec.verify import block_verify_law, gbv_verify_law, token_verify_law

SAMPLED = SamplingConfig(temperature=1.0)
BIAS = {1: 0.8}
PRESENCE, FREQUENCY = 0.7, 0.5
PROCESSORS = {"logit_bias": BIAS, "presence_penalty": PRESENCE, "frequency_penalty": FREQUENCY}
PROMPT = [0]


class Processed:
    """A tabular model's next-token law with the processors applied, written out from OpenAI's formula (not from
    verispec.processors): logits as the engine reads them (float32 log-probabilities), plus the bias, minus the
    penalties over the tokens after the prompt, then softmax at `temperature`."""

    def __init__(self, model: TabularLM, prompt_length: int, temperature: float = 1.0) -> None:
        self.model, self.prompt_length, self.temperature = model, prompt_length, temperature
        self.vocab_size = model.vocab_size

    def logits(self, prefix: list[int]) -> torch.Tensor:
        logits = self.model.conditional(prefix).log().float().to(torch.float64)
        for token, amount in BIAS.items():
            logits[token] += amount
        for token, count in Counter(prefix[self.prompt_length :]).items():
            logits[token] -= PRESENCE + FREQUENCY * count
        return logits

    def conditional(self, prefix) -> torch.Tensor:
        return torch.softmax(self.logits(list(prefix)) / self.temperature, dim=-1)

    def sequence_prob(self, context, continuation) -> float:
        prob, prefix = 1.0, list(context)
        for token in continuation:
            prob *= float(self.conditional(prefix)[token])
            prefix.append(int(token))
        return prob


def tabular_pair(vocab: int = 3) -> tuple[TabularLM, TabularLM]:
    return TabularLM(vocab, seed=31), TabularLM(vocab, seed=32, sharpness=2.0)


@pytest.mark.parametrize(("law", "paths"), [(token_verify_law, None), (block_verify_law, None), (gbv_verify_law, 2)])
def test_the_rules_are_exact_with_processed_laws_that_count_the_drafted_prefix(law, paths):
    """Exact enumeration: with p and q processed at every position with the drafted prefix counted, the rules'
    output law is the processed target's autoregressive law at machine precision."""
    target, draft = tabular_pair()
    p, q = Processed(target, len(PROMPT)), Processed(draft, len(PROMPT))
    assert max_abs_diff(speculative_law(law, p, q, PROMPT, 2, 3, paths), target_law(p, PROMPT, 3)) < 1e-12


@pytest.mark.parametrize("n_paths", [1, 3])
def test_q_and_p_rows_are_the_processed_laws_at_their_own_positions(n_paths):
    """The round's draft laws q and the target pass's p, `laws` and gate rows against the formula, row by row: a
    drafted row counts the path's tokens before it, and the prompt is never counted."""
    target, draft = tabular_pair(5)
    prompt, generated = [0, 2, 2], [1, 1, 2]
    tokens = prompt + generated
    round_processors = LogitProcessors(BIAS, PRESENCE, FREQUENCY).at(Counter(generated))
    sampling = SamplingConfig(temperature=0.8)
    gen = torch.Generator().manual_seed(4)
    block = draft_paths(draft, tokens, n_paths, 3, sampling, gen, frozenset(), 5, processors=round_processors)
    scored = score_block(target, tokens, block, sampling, round_processors)
    p_law, q_law = Processed(target, len(prompt), 0.8), Processed(draft, len(prompt), 0.8)
    gate = scored.per_path(scored.gate_law())
    for k, path in enumerate(block.tokens):
        for i in range(len(path) + 1):
            context = tokens + path[:i]
            torch.testing.assert_close(scored.p[k, i], p_law.conditional(context), rtol=0, atol=1e-12)
            torch.testing.assert_close(scored.laws.row(k, i), p_law.conditional(context), rtol=0, atol=1e-12)
            torch.testing.assert_close(gate[k, i], torch.softmax(p_law.logits(context), -1), rtol=0, atol=1e-12)
            if i < len(path):
                torch.testing.assert_close(block.q[k, i], q_law.conditional(context), rtol=0, atol=1e-12)


# Monte-Carlo through the real loop: 3,000 decodes of 3 tokens each (1,500 for gbv, whose decodes cost ~4x), chi-square
# at FALSE_ALARM (1e-6) against the processed target's exact law (`Processed`). The planted-bug test below shows that
# 1,000 decodes already catch a p that ignores the drafted tokens' counts (p-value ~1e-64).
RUNS = 3000
CASES = {
    "ar": {"method": "ar"},
    "sd": {"method": "sd", "drafter": "model"},
    "bv": {"method": "bv", "drafter": "model"},
    "gbv": {"method": "gbv", "paths": 2},
    "bv-ngram": {"method": "bv", "drafter": "ngram", "ngram_min": 1},
}


def processed_counts(engine: Engine, runs: int = RUNS, **settings) -> Counter:
    config = DecodeConfig(gamma=2, max_new_tokens=3, sampling=SAMPLED, **PROCESSORS).with_settings(**settings)
    return decode_counts(engine, config, runs, tuple(PROMPT))


@pytest.mark.parametrize("case", list(CASES))
def test_lossless_methods_emit_the_processed_target_law(case):
    target, draft = tabular_pair()
    runs = RUNS // 2 if case == "gbv" else RUNS
    counts = processed_counts(Engine(target, draft), runs, **CASES[case])
    assert chi_square_pvalue(counts, target_law(Processed(target, len(PROMPT)), PROMPT, 3)) > FALSE_ALARM


def test_a_target_row_that_ignores_the_drafted_prefix_is_caught(monkeypatch):
    """Planted bug: the target's rows count only the committed output, not the drafted tokens before them. Then
    sd's law moves off the processed target's and the Monte-Carlo test above rejects it."""
    import verispec.scoring

    monkeypatch.setattr(verispec.scoring, "tree_prefixes", lambda tokens, parents: [[]] * (len(tokens) + 1))
    target, draft = tabular_pair()
    counts = processed_counts(Engine(target, draft), 1000, **CASES["sd"])
    assert chi_square_pvalue(counts, target_law(Processed(target, len(PROMPT)), PROMPT, 3)) < FALSE_ALARM


def same_model_acceptance(method: str) -> float:
    target, draft = TabularLM(4, seed=7), TabularLM(4, seed=7)
    rates = []
    for seed in range(3):
        config = DecodeConfig(method, gamma=4, max_new_tokens=40, sampling=SAMPLED, seed=seed, drafter="model",
                              **PROCESSORS)
        rates.append(Engine(target, draft).decode(PROMPT, config).trace.acceptance_rate)
    return min(rates)


@pytest.mark.parametrize("method", ["sd", "bv"])
def test_a_draft_that_is_the_target_has_every_token_accepted(method):
    # p = q at every position only if both take the processors at the same counts.
    assert same_model_acceptance(method) == 1.0


def test_a_draft_without_the_processors_is_caught(monkeypatch):
    """Planted bug: the processors reach p but not q. The law stays the target's (q is still the law drawn from),
    so only the acceptance shows it: a draft that is the target no longer has everything accepted."""
    import verispec.drafters.model

    def unprocessed(*args, **kwargs):
        return draft_paths(*args[:10], **kwargs)  # drops the 11th argument, the round's processors

    monkeypatch.setattr(verispec.drafters.model, "draft_paths", unprocessed)
    assert same_model_acceptance("sd") < 0.9


def constant_verifier(accept: bool) -> LearnedVerifier:
    """A context verifier over a 1-wide hidden state that accepts (or rejects) every token (tabular models)."""
    return LearnedVerifier(torch.zeros(1, dtype=torch.float64), 20.0 if accept else -20.0, "context", 0.5, 1.0, 1,
                           "any")


@pytest.mark.parametrize("settings", [
    {"method": "ar"}, {"method": "draft"}, {"method": "sd", "drafter": "model"}, {"method": "bv"},
    {"method": "gbv", "paths": 2}, {"method": "specinfer", "paths": 2}, {"method": "spectr", "paths": 2},
    {"method": "nss", "paths": 2}, {"method": "traversal", "paths": 2}, {"method": "typical"},
    {"method": "margin"}, {"method": "fuzzy"}, {"method": "fly", "fly_window": 2}, {"method": "sprinter"},
    {"method": "sprinter-exact"}, {"method": "sd", "drafter": "ngram", "ngram_min": 1},
])
def test_every_method_honours_a_ban(settings):
    """logit_bias −100 bans a token (its odds fall by e^100) in every method, lossy ones included."""
    target, draft = TabularLM(5, seed=11), TabularLM(5, seed=12, sharpness=2.0)
    engine = Engine(target, draft, verifier=constant_verifier(True))
    base = DecodeConfig(gamma=3, max_new_tokens=20, sampling=SAMPLED).with_settings(**settings)
    free = Counter(t for s in range(5) for t in engine.decode([0, 2], base.with_settings(seed=s)).tokens)
    assert free[2] > 0  # without the ban the token comes out
    banned = base.with_settings(logit_bias={2: -100.0}, presence_penalty=0.5)
    assert all(2 not in engine.decode([0, 2], banned.with_settings(seed=s)).tokens for s in range(5))


GREEDY_CASES = {
    "sd": {"method": "sd", "drafter": "model"},
    "sd-ngram": {"method": "sd", "drafter": "ngram", "ngram_min": 1},
    "bv-hybrid": {"method": "bv", "drafter": "hybrid", "ngram_min": 1},
    "gbv": {"method": "gbv", "paths": 3},
    "gbv-ngram": {"method": "gbv", "paths": 2, "drafter": "ngram", "ngram_min": 1},
    "specinfer": {"method": "specinfer", "paths": 2},
    "nss": {"method": "nss", "paths": 2},
    "traversal": {"method": "traversal", "paths": 2},
    "margin-0": {"method": "margin", "margin_delta": 0.0},  # keeps only p̃'s argmax: greedy-exact if p̃ is processed
}


@pytest.fixture(scope="module")
def greedy(tiny_pair, tokenizer):
    """The tiny pair, a prompt, and processors that change `ar`'s greedy output (ban its commonest token, penalise
    repeats, favour another token)."""
    prompt = tokenizer("def add(a, b):\n    return a + b\n\ndef add(a, b):")["input_ids"]
    plain = Engine(tiny_pair["target"]).decode(prompt, DecodeConfig("ar", max_new_tokens=30)).tokens
    common = Counter(plain).most_common(1)[0][0]
    processors = {"logit_bias": {common: -100.0, prompt[3]: 2.0}, "presence_penalty": 1.0, "frequency_penalty": 1.5}
    reference = Engine(tiny_pair["target"]).decode(prompt, DecodeConfig("ar", max_new_tokens=30, **processors))
    assert reference.tokens != plain and common not in reference.tokens
    return {"prompt": prompt, "processors": processors, "ar": reference.tokens}


@pytest.mark.parametrize("case", list(GREEDY_CASES))
def test_greedy_methods_equal_ar_with_the_same_processors(tiny_pair, greedy, case):
    engine = Engine(tiny_pair["target"], tiny_pair["partial"])
    config = DecodeConfig(gamma=4, max_new_tokens=30, **greedy["processors"]).with_settings(**GREEDY_CASES[case])
    assert engine.decode(greedy["prompt"], config).tokens == greedy["ar"]


def test_greedy_draft_method_equals_ar_of_the_draft_with_the_same_processors(tiny_pair, greedy):
    config = DecodeConfig("draft", max_new_tokens=30, **greedy["processors"])
    alone = Engine(tiny_pair["partial"]).decode(greedy["prompt"], config.with_settings(method="ar")).tokens
    assert Engine(tiny_pair["target"], tiny_pair["partial"]).decode(greedy["prompt"], config).tokens == alone
