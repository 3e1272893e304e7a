#!/bin/bash
# The architecture study (issue 17, docs/architectures.md) on the H200: the six study models
# (Mamba-1.4B, Falcon-H1-0.5B/1.5B/1.5B-Deep/3B twins, the Qwen2.5-1.5B twin), tallow beside
# llama.cpp's llama-bench on the same files, from 0 to 32k tokens of context. One log, one command.
#
#   bash scripts/gpu_study.sh [LLAMA_BENCH]          e.g. /root/llama/bin/llama-bench (built for sm_90)
#
# What it checks, in order (each a line in the log; a failed check stops nothing after it but is marked FAIL):
#   1. the twins: scripts/make_ssm_twin.py writes the five into $WORK/twins (seconds); the Qwen2.5-1.5B
#      twin from .twins2 (the lead's carried twin headers + make_twin.py) when present
#   2. the memory plans: `tallow plan --ctx 32768 --mem-budget 8GiB` for each (which fits 32k in 8 GiB)
#   3. correctness first: on the device, rewinding the memory to a depth (what the study does between
#      repetitions) answers as a fresh prefill does: the next logits equal, for the Qwen twin and, where
#      tallow runs them on the GPU (the ssmgpu work), the SSM twins; the GPU greedy tokens of a tiny
#      falcon-h1 and mamba equal the CPU reference's
#   4. timing: `tallow bench --device $DEVICE --depths ... -r $REPS --llama-bench LLAMA_BENCH --json` per
#      model (a timeout each, so one slow model cannot eat the call); a model tallow cannot run on the
#      device is logged in one sentence and skipped; the combined table at the end
# Carried into the repo root: .whl/ (the gguf wheel, installed into /tmp/site), .twins2/ (optional).
# Assumes no network, torch 2.11, Triton 3.6. Overrides: WORK (/root), OUT, DEVICE (cuda), DEPTHS
# (0,1024,4096,16384,32768), REPS (2), PP (512), TG (64), LLAMA_ARGS ("-ngl 99 -fa 1"), PER_MODEL_S (75),
# TOTAL_S (500: no model is started after this many seconds, so the call stays under 9 minutes),
# CHECK_TOKENS (1500: the depth the rewind check uses), ONLY (a space-separated subset of the models).
set -uo pipefail
export PYTHONUNBUFFERED=1
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-/root}
OUT=${OUT:-/tmp/out}
DEVICE=${DEVICE:-cuda}
DEPTHS=${DEPTHS:-0,1024,4096,16384,32768}
REPS=${REPS:-2}
PP=${PP:-512}
TG=${TG:-64}
LLAMA_ARGS=${LLAMA_ARGS:--ngl 99 -fa 1}
PER_MODEL_S=${PER_MODEL_S:-75}
TOTAL_S=${TOTAL_S:-500}
CHECK_TOKENS=${CHECK_TOKENS:-1500}
LLAMA_BENCH=${1:-${LLAMA_BENCH:-}}
mkdir -p "$OUT" "$WORK/twins"
exec > >(tee -a "$OUT/gpu_study.log") 2>&1
cd "$ROOT"
say() { echo "[$(date -u +%H:%M:%S)] $*"; }

if ls .whl/*.whl >/dev/null 2>&1 && [ ! -f /tmp/site/.installed ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    && touch /tmp/site/.installed
fi
export PYTHONPATH=/tmp/site:$ROOT
python3 -c "import gguf, tallow" || { echo "tallow or gguf does not import: carry .whl (see the header)"; exit 2; }
command -v nvidia-smi >/dev/null && nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw,memory.used --format=csv,noheader
LLAMA_OPT=()
if [ -n "$LLAMA_BENCH" ]; then
  if [ -x "$LLAMA_BENCH" ]; then LLAMA_OPT=(--llama-bench "$LLAMA_BENCH" "--llama-args=$LLAMA_ARGS")
  else say "no executable llama-bench at $LLAMA_BENCH: tallow's figures only"; fi
fi

say "== 1. twins"
python3 scripts/make_ssm_twin.py all "$WORK/twins" | sed 's/^/  /'
MODELS=(mamba-1.4b falcon-h1-0.5b falcon-h1-1.5b falcon-h1-1.5b-deep falcon-h1-3b)
if [ -f .twins2/qwen25-1.5b.json ]; then
  [ -f "$WORK/twins/qwen25-1.5b.gguf" ] || python3 .twins2/make_twin.py make .twins2/qwen25-1.5b "$WORK/twins/qwen25-1.5b.gguf"
fi
[ -f "$WORK/twins/qwen25-1.5b.gguf" ] && MODELS=(qwen25-1.5b "${MODELS[@]}") || say "no .twins2/qwen25-1.5b: the transformer is left out"
[ -n "${ONLY:-}" ] && read -r -a MODELS <<< "$ONLY"  # e.g. ONLY="qwen25-1.5b falcon-h1-0.5b": a subset

say "== 2. plans at 32k in 8 GiB"
for m in "${MODELS[@]}"; do
  python3 -m tallow.cli plan "$WORK/twins/$m.gguf" --ctx 32768 --mem-budget 8GiB > "$OUT/plan_$m.txt" 2>&1
  rc=$?
  echo "  $m: $(grep -E '^  total' "$OUT/plan_$m.txt" | tr -s ' ') rc=$rc $(grep -E 'error|fits' "$OUT/plan_$m.txt" | tr -s ' ' | head -1)"
done

say "== 3. correctness: rewind == fresh prefill on $DEVICE; GPU greedy == CPU on tiny SSM models"
python3 - "$DEVICE" "$WORK/twins" "$CHECK_TOKENS" "${MODELS[@]}" <<'EOF'
import sys, torch
sys.path.insert(0, "tests")
import tallow
from tallow import bench_depths
from tallow.errors import TallowError
device, folder, n_check, models = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4:]
for m in models:
    try:
        llm = tallow.load(f"{folder}/{m}.gguf", ctx=4096, device=device, progress=False)
    except TallowError as exc:
        print(f"  SKIP {m}: {exc}"); continue
    context = list(range(100, 100 + n_check))
    bench_depths.rewind(llm, context)
    fresh = llm.engine.decode_step(7).float().clone()
    bench_depths.fill(llm, list(range(9, 9 + min(512, n_check))), len(context) + 1)
    bench_depths.rewind(llm, context)
    again = llm.engine.decode_step(7).float()
    # NaN-aware: a random-weight twin's logits can be NaN (session 15: Mamba-1.4B's and Falcon-H1-3B's were), and
    # torch.equal then fails however equal the two runs are; the NaN count is printed beside
    same = (again == fresh) | (again.isnan() & fresh.isnan())
    ok = bool(same.all())
    print(f"  {'PASS' if ok else 'FAIL'} {m} on {llm.model.device}: rewind to {n_check} then decode == fresh "
          f"(max |d| {(again - fresh).nan_to_num().abs().max().item():.3g}, NaN logits {int(fresh.isnan().sum())})")
    del llm
    torch.cuda.empty_cache() if torch.cuda.is_available() else None
try:
    from tiny_models import write_tiny_ssm
    for arch in ("falcon-h1", "mamba"):
        path = write_tiny_ssm(arch, f"/tmp/tiny-{arch}.gguf")
        prompt = list(range(3, 43))
        outs = {}
        for dev in ("cpu", device):
            try:
                llm = tallow.load(str(path), ctx=256, device=dev, progress=False)
            except TallowError as exc:
                outs[dev] = f"refused: {exc}"; continue
            outs[dev] = llm.generate(prompt, max_tokens=24, temperature=0.0).tokens
        same = outs.get("cpu") == outs.get(device)
        print(f"  {'PASS' if same else 'DIFF'} tiny {arch}: {device} greedy vs cpu: {outs.get(device)!s:.120}")
except Exception as exc:  # the check is informative; the timing below still runs
    print(f"  FAIL tiny greedy check: {type(exc).__name__}: {exc}")
EOF

say "== 4. timing: depths $DEPTHS, pp$PP tg$TG, -r $REPS, llama-bench: ${LLAMA_BENCH:-none}"
JSONS=()
for m in "${MODELS[@]}"; do
  # A depth + pp beyond the model's context is refused (tallow bench's exit 2): the deepest test stops
  # at the context (Qwen2.5-1.5B: 32768 tokens, Falcon-H1-0.5B: 16384, its max_position_embeddings)
  depths=$(python3 -c "
from tallow.memory.budget import scan_header; from tallow.spec import spec_from_gguf
ctx = spec_from_gguf(scan_header('$WORK/twins/$m.gguf')).context_length
print(','.join(dict.fromkeys(str(min(int(d), ctx - max($PP, $TG))) for d in '$DEPTHS'.split(','))))")
  if [ $SECONDS -gt "$TOTAL_S" ]; then say "-- $m skipped: $SECONDS s gone (TOTAL_S=$TOTAL_S); run again with ONLY=\"$m\""; continue; fi
  say "-- $m (depths $depths)"
  timeout "$PER_MODEL_S" python3 -m tallow.cli bench "$WORK/twins/$m.gguf" --device "$DEVICE" --depths "$depths" \
    -p "$PP" -n "$TG" -r "$REPS" "${LLAMA_OPT[@]}" --json > "$OUT/study_$m.json" 2> "$OUT/study_$m.err"
  rc=$?
  sed 's/^/  /' "$OUT/study_$m.err" | tail -8
  say "-- $m rc=$rc"
  [ $rc -eq 0 ] || [ $rc -eq 5 ] && JSONS+=("$OUT/study_$m.json")
done
say "== the table (all models; JSON rows in $OUT/study_*.json)"
python3 - "$PP" "$TG" "$OUT" "${JSONS[@]}" <<'EOF'
import json, sys
from pathlib import Path
from tallow.bench_depths import table, plot
pp, tg, out, files = int(sys.argv[1]), int(sys.argv[2]), Path(sys.argv[3]), sys.argv[4:]
rows = [r for f in files if Path(f).stat().st_size for r in json.loads(Path(f).read_text())]
print(table(rows, pp, tg))
print("ROWS_JSON " + json.dumps(rows))
try:
    plot(rows, pp, tg, out / "gpu_study.png"); print(f"plot: {out}/gpu_study.png")
except ImportError:
    print("no matplotlib here: plot from the ROWS_JSON line")
EOF
say "done"
