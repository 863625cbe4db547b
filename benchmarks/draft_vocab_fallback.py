"""Would a reduced draft head that falls back to the full head where it is unsure pay? Exact acceptance without
decoding: a rule that looks only at the reduced head's own logits (so q stays a function of the context, and
verification stays exact) picks, per position, the reduced head's law or the full head's; this scores such rules on
the target's own answers.

Per position, with S the head's tokens (the top N of the shipped ranking plus the context's tokens, as
`--draft-vocab N` drafts) and z the draft's logits: the rule's signal is either the reduced law's top probability
(`confidence`: max over S of softmax(z_S)) or the logits' own mass over S (`mass`: logsumexp of z_S, on the logits'
absolute scale), and the head falls back below a threshold. The thresholds are set on the first set of answers
(`--tune`) to fall back at given rates, then applied unchanged to the second (`--evaluate`), so no threshold is
chosen on the prompts it is judged on. Reports α (T = 1, exact: Σ min(p, q)) of the full head, of the reduced head,
of each rule, and the oracle that falls back where the reduced head's in-S mass q(S) is lowest (the most any signal
could recover at that rate).

    PYTHONPATH=. .venv/bin/python benchmarks/draft_vocab_fallback.py \
        --tune benchmarks/results/int4-torch-draft-dev-T0-decoder-stack.json.gz \
        --skip-categories writing roleplay reasoning math coding extraction stem humanities \
        --evaluate benchmarks/results/int4-draft-vocab-mt-bench-T0-answers.json.gz \
        --out benchmarks/results/draft-vocab-fallback.json
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import torch

from verispec.bench.files import write_atomically
from verispec.drafters.vocab import load_ranking, reduced_vocabulary, special_token_ids
from verispec.models.loading import load_model
from verispec.models.pair import encode_prompt

sys.path.insert(0, str(Path(__file__).resolve().parent))
from draft_vocab_support import ar_answers  # noqa: E402  (a sibling script: the same answers)

RATES = (0.05, 0.1, 0.2)


def score(target, draft, paths: list[str], prompts: int, positions: int, skip: frozenset[str],
          tops: dict[int, torch.Tensor], vocab_size: int) -> dict[int, dict[str, np.ndarray]]:
    """Per head size N: per-position arrays of α of the full head, of the reduced head, q(S), and the signals."""
    out: dict[int, dict[str, list]] = {n: {k: [] for k in ("full", "reduced", "in_mass", "confidence", "mass")}
                                       for n in tops}
    tokenizer = target.tokenizer
    for path in paths:
        for record in ar_answers(path, prompts, skip):
            prompt = encode_prompt(tokenizer, record["prompt"], True)
            n = min(positions, len(record["tokens"]))
            ids = prompt + record["tokens"][:n]
            target.reset()
            p = torch.softmax(target.forward(ids[:-1], n_logits=n).logits.double(), -1)[:, :vocab_size]
            draft.reset()
            z = draft.forward(ids[:-1], n_logits=n).logits.double()[:, :vocab_size]
            q = torch.softmax(z, -1)
            full = torch.minimum(p, q).sum(-1)
            for size, top in tops.items():
                inside = torch.zeros(n, vocab_size, dtype=torch.bool)
                inside[:, top] = True
                for i in range(n):  # position i predicts ids[len(prompt) + i]; its context is ids[:len(prompt) + i]
                    inside[i, torch.tensor(ids[: len(prompt) + i])] = True
                z_s = z.masked_fill(~inside, float("-inf"))
                q_s = torch.softmax(z_s, -1)
                row = out[size]
                row["full"].append(full)
                row["reduced"].append(torch.minimum(p, q_s).sum(-1))
                row["in_mass"].append((q * inside).sum(-1))
                row["confidence"].append(q_s.max(-1).values)
                row["mass"].append(torch.logsumexp(z_s, -1))
            print(f"{Path(path).name}:{record['prompt_id']}: {n} positions", flush=True)
    return {size: {k: torch.cat(v).numpy() for k, v in row.items()} for size, row in out.items()}


def with_fallback(row: dict[str, np.ndarray], fall: np.ndarray) -> float:
    """α when the positions in `fall` use the full head and the others the reduced one."""
    return float(np.where(fall, row["full"], row["reduced"]).mean())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tune", nargs="+", required=True, help="results files whose `ar` answers set thresholds")
    parser.add_argument("--evaluate", nargs="+", required=True, help="results files whose `ar` answers judge them")
    parser.add_argument("--skip-categories", nargs="*", default=[], help="categories left out of the tuning set")
    parser.add_argument("--prompts", type=int, default=20, help="prompts per results file")
    parser.add_argument("--positions", type=int, default=64, help="answer tokens scored per prompt")
    parser.add_argument("--vocabs", type=int, nargs="+", default=[16384, 12288, 8192])
    parser.add_argument("--linear-backend", default="int4")
    parser.add_argument("--out", type=Path, default=Path("results/draft-vocab-fallback.json"))
    args = parser.parse_args()

    target = load_model(None, "target", linear_backend=args.linear_backend)
    draft = load_model(None, "draft", linear_backend=args.linear_backend)
    vocab_size = min(target.vocab_size, draft.vocab_size)
    ranking = load_ranking(target.tokenizer)
    specials = special_token_ids(target.tokenizer)
    tops = {n: torch.tensor(reduced_vocabulary(n, vocab_size, ranking, specials)) for n in args.vocabs}
    tune = score(target, draft, args.tune, args.prompts, args.positions, frozenset(args.skip_categories), tops,
                 vocab_size)
    judge = score(target, draft, args.evaluate, args.prompts, args.positions, frozenset(), tops, vocab_size)
    rows = []
    print("| head N | rule | fallback rate (set on tuning answers) | fallback rate here | α full | α reduced | α with "
          "fallback | points recovered of the loss |\n|---:|---|---:|---:|---:|---:|---:|---:|")
    for size in args.vocabs:
        t, e = tune[size], judge[size]
        full, reduced = float(e["full"].mean()), float(e["reduced"].mean())
        for rule in ("confidence", "mass", "oracle"):
            for rate in RATES:
                if rule == "oracle":  # where the reduced head misses most of the draft's mass, at this rate here
                    fall = e["in_mass"] <= np.quantile(e["in_mass"], rate)
                else:
                    fall = e[rule] < np.quantile(t[rule], rate)
                alpha = with_fallback(e, fall)
                recovered = (alpha - reduced) / (full - reduced) if full > reduced else float("nan")
                rows.append({"vocab": size, "rule": rule, "tuned_rate": rate, "rate": float(fall.mean()),
                             "alpha_full": full, "alpha_reduced": reduced, "alpha": alpha, "recovered": recovered,
                             "positions": int(len(fall))})
                print(f"| {size} | {rule} | {rate:.2f} | {fall.mean():.3f} | {full:.4f} | {reduced:.4f} | "
                      f"{alpha:.4f} | {recovered:.0%} |")
    write_atomically(args.out, json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows},
                                          indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
