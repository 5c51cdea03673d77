#!/usr/bin/env bash
# bench/bench_engine.sh - engine throughput against the memory-bandwidth roofline.
#
# Makes Qwen3-0.6B-shaped and Llama-3.2-1B-shaped bf16 models with random
# weights (tests/gen_model.py), imports them into a store (lmstore import),
# and for each model alternates, ROUNDS times, a STREAM-like read-bandwidth
# probe (bench/membw.c) and the engine (bench/bench_engine.c: prefill of
# PROMPT tokens, then DECODE greedy tokens) with the same threads, so that
# each decode figure has a bandwidth figure measured next to it (this kind
# of machine's bandwidth swings minute to minute). Prints one line per round
# and a summary per model:
#   roofline tok/s = read bandwidth / weight bytes read per decode token
#   fraction       = measured decode tok/s / roofline tok/s
#
# usage: bench/bench_engine.sh [--build DIR] [--work DIR] [--threads T]
#                              [--rounds R] [--prompt P] [--decode D] [--models "qwen3-0.6b llama-3.2-1b"]
# Needs: a build with the lmstore CLI, bench_engine and membw (cmake --build DIR),
# python3 with numpy (for the generator). The work folder keeps the models
# between runs (delete it when done: about 4 GB).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${LMS_BUILD_DIR:-$src/build}
work=${LMS_BENCH_DIR:-${TMPDIR:-/tmp}/lmstore-bench-engine}
threads=$(nproc)
rounds=3
prompt=128
decode=32
models="qwen3-0.6b llama-3.2-1b"
while [ $# -gt 0 ]; do
  case $1 in
    --build) build=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --prompt) prompt=$2; shift 2 ;;
    --decode) decode=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    *) echo "usage: $0 [--build DIR] [--work DIR] [--threads T] [--rounds R] [--prompt P] [--decode D] [--models LIST]" >&2; exit 2 ;;
  esac
done
for b in lmstore bench_engine membw; do
  [ -x "$build/$b" ] || { echo "bench_engine.sh: $build/$b not built (cmake --build $build)" >&2; exit 1; }
done
mkdir -p "$work"
store=$work/store

gen() { # name -> model folder in $work/name
  local name=$1 dir=$work/$1
  [ -f "$dir/config.json" ] && return 0
  case $name in
    qwen3-0.6b) args="--arch qwen3 --hidden 1024 --intermediate 3072 --layers 28 --heads 16 --kv-heads 8 --head-dim 128 --vocab 151936 --max-pos 40960 --tied" ;;
    llama-3.2-1b) args="--arch llama --hidden 2048 --intermediate 8192 --layers 16 --heads 32 --kv-heads 8 --head-dim 64 --vocab 128256 --max-pos 131072 --tied" ;;
    llama-3-8b) args="--arch llama --hidden 4096 --intermediate 14336 --layers 32 --heads 32 --kv-heads 8 --head-dim 128 --vocab 128256 --max-pos 8192" ;;
    *) echo "unknown model $name" >&2; exit 2 ;;
  esac
  python3 "$src/tests/gen_model.py" "$dir" $args --dtype BF16 --shard-size 2G --force >/dev/null
}

echo "# bench_engine.sh: $(date -u +%Y-%m-%dT%H:%MZ), $(uname -n), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs, threads $threads"
echo "# command: bench/bench_engine.sh --threads $threads --rounds $rounds --prompt $prompt --decode $decode --models \"$models\""
for m in $models; do
  gen "$m"
  if ! "$build/lmstore" info --store "$store" "$m" >/dev/null 2>&1; then
    "$build/lmstore" import --store "$store" "$work/$m" --name "$m" >/dev/null
  fi
  # warm the page cache: decode reads weights from memory, not from disk
  cat "$work/$m"/*.safetensors > /dev/null
  bws=() decs=() pres=() fracs=()
  for r in $(seq 1 "$rounds"); do
    bw=$("$build/membw" --threads "$threads" --mib 2048 --reps 5 --json)
    out=$("$build/bench_engine" --store "$store" --model "$m" --threads "$threads" --prompt "$prompt" --decode "$decode" --reps 1)
    bw2=$("$build/membw" --threads "$threads" --mib 2048 --reps 5 --json)
    line=$(python3 - "$bw" "$out" "$bw2" <<'PY'
import json, sys
a, o, b = (json.loads(x) for x in sys.argv[1:4])
bw = (a["median_gbs"] + b["median_gbs"]) / 2           # bandwidth around the run
roof = bw * 1e9 / o["weight_bytes_per_token"]
print(f'{bw:.2f} {o["decode_tps"]:.3f} {o["prefill_tps"]:.2f} {roof:.3f} {o["decode_tps"] / roof:.3f} '
      f'{o["weight_bytes_per_token"]} {o["kernels"]} {o["peak_rss"]}')
PY
)
    set -- $line
    echo "$m round $r: read bandwidth $1 GB/s -> roofline $4 tok/s; decode $2 tok/s ($(python3 -c "print(f'{100*$5:.0f}')")% of roofline); prefill $3 tok/s; weights/token $(( $6 / 1000000 )) MB; kernels $7"
    bws+=("$1"); decs+=("$2"); pres+=("$3"); fracs+=("$5")
  done
  python3 - "$m" "${bws[*]}" "${decs[*]}" "${pres[*]}" "${fracs[*]}" <<'PY'
import statistics as st, sys
m = sys.argv[1]
bw, dec, pre, fr = ([float(x) for x in s.split()] for s in sys.argv[2:6])
print(f"{m} summary: median of {len(fr)} rounds: bandwidth {st.median(bw):.2f} GB/s, decode {st.median(dec):.2f} tok/s, "
      f"prefill {st.median(pre):.1f} tok/s, decode at {100*st.median(fr):.0f}% of the roofline (rounds: "
      + ", ".join(f"{100*x:.0f}%" for x in fr) + ")")
PY
done
