#!/bin/bash
# Issue 16 on the H200 (session 12): the routed experts' integer-dot GEMV, the full MoE twins beside llama.cpp.
#   bash scripts/gpu_moe_s12.sh STEP...
# Steps:
#   setup            wheels (.whl), llama-bench b11434 from .llbin's pieces (built in an earlier lease of the
#                    project from .llsrc: scripts/gpu_same_run.sh pack-split), machine state, copy bandwidth
#   bg-twin NAME     scripts/make_moe_twin.py NAME into /dev/shm/twins (RAM: the disk writes slowly) in the
#                    background; `wait-twins` waits for every such writer
#   kernels          scripts/gpu_moe_mmvq.py --sweep: the check against the reference on the device, then the
#                    expert GEMVs' times, integer-dot vs fp32, on the twins' projection shapes
#   check            scripts/gpu_moe_check.py --quick (tiny MoE models: routing and logits against the CPU)
#   ab NAME          tallow tg128 with TALLOW_MOE_MMVQ=0 and =1 (scripts/gpu_ab.py), -r 3 each
#   table NAME       tallow bench -p 33,512 -n 128 -r 3 ($ENV_T applied), then llama-bench -p 33,512 -n 128 -r 5
#   depth NAME       tg128 at depth 32768: tallow with FP8 KV and with f16 KV, llama-bench with f16 and (DEPTH_Q8=1,
#                    the default) q8_0 KV
#   kernels-quick    scripts/gpu_moe_mmvq.py without the sweep: every shape checked and timed as shipped
#   kernels-nv       the NVFP4 shapes swept, the K-quant ones as shipped
#   ab-fold NAME     tallow tg128 with TALLOW_MOE_SCALE_FOLD on, off, on again (scripts/gpu_ab.py), -r 3 each
#   tg NAME          tg128 alone: tallow (TALLOW_MOE_MMVQ=1), then llama-bench
#   debug NAME       one short bench with CUDA_LAUNCH_BLOCKING=1 (where an illegal access happens)
#   plan NAME        tallow plan --device cuda --ctx 65536, what a load allocates (make_moe_twin --measure-load),
#                    and the plan on a budget the weights do not fit (--mem-budget 8GiB: must refuse, rc != 0)
#   profile NAME     scripts/gpu_profile.py --prefill 33 --decode 8 --sequence ($ENV_T applied)
#   rm NAME          delete a twin (RAM)
# Everything is tee'd into $OUT (steps.log and one file per step).
. "$(dirname "$0")/gpu_moe_lib.sh" || exit 1
set -- "$@"
while [ $# -gt 0 ]; do
  step=$1; shift
  case $step in
    setup) say "setup"
      setup_llama
      python3 scripts/gpu_copy_bandwidth.py 2>&1 | tee -a $OUT/steps.log
      ;;
    bg-twin) name=$1; shift; say "twin $name (background)"; bg_twin $name ;;
    wait-twins) wait_twins; ls -la $TW ;;
    kernels) say "kernels"; timeout ${KERNELS_S:-200} python3 scripts/gpu_moe_mmvq.py --sweep 2>&1 | grep -v Warning | tee $OUT/kernels.txt | tail -16 ;;
    kernels-nv) say "kernels-nv: NVFP4 swept, the K-quant defaults"
      timeout ${KERNELS_S:-200} python3 scripts/gpu_moe_mmvq.py --sweep --only NVFP4 2>&1 | grep -v Warning | tee $OUT/kernels_nv.txt | tail -8
      timeout ${KERNELS_S:-200} python3 scripts/gpu_moe_mmvq.py --only qwen3,Q4_K 2>&1 | grep -v Warning | tee $OUT/kernels_kq.txt | tail -8 ;;
    ab-fold) name=$1; shift; say "ab-fold $name"; state
      python3 scripts/gpu_ab.py --work $TW --twins $name --tests "-p 0 -n 128 -r 3" base TALLOW_MOE_SCALE_FOLD=0 base 2>&1 | tee -a $OUT/ab_fold.txt; state ;;
    tg) name=$1; shift; say "tg $name: tallow TALLOW_MOE_MMVQ=1, then llama-bench, tg128"
      TALLOW_MOE_MMVQ=1 python3 -m tallow.cli bench -m $TW/$name.gguf --device cuda -p 0 -n 128 -r 3 2>&1 | grep "tg128:" | tee -a $OUT/tg.txt
      llama_json $TW/$name.gguf -p 0 -n 128 -r 5 | tee -a $OUT/tg.txt ;;
    debug) name=$1; shift; say "debug $name: CUDA_LAUNCH_BLOCKING=1, one short bench"
      CUDA_LAUNCH_BLOCKING=1 timeout 200 python3 -m tallow.cli bench -m $TW/$name.gguf --device cuda -p 33 -n 16 -r 1 > $OUT/debug_$name.txt 2>&1
      echo "rc $?" >> $OUT/debug_$name.txt; grep -v Warning $OUT/debug_$name.txt | grep -B2 -A3 "File\|Error\|rc " | tail -40 ;;
    check) say "check"; timeout 90 python3 scripts/gpu_moe_check.py --device cuda --quick 2>&1 | tail -10 | tee $OUT/moe_check.txt ;;
    ab) name=$1; shift; say "ab $name"; state
      python3 scripts/gpu_ab.py --work $TW --twins $name --tests "-p 0 -n 128 -r 3" TALLOW_MOE_MMVQ=0 TALLOW_MOE_MMVQ=1 2>&1 | tee -a $OUT/ab.txt; state ;;
    table) name=$1; shift; say "table $name (${ENV_T:-defaults})"; state
      env ${ENV_T:-} python3 -m tallow.cli bench -m $TW/$name.gguf --device cuda -p 33,512 -n 128 -r 3 2>&1 | grep -v Warning | tee -a $OUT/table.txt
      state; llama_json $TW/$name.gguf -p 33,512 -n 128 -r 5 | tee -a $OUT/table.txt; state ;;
    depth) name=$1; shift; say "depth $name"
      for kv in fp8 f16; do env ${ENV_T:-} python3 -m tallow.cli bench -m $TW/$name.gguf --device cuda -p 0 -n 128 -d 32768 -r 2 --kv-dtype $kv 2>&1 \
        | grep -v Warning | tee -a $OUT/depth.txt; done
      llama_json $TW/$name.gguf -p 0 -n 128 -d 32768 -r 3 | tee -a $OUT/depth.txt
      [ "${DEPTH_Q8:-1}" = 1 ] && llama_json $TW/$name.gguf -p 0 -n 128 -d 32768 -r 3 -ctk q8_0 -ctv q8_0 | tee -a $OUT/depth.txt ;;
    kernels-quick) say "kernels-quick: every shape's check and time with the shipped configs"
      timeout ${KERNELS_S:-200} python3 scripts/gpu_moe_mmvq.py 2>&1 | grep -v Warning | tee $OUT/kernels_quick.txt | tail -12 ;;
    plan) name=$1; shift; say "plan $name"
      python3 -m tallow.cli plan -m $TW/$name.gguf --device cuda --ctx 65536 2>&1 | tee -a $OUT/plan.txt
      python3 scripts/make_moe_twin.py --measure-load $TW/$name.gguf --ctx 65536 2>&1 | grep -v Warning | tee -a $OUT/plan.txt
      python3 -m tallow.cli plan -m $TW/$name.gguf --device cuda --ctx 65536 --mem-budget 8GiB > $OUT/refuse.txt 2>&1
      echo "plan --mem-budget 8GiB: rc $?" >> $OUT/refuse.txt; tail -4 $OUT/refuse.txt | tee -a $OUT/plan.txt ;;
    profile) name=$1; shift; say "profile $name (${ENV_T:-defaults})"
      env ${ENV_T:-} timeout 120 python3 scripts/gpu_profile.py $TW/$name.gguf --prefill 33 --decode 8 --sequence > $OUT/profile_$name.txt 2>&1
      grep -i "replay\|per token" $OUT/profile_$name.txt | tail -3 ;;
    rm) name=$1; shift; rm -f $TW/$name.gguf; say "removed $name" ;;
    *) say "unknown step $step" ;;
  esac
done
say "done"
