"""Which tokens a reduced draft head should cover: acceptance α of the top-N head, and of the top-N head plus the
tokens already in the context (the prompt and the answer so far), on answers the target wrote in a benchmark run.

A head over a subset S gives q_S = softmax of the draft's logits over S: exactly the full-head q restricted to S and
renormalised. So α of any subset follows from one teacher-forced pass of the full draft (no sliced copies):
per position α(T=1) = Σ_{v in S} min(p_v, q_v / q(S)) and α(T=0) = [argmax_S q = argmax p]. The positions are the
first `--positions` tokens of each prompt's `ar` answer in the given results files (or their archives), so the
text is what the target writes; p and q are recomputed here on the chosen linear backend.

    PYTHONPATH=. .venv/bin/python benchmarks/draft_vocab_support.py \
        benchmarks/results/int4-lossy-humaneval-T0.json.gz benchmarks/results/int4-lookup-categories-T0.json.gz \
        --prompts 10 --out results/draft-vocab-support.json
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
from pathlib import Path
from typing import Any

import numpy as np
import torch

from verispec.bench.archive import restore_prompts
from verispec.bench.files import write_atomically
from verispec.drafters.vocab_answers import teacher_forced_probs
from verispec.models.loading import load_model
from verispec.models.pair import encode_prompt
from verispec.models.vocab import load_ranking, reduced_vocabulary, special_token_ids


def ar_answers(path: str, limit: int, skip: frozenset[str] = frozenset()) -> list[dict[str, Any]]:
    """Return the `ar` records of the first `limit` prompts of a results file or its `.json.gz` archive, leaving out
    prompts of the categories in `skip`."""
    if path.endswith(".gz"):
        with gzip.open(path, "rt", encoding="utf-8") as handle:
            results = restore_prompts(json.load(handle))
    else:
        results = json.loads(Path(path).read_text())
    seen: dict[str, dict[str, Any]] = {}
    for record in results["records"]:
        if record["method"] == "ar" and record["prompt_id"] not in seen and record.get("category") not in skip:
            seen[record["prompt_id"]] = record
    return list(seen.values())[:limit]


def alphas(p: torch.Tensor, q: torch.Tensor, support: torch.Tensor) -> tuple[list[float], list[float]]:
    """Return per-position α(T=1) and α(T=0) of a head over `support` (bool [n, V]) against target rows p [n, V]."""
    q_s = q * support
    q_s = q_s / q_s.sum(-1, keepdim=True)
    return torch.minimum(p, q_s).sum(-1).tolist(), (p.argmax(-1) == q_s.argmax(-1)).float().tolist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("results", nargs="+", help="results files or archives with `ar` records")
    parser.add_argument("--prompts", type=int, default=10, help="prompts per results file")
    parser.add_argument("--positions", type=int, default=48, help="answer tokens scored per prompt")
    parser.add_argument("--vocabs", type=int, nargs="+", default=[32768, 16384, 8192])
    parser.add_argument("--rankings", nargs="+", default=["shipped"], metavar="LABEL=FILE.npy",
                        help="rankings to compare (a ranking .npy as `vocab_ranking build` writes; 'shipped': the "
                             "one verispec ships for the tokenizer)")
    parser.add_argument("--skip-categories", nargs="*", default=[],
                        help="leave out prompts of these categories (e.g. MT-Bench's, when MT-Bench evaluates)")
    parser.add_argument("--linear-backend", default="int4")
    parser.add_argument("--out", default="results/draft-vocab-support.json")
    args = parser.parse_args()

    target = load_model(None, "target", linear_backend=args.linear_backend)
    draft = load_model(None, "draft", linear_backend=args.linear_backend)
    tokenizer = target.tokenizer
    vocab_size = min(target.vocab_size, draft.vocab_size)
    specials = special_token_ids(tokenizer)
    tops = {}
    for spec in args.rankings:
        label, _, ranking_file = spec.partition("=")
        ranking = np.load(ranking_file).astype(np.int64).tolist() if ranking_file else load_ranking(tokenizer)
        prefix = "" if spec == "shipped" else f"{label}: "
        for n in args.vocabs:
            tops[f"{prefix}top {n}"] = torch.tensor(reduced_vocabulary(n, vocab_size, ranking, specials))

    scores: dict[str, dict[str, list[float]]] = {}
    sources = []
    for path in args.results:
        for record in ar_answers(path, args.prompts, frozenset(args.skip_categories)):
            prompt = encode_prompt(tokenizer, record["prompt"], True)
            if len(prompt) != record["prompt_tokens"]:
                raise SystemExit(f"{path}: prompt {record['prompt_id']} encodes to {len(prompt)} tokens, the run "
                                 f"had {record['prompt_tokens']}: not the same template")
            n = min(args.positions, len(record["tokens"]))
            ids = prompt + record["tokens"][:n]
            p = teacher_forced_probs(target, ids, n)[:, :vocab_size]
            q = teacher_forced_probs(draft, ids, n)[:, :vocab_size]
            for head, top in tops.items():
                base = torch.zeros(n, vocab_size, dtype=torch.bool)
                base[:, top] = True
                with_context = base.clone()
                for i in range(n):  # position i predicts ids[len(prompt) + i]: its context is ids[:len(prompt) + i]
                    with_context[i, torch.tensor(ids[: len(prompt) + i])] = True
                added = (with_context & ~base).sum(-1).float().mean().item()
                for name, support in ((head, base), (f"{head} + context", with_context)):
                    a1, a0 = alphas(p, q, support)
                    row = scores.setdefault(name, {"alpha_T1": [], "alpha_T0": [], "added": []})
                    row["alpha_T1"] += a1
                    row["alpha_T0"] += a0
                    row["added"] += [added if "context" in name else 0.0] * n
            full = scores.setdefault("full", {"alpha_T1": [], "alpha_T0": [], "added": []})
            full["alpha_T1"] += torch.minimum(p, q).sum(-1).tolist()
            full["alpha_T0"] += (p.argmax(-1) == q.argmax(-1)).float().tolist()
            full["added"] += [0.0] * n
            sources.append(f"{Path(path).name}:{record['prompt_id']}")
            print(f"{sources[-1]}: {n} positions", flush=True)

    rows = [{"head": name, "alpha_T1": statistics.fmean(s["alpha_T1"]), "alpha_T0": statistics.fmean(s["alpha_T0"]),
             "context_tokens_added": statistics.fmean(s["added"]), "positions": len(s["alpha_T1"])}
            for name, s in scores.items()]
    write_atomically(Path(args.out), json.dumps({"rows": rows, "prompts": sources, "positions": args.positions,
                                                 "rankings": args.rankings, "linear_backend": args.linear_backend},
                                                indent=1))
    print("| draft head | α (T=1) | α (T=0) | context tokens added (mean) |\n|---|---:|---:|---:|")
    for r in sorted(rows, key=lambda r: -r["alpha_T1"]):
        print(f"| {r['head']} | {r['alpha_T1']:.3f} | {r['alpha_T0']:.3f} | {r['context_tokens_added']:.0f} |")


if __name__ == "__main__":
    main()
