#!/usr/bin/env bash
# bench/bench_import.sh - import throughput against cp: generates a model of
# SIZE (default 4.2G) bf16 weights in shards, warms the page cache with it,
# then hyperfine runs, side by side in one session, `lmstore import` into a
# fresh store and `cp -r` of the same shards to the same filesystem (and
# `cp -r` followed by `sync`, since import makes its data durable with fsync
# before it commits). Prints the ratios; deletes everything it wrote.
#
# usage: bench/bench_import.sh [BUILD_DIR] [SIZE] [RUNS]
#   env: BENCH_DIR (scratch folder, default ${TMPDIR:-/tmp}/lmstore-bench-import)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
size=${2:-4.2G}
runs=${3:-5}
bin=$build/lmstore
dir=${BENCH_DIR:-${TMPDIR:-/tmp}/lmstore-bench-import}
src=$dir/src
dst=$dir/dst
command -v hyperfine >/dev/null || { echo "hyperfine is needed" >&2; exit 1; }
[ -x "$bin" ] || { echo "no lmstore at $bin (build first)" >&2; exit 1; }

cleanup() { rm -rf "$dir"; }
trap cleanup EXIT
rm -rf "$dir"
mkdir -p "$src" "$dst"

python3 "$here/tests/gen_model.py" "$src" --force --arch llama --hidden 2048 --intermediate 5632 \
    --heads 16 --kv-heads 4 --vocab 32000 --target-size "$size" --shard-size 1G --seed 1
bytes=$(du -cb "$src"/*.safetensors | tail -1 | cut -f1)
cat "$src"/* > /dev/null # page cache warm
echo "model: $(ls "$src" | wc -l) files, $bytes bytes of safetensors; $(nproc) CPUs" >&2

hyperfine --runs "$runs" --export-json "$dir/hf.json" \
    --prepare "rm -rf $dst/store $dst/cp; sync; cat $src/* > /dev/null" \
    -n import "$bin import $src --store $dst/store --quiet" \
    -n cp "cp -r $src $dst/cp" \
    -n cp+sync "cp -r $src $dst/cp && sync"

python3 - "$dir/hf.json" "$bytes" <<'PY'
import json, statistics, sys
r = {x["command"]: x for x in json.load(open(sys.argv[1]))["results"]}
b = int(sys.argv[2])
med = {k: statistics.median(v["times"]) for k, v in r.items()}
for k in ("import", "cp", "cp+sync"):
    print(f"{k:8s} median {med[k]:.3f} s  ({b / med[k] / 1e9:.2f} GB/s)  runs {['%.2f' % t for t in r[k]['times']]}")
print(f"import throughput / cp throughput      = {med['cp'] / med['import']:.2f}x")
print(f"import throughput / (cp + sync)        = {med['cp+sync'] / med['import']:.2f}x")
PY
