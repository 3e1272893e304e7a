#!/bin/bash
# Session 17's H200 calls (issue 17): the decode merge sized from the live depth, then the final study.
#   bash scripts/gpu_session_17.sh STEP...      (carry .whl, .twins2x, .llbin; logs in $OUT)
# Steps:
#   setup     the wheels into /tmp/site, the twin headers unpacked, llama-bench b11434 from .llbin's pieces (in the
#             background), the six twins written
#   profile   one decode step of qwen25-1.5b over a 32k-slot cache (scripts/gpu_profile.py --ctx 32768 --sequence),
#             TALLOW_ATTN_LIVE_MERGE=1 and =0: the merge kernel's time
#   bits      TALLOW_ATTN_LIVE_MERGE on the qwen twin over a 32k-slot cache (scripts/gpu_switch_bits.py): against a
#             2k-slot cache (the same bits expected) and against the switch off
#   shortk    TALLOW_GEMV_SHORT_K on the mamba twin's own dt projections (scripts/gpu_short_k.py: both GEMVs against fp64)
#   ab        gpu_ab.py, tg64 -r 3: TALLOW_ATTN_LIVE_MERGE=1 / off / =1 on qwen (depths 0,1024,4096,32256: a 32k
#             cache) and falcon-h1-0.5b (0,1024,15872: its 16k cache); TALLOW_GEMV_SHORT_K=1 / off / =1 on mamba-1.4b
#   confirm   gpu_ab.py on mamba-1.4b at 1024,4096: the default / TALLOW_GEMV_SHORT_K=0 / the default (after the default
#             turned on)
#   check     scripts/gpu_ssmgpu.py check (tiny mamba / mamba2 / falcon-h1 through the graphs against llama.cpp's
#             fixtures) with the default
#   study     scripts/gpu_study.sh over the six twins or STUDY_ONLY (tg64 and pp512 at 0..32768 beside llama-bench, -r 2)
#   tar       every log in $OUT into one archive (the tool returns a limited count of files)
. "$(dirname "$0")/gpu_lib.sh" || exit 1
for step in "$@"; do
  case $step in
    setup) say "setup"; setup_twins ;;
    profile) say "profile: qwen over a 32k-slot cache, the live merge on and off"
      for v in 1 0; do
        TALLOW_ATTN_LIVE_MERGE=$v timeout 120 python3 scripts/gpu_profile.py /root/twins/qwen25-1.5b.gguf --ctx 32768 \
          --prefill 33 --decode 8 --sequence > $OUT/profile_qwen_live$v.txt 2>&1
        grep -E "last replay|_merge_kernel|_split_kernel" $OUT/profile_qwen_live$v.txt | head -4 | sed "s/^/live=$v: /" \
          | tee -a $OUT/steps.log; done ;;
    bits) say "bits: the live merge over a 32k cache against a 2k cache and against the switch off"
      TALLOW_ATTN_LIVE_MERGE=1 timeout 150 python3 scripts/gpu_switch_bits.py /root/twins/qwen25-1.5b.gguf --ctx 32768 \
        ctx=2048 TALLOW_ATTN_LIVE_MERGE=0 2>&1 | grep -v Warning | tail -3 | tee -a $OUT/bits.txt ;;
    shortk) say "shortk: the mamba dt projections' two GEMVs against fp64"
      timeout 100 python3 scripts/gpu_short_k.py /root/twins/mamba-1.4b.gguf 2>&1 | grep -v Warning | tail -3 | tee -a $OUT/bits.txt ;;
    ab) say "ab: TALLOW_ATTN_LIVE_MERGE=1 / off / =1, TALLOW_GEMV_SHORT_K=1 / off / =1, tg64 -r 3"; state
      timeout ${AB_S:-200} python3 scripts/gpu_ab.py --work /root/twins --twins mamba-1.4b --tests "-p 0 -n 64 -d 0,1024,4096 -r 3" \
        TALLOW_GEMV_SHORT_K=1 TALLOW_GEMV_SHORT_K=0 TALLOW_GEMV_SHORT_K=1 2>&1 | tee -a $OUT/ab.txt
      for spec in "qwen25-1.5b|0,1024,4096,32256" "falcon-h1-0.5b|0,1024,15872"; do
        IFS='|' read -r t d <<< "$spec"
        timeout ${AB_S:-200} python3 scripts/gpu_ab.py --work /root/twins --twins $t --tests "-p 0 -n 64 -d $d -r 3" \
          TALLOW_ATTN_LIVE_MERGE=1 TALLOW_ATTN_LIVE_MERGE=0 TALLOW_ATTN_LIVE_MERGE=1 2>&1 | tee -a $OUT/ab.txt; done; state ;;
    confirm) say "confirm: the default / TALLOW_GEMV_SHORT_K=0 / the default on mamba-1.4b"; state
      timeout 150 python3 scripts/gpu_ab.py --work /root/twins --twins mamba-1.4b --tests "-p 0 -n 64 -d 1024,4096 -r 3" \
        base TALLOW_GEMV_SHORT_K=0 base 2>&1 | tee -a $OUT/ab.txt ;;
    check) say "check: tiny models through the graphs vs llama.cpp's fixtures"
      timeout ${CHECK_S:-100} python3 scripts/gpu_ssmgpu.py check --work /tmp/ssmgpu 2>&1 | tail -40 > $OUT/ssm_check.txt
      echo "ssmgpu check: $(grep -c PASS $OUT/ssm_check.txt) PASS, $(grep -c FAIL $OUT/ssm_check.txt) FAIL" | tee -a $OUT/steps.log
      grep -v PASS $OUT/ssm_check.txt | tail -5 ;;
    study) say "study: gpu_study.sh over the six twins, llama-bench right after tallow on each file"; state
      wait; cat $OUT/llama_bg.log | tee -a $OUT/steps.log
      ONLY="${STUDY_ONLY:-$TWINS6}" PER_MODEL_S=${PER_MODEL_S:-80} TOTAL_S=${TOTAL_S:-280} CHECK_TOKENS=200 WORK=/root \
        timeout ${STUDY_S:-340} bash scripts/gpu_study.sh $LLAMA > /dev/null 2>&1
      grep -v "^ROWS_JSON" $OUT/gpu_study.log | grep -E "PASS|FAIL|DIFF|SKIP" | head -12
      grep -v "^ROWS_JSON" $OUT/gpu_study.log | grep -A40 "== the table"; state ;;
    tar) say "tar"; (cd $OUT && tar czf /tmp/logs.tgz . && rm -f $(ls) && mv /tmp/logs.tgz .) ;;
    *) say "unknown step $step" ;;
  esac
done
say "done"
