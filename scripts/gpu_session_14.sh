#!/bin/bash
# Session 14's last H200 call (issue 17): the checks of the two new decode paths, their A/B, then the study.
#   bash scripts/gpu_session_14.sh            (carry .whl, .twins2x, .llbin; logs in $OUT)
# 1. scripts/gpu_same_run.sh llama-bg epilogue ssm-ab llama-wait: llama-bench unpacked from .llbin; tiny mamba and
#    falcon-h1 (Q8_0, wide enough for the integer-dot paths) with TALLOW_SSM_SCAN_EPILOGUE / TALLOW_HYBRID_JOIN_Q8
#    on, off and on the CPU; the Mamba-1.4B twin's tg64: the default, TALLOW_SSM_SCAN_EPILOGUE=0, the default.
# 2. A guard: if the default's tg64 is more than 3% under the switch-off one, the study runs with the switch off
#    (and says so): the study's table must be of the code as it ships or as it will be shipped.
# 3. scripts/gpu_study.sh over the five SSM twins (depths 0..32768, pp512, tg64, -r 2, llama-bench beside).
set -o pipefail
OUT=${OUT:-/tmp/out}; export OUT
AB=TALLOW_SSM_SCAN_EPILOGUE=0 SSM_TWINS=mamba-1.4b AB_TESTS="-p 0 -n 64 -r 3" timeout ${PART1_S:-170} \
  bash scripts/gpu_same_run.sh llama-bg epilogue ssm-ab llama-wait
python3 - "$OUT/ssm_ab.txt" <<'PY' > $OUT/guard.txt
import re, sys
rows = [l.split() for l in open(sys.argv[1]) if " tg64 " in l]
base = [float(r[3]) for r in rows if r[1] == "base"]
off = [float(r[3]) for r in rows if r[1] != "base"]
ok = not base or not off or min(base) >= 0.97 * max(off)
print("keep" if ok else "off", base, off)
PY
cat $OUT/guard.txt
grep -q '^off' $OUT/guard.txt && export TALLOW_SSM_SCAN_EPILOGUE=0 && echo "study with TALLOW_SSM_SCAN_EPILOGUE=0"
ONLY="mamba-1.4b falcon-h1-1.5b falcon-h1-0.5b falcon-h1-3b falcon-h1-1.5b-deep" PER_MODEL_S=${PER_MODEL_S:-95} \
  TOTAL_S=${TOTAL_S:-260} CHECK_TOKENS=200 timeout ${STUDY_S:-370} bash scripts/gpu_study.sh /root/llama/bin/llama-bench
