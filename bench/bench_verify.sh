#!/usr/bin/env bash
# bench/bench_verify.sh - `lmstore verify` throughput against reading the same
# bytes: generates a model of SIZE (default 4.2G) bf16 weights, imports it,
# then hyperfine runs, alternating in rounds within one session,
#   verify: lmstore verify (index checks + XXH3-128 of every blob, all CPUs)
#   cat:    cat of the store's segment files > /dev/null (the same bytes)
# with the page cache warm for both (the store is read once first), and
# prints each and the ratio verify time / cat time (goal: <= 1.5).
# Deletes everything it wrote.
#
# usage: bench/bench_verify.sh [BUILD_DIR] [SIZE] [ROUNDS]
#   env: BENCH_DIR (scratch folder, default ${TMPDIR:-/tmp}/lmstore-bench-verify)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
size=${2:-4.2G}
rounds=${3:-3}
bin=$build/lmstore
dir=${BENCH_DIR:-${TMPDIR:-/tmp}/lmstore-bench-verify}
command -v hyperfine >/dev/null || { echo "hyperfine is needed" >&2; exit 1; }
[ -x "$bin" ] || { echo "no lmstore at $bin (build first)" >&2; exit 1; }

cleanup() { rm -rf "$dir"; }
trap cleanup EXIT
rm -rf "$dir"
mkdir -p "$dir"

python3 "$here/tests/gen_model.py" "$dir/src" --force --arch llama --hidden 2048 --intermediate 5632 \
    --heads 16 --kv-heads 4 --vocab 32000 --target-size "$size" --shard-size 1G --seed 1 >/dev/null
"$bin" import "$dir/src" --store "$dir/store" --quiet
rm -rf "$dir/src" # only the store's copy stays in the page cache
bytes=$(du -cb "$dir"/store/segments/*.seg | tail -1 | cut -f1)
cat "$dir"/store/segments/*.seg > /dev/null
echo "store: $bytes bytes in $(ls "$dir"/store/segments | wc -l) segments; $(nproc) CPUs" >&2

for r in $(seq 1 "$rounds"); do
  hyperfine --warmup 1 --runs 3 --export-json "$dir/round$r.json" \
      -n verify "$bin verify --store $dir/store --quiet" \
      -n cat "cat $dir/store/segments/*.seg > /dev/null" >&2
done

python3 - "$bytes" "$dir"/round*.json <<'PY'
import json, statistics, sys
b = int(sys.argv[1])
t = {"verify": [], "cat": []}
for f in sys.argv[2:]:
    for x in json.load(open(f))["results"]:
        t[x["command"]] += x["times"]
med = {k: statistics.median(v) for k, v in t.items()}
for k in ("verify", "cat"):
    print(f"{k:7s} median {med[k]:.3f} s ({b / med[k] / 1e9:.2f} GB/s) over {len(t[k])} runs")
print(f"verify time / cat time = {med['verify'] / med['cat']:.2f} (goal <= 1.5)")
PY
