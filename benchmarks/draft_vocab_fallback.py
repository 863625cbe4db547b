"""Would a reduced draft head that falls back to the full head where it is unsure pay? Exact acceptance without
decoding: a rule that looks only at the context (the reduced head's logits, the draft's last hidden state), so q stays
a function of the context and verification stays exact, picks per position the reduced head's law or the full head's;
this scores such rules on the target's own answers.

Per position, with S the head's tokens (the top N of the shipped ranking plus the context's tokens, as
`--draft-vocab N` drafts), O the tokens outside the top N, z the draft's logits and h its last hidden state, the
signals (the head falls back where a signal is high):
- `confidence`: the reduced law's top probability, low (max over S of softmax(z_S));
- `mass`: the logits' own mass over S, low (logsumexp of z_S, on the logits' absolute scale);
- `clusters`: an estimate of O's logit mass against S's, from k-means clusters of O's output rows (no training):
  log Σ_j n_j exp(h·c_j + ½ Σ_d h_d² σ²_jd) − logsumexp(z_S), cluster j with n_j rows, centroid c_j, per-dimension
  variance σ²_j (a log-normal sum); it costs 2K rows of the head;
- `lowrank`: O's logit mass from a rank-r approximation of O's rows, whitened by the tuning answers' hidden states
  (the best rank-r fit of those logits), minus logsumexp(z_S); it costs r·|O|/H rows.
The thresholds are set on the first set of answers (`--tune`, whose hidden states also whiten `lowrank`) to fall back
at given rates, then applied unchanged to the second (`--evaluate`), so nothing is chosen on the prompts it is judged
on. Reports α (T = 1, exact: Σ min(p, q)) of the full head, of the reduced head, of each rule, and the oracle that
falls back where the reduced head's in-S mass q(S) is lowest (the most any signal could recover at that rate). It
also scores `screen`: no fallback, but S grows per position by the k tokens of O the rank-r approximation ranks
highest (exact logits for those), at a cost of r·|O|/H + k rows.

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
from verispec.models.loading import load_model
from verispec.models.pair import encode_prompt
from verispec.models.vocab import load_ranking, reduced_vocabulary, special_token_ids

sys.path.insert(0, str(Path(__file__).resolve().parent))
from draft_vocab_support import ar_answers  # noqa: E402  (a sibling script: the same answers)

RATES = (0.05, 0.1, 0.15, 0.2)
RULES = ("confidence", "mass", "clusters", "lowrank", "oracle")


def forwards(target, draft, paths: list[str], prompts: int, positions: int, skip: frozenset[str],
             vocab_size: int) -> dict:
    """Teacher-forced passes over the answers: per position the target's law p (float16), the draft's logits z, its
    last hidden state h, and the context (prompt and answer so far) as token ids."""
    rows: dict[str, list] = {"p": [], "z": [], "h": [], "context": []}
    for path in paths:
        for record in ar_answers(path, prompts, skip):
            prompt = encode_prompt(target.tokenizer, record["prompt"], True)
            n = min(positions, len(record["tokens"]))
            ids = prompt + record["tokens"][:n]
            target.reset()
            p = torch.softmax(target.forward(ids[:-1], n_logits=n).logits.double(), -1)[:, :vocab_size]
            draft.reset()
            out = draft.forward(ids[:-1], n_logits=n, return_hidden=True)
            rows["p"].append(p.half())
            rows["z"].append(out.logits.float()[:, :vocab_size])
            rows["h"].append(out.hidden.float())
            # position i predicts ids[len(prompt) + i]; its context is ids[:len(prompt) + i]
            rows["context"] += [torch.tensor(ids[: len(prompt) + i]) for i in range(n)]
            print(f"{Path(path).name}:{record['prompt_id']}: {n} positions", flush=True)
    return {k: v if k == "context" else torch.cat(v) for k, v in rows.items()}


def kmeans(rows: torch.Tensor, k: int, iterations: int, seed: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Return centroids [k, H], per-dimension variances [k, H] and sizes [k] of Lloyd's k-means over `rows`."""
    generator = torch.Generator().manual_seed(seed)
    centroids = rows[torch.randperm(len(rows), generator=generator)[:k]].clone()
    for _ in range(iterations + 1):
        nearest = torch.cat([(chunk @ centroids.T - 0.5 * (centroids * centroids).sum(1)).argmax(1)
                             for chunk in rows.split(16384)])
        sizes = torch.bincount(nearest, minlength=k).float()
        sums = torch.zeros_like(centroids).index_add_(0, nearest, rows)
        centroids = torch.where(sizes[:, None] > 0, sums / sizes.clamp(min=1)[:, None], centroids)
    squares = torch.zeros_like(centroids).index_add_(0, nearest, rows * rows) / sizes.clamp(min=1)[:, None]
    return centroids, (squares - centroids * centroids).clamp(min=0), sizes


class OutsideMass:
    """The structured estimates of the logit mass outside the top N, for one head size."""

    def __init__(self, embedding: torch.Tensor, top: torch.Tensor, tune_hidden: torch.Tensor, clusters: int,
                 seed: int) -> None:
        outside = torch.ones(len(embedding), dtype=torch.bool)
        outside[top] = False
        self.ids = outside.nonzero().squeeze(1)
        rows = embedding[self.ids]
        self.centroids, self.variances, sizes = kmeans(rows, clusters, 8, seed)
        self.log_sizes = sizes.clamp(min=1).log()
        # Whitening by the tuning hidden states' second moment makes the rank-r fit the best one of their logits.
        moment = tune_hidden.T @ tune_hidden / len(tune_hidden)
        chol = torch.linalg.cholesky(moment + 1e-3 * moment.diagonal().mean() * torch.eye(len(moment)))
        _, _, right = torch.linalg.svd(rows @ chol, full_matrices=False)
        self.query = torch.linalg.inv(chol).T @ right.T  # h @ query[:, :r]: the hidden state in the rank-r basis
        self.keys = rows @ chol @ right.T  # [|O|, H]: the first r columns are O's rows in that basis

    def clusters(self, hidden: torch.Tensor) -> torch.Tensor:
        return torch.logsumexp(hidden @ self.centroids.T + 0.5 * (hidden * hidden) @ self.variances.T
                               + self.log_sizes, -1)

    def approximate(self, hidden: torch.Tensor, rank: int) -> torch.Tensor:
        """[n, |O|] rank-`rank` approximations of O's logits."""
        return (hidden @ self.query[:, :rank]) @ self.keys[:, :rank].T


def score(data: dict, top: torch.Tensor, outside: OutsideMass, rank: int, screen_rank: int, screen_k: int
          ) -> dict[str, np.ndarray]:
    """Per position: α of the full head, the reduced head and the screened head; q(S); the signals."""
    z, h, p = data["z"], data["h"], data["p"].double()
    n, vocab_size = z.shape
    inside = torch.zeros(n, vocab_size, dtype=torch.bool)
    inside[:, top] = True
    for i, context in enumerate(data["context"]):
        inside[i, context] = True
    q = torch.softmax(z.double(), -1)
    z_s = z.double().masked_fill(~inside, float("-inf"))
    q_s = torch.softmax(z_s, -1)
    lse_s = torch.logsumexp(z_s, -1)
    approx = outside.approximate(h, rank)
    screened = inside.clone()
    nearest = outside.approximate(h, screen_rank).topk(screen_k, -1).indices  # [n, k] into O
    screened[torch.arange(n)[:, None], outside.ids[nearest]] = True
    out = {"full": torch.minimum(p, q).sum(-1), "reduced": torch.minimum(p, q_s).sum(-1),
           "screen": torch.minimum(p, torch.softmax(z.double().masked_fill(~screened, float("-inf")), -1)).sum(-1),
           "in_mass": (q * inside).sum(-1), "confidence": -q_s.max(-1).values, "mass": -lse_s,
           "clusters": outside.clusters(h).double() - lse_s, "lowrank": torch.logsumexp(approx, -1).double() - lse_s}
    return {k: v.numpy() for k, v in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tune", nargs="+", required=True, help="results files whose `ar` answers set thresholds")
    parser.add_argument("--evaluate", nargs="+", required=True, help="results files whose `ar` answers judge them")
    parser.add_argument("--skip-categories", nargs="*", default=[], help="categories left out of the tuning set")
    parser.add_argument("--prompts", type=int, default=20, help="prompts per results file")
    parser.add_argument("--positions", type=int, default=64, help="answer tokens scored per prompt")
    parser.add_argument("--vocabs", type=int, nargs="+", default=[16384, 12288, 8192])
    parser.add_argument("--clusters", type=int, default=1024, help="k-means clusters of the rows outside the head")
    parser.add_argument("--rank", type=int, default=32, help="rank of the `lowrank` signal")
    parser.add_argument("--screen", type=int, nargs=2, default=[128, 64], metavar=("RANK", "K"),
                        help="the screened head: rank of its approximation and tokens it adds per position")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--linear-backend", default="int4")
    parser.add_argument("--out", type=Path, default=Path("results/draft-vocab-fallback.json"))
    args = parser.parse_args()

    target = load_model(None, "target", linear_backend=args.linear_backend)
    draft = load_model(None, "draft", linear_backend=args.linear_backend)
    vocab_size = min(target.vocab_size, draft.vocab_size)
    embedding = draft.model.get_input_embeddings().weight.detach().float()[:vocab_size]  # the tied head's rows
    hidden_size = embedding.shape[1]
    ranking = load_ranking(target.tokenizer)
    specials = special_token_ids(target.tokenizer)
    tune = forwards(target, draft, args.tune, args.prompts, args.positions, frozenset(args.skip_categories),
                    vocab_size)
    judge = forwards(target, draft, args.evaluate, args.prompts, args.positions, frozenset(), vocab_size)
    rows = []
    print("| head N | rule | cost (share of the full head's multiply-adds) | fallback rate (set on tuning answers) | "
          "fallback rate here | α full | α reduced | α with fallback | share of the loss recovered |\n"
          "|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for size in args.vocabs:
        top = torch.tensor(reduced_vocabulary(size, vocab_size, ranking, specials))
        signal = OutsideMass(embedding, top, tune["h"], args.clusters, args.seed)
        t, e = (score(answers, top, signal, args.rank, *args.screen) for answers in (tune, judge))
        full, reduced = float(e["full"].mean()), float(e["reduced"].mean())
        outside = len(signal.ids)
        costs = {"confidence": 0.0, "mass": 0.0, "oracle": float("nan"), "clusters": 2 * args.clusters / vocab_size,
                 "lowrank": args.rank * outside / hidden_size / vocab_size}
        cells = []
        for rule in RULES:
            for rate in RATES:
                if rule == "oracle":  # where the reduced head misses most of the draft's mass, at this rate here
                    fall = e["in_mass"] <= np.quantile(e["in_mass"], rate)
                else:
                    fall = e[rule] > np.quantile(t[rule], 1 - rate)
                cells.append((rule, rate, fall, float(np.where(fall, e["full"], e["reduced"]).mean()), costs[rule]))
        screen_cost = (args.screen[0] * outside / hidden_size + args.screen[1]) / vocab_size
        cells.append((f"screen r={args.screen[0]} k={args.screen[1]}", 0.0, np.zeros(len(e["screen"]), dtype=bool),
                      float(e["screen"].mean()), screen_cost))
        for rule, tuned_rate, fall, alpha, cost in cells:
            recovered = (alpha - reduced) / (full - reduced) if full > reduced else float("nan")
            rows.append({"vocab": size, "rule": rule, "tuned_rate": tuned_rate, "rate": float(fall.mean()),
                         "signal_cost": cost, "alpha_full": full, "alpha_reduced": reduced, "alpha": alpha,
                         "recovered": recovered, "positions": int(len(fall))})
            print(f"| {size} | {rule} | {cost:.3f} | {tuned_rate:.2f} | {fall.mean():.3f} | {full:.4f} | "
                  f"{reduced:.4f} | {alpha:.4f} | {recovered:.0%} |", flush=True)
    write_atomically(args.out, json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "rows": rows},
                                          indent=1))
    print(f"wrote {args.out}")


if __name__ == "__main__":
    main()
