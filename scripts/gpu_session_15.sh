#!/bin/bash
# Session 15's H200 calls (issue 17): the chunked SSD prefill scan (TALLOW_SSD_CHUNKED) checked, timed and A/B'd.
#   bash scripts/gpu_session_15.sh ssd       (carry .whl, .twins2x, .llbin; logs in $OUT)
# ssd: scripts/gpu_ssd.py check (the SSD scan vs the token-by-token scan on the four Falcon-H1 layer shapes, 512 rows
#      and a padded 300/291) and sweep (µs per 512-token chunk, tile choices); scripts/gpu_ssmgpu.py check (tiny
#      mamba / mamba2 / falcon-h1 through the graphs against llama.cpp's fixtures: prompts of 40 tokens, so the
#      SSD scan runs); pp512 at depths 0 and 16384 with the default and TALLOW_SSD_CHUNKED=0 (scripts/gpu_ab.py,
#      one process each) on the 1.5B, 1.5B-Deep and 3B twins, then llama-bench's pp512 at the same depths on the
#      same files; the 1.5B twin's pp512 kernels (scripts/gpu_profile.py).
set -o pipefail
OUT=${OUT:-/tmp/out}; export OUT; mkdir -p $OUT
[ -f /tmp/site/.installed ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && touch /tmp/site/.installed; } || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
T0=$SECONDS
say() { echo "[$((SECONDS - T0)) s $(date -u +%H:%M:%S)] $*" | tee -a $OUT/steps.log; }
state() { nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader | tee -a $OUT/state.txt; }
LLAMA=/root/llama/bin/llama-bench
for step in "$@"; do
  case $step in
    ssd)
      (mkdir -p /root/llama/bin && cat .llbin/llama-bench.xz.* | xz -dc > $LLAMA && chmod +x $LLAMA) &
      (python3 scripts/make_ssm_twin.py all /root/twins > $OUT/twins.log 2>&1) &
      say "gpu_ssd check"; state
      timeout 120 python3 scripts/gpu_ssd.py check 2>&1 | grep -v Warning | tee $OUT/ssd_check.txt
      say "gpu_ssd sweep"
      timeout 150 python3 scripts/gpu_ssd.py sweep 2>&1 | grep -v Warning | tee $OUT/ssd_sweep.txt
      say "ssmgpu check"
      timeout 150 python3 scripts/gpu_ssmgpu.py check --work /tmp/ssmgpu 2>&1 | tail -40 | tee $OUT/ssm_check.txt
      wait
      say "A/B pp512"; state
      timeout 200 python3 scripts/gpu_ab.py --work /root/twins --twins falcon-h1-1.5b,falcon-h1-3b,falcon-h1-1.5b-deep \
        --tests "-p 512 -n 0 -d 0,16384 -r 3" base TALLOW_SSD_CHUNKED=0 2>&1 | tee $OUT/ssd_ab.txt; state
      say "llama-bench pp512"
      for t in falcon-h1-1.5b falcon-h1-3b falcon-h1-1.5b-deep; do
        timeout 60 $LLAMA -m /root/twins/$t.gguf -ngl 99 -fa 1 -p 512 -n 0 -d 0,16384 -r 4 -o jsonl 2>/dev/null \
          | tee -a $OUT/llama_samples.jsonl | python3 scripts/llama_samples.py | sed "s/^/$t /" | tee -a $OUT/llama_pp.txt; done
      say "profile pp512"
      timeout 90 python3 scripts/gpu_profile.py /root/twins/falcon-h1-1.5b.gguf --prefill 512 --decode 0 --rows 30 \
        > $OUT/profile_pp_falcon-h1-1.5b.txt 2>&1; grep -v Warning $OUT/profile_pp_falcon-h1-1.5b.txt | head -30 | cut -c1-150
      say "done" ;;
    final)  # call 2 (one call: a second start may be refused): the SSD scan with C B^T in its own launch checked
            # and timed, its A/B (1.5B, 3B, Deep at 0 / 16384, 0.5B at 0 / 4096), then the study over the six twins
            # beside llama-bench, the tiny models through the graphs, and the tile sweep in what time is left
      mkdir -p /root/llama/bin && cat .llbin/llama-bench.xz.* | xz -dc > $LLAMA && chmod +x $LLAMA
      if [ ! -f .twins2/make_twin.py ]; then  # the twin headers, xz-compressed (carry limit), as gpu_same_run.sh does
        mkdir -p .twins2 && cp .twins2x/*.py .twins2x/*.json .twins2/ && for f in .twins2x/*.hdr.xz; do
          b=$(basename $f .xz); xz -dc $f > .twins2/$b; done
      fi
      (python3 scripts/make_ssm_twin.py all /root/twins > $OUT/twins.log 2>&1) &
      say "gpu_ssd check"; state
      timeout 100 python3 scripts/gpu_ssd.py check 2>&1 | grep -v Warning | tee $OUT/ssd_check.txt
      wait
      say "A/B pp512"; state
      timeout 120 python3 scripts/gpu_ab.py --work /root/twins --twins falcon-h1-1.5b,falcon-h1-3b,falcon-h1-1.5b-deep \
        --tests "-p 512 -n 0 -d 0,16384 -r 3" base TALLOW_SSD_CHUNKED=0 2>&1 | tee $OUT/ssd_ab.txt
      timeout 40 python3 scripts/gpu_ab.py --work /root/twins --twins falcon-h1-0.5b \
        --tests "-p 512 -n 0 -d 0,4096 -r 3" base TALLOW_SSD_CHUNKED=0 2>&1 | tee -a $OUT/ssd_ab.txt; state
      say "study"
      ONLY="qwen25-1.5b mamba-1.4b falcon-h1-0.5b falcon-h1-1.5b falcon-h1-1.5b-deep falcon-h1-3b" PER_MODEL_S=80 \
        TOTAL_S=270 CHECK_TOKENS=200 WORK=/root timeout 350 bash scripts/gpu_study.sh $LLAMA > /dev/null 2>&1
      grep -v "^ROWS_JSON" $OUT/gpu_study.log | tail -45; state
      say "ssmgpu check"
      timeout 45 python3 scripts/gpu_ssmgpu.py check --work /tmp/ssmgpu 2>&1 | tail -40 > $OUT/ssm_check.txt
      grep -c PASS $OUT/ssm_check.txt; grep -v PASS $OUT/ssm_check.txt | tail -5
      say "sweep"
      timeout 60 python3 scripts/gpu_ssd.py sweep --quick 2>&1 | grep -v Warning > $OUT/ssd_sweep.txt
      say "done" ;;
    split)  # call 4: the split prefill attention checked and timed alone, its A/B, then the study again (both changes)
      mkdir -p /root/llama/bin && cat .llbin/llama-bench.xz.* | xz -dc > $LLAMA && chmod +x $LLAMA
      if [ ! -f .twins2/make_twin.py ]; then
        mkdir -p .twins2 && cp .twins2x/*.py .twins2x/*.json .twins2/ && for f in .twins2x/*.hdr.xz; do
          b=$(basename $f .xz); xz -dc $f > .twins2/$b; done
      fi
      mkdir -p /root/twins
      (python3 scripts/make_ssm_twin.py all /root/twins > $OUT/twins.log 2>&1;
       python3 .twins2/make_twin.py make .twins2/qwen25-1.5b /root/twins/qwen25-1.5b.gguf >> $OUT/twins.log 2>&1) &
      say "prefill split check"; state
      timeout 100 python3 scripts/gpu_prefill_split.py 2>&1 | grep -v Warning | tee $OUT/split_check.txt
      wait
      say "A/B pp512 with and without the split"; state
      timeout 170 python3 scripts/gpu_ab.py --work /root/twins --twins falcon-h1-1.5b-deep,falcon-h1-1.5b,qwen25-1.5b \
        --tests "-p 512 -n 0 -d 0,16384,32256 -r 2" base TALLOW_PREFILL_SPLIT=0 2>&1 | tee $OUT/split_ab.txt; state
      say "study"
      ONLY="qwen25-1.5b mamba-1.4b falcon-h1-0.5b falcon-h1-1.5b falcon-h1-1.5b-deep falcon-h1-3b" PER_MODEL_S=80 \
        TOTAL_S=270 CHECK_TOKENS=200 WORK=/root timeout 330 bash scripts/gpu_study.sh $LLAMA > /dev/null 2>&1
      grep -v "^ROWS_JSON" $OUT/gpu_study.log | grep -A40 "== the table"; state
      say "done"
      # one file back: the device tool returns a limited count of files from $OUT (call 2 lost its logs that way)
      tar czf /tmp/all.tgz -C $OUT . && rm -rf $OUT/* && mv /tmp/all.tgz $OUT/ ;;
    split2)  # call 5: the split's idle ranges and merge made cheaper: its check and A/B again (deep and qwen)
      (python3 scripts/make_ssm_twin.py falcon-h1-1.5b-deep /root/twins/falcon-h1-1.5b-deep.gguf > $OUT/twins.log 2>&1;
       [ -f .twins2/make_twin.py ] || { mkdir -p .twins2 && cp .twins2x/*.py .twins2x/*.json .twins2/ &&
         xz -dc .twins2x/qwen25-1.5b.hdr.xz > .twins2/qwen25-1.5b.hdr; };
       python3 .twins2/make_twin.py make .twins2/qwen25-1.5b /root/twins/qwen25-1.5b.gguf >> $OUT/twins.log 2>&1) &
      say "prefill split check"; state
      timeout 100 python3 scripts/gpu_prefill_split.py 2>&1 | grep -v Warning | tee $OUT/split_check.txt
      wait
      say "A/B pp512 with and without the split"; state
      timeout 120 python3 scripts/gpu_ab.py --work /root/twins --twins falcon-h1-1.5b-deep,qwen25-1.5b \
        --tests "-p 512 -n 0 -d 0,16384,32256 -r 2" base TALLOW_PREFILL_SPLIT=0 base 2>&1 | tee $OUT/split_ab.txt; state
      say "done"
      tar czf /tmp/all.tgz -C $OUT . && rm -rf $OUT/* && mv /tmp/all.tgz $OUT/ ;;
    ssd2)  # the SSD scan with C B^T in a launch of its own: the same checks, a smaller sweep, the A/B with the 0.5B
      (python3 scripts/make_ssm_twin.py all /root/twins > $OUT/twins.log 2>&1) &
      say "gpu_ssd check"; state
      timeout 120 python3 scripts/gpu_ssd.py check 2>&1 | grep -v Warning | tee $OUT/ssd_check.txt
      say "gpu_ssd sweep"
      timeout 120 python3 scripts/gpu_ssd.py sweep 2>&1 | grep -v Warning | tee $OUT/ssd_sweep.txt
      say "ssmgpu check"
      timeout 150 python3 scripts/gpu_ssmgpu.py check --work /tmp/ssmgpu 2>&1 | tail -40 | tee $OUT/ssm_check.txt
      wait
      say "A/B pp512"; state
      timeout 200 python3 scripts/gpu_ab.py --work /root/twins --twins falcon-h1-1.5b,falcon-h1-3b,falcon-h1-1.5b-deep \
        --tests "-p 512 -n 0 -d 0,16384 -r 3" base TALLOW_SSD_CHUNKED=0 2>&1 | tee $OUT/ssd_ab.txt
      timeout 60 python3 scripts/gpu_ab.py --work /root/twins --twins falcon-h1-0.5b \
        --tests "-p 512 -n 0 -d 0,4096 -r 3" base TALLOW_SSD_CHUNKED=0 2>&1 | tee -a $OUT/ssd_ab.txt; state
      say "profile pp512"
      timeout 90 python3 scripts/gpu_profile.py /root/twins/falcon-h1-1.5b.gguf --prefill 512 --decode 0 --rows 30 \
        > $OUT/profile_pp_falcon-h1-1.5b.txt 2>&1; grep -v Warning $OUT/profile_pp_falcon-h1-1.5b.txt | head -30 | cut -c1-60,100-200
      say "done" ;;
  esac
done
