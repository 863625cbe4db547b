#!/usr/bin/env bash
# The full-size benchmarks of BENCHMARKS.md, one resumable run each. Run from the repository root after
# `make install models`.
#
#   benchmarks/run_full.sh RUN [UPTO]
#
# RUN is one of:
#   sd-humaneval-T0 sd-dev-T0 sd-humaneval-T1 sd-dev-T1   ar, draft, sd at γ = 1..6 and transformers' peers
#   draft-bf16-humaneval-T0 draft-bf16-dev-T0             the same prompts, sd with a bfloat16 draft
#   multipath-T0.6 multipath-T1.0                         sd, bv and every multi-path verifier at K = 2..4, γ = 4, 8
#   int4-multipath-T1.0                                   gbv and specinfer (K = 3) against sd and bv on the int4 path
#   fixed-blocks-T0.6 fixed-blocks-T1.0                   every verifier's exact E[τ] on shared drafted blocks
#   sprinter-T0 sprinter-T1                               SPRINTER's speed against quality (trains its verifier first)
#   llamacpp-draft-humaneval-T0 llamacpp-draft-dev-T0     against llama.cpp: the int8 target with llama.cpp's draft,
#   llamacpp-draft-humaneval-T1 llamacpp-draft-dev-T1     next to llama.cpp's own plain and speculative decoding
#   int4-llamacpp-draft-humaneval-T0                      the same on the int4 backend (4-bit GGUF layers in 4 bits)
#   int4-llamacpp-draft-dev-T0 int4-llamacpp-draft-humaneval-T1 int4-llamacpp-draft-dev-T1
#   int4-q4_0-draft-humaneval-T0 int4-q4_0-draft-dev-T0   the same with the draft requantised to Q4_0
#   int4-q4_0-draft-humaneval-T1 int4-q4_0-draft-dev-T1   (llamacpp:default-q4_0, written by `make peers`)
#   int4-torch-draft-humaneval-T0 int4-torch-draft-dev-T0 the same with the draft in torch on the int4 backend
#   int4-torch-draft-humaneval-T1 int4-torch-draft-dev-T1
#   lossy-humaneval-T0 lossy-humaneval-T1                 the lossy rules and SPRINTER against ar, sd and draft:
#                                                         HumanEval pass@1 by execution, speed on the int8 path
#   int4-lossy-humaneval-T0 int4-lossy-humaneval-T1       the same with both models on the int4 backend
#   int4-lookup-categories-T0 int4-lookup-categories-T1   the same on int4 with the Q4_0 draft, without hf-lookup
#   int4-torch-draft-lookup-categories-T0                 the same with the torch draft (int4) and no llama.cpp
#   lookup-categories-T0 lookup-categories-T1             prompt lookup (ngram), the hybrid and the model drafter on
#                                                         Spec-Bench's summarization and RAG prompts, against ar,
#                                                         transformers' prompt lookup and llama.cpp's plain decoding
#   int4-draft-vocab-humaneval-T0 int4-draft-vocab-mt-bench-T0
#                                                         sd with the reduced draft head (32k, 16k, 8k tokens + the
#                                                         context's) against the full head, both models on int4
#   onednn-draft-vocab-humaneval-T0 onednn-draft-vocab-mt-bench-T0
#                                                         the same (16k) on the float32 default path
#   default-humaneval-T0 default-dev-T1                   the default path (no flags) against llama.cpp; ISA=avx2
#   default-humaneval-T1 default-dev-T0                   for verispec's AVX2 kernel against llama.cpp's AVX2 build
#   keyed-dev-T1 keyed-humaneval-T1                       keyed draws (same tokens as keyed ar) against plain ar, sd
#   profile                                               the cost model's hardware profiles (oneDNN and torch linears)
# UPTO runs that many prompts in all (default: the full size). Every bench run writes its results after each prompt
# and resumes with `--resume`, so a run can stop (or be killed) and go on later, losing at most the prompt in
# progress; rerun with a larger UPTO to extend it. Each run's results are also kept, compressed and without the
# prompts' text, in benchmarks/results/NAME.json.gz (committed; `verispec archive`), and a run resumes from there on
# a machine that lacks results/full/NAME.json. On a 2-core CPU these runs take about 30 hours together.
# The sd and bv variants here name the drafter they measure (the model drafter; the default for sd and bv is hybrid).
# Runs archived before sd and bv chose γ per round by default measured a fixed γ; a rerun of those measures the
# adaptive γ unless its variants add adaptive_gamma=false (the default-* runs name both).
# TAG=WORD appends -WORD to the run's name: a fresh run (another machine, another commit) beside the archived one.
#
# Prompt sets. Evaluation prompts never overlap SPRINTER's training prompts: the verifiers are trained on the dev
# split shuffled with seed 0, positions 0-31; the sd, multipath and fixed-blocks runs use positions 100+ of
# shuffles with seed 0; the sprinter runs use the dev split's short categories in seed-1 order with every training
# prompt removed (checked against the training manifest's prompt ids).
set -euo pipefail
export HF_HUB_OFFLINE=1
V=".venv/bin/python -m verispec"
PY=".venv/bin/python"
DEV="spec-bench:../shared/data/spec_bench/dev.jsonl"
SHORT=(writing roleplay reasoning math coding stem humanities translation qa math_reasoning)  # no RAG/summaries
OUT=results/full
ARCHIVE=benchmarks/results  # committed; rewritten by the bench after every prompt
mkdir -p "$OUT" results/sprinter
RUN=${1:?usage: benchmarks/run_full.sh RUN [UPTO]}
N=128

bench() {  # bench NAME UPTO ARGS...: one resumable run into $OUT/NAME.json (NAME-TAG with TAG), with its report
  local name=$1${TAG:+-$TAG} upto=$2
  shift 2
  # $OUT is not committed and does not outlive the machine; the archive in $ARCHIVE (prompt texts left out) is.
  # Resume from the archive when the results file is not here; the bench rewrites the archive after every prompt
  # (--archive), so a run stopped mid-way still leaves every finished prompt in a file git tracks.
  if [ ! -f "$OUT/$name.json" ] && [ -f "$ARCHIVE/$name.json.gz" ]; then
    $V archive unpack "$ARCHIVE/$name.json.gz" "$OUT/$name.json"
  fi
  $V bench "$@" --max-new-tokens "$N" --limit "$upto" --resume --no-progress --out "$OUT/$name.json" \
    --archive "$ARCHIVE/$name.json.gz" --report
}

sd_prompts() {  # sd_prompts SOURCE: sets PROMPTS, the sd runs' prompts (dev positions 100+, or HumanEval)
  if [ "$1" = dev ]; then PROMPTS=(--prompts "$DEV" --subset-seed 0 --offset 100); else PROMPTS=(--prompts humaneval --subset-seed 0); fi
}

sd_run() {  # sd_run SOURCE TEMPERATURE UPTO: sd against ar, the draft alone and transformers' peers
  sd_prompts "$1"
  bench "sd-$1-T$2" "$3" "${PROMPTS[@]}" --temperature "$2" \
    --methods ar draft sd:gamma=1,drafter=model sd:gamma=2,drafter=model sd:gamma=4,drafter=model sd:gamma=6,drafter=model hf-generate \
              hf-assisted:gamma=1 hf-assisted:gamma=2 hf-assisted:gamma=4 hf-assisted:gamma=6 \
    --compare-to hf-assisted:gamma=4
}

confidence_run() {  # confidence_run SOURCE TEMPERATURE UPTO: sd and bv with the draft-confidence stop, int4 path
  sd_prompts "$1"
  bench "int4-confidence-$1-T$2" "$3" "${PROMPTS[@]}" --temperature "$2" --linear-backend int4 \
    --compare-to sd:gamma=4,drafter=model --methods ar sd:gamma=4,drafter=model sd:gamma=4,draft_confidence=0.1,drafter=model sd:gamma=4,draft_confidence=0.3,drafter=model \
    sd:gamma=6,draft_confidence=0.3,drafter=model bv:gamma=4,drafter=model bv:gamma=4,draft_confidence=0.3,drafter=model
}

confidence_more() {  # confidence_more SOURCE TEMPERATURE UPTO: the stop at 0.3 and 0.5, and with the hybrid drafter
  sd_prompts "$1"
  bench "int4-confidence-more-$1-T$2" "$3" "${PROMPTS[@]}" --temperature "$2" --linear-backend int4 \
    --compare-to sd:gamma=4,drafter=model --methods ar sd:gamma=4,drafter=model sd:gamma=4,draft_confidence=0.3,drafter=model sd:gamma=4,draft_confidence=0.5,drafter=model \
    sd:gamma=4,drafter=hybrid sd:gamma=4,drafter=hybrid,draft_confidence=0.3
}

multipath() {  # multipath TEMPERATURE UPTO: every multi-path method at K = 2..4 (K = 1 is sd / bv), gamma 4 and 8
  local methods=(ar sd:gamma=4,drafter=model sd:gamma=8,drafter=model bv:gamma=4,drafter=model bv:gamma=8,drafter=model)
  for k in 2 3 4; do for g in 4 8; do for m in gbv specinfer spectr nss; do methods+=("$m:paths=$k,gamma=$g"); done; done; done
  bench "multipath-T$1" "$2" --prompts "$DEV" --category "${SHORT[@]}" --subset-seed 0 --offset 100 \
    --temperature "$1" --methods "${methods[@]}" --compare-to bv:gamma=4,drafter=model
}

multipath_int4() {  # multipath_int4 TEMPERATURE UPTO: GBV and SpecInfer (K = 3) against sd and bv, γ = 4, int4 path
  bench "int4-multipath-T$1" "$2" --prompts "$DEV" --category "${SHORT[@]}" --subset-seed 0 --offset 100 \
    --temperature "$1" --linear-backend int4 --compare-to bv:gamma=4,drafter=model \
    --methods ar sd:gamma=4,drafter=model bv:gamma=4,drafter=model gbv:paths=3,gamma=4 specinfer:paths=3,gamma=4
}

sprinter_verifier() {  # sprinter_verifier TEMPERATURE FEATURES: collect on the training prompts and train, once
  local t=$1
  if [ ! -f "results/sprinter/train_T$t.safetensors" ]; then
    $V verifier collect --prompts "$DEV" --subset-seed 0 --offset 0 --limit 32 --steps 32 --lam 1.0 \
      --temperature "$t" --seed 0 --no-progress --out "results/sprinter/train_T$t.safetensors"
  fi
  if [ ! -f "results/sprinter/verifier_T$t.safetensors" ]; then
    $V verifier train --data "results/sprinter/train_T$t.safetensors" --features "$2" --l2 1.0 --lr 0.001 \
      --epochs 50 --out "results/sprinter/verifier_T$t.safetensors"
  fi
  # Thresholds calibrated on the training prompts' validation split (never on evaluation prompts) to
  # eta_FP = 0.1 and 0.25, next to the paper's default tau = 0.5. Written once, so resumed runs keep them.
  if [ ! -f "results/sprinter/taus_T$t.txt" ]; then
    $PY - "$t" "$2" <<'PY' > "results/sprinter/taus_T$t.txt"
import sys
import torch
from verispec.learned.collect import load_dataset
from verispec.learned.train import train_verifier
from verispec.learned.verifier import LearnedVerifier
t, features = sys.argv[1], sys.argv[2]
deployed = LearnedVerifier.load(f"results/sprinter/verifier_T{t}.safetensors")
data = load_dataset(f"results/sprinter/train_T{t}.safetensors")
taus = []
for rate in (0.1, 0.25):
    verifier, _ = train_verifier(data, features=features, l2=1.0, lr=1e-3, epochs=50, target_fp_rate=rate)
    assert torch.equal(verifier.weight, deployed.weight), "retraining did not reproduce the deployed verifier"
    taus.append(round(verifier.threshold, 3))
print(" ".join(str(tau) for tau in sorted(set(taus), reverse=True)))
PY
  fi
}

sprinter_prompts() {  # the held-out evaluation prompts, written once
  [ -f "$OUT/sprinter_prompts.jsonl" ] && return
  $PY - "$DEV" "${SHORT[@]}" <<'PY' > "$OUT/sprinter_prompts.jsonl"
import json
import sys
from verispec.prompt_sets import load_prompts
source, cats = sys.argv[1], sys.argv[2:]
train = set()
for t in ("0", "1"):
    train |= set(json.load(open(f"results/sprinter/train_T{t}.safetensors.json"))["prompt_ids"])
rows = {str(json.loads(line)["question_id"]): line for line in open(source.split(":", 1)[1])}
held_out = [p for p in load_prompts(source, cats, None, 1, 0) if p.id not in train]
assert len(held_out) >= 40, len(held_out)
for p in held_out[:40]:
    sys.stdout.write(rows[p.id])
PY
}

sprinter_run() {  # sprinter_run TEMPERATURE UPTO
  local t=$1 features=token
  [ "$t" = 0 ] && features=context  # at T = 0, q is one-hot: q(x) and its entropy carry nothing
  sprinter_verifier "$t" "$features"
  sprinter_verifier "$([ "$t" = 0 ] && echo 1 || echo 0)" "$([ "$t" = 0 ] && echo token || echo context)"
  sprinter_prompts
  local sprinters=(sprinter:tau=0.5)
  for tau in $(cat "results/sprinter/taus_T$t.txt"); do sprinters+=("sprinter:tau=$tau"); done
  bench "sprinter-T$t" "$2" --prompts "$OUT/sprinter_prompts.jsonl" --temperature "$t" \
    --verifier "results/sprinter/verifier_T$t.safetensors" \
    --methods ar draft sd:gamma=4,drafter=model "${sprinters[@]}" sprinter-exact:tau=0.5 --compare-to sd:gamma=4,drafter=model --quality
  $V pareto "$OUT/sprinter-T$t.json" --out "$OUT/sprinter-T${t}_pareto.png"
}

draft_bf16() {  # draft_bf16 SOURCE UPTO: the sd runs' prompts with the draft in bfloat16 (the target stays float32)
  sd_prompts "$1"
  bench "draft-bf16-$1-T0" "$2" "${PROMPTS[@]}" --temperature 0 --draft-dtype bfloat16 \
    --methods ar draft sd:gamma=2,drafter=model sd:gamma=4,drafter=model sd:gamma=6,drafter=model
}

fixed_blocks() {  # fixed_blocks TEMPERATURE UPTO: exact E[τ] of every verifier on the same drafted blocks
  local name="fixed-blocks-T$1${TAG:+-$TAG}"
  $V fixed-blocks --prompts "$DEV" --category "${SHORT[@]}" --subset-seed 0 --offset 100 --limit "$2" \
    --temperature "$1" --out "$OUT/$name.json"
  gzip -n -c "$OUT/$name.json" > "$ARCHIVE/$name.json.gz"  # -n: no timestamp, so the same results give the same bytes
}

llamacpp_run() {  # llamacpp_run SOURCE TEMPERATURE UPTO [BACKEND [DRAFT]]: verispec (int8 target, or BACKEND,
  # draft in llama.cpp: the shipped GGUF, or DRAFT; DRAFT=torch: the draft in torch on BACKEND) against llama.cpp
  local backend="${4:-int8}" draft="${5:-default}" name="llamacpp-draft-$1-T$2" spec
  [ "$draft" != default ] && name="${draft#default-}-draft-$1-T$2"
  [ "$backend" != int8 ] && name="$backend-$name"
  spec="llamacpp:$draft"
  [ "$draft" = torch ] && spec=default
  sd_prompts "$1"
  bench "$name" "$3" "${PROMPTS[@]}" --temperature "$2" --linear-backend "$backend" --draft "$spec" \
    --methods ar sd:gamma=4,drafter=model sd:drafter=hybrid llamacpp-generate llamacpp-speculative --gamma 4 \
    --compare-to llamacpp-generate
}

lossy_run() {  # lossy_run TEMPERATURE UPTO [BACKEND]: the lossy rules at their middle and loosest knob values (bench/pareto.py
  # SWEEPS; the lossless end is `sd`) and the packaged SPRINTER verifier (trained at T = 0) at its threshold 0.667
  # and at the paper's 0.5, against ar, sd and the draft alone; whole functions (up to 384 tokens, stopped at the
  # function's end), scored by running HumanEval's tests. fuzzy runs at T > 0 only: at T = 0 p and q are point
  # masses, JS(p, q) is 0 or ln 2, and every threshold below ln 2 decodes exactly as sd.
  # BACKEND (default int8) is both models' linear backend; runs on another one are named after it.
  local fuzzy=() backend=${3:-int8} name="lossy-humaneval-T$1"
  [ "$1" != 0 ] && fuzzy=(fuzzy:threshold=0.15 fuzzy:threshold=0.3)
  [ "$backend" != int8 ] && name="$backend-$name"
  N=384 bench "$name" "$2" --prompts humaneval --subset-seed 0 --temperature "$1" --linear-backend "$backend" \
    --stop-at-function-end --quality --compare-to sd:gamma=4,drafter=model \
    --methods ar draft sd:gamma=4,drafter=model sprinter sprinter:tau=0.5 typical:epsilon=0.09,delta=0.3 \
              typical:epsilon=0.03,delta=0.1 margin:delta=1 margin:delta=2 fly:entropy=0.1 "${fuzzy[@]}"
  name="$name${TAG:+-$TAG}"
  $V pareto "$OUT/$name.json" --fronts "$OUT/$name"
  $V pareto "$OUT/$name.json" --x answer_speedup --fronts "$OUT/$name-per-answer"
}

lookup_run() {  # lookup_run TEMPERATURE UPTO [BACKEND DRAFT]: the drafters on the long-context categories (int8
  # target, draft in llama.cpp; transformers' prompt lookup on its own linears, as users run it). Seed-1 order: no
  # prompt of the SPRINTER verifiers' or the vocabulary ranking's development was chosen from it. transformers' prompt
  # lookup runs at T = 0 on int8 only: it takes 3.4x ar's time, half the run, and T = 0 already answers how the two
  # compare. With BACKEND and DRAFT (a llamacpp: spec) the run is named after the backend; DRAFT "torch" runs the
  # default draft on BACKEND and leaves llama.cpp out altogether (no `make peers` needed).
  local peers=(llamacpp-generate) backend=${3:-int8} draft=${4:-default} name="lookup-categories-T$1" spec
  spec="llamacpp:$draft"
  if [ "$1" = 0 ] && [ "$backend" = int8 ]; then peers+=(hf-lookup); fi
  [ "$backend" != int8 ] && name="$backend-$name"
  if [ "$draft" = torch ]; then peers=() spec=default name="$backend-torch-draft-lookup-categories-T$1"; fi
  bench "$name" "$2" --prompts "$DEV" --category summarization rag --subset-seed 1 \
    --temperature "$1" --linear-backend "$backend" --draft "$spec" --gamma 4 \
    --methods ar sd:gamma=4,drafter=model sd:drafter=ngram sd:drafter=ngram,gamma=8 sd:drafter=hybrid "${peers[@]}"
}

draft_vocab_run() {  # draft_vocab_run SOURCE UPTO [BACKEND]: the reduced draft head against the full one, T = 0, int4
  # path (or BACKEND: onednn is the float32 default path, where the head is a larger share of the draft; 16k only).
  # MT-Bench and HumanEval: the ranking's mix of code, prose and the draft's answers was chosen on Spec-Bench dev
  # prompts outside MT-Bench's categories, not on these. (The 32k head joined the int4 runs with that ranking.)
  local backend=${3:-int4} heads=(sd:gamma=4,draft_vocab=32768,drafter=model sd:gamma=4,draft_vocab=16384,drafter=model sd:gamma=4,draft_vocab=8192,drafter=model)
  [ "$backend" != int4 ] && heads=(sd:gamma=4,draft_vocab=16384,drafter=model)
  bench "$backend-draft-vocab-$1-T0" "$2" --prompts "$1" --subset-seed 0 --temperature 0 --linear-backend "$backend" \
    --compare-to sd:gamma=4,drafter=model --methods ar sd:gamma=4,drafter=model "${heads[@]}"
}

default_run() {  # default_run SOURCE TEMPERATURE UPTO: the default path, no flags (auto backend, sd with its default
  # drafter), fixed and adaptive γ, against llama.cpp's plain decoding of the same GGUF. ISA=avx2 runs verispec's
  # AVX2 kernel (VERISPEC_ISA) against llama.cpp built for AVX2 only (`make peers ISA=avx2`), on the same host.
  local peer=llamacpp-generate name="default-$1-T$2"
  if [ -n "${ISA:-}" ]; then
    export VERISPEC_ISA=$ISA
    peer="llamacpp-generate:isa=$ISA" name="$name-$ISA"
  fi
  sd_prompts "$1"
  # (the archives, measured before the adaptive γ became the default, hold the fixed γ as `sd` and the default as
  # `sd:adaptive_gamma=true`; a fresh run names them `sd:adaptive_gamma=false` and `sd`)
  bench "$name" "$3" "${PROMPTS[@]}" --temperature "$2" \
    --methods ar sd sd:adaptive_gamma=false sd:drafter=model "$peer" --compare-to "$peer"
}

keyed_run() {  # keyed_run SOURCE TEMPERATURE UPTO: keyed draws (docs/algorithms.md §0.1) against the engine's own
  # draws on the default path; keyed ar and keyed sd write the same tokens (the same EOS), so their ratio carries no
  # sampling noise, while plain ar and sd each write their own sample
  sd_prompts "$1"
  bench "keyed-$1-T$2" "$3" "${PROMPTS[@]}" --temperature "$2" \
    --methods ar ar:keyed_draws=true sd sd:keyed_draws=true --compare-to ar
}

profiles() {  # the cost model's profiles: verispec's oneDNN linears, and transformers' own linears for the peers
  $V profile --out results/profile_cpu_fp32_onednn.json
  $V profile --linear-backend torch --out results/profile_cpu_fp32_torch.json
}

case "$RUN" in
  sd-humaneval-T0) sd_run humaneval 0 "${2:-20}" ;;
  sd-dev-T0) sd_run dev 0 "${2:-20}" ;;
  sd-humaneval-T1) sd_run humaneval 1 "${2:-20}" ;;
  sd-dev-T1) sd_run dev 1 "${2:-20}" ;;
  multipath-T0.6) multipath 0.6 "${2:-20}" ;;
  multipath-T1.0) multipath 1.0 "${2:-20}" ;;
  fixed-blocks-T0.6) fixed_blocks 0.6 "${2:-20}" ;;
  fixed-blocks-T1.0) fixed_blocks 1.0 "${2:-20}" ;;
  sprinter-T0) sprinter_run 0 "${2:-40}" ;;
  sprinter-T1) sprinter_run 1 "${2:-40}" ;;
  draft-bf16-humaneval-T0) draft_bf16 humaneval "${2:-20}" ;;
  draft-bf16-dev-T0) draft_bf16 dev "${2:-20}" ;;
  llamacpp-draft-humaneval-T0) llamacpp_run humaneval 0 "${2:-20}" ;;
  llamacpp-draft-dev-T0) llamacpp_run dev 0 "${2:-20}" ;;
  llamacpp-draft-humaneval-T1) llamacpp_run humaneval 1 "${2:-20}" ;;
  llamacpp-draft-dev-T1) llamacpp_run dev 1 "${2:-20}" ;;
  int4-llamacpp-draft-humaneval-T0) llamacpp_run humaneval 0 "${2:-20}" int4 ;;
  int4-llamacpp-draft-dev-T0) llamacpp_run dev 0 "${2:-20}" int4 ;;
  int4-llamacpp-draft-humaneval-T1) llamacpp_run humaneval 1 "${2:-20}" int4 ;;
  int4-llamacpp-draft-dev-T1) llamacpp_run dev 1 "${2:-20}" int4 ;;
  int4-q4_0-draft-humaneval-T0) llamacpp_run humaneval 0 "${2:-20}" int4 default-q4_0 ;;
  int4-q4_0-draft-dev-T0) llamacpp_run dev 0 "${2:-20}" int4 default-q4_0 ;;
  int4-q4_0-draft-humaneval-T1) llamacpp_run humaneval 1 "${2:-20}" int4 default-q4_0 ;;
  int4-q4_0-draft-dev-T1) llamacpp_run dev 1 "${2:-20}" int4 default-q4_0 ;;
  int4-torch-draft-humaneval-T0) llamacpp_run humaneval 0 "${2:-20}" int4 torch ;;
  int4-torch-draft-dev-T0) llamacpp_run dev 0 "${2:-20}" int4 torch ;;
  int4-torch-draft-humaneval-T1) llamacpp_run humaneval 1 "${2:-20}" int4 torch ;;
  int4-torch-draft-dev-T1) llamacpp_run dev 1 "${2:-20}" int4 torch ;;
  lossy-humaneval-T0) lossy_run 0 "${2:-40}" ;;
  lossy-humaneval-T1) lossy_run 1 "${2:-40}" ;;
  int4-lossy-humaneval-T0) lossy_run 0 "${2:-40}" int4 ;;
  int4-multipath-T1.0) multipath_int4 1.0 "${2:-20}" ;;
  int4-confidence-dev-T1) confidence_run dev 1 "${2:-20}" ;;
  int4-confidence-humaneval-T1) confidence_run humaneval 1 "${2:-20}" ;;
  int4-confidence-more-dev-T0.6) confidence_more dev 0.6 "${2:-20}" ;;
  int4-lookup-categories-T0) lookup_run 0 "${2:-20}" int4 default-q4_0 ;;
  int4-lookup-categories-T1) lookup_run 1 "${2:-20}" int4 default-q4_0 ;;
  int4-torch-draft-lookup-categories-T0) lookup_run 0 "${2:-20}" int4 torch ;;
  int4-lossy-humaneval-T1) lossy_run 1 "${2:-40}" int4 ;;
  lookup-categories-T0) lookup_run 0 "${2:-20}" ;;
  lookup-categories-T1) lookup_run 1 "${2:-20}" ;;
  int4-draft-vocab-humaneval-T0) draft_vocab_run humaneval "${2:-10}" ;;
  int4-draft-vocab-mt-bench-T0) draft_vocab_run mt-bench "${2:-10}" ;;
  onednn-draft-vocab-humaneval-T0) draft_vocab_run humaneval "${2:-10}" onednn ;;
  onednn-draft-vocab-mt-bench-T0) draft_vocab_run mt-bench "${2:-10}" onednn ;;
  default-humaneval-T0) default_run humaneval 0 "${2:-20}" ;;
  default-dev-T1) default_run dev 1 "${2:-20}" ;;
  keyed-dev-T1) keyed_run dev 1 "${2:-20}" ;;
  keyed-humaneval-T1) keyed_run humaneval 1 "${2:-20}" ;;
  default-humaneval-T1) default_run humaneval 1 "${2:-20}" ;;
  default-dev-T0) default_run dev 0 "${2:-20}" ;;
  profile) profiles ;;
  *) echo "unknown run: $RUN" >&2; exit 2 ;;
esac
