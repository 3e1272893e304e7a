#!/bin/bash
# What every H200 session script of the study begins with (sourced: . scripts/gpu_lib.sh): the carried wheels installed
# into /tmp/site, logs under $OUT, and the helpers below. Carry .whl, .twins2x and .llbin (or .llsrc).
#   say MSG            a timestamped line in $OUT/steps.log
#   state              the GPU's clocks, temperature and power into $OUT/state.txt
#   build_llama        llama-bench b11434 at $LLAMA: unpacked from .llbin's xz pieces, else built from .llsrc (~6 min)
#   llama TWIN ARGS    llama-bench -ngl 99 -fa 1 on /root/twins/TWIN.gguf: its steady repetitions into $OUT/table.log
#   setup_twins        the twin headers unpacked, llama-bench built in the background, the study's six twins written
#   extra_twin NAME    /root/twins/NAME.gguf written if missing: gemma4-* by make_gemma4_twin.py, else from .twins2's header
set -o pipefail
OUT=${OUT:-/tmp/out}; export OUT; mkdir -p $OUT /root/twins
export PYTHONUNBUFFERED=1
[ -f /tmp/site/.installed ] || { python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
  --target /tmp/site .whl/*.whl && touch /tmp/site/.installed; } || exit 1
export PYTHONPATH=/tmp/site:$PWD
T0=$SECONDS
LLAMA=/root/llama/bin/llama-bench
TWINS6="qwen25-1.5b mamba-1.4b falcon-h1-0.5b falcon-h1-1.5b falcon-h1-1.5b-deep falcon-h1-3b"
say() { echo "[$((SECONDS - T0)) s $(date -u +%H:%M:%S)] $*" | tee -a $OUT/steps.log; }
state() { nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader | tee -a $OUT/state.txt; }
build_llama() {
  [ -x $LLAMA ] && return 0
  if ls .llbin/llama-bench.xz.* > /dev/null 2>&1; then
    mkdir -p /root/llama/bin && cat .llbin/llama-bench.xz.* | xz -dc > $LLAMA && chmod +x $LLAMA && return 0
  fi
  rm -rf /root/llsrc && mkdir -p /root/llsrc && tar xJf .llsrc/llsrc.tar.xz -C /root/llsrc || return 1
  cmake -S /root/llsrc -B /root/llbuild -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DBUILD_SHARED_LIBS=OFF > $OUT/llama_cmake.log 2>&1 || return 1
  cmake --build /root/llbuild -j${LLAMA_JOBS:-12} --target llama-bench > $OUT/llama_build.log 2>&1 || return 1
  mkdir -p /root/llama/bin && cp /root/llbuild/bin/llama-bench $LLAMA
}
llama() {  # twin, llama-bench tests: its steady repetitions
  timeout ${LLAMA_S:-60} $LLAMA -m /root/twins/$1.gguf -ngl 99 -fa 1 "${@:2}" -o jsonl 2>/dev/null \
    | tee -a $OUT/llama_samples.jsonl | python3 scripts/llama_samples.py | tee -a $OUT/table.log
}
setup_twins() {
  if [ ! -f .twins2/make_twin.py ]; then
    mkdir -p .twins2 && cp .twins2x/*.py .twins2x/*.json .twins2/ && for f in .twins2x/*.hdr.xz; do
      xz -dc $f > .twins2/$(basename $f .xz); done
  fi
  (t=$SECONDS; build_llama; echo "llama build rc $? in $((SECONDS - t)) s") > $OUT/llama_bg.log 2>&1 &
  python3 scripts/make_ssm_twin.py all /root/twins > $OUT/twins.log 2>&1 || say "ssm twins FAILED"
  python3 .twins2/make_twin.py make .twins2/qwen25-1.5b /root/twins/qwen25-1.5b.gguf >> $OUT/twins.log 2>&1 \
    || say "qwen twin FAILED"
  ls -la /root/twins | tee -a $OUT/steps.log; state
}
extra_twin() {
  local t=$1 f=/root/twins/$1.gguf
  [ -s $f ] && return 0
  case $t in
    gemma4-*) python3 scripts/make_gemma4_twin.py ${t#gemma4-} $f.tmp ;;
    *) python3 .twins2/make_twin.py make .twins2/$t $f.tmp ;;
  esac >> $OUT/twins.log 2>&1 && mv $f.tmp $f
}
