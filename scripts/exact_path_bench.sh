#!/bin/sh
# Issue 14: llama.cpp's numerics (the CPU default for these models since session 25) beside llama-bench b11434 and the
# torch paths (TALLOW_NUMERICS=default), tg64 and pp512, R=3 each,
# in one exclusive hold of /tmp/cpu.lock per call (run it as: flock -x /tmp/cpu.lock sh scripts/exact_path_bench.sh).
# Rows: llama.cpp (its default repacking), tallow default (llama.cpp's numerics), TALLOW_NUMERICS=default (the torch
# paths), and the default's composed blocks (TALLOW_CPU_C_LAYER=0).
# llama.cpp: mkdir -p /tmp/llama && tar xJf ../shared/llama.cpp/llama-b11434-cpu.tar.xz -C /tmp/llama, or LLAMA_BENCH=path
# to a llama-bench built on this machine (the shared build needs AVX-512: docs/performance.md, session 20).
cd "$(dirname "$0")/.." || exit 1
LB=${LLAMA_BENCH:-/tmp/llama/llama-bench}
best() { python3 -c "import json,sys; d=json.load(sys.stdin); s=d[0]['samples_ts'] if 'samples_ts' in d[0] else d[0]['samples']; print(f'mean {sum(s)/len(s):.1f} best {max(s):.1f}  samples', [round(x,1) for x in s])"; }
for m in ${MODELS:-smollm2-135m gemma3-270m qwen2.5-coder-1.5b-instruct}; do  # MODELS: names or GGUF paths
  f=$m; [ -f "$f" ] || f=$HOME/.cache/tallow/models/$m.gguf  # a name from the cache, or a file
  echo "### $m $(date -u +%H:%M:%S) load $(cut -d' ' -f1 /proc/loadavg)"
  for t in "-p 0 -n 64" "-p 512 -n 0"; do
    echo "llama.cpp $t: $(LD_LIBRARY_PATH=$(dirname "$LB") "$LB" -m $f -t 2 $t -r 3 -o json 2>/dev/null | best)"
    for env in "X=1" "TALLOW_NUMERICS=default" "TALLOW_CPU_C_LAYER=0"; do
      case "$t$env" in *512*C_LAYER*) continue ;; esac
      echo "tallow $env $t: $(env $env OMP_NUM_THREADS=2 python -m tallow.cli bench -m $f $t -r 3 --json 2>/dev/null | best)"
    done
  done
done
