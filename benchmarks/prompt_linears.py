"""What reads prompts on the int4 path: fbgemm's int8 copy against oneDNN's bfloat16 copy (AMX where the CPU has it).

Two measurements, the two copies alternating rep by rep in one process:
1. each linear shape of the default target at prompt sizes: time, GFLOP/s and the ratio;
2. the default target's whole prompt forward (int4 backend, the copies the only difference) on Spec-Bench prompts of
   the summarization and RAG categories, cut to fixed lengths: time per prompt forward, and how far each copy's
   last-position logits are from the float32 model's (oneDNN, the GGUF's weights dequantized): max |Δ|, and
   whether the top token is the same.

    PYTHONPATH=. .venv/bin/python benchmarks/prompt_linears.py \
        --prompts spec-bench:../shared/data/spec_bench/dev.jsonl --out results/prompt-linears.json
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from verispec.bench.files import write_atomically
from verispec.models.int4 import use_int4_linears
from verispec.models.loading import load_model
from verispec.models.prompt_linear import amx_available, prompt_layer
from verispec.prompt_sets import load_prompts
from verispec.provenance import machine_description

SHAPES = {"q/o (1536 x 1536)": (1536, 1536), "k/v (256 x 1536)": (256, 1536), "gate/up (8960 x 1536)": (8960, 1536),
          "down (1536 x 8960)": (1536, 8960)}


def alternate(fns: dict[str, Any], reps: int) -> dict[str, list[float]]:
    """Return each callable's times over `reps` rounds, the callables taking turns (after one warm-up call each)."""
    for fn in fns.values():
        fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            start = time.perf_counter()
            fn()
            times[name].append(time.perf_counter() - start)
    return times


def layer_table(rows: list[int], reps: int) -> list[dict[str, Any]]:
    out = []
    for label, (n, k) in SHAPES.items():
        gen = torch.Generator().manual_seed(n + k)
        weight = torch.randn(n, k, generator=gen) * 0.02
        copies = {"int8": prompt_layer(weight, None, "int8"), "bf16": prompt_layer(weight, None, "bf16")}
        for t in rows:
            x = torch.randn(t, k, generator=gen)
            times = alternate({name: (lambda c=c, x=x: c(x)) for name, c in copies.items()}, reps)
            best = {name: min(v) for name, v in times.items()}
            flops = 2 * t * n * k
            row = {"layer": label, "rows": t, **{f"{name}_ms": 1e3 * s for name, s in best.items()},
                   **{f"{name}_gflops": flops / s / 1e9 for name, s in best.items()},
                   "bf16_speedup": best["int8"] / best["bf16"]}
            print(f"{label:24s} {t:5d} rows: int8 {row['int8_ms']:7.2f} ms ({row['int8_gflops']:5.0f} GFLOP/s)  "
                  f"bf16 {row['bf16_ms']:7.2f} ms ({row['bf16_gflops']:5.0f})  bf16 {row['bf16_speedup']:.2f}x",
                  flush=True)
            out.append(row)
    return out


def target_with(prompt: str) -> Any:
    model = load_model(None, "target", linear_backend="torch")
    use_int4_linears(model.model, lm_head=model.model.get_output_embeddings(), prompt=prompt)
    return model


def model_table(source: str, lengths: list[int], count: int, reps: int) -> list[dict[str, Any]]:
    reference = load_model(None, "target", linear_backend="onednn")
    models = {fmt: target_with(fmt) for fmt in ("int8", "bf16")}
    gc.collect()
    tokenizer = models["int8"].tokenizer
    texts = [p.text for p in load_prompts(source, category=["summarization", "rag"], seed=0)]
    ids = [tokenizer(text)["input_ids"] for text in texts]
    out = []
    for length in lengths:
        chosen = [x[:length] for x in ids if len(x) >= length][:count]
        for i, prompt in enumerate(chosen):
            logits = {}

            def forward(fmt: str, prompt: list[int] = prompt, logits: dict = logits) -> None:
                models[fmt].reset()
                logits[fmt] = models[fmt].forward(prompt, n_logits=1).logits[0]

            times = alternate({fmt: (lambda fmt=fmt: forward(fmt)) for fmt in models}, reps)
            med = {fmt: statistics.median(v) for fmt, v in times.items()}
            reference.reset()
            exact = reference.forward(prompt, n_logits=1).logits[0]
            row = {"length": length, "prompt": i, **{f"{fmt}_s": s for fmt, s in med.items()},
                   "bf16_speedup": med["int8"] / med["bf16"]}
            for fmt in models:
                row[f"{fmt}_max_abs_logit_diff_fp32"] = float((logits[fmt] - exact).abs().max())
                row[f"{fmt}_same_top_fp32"] = bool(logits[fmt].argmax() == exact.argmax())
            print(f"{length:5d} tokens, prompt {i}: int8 {row['int8_s']:.3f} s  bf16 {row['bf16_s']:.3f} s  "
                  f"bf16 {row['bf16_speedup']:.2f}x  max|Δlogit| vs fp32: int8 "
                  f"{row['int8_max_abs_logit_diff_fp32']:.3f}, bf16 {row['bf16_max_abs_logit_diff_fp32']:.3f}; "
                  f"same top: {row['int8_same_top_fp32']}, {row['bf16_same_top_fp32']}", flush=True)
            out.append(row)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--prompts", default="spec-bench:../shared/data/spec_bench/dev.jsonl")
    p.add_argument("--rows", type=int, nargs="+", default=[128, 512])
    p.add_argument("--lengths", type=int, nargs="+", default=[256, 1024])
    p.add_argument("--count", type=int, default=3, help="prompts per length")
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--skip-model", action="store_true", help="the per-layer table only")
    p.add_argument("--skip-layers", action="store_true", help="the prompt forwards only")
    p.add_argument("--out", required=True)
    args = p.parse_args()
    result: dict[str, Any] = {"machine": machine_description(), "amx": amx_available(),
                              "threads": torch.get_num_threads(),
                              "layers": [] if args.skip_layers else layer_table(args.rows, args.reps)}
    if not args.skip_model:
        result["prompt_forwards"] = rows = model_table(args.prompts, args.lengths, args.count, args.reps)
        for length in args.lengths:
            at = [r for r in rows if r["length"] == length]
            ratio = sum(r["int8_s"] for r in at) / sum(r["bf16_s"] for r in at)
            print(f"{length} tokens: bf16 copy {ratio:.2f}x the int8 copy's speed over {len(at)} prompts")
    write_atomically(Path(args.out), json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
