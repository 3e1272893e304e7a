#!/bin/bash
# Issue 12's GPU session (one call): wheels, machine state, the split-K sweep, twins, A/B bench.
#   bash scripts/gpu_session_12.sh [sweep|ab|final]...
set -o pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
state() { nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw,power.limit,utilization.gpu --format=csv,noheader | tee -a $OUT/state.txt; }
twins() {
  mkdir -p /root/twins
  for t in "$@"; do [ -f /root/twins/$t.gguf ] || python3 .twins2/make_twin.py make .twins2/$t /root/twins/$t.gguf; done
}
state
for step in "$@"; do
  case $step in
    sweep) python3 scripts/gpu_bench_kernels.py --only splitk --out $OUT/splitk.json 2>&1 | tee $OUT/sweep.log ;;
    ab) twins smollm2-135m qwen3-4b; state
        python3 scripts/gpu_ab.py --work /root/twins --twins smollm2-135m,qwen3-4b --tests "-p 33,512 -n 128 -r 3" \
          TALLOW_GEMV_SPLITK=0 base 2>&1 | tee $OUT/ab.log; state ;;
    final) python3 scripts/gpu_bench_kernels.py --only defaults --out $OUT/defaults.json 2>&1 | tee $OUT/defaults.log
        twins smollm2-135m qwen3-4b; state
        python3 scripts/gpu_clock_check.py /root/twins/qwen3-4b.gguf 2>&1 | tee $OUT/clock.log
        python3 scripts/gpu_ab.py --work /root/twins --twins smollm2-135m,qwen3-4b --tests "-p 33,512 -n 128 -r 3" \
          TALLOW_GEMV_SPLITK=0 base 2>&1 | tee $OUT/ab.log; state
        python3 scripts/gpu_ab.py --work /root/twins --twins qwen3-4b --tests "-p 0 -n 128 -d 0,32768 -r 2" \
          TALLOW_ATTN_LIVE_SPLITS=0 base 2>&1 | tee $OUT/depth.log; state ;;
    depth) twins qwen3-4b; state
        python3 scripts/gpu_ab.py --work /root/twins --twins qwen3-4b --tests "-p 0 -n 128 -d 0,32768 -r 2" \
          TALLOW_ATTN_LIVE_SPLITS=0 base TALLOW_KV_DTYPE=int8 2>&1 | tee $OUT/depth2.log; state ;;
    exact) twins smollm2-135m qwen3-4b
        python3 scripts/gpu_speculate.py /root/twins/smollm2-135m.gguf /root/twins/qwen3-4b.gguf --reps 20 2>&1 | tee $OUT/speculate.log
        python3 scripts/gpu_check.py --twins .twins2 --work /root/twins --parity --only smollm2-135m 2>&1 | tee $OUT/parity.log ;;
    state) twins smollm2-135m
        python3 -m tallow.cli bench -m /root/twins/smollm2-135m.gguf --device cuda -p 33 -n 64 -r 2 2>&1 | tee $OUT/bench_state.log
        python3 -m tallow.cli bench -m /root/twins/smollm2-135m.gguf --device cuda -p 0 -n 64 -r 1 --json 2>&1 | tee -a $OUT/bench_state.log ;;
  esac
done
