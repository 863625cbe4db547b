"""Output quality for the benchmark: the target's NLL / perplexity of each output and ROUGE-L overlaps.

* **NLL under the target.** Each output is scored by the target given the same prompt ids it was decoded from:
  NLL = −Σ_j log p(y_j | prompt, y_<j), with p the temperature-1 softmax of the target's raw logits. It is the
  perplexity of the *model*, not of the processed law that was sampled from (temperature, top-k, top-p): a greedy
  output and a sampled one are scored on the same scale. Every generated token is scored, the EOS included when
  it ended the output (the target's probability of stopping there). Perplexity = exp(NLL / tokens): per prompt,
  and for a method the corpus value exp(Σ NLL / Σ tokens).
* **ROUGE-L** (Lin 2004) F1 = 2·P·R / (P + R), P = LCS / |candidate|, R = LCS / |reference| (β = 1), LCS the
  longest common subsequence. Against the target's own `ar` output for the same prompt and seed it is computed on
  **token ids** as generated (EOS included): exact, and free of tokenizer round trips; every method shares the
  target's tokenizer. At temperature 0 a lossless method scores 1; at temperature > 0 two correct samplers still
  differ, so it measures closeness to one target sample, not correctness. Against a prompt set's reference
  answer it is computed on **whitespace-separated words** of the decoded text (the reference is text).
* **pass@1 by execution** (HumanEval prompts only): each output runs against its problem's tests in a sandboxed
  subprocess (`bench.execution`, which states what is and is not isolated); `passed` is 1 or 0, and a method's
  pass@1 is the mean over its scored problems (one completion each).
* The `draft` method (the draft alone, no target calls) is the quality floor: the draft-only control of §3.8.

Aggregates over a method's prompts (`summarize_quality`), each with a 95% percentile-bootstrap interval over
prompts (`verispec.stats.bootstrap_ratio`, prompts resampled with replacement): NLL per token = Σ NLL / Σ tokens
(a ratio of sums, as the speedup), perplexity = exp of it and of its interval bounds, and the mean ROUGE-L over
the prompts that have the comparison, with the count of those prompts.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import torch

from verispec.bench.execution import check_completion
from verispec.errors import ConfigError
from verispec.models.protocol import CausalLM
from verispec.stats import bootstrap_ratio


def _target(decoder_or_model: Any) -> CausalLM:
    """Return the target model of a `Decoder`, or the `CausalLM` itself."""
    return decoder_or_model if isinstance(decoder_or_model, CausalLM) else decoder_or_model.model("target")


def target_nll(decoder_or_model: Any, prompt_ids: Sequence[int], output_ids: Sequence[int]) -> tuple[float, int]:
    """Return (Σ NLL in nats, number of tokens scored) of `output_ids` under the target after `prompt_ids`.

    One fresh forward (the cache is reset before and after) over prompt + output[:-1]: the logits at the last
    n = len(output) positions are the predictions of the n output tokens (the last output token predicts nothing
    that is scored, so it is not fed). Temperature-1 log-softmax of the raw logits, in float64.
    """
    if not prompt_ids:
        raise ConfigError("target_nll needs the prompt ids the output was decoded from (got none)")
    n = len(output_ids)
    if n == 0:
        return 0.0, 0
    model = _target(decoder_or_model)
    model.reset()
    try:
        logits = model.forward([int(t) for t in prompt_ids] + [int(t) for t in output_ids[:-1]], n_logits=n).logits
    finally:
        model.reset()  # don't leave a scoring pass in the cache the next decode would otherwise reset anyway
    log_p = torch.log_softmax(logits.to(torch.float64), dim=-1)  # [n, V]
    ids = torch.as_tensor([int(t) for t in output_ids], dtype=torch.long).view(n, 1)  # [n, 1]
    return float(-log_p.gather(1, ids).sum()), n


def perplexity(nll: float, tokens: int) -> float | None:
    """Return exp(nll / tokens), the perplexity of `tokens` tokens with total NLL `nll` (None without tokens)."""
    return math.exp(nll / tokens) if tokens else None


def lcs_length(a: Sequence[Any], b: Sequence[Any]) -> int:
    """Return the length of the longest common subsequence of `a` and `b` (O(|a|·|b|) time, O(|b|) memory)."""
    if len(a) < len(b):
        a, b = b, a
    row = [0] * (len(b) + 1)
    for x in a:
        diagonal = 0  # row[j-1] of the previous row
        for j, y in enumerate(b, 1):
            above = row[j]
            row[j] = diagonal + 1 if x == y else max(above, row[j - 1])
            diagonal = above
    return row[-1]


def rouge_l(candidate: str | Sequence[int], reference: str | Sequence[int]) -> float:
    """Return the ROUGE-L F1 of `candidate` against `reference`: token-id sequences as given, text split into
    whitespace words. Two empty sequences score 1, one empty sequence 0."""
    cand = candidate.split() if isinstance(candidate, str) else list(candidate)
    ref = reference.split() if isinstance(reference, str) else list(reference)
    if not cand or not ref:
        return float(not cand and not ref)
    lcs = lcs_length(cand, ref)
    if lcs == 0:
        return 0.0
    precision, recall = lcs / len(cand), lcs / len(ref)
    return 2 * precision * recall / (precision + recall)


def quality_records(
    records: Sequence[dict[str, Any]],
    decoder: Any,
    chat_template: bool = True,
    references: Mapping[int, str | None] | None = None,
    problems: Mapping[int, Mapping[str, Any] | None] | None = None,
) -> Sequence[dict[str, Any]]:
    """Add `record["quality"]` to every bench record and return the records.

    The quality dict: `nll` (Σ nats), `tokens` (scored), `nll_per_token`, `ppl`, `rouge_l_vs_ar` (token ids, vs the
    same prompt's `ar` record, None when `ar` did not run) and `rouge_l_vs_reference` (words, vs
    `references[prompt_index]`, None without one); with a HumanEval problem in `problems[prompt_index]` also
    `passed` (1.0 / 0.0, `bench.execution.check_completion`) and `execution` (its status). Prompts are re-encoded
    as the runner encoded them (`chat_template`); an encoding of another length than the record's `prompt_tokens`
    is an error.
    """
    references, problems = references or {}, problems or {}
    executed: dict[tuple[int, str], Any] = {}  # identical texts are run once
    ar = {r["prompt_index"]: r["tokens"] for r in records if r["method"] == "ar"}
    prompt_ids: dict[int, list[int]] = {}
    scored: dict[tuple[int, tuple[int, ...]], tuple[float, int]] = {}  # identical outputs are scored once
    for record in records:
        index = record["prompt_index"]
        if index not in prompt_ids:
            prompt_ids[index] = decoder.encode_prompt(record["prompt"], chat_template)
        ids = prompt_ids[index]
        if len(ids) != record["prompt_tokens"]:
            raise ConfigError(f"prompt {record.get('prompt_id', index)!r} encodes to {len(ids)} tokens, but was "
                              f"decoded from {record['prompt_tokens']}: score with the chat_template setting of "
                              f"the run")
        key = (index, tuple(record["tokens"]))
        if key not in scored:
            scored[key] = target_nll(decoder, ids, record["tokens"])
        nll, n = scored[key]
        reference = references.get(index)
        record["quality"] = {
            "nll": nll,
            "tokens": n,
            "nll_per_token": nll / n if n else None,
            "ppl": perplexity(nll, n),
            "rouge_l_vs_ar": rouge_l(record["tokens"], ar[index]) if index in ar else None,
            "rouge_l_vs_reference": rouge_l(record["text"], reference) if reference else None,
        }
        if problems.get(index) is not None:
            if (index, record["text"]) not in executed:
                executed[index, record["text"]] = check_completion(problems[index], record["text"])
            outcome = executed[index, record["text"]]
            record["quality"].update(passed=float(outcome.passed), execution=outcome.status)
    return records


def summarize_quality(records: Sequence[dict[str, Any]], resamples: int = 2000, seed: int = 0) -> dict[str, Any]:
    """Return a method's quality aggregates (module docstring); every key is present, None without scores."""
    scored = [r["quality"] for r in records if r.get("quality")]
    nll = [q["nll"] for q in scored if q["tokens"]]
    tokens = [q["tokens"] for q in scored if q["tokens"]]
    row: dict[str, Any] = {"quality_prompts": len(scored)}
    per_token = sum(nll) / sum(tokens) if tokens else None
    interval = bootstrap_ratio(list(zip(nll, tokens, strict=True)), resamples, seed)
    row.update(nll_per_token=per_token, nll_per_token_ci95=interval,
               ppl=math.exp(per_token) if per_token is not None else None,
               ppl_ci95=(math.exp(interval[0]), math.exp(interval[1])) if interval else None)
    # pass@1 is the mean of the per-problem `passed` (one completion each).
    for key, name in (("rouge_l_vs_ar", "rouge_l_vs_ar"), ("rouge_l_vs_reference", "rouge_l_vs_reference"),
                      ("passed", "pass_at_1")):
        values = [q[key] for q in scored if q.get(key) is not None]
        row[name] = float(np.mean(values)) if values else None
        row[f"{name}_ci95"] = bootstrap_ratio([(v, 1.0) for v in values], resamples, seed)
        row[f"{name}_prompts"] = len(values)
    return row
