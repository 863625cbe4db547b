"""torch's threads while the llama.cpp draft runs: the engine's rule (`verispec.models.threads`) against none, paired.

With the draft in llama.cpp and the target in torch, both thread pools share the cores. The engine keeps torch at
one thread outside the target's forwards, so that no OpenMP worker spins while llama.cpp computes. This script
decodes the same prompts with the rule on and off (`verispec.engine.shared_cores` replaced by a pass-through),
alternating which arm goes first from prompt to prompt, and prints the ratio of total time per token with a 95%
percentile-bootstrap interval over prompts, per drafter. Both arms write the same tokens (checked).

    .venv/bin/python benchmarks/thread_sharing.py [--prompts 10] [--offset 20] [--drafters model hybrid]
        [--out results/thread-sharing.json]

HumanEval problems from position `--offset` of the seed-0 order (the main llama.cpp runs use positions 0-19);
int8 target, llama.cpp draft (needs `make peers`), T = 0, γ = 4, 128 new tokens.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

import verispec.engine
from verispec.api import Decoder
from verispec.bench.datasets import load_prompts
from verispec.bench.files import write_atomically
from verispec.stats import paired_speedup

ARMS = ("rule", "none")


@contextlib.contextmanager
def _no_rule(*models: Any) -> Iterator[tuple[Any, ...]]:
    yield models


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=int, default=10)
    parser.add_argument("--offset", type=int, default=20)
    parser.add_argument("--drafters", nargs="+", default=["model", "hybrid"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", default="results/thread-sharing.json")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    rule = verispec.engine.shared_cores
    decoder = Decoder(None, "llamacpp:default", linear_backend="int8")
    prompts = load_prompts("humaneval", limit=args.prompts, seed=0, offset=args.offset)
    decoder.generate("def f(x):", method="sd", gamma=4, max_new_tokens=8, temperature=0)  # load and warm up
    records: list[dict[str, Any]] = []
    for drafter in args.drafters:
        for i, prompt in enumerate(prompts):
            tokens = {}
            for arm in ARMS if i % 2 == 0 else ARMS[::-1]:
                verispec.engine.shared_cores = rule if arm == "rule" else _no_rule
                start = time.perf_counter()
                out = decoder.generate(prompt.text, method="sd", gamma=4, max_new_tokens=128, temperature=0,
                                       drafter=drafter)
                seconds = time.perf_counter() - start
                tokens[arm] = out.tokens
                records.append({"drafter": drafter, "prompt": i, "arm": arm, "seconds": seconds,
                                "tokens": len(out.tokens), "draft_calls": out.trace.draft_calls,
                                "target_calls": out.trace.target_calls})
                print(f"{drafter:7s} prompt {i:2d} {arm:5s} {seconds / len(out.tokens) * 1e3:6.1f} ms/token",
                      flush=True)
            if tokens["rule"] != tokens["none"]:
                raise SystemExit(f"the two arms wrote different tokens on prompt {i} ({drafter})")
    verispec.engine.shared_cores = rule
    summary = []
    for drafter in args.drafters:
        pairs = {arm: [(r["seconds"], r["tokens"]) for r in records if r["drafter"] == drafter and r["arm"] == arm]
                 for arm in ARMS}
        speedup, interval = paired_speedup(pairs["none"], pairs["rule"], 2000, 0)
        ms = {arm: sum(s for s, _ in pairs[arm]) / sum(n for _, n in pairs[arm]) * 1e3 for arm in ARMS}
        summary.append({"drafter": drafter, "ms_per_token_rule": ms["rule"], "ms_per_token_none": ms["none"],
                        "speedup_of_rule": speedup, "ci95": interval})
        low, high = interval if interval is not None else (float("nan"), float("nan"))
        print(f"{drafter}: rule {ms['rule']:.1f} ms/token, none {ms['none']:.1f}: the rule runs {speedup:.3f}x "
              f"[{low:.3f}, {high:.3f}] over {len(pairs['rule'])} prompts")
    payload = {"settings": vars(args), "linear_kernels": decoder.linear_kernels(), "summary": summary,
               "records": records}
    write_atomically(Path(args.out), json.dumps(payload, indent=1, default=list) + "\n")
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
