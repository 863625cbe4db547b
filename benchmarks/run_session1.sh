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
    for T in 0.6 1.0; do
      $V bench --prompts "$DEV" --subset-seed 0 --offset 100 --limit "$P" --temperature "$T" --max-new-tokens "$N" \
        --methods ar sd:gamma=4 bv:gamma=4 gbv:paths=2,gamma=4 gbv:paths=3,gamma=4 gbv:paths=4,gamma=4 \
                  specinfer:paths=3,gamma=4 spectr:paths=3,gamma=4 nss:paths=3,gamma=4 traversal:paths=3,gamma=4 \
                  sd:gamma=8 bv:gamma=8 gbv:paths=3,gamma=8 \
        --compare-to bv:gamma=4 --no-progress --out "results/bench/issue4_dev_T${T}.json" --report
    done
    ;;&
  issue5|all)
    VER=results/sprinter/verifier_T1.safetensors
    $V bench --prompts "$DEV" --subset-seed 0 --offset 200 --limit "${P5:-12}" --temperature 1 --max-new-tokens "$N" \
      --verifier "$VER" --methods ar draft sd:gamma=4 sprinter:tau=0.3 sprinter:tau=0.5 sprinter:tau=0.7 \
                 sprinter-exact:tau=0.5 \
      --compare-to sd:gamma=4 --quality --no-progress --out results/bench/issue5_dev_T1.json --report
    ;;
esac
