"""vLLM's CPU build on the default pair: what runs, its start-up and tokens/s, and verispec's drafter and rules
inside it against vLLM's own speculative methods, on the same prompts in one run.

Run with vLLM's virtualenv (`make vllm`); it needs the float copy of the pair (`verispec setup --float`), since
vLLM's CPU build loads Hugging Face folders:

    .venv-vllm/bin/python benchmarks/vllm_peer.py --prompts 8 --max-tokens 64 \
        --out benchmarks/results/vllm-peer-humaneval-T0.json

Each configuration runs in a fresh process (`verispec.vllm.run`): load, one untimed warm-up pass over the prompts,
then `--repeat` timed passes; the prompts go in as one batch, as a vLLM user sends them. The configurations run in
order and then again in reverse order (A B C ... C B A), so a drift of the machine's speed shows as a difference
between a configuration's two runs. Greedy (T = 0) by default: there every rule emits vLLM's own greedy tokens, so
the comparison is of drafters and overhead, not of quality.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from verispec.bench.files import write_atomically
from verispec.models.default_pair import DRAFT, TARGET, converted_dir
from verispec.prompt_sets import load_prompts
from verispec.provenance import provenance
from verispec.vllm.run import run_in_subprocess

NGRAM = {"method": "ngram", "prompt_lookup_min": 2, "prompt_lookup_max": 4}
VERISPEC_NGRAM = {"method": "custom_class", "model": "verispec.vllm.proposer.NgramProposer"}
# the hybrid's draft model is the embedded default draft, on verispec's kernels (VERISPEC_VLLM_DRAFT unset)
VERISPEC_HYBRID = {"method": "custom_class", "model": "verispec.vllm.proposer.HybridProposer"}


def configurations(gamma: int) -> dict[str, tuple[dict | None, str | None]]:
    """Return name -> (speculative_config, verispec rule) for every configuration measured."""
    draft = {"method": "draft_model", "model": str(converted_dir(DRAFT))}
    return {
        "vllm-plain": (None, None),
        "vllm-ngram": (NGRAM | {"num_speculative_tokens": gamma}, None),
        "vllm-draft-model": (draft | {"num_speculative_tokens": gamma}, None),
        "verispec-ngram+bv": (VERISPEC_NGRAM | {"num_speculative_tokens": gamma}, "bv"),
        "verispec-hybrid+bv": (VERISPEC_HYBRID | {"num_speculative_tokens": gamma}, "bv"),
        "vllm-draft-model+verispec-bv": (draft | {"num_speculative_tokens": gamma}, "bv"),
    }


def run_one(args: argparse.Namespace, prompts: list[list[int]], spec: dict | None, rule: str | None) -> dict:
    """Run one configuration in a fresh process; return its result (or its error)."""
    engine = {"model": str(converted_dir(TARGET)), "dtype": args.dtype, "enforce_eager": True,
              "max_model_len": 2048, "max_num_seqs": len(prompts), "max_num_batched_tokens": 2048, "seed": 0,
              "disable_log_stats": False}
    if spec:
        engine["speculative_config"] = spec
    job = {"engine": engine, "prompts": prompts, "max_tokens": args.max_tokens, "temperature": args.temperature,
           "seeds": list(range(len(prompts))), "ignore_eos": True, "rule": rule, "repeat": 1 + args.repeat}
    env = {"HF_HUB_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": str(args.kv_gib), "VLLM_CPU_OMP_THREADS_BIND": args.cores,
           "VLLM_CPU_NUM_OF_RESERVED_CPU": "0"}
    result, stderr = run_in_subprocess(job, env)
    if result is None:
        return {"error": stderr[-3000:]}
    tokens = sum(len(out) for out in result["outputs"])
    result["tokens_per_s"] = [tokens / s for s in result["generate_seconds"][1:]]  # the first pass is the warm-up
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--source", default="humaneval")
    parser.add_argument("--prompts", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--temperature", type=float, default=0.0)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=1, help="timed passes per configuration and round")
    parser.add_argument("--dtype", default="float32")
    parser.add_argument("--kv-gib", type=int, default=2)
    parser.add_argument("--cores", default="0-1", help="VLLM_CPU_OMP_THREADS_BIND")
    parser.add_argument("--only", nargs="*", help="configuration names to run (default: all)")
    parser.add_argument("--out", default="benchmarks/results/vllm-peer.json")
    args = parser.parse_args()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(converted_dir(TARGET))
    texts = [p.text for p in load_prompts(args.source, limit=args.prompts)]
    prompts = [tokenizer(text)["input_ids"] for text in texts]
    configs = {k: v for k, v in configurations(args.gamma).items() if not args.only or k in args.only}
    order = list(configs) + list(configs)[::-1]
    runs: dict[str, list[dict]] = {name: [] for name in configs}
    for name in order:
        result = run_one(args, prompts, *configs[name])
        runs[name].append(result)
        if "error" in result:
            print(f"{name}: failed: {result['error'].splitlines()[-1:]}", flush=True)
        else:
            rates = ", ".join(f"{t:.2f}" for t in result["tokens_per_s"])
            print(f"{name}: load {result['load_seconds']:.0f} s, {rates} tok/s", flush=True)
    base = [t for r in runs["vllm-plain"] for t in r.get("tokens_per_s", [])] if "vllm-plain" in runs else []
    summary = {}
    for name, results in runs.items():
        rates = [t for r in results for t in r.get("tokens_per_s", [])]
        summary[name] = {"tokens_per_s": rates, "mean_tokens_per_s": sum(rates) / len(rates) if rates else None,
                         "load_seconds": [r.get("load_seconds") for r in results],
                         "errors": [r["error"][-600:] for r in results if "error" in r]}
        if base and rates:
            summary[name]["over_plain"] = summary[name]["mean_tokens_per_s"] / (sum(base) / len(base))
        # the prompts whose tokens equal vLLM's plain decoding (all of them, at T = 0, for a lossless rule)
        reference = next((r["outputs"] for r in runs.get("vllm-plain", []) if "outputs" in r), None)
        outputs = next((r["outputs"] for r in results if "outputs" in r), None)
        if reference and outputs:
            summary[name]["prompts_equal_to_plain"] = sum(a == b for a, b in zip(outputs, reference, strict=True))
    for results in runs.values():
        for r in results:
            r.pop("outputs", None)
    write_atomically(Path(args.out), json.dumps({**provenance(), "args": vars(args), "summary": summary,
                                                 "runs": runs}, indent=1))
    for name, s in summary.items():
        ratio = f"{s['over_plain']:.2f}x plain" if s.get("over_plain") else "-"
        mean = f"{s['mean_tokens_per_s']:.2f}" if s["mean_tokens_per_s"] else "failed"
        print(f"{name:<30} {mean:>8} tok/s  {ratio}")
    print(f"results: {args.out}")


if __name__ == "__main__":  # vLLM's engine processes re-import the main module
    main()
