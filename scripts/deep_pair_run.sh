#!/bin/sh
# The deep pairs of issue 17's CPU table, model after model: first scripts/deep_pair_tallow.py fills every depth on
# both cores (saving the pool and state at each), then scripts/deep_pair_llama.py with PAIR=1 fills the same token ids
# in llama-server on both cores and, at each depth, times llama.cpp, tallow (hydrating that depth's file), llama.cpp in
# one exclusive hold of /tmp/cpu.lock. One engine after the other on two threads, not side by side on one each: the
# faster filler's core would otherwise idle while the other finishes (llama-server fills Mamba-1.4B at 35 tok/s on one
# thread, tallow at ~100). Both fills run at autogroup nice 19, yielding to everyone else's work.
#   setsid sh scripts/deep_pair_run.sh OUT_DIR "MODEL:DEPTHS" ...   e.g. /tmp/twins/mamba-1.4b.gguf:1024,4096,16384,32768
cd "$(dirname "$0")/.." || exit 1
out=$1; shift
echo 19 > /proc/$$/autogroup   # this session's group (the fills, the server between holds) yields to everyone else's
for spec in "$@"; do
  m=${spec%%:*}; depths=${spec#*:}; name=$(basename "$m" .gguf)
  dir=$out/$name; mkdir -p "$dir"; rm -f "$dir/filled.json" "$dir/tokens.json"
  printf '{"model": "%s"}\n' "$(realpath "$m")" > "$dir/model.json"  # for deep_pair_table.py's plan column
  echo "### $name $depths $(date -u +%H:%M:%S)"
  DIR=$dir MODEL=$m DEPTHS=$depths OMP_NUM_THREADS=2 PYTHONPATH=$PWD nice -n 19 python scripts/deep_pair_tallow.py fill > "$dir/fill.log" 2>&1
  echo "### $name tallow filled $(date -u +%H:%M:%S)"
  DIR=$dir MODEL=$m DEPTHS=$depths PAIR=1 TB=2 PYTHONPATH=$PWD python scripts/deep_pair_llama.py ${R:-3} > "$dir/pair.log" 2>&1
  grep -h '^{' "$dir/pair.log"
done
echo "### done $(date -u +%H:%M:%S)"
