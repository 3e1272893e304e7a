#!/bin/sh
# Decode side by side, one after the other in one run: llama-bench b11434 (tg64) with its default weight
# repacking and with `--repack 0` (the fixtures' configuration), then `tallow bench` default
# (TALLOW_CPU_GGML_DOT=0), with the C kernel (=1), and under TALLOW_NUMERICS=ggml (C kernel on there);
# R repetitions each, mean and best repetition (the best is the least disturbed on a shared machine),
# load average before each.
#   mkdir -p /tmp/llama && tar xJf ../shared/llama.cpp/llama-b11434-cpu.tar.xz -C /tmp/llama
#   R=5 sh scripts/cpudot_bench.sh [MODEL ...]     (default: the three real models; a path is taken as is,
#   e.g. /work/twins/gemma4-e2b.gguf; N=32 for tg32; MODES="0 1 ggml" picks the tallow rows (an entry with "="
#   is taken as the environment itself, e.g. MODES="TALLOW_CPU_C_LAYER=1 TALLOW_CPU_C_LAYER=0"); REPACK="1" runs
#   llama-bench with its default repacking only; L=1 takes the exclusive /tmp/cpu.lock per model; T=1 runs both
#   engines on one thread instead of 2: on a shared machine a 2-thread run waits at every product's barrier for
#   a thread the scheduler took away; D=1024: both engines' tg at that KV depth, llama-bench -d / tallow bench -d)
cd "$(dirname "$0")/.." || exit 1
R=${R:-5}
models=${*:-"smollm2-135m gemma3-270m qwen2.5-coder-1.5b-instruct"}
best() { python3 -c "import json,sys; d=json.load(sys.stdin); s=d[0]['samples_ts'] if 'samples_ts' in d[0] else d[0]['samples']; print(f'mean {sum(s)/len(s):.1f} best {max(s):.1f} tok/s  samples', [round(x,1) for x in s])"; }
for m in $models; do
  case $m in */*) f=$m ;; *) f=$HOME/.cache/tallow/models/$m.gguf ;; esac
  if [ "${L:-0}" = 1 ] && [ -z "$CPUDOT_LOCKED" ]; then CPUDOT_LOCKED=1 flock -x /tmp/cpu.lock sh "$(pwd)/scripts/cpudot_bench.sh" "$m"; continue; fi
  echo "### $m tg${N:-64}${D:+ depth $D}  $(date -u +%H:%M:%S)"
  for rp in ${REPACK:-1 0}; do
    echo "llama.cpp repack=$rp load $(cut -d' ' -f1 /proc/loadavg): $(LD_LIBRARY_PATH=/tmp/llama /tmp/llama/llama-bench -m "$f" -t "${T:-2}" -p 0 -n "${N:-64}" ${D:+-d $D} -r "$R" --repack $rp -o json 2>/dev/null | best)"
  done
  for c in ${MODES:-0 1 ggml}; do
    case $c in ggml) env="TALLOW_NUMERICS=ggml" ;; *=*) env=$c ;; *) env="TALLOW_CPU_GGML_DOT=$c" ;; esac
    echo "tallow $env load $(cut -d' ' -f1 /proc/loadavg): $(env $env OMP_NUM_THREADS="${T:-2}" PYTHONPATH=$PWD python -m tallow.cli bench -m "$f" -p 0 -n "${N:-64}" ${D:+-d $D} -r "$R" --json 2>/dev/null | best)"
  done
done
