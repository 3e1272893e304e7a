#!/bin/bash
# Routed experts (qwen3moe, Gemma 4 26B-A4B) on the H200: correctness against the CPU, then the twins.
#
#   bash scripts/gpu_moegpu.sh [check] [qwen3-30b-a3b] [gemma4-26b-nvfp4] [gemma4-26b-q4km] [LLAMA_BENCH=/path]
#   (default: check qwen3-30b-a3b gemma4-26b-nvfp4; a first argument that is an executable llama-bench
#    path is used for the llama.cpp figures beside tallow's)
#
# What it checks:
#   check: scripts/gpu_moe_check.py on the tiny MoE models (tests/tiny_models.py; qwen3moe and
#          gemma4-moe, F32/Q8_0/Q4_0/NVFP4/MXFP4 experts): on cuda vs the CPU reference linears,
#          every layer's chosen experts identical token by token, decode logits within 1e-4 of the
#          logit scale, grouped prefill within 3e-2 (bf16), TALLOW_MOE_TRITON=0 identical routing,
#          greedy 16 tokens through tallow.load (CUDA-graph decode) = the CPU's; then the device
#          copy bandwidth (for the floor below).
#   twins (scripts/make_moe_twin.py, written under $WORK/twins and deleted after): tallow plan
#          --device cuda --ctx 65536 (and what the load allocated), tallow bench tg128 / pp512 /
#          pp33 (TTFT), FP8 KV decode at depth 32768, llama-bench on the same file when given;
#          the bandwidth floor (active bytes per token / measured device copy bandwidth).
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
[ ${#steps[@]} -gt 0 ] || steps=(check qwen3-30b-a3b gemma4-26b-nvfp4)
say "gpu_moegpu: ${steps[*]} (WORK=$WORK LLAMA_BENCH=${LLAMA_BENCH:-none})"
status=0

bandwidth() {  # device copy bandwidth, GB/s (read + write of a 4 GiB buffer)
  python3 - <<'PY'
import torch
x = torch.empty(1 << 31, dtype=torch.float16, device="cuda"); y = torch.empty_like(x)
for _ in range(3): y.copy_(x)
torch.cuda.synchronize(); s, e = torch.cuda.Event(True), torch.cuda.Event(True)
s.record()
for _ in range(10): y.copy_(x)
e.record(); torch.cuda.synchronize()
print(f"device copy bandwidth {2 * x.numel() * 2 * 10 / (s.elapsed_time(e) / 1e3) / 1e9:.0f} GB/s (read+write, 4 GiB)")
PY
}

twin_bench() {  # twin_bench NAME
  local name=$1 model=$WORK/twins/$1.gguf t0=$SECONDS
  if [ ! -s "$model" ]; then
    say "make twin $name"
    python3 scripts/make_moe_twin.py "$name" "$model.tmp" && mv "$model.tmp" "$model" || { say "twin $name failed"; return 1; }
  fi
  python3 -m tallow.cli inspect "$model" | grep -A1 "^experts" || true
  say "tallow plan --device cuda --ctx 65536"
  python3 -m tallow.cli plan -m "$model" --device cuda --ctx 65536 || true
  python3 scripts/make_moe_twin.py --measure-load "$model" --ctx 65536 || true
  state
  say "tallow bench -p 33,512 -n 128 -r 3 (f16 KV)"
  python3 -m tallow.cli bench -m "$model" --device cuda -p 33,512 -n 128 -r 3 || status=1
  say "tallow bench tg128 at depth 32768, FP8 KV"
  python3 -m tallow.cli bench -m "$model" --device cuda -p 512 -n 128 -d 32768 -r 2 --kv-dtype fp8 || status=1
  state
  if [ -n "$LLAMA_BENCH" ]; then
    say "llama-bench -ngl 99 -fa 1 -p 33,512 -n 128 -r 3"
    "$LLAMA_BENCH" -m "$model" -ngl 99 -fa 1 -p 33,512 -n 128 -r 3 || status=1
    "$LLAMA_BENCH" -m "$model" -ngl 99 -fa 1 -p 512 -n 128 -d 32768 -r 2 -ctk q8_0 -ctv q8_0 || true
  fi
  rm -f "$model"
  say "twin $name done in $((SECONDS - t0)) s"
}

for s in "${steps[@]}"; do
  case $s in
    check) say "== check"; python3 scripts/gpu_moe_check.py --device cuda || status=1; bandwidth || true ;;
    qwen3-30b-a3b|gemma4-26b-nvfp4|gemma4-26b-q4km) twin_bench "$s" || status=1 ;;
    *) echo "unknown step $s"; exit 2 ;;
  esac
done
say "gpu_moegpu: done, status $status"
exit $status
