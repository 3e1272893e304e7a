#!/bin/sh
# Prefill side by side (session 14): per model, in one exclusive hold of /tmp/cpu.lock, llama-bench b11434 pp512
# (its default repacking) and right after it `tallow bench -p 512 -n 0` with each of MODES (default: the C prefill
# product on, then off: TALLOW_CPU_GEMM=1 / =0); R repetitions each, mean and samples, the load average before each.
#   R=3 sh scripts/prefill_bench.sh [MODEL ...]      (default: the three real models; P=512 the prompt length)
# Each mode's weights are loaded (and the weight cache filled) once before the hold, so the hold is all timing.
cd "$(dirname "$0")/.." || exit 1
R=${R:-3}
P=${P:-512}
MODES=${MODES:-"TALLOW_CPU_GEMM=1 TALLOW_CPU_GEMM=0"}
models=${*:-"smollm2-135m gemma3-270m qwen2.5-coder-1.5b-instruct"}
stats() { python3 -c "import json,sys; d=json.load(sys.stdin); s=d[0]['samples_ts'] if 'samples_ts' in d[0] else d[0]['samples']; print(f'mean {sum(s)/len(s):.1f} tok/s  samples', [round(x,1) for x in s])"; }
for m in $models; do
  case $m in */*) f=$m ;; *) f=$HOME/.cache/tallow/models/$m.gguf ;; esac
  if [ -z "$PREFILL_LOCKED" ]; then
    for c in $MODES; do env $c PYTHONPATH=$PWD nice -n 19 python -m tallow.cli bench -m "$f" -p 8 -n 0 -r 1 --json >/dev/null 2>&1; done
    PREFILL_LOCKED=1 flock -x /tmp/cpu.lock sh "$(pwd)/scripts/prefill_bench.sh" "$m"
    continue
  fi
  echo "### $m pp$P  $(date -u +%H:%M:%S)"
  echo "llama.cpp load $(cut -d' ' -f1 /proc/loadavg): $(LD_LIBRARY_PATH=/tmp/llama /tmp/llama/llama-bench -m "$f" -t 2 -p "$P" -n 0 -r "$R" -o json 2>/dev/null | stats)"
  for c in $MODES; do
    echo "tallow $c load $(cut -d' ' -f1 /proc/loadavg): $(env $c OMP_NUM_THREADS=2 PYTHONPATH=$PWD python -m tallow.cli bench -m "$f" -p "$P" -n 0 -r "$R" --json 2>/dev/null | stats)"
  done
done
