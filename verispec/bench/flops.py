"""A FLOPs estimate of each decode, from its trace and the models' sizes.

The counting convention (one multiply-add = 2 FLOPs; forward passes only; every pass of every model counted):

* **Linear layers.** A model forward over T tokens costs 2·N·T, where N is the number of weights of the matrix
  multiplications every processed token goes through: all linear layers, the LM head included (a head tied to
  the input embedding is counted once, as the head); embedding lookups and normalisation scales are excluded.
  The head is charged for every processed token. That is exact for the target's verification passes (a logit
  row per fed token) and for 1-token draft steps, and an over-count for the prompt prefill and the draft's
  catch-up forwards, which keep only the last row's logits.
* **Attention** (Hoffmann et al. 2022, Appendix F: scores QKᵀ plus the weighted sum of V): a token that sees c
  positions (itself included) costs 4·L·d_attn·c, with L layers and d_attn = query heads × head dim. Only
  causally visible positions are counted (c = cache length before the pass + the token's index in it), whatever
  the kernel computes under the mask; tree tokens are charged as if the whole block were a chain.
  - The decoding model's passes (the target, or the draft for the `draft` method) are itemised per round in the
    trace, so their c are exact.
  - The draft passes of speculative methods are not itemised: the prompt's P tokens are charged 1..P, every
    other draft-processed token the mean context of a round's draft tokens, S_r + (d_r − 1)/2 (S_r the committed
    length at the start of round r, d_r the tokens drafted in it), averaged over rounds weighted by d_r: an
    approximation (the catch-up tokens a round re-feeds are not itemised), within one position per token on
    average and 1.5% in total on tiny-model decodes (γ = 2..8), where it was checked against the forwards.
* **Learned verifier** (SPRINTER): 2·F per scored token, F its weights (the draft's hidden size, plus 4 for the
  token-aware features). Its input is the draft's hidden state, already computed, so nothing else is added.
* Sampling, softmax, verification arithmetic and the KV-cache bookkeeping are not counted.

Per record: `total`, its parts `target`, `draft`, `verifier` and `attention` (the attention share of the model
parts), `prefill` (each model's forward over the prompt, counted in total), `per_token` = total / generated tokens
and `per_token_decode` = (total − prefill) / generated tokens.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import torch

from verispec.methods import METHODS


@dataclass(frozen=True)
class ModelCost:
    """The sizes the convention needs of one model."""

    params: int  # N: weights of the matmuls every processed token goes through (linear layers + LM head)
    layers: int  # L: transformer blocks (0 when unknown: no attention term)
    attn_width: int  # d_attn: query heads × head dim


def matmul_params(module: torch.nn.Module) -> int:
    """Return the weights (and biases) of `module`'s linear layers: nn.Linear by its declared shape (a fast path may
    have replaced the dense weight), other 2-D non-embedding weights (e.g. GPT-2's Conv1D) by their size."""
    total = 0
    for sub in module.modules():
        if isinstance(sub, torch.nn.Linear):
            total += sub.in_features * sub.out_features + (sub.bias.numel() if sub.bias is not None else 0)
        elif not isinstance(sub, torch.nn.Embedding):
            weight = sub._parameters.get("weight")
            if weight is not None and weight.dim() == 2:
                bias = sub._parameters.get("bias")
                total += weight.numel() + (bias.numel() if bias is not None else 0)
    return total


def config_matmul_params(config: Any) -> int:
    """Return the matmul weights of a decoder-only transformer (Qwen2/Llama layout: q, k, v, o, a gated MLP, the
    output layer; biases left out) from its config alone: for a model run outside torch (llama.cpp's)."""
    hidden, heads = config.hidden_size, config.num_attention_heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    attention = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    return config.num_hidden_layers * (attention + 3 * hidden * config.intermediate_size) + config.vocab_size * hidden


def model_cost(model: Any) -> ModelCost:
    """Return the `ModelCost` of an `HFCausalLM` (or of a transformers model itself, or of a model without a torch
    module that carries its transformers `config`, such as a llama.cpp one)."""
    module = model if isinstance(model, torch.nn.Module) else model.model
    config = module.config if module is not None else model.config
    config = config.get_text_config() if hasattr(config, "get_text_config") else config
    if module is None:
        heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
        return ModelCost(config_matmul_params(config), int(config.num_hidden_layers), int(heads * head_dim))
    layers = getattr(config, "num_hidden_layers", None) or getattr(config, "n_layer", None) or 0
    heads = getattr(config, "num_attention_heads", None) or getattr(config, "n_head", None) or 0
    hidden = getattr(config, "hidden_size", None) or getattr(config, "n_embd", None) or 0
    head_dim = getattr(config, "head_dim", None) or (hidden // heads if heads else 0)
    return ModelCost(matmul_params(module), int(layers), int(heads * head_dim))


def decoding_contexts(rounds: Sequence[dict[str, Any]], prompt_tokens: int) -> int:
    """Return Σ c over every token the decoding model's passes processed (c = positions it sees, itself included).

    Round r starts with S_r = prompt + tokens emitted before it; its pass feeds `fed` tokens, the last `nodes` of
    them draft tokens (tree nodes, or drafted for traces without a tree), after a cache of S_r − (fed − nodes).
    """
    total, committed = 0, prompt_tokens
    for r in rounds:
        fed = r["fed"]
        cache = committed - (fed - (r.get("tree_nodes") or r["drafted"]))
        total += fed * cache + fed * (fed + 1) // 2
        committed += r["emitted"]
    return total


def draft_contexts(rounds: Sequence[dict[str, Any]], prompt_tokens: int, draft_tokens: int) -> int:
    """Return the estimated Σ c over the draft passes of a speculative decode (module docstring)."""
    if draft_tokens <= 0:
        return 0
    starts, committed = [], prompt_tokens
    for r in rounds:
        # A round's draft forwards feed the last committed token (position S_r), then drafts at S_r+1 .. S_r+d−1.
        starts.append((r["drafted"] * r.get("paths", 1), committed + (r["drafted"] - 1) / 2))
        committed += r["emitted"]
    weight = sum(w for w, _ in starts)
    mean_start = sum(w * s for w, s in starts) / weight if weight else committed
    prompt = min(prompt_tokens, draft_tokens)
    return prompt * (prompt + 1) // 2 + round((draft_tokens - prompt) * mean_start)


def _forward_flops(cost: ModelCost, tokens: int, contexts: int) -> tuple[int, int]:
    """Return (linear FLOPs, attention FLOPs) of `tokens` processed tokens seeing `contexts` positions in all."""
    return 2 * cost.params * tokens, 4 * cost.layers * cost.attn_width * contexts


def trace_flops(
    record: dict[str, Any], target: ModelCost | None, draft: ModelCost | None, verifier_params: int = 0
) -> dict[str, Any]:
    """Return the FLOPs of one record's decode (keys in the module docstring); None for a part whose model cost is
    missing while the trace shows it ran."""
    trace = record["trace"]
    rounds = trace["rounds"]
    prompt = trace.get("prefill_tokens") or record.get("prompt_tokens") or 0
    method = METHODS.get(record["method"])
    decoder_is_draft = method is not None and method.decoder == "draft"
    parts = {"target": 0, "draft": 0, "attention": 0, "prefill": 0}
    for role, cost, tokens in (("target", target, trace.get("target_tokens", 0)),
                               ("draft", draft, trace.get("draft_tokens", 0))):
        if not tokens:
            continue
        if cost is None:
            return {"total": None, "per_token": None, "per_token_decode": None}
        if (role == "draft") == decoder_is_draft:
            contexts = decoding_contexts(rounds, prompt)
        else:
            contexts = draft_contexts(rounds, prompt, tokens)
        linear, attention = _forward_flops(cost, tokens, contexts)
        parts[role] = linear + attention
        parts["attention"] += attention
        p = min(prompt, tokens)
        parts["prefill"] += sum(_forward_flops(cost, p, p * (p + 1) // 2))  # each model reads the prompt once
    scored = sum(len(r.get("verifier_scores") or []) for r in rounds)
    parts["verifier"] = 2 * verifier_params * scored
    total = parts["target"] + parts["draft"] + parts["verifier"]
    generated = trace["generated"]
    return {"total": total, **parts, "per_token": total / generated if generated else None,
            "per_token_decode": (total - parts["prefill"]) / generated if generated else None}


def add_flops(records: Sequence[dict[str, Any]], decoder: Any) -> dict[str, Any]:
    """Add `record["flops"]` to every record; return the model costs used (JSON-able).

    Only the models the records show running are asked of `decoder`, so nothing new is loaded.
    """
    uses = {role: any(r["trace"].get(f"{role}_calls", 0) for r in records) for role in ("target", "draft")}
    costs = {role: model_cost(decoder.model(role)) if used else None for role, used in uses.items()}
    scored = any(r.get("verifier_scores") for rec in records for r in rec["trace"]["rounds"])
    verifier_params = int(decoder.verifier().weight.numel()) if scored else 0
    for record in records:
        record["flops"] = trace_flops(record, costs["target"], costs["draft"], verifier_params)
    return {role: asdict(c) if c else None for role, c in costs.items()} | {"verifier_params": verifier_params}


def summarize_flops(records: Sequence[dict[str, Any]]) -> dict[str, float | None]:
    """Return the aggregate FLOPs per generated token of a method's records (token-weighted, None without data)."""
    flops = [(r["flops"], r["trace"]["generated"]) for r in records if (r.get("flops") or {}).get("total") is not None]
    tokens = sum(n for _, n in flops)
    if not tokens:
        return {"flops_per_token": None, "flops_per_token_decode": None}
    return {"flops_per_token": sum(f["total"] for f, _ in flops) / tokens,
            "flops_per_token_decode": sum(f["total"] - f["prefill"] for f, _ in flops) / tokens}
