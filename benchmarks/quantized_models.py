"""The default pair on several linear backends in one run: t(1), f(k), c, and the target's numerics against fp32.

Both backends of a model are loaded together and timed rep by rep in turn (load from other processes then falls on
all alike); figures are minima over reps (the least-disturbed run). A target forward is a verification pass (a
logits row per new token), a draft forward a drafting step (one row), each after `--context` cached tokens. c =
draft t(1) / target t(1) on the same backend. Numerics: every backend's target scores the text of `--prompts` held-
out Spec-Bench dev prompts (first turns, no chat template, the first `--max-text-tokens`), one forward each: mean
NLL per token, max |Δlogit| against the first backend (fp32) and the share of positions whose top-1 token agrees
with it.

    .venv/bin/python benchmarks/quantized_models.py [--backends onednn int8] [--reps 5] [--prompts 20]
    .venv/bin/python benchmarks/quantized_models.py --roles target --ks 1 --reps 1   # numerics only
    .venv/bin/python benchmarks/quantized_models.py --backends int8 --loops verispec transformers --ks 1 2 5 8 16

`--loops`: the decoder loops to time on each backend (`verispec.models.lean` against transformers' forward), one
adapter each over the same loaded model; the rows are then named BACKEND/LOOP and a last line gives the loops'
time ratio per k.
"""

from __future__ import annotations

import argparse
import gc
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch

from verispec.bench.files import write_atomically
from verispec.models.hf import HFCausalLM
from verispec.models.loading import load_model
from verispec.prompt_sets import load_prompts
from verispec.provenance import provenance

DEV = "spec-bench:/work/shared/data/spec_bench/dev.jsonl"


def timed_forward(model: HFCausalLM, tokens: list[int], n_logits: int, context: int) -> tuple[float, float]:
    """Return (wall, CPU) seconds of one forward over `tokens` after `context` cached tokens (then rolled back).

    CPU seconds (all threads of this process) leave out the time other processes hold the cores, so on a loaded
    machine they track a kernel's cost where wall time does not."""
    model.truncate(context)
    start, cpu = time.perf_counter(), time.process_time()
    model.forward(tokens, n_logits=n_logits)
    return time.perf_counter() - start, time.process_time() - cpu


def stat(values: list[float], how: str) -> float:
    """The minimum ("min": the least-disturbed run) or the median of `values`."""
    return min(values) if how == "min" else statistics.median(values)


def write_forward_times(args: argparse.Namespace, summary: dict, times: dict) -> None:
    """Write `args.out` (if given) atomically: the arguments, provenance, `summary` and every timing in ms, from
    `times` {model: {setting: {k: [seconds]}}}."""
    if args.out is None:
        return
    record = {"args": {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()},
              "provenance": provenance(), "summary": summary,
              "times_ms": {f"{n}/{s}/{k}": [t * 1e3 for t in v] for n, per in times.items()
                           for s, sizes in per.items() for k, v in sizes.items()}}
    write_atomically(args.out, json.dumps(record, indent=1))
    print(f"wrote {args.out}")


HOWS = ("min", "median")


def settings_args(description: str, reps: int, tokens: list[int], settings: list[str] | None = None
                  ) -> argparse.Namespace:
    """Parse the options of a script that times the default pair's forwards under several settings of one process
    (`settings`: the script's own, of which --settings picks some, the first the one the others are compared with);
    refuse (as argparse does) counts or sizes that leave nothing to time, or no one-token forward to divide by."""
    parser = argparse.ArgumentParser(description=description)
    if settings is not None:
        parser.add_argument("--settings", nargs="+", choices=settings, default=settings,
                            help="the settings to time (the first is the others' baseline)")
    parser.add_argument("--reps", type=int, default=reps, help="forwards per model, setting and size")
    parser.add_argument("--context", type=int, default=128, help="cached tokens before each timed forward")
    parser.add_argument("--tokens", type=int, nargs="+", default=tokens, help="forward sizes k")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--out", type=Path, default=None, help="results JSON (written atomically)")
    args = parser.parse_args()
    if args.reps < 1 or args.context < 1 or min(args.tokens) < 1 or 1 not in args.tokens:
        parser.error("--reps and --context must be >= 1, and --tokens must include 1")
    return args


def cached_context(models: dict[str, HFCausalLM], context: int, tokens: int) -> list[int]:
    """Feed every model the same `context` random tokens (seeded) and return `tokens` more for the timed forwards."""
    gen = torch.Generator().manual_seed(0)
    prefix = torch.randint(1000, 30000, (context,), generator=gen).tolist()
    fresh = torch.randint(1000, 30000, (tokens,), generator=gen).tolist()
    for model in models.values():
        model.reset()
        model.forward(prefix)
    return fresh


def time_settings(models: dict[str, HFCausalLM], settings: list[str], switch: Callable[[HFCausalLM, str], None],
                  args: argparse.Namespace, fresh: list[int]) -> dict[str, dict[str, dict[int, list[float]]]]:
    """Return {model: {setting: {k: [seconds]}}}: `args.reps` forwards of each size k in `args.tokens` per model and
    setting, the settings in turn rep by rep (`switch(model, setting)` selects one), who goes first rotating, so
    that load from other processes falls on all alike. After each switch one forward goes untimed: the first
    forward after the other model's ran about 10 ms slower whatever its size (20% of the target's one-token pass)."""
    times = {name: {s: {k: [] for k in args.tokens} for s in settings} for name in models}
    for rep in range(args.reps):
        for name, model in models.items():
            for setting in settings[rep % len(settings):] + settings[: rep % len(settings)]:
                switch(model, setting)
                timed_forward(model, fresh[:1], 1, args.context)
                for k in args.tokens:
                    times[name][setting][k].append(timed_forward(model, fresh[:k], k, args.context)[0])
    return times


def summarize_settings(times: dict[str, dict[str, dict[int, list[float]]]], base: str, tokens: list[int]) -> dict:
    """Print and return, per model, setting and size k, the min and median ms per forward and their ratios to the
    setting `base` (`{model}/{setting}/t({k})`), then per setting the target's f(k) = t(k) / t(1)
    (`{setting}/f({k})/{how}`)."""
    summary: dict = {}
    settings = list(next(iter(times.values())))
    width = max(map(len, settings))
    for name in times:
        for k in tokens:
            for setting in settings:
                row = {how: stat(times[name][setting][k], how) * 1e3 for how in HOWS}
                row.update({f"vs_{base}_{how}": row[how] / (stat(times[name][base][k], how) * 1e3) for how in HOWS})
                summary[f"{name}/{setting}/t({k})"] = row
                print(f"{name:6s} {setting:{width}s} t({k:2d}) min {row['min']:7.2f} ms  median {row['median']:7.2f} "
                      f"ms  x {base} {row[f'vs_{base}_min']:.3f} / {row[f'vs_{base}_median']:.3f}")
    for setting in settings:
        for how in HOWS:
            one = stat(times["target"][setting][1], how)
            f = {k: stat(times["target"][setting][k], how) / one for k in tokens if k > 1}
            summary.update({f"{setting}/f({k})/{how}": v for k, v in f.items()})
            print(f"target {setting:{width}s} {how:6s} " + "  ".join(f"f({k}) {v:.2f}" for k, v in f.items()))
    return summary


def time_backends(models: dict[str, HFCausalLM], role: str, ks: list[int], context: int, reps: int,
                  gen: torch.Generator) -> dict[str, dict[str, dict[int, float]]]:
    """Return {clock: {backend: {k: seconds}}} per forward of k new tokens for the wall and CPU clocks,
    interleaved rep by rep."""
    vocab = next(iter(models.values())).vocab_size
    prefix = torch.randint(1000, min(vocab, 30000), (context,), generator=gen).tolist()
    fresh = torch.randint(1000, min(vocab, 30000), (max(ks),), generator=gen).tolist()
    for model in models.values():
        model.reset()
        model.forward(prefix)
        timed_forward(model, fresh[:4], 1, context)  # warm-up
    times: dict[str, dict[int, list[tuple[float, float]]]] = {b: {k: [] for k in ks} for b in models}
    for _ in range(reps):
        for backend, model in models.items():
            for k in ks:
                times[backend][k].append(timed_forward(model, fresh[:k], k if role == "target" else 1, context))
    # The minimum over reps: on a shared CPU, the least-disturbed run is the best estimate of the kernel's cost.
    return {clock: {b: {k: min(t[i] for t in v) for k, v in per_k.items()} for b, per_k in times.items()}
            for i, clock in enumerate(("wall", "cpu"))}


@torch.inference_mode()
def numerics(models: dict[str, HFCausalLM], n_prompts: int, max_tokens: int) -> dict[str, dict[str, float]]:
    """Return, per backend, the NLL per token of held-out text and its logit gaps to the first backend."""
    reference_name = next(iter(models))
    tok = models[reference_name].tokenizer
    texts = [p.text for p in load_prompts(DEV, seed=0, offset=100, limit=n_prompts)]
    stats: dict[str, dict[str, list[float]]] = {b: {"nll": [], "dmax": [], "agree": []} for b in models}
    for text in texts:
        ids = tok(text)["input_ids"][:max_tokens]  # long (RAG, summarization) texts are cut: a CPU-sized run
        logits = {}
        for backend, model in models.items():
            model.reset()
            logits[backend] = model.forward(ids, n_logits=len(ids)).logits[:-1]  # [n - 1, V]: predicts ids[1:]
        for backend, rows in logits.items():
            nll = -torch.log_softmax(rows.double(), -1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
            stats[backend]["nll"] += nll.tolist()
            stats[backend]["dmax"].append((rows - logits[reference_name]).abs().max().item())
            stats[backend]["agree"] += (rows.argmax(-1) == logits[reference_name].argmax(-1)).tolist()
    return {b: {"nll": sum(s["nll"]) / len(s["nll"]), "max_dlogit": max(s["dmax"]),
                "top1_agree": sum(s["agree"]) / len(s["agree"]), "tokens": len(s["nll"])} for b, s in stats.items()}


def with_loops(models: dict[str, HFCausalLM], loops: list[str]) -> dict[str, HFCausalLM]:
    """Return `models` as they are for one decoder loop, else one adapter per (backend, loop) over each model."""
    if loops == ["verispec"]:
        return models
    out = {}
    for backend, model in models.items():
        for loop in loops:
            wrapped = HFCausalLM(model.model, model.tokenizer, name=model.name, lean=loop == "verispec")
            wrapped.linear_backend, wrapped.linear_kernel = model.linear_backend, model.linear_kernel
            out[f"{backend}/{loop}"] = wrapped
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backends", nargs="+", default=["onednn", "int8"])
    p.add_argument("--ks", nargs="+", type=int, default=list(range(1, 17)))
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--reps", type=int, default=5)
    p.add_argument("--prompts", type=int, default=20)
    p.add_argument("--max-text-tokens", type=int, default=128, help="tokens scored per prompt text, at most")
    p.add_argument("--roles", nargs="+", default=["draft", "target"])
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--loops", nargs="+", default=["verispec"], choices=["verispec", "transformers"])
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    gen = torch.Generator().manual_seed(0)
    t1: dict[tuple[str, str], dict[str, float]] = {}
    for role in args.roles:
        models = with_loops({b: load_model(None, role, linear_backend=b) for b in args.backends}, args.loops)
        for b, m in models.items():
            print(f"{role} {b}: {m.linear_kernel}", flush=True)
        with torch.inference_mode():
            clocks = time_backends(models, role, args.ks, args.context, args.reps, gen)
        for clock, times in clocks.items():
            for b, per_k in times.items():
                t1.setdefault((clock, b), {})[role] = per_k[1]
                curve = " ".join(f"{per_k[k] / per_k[1]:.2f}" for k in args.ks)
                print(f"{role} {b} ({clock} clock): t(1) {per_k[1] * 1e3:.0f} ms; f(k) for k = "
                      f"{' '.join(map(str, args.ks))}: {curve}", flush=True)
            for b in args.backends if len(args.loops) == 2 else ():
                mine, theirs = times[f"{b}/verispec"], times[f"{b}/transformers"]
                ratios = " ".join(f"{mine[k] / theirs[k]:.2f}" for k in args.ks)
                print(f"{role} {b} ({clock} clock): verispec loop / transformers' forward, k = "
                      f"{' '.join(map(str, args.ks))}: {ratios}", flush=True)
        if role == "target":
            for b, s in numerics(models, args.prompts, args.max_text_tokens).items():
                print(f"target {b}: NLL/token {s['nll']:.4f} over {s['tokens']} tokens; max |dlogit| vs "
                      f"{next(iter(models))} {s['max_dlogit']:.3f}; top-1 agreement {s['top1_agree']:.3f}", flush=True)
        del models
        gc.collect()
    first = next(iter(t1))[1] if t1 else args.backends[0]
    for clock, b in t1 if len(args.roles) == 2 else ():
        base = t1[clock, first]
        print(f"{b} ({clock} clock): c = {t1[clock, b]['draft'] / t1[clock, b]['target']:.3f}; target t(1) vs "
              f"{first} {t1[clock, b]['target'] / base['target']:.3f}x, draft t(1) vs {first} "
              f"{t1[clock, b]['draft'] / base['draft']:.3f}x")


if __name__ == "__main__":
    main()
