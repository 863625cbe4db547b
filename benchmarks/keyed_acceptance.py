"""What keyed draws cost in acceptance, without decoding noise: at every position of the target's own output, the
probability that a token the draft model drew is kept, by token verification (1 − TV(p, q)) and by keyed
verification (m(p, q), docs/algorithms.md §0.1), on the same laws.

Per prompt: the target writes its output with keyed `ar` at the temperature (the default path's models, no flags);
one pass of each model over prompt + output then gives p and q at every output position, processed at that
temperature. Lookup tokens are kept with probability p(x) by both rules, so only the draft model's tokens differ.
The summary gives both means over all positions, their ratio, and what they make of a round of γ = 4 with
per-token acceptance α (E = (1 − α^5) / (1 − α) tokens per target pass).

    PYTHONPATH=. .venv/bin/python benchmarks/keyed_acceptance.py --offset 100 --limit 20 \\
        --prompts spec-bench:../shared/data/spec_bench/dev.jsonl --out benchmarks/results/keyed-acceptance-dev.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path

import torch

from verispec.api import Decoder
from verispec.bench.files import write_atomically
from verispec.config import DecodeConfig
from verispec.drafters.adaptive import expected_tokens
from verispec.prompt_sets import load_prompts
from verispec.provenance import machine_description
from verispec.sampling import SamplingConfig, process_logits
from verispec.verify.keyed import match_probability


def position_laws(model, tokens: list[int], n: int, sampling: SamplingConfig) -> torch.Tensor:
    """Return the processed laws `[n, V]` of the last `n` tokens of `tokens`, each given the tokens before it."""
    model.reset()
    logits = model.forward(tokens, n_logits=n + 1).logits[:n]
    model.reset()
    return process_logits(logits, sampling)


def measure(decoder: Decoder, text: str, temperature: float, max_new_tokens: int, seed: int) -> dict:
    """One prompt: keyed `ar`'s output, then each position's acceptance by both rules."""
    prompt = decoder.encode_prompt(text)
    config = DecodeConfig("ar", max_new_tokens=max_new_tokens, seed=seed, keyed_draws=True,
                          sampling=SamplingConfig(temperature=temperature))
    output = decoder.engine(config).decode(prompt, config).tokens
    sampling = config.sampling
    p = position_laws(decoder.model("target"), prompt + output, len(output), sampling)
    q = position_laws(decoder.model("draft"), prompt + output, len(output), sampling)
    tv_kept = 1.0 - 0.5 * (p - q).abs().sum(-1)
    keyed_kept = match_probability(p, q)
    return {"prompt_tokens": len(prompt), "output_tokens": len(output), "tv": tv_kept.tolist(),
            "keyed": keyed_kept.tolist()}


def summary(records: list[dict]) -> dict:
    tv = [a for r in records for a in r["tv"]]
    keyed = [a for r in records for a in r["keyed"]]
    alpha_tv, alpha_keyed = statistics.fmean(tv), statistics.fmean(keyed)
    return {"positions": len(tv), "alpha_tv": alpha_tv, "alpha_keyed": alpha_keyed,
            "keyed_over_tv": alpha_keyed / alpha_tv,
            "tokens_per_round_gamma4_tv": expected_tokens(alpha_tv, 4),
            "tokens_per_round_gamma4_keyed": expected_tokens(alpha_keyed, 4),
            "per_prompt_keyed_over_tv": [statistics.fmean(r["keyed"]) / statistics.fmean(r["tv"]) for r in records]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--prompts", default="humaneval")
    parser.add_argument("--subset-seed", type=int, default=0)
    parser.add_argument("--offset", type=int, default=0)
    parser.add_argument("--limit", type=int, default=20)
    parser.add_argument("--temperatures", type=float, nargs="+", default=[1.0])
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    prompts = load_prompts(args.prompts, limit=args.limit, seed=args.subset_seed, offset=args.offset)
    decoder = Decoder()
    decoder.model("target"), decoder.model("draft")  # loaded before the kernels are described
    results: dict = {"machine": machine_description(), "args": vars(args), "kernels": decoder.linear_kernels(),
                     "by_temperature": {}}
    for temperature in args.temperatures:
        records = []
        for i, prompt in enumerate(prompts):
            start = time.perf_counter()
            record = measure(decoder, prompt.text, temperature, args.max_new_tokens, seed=i)
            records.append({"id": prompt.id, "category": prompt.category, **record})
            print(f"T={temperature} {i + 1}/{len(prompts)} {prompt.id}: kept {statistics.fmean(record['tv']):.3f} "
                  f"(TV) {statistics.fmean(record['keyed']):.3f} (keyed), {time.perf_counter() - start:.1f} s",
                  flush=True)
        results["by_temperature"][str(temperature)] = {"summary": summary(records), "records": records}
        print(json.dumps({k: v for k, v in summary(records).items() if not k.startswith("per_prompt")}), flush=True)
    write_atomically(Path(args.out), json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
