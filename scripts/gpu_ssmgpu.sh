#!/bin/bash
# mamba / mamba2 / falcon-h1 on the H200 (issue 17, branch s7-ssmgpu): correctness first, then speed.
#
#   bash scripts/gpu_ssmgpu.sh [check] [kernels] [bench]        (default: all three)
#
# Carried into the repo root: .whl/ (the gguf wheel; installed into /tmp/site). No network.
# check (scripts/gpu_ssmgpu.py check, ~2 min): for the tiny mamba, mamba2 and falcon-h1 of
#   tests/tiny_models.py, F32 and Q8_0: the eager GPU forward against the CPU and against
#   llama.cpp's logits (tests/fixtures/tiny_<arch>.json); greedy tokens through the prefill and
#   decode CUDA graphs (the fixture's 16 for F32, the CPU's for Q8_0); teacher-forced decode-graph
#   logits against the CPU; the same greedy tokens with TALLOW_SSM_TRITON=0 and TALLOW_CUDA_GRAPHS=0;
#   prefix reuse from a state checkpoint answering as a cold run. A FAIL line per failed check;
#   the step fails (but bench still runs) if any did.
# kernels (~30 s): the conv and scan alone on Mamba-1.4B's and Falcon-H1-0.5B's layer shapes, decode
#   and a 512-token chunk, µs per call: Triton (scan at 1..32 rows per program) vs the torch ops.
# bench (scripts/gpu_ssmgpu.py bench, ~5 min): tallow bench pp512 and tg64 at depths 0 and 4096,
#   -r 3, on 24-layer random Q8_0 models (shapes in gpu_ssmgpu.py MID), Triton mixer vs
#   TALLOW_SSM_TRITON=0; plus the study's mamba-1.4b / falcon-h1-0.5b twins where
#   scripts/make_ssm_twin.py is on the branch. nvidia-smi's state before and after.
# Everything is tee'd to $OUT/gpu_ssmgpu.log. Overrides: OUT, WORK, SSMGPU_PP, SSMGPU_TG, SSMGPU_DEPTHS.
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
