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
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
TW=/dev/shm/twins; mkdir -p $TW
LLAMA=/root/llama/bin/llama-bench
[ -f /tmp/site/.installed ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && touch /tmp/site/.installed; } || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$SECONDS
say() { echo "[$(date -u +%H:%M:%S) +$((SECONDS - T0)) s] $*" | tee -a $OUT/steps.log; }
state() { nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw,memory.used --format=csv,noheader | tee -a $OUT/state.txt; }
llama_json() {  # model, tests...
  local m=$1; shift
  $LLAMA -m $m -ngl 99 -fa 1 "$@" -o jsonl 2> $OUT/llama_err.txt | tee -a $OUT/llama_samples.jsonl | python3 scripts/llama_samples.py
  local rc=$?; [ -s $OUT/llama_err.txt ] && grep -i "error\|unsupported\|fail\|nvfp4\|fallback" $OUT/llama_err.txt | head -5; return $rc
}
WRITERS=()
while [ $# -gt 0 ]; do
  step=$1; shift
  case $step in
    setup) say "setup"
      if [ ! -x $LLAMA ]; then mkdir -p /root/llama/bin && cat .llbin/llama-bench.xz.* | xz -dc > $LLAMA && chmod +x $LLAMA; fi
      $LLAMA --version 2>&1 | tail -2 | tee -a $OUT/steps.log
      nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a $OUT/steps.log; state ;;
    bg-twin) name=$1; shift; say "twin $name (background)"
      ( t=$SECONDS; [ -s $TW/$name.gguf ] || { python3 scripts/make_moe_twin.py $name $TW/$name.gguf.tmp && mv $TW/$name.gguf.tmp $TW/$name.gguf; }
        echo "twin $name rc $? in $((SECONDS - t)) s" ) > $OUT/twin_$name.log 2>&1 &
      WRITERS+=($!) ;;
    wait-twins) for p in "${WRITERS[@]}"; do wait $p; done; WRITERS=(); cat $OUT/twin_*.log | tail -4 | tee -a $OUT/steps.log ;;
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
