#!/bin/bash
# Routed experts (qwen3moe, Gemma 4 26B-A4B) on the H200: correctness against the CPU, then the twins.
#
#   bash scripts/gpu_moegpu.sh [check] [qwen3-30b-a3b] [gemma4-26b-nvfp4] [gemma4-26b-q4km] [/path/to/llama-bench]
#   (default: check; an argument that is an executable file is the llama-bench for the llama.cpp
#    figures beside tallow's). One twin step is ~15-18 GB written and 3 loads: give each its own
#    call (`check qwen3-30b-a3b` may fit one 9-minute call; time it from the log).
#
#   `quick` (the lead's 60-second slot, what to run first): gpu_moe_check --quick (NVFP4 qwen3moe, Q4_0 gemma4-moe,
#   every check below), then a Qwen3-30B-A3B twin cut to 4 layers (full-size layers, experts and
#   vocabulary): the bandwidth floor, tallow bench pp512/tg128, llama-bench beside when given.
# What it checks:
#   check: scripts/gpu_moe_check.py on the tiny MoE models (tests/tiny_models.py; qwen3moe and
#          gemma4-moe, F32/Q8_0/Q4_0/NVFP4/MXFP4 experts): on cuda vs the CPU reference linears,
#          every layer's chosen experts identical token by token, decode logits within 1e-4 of the
#          logit scale, grouped prefill within 3e-2 (bf16), TALLOW_MOE_TRITON=0 identical routing,
#          greedy 16 tokens through tallow.load (CUDA-graph decode) = the CPU's.
#   twins (scripts/make_moe_twin.py, under $WORK/twins; a twin step deletes the other twins first):
#          the bandwidth floor (bytes a token reads / measured device copy bandwidth), tallow plan
#          --device cuda --ctx 65536 against what the load allocates (weights + KV after load, peak
#          after pp512 + tg16), tallow bench tg128 / pp512 / pp33 (TTFT) with f16 KV, then FP8 KV
#          at depths 0 and 32768, llama-bench on the same file when given.
# Everything goes to $OUT/gpu_moegpu.log. Needs: .whl/ (the gguf wheel) carried; no network.
set -uo pipefail
export PYTHONUNBUFFERED=1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-/root}
OUT=${OUT:-/tmp/out}
LLAMA_BENCH=${LLAMA_BENCH:-}
mkdir -p "$OUT" "$WORK/twins"
LOG=$OUT/gpu_moegpu.log
exec > >(tee -a "$LOG") 2>&1
cd "$ROOT"
say() { echo "[$(date -u +%H:%M:%S)] $*"; }
state() { nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw,memory.used --format=csv,noheader 2>/dev/null || true; }

if ls .whl/*.whl >/dev/null 2>&1 && [ ! -f /tmp/site/.installed ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && touch /tmp/site/.installed
fi
export PYTHONPATH=/tmp/site:$ROOT${PYTHONPATH:+:$PYTHONPATH}
python3 -c "import gguf, tallow" || { echo "tallow or gguf does not import: carry .whl"; exit 2; }

steps=()
for a in "$@"; do
  if [ -x "$a" ] && [ -f "$a" ]; then LLAMA_BENCH=$a; else steps+=("$a"); fi
done
[ ${#steps[@]} -gt 0 ] || steps=(check)
say "gpu_moegpu: ${steps[*]} (WORK=$WORK LLAMA_BENCH=${LLAMA_BENCH:-none})"
status=0

bandwidth() {  # device copy bandwidth in GB/s, and with $1 bytes a token, the floor
  python3 scripts/gpu_copy_bandwidth.py "${1:-0}"
}

twin_bench() {  # twin_bench NAME: make the twin (deleting the other twins first: disk), plan, load, bench
  local name=$1 model=$WORK/twins/$1.gguf t0=$SECONDS active
  for other in "$WORK"/twins/*.gguf; do [ "$other" = "$model" ] || rm -f "$other"; done
  if [ ! -s "$model" ]; then
    say "make twin $name"
    python3 scripts/make_moe_twin.py "$name" "$model.tmp" && mv "$model.tmp" "$model" || { say "twin $name failed"; return 1; }
    say "twin written in $((SECONDS - t0)) s"
  fi
  python3 scripts/make_moe_twin.py "$name" --table | tail -2
  active=$(python3 scripts/make_moe_twin.py "$name" --table | sed -n 's/^a token reads \([0-9,]*\) bytes.*/\1/p' | tr -d ,)
  bandwidth "$active" || true
  python3 -m tallow.cli inspect "$model" | grep -A1 "^experts" || true
  say "tallow plan --device cuda --ctx 65536, then the same load measured"
  python3 -m tallow.cli plan -m "$model" --device cuda --ctx 65536 || true
  python3 scripts/make_moe_twin.py --measure-load "$model" --ctx 65536 || status=1
  state
  say "tallow bench -p 33,512 -n 128 -r 3 (f16 KV)"
  python3 -m tallow.cli bench -m "$model" --device cuda -p 33,512 -n 128 -r 3 --json > "$OUT/tallow_$name.json" || status=1
  python3 - "$OUT/tallow_$name.json" <<'PY' || status=1
import json, sys
for r in json.load(open(sys.argv[1])):
    extra = f" (TTFT {33 / r['tok_s_mean'] * 1e3:.1f} ms)" if r["test"].startswith("pp33") else ""
    print(f"tallow | {r['model']} | {r['test']} | {r['tok_s_mean']:.2f} ± {r['tok_s_std']:.2f} t/s{extra} | {r['device']}")
PY
  say "tallow bench at depths 0 and 32768, FP8 KV"
  python3 -m tallow.cli bench -m "$model" --device cuda -p 512 -n 128 -d 0,32768 -r 2 --kv-dtype fp8 || status=1
  state
  if [ -n "$LLAMA_BENCH" ]; then
    say "llama-bench -ngl 99 -fa 1 -p 33,512 -n 128 -r 3; then q8_0 KV (llama.cpp has no FP8 KV) at depth 32768"
    "$LLAMA_BENCH" -m "$model" -ngl 99 -fa 1 -p 33,512 -n 128 -r 3 || status=1
    "$LLAMA_BENCH" -m "$model" -ngl 99 -fa 1 -p 512 -n 128 -d 32768 -r 2 -ctk q8_0 -ctv q8_0 || true
  fi
  say "twin $name done in $((SECONDS - t0)) s (the file stays for a re-run; the next twin step deletes it)"
}

quick() {  # the 60-second slot: the GPU check on two files, then a cut Qwen3-30B-A3B twin beside llama-bench
  local t0=$SECONDS model=$WORK/twins/qwen3-30b-a3b-4l.gguf cut="--layers 4" active writer
  # shellcheck disable=SC2086
  [ -s "$model" ] || { python3 scripts/make_moe_twin.py qwen3-30b-a3b "$model.tmp" $cut > "$OUT/twin_quick.log" 2>&1 \
    && mv "$model.tmp" "$model"; } &
  writer=$!
  say "== quick: gpu_moe_check --quick (the cut twin is written meanwhile)"
  timeout 30 python3 scripts/gpu_moe_check.py --device cuda --quick || status=1
  wait $writer || status=1
  say "== quick: Qwen3-30B-A3B twin cut to 4 of its 48 layers (every layer, expert and vocabulary row full size)"
  cat "$OUT/twin_quick.log" 2>/dev/null | tail -1
  [ -s "$model" ] || { say "no twin"; return 1; }
  # shellcheck disable=SC2086
  active=$(python3 scripts/make_moe_twin.py qwen3-30b-a3b --table $cut | sed -n 's/^a token reads \([0-9,]*\) bytes.*/\1/p' | tr -d ,)
  bandwidth "$active" || true
  say "tallow bench -p 512 -n 128 -r 1 ($((SECONDS - t0)) s in)"
  timeout $((57 - (SECONDS - t0) > 5 ? 57 - (SECONDS - t0) : 5)) \
    python3 -m tallow.cli bench -m "$model" --device cuda -p 512 -n 128 -r 1 || status=1
  if [ -n "$LLAMA_BENCH" ] && [ $((SECONDS - t0)) -lt 50 ]; then
    say "llama-bench -ngl 99 -fa 1 -p 512 -n 128 -r 1 ($((SECONDS - t0)) s in)"
    timeout $((59 - (SECONDS - t0))) "$LLAMA_BENCH" -m "$model" -ngl 99 -fa 1 -p 512 -n 128 -r 1 || true
  fi
  say "== quick done in $((SECONDS - t0)) s"
}

for s in "${steps[@]}"; do
  case $s in
    quick) quick ;;
    check) say "== check"; python3 scripts/gpu_moe_check.py --device cuda || status=1 ;;
    qwen3-30b-a3b|gemma4-26b-nvfp4|gemma4-26b-q4km) twin_bench "$s" || status=1 ;;
    *) echo "unknown step $s"; exit 2 ;;
  esac
done
say "gpu_moegpu: done, status $status"
exit $status
