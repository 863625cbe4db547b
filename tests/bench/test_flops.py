"""The FLOPs estimate: parameter counts of tiny models, a hand-built trace, and the context sums of real decodes."""

from __future__ import annotations

import pytest
import torch

from verispec import Decoder
from verispec.bench.flops import (
    ModelCost,
    add_flops,
    decoding_contexts,
    draft_contexts,
    matmul_params,
    model_cost,
    summarize_flops,
    trace_flops,
)


def test_matmul_params_of_the_tiny_qwen2_by_hand(tiny_pair):
    model = tiny_pair["target"]
    v, d, inter, kv = model.vocab_size, 32, 64, 16  # 4 query heads and 2 KV heads of dim 8
    per_layer = (d * d + d) + 2 * (d * kv + kv) + d * d + 3 * d * inter  # q, k, v (with biases), o, MLP
    assert matmul_params(model.model) == 2 * per_layer + v * d  # 2 layers + LM head; embeddings excluded
    assert model_cost(model) == ModelCost(2 * per_layer + v * d, 2, 32)
    assert model_cost(model.model) == model_cost(model)
    # a model without a torch module (llama.cpp's) is costed from its config: the same weights but the biases
    without_module = type("ConfigOnly", (), {"model": None, "config": model.model.config})()
    assert model_cost(without_module) == ModelCost(2 * per_layer + v * d - 2 * (d + 2 * kv), 2, 32)


def test_matmul_params_counts_declared_shapes_and_tied_heads_once():
    linear = torch.nn.Linear(6, 4)
    linear.weight = torch.nn.Parameter(torch.empty(4, 0))  # what the oneDNN fast path leaves behind
    embed = torch.nn.Embedding(10, 6)
    head = torch.nn.Linear(6, 10, bias=False)
    head.weight = embed.weight  # tied
    assert matmul_params(torch.nn.ModuleList([linear, embed, head, torch.nn.LayerNorm(6)])) == 6 * 4 + 4 + 60


TARGET, DRAFT = ModelCost(params=100, layers=2, attn_width=4), ModelCost(params=10, layers=1, attn_width=2)


def _sd_record():
    # Prompt 3, γ = 2. Round 1: the target feeds the prompt + 2 drafts (positions 1..5), both accepted, bonus: 3
    # emitted. Round 2: the target feeds the bonus + 2 drafts after a cache of 5 (positions 6, 7, 8); 1 emitted.
    # The draft fed 3 + 1 tokens in round 1, then 2 (last draft and bonus) + 1 in round 2: 7.
    rounds = [dict(drafted=2, accepted=2, emitted=3, fed=5, tree_nodes=2),
              dict(drafted=2, accepted=0, emitted=1, fed=3, tree_nodes=2)]
    trace = dict(rounds=rounds, generated=4, target_calls=2, target_tokens=8, draft_calls=4, draft_tokens=7,
                 prefill_tokens=3)
    return dict(method="sd", trace=trace)


def test_trace_flops_by_hand():
    record = _sd_record()
    assert decoding_contexts(record["trace"]["rounds"], 3) == (1 + 2 + 3 + 4 + 5) + (6 + 7 + 8)
    # Draft: the prompt 1+2+3, then 4 tokens at the drafted-weighted mean of S_r + (d_r − 1)/2: (3.5 + 6.5) / 2 = 5
    # (the forwards saw 4, then 5 + 6 and 7: 22).
    assert draft_contexts(record["trace"]["rounds"], 3, 7) == 6 + 20
    flops = trace_flops(record, TARGET, DRAFT)
    target = 2 * 100 * 8 + 4 * 2 * 4 * 36  # linear + attention = 1600 + 1152
    draft = 2 * 10 * 7 + 4 * 1 * 2 * 26  # 140 + 208
    prefill = (2 * 100 * 3 + 4 * 2 * 4 * 6) + (2 * 10 * 3 + 4 * 1 * 2 * 6)  # each model over the 3-token prompt
    assert flops == {"total": target + draft, "target": target, "draft": draft, "verifier": 0,
                     "attention": 1152 + 208, "prefill": prefill, "per_token": (target + draft) / 4,
                     "per_token_decode": (target + draft - prefill) / 4}


def test_verifier_draft_method_peers_and_missing_costs():
    record = _sd_record()
    record["trace"]["rounds"][0]["verifier_scores"] = [0.9, 0.2]
    record["trace"]["rounds"][1]["verifier_scores"] = [0.7]
    assert trace_flops(record, TARGET, DRAFT, verifier_params=5)["verifier"] == 2 * 5 * 3
    assert trace_flops(record, None, DRAFT)["total"] is None  # the target ran but its size is unknown
    # `draft` decodes with the draft: its passes are the rounds (prompt of 3, then 1 token per round).
    rounds = [dict(drafted=0, accepted=0, emitted=1, fed=3), dict(drafted=0, accepted=0, emitted=1, fed=1)]
    own = dict(method="draft", trace=dict(rounds=rounds, generated=2, target_tokens=0, draft_tokens=4,
                                          prefill_tokens=3))
    assert trace_flops(own, None, DRAFT)["draft"] == 2 * 10 * 4 + 4 * 1 * 2 * (6 + 4)
    # A peer's rounds have no tree: the drafted count marks the block (hf-assisted, same numbers as sd).
    peer = _sd_record()
    peer["method"] = "hf-assisted"
    for r in peer["trace"]["rounds"]:
        del r["tree_nodes"]
    assert trace_flops(peer, TARGET, DRAFT) == trace_flops(_sd_record(), TARGET, DRAFT)
    both = [dict(_sd_record(), flops=trace_flops(_sd_record(), TARGET, DRAFT)), dict(own, flops={"total": None})]
    assert summarize_flops(both)["flops_per_token"] == trace_flops(_sd_record(), TARGET, DRAFT)["per_token"]
    assert summarize_flops([own]) == {"flops_per_token": None, "flops_per_token_decode": None}


def _logged_forwards(monkeypatch, model, log):
    original = model.forward

    def forward(tokens, n_logits=1, return_hidden=False, parents=None):
        assert parents is None, "a chain decode"
        cache, fed = model.cache_length, len(tokens)
        log.append(fed * cache + fed * (fed + 1) // 2)  # positions 1..cache+fed of this pass's tokens
        return original(tokens, n_logits, return_hidden, parents)

    monkeypatch.setattr(model, "forward", forward)


@pytest.mark.parametrize("method", ["ar", "sd", "draft"])
def test_context_sums_match_the_engine_forwards(tiny_pair, monkeypatch, method):
    decoder = Decoder(tiny_pair["target"], tiny_pair["partial"])
    target_log, draft_log = [], []
    _logged_forwards(monkeypatch, tiny_pair["target"], target_log)
    _logged_forwards(monkeypatch, tiny_pair["partial"], draft_log)
    gen = decoder.generate("hello world", method=method, gamma=3, max_new_tokens=20, temperature=1.0, seed=1)
    trace = gen.trace.to_dict()
    own = draft_log if method == "draft" else target_log
    assert decoding_contexts(trace["rounds"], gen.prompt_tokens) == sum(own)  # exact for the decoding model
    if method == "sd":
        estimate, exact = draft_contexts(trace["rounds"], gen.prompt_tokens, trace["draft_tokens"]), sum(draft_log)
        assert abs(estimate - exact) <= 0.03 * exact  # the approximation the module docstring states
    record = {"method": method, "prompt_tokens": gen.prompt_tokens, "trace": trace}
    costs = add_flops([record], decoder)
    assert costs["verifier_params"] == 0
    # The decoding model's part is exact: 2·N per fed token plus 4·L·d_attn per visible position of its forwards.
    role = "draft" if method == "draft" else "target"
    cost = model_cost(decoder.model(role))
    assert record["flops"][role] == 2 * cost.params * trace[f"{role}_tokens"] + 4 * cost.layers * cost.attn_width * sum(
        own)
    assert (costs["draft"] is not None) == (method != "ar") and (costs["target"] is None) == (method == "draft")
