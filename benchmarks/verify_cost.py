"""Time every verifier on one round at the default pair's vocabulary (V = 151,936): ms per call, K paths x γ.

Random laws (softmax of 3·N(0, 1) logits, float64) stand in for the models' conditionals, and the K paths are drawn
from them, so the tree has the shapes decoding produces. Verification cost is pure tensor work on the CPU and does
not depend on the models. Run: `.venv/bin/python benchmarks/verify_cost.py` (about a minute); the median of
`--reps` calls is printed as a markdown table.
"""

from __future__ import annotations

import argparse
import statistics
import time

import torch

from verispec.verify import (
    block_verify,
    gbv_verify,
    nss_verify,
    specinfer_verify,
    spectr_verify,
    token_verify,
    traversal_verify,
)

SINGLE = {"sd (token)": token_verify, "bv": block_verify}
MULTI = {"gbv": gbv_verify, "specinfer": specinfer_verify, "spectr": spectr_verify, "nss": nss_verify,
         "traversal": traversal_verify}


def random_round(k: int, gamma: int, vocab: int, generator: torch.Generator):
    """Return (draft tokens [K, γ], q [K, γ, V], p [K, γ+1, V]) with paths drawn from q along each path."""
    def law(*shape: int) -> torch.Tensor:
        return torch.softmax(3 * torch.randn(*shape, vocab, generator=generator, dtype=torch.float64), -1)

    q, p = law(k, gamma), law(k, gamma + 1)
    tokens = torch.stack([torch.stack([torch.multinomial(q[i, j], 1, generator=generator)[0] for j in range(gamma)])
                          for i in range(k)])
    return tokens, q, p


def median_ms(fn, args, reps: int, generator: torch.Generator) -> float:
    fn(*args, generator)  # warm-up
    times = []
    for _ in range(reps):
        start = time.perf_counter()
        fn(*args, generator)
        times.append(time.perf_counter() - start)
    return 1e3 * statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--vocab", type=int, default=151_936)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--gammas", type=int, nargs="+", default=[4, 8])
    parser.add_argument("--paths", type=int, nargs="+", default=[2, 3, 4])
    args = parser.parse_args()
    generator = torch.Generator().manual_seed(0)
    print(f"V = {args.vocab}, {torch.get_num_threads()} threads, median of {args.reps} calls, ms per round\n")
    columns = [*SINGLE, *(f"{name} K={k}" for name in MULTI for k in args.paths)]
    print("| γ | " + " | ".join(columns) + " |")
    print("|---:|" + "---:|" * len(columns))
    for gamma in args.gammas:
        row = []
        tokens, q, p = random_round(1, gamma, args.vocab, generator)
        row += [median_ms(fn, (tokens[0], q[0], p[0]), args.reps, generator) for fn in SINGLE.values()]
        for fn in MULTI.values():
            for k in args.paths:
                row.append(median_ms(fn, random_round(k, gamma, args.vocab, generator), args.reps, generator))
        print(f"| {gamma} | " + " | ".join(f"{ms:.1f}" for ms in row) + " |")


if __name__ == "__main__":
    main()
