#!/bin/bash
# Issue 16 on the H200 (session 17): the routed experts' grouped prefill kernel, the MoE twins beside llama.cpp.
#   bash scripts/gpu_moe_s17.sh STEP...
# Steps:
#   setup            wheels (.whl), llama-bench b11434 from .llbin's pieces (built in an earlier lease of the
#                    project from .llsrc: scripts/gpu_same_run.sh pack-split), machine state, copy bandwidth
#   bg-twin NAME     scripts/make_moe_twin.py NAME into /dev/shm/twins (RAM: the disk writes slowly) in the
#                    background; `wait-twins` waits for every such writer
#   grouped          scripts/gpu_moe_grouped.py --sweep: moe_grouped checked against fp32 products of the same bf16
#                    values, timed against the dequantize-all path on the twins' projection shapes (33 and 512 tokens)
#   check            scripts/gpu_moe_check.py --quick (tiny MoE models: routing and logits against the CPU)
#   ab NAME          tallow -p 33,512 -n 128 -r 3 with the defaults and TALLOW_MOE_GROUPED_PREFILL=0 (scripts/gpu_ab.py)
#   llama NAME       llama-bench -p 33,512 -n 128 -r 5 on the same file
#   profile NAME     scripts/gpu_profile.py --prefill 512 (where a prefill chunk goes, $ENV_T applied)
# Everything is tee'd into $OUT (steps.log and one file per step).
. "$(dirname "$0")/gpu_moe_lib.sh" || exit 1
while [ $# -gt 0 ]; do
  step=$1; shift
  case $step in
    setup) say "setup"
      setup_llama ;;
    bg-twin) name=$1; shift; say "twin $name (background)"; bg_twin $name ;;
    wait-twins) wait_twins ;;
    grouped) say "grouped"; timeout ${GROUPED_S:-150} python3 scripts/gpu_moe_grouped.py ${GROUPED_ARGS---sweep} 2>&1 | grep -v Warning | tee $OUT/grouped.txt | tail -30 ;;
    check) say "check"; timeout 100 python3 scripts/gpu_moe_check.py --device cuda --quick 2>&1 | tail -14 | tee $OUT/moe_check.txt ;;
    ab) name=$1; shift; say "ab $name"; state
      timeout 300 python3 scripts/gpu_ab.py --work $TW --twins $name --tests "-p 33,512 -n 128 -r 3" base TALLOW_MOE_GROUPED_PREFILL=0 2>&1 | tee -a $OUT/ab.txt; state ;;
    llama) name=$1; shift; say "llama $name"; llama_json $TW/$name.gguf -p 33,512 -n 128 -r 5 | tee -a $OUT/llama.txt; state ;;
    profile) name=$1; shift; say "profile $name (${ENV_T:-defaults})"
      env ${ENV_T:-} timeout 120 python3 scripts/gpu_profile.py $TW/$name.gguf --prefill 512 --decode 1 > $OUT/profile_$name.txt 2>&1
      grep -v Warning $OUT/profile_$name.txt | tail -30 ;;
    *) say "unknown step $step" ;;
  esac
done
say "done"
