#!/bin/bash
# Session 22's H100/H200 call for TALLOW_NORM_ADD_Q8 (issue 12, cut (1)): twins, the kernel check, the A/B, the profiles.
#   bash scripts/gpu_s22.sh [kernel] [ab] [profile]
# Carry: .whl (gguf 0.19.0, llguidance 1.9.1), .twins2 (make_twin.py + qwen3-4b.hdr/.json from ../shared/twins).
. scripts/gpu_lib.sh  # the wheels into /tmp/site, $OUT, say, state
state; git log --oneline -1 2>/dev/null | tee -a $OUT/steps.log
say "twins in the background"
(extra_twin gemma4-e2b || echo "gemma4-e2b FAILED"; extra_twin qwen3-4b || echo "qwen3-4b FAILED") >> $OUT/twins.log 2>&1 &
for step in "$@"; do
  case $step in
    kernel) say "kernel: scripts/gpu_norm_add_q8.py"
      timeout 150 python3 scripts/gpu_norm_add_q8.py 2>&1 | grep -v Warning | tee $OUT/kernel.txt ;;
    ab) wait; ls -la /root/twins | tee -a $OUT/steps.log
      say "ab: tg128, TALLOW_NORM_ADD_Q8=1 / 0 / 1 (explicit: independent of the default)"; state
      python3 scripts/gpu_ab.py --work /root/twins --twins ${AB_TWINS:-gemma4-e2b,qwen3-4b} --tests "${AB_TESTS:--p 0 -n 128 -r 3}" \
        TALLOW_NORM_ADD_Q8=1 TALLOW_NORM_ADD_Q8=0 TALLOW_NORM_ADD_Q8=1 2>&1 | tee -a $OUT/ab.txt; state ;;
    profile) wait
      for v in 1 0; do say "profile E2B TALLOW_PDL=0 TALLOW_NORM_ADD_Q8=$v"
        TALLOW_PDL=0 TALLOW_NORM_ADD_Q8=$v timeout 150 python3 scripts/gpu_profile.py /root/twins/gemma4-e2b.gguf --prefill 33 \
          --decode 8 --sequence > $OUT/prof_$v.txt 2>&1
        grep -A14 "^last replay" $OUT/prof_$v.txt | tee -a $OUT/steps.log; done ;;
  esac
done
say "done"
