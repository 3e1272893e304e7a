#!/bin/bash
# Session 16's H200 calls (issue 17): the decode misses of session 15's study and the twins' NaN logits.
#   bash scripts/gpu_session_16.sh STEP...      (carry .whl, .twins2x, and .llsrc or .llbin; logs in $OUT)
# Steps:
#   setup     the wheels into /tmp/site, the twin headers unpacked, llama-bench b11434 from .llbin's pieces or
#             built from .llsrc in the background (gpu_same_run.sh's build_llama), the six twins written
#   profile   one decode step of PROFILE_TWINS (scripts/gpu_profile.py --sequence: the last replay's kernels by
#             name and in order), with TALLOW_PDL=0 (each kernel's own time) and with PDL
#   nan       scripts/gpu_nan_hunt.py on NAN_TWINS: the rewind check's 200-token context then one token, eager,
#             op by op on the GPU and on this machine's CPU
#   llama-wait  wait for the background build; its log
#   base      tg64 at depths 0,1024,4096 (BASE_TWINS): tallow bench -r 3, then llama-bench -r 5 on the same file
#   ab        AB_TWINS tg64 at AB_DEPTHS: the default, each of $AB (space-separated variants), the default again
#   check     scripts/gpu_ssmgpu.py check (tiny mamba / mamba2 / falcon-h1 through the graphs against llama.cpp's
#             fixtures); scripts/gpu_ssm_epilogue.py's tiny wide falcon-h1 with TALLOW_HYBRID_STACK_IN and
#             TALLOW_GEMV_ADD_EPILOGUE on / off / the CPU; scripts/gpu_switch_bits.py on the qwen and falcon-h1-0.5b twins
#   ab2       session 16's A/B: each change's switch off against the default (gpu_ab.py, tg64 -r 3)
#   skip      TALLOW_ATTN_SKIP_EMPTY: gpu_switch_bits.py and gpu_ab.py on the qwen twin, depths 0/1024/32256 (a 32k cache)
#   study     scripts/gpu_study.sh over the six twins or STUDY_ONLY (tg64 and pp512 at 0..32768 beside llama-bench, -r 2)
#   pack      llama-bench xz-split into $OUT (a later lease carries .llbin)
#   tar       every log in $OUT into one archive (the tool returns a limited count of files)
. "$(dirname "$0")/gpu_lib.sh" || exit 1
MISS4="mamba-1.4b falcon-h1-0.5b falcon-h1-1.5b-deep qwen25-1.5b"
for step in "$@"; do
  case $step in
    setup) say "setup"; setup_twins ;;
    profile) say "profile"
      for t in ${PROFILE_TWINS:-$MISS4}; do
        TALLOW_PDL=0 timeout 120 python3 scripts/gpu_profile.py /root/twins/$t.gguf --prefill 33 --decode 8 --sequence \
          > $OUT/profile_${t}_nopdl.txt 2>&1; grep "last replay" $OUT/profile_${t}_nopdl.txt | sed "s/^/$t no PDL: /" | tee -a $OUT/steps.log
        timeout 120 python3 scripts/gpu_profile.py /root/twins/$t.gguf --prefill 33 --decode 8 --sequence \
          > $OUT/profile_${t}_pdl.txt 2>&1; grep "last replay" $OUT/profile_${t}_pdl.txt | sed "s/^/$t PDL: /" | tee -a $OUT/steps.log
      done ;;
    nan) say "nan"
      for t in ${NAN_TWINS:-mamba-1.4b falcon-h1-3b}; do
        timeout ${NAN_S:-150} python3 scripts/gpu_nan_hunt.py /root/twins/$t.gguf --tokens 200 --devices ${NAN_DEVICES:-cuda,cpu} \
          2>&1 | grep -v Warning | tee $OUT/nan_$t.txt | head -60; done ;;
    llama-wait) say "llama-wait"; wait; cat $OUT/llama_bg.log | tee -a $OUT/steps.log
      [ -x $LLAMA ] || { tail -30 $OUT/llama_build.log $OUT/llama_cmake.log; } ;;
    base) say "base: tg64 at 0,1024,4096, tallow then llama-bench"
      for t in ${BASE_TWINS:-$MISS4}; do
        echo "== $t" | tee -a $OUT/table.log; state
        timeout 90 python3 -m tallow.cli bench -m /root/twins/$t.gguf --device cuda -p 0 -n 64 -d ${BASE_DEPTHS:-0,1024,4096} -r 3 \
          2>&1 | grep "^  \|rror" | tee -a $OUT/table.log
        llama $t -p 0 -n 64 -d ${BASE_DEPTHS:-0,1024,4096} -r 5; done; state ;;
    ab) say "ab: default, $AB, default; tg64 at ${AB_DEPTHS:-0,1024,4096}"; state
      timeout ${AB_S:-300} python3 scripts/gpu_ab.py --work /root/twins --twins $(echo ${AB_TWINS:-$MISS4} | tr ' ' ,) \
        --tests "-p 0 -n 64 -d ${AB_DEPTHS:-0,1024,4096} -r 3" base $AB base 2>&1 | tee -a $OUT/ab.txt; state ;;
    check) say "check: tiny models through the graphs vs llama.cpp's fixtures; the switches' bits"
      timeout ${CHECK_S:-100} python3 scripts/gpu_ssmgpu.py check --work /tmp/ssmgpu 2>&1 | tail -40 > $OUT/ssm_check.txt
      echo "ssmgpu check: $(grep -c PASS $OUT/ssm_check.txt) PASS, $(grep -c FAIL $OUT/ssm_check.txt) FAIL" | tee -a $OUT/steps.log
      grep -v PASS $OUT/ssm_check.txt | tail -5
      for sw in TALLOW_HYBRID_STACK_IN TALLOW_GEMV_ADD_EPILOGUE; do
        timeout 90 python3 scripts/gpu_ssm_epilogue.py falcon-h1 $sw --no-kernel 2>&1 | grep -v Warning | tail -3 | tee -a $OUT/bits.txt; done
      timeout 100 python3 scripts/gpu_switch_bits.py /root/twins/qwen25-1.5b.gguf TALLOW_GEMV_ADD_EPILOGUE TALLOW_GPU_ARGMAX \
        2>&1 | grep -v Warning | tail -3 | tee -a $OUT/bits.txt
      timeout 100 python3 scripts/gpu_switch_bits.py /root/twins/falcon-h1-0.5b.gguf TALLOW_HYBRID_STACK_IN TALLOW_GEMV_ADD_EPILOGUE \
        2>&1 | grep -v Warning | tail -3 | tee -a $OUT/bits.txt ;;
    ab2) say "ab2: each change off against the default, tg64, one process per setting"; state
      for spec in "qwen25-1.5b|0|TALLOW_GEMV_ADD_EPILOGUE=0 TALLOW_GPU_ARGMAX=0" \
                  "falcon-h1-0.5b|1024|TALLOW_HYBRID_STACK_IN=0 TALLOW_GEMV_ADD_EPILOGUE=0 TALLOW_GPU_ARGMAX=0" \
                  "falcon-h1-1.5b-deep|1024|TALLOW_HYBRID_STACK_IN=0" "mamba-1.4b|0|TALLOW_GPU_ARGMAX=0"; do
        IFS='|' read -r t d variants <<< "$spec"
        timeout 150 python3 scripts/gpu_ab.py --work /root/twins --twins $t --tests "-p 0 -n 64 -d $d -r 3" \
          base $variants base 2>&1 | tee -a $OUT/ab.txt; done; state ;;
    study) say "study: gpu_study.sh over the six twins, llama-bench right after tallow on each file"; state
      ONLY="${STUDY_ONLY:-$TWINS6}" PER_MODEL_S=${PER_MODEL_S:-80} TOTAL_S=${TOTAL_S:-280} CHECK_TOKENS=200 WORK=/root \
        timeout ${STUDY_S:-340} bash scripts/gpu_study.sh $LLAMA > /dev/null 2>&1
      grep -v "^ROWS_JSON" $OUT/gpu_study.log | grep -E "PASS|FAIL|DIFF|SKIP" | head -12
      grep -v "^ROWS_JSON" $OUT/gpu_study.log | grep -A40 "== the table"; state ;;
    skip) say "skip: TALLOW_ATTN_SKIP_EMPTY's bits and A/B on qwen at a 32k-slot cache"; state
      timeout 100 python3 scripts/gpu_switch_bits.py /root/twins/qwen25-1.5b.gguf TALLOW_ATTN_SKIP_EMPTY \
        2>&1 | grep -v Warning | tail -2 | tee -a $OUT/bits.txt
      timeout 150 python3 scripts/gpu_ab.py --work /root/twins --twins qwen25-1.5b --tests "-p 0 -n 64 -d 0,1024,32256 -r 3" \
        base TALLOW_ATTN_SKIP_EMPTY=0 base 2>&1 | tee -a $OUT/ab.txt; state
      for t in falcon-h1-0.5b falcon-h1-1.5b-deep falcon-h1-1.5b falcon-h1-3b; do
        timeout 60 python3 scripts/gpu_stack_bits.py /root/twins/$t.gguf 2>&1 | grep -v Warning | tail -2 | tee -a $OUT/bits.txt; done ;;
    pack) say "pack"; [ -x $LLAMA ] && { strip $LLAMA; xz -T16 -6 -c $LLAMA | split -b 15M -d -a 1 - $OUT/llama-bench.xz.; ls -la $OUT; } ;;
    tar) say "tar"; (cd $OUT && tar czf /tmp/logs.tgz --exclude 'llama-bench.xz.*' . && rm -f $(ls | grep -v '^llama-bench.xz') \
      && mv /tmp/logs.tgz .) ;;
    *) say "unknown step $step" ;;
  esac
done
say "done"
