#!/usr/bin/env bash
# libgomp wait policy against the llama.cpp draft (BENCHMARKS.md §3): three alternations of three settings,
# ms/token of sd (llama.cpp draft, int8 target) and of ar, and the draft ms per call. After `make install models peers`.
cd "$(dirname "$0")/.."
export HF_HUB_OFFLINE=1
P="Write a Python function merge_intervals(intervals) that merges overlapping intervals and returns them sorted. Include a docstring and explain the algorithm briefly."
for rep in 1 2 3; do
  for setting in default spin1k passive; do
    case $setting in default) E=();; spin1k) E=(GOMP_SPINCOUNT=1000);; passive) E=(OMP_WAIT_POLICY=PASSIVE);; esac
    for m in sd ar; do
      env "${E[@]}" .venv/bin/python -m verispec generate "$P" --linear-backend int8 --draft llamacpp:default --method $m --max-new-tokens 128 --json 2>/dev/null \
      | python3 -c "
import json,sys; d=json.load(sys.stdin); t=d['trace']
print('$rep $setting $m', t['generated'], round(1000*t['time_total']/t['generated'],1), 'ms/token', 'draft', round(1000*t.get('time_draft',0)/max(1,t['draft_calls']),1) if t.get('draft_calls') else '-', 'ms/call')"
    done
  done
done
