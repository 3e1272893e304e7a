#!/bin/bash
# Same-run ratios on the H200: llama.cpp b11434 built in the lease (static llama-bench, CUDA sm_90), then each
# twin measured by tallow and by llama-bench one right after the other, in the same call.
#   bash scripts/gpu_same_run.sh STEP...
# Steps: prepare (llama.cpp built in the background while the twins are written; waits for both),
#        llama-bg / llama-wait (the build alone in the background, and waiting for it), mmvq (scripts/gpu_mmvq.sh),
#        check (CHECK_TWINS, smollm2 by default: graph vs eager decode and top-1 against the CPU fp32 reference),
#        q8norm (scripts/gpu_q8_norm.py: the norm-folded Q8_1 in one pass vs the chunked kernel, checked and timed),
#        copybw (the device copy bandwidth), q8-ab (Q8_TWINS tg128: the default, $AB, the default again),
#        table T... (tallow `-p 33,512 -n 128 -r 3`, then llama-bench `-p 33,512 -n 128 -r 5`, per twin),
#        depth T (tg128 at depth 32768, both), ssm (the study's SSM twins at depths 0 and 4096, both),
#        moe (Qwen3-30B-A3B twin cut to 8 of its 48 layers, both), moe-ab (gpu_moe_check --quick, then tallow
#        on that twin with and without TALLOW_MOE_ROUTE_TRITON), moe-check (gpu_moe_check --quick alone),
#        mmvq-ab (E2B and qwen3-4b tg128 with and without TALLOW_GEMV_MMVQ), pack (llama-bench.xz into $OUT),
#        piece (the real smollm2 file's pieces carried in .mpiece1/2/3, one per call, kept in /root/m),
#        conform (the pieces joined and checked; the smollm2 conformance tests with TALLOW_GEMV_MMVQ=0 and 1),
#        spec-mmvq (scripts/gpu_speculate.py's exactness check with the integer-dot GEMV: verification rows vs
#        decode steps, E2B and qwen3-4b), epi-ab (E2B, qwen3-4b, smollm2 tg128: the default against $AB),
#        e2b-ab (E2B tg128 at depths 0 and 32768, the default and $AB, then llama-bench's),
#        profile-e2b (one E2B decode step's kernels), profile-nopdl (the same with TALLOW_PDL=0), profile-q4 (qwen3-4b's step, TALLOW_PDL=0),
#        g4check (scripts/gpu_gemma4_check.py: tiny Gemma 4 greedy against llama.cpp's fixture through the graphs),
#        narrow (scripts/gpu_gemv_table.py --narrow: deeper mmvq configs on the narrow shapes),
#        twins (write the five twins), gemv-table (scripts/gpu_gemv_table.py over them: issue 12's bandwidth table),
#        pack-split (llama-bench, xz, in 15 MB pieces into $OUT: unpacked by a later lease's llama step from .llbin),
#        ssm-check (scripts/gpu_ssmgpu.py check: tiny mamba/mamba2/falcon-h1 through the graphs against llama.cpp's
#        fixtures), ssm0 (SSM_TWINS tallow then llama-bench, `-p 512 -n 64`, depth 0), profile-ssm (one decode
#        step of PROFILE_TWINS, with and without PDL), ssm-ab (SSM_TWINS tg64 at depths 0 and 4096: default, $AB, default),
#        epilogue (scripts/gpu_ssm_epilogue.py: TALLOW_SSM_SCAN_EPILOGUE's kernel and model checks on the Mamba-1.4B twin),
#        profile-pp (PP_TWINS' pp512 kernels), ssm-kernels (scripts/gpu_ssmgpu.py kernels: conv and scan alone, rows per program).
# (The fold-ab and one-launch steps of session 9 ran at c5130b2 and 714d48e; their switches are gone.)
# Twins: smollm2-135m gemma3-270m qwen25-1.5b qwen3-4b (from .twins2 headers), gemma4-e2b gemma4-e4b
# (scripts/make_gemma4_twin.py). Carry: .whl (gguf wheel), .twins2, .llsrc (llama.cpp's source, trimmed).
# llama-bench's first repetition of a prompt test is slow: scripts/llama_samples.py reports the steady ones.
set -o pipefail
export PYTHONUNBUFFERED=1
OUT=${OUT:-/tmp/out}; mkdir -p $OUT /root/twins
[ -f /tmp/site/.installed ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && touch /tmp/site/.installed; } || exit 1
export PYTHONPATH=/tmp/site:$PWD
LLAMA=/root/llama/bin/llama-bench
AB=${AB:-TALLOW_GEMV_EPILOGUE=0}  # the variant the A/B steps compare with the default
if [ -d .twins2x ] && [ ! -f .twins2/make_twin.py ]; then  # the twin headers xz-compressed (carry limit)
  mkdir -p .twins2 && cp .twins2x/*.py .twins2x/*.json .twins2/ && for f in .twins2x/*.hdr.xz; do
    b=$(basename $f .xz); xz -dc $f > .twins2/$b; done
fi
T0=$SECONDS
say() { echo "[$((SECONDS - T0)) s] $*" | tee -a $OUT/steps.log; }
state() { nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader | tee -a $OUT/state.txt; }
build_llama() {
  [ -x $LLAMA ] && return 0
  if ls .llbin/llama-bench.xz.* > /dev/null 2>&1; then  # pieces packed by an earlier lease
    mkdir -p /root/llama/bin && cat .llbin/llama-bench.xz.* | xz -dc > $LLAMA && chmod +x $LLAMA && return 0
  fi
  rm -rf /root/llsrc && mkdir -p /root/llsrc && tar xJf .llsrc/llsrc.tar.xz -C /root/llsrc || return 1
  cmake -S /root/llsrc -B /root/llbuild -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DBUILD_SHARED_LIBS=OFF > $OUT/llama_cmake.log 2>&1 || return 1
  cmake --build /root/llbuild -j16 --target llama-bench > $OUT/llama_build.log 2>&1 || return 1
  mkdir -p /root/llama/bin && cp /root/llbuild/bin/llama-bench $LLAMA
}
twin() {
  local t=$1 f=/root/twins/$1.gguf
  [ -s $f ] && return 0
  case $t in
    gemma4-*) python3 scripts/make_gemma4_twin.py ${t#gemma4-} $f.tmp ;;
    *) python3 .twins2/make_twin.py make .twins2/$t $f.tmp ;;
  esac > /dev/null && mv $f.tmp $f
}
llama_json() {  # model, tests...
  local m=$1; shift
  $LLAMA -m $m -ngl 99 -fa 1 "$@" -o jsonl 2>/dev/null | tee -a $OUT/llama_samples.jsonl | python3 scripts/llama_samples.py
}
pair() {  # twin, tests (the same for both)
  local t=$1; shift
  [ -x $LLAMA ] || build_llama || say "no llama-bench"  # .llbin's pieces (seconds), else a build from .llsrc
  echo "== $t: $*" | tee -a $OUT/table.log; state
  python3 -m tallow.cli bench -m /root/twins/$t.gguf --device cuda "$@" -r 3 2>&1 | grep "^  \|rror" | tee -a $OUT/table.log
  state
  llama_json /root/twins/$t.gguf "$@" -r 5 | tee -a $OUT/table.log
}
for step in "$@"; do
  case $step in
    prepare) say "prepare"
      (t=$SECONDS; build_llama; echo "llama build rc $? in $((SECONDS - t)) s") > $OUT/llama_bg.log 2>&1 &
      for t in smollm2-135m gemma3-270m qwen25-1.5b qwen3-4b gemma4-e2b; do twin $t || say "twin $t FAILED"; done
      say "twins written"; wait; cat $OUT/llama_bg.log | tee -a $OUT/steps.log
      [ -x $LLAMA ] || { tail -20 $OUT/llama_build.log $OUT/llama_cmake.log; exit 1; }
      $LLAMA --version 2>&1 | tail -2 | tee -a $OUT/steps.log ;;
    llama-bg) say "llama.cpp build started in the background"
      (t=$SECONDS; build_llama; echo "llama build rc $? in $((SECONDS - t)) s") > $OUT/llama_bg.log 2>&1 & ;;
    llama-wait) wait; cat $OUT/llama_bg.log | tee -a $OUT/steps.log; [ -x $LLAMA ] || exit 1 ;;
    twins) say "twins"; for t in smollm2-135m gemma3-270m qwen25-1.5b qwen3-4b gemma4-e2b; do twin $t || say "twin $t FAILED"; done ;;
    gemv-table) say "gemv-table"  # issue 12's per-kernel bandwidth table (scripts/gpu_gemv_table.py)
      timeout ${TABLE_S:-330} python3 scripts/gpu_gemv_table.py /root/twins/{smollm2-135m,gemma3-270m,qwen25-1.5b,qwen3-4b,gemma4-e2b}.gguf \
        --sweep-s ${SWEEP_S:-200} 2>&1 | grep -v Warning | tee $OUT/gemv_table.txt | tail -60 ;;
    narrow) say "narrow: mmvq configs for the narrow shapes"
      timeout 260 python3 scripts/gpu_gemv_table.py --narrow ${SWEEP_S:-200} 2>&1 | grep -v Warning | tee $OUT/narrow_sweep.txt ;;
    mmvq) say "mmvq"; bash scripts/gpu_mmvq.sh > /dev/null 2>&1; tail -40 $OUT/gpu_mmvq.log ;;
    check) say "check"  # CHECK_TWINS: the twins checked (graph vs eager decode, parity with the CPU fp32 reference)
      for t in ${CHECK_TWINS:-smollm2-135m}; do
        python3 scripts/gpu_check.py --twins .twins2 --work /root/twins --parity --only $t 2>&1 | tail -3 | tee -a $OUT/parity.txt; done ;;
    q8norm) say "q8norm: the one-pass norm quantization against the chunked one (scripts/gpu_q8_norm.py)"
      timeout 200 python3 scripts/gpu_q8_norm.py 2>&1 | grep -v Warning | tee $OUT/q8norm.txt ;;
    copybw) say "copybw"; python3 scripts/gpu_copy_bandwidth.py 2>&1 | tee -a $OUT/steps.log ;;
    q8-ab) say "q8-ab: the default, $AB, the default again, tg128 (Q8_TWINS)"; state
      for t in ${Q8_TWINS:-gemma4-e2b qwen3-4b}; do twin $t || say "twin $t FAILED"; done
      python3 scripts/gpu_ab.py --work /root/twins --twins $(echo ${Q8_TWINS:-gemma4-e2b qwen3-4b} | tr ' ' ,) \
        --tests "${AB_TESTS:--p 0 -n 128 -r 3}" base $AB base 2>&1 | tee -a $OUT/q8_ab.txt; state ;;
    smollm2-135m|gemma3-270m|qwen25-1.5b|qwen3-4b|gemma4-e2b|gemma4-e4b) say "table $step"
      twin $step && pair $step -p 33,512 -n 128 ;;
    depth) say "depth qwen3-4b"
      twin qwen3-4b && pair qwen3-4b -p 0 -n 128 -d 32768 ;;
    depth-e2b) say "depth gemma4-e2b"
      twin gemma4-e2b && pair gemma4-e2b -p 0 -n 128 -d 32768 ;;
    epilogue) say "epilogue: tiny mamba / falcon-h1 wide enough for the integer-dot paths (scripts/gpu_ssm_epilogue.py)"
      timeout 150 python3 scripts/gpu_ssm_epilogue.py mamba 2>&1 | grep -v Warning | tail -6 | tee $OUT/epilogue.txt
      timeout 100 python3 scripts/gpu_ssm_epilogue.py falcon-h1 TALLOW_HYBRID_JOIN_Q8 --no-kernel 2>&1 \
        | grep -v Warning | tail -6 | tee -a $OUT/epilogue.txt ;;
    profile-pp) say "profile-pp"
      ls /root/twins/mamba-1.4b.gguf > /dev/null 2>&1 || python3 scripts/make_ssm_twin.py all /root/twins > /dev/null || say "ssm twins FAILED"
      for t in ${PP_TWINS:-falcon-h1-1.5b}; do timeout 120 python3 scripts/gpu_profile.py /root/twins/$t.gguf --prefill 512 --decode 0 --rows 30 \
        > $OUT/profile_pp_$t.txt 2>&1; head -40 $OUT/profile_pp_$t.txt | grep -v Warning | cut -c1-60,100-200; done ;;
    ssm-kernels) say "ssm-kernels"; timeout 200 python3 scripts/gpu_ssmgpu.py kernels --work /tmp/ssmgpu 2>&1 | tail -20 | tee $OUT/ssm_kernels.txt ;;
    ssm-check) say "ssm-check"; timeout 200 python3 scripts/gpu_ssmgpu.py check --work /tmp/ssmgpu 2>&1 | tail -40 | tee $OUT/ssm_check.txt ;;
    ssm0) say "ssm0: the SSM twins at depth 0 beside llama-bench"
      ls /root/twins/mamba-1.4b.gguf > /dev/null 2>&1 || python3 scripts/make_ssm_twin.py all /root/twins > /dev/null || say "ssm twins FAILED"
      for t in ${SSM_TWINS:-mamba-1.4b falcon-h1-0.5b falcon-h1-1.5b falcon-h1-1.5b-deep falcon-h1-3b}; do pair $t -p 512 -n 64; done ;;
    profile-ssm) say "profile-ssm"
      ls /root/twins/mamba-1.4b.gguf > /dev/null 2>&1 || python3 scripts/make_ssm_twin.py all /root/twins > /dev/null || say "ssm twins FAILED"
      for t in ${PROFILE_TWINS:-mamba-1.4b falcon-h1-1.5b}; do
        TALLOW_PDL=0 timeout 120 python3 scripts/gpu_profile.py /root/twins/$t.gguf --prefill 33 --decode 8 --sequence \
          > $OUT/profile_${t}_nopdl.txt 2>&1; grep "last replay" $OUT/profile_${t}_nopdl.txt | tee -a $OUT/steps.log
        timeout 120 python3 scripts/gpu_profile.py /root/twins/$t.gguf --prefill 33 --decode 8 --sequence \
          > $OUT/profile_${t}_pdl.txt 2>&1; grep "last replay" $OUT/profile_${t}_pdl.txt | tee -a $OUT/steps.log; done ;;
    ssm-ab) say "ssm-ab: the default, $AB, the default again, tg64 at depths 0 and 4096"; state
      ls /root/twins/mamba-1.4b.gguf > /dev/null 2>&1 || python3 scripts/make_ssm_twin.py all /root/twins > /dev/null || say "ssm twins FAILED"
      python3 scripts/gpu_ab.py --work /root/twins --twins $(echo ${SSM_TWINS:-mamba-1.4b falcon-h1-1.5b} | tr ' ' ,) \
        --tests "${AB_TESTS:--p 0 -n 64 -d 0,4096 -r 3}" base $AB base 2>&1 | tee -a $OUT/ssm_ab.txt; state ;;
    ssm) say "ssm"
      python3 scripts/make_ssm_twin.py all /root/twins > /dev/null || say "ssm twins FAILED"
      for t in mamba-1.4b falcon-h1-1.5b; do pair $t -p 512 -n 128; done ;;
    moe) say "moe"
      f=/root/twins/qwen3-30b-a3b-cut8.gguf
      [ -s $f ] || python3 scripts/make_moe_twin.py qwen3-30b-a3b $f --layers 8 > $OUT/moe_twin.log 2>&1 || say "moe twin FAILED"
      pair qwen3-30b-a3b-cut8 -p 512 -n 128 ;;
    moe-ab) say "moe-ab: the routing kernel's check and A/B"
      f=/root/twins/qwen3-30b-a3b-cut8.gguf
      [ -s $f ] || python3 scripts/make_moe_twin.py qwen3-30b-a3b $f --layers 8 > $OUT/moe_twin.log 2>&1 || say "moe twin FAILED"
      timeout 120 python3 scripts/gpu_moe_check.py --device cuda --quick 2>&1 | tail -8 | tee -a $OUT/moe_check.txt
      python3 scripts/gpu_ab.py --work /root/twins --twins qwen3-30b-a3b-cut8 --tests "-p 0 -n 128 -r 3" base TALLOW_MOE_ROUTE_TRITON=0 2>&1 | tee -a $OUT/moe_ab.txt ;;
    mmvq-ab) say "mmvq-ab: TALLOW_GEMV_MMVQ in the engine (speculation off in both variants)"
      for t in gemma4-e2b qwen3-4b; do twin $t || say "twin $t FAILED"; done
      python3 scripts/gpu_ab.py --work /root/twins --twins gemma4-e2b,qwen3-4b --tests "-p 0 -n 128 -r 3" \
        TALLOW_SPECULATE=0 TALLOW_SPECULATE=0,TALLOW_GEMV_MMVQ=0 2>&1 | tee -a $OUT/mmvq_ab.txt ;;
    moe-check) say "moe-check"; timeout 120 python3 scripts/gpu_moe_check.py --device cuda --quick 2>&1 | tail -12 | tee -a $OUT/moe_check.txt ;;
    piece) mkdir -p /root/m; for d in .mpiece*; do [ -d $d ] && cp $d/* /root/m/; done; ls -la /root/m | tee -a $OUT/steps.log ;;
    conform) say "conform"
      cat /root/m/smollm2.part0 /root/m/smollm2.part1 /root/m/smollm2.part2 > /root/m/smollm2-135m.gguf
      sha256sum /root/m/smollm2-135m.gguf | tee -a $OUT/steps.log
      for v in ${CONFORM_MMVQ:-0 1}; do TALLOW_GEMV_MMVQ=$v TALLOW_TEST_MODELS=/root/m timeout 300 python3 -m pytest -q -p no:cacheprovider \
        tests/test_conformance.py -k smollm2 2>&1 | tail -15 | tee -a $OUT/conform_mmvq$v.txt; done ;;
    spec-mmvq) say "spec-mmvq"
      for t in gemma4-e2b qwen3-4b; do twin $t || say "twin $t FAILED"; done
      timeout 300 python3 scripts/gpu_speculate.py /root/twins/gemma4-e2b.gguf /root/twins/qwen3-4b.gguf \
        --reps ${SPEC_REPS:-20} 2>&1 | tail -30 | tee -a $OUT/spec_mmvq.txt ;;
    epi-ab) say "epi-ab: $AB against the default, tg128"
      for t in gemma4-e2b qwen3-4b smollm2-135m; do twin $t || say "twin $t FAILED"; done
      python3 scripts/gpu_ab.py --work /root/twins --twins gemma4-e2b,qwen3-4b,smollm2-135m --tests "-p 0 -n 128 -r 3" \
        base $AB 2>&1 | tee -a $OUT/epi_ab.txt ;;
    e2b-ab) say "e2b-ab: $AB against the default"
      twin gemma4-e2b || say "twin gemma4-e2b FAILED"
      for d in 0 32768; do state
        python3 scripts/gpu_ab.py --work /root/twins --twins gemma4-e2b --tests "-p 0 -n 128 -d $d -r 3" \
          base $AB 2>&1 | tee -a $OUT/e2b_ab.txt
        state; llama_json /root/twins/gemma4-e2b.gguf -p 0 -n 128 -d $d -r 5 | tee -a $OUT/e2b_ab.txt; done ;;
    profile-e2b) say "profile-e2b"
      python3 scripts/gpu_profile.py /root/twins/gemma4-e2b.gguf --prefill 33 --decode 8 --sequence \
        > $OUT/profile_e2b_mmvq.txt 2>&1; tail -5 $OUT/profile_e2b_mmvq.txt ;;
    profile-nopdl) say "profile-nopdl"  # kernel durations without PDL's early launches (no waiting inside them)
      TALLOW_PDL=0 python3 scripts/gpu_profile.py /root/twins/gemma4-e2b.gguf --prefill 33 --decode 8 --sequence \
        > $OUT/profile_e2b_nopdl.txt 2>&1; grep "last replay" $OUT/profile_e2b_nopdl.txt ;;
    profile-q4) say "profile-q4"  # one qwen3-4b decode step without PDL: each kernel's own duration
      twin qwen3-4b && TALLOW_PDL=0 python3 scripts/gpu_profile.py /root/twins/qwen3-4b.gguf --prefill 33 --decode 8 \
        --sequence > $OUT/profile_q4_nopdl.txt 2>&1; grep "last replay" $OUT/profile_q4_nopdl.txt ;;
    g4check) say "g4check"; timeout 300 python3 scripts/gpu_gemma4_check.py --work /root/g4 2>&1 | tail -12 | tee -a $OUT/g4check.txt ;;
    pack-split) strip $LLAMA; xz -T16 -6 -c $LLAMA | split -b 15M -d -a 1 - $OUT/llama-bench.xz.; ls -la $OUT ;;
    pack) strip $LLAMA; xz -T16 -6 -c $LLAMA > $OUT/llama-bench.xz; ls -la $LLAMA $OUT/llama-bench.xz ;;
    *) say "unknown step $step" ;;
  esac
done
say "done"
