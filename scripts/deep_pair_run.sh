#!/bin/sh
# The deep pairs of issue 17's CPU table, model after model (scripts/deep_pair_tallow.py fill beside
# scripts/deep_pair_llama.py with PAIR=1: both fill on one thread each at autogroup nice 19, and each depth is
# timed in one exclusive hold, llama.cpp, tallow, llama.cpp, with the tallow fill stopped for the hold).
#   setsid sh scripts/deep_pair_run.sh OUT_DIR "MODEL:DEPTHS" ...   e.g. /tmp/twins/mamba-1.4b.gguf:1024,4096,16384,32768
cd "$(dirname "$0")/.." || exit 1
out=$1; shift
echo 19 > /proc/$$/autogroup   # this session's group (the fills, the server between holds) yields to everyone else's
for spec in "$@"; do
  m=${spec%%:*}; depths=${spec#*:}; name=$(basename "$m" .gguf)
  dir=$out/$name; mkdir -p "$dir"; rm -f "$dir/filled.json" "$dir/tokens.json"
  echo "### $name $depths $(date -u +%H:%M:%S)"
  DIR=$dir MODEL=$m DEPTHS=$depths OMP_NUM_THREADS=1 PYTHONPATH=$PWD nice -n 19 python scripts/deep_pair_tallow.py fill > "$dir/fill.log" 2>&1 &
  fill=$!
  while [ ! -s "$dir/tokens.json" ] && kill -0 $fill 2>/dev/null; do sleep 2; done
  DIR=$dir MODEL=$m DEPTHS=$depths PAIR=1 PAUSE="$fill" PYTHONPATH=$PWD python scripts/deep_pair_llama.py ${R:-3} > "$dir/pair.log" 2>&1
  wait $fill
  grep -h '^{' "$dir/pair.log"
done
echo "### done $(date -u +%H:%M:%S)"
