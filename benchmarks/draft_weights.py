"""The draft's weights against one target: what each draft linear backend (and reduced head) costs (c) and how much
the target accepts of it (exact expected acceptance), without decoding noise.

Each draft backend loads the same draft model; the target loads once. A backend may name a reduced head,
`int4-rounded:vocab=16384` (`--draft-vocab 16384` of `verispec generate`: the 16,384 best-ranked tokens plus the
context's, docs/algorithms.md §6.1); its q is exactly the softmax over that set, so its α is what decoding gets.
Cost: one-token forwards after `--context` cached tokens, the target's and every draft's in turn, rep by rep
(minimum over reps: the least-disturbed run); c = draft t(1) / target t(1). Acceptance: the target writes its greedy
answer to each prompt (chat template, up to `--max-new-tokens`), then the target and every draft score the answer
after the prompt in decode-sized forwards (as decoding computes them: longer forwards would run the int4 path's
prompt copies). Over the answer's positions, α at T = 1 is the mean of Σ_x min(p(x), q(x)) (the exact probability
that speculative sampling accepts one drafted token there) and at T = 0 the share of positions where the draft's top
token is the target's.

    .venv/bin/python benchmarks/draft_weights.py --target-backend int4 --draft-backends int4 int4-rounded \\
        --prompts humaneval --limit 20 --out benchmarks/results/draft-weights-int4.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

from verispec.api import Decoder
from verispec.bench.files import write_atomically
from verispec.models.loading import load_model
from verispec.prompt_sets import load_prompts
from verispec.provenance import provenance

sys.path.insert(0, str(Path(__file__).resolve().parent))
from quantized_models import timed_forward  # noqa: E402  (a sibling script: the same timing for both)


def costs(target, drafts: dict, context: int, reps: int, gen: torch.Generator) -> dict[str, float]:
    """Return t(1) in seconds of the target ("target") and of each draft, timed in turn rep by rep."""
    models = {"target": target, **drafts}
    prefix = torch.randint(1000, 30000, (context,), generator=gen).tolist()
    token = torch.randint(1000, 30000, (1,), generator=gen).tolist()
    for model in models.values():
        model.reset()
        model.forward(prefix)
        timed_forward(model, token, 1, context)  # warm-up
    times: dict[str, list[float]] = {name: [] for name in models}
    for _ in range(reps):
        for name, model in models.items():
            times[name].append(timed_forward(model, token, 1, context)[0])
    return {name: min(t) for name, t in times.items()}


def answer_logits(model, ids: list[int], answer: list[int]) -> torch.Tensor:
    """Return the logits [len(answer), V] that predict each token of `answer` after `ids`, from decode-sized forwards
    (at most the model's `prompt_rows` tokens each, as in decoding: longer forwards run the prompt copies)."""
    model.reset()
    model.forward(ids[:-1])
    fed = [ids[-1]] + answer[:-1]  # row j predicts answer[j]
    step = getattr(model, "prompt_rows", None) or len(fed)
    rows = [model.forward(fed[i: i + step], n_logits=len(fed[i: i + step])).logits for i in range(0, len(fed), step)]
    return torch.cat(rows)


@torch.inference_mode()
def acceptance(decoder: Decoder, target, drafts: dict, prompts: list, max_new_tokens: int) -> dict[str, dict]:
    """Return per draft the exact α at T = 1 and the top-1 agreement over the target's greedy answers."""
    sums = {name: {"alpha": 0.0, "agree": 0.0} for name in drafts}
    positions = 0
    for prompt in prompts:
        ids = decoder.encode_prompt(prompt.text)
        answer = decoder.generate(prompt.text, method="ar", temperature=0.0, max_new_tokens=max_new_tokens).tokens
        if not answer:
            continue
        p = answer_logits(target, ids, answer).double().softmax(-1)
        for name, draft in drafts.items():
            q = answer_logits(draft, ids, answer).double().softmax(-1)
            sums[name]["alpha"] += torch.minimum(p, q).sum(-1).sum().item()
            sums[name]["agree"] += (p.argmax(-1) == q.argmax(-1)).double().sum().item()
        positions += len(answer)
    return {name: {"alpha_T1": s["alpha"] / positions, "top1_agreement": s["agree"] / positions,
                   "positions": positions} for name, s in sums.items()}


def load_draft(spec: str):
    """Load the draft for `spec`: a linear backend, optionally `:vocab=N` for a reduced head (plus the context's)."""
    backend, _, head = spec.partition(":")
    if not head:
        return load_model(None, "draft", linear_backend=backend)
    key, _, value = head.partition("=")
    if key != "vocab" or not value.isdigit():
        raise SystemExit(f"bad draft {spec!r}: expected BACKEND or BACKEND:vocab=N")
    return load_model(None, "draft", linear_backend=backend, draft_vocab=int(value), context_vocab=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--target-backend", default="int4")
    p.add_argument("--draft-backends", nargs="+", default=["int4", "int4-rounded"],
                   help="linear backends of the draft; BACKEND:vocab=N adds a reduced head of N tokens + the context's")
    p.add_argument("--prompts", default="humaneval", help="a prompt source, as `verispec bench --prompts`")
    p.add_argument("--limit", type=int, default=20)
    p.add_argument("--offset", type=int, default=0)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--context", type=int, default=128)
    p.add_argument("--reps", type=int, default=15)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--out", type=Path, default=None, help="where to write the results JSON (atomically)")
    args = p.parse_args()
    torch.set_num_threads(args.threads)
    target = load_model(None, "target", linear_backend=args.target_backend)
    drafts = {spec: load_draft(spec) for spec in args.draft_backends}
    kernels = {"target": target.linear_kernel} | {b: d.linear_kernel for b, d in drafts.items()}
    for name, kernel in kernels.items():
        print(f"{name}: {kernel}", flush=True)
    t1 = costs(target, drafts, args.context, args.reps, torch.Generator().manual_seed(0))
    prompts = load_prompts(args.prompts, limit=args.limit, seed=0, offset=args.offset)
    accepted = acceptance(Decoder(target, next(iter(drafts.values()))), target, drafts, prompts, args.max_new_tokens)
    print(f"target ({args.target_backend}) t(1) {t1['target'] * 1e3:.1f} ms")
    print("| draft backend | t(1) ms | c | α at T = 1 (exact) | top-1 agreement |")
    print("|---|---:|---:|---:|---:|")
    for b in drafts:
        a = accepted[b]
        print(f"| {b} | {t1[b] * 1e3:.1f} | {t1[b] / t1['target']:.3f} | {a['alpha_T1']:.4f} | "
              f"{a['top1_agreement']:.4f} |")
    if args.out is not None:
        results = {"config": vars(args) | {"out": str(args.out)}, **provenance("cpu"), "kernels": kernels,
                   "t1_seconds": t1, "acceptance": accepted, "prompts": [prompt.id for prompt in prompts]}
        write_atomically(args.out, json.dumps(results, indent=1))
        print(f"results: {args.out}")


if __name__ == "__main__":
    main()
