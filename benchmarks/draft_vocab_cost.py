"""The reduced draft head: its cost c (draft forward / target forward) and acceptance α for N ∈ {full, 32k, 16k, 8k},
the fixed head of N tokens against the head that also covers the context's tokens (the default).

For each prompt the target writes a greedy continuation; then the target and each draft head score that same text
in one teacher-forced forward, giving per position α(T=1) = Σ_v min(p, q) and α(T=0) = [argmax q = argmax p]
(the acceptance of token-level verification at that position; a context head covers, at each position, the tokens up
to it). c is the median time of a 1-token forward after the prompt (cache filled), draft over target. Draft heads
load one at a time (each a copy: the head is sliced at load).

    PYTHONPATH=. .venv/bin/python benchmarks/draft_vocab_cost.py --prompts 6 --new-tokens 48 --out results/vocab.json
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from verispec.api import Decoder
from verispec.bench.files import write_atomically
from verispec.engine import DecodeConfig, Engine
from verispec.models.loading import load_model
from verispec.prompt_sets import load_prompts


def median_forward_seconds(model: Any, ids: list[int], repeats: int) -> float:
    """Return the median time of a 1-token forward after `ids` (the cache is rolled back after each)."""
    model.reset()
    model.forward(ids[:-1], n_logits=1)
    base = model.cache_length
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        model.forward(ids[-1:], n_logits=1)
        times.append(time.perf_counter() - start)
        model.truncate(base)
    return statistics.median(times)


def teacher_forced_probs(model: Any, ids: list[int], n: int) -> torch.Tensor:
    """Return softmax probabilities `[n, V]` (float32) predicting the last n tokens of `ids`."""
    model.reset()
    logits = model.forward(ids[:-1], n_logits=n).logits  # [n, V]
    return torch.softmax(logits.float(), dim=-1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=6, help="half from MT-Bench, half from HumanEval")
    parser.add_argument("--new-tokens", type=int, default=48)
    parser.add_argument("--vocabs", type=int, nargs="+", default=[32768, 16384, 8192])
    parser.add_argument("--repeats", type=int, default=30)
    parser.add_argument("--linear-backend", default="onednn")
    parser.add_argument("--out", default="results/draft_vocab_cost.json")
    args = parser.parse_args()
    half = max(args.prompts // 2, 1)
    prompts = load_prompts("mt-bench", limit=half) + load_prompts("humaneval", limit=args.prompts - half)

    target = load_model(None, "target", linear_backend=args.linear_backend)
    encode = Decoder(target, None)
    texts = []
    for prompt in prompts:
        ids = encode.encode_prompt(prompt.text)
        out = Engine(target).decode(ids, DecodeConfig("ar", max_new_tokens=args.new_tokens))
        texts.append((ids + out.tokens, len(out.tokens)))
    p_rows = [teacher_forced_probs(target, ids, n) for ids, n in texts]
    t_target = statistics.median(median_forward_seconds(target, ids[: -n or None], args.repeats) for ids, n in texts)
    del target, encode
    gc.collect()

    rows = []
    heads = [(None, False)] + [(vocab, context) for vocab in args.vocabs for context in (False, True)]
    for vocab, context in heads:
        draft = load_model(None, "draft", linear_backend=args.linear_backend, draft_vocab=vocab, context_vocab=context)
        alpha1, alpha0 = [], []
        for (ids, n), p in zip(texts, p_rows, strict=True):
            q = teacher_forced_probs(draft, ids, n)
            alpha1 += torch.minimum(p, q).sum(-1).tolist()
            alpha0 += (p.argmax(-1) == q.argmax(-1)).float().tolist()
        t_draft = statistics.median(median_forward_seconds(draft, ids[: -n or None], args.repeats)
                                    for ids, n in texts)
        rows.append({"draft_vocab": vocab or "full", "context": context, "draft_forward_s": t_draft,
                     "c": t_draft / t_target,
                     "alpha_T1": statistics.fmean(alpha1), "alpha_T0": statistics.fmean(alpha0),
                     "positions": len(alpha1)})
        print(json.dumps(rows[-1]), flush=True)
        del draft
        gc.collect()
    result = {"target_forward_s": t_target, "rows": rows, "prompts": [p.source + ":" + p.id for p in prompts],
              "new_tokens": args.new_tokens, "linear_backend": args.linear_backend, "threads": torch.get_num_threads(),
              "load_average": os.getloadavg()}
    write_atomically(Path(args.out), json.dumps(result, indent=1))
    print("| N | context | c | α (T=1) | α (T=0) |\n|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['draft_vocab']} | {r['context']} | {r['c']:.3f} | {r['alpha_T1']:.3f} | {r['alpha_T0']:.3f} |")


if __name__ == "__main__":
    main()
