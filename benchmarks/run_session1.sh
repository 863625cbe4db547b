#!/usr/bin/env bash
# The benchmarks recorded in BENCHMARKS.md (session 1). Run from the repository root after `make install models`.
# Every run interleaves its methods prompt by prompt; evaluation prompts are disjoint from SPRINTER's training
# prompts (dev split shuffled with seed 0: training = positions 0-59, issue-3/4 runs = 100-105, SPRINTER eval = 200+).
set -euo pipefail
export HF_HUB_OFFLINE=1
V=".venv/bin/python -m verispec"
DEV="spec-bench:../shared/data/spec_bench/dev.jsonl"
N=${N:-48}        # new tokens per prompt
P=${P:-6}         # prompts per prompt set
mkdir -p results/bench

case "${1:-all}" in
  issue3|all)
    for src in dev humaneval; do
      if [ "$src" = dev ]; then prompts="--prompts $DEV --subset-seed 0 --offset 100 --limit $P"; else prompts="--prompts humaneval --subset-seed 0 --limit $P"; fi
      $V bench $prompts --methods ar draft sd:gamma=1 sd:gamma=2 sd:gamma=4 sd:gamma=6 hf-generate hf-assisted:gamma=4 \
        --max-new-tokens "$N" --temperature 0 --no-progress --out "results/bench/issue3_${src}_T0.json" --report
    done
    $V bench --prompts humaneval --subset-seed 0 --limit "$P" --methods ar sd:gamma=2 sd:gamma=4 hf-assisted:gamma=4 \
      --max-new-tokens "$N" --temperature 1 --no-progress --out results/bench/issue3_humaneval_T1.json --report
    ;;&
  issue4|all)
    # Short-prompt dev categories (long RAG/summarization prompts cost minutes of prefill per method here).
    .venv/bin/python - <<'PY'
import json
from verispec.bench.datasets import load_prompts
rows = {str(json.loads(line)["question_id"]): line for line in open("../shared/data/spec_bench/dev.jsonl")}
cats = ["writing", "roleplay", "reasoning", "math", "coding", "stem", "humanities", "translation", "qa", "math_reasoning"]
with open("results/bench/issue4_prompts.jsonl", "w") as f:
    for p in load_prompts("spec-bench:../shared/data/spec_bench/dev.jsonl", cats, 4, 0, 100):
        f.write(rows[p.id])
PY
    for T in ${TEMPS:-0.6}; do
      $V bench --prompts results/bench/issue4_prompts.jsonl --temperature "$T" --max-new-tokens "$N" \
        --methods ar sd:gamma=4 bv:gamma=4 gbv:paths=2,gamma=4 gbv:paths=3,gamma=4 gbv:paths=4,gamma=4 \
                  specinfer:paths=3,gamma=4 spectr:paths=3,gamma=4 nss:paths=3,gamma=4 traversal:paths=3,gamma=4 \
                  bv:gamma=8 gbv:paths=3,gamma=8 \
        --compare-to bv:gamma=4 --no-progress --out "results/bench/issue4_dev_T${T}.json" --report
    done
    ;;&
  issue5|all)
    # SPRINTER: collect on 32 dev prompts (training), train, then evaluate on 8 short dev prompts that are not among
    # the training prompts (checked against the training manifest's prompt ids).
    $V verifier collect --prompts "$DEV" --subset-seed 0 --offset 0 --limit 32 --steps 32 --lam 1.0 --temperature 1.0 \
      --seed 0 --out results/sprinter/train_T1.safetensors
    $V verifier train --data results/sprinter/train_T1.safetensors --features token --l2 1.0 --lr 0.001 --epochs 50 \
      --out results/sprinter/verifier_T1.safetensors
    .venv/bin/python - <<'PY'
import json
from verispec.bench.datasets import load_prompts
train = set(json.load(open("results/sprinter/train_T1.safetensors.json"))["prompt_ids"])
rows = {str(json.loads(line)["question_id"]): line for line in open("../shared/data/spec_bench/dev.jsonl")}
cats = ["writing", "roleplay", "reasoning", "math", "coding", "stem", "humanities", "translation", "qa", "math_reasoning"]
held_out = [p for p in load_prompts("spec-bench:../shared/data/spec_bench/dev.jsonl", cats, None, 1, 0) if p.id not in train]
with open("results/sprinter/eval_prompts.jsonl", "w") as f:
    for p in held_out[:8]:
        f.write(rows[p.id])
PY
    $V bench --prompts results/sprinter/eval_prompts.jsonl --temperature 1 --max-new-tokens "$N" \
      --verifier results/sprinter/verifier_T1.safetensors --methods ar draft sd:gamma=4 sprinter:tau=0.3 \
                 sprinter:tau=0.5 sprinter:tau=0.7 sprinter-exact:tau=0.5 \
      --compare-to sd:gamma=4 --quality --no-progress --out results/bench/issue5_dev_T1.json --report
    ;;
esac
