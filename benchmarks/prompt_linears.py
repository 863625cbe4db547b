"""What reads prompts on the int4 path: the 4-bit kernel itself, fbgemm's int8 copy, oneDNN's bfloat16 copy (AMX
where the CPU has it; measured only where oneDNN runs bfloat16), or an int8 copy on verispec's 8-bit kernel (where it
runs on AMX tiles; the layers already on that kernel then read prompts themselves).

Two measurements, the readers alternating rep by rep in one process:
1. each linear shape of the default target at prompt sizes, 4-bit levels at random: time, GFLOP/s and the ratios to
   the kernel;
2. the default target's whole prompt forward (loaded from its GGUF as decoding loads it; each layer's prompt reader
   the only difference) on Spec-Bench prompts of the summarization and RAG categories, cut to fixed lengths: time
   per prompt forward, and how far each reader's last-position logits are from float32 ones (each layer's
   dequantized weights in torch's float32 linear): max |Δ|, and whether the top token is the same.

    PYTHONPATH=. .venv/bin/python benchmarks/prompt_linears.py \
        --prompts spec-bench:../shared/data/spec_bench/dev.jsonl --out benchmarks/results/prompt-readers.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from verispec.bench.files import write_atomically
from verispec.models.int4 import Int4Linear, KernelLinear, layer_prompt_copy, prompt_copy_of
from verispec.models.loading import load_model
from verispec.models.prompt_linear import amx_available, kernel_tiles, onednn_bf16
from verispec.prompt_sets import load_prompts
from verispec.provenance import machine_description

SHAPES = {"q/o (1536 x 1536)": (1536, 1536), "k/v (256 x 1536)": (256, 1536), "gate/up (8960 x 1536)": (8960, 1536),
          "down (1536 x 8960)": (1536, 8960)}


def copy_formats(whole_model: bool = False) -> list[str]:
    """The prompt copies measured on this host: int8, bf16 where oneDNN runs it (torch's own is not a contender;
    whole prompt forwards in bf16 only with AMX: without, its layers alone take several times the kernel's time),
    and int8-rows where the 8-bit kernel has AMX tiles."""
    formats = ["int8", "bf16"] if (amx_available() if whole_model else onednn_bf16()) else ["int8"]
    return formats + (["int8-rows"] if kernel_tiles() else [])


class FloatCopy:
    """A layer's dequantized weights in torch's float32 linear: the reference the readers are compared with."""

    def __init__(self, layer: KernelLinear, bias: torch.Tensor | None) -> None:
        self.weight, self.bias = layer.dequantized(), bias

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        return torch.nn.functional.linear(x.float(), self.weight, self.bias).to(x.dtype)

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
        q = torch.randint(0, 16, (n, k), generator=gen, dtype=torch.uint8)
        scale = (torch.rand(n, k // 32, generator=gen) * 0.004).half()
        offset = (-torch.rand(n, k // 32, generator=gen) * 0.03).half()
        kernel = Int4Linear(q, scale, offset, None)
        weight = kernel.dequantized()
        readers = {"kernel": kernel._run, **{fmt: prompt_copy_of(weight, None, fmt) for fmt in copy_formats()}}
        for t in rows:
            x = torch.randn(t, k, generator=gen)
            times = alternate({name: (lambda r=r, x=x: r(x)) for name, r in readers.items()}, reps)
            best = {name: min(v) for name, v in times.items()}
            flops = 2 * t * n * k
            row = {"layer": label, "rows": t, **{f"{name}_ms": 1e3 * s for name, s in best.items()},
                   **{f"{name}_gflops": flops / s / 1e9 for name, s in best.items()},
                   **{f"{name}_over_kernel": best[name] / best["kernel"] for name in best}}
            print(f"{label:24s} {t:5d} rows: " + "  ".join(
                f"{name} {1e3 * best[name]:7.2f} ms ({row[name + '_gflops']:4.0f} GFLOP/s, "
                f"{row[name + '_over_kernel']:.2f}x)" for name in best), flush=True)
            out.append(row)
    return out


def reader(layer: KernelLinear, bias: torch.Tensor | None, fmt: str) -> Any:
    """Return `layer`'s prompt reader in `fmt` (a copy, `FloatCopy`, or None for the layer itself), as decoding
    builds it."""
    return FloatCopy(layer, bias) if fmt == "float32" else layer_prompt_copy(layer, bias, fmt)


def set_readers(model: Any, fmt: str, cache: dict[str, dict[int, Any]]) -> None:
    """Give every kernel layer of `model` (but the LM head) the prompt reader `fmt`: "kernel" (none), a copy in
    int8, int8-rows or bf16, or "float32" (`FloatCopy`); each built once and kept in `cache`."""
    head = model.model.get_output_embeddings()
    for module in model.model.modules():
        layer = getattr(module, "quantized", None)
        if not isinstance(layer, KernelLinear) or module is head:
            continue
        built = cache.setdefault(fmt, {})
        if fmt != "kernel" and id(layer) not in built:
            built[id(layer)] = reader(layer, module.bias, fmt)
        layer.prompt_linear = built.get(id(layer))


def model_table(source: str, lengths: list[int], count: int, reps: int) -> list[dict[str, Any]]:
    model = load_model(None, "target", linear_backend="int4")
    readers: dict[str, dict[int, Any]] = {}
    formats = ["kernel", *copy_formats(whole_model=True)]
    texts = [p.text for p in load_prompts(source, category=["summarization", "rag"], seed=0)]
    ids = [model.tokenizer(text)["input_ids"] for text in texts]
    out = []
    for length in lengths:
        chosen = [x[:length] for x in ids if len(x) >= length][:count]
        for i, prompt in enumerate(chosen):
            logits = {}

            def forward(fmt: str, prompt: list[int] = prompt, logits: dict = logits) -> None:
                set_readers(model, fmt, readers)
                model.reset()
                logits[fmt] = model.forward(prompt, n_logits=1).logits[0]

            times = alternate({fmt: (lambda fmt=fmt: forward(fmt)) for fmt in formats}, reps)
            med = {fmt: statistics.median(v) for fmt, v in times.items()}
            forward("float32")
            exact = logits.pop("float32")
            row = {"length": length, "prompt": i, **{f"{fmt}_s": s for fmt, s in med.items()},
                   **{f"{fmt}_over_kernel": med[fmt] / med["kernel"] for fmt in formats}}
            for fmt in formats:
                row[f"{fmt}_max_abs_logit_diff_fp32"] = float((logits[fmt] - exact).abs().max())
                row[f"{fmt}_same_top_fp32"] = bool(logits[fmt].argmax() == exact.argmax())
            print(f"{length:5d} tokens, prompt {i}: " + "  ".join(
                f"{fmt} {row[fmt + '_s']:.3f} s ({row[fmt + '_over_kernel']:.2f}x), max|Δlogit| vs fp32 "
                f"{row[fmt + '_max_abs_logit_diff_fp32']:.3f}, same top {row[fmt + '_same_top_fp32']}"
                for fmt in formats), flush=True)
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
    result: dict[str, Any] = {"machine": machine_description(), "amx": amx_available(), "onednn_bf16": onednn_bf16(),
                              "threads": torch.get_num_threads(),
                              "layers": [] if args.skip_layers else layer_table(args.rows, args.reps)}
    if not args.skip_model:
        result["prompt_forwards"] = rows = model_table(args.prompts, args.lengths, args.count, args.reps)
        for length in args.lengths:
            at = [r for r in rows if r["length"] == length]
            for fmt in copy_formats(whole_model=True):
                ratio = sum(r[f"{fmt}_s"] for r in at) / sum(r["kernel_s"] for r in at)
                print(f"{length} tokens: the {fmt} copy takes {ratio:.2f}x the kernel's time over {len(at)} prompts")
            if "int8-rows" in copy_formats(whole_model=True) and "bf16" in copy_formats(whole_model=True):
                ratio = sum(r["int8-rows_s"] for r in at) / sum(r["bf16_s"] for r in at)
                print(f"{length} tokens: the int8-rows copy takes {ratio:.2f}x the bf16 copy's time")
    write_atomically(Path(args.out), json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
