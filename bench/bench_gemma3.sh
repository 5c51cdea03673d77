#!/usr/bin/env bash
# bench/bench_gemma3.sh - decode of a gemma-3-1b-shaped BF16 model: lmstore's
# engine against llama.cpp on the same weights as a BF16 GGUF, alternating
# A and B in one run (this kind of machine's memory bandwidth swings minute
# to minute, so each figure has its peer's measured next to it).
#
# Makes the model with random weights (tests/gen_model.py: 26 layers, hidden
# 1152, MLP 6912, 4 heads / 1 KV head of 256, vocab 262144, tied, window 512,
# every 6th layer global), imports it into a store (lmstore import), writes
# the same matrices as GGUF (bench/gemma3_gguf.py), then per round:
#   A: bench/bench_engine: prefill PROMPT random tokens, decode DECODE greedily
#   B: llama-bench -p 0 -n DECODE -d PROMPT (DECODE tokens after PROMPT of context)
# with the same threads and F16 K/V (both defaults). Prints one line per
# round and the medians; ratio = lmstore decode tok/s / llama.cpp's. The
# paired per-round ratio is the figure to read: on a shared VM the memory
# bandwidth both engines live on can change several-fold between rounds.
#
# usage: bench/bench_gemma3.sh --llama-bench PATH [--build DIR] [--work DIR]
#                              [--threads T] [--rounds R] [--prompt P] [--decode D]
# Needs: a build with the lmstore CLI and bench_engine, llama-bench (llama.cpp,
# built by the user), python3 with numpy, safetensors and gguf. The work
# folder keeps the model, the store and the GGUF (about 6 GB) between runs.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${LMS_BUILD_DIR:-$src/build}
work=${LMS_BENCH_DIR:-${TMPDIR:-/tmp}/lmstore-bench-gemma3}
threads=2
rounds=5
prompt=128
decode=64
lb=""
while [ $# -gt 0 ]; do
  case $1 in
    --llama-bench) lb=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --prompt) prompt=$2; shift 2 ;;
    --decode) decode=$2; shift 2 ;;
    *) echo "usage: $0 --llama-bench PATH [--build DIR] [--work DIR] [--threads T] [--rounds R] [--prompt P] [--decode D]" >&2; exit 2 ;;
  esac
done
[ -x "$lb" ] || { echo "bench_gemma3.sh: --llama-bench PATH (llama.cpp's llama-bench) is required" >&2; exit 2; }
for b in lmstore bench_engine; do
  [ -x "$build/$b" ] || { echo "bench_gemma3.sh: $build/$b not built (cmake --build $build)" >&2; exit 1; }
done
py=${PYTHON:-python3}
mkdir -p "$work"
m=gemma-3-1b
if [ ! -f "$work/$m/config.json" ]; then
  "$py" "$src/tests/gen_model.py" "$work/$m" --arch gemma3 --hidden 1152 --intermediate 6912 --layers 26 \
    --heads 4 --kv-heads 1 --head-dim 256 --vocab 262144 --max-pos 32768 --tied --window 512 \
    --dtype BF16 --shard-size 2G --force 2>/dev/null
fi
store=$work/store
if ! "$build/lmstore" info --store "$store" "$m" >/dev/null 2>&1; then
  "$build/lmstore" import --store "$store" "$work/$m" --name "$m" >/dev/null
fi
gguf=$work/$m-bf16.gguf
[ -f "$gguf" ] || "$py" "$src/bench/gemma3_gguf.py" "$work/$m" "$gguf"
cat "$work/$m"/*.safetensors "$gguf" > /dev/null # page cache warm: decode reads memory, not disk

echo "# bench_gemma3.sh: $(date -u +%Y-%m-%dT%H:%MZ), $(uname -n), $(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //'), $(nproc) CPUs, threads $threads"
echo "# command: bench/bench_gemma3.sh --threads $threads --rounds $rounds --prompt $prompt --decode $decode"
echo "# round  lmstore_decode_tps  llamacpp_decode_tps  ratio"
as=() bs=()
for r in $(seq 1 "$rounds"); do
  a=$("$build/bench_engine" --store "$store" --model "$m" --threads "$threads" --prompt "$prompt" --decode "$decode" --reps 1 |
      "$py" -c 'import json,sys; print("%.3f" % json.load(sys.stdin)["decode_tps"])')
  b=$("$lb" -m "$gguf" -t "$threads" -p 0 -n "$decode" -d "$prompt" -r 1 -o json 2>/dev/null |
      "$py" -c 'import json,sys; print("%.3f" % [x for x in json.load(sys.stdin) if x["n_gen"] > 0][0]["avg_ts"])')
  as+=("$a") bs+=("$b")
  echo "$r  $a  $b  $("$py" -c "print('%.3f' % ($a / $b))")"
done
"$py" - "${as[*]}" "${bs[*]}" <<'PY'
import statistics, sys
a = [float(x) for x in sys.argv[1].split()]
b = [float(x) for x in sys.argv[2].split()]
ma, mb = statistics.median(a), statistics.median(b)
r = [x / y for x, y in zip(a, b)]
print(f"median: lmstore {ma:.3f} tok/s, llama.cpp {mb:.3f} tok/s, ratio of medians {ma / mb:.3f}; "
      f"median of the per-round ratios {statistics.median(r):.3f} (range {min(r):.3f} .. {max(r):.3f}, "
      f"{sum(x >= 0.9 for x in r)} of {len(r)} rounds at 0.9 or more)")
PY
