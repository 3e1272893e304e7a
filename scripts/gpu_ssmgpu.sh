#!/bin/bash
# mamba / mamba2 / falcon-h1 on the H200 (issue 17, branch s7-ssmgpu): correctness first, then speed.
#
#   bash scripts/gpu_ssmgpu.sh [final] [check] [kernels] [bench]        (default: check kernels bench)
#   LLAMA_BENCH=/root/llama/bin/llama-bench bash scripts/gpu_ssmgpu.sh final     the lead's last 60-second call
#
# final (<= 60 s, deadline-aware: each step runs only if the time left fits it): a short check of
#   this HEAD (tiny mamba/mamba2/falcon-h1 F32 greedy through the graphs = llama.cpp's 16 tokens, no
#   drafts, decode-graph logits vs the CPU; falcon-h1 Q8_0 greedy), then speed beside llama.cpp on
#   the same files: 24-layer Q8_0 mid models (mamba, falcon-h1, mamba2), tallow pp512/tg64 and
#   llama-bench -p 512 -n 64 -r 2 -ngl 99 -fa 1.
#
# Carried into the repo root: .whl/ (the gguf wheel; installed into /tmp/site). No network.
# check (scripts/gpu_ssmgpu.py check, 25 s on the H200 at 21:12): for the tiny mamba, mamba2 and
#   falcon-h1 of tests/tiny_models.py, F32 and Q8_0: the eager GPU forward against the CPU's fp32
#   reference and against llama.cpp's logits (tests/fixtures/tiny_<arch>.json); greedy tokens
#   through the prefill and decode CUDA graphs (the fixture's 16 for F32, the CPU's for Q8_0);
#   teacher-forced decode-graph logits against the CPU; the same greedy tokens with
#   TALLOW_SSM_TRITON=0 and TALLOW_CUDA_GRAPHS=0; prefix reuse from a state checkpoint answering
#   bit for bit as a cold engine. A FAIL line per failed check; exit 1 if any (later steps still run).
# kernels (~15 s): the conv and scan alone on Mamba-1.4B's and Falcon-H1-0.5B's layer shapes (first checked
#   against the torch ops there: outputs and states within 1e-4 relative, else FAIL), a
#   decode step and a 512-token chunk, µs per call: Triton (scan at 1..32 rows per program) vs torch.
# bench (~90 s, one process): writes three 24-layer random Q8_0 models (gpu_ssmgpu.py MID, ~10 s
#   each), then pp512 (median of 3 after a warm-up), tg64, and tg64 after 4096 tokens with the
#   Triton mixer; pp512 and tg16 once with TALLOW_SSM_TRITON=0 (prefill graphs off there).
#   SSMGPU_TWINS=1 adds the study's twins where scripts/make_ssm_twin.py exists (slow to write).
# Everything is tee'd to $OUT/gpu_ssmgpu.log. Overrides: OUT, WORK, SSMGPU_PP, SSMGPU_TG, SSMGPU_DEPTH, SSMGPU_TWINS.
set -uo pipefail
export PYTHONUNBUFFERED=1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/out}
WORK=${WORK:-/tmp/ssmgpu}
mkdir -p "$OUT" "$WORK"
exec > >(tee -a "$OUT/gpu_ssmgpu.log") 2>&1
cd "$ROOT"
say() { echo "[$(date -u +%H:%M:%S)] $*"; }
state() { command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw,utilization.gpu,memory.used --format=csv,noheader || true; }

if ls .whl/*.whl >/dev/null 2>&1 && [ ! -f /tmp/site/.installed ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && touch /tmp/site/.installed
fi
export PYTHONPATH=/tmp/site:$ROOT
python3 -c "import gguf, tallow, triton, torch; print('torch', torch.__version__, 'triton', triton.__version__)" \
  || { echo "tallow, gguf or triton does not import: carry .whl (see the header)"; exit 2; }
git -C "$ROOT" log --oneline -1 2>/dev/null || true

steps=("$@"); [ ${#steps[@]} -eq 0 ] && steps=(check kernels bench)
rc=0
for s in "${steps[@]}"; do
  say "== $s"; state; t0=$SECONDS
  python3 scripts/gpu_ssmgpu.py "$s" --work "$WORK" || rc=1
  state; say "== $s done in $((SECONDS - t0)) s (rc so far $rc)"
done
exit $rc
