"""GBV's tiered order against the full ratio order, on the same drafted blocks: exact E[τ] and verification time.

GBV is lossless under any per-node total order (docs/algorithms.md §2.2); verispec ranks by p/q only the tokens with
q ≥ min(1e-6, 1e-2·max q) and puts the rest below them in token-id order, which avoids a sort of the whole
vocabulary at every node. This measures what that costs in acceptance: at contexts along the target's own sampled
continuation of each prompt (as `verispec fixed-blocks` picks them), `--draws` i.i.d. draft paths are scored by
the target once, and every disjoint group of K paths gets GBV's exact E[τ] under both orders (`gbv_verify_law` with
`min_q=0`: every token ranked), with the time each law took. Ratios are paired per prompt, 95% bootstrap intervals.

    .venv/bin/python benchmarks/gbv_order.py --linear-backend int4 --limit 10 --out results/gbv-order.json
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import torch

from verispec.api import Decoder
from verispec.bench.files import write_atomically
from verispec.bench.fixed_blocks import (
    DRAW_SEED_OFFSET,
    TRAJECTORY_GAMMA,
    TRAJECTORY_METHOD,
    FixedBlocksConfig,
    context_positions,
)
from verispec.drafting import draft_paths
from verispec.engine import DecodeConfig, score_block
from verispec.prompt_sets import load_prompts
from verispec.sampling import SamplingConfig
from verispec.stats import bootstrap_ratio
from verispec.verify import gbv_verify_law
from verispec.verify.gbv import ranked_threshold

SHORT = ["writing", "roleplay", "reasoning", "math", "coding", "stem", "humanities", "translation", "qa",
         "math_reasoning"]
ORDERS = {"tiered (default)": {}, "full ratio order": {"min_q": 0.0}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", default="spec-bench:../shared/data/spec_bench/dev.jsonl")
    parser.add_argument("--category", nargs="*", default=SHORT)
    parser.add_argument("--limit", type=int, default=10)
    parser.add_argument("--offset", type=int, default=100)
    parser.add_argument("--subset-seed", type=int, default=0)
    parser.add_argument("--temperature", type=float, default=1.0)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--paths", type=int, default=3)
    parser.add_argument("--draws", type=int, default=12)
    parser.add_argument("--contexts", type=int, default=4)
    parser.add_argument("--stride", type=int, default=32)
    parser.add_argument("--linear-backend", default="int4")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", default="results/gbv-order.json")
    args = parser.parse_args()

    sampling = SamplingConfig(temperature=args.temperature)
    prompts = load_prompts(args.prompts, args.category, args.limit, args.subset_seed, args.offset)
    decoder = Decoder(linear_backend=args.linear_backend)
    target, draft = decoder.model("target"), decoder.model("draft")
    eos = frozenset(decoder.eos_token_ids("target"))
    ranked: list[int] = []  # per context: mean tokens ranked by ratio per drafted node under the default order
    per_prompt = []  # per prompt and order: (sum of E[τ], sum of law seconds, groups)
    for index, prompt in enumerate(prompts):
        prompt_ids = decoder.encode_prompt(prompt.text, True)
        trajectory = decoder.generate(prompt.text, DecodeConfig(
            method=TRAJECTORY_METHOD, gamma=TRAJECTORY_GAMMA, sampling=sampling,
            max_new_tokens=(args.contexts - 1) * args.stride + 1, seed=args.seed + index))
        generator = torch.Generator().manual_seed(args.seed + index + DRAW_SEED_OFFSET)
        draft.reset()
        target.reset()
        sums = {name: [0.0, 0.0, 0] for name in ORDERS}
        positions = context_positions(len(trajectory.tokens), trajectory.stopped_at_eos,
                                      FixedBlocksConfig(contexts=args.contexts, stride=args.stride))
        for position in positions:
            context = prompt_ids + trajectory.tokens[:position]
            block = draft_paths(draft, context, args.draws, args.gamma, sampling, generator, eos, target.vocab_size)
            p = score_block(target, context, block, sampling).p
            tokens, q = block.as_tensor(), block.q
            threads = torch.get_num_threads()
            torch.set_num_threads(1)  # as the engine verifies: one thread outside the models' forwards
            for j in range(args.draws // args.paths):
                group = slice(j * args.paths, (j + 1) * args.paths)
                names = list(ORDERS) if j % 2 == 0 else list(ORDERS)[::-1]  # alternate which one runs first
                for name in names:
                    knobs = ORDERS[name]
                    start = time.perf_counter()
                    _, law = gbv_verify_law(tokens[group], q[group], p[group], **knobs)
                    seconds = time.perf_counter() - start
                    sums[name][0] += law.expected_accepted()
                    sums[name][1] += seconds
                    sums[name][2] += 1
            torch.set_num_threads(threads)
            ranked.append(int((q >= ranked_threshold(q)).sum(-1).float().mean()))
            for model in (draft, target):
                model.truncate(len(context) - 1)
        per_prompt.append({"prompt_id": prompt.id, "category": prompt.category, **sums})
        print(f"prompt {index + 1}/{len(prompts)}: " + ", ".join(
            f"{name} E[τ] {s[0] / s[2]:.3f}, {1e3 * s[1] / s[2]:.1f} ms" for name, s in sums.items()), flush=True)

    tiered, full = ORDERS
    rows = []
    for name in ORDERS:
        groups = sum(r[name][2] for r in per_prompt)
        rows.append({"order": name, "expected_accepted": sum(r[name][0] for r in per_prompt) / groups,
                     "law_ms": 1e3 * sum(r[name][1] for r in per_prompt) / groups, "groups": groups})
    ratio = bootstrap_ratio([(r[tiered][0], r[full][0]) for r in per_prompt], 2000, 0)
    speed = bootstrap_ratio([(r[full][1], r[tiered][1]) for r in per_prompt], 2000, 0)
    print(f"\n| order (K = {args.paths}, γ = {args.gamma}, T = {args.temperature}) | E[τ] | law ms per round |")
    print("|---|---:|---:|")
    for row in rows:
        print(f"| {row['order']} | {row['expected_accepted']:.4f} | {row['law_ms']:.1f} |")
    print(f"tokens ranked by ratio per node under the default order: mean {sum(ranked) / len(ranked):.0f}, "
          f"max {max(ranked)} of {target.vocab_size}")

    def interval(ci: tuple[float, float] | None) -> str:
        return f"[{ci[0]:.4f}, {ci[1]:.4f}]" if ci else "(one prompt: no interval)"

    print(f"\nE[τ] tiered / full: {rows[0]['expected_accepted'] / rows[1]['expected_accepted']:.4f} "
          f"{interval(ratio)}; law time full / tiered: {rows[1]['law_ms'] / rows[0]['law_ms']:.2f}x {interval(speed)}")
    payload = {"args": vars(args), "rows": rows, "ranked_per_node": ranked, "per_prompt": per_prompt,
               "expected_accepted_ratio_ci": ratio, "law_speedup_ci": speed}
    write_atomically(Path(args.out), json.dumps(payload, indent=1))


if __name__ == "__main__":
    main()
