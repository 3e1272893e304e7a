#!/bin/bash
# Session 6's H200 runs: llama.cpp b11434 built there beside tallow, the four-twin table side by side.
#   bash scripts/gpu_session_13.sh [llama|pack|table|depth|exact]...
# Carry: .whl (gguf, llguidance), .twins2 (twin headers + make_twin.py), .llsrc (llama.cpp's source,
# trimmed, as a tar.xz) or .llbin (a llama-bench built by `pack` in an earlier lease of this session).
set -o pipefail
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD
OUT=${OUT:-/tmp/out}; mkdir -p $OUT
LLAMA=/root/llama/bin/llama-bench
state() { nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu,power.draw,power.limit,utilization.gpu --format=csv,noheader | tee -a $OUT/state.txt; }
twins() {
  mkdir -p /root/twins
  for t in "$@"; do [ -f /root/twins/$t.gguf ] || python3 .twins2/make_twin.py make .twins2/$t /root/twins/$t.gguf; done
}
llama() {  # llama-bench with CUDA for sm_90, static, into /root/llama (or unpacked from .llbin)
  [ -x $LLAMA ] && return 0
  if [ -f .llbin/llama-bench.xz ]; then
    mkdir -p /root/llama/bin && xz -dc .llbin/llama-bench.xz > $LLAMA && chmod +x $LLAMA && return 0
  fi
  local t0=$SECONDS
  rm -rf /root/llsrc && mkdir -p /root/llsrc && tar xJf .llsrc/llsrc.tar.xz -C /root/llsrc || return 1
  cmake -S /root/llsrc -B /root/llbuild -G Ninja -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES=90 \
    -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=OFF -DLLAMA_BUILD_APP=OFF -DBUILD_SHARED_LIBS=OFF > $OUT/llama_cmake.log 2>&1 || { tail -30 $OUT/llama_cmake.log; return 1; }
  cmake --build /root/llbuild -j16 --target llama-bench > $OUT/llama_build.log 2>&1 || { tail -30 $OUT/llama_build.log; return 1; }
  mkdir -p /root/llama/bin && cp /root/llbuild/bin/llama-bench $LLAMA
  echo "llama.cpp build: $((SECONDS - t0)) s" | tee -a $OUT/llama.txt
  $LLAMA --version 2>&1 | tee -a $OUT/llama.txt
}
# One twin, tallow then llama.cpp, the same tests, one right after the other.
side_by_side() {  # twin, tallow tests, llama-bench tests
  local t=$1
  state
  python3 -m tallow.cli bench -m /root/twins/$t.gguf --device cuda $2 2>&1 | tee -a $OUT/table.log
  state
  $LLAMA -m /root/twins/$t.gguf -ngl 99 -fa 1 $3 2>&1 | grep -v "^ggml_cuda_init\|^  Device\|^load_backend" | tee -a $OUT/table.log
}
# llama-bench's per-repetition samples (jsonl): its first repetition of a prompt test is slow.
llama_json() {  # model, tests...
  local m=$1; shift
  $LLAMA -m $m -ngl 99 -fa 1 "$@" -o jsonl 2>/dev/null | tee -a $OUT/llama_samples.jsonl | python3 scripts/llama_samples.py
}
gemma4_twins() {
  mkdir -p /root/twins
  for m in e2b e4b; do [ -s /root/twins/gemma4-$m.gguf ] || python3 scripts/make_gemma4_twin.py $m /root/twins/gemma4-$m.gguf; done
}
state
for step in "$@"; do
  case $step in
    llama) llama || exit 1 ;;
    twins) twins smollm2-135m gemma3-270m qwen25-1.5b qwen3-4b ;;
    pack) strip $LLAMA; xz -T16 -6 -c $LLAMA > $OUT/llama-bench.xz; ls -la $LLAMA $OUT/llama-bench.xz ;;
    table) llama || exit 1; twins smollm2-135m gemma3-270m qwen25-1.5b qwen3-4b
        for t in smollm2-135m gemma3-270m qwen25-1.5b qwen3-4b; do
          echo "== $t" | tee -a $OUT/table.log
          side_by_side $t "-p 33,512 -n 128 -r 3" "-p 33,512 -n 128 -r 3"
        done ;;
    depth) llama || exit 1; twins qwen3-4b
        echo "== qwen3-4b depth" | tee -a $OUT/depth.log
        python3 -m tallow.cli bench -m /root/twins/qwen3-4b.gguf --device cuda -p 0 -n 128 -d 0,32768 -r 2 2>&1 | tee -a $OUT/depth.log
        echo "tallow bench rc: ${PIPESTATUS[0]}" | tee -a $OUT/depth.log
        $LLAMA -m /root/twins/qwen3-4b.gguf -ngl 99 -fa 1 -p 0 -n 128 -d 0,32768 -r 2 2>&1 | tee -a $OUT/depth.log ;;
    prepare) (llama > $OUT/llama_bg.log 2>&1; echo "llama build rc $?" >> $OUT/llama_bg.log) &
        bg=$!
        (twins smollm2-135m gemma3-270m qwen25-1.5b qwen3-4b; gemma4_twins) > $OUT/twins_bg.log 2>&1
        cat $OUT/twins_bg.log | tail -8 ;;
    wait_llama) wait; cat $OUT/llama_bg.log; [ -x $LLAMA ] || exit 1 ;;
    table2) for t in smollm2-135m gemma3-270m qwen25-1.5b qwen3-4b; do
          echo "== $t" | tee -a $OUT/table2.log; state
          python3 -m tallow.cli bench -m /root/twins/$t.gguf --device cuda -p 33,512 -n 128 -r 3 2>&1 | grep "^  " | tee -a $OUT/table2.log
          llama_json /root/twins/$t.gguf -p 33,512 -n 128 -r 5 | tee -a $OUT/table2.log
        done ;;
    gemma4) for m in e2b e4b; do
          echo "== gemma4-$m" | tee -a $OUT/gemma4.log; state
          python3 -m tallow.cli bench -m /root/twins/gemma4-$m.gguf --device cuda -p 33,512 -n 128 -r 3 2>&1 | grep "^  \|rror" | tee -a $OUT/gemma4.log
          python3 -m tallow.cli bench -m /root/twins/gemma4-$m.gguf --device cuda -p 0 -n 128 -d 4096,32768 -r 2 2>&1 | grep "^  \|rror" | tee -a $OUT/gemma4.log
          llama_json /root/twins/gemma4-$m.gguf -p 33,512 -n 128 -r 4 | tee -a $OUT/gemma4.log
          llama_json /root/twins/gemma4-$m.gguf -p 0 -n 128 -d 4096,32768 -r 2 | tee -a $OUT/gemma4.log
        done ;;
    gemma4_tallow) gemma4_twins; for m in e2b e4b; do
          echo "== gemma4-$m" | tee -a $OUT/gemma4_tallow.log; state
          python3 -m tallow.cli bench -m /root/twins/gemma4-$m.gguf --device cuda -p 33,512 -n 128 -r 3 2>&1 | grep "^  \|rror" | tee -a $OUT/gemma4_tallow.log
          python3 -m tallow.cli bench -m /root/twins/gemma4-$m.gguf --device cuda -p 0 -n 128 -d 4096,32768 -r 2 2>&1 | grep "^  \|rror" | tee -a $OUT/gemma4_tallow.log
        done ;;
    depth2) echo "== qwen3-4b depth" | tee -a $OUT/depth2.log
        python3 -m tallow.cli bench -m /root/twins/qwen3-4b.gguf --device cuda -p 0 -n 128 -d 0,32768 -r 2 2>&1 | grep "^  \|rror" | tee -a $OUT/depth2.log
        llama_json /root/twins/qwen3-4b.gguf -p 0 -n 128 -d 0,32768 -r 2 | tee -a $OUT/depth2.log ;;
    exact) twins smollm2-135m qwen3-4b
        python3 scripts/gpu_speculate.py /root/twins/smollm2-135m.gguf /root/twins/qwen3-4b.gguf --reps 5 2>&1 | tee $OUT/speculate.log
        python3 scripts/gpu_check.py --twins .twins2 --work /root/twins --parity --only smollm2-135m 2>&1 | tee $OUT/parity.log
        python3 scripts/gpu_gemma4_check.py 2>&1 | tee $OUT/gemma4_check.log ;;
  esac
done
state
