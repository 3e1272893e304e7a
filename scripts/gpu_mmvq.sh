#!/bin/bash
# The integer-dot GEMV vs quant_gemv on the H200 (issue 12 / 14, branch s8-mmvq), one command:
#
#   bash scripts/gpu_mmvq.sh [--short]   (about 4 minutes, --short about 2; hard limit 290 s)
#
# Runs scripts/gpu_mmvq.py (see its docstring: a GATE line first, then one line per shape and the
# M = 4/8 lines); log and JSON in $OUT (gpu_mmvq.log, gpu_mmvq.json). Needs torch + triton only
# (no gguf, no model file, no network).
set -uo pipefail
export PYTHONUNBUFFERED=1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
exec > >(tee -a "$OUT/gpu_mmvq.log") 2>&1
cd "$ROOT"
echo "[$(date -u +%H:%M:%S)] gpu_mmvq at $(git rev-parse --short HEAD 2>/dev/null || echo '?')"
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader || true
PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}" timeout 290 python scripts/gpu_mmvq.py --out "$OUT/gpu_mmvq.json" "$@"
rc=$?
echo "[$(date -u +%H:%M:%S)] gpu_mmvq rc $rc"
exit $rc
