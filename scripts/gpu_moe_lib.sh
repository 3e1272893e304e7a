#!/bin/bash
# What the MoE H200 session scripts begin with (sourced: . scripts/gpu_moe_lib.sh): the carried wheels installed into
# /tmp/site, logs under $OUT, the twins in RAM at $TW, and the helpers below. Carry .whl and .llbin.
#   say MSG               a timestamped line in $OUT/steps.log
#   state                 the GPU's clocks, temperature, power and memory into $OUT/state.txt
#   llama_json MODEL ARGS llama-bench -ngl 99 -fa 1: its steady repetitions (scripts/llama_samples.py), errors shown
#   setup_llama           llama-bench b11434 unpacked from .llbin's pieces, its version, the GPU, the machine state
#   bg_twin NAME          scripts/make_moe_twin.py NAME into $TW in the background; wait_twins waits for every writer
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
bg_twin() {
  ( t=$SECONDS; [ -s $TW/$1.gguf ] || { python3 scripts/make_moe_twin.py $1 $TW/$1.gguf.tmp && mv $TW/$1.gguf.tmp $TW/$1.gguf; }
    echo "twin $1 rc $? in $((SECONDS - t)) s" ) > $OUT/twin_$1.log 2>&1 &
  WRITERS+=($!)
}
wait_twins() { for p in "${WRITERS[@]}"; do wait $p; done; WRITERS=(); cat $OUT/twin_*.log | tail -4 | tee -a $OUT/steps.log; }
setup_llama() {
  if [ ! -x $LLAMA ]; then mkdir -p /root/llama/bin && cat .llbin/llama-bench.xz.* | xz -dc > $LLAMA && chmod +x $LLAMA; fi
  $LLAMA --version 2>&1 | tail -2 | tee -a $OUT/steps.log
  nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee -a $OUT/steps.log; state
}
