#!/bin/bash
# tallow beside llama.cpp on the CPU, one test at a time and interleaved (the machine is shared: each
# pair runs back to back, `uptime` logged beside each figure).
#   bash scripts/cpu_bench_gemma4.sh MODEL.gguf LOG [REPS] [TESTS...]
# TESTS: pp33:0 pp512:0 tg128:0 pp33:4096 ... (default: pp33, pp512 and tg128 at depth 0).
# llama.cpp: ../shared/llama.cpp's CPU build unpacked in /tmp/llama (see its README).
# TALLOW_ENV="OMP_WAIT_POLICY=PASSIVE" and LLAMA_ARGS="--poll 0": both engines' threads sleep instead
# of spinning while they wait (on a loaded 2-core machine spinning threads starve the working one).
set -euo pipefail
model=$1; log=$2; reps=${3:-3}; shift $(( $# < 3 ? $# : 3 ))
tests=("$@"); [ ${#tests[@]} -gt 0 ] || tests=(pp33:0 pp512:0 tg128:0)
export LD_LIBRARY_PATH=/tmp/llama PYTHONPATH=${PYTHONPATH:-$PWD}
for t in "${tests[@]}"; do
  kind=${t%%:*}; n=${kind:2}; depth=${t##*:}
  if [ "${kind:0:2}" = pp ]; then tl=(-p "$n" -n 0); ll=(-p "$n" -n 0); else tl=(-p 0 -n "$n"); ll=(-p 0 -n "$n"); fi
  {
    echo "== $t  $(date -u +%H:%M:%S)  tallow ${TALLOW_ENV:-}  load: $(cut -d' ' -f1-3 /proc/loadavg)"
    env ${TALLOW_ENV:-} python -m tallow.cli bench -m "$model" --device cpu "${tl[@]}" -d "$depth" -r "$reps" 2>&1 | grep -v -E '^\| (model|---)'
    echo "== $t  $(date -u +%H:%M:%S)  llama.cpp ${LLAMA_ARGS:-}  load: $(cut -d' ' -f1-3 /proc/loadavg)"
    /tmp/llama/llama-bench -m "$model" -t 2 ${LLAMA_ARGS:-} "${ll[@]}" -d "$depth" -r "$reps" 2>&1 | grep -E 'pp|tg' | grep -v '^| model'
    echo "   done $(date -u +%H:%M:%S)  load: $(cut -d' ' -f1-3 /proc/loadavg)"
  } 2>&1 | tee -a "$log"
done
