#!/bin/bash
# Session 26's H200 calls (issues 17 and 12): the study's memory at 32k against the plan, session 22's
# TALLOW_NORM_ADD_Q8 measured, and the study on per-depth pools.
#   bash scripts/gpu_session_26.sh STEP...      (carry .whl, .twins2x, .llsrc or .llbin; logs in $OUT)
# Steps:
#   setup     wheels, twin headers, llama-bench b11434 in the background (.llbin's pieces or built from .llsrc),
#             the six study twins, the Gemma-4-E2B and qwen3-4b twins
#   peak      scripts/peak_at_depth.py --device cuda for the six twins at 32768 (Falcon-H1-0.5B at its 16384)
#   kernel    scripts/gpu_norm_add_q8.py: the fused norm + Q8_1 launch's bits (both reshape variants) and its µs
#   ab        gpu_ab.py tg128 -r 3: TALLOW_NORM_ADD_Q8=1 / 0 / 1 on gemma4-e2b and qwen3-4b (the control)
#   profile   E2B's no-PDL decode profile with TALLOW_NORM_ADD_Q8=1 and 0 (launch counts, span)
#   pack      wait for llama-bench, then its xz pieces into $OUT (a later lease carries them as .llbin)
#   study     scripts/gpu_study.sh over the six twins (tg64 and pp512 at 0..32768 beside llama-bench, -r 2)
. "$(dirname "$0")/gpu_lib.sh" || exit 1
state; git log --oneline -1 2>/dev/null | tee -a $OUT/steps.log
for step in "$@"; do
  case $step in
    setup) say "setup"; setup_twins; extra_twin gemma4-e2b || say "gemma4-e2b FAILED"; extra_twin qwen3-4b || say "qwen3-4b FAILED"
      ls -la /root/twins | tee -a $OUT/steps.log ;;
    peak) say "peak: GPU memory at 32k against the plan"
      for t in $TWINS6; do
        ctx=32768; [ $t = falcon-h1-0.5b ] && ctx=16384
        timeout 150 python3 scripts/peak_at_depth.py /root/twins/$t.gguf $ctx --device cuda 2>>$OUT/peak.err | tee -a $OUT/peak.jsonl
      done ;;
    kernel) say "kernel: scripts/gpu_norm_add_q8.py"
      timeout 150 python3 scripts/gpu_norm_add_q8.py 2>&1 | grep -v Warning | tee $OUT/kernel.txt ;;
    ab) say "ab: tg128, TALLOW_NORM_ADD_Q8=1 / 0 / 1"; state
      timeout ${AB_S:-240} python3 scripts/gpu_ab.py --work /root/twins --twins gemma4-e2b,qwen3-4b --tests "-p 0 -n 128 -r 3" \
        TALLOW_NORM_ADD_Q8=1 TALLOW_NORM_ADD_Q8=0 TALLOW_NORM_ADD_Q8=1 2>&1 | tee -a $OUT/ab.txt; state ;;
    profile) for v in 1 0; do say "profile E2B TALLOW_PDL=0 TALLOW_NORM_ADD_Q8=$v"
        TALLOW_PDL=0 TALLOW_NORM_ADD_Q8=$v timeout 150 python3 scripts/gpu_profile.py /root/twins/gemma4-e2b.gguf --prefill 33 \
          --decode 8 --sequence > $OUT/prof_$v.txt 2>&1
        grep -A14 "^last replay" $OUT/prof_$v.txt | tee -a $OUT/steps.log; done ;;
    pack) say "pack: waiting for llama-bench"; wait; cat $OUT/llama_bg.log | tee -a $OUT/steps.log
      [ -x $LLAMA ] && { strip $LLAMA; xz -T16 -6 -c $LLAMA | split -b 15M -d -a 1 - $OUT/llama-bench.xz.; ls -la $OUT | tee -a $OUT/steps.log; } ;;
    study) say "study: gpu_study.sh over the six twins, llama-bench right after tallow on each file"; state
      wait; build_llama || say "no llama-bench"
      ONLY="${STUDY_ONLY:-$TWINS6}" PER_MODEL_S=${PER_MODEL_S:-80} TOTAL_S=${TOTAL_S:-300} CHECK_TOKENS=200 WORK=/root \
        timeout ${STUDY_S:-380} bash scripts/gpu_study.sh $LLAMA > /dev/null 2>&1
      grep -v "^ROWS_JSON" $OUT/gpu_study.log | grep -E "PASS|FAIL|DIFF|SKIP" | head -12
      grep -v "^ROWS_JSON" $OUT/gpu_study.log | grep -A40 "== the table"; state ;;
    *) say "unknown step $step" ;;
  esac
done
say "done"
