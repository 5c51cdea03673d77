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

# Rounds alternate the three commands (one hyperfine call per round, each
# command once), so that the drift of a shared disk hits all of them alike.
for r in $(seq 1 "$runs"); do
    hyperfine --runs 1 --export-json "$dir/round$r.json" --style basic \
        --prepare "rm -rf $dst/store $dst/cp; sync; sleep 1; cat $src/* > /dev/null" \
        -n import "$bin import $src --store $dst/store --quiet" \
        -n cp "cp -r $src $dst/cp" \
        -n cp+sync "cp -r $src $dst/cp && sync" >&2
done

python3 - "$dir" "$runs" "$bytes" <<'PY'
import json, statistics, sys
d, runs, b = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
t = {"import": [], "cp": [], "cp+sync": []}
for r in range(1, runs + 1):
    for x in json.load(open(f"{d}/round{r}.json"))["results"]:
        t[x["command"]].append(x["times"][0])
med = {k: statistics.median(v) for k, v in t.items()}
for k in ("import", "cp", "cp+sync"):
    print(f"{k:8s} median {med[k]:6.2f} s  {b / med[k] / 1e9:5.2f} GB/s   runs {' '.join('%.2f' % x for x in t[k])}")
r_cp = statistics.median([c / i for i, c in zip(t["import"], t["cp"])])
r_cs = statistics.median([c / i for i, c in zip(t["import"], t["cp+sync"])])
print(f"import/cp throughput ratio: {med['cp'] / med['import']:.2f}x of medians, {r_cp:.2f}x median of per-round ratios")
print(f"import/(cp+sync) ratio:     {med['cp+sync'] / med['import']:.2f}x of medians, {r_cs:.2f}x median of per-round ratios")
PY
