#!/usr/bin/env bash
# bench/bench_cold_start.sh - whole-process cold start on the CPU: from exec to
# the first token printed, `lmstore run MODEL -p PROMPT --max-tokens 1`
# against llama.cpp's llama-completion on the same weights as GGUF of the
# same dtype (-n 1, prompt not echoed, no warm-up run), alternating A/B
# round by round in one run, page cache warm and dropped.
#
#   bench/bench_cold_start.sh LLAMA_BUILD_DIR [--lmstore BIN] [--work DIR]
#       [--rounds R] [--threads T] [--models "smollm2 qwen3-0.6b"] [--no-drop] [--omp-active]
#
# LLAMA_BUILD_DIR: a llama.cpp CMake build folder with bin/llama-completion
# (llama.cpp's source comes with the PyPI sdist of llama-cpp-python, in
# vendor/llama.cpp; build it outside this repository). BIN: the lmstore CLI
# (default build/lmstore; a build without CUDA, -DLMS_CUDA=OFF, is the one
# comparable to a CPU build of llama.cpp: a CUDA build also loads cuBLAS at
# exec). Models: smollm2 is the quick-start SmolLM2-135M-Instruct
# (models/smollm2-135m-instruct, tools/quickstart.sh fetches it); qwen3-0.6b
# is Qwen3-0.6B-shaped with random bf16 weights (tests/gen_model.py) and
# Qwen3's real tokenizer (tests/fixtures/tokenizers/). GGUFs are written by
# bench/hf_to_gguf.py (PyPI gguf). Both engines get T threads (default 2).
# Contexts, each a row of the table: "fit" - lmstore run as it is (it sizes
# its context to what the prompt and --max-tokens can reach) and llama.cpp
# with -c 256 (it has no such default: without -c it takes the model's whole
# trained context); "4096" - both --ctx / -c 4096 (lmstore's default for
# longer requests).
# Dropping the page cache (echo 3 > /proc/sys/vm/drop_caches) needs root;
# --no-drop skips that half. llama.cpp's OpenMP threads run with
# OMP_WAIT_POLICY=passive (--omp-active: its default, spinning), which is its
# faster setting wherever other processes share the cores: spinning threads
# then wait for descheduled ones (5 tokens took 0.9-3.2 s instead of 0.13-0.18
# s on the 2-CPU machine of bench/RESULTS.md). Timing: bench/cold_start.py
# (first byte on stdout). Prints a markdown table (medians, min-max, ratio of medians); the
# raw JSON lines and the metrics lmstore prints go to WORK/cold_start.log.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
if [ $# -lt 1 ] || [ "${1#-}" != "$1" ]; then
  awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"
  exit 2
fi
llama=$(cd "$1" && pwd)
shift
lms=$src/build/lmstore
work=$src/build/bench-cold-start
rounds=10
threads=2
models="smollm2 qwen3-0.6b"
drop=1
omp=passive
while [ $# -gt 0 ]; do
  case $1 in
    --lmstore) lms=$(readlink -f "$2"); shift 2 ;;
    --work) work=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    --no-drop) drop=0; shift ;;
    --omp-active) omp=active; shift ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
completion=$llama/bin/llama-completion
[ -x "$completion" ] || { echo "no $completion" >&2; exit 1; }
[ -x "$lms" ] || { echo "no $lms" >&2; exit 1; }
py=python3
if ! $py -c 'import numpy, gguf' 2>/dev/null; then
  py=$src/.venv-test/bin/python # tests/run.sh makes it
fi
mkdir -p "$work"
log=$work/cold_start.log
store=$work/store
prompt="The capital of France is"
: >"$log"

prepare() { # model -> HF folder in $work/hf-NAME, imported as NAME, GGUF in $work/NAME.gguf
  local m=$1 hf=$work/hf-$1
  case $m in
    smollm2)
      hf=$src/models/smollm2-135m-instruct
      [ -f "$hf/model.safetensors" ] || { echo "no $hf (tools/quickstart.sh fetches it)" >&2; exit 1; } ;;
    qwen3-0.6b)
      [ -f "$hf/config.json" ] || $py "$src/tests/gen_model.py" "$hf" --arch qwen3 --hidden 1024 --intermediate 3072 \
        --layers 28 --heads 16 --kv-heads 8 --head-dim 128 --vocab 151936 --max-pos 40960 --tied --dtype BF16 \
        --shard-size 2G --tokenizer "$src/tests/fixtures/tokenizers/qwen3" --force >/dev/null 2>>"$log" ;;
    *) echo "unknown model $m" >&2; exit 2 ;;
  esac
  "$lms" ls --store "$store" 2>/dev/null | grep -q "^$m " ||
    "$lms" import "$hf" --store "$store" --name "$m" >>"$log" 2>&1
  [ -f "$work/$m.gguf" ] || $py "$src/bench/hf_to_gguf.py" "$hf" "$work/$m.gguf" >>"$log" 2>&1
}

{
  echo "# $(date -u +%FT%TZ) $(uname -n) $(nproc) CPUs; load average $(cut -d' ' -f1-3 /proc/loadavg)"
  echo "# lmstore: $lms ($("$lms" version 2>/dev/null | head -n1))"
  echo "# llama.cpp: $completion (OMP_WAIT_POLICY=$omp)"
} >>"$log"
results=$work/results.jsonl
: >"$results"
for m in $models; do
  prepare "$m"
  for ctx in fit 4096; do
    lms_cmd=("$lms" run "$m" --store "$store" -p "$prompt" --max-tokens 1 --threads "$threads")
    llama_cmd=(env OMP_WAIT_POLICY=$omp "$completion" -m "$work/$m.gguf" -p "$prompt" -n 1 -no-cnv
               --no-display-prompt --no-warmup -t "$threads")
    if [ $ctx = fit ]; then
      llama_cmd+=(-c 256)
    else
      lms_cmd+=(--ctx "$ctx")
      llama_cmd+=(-c "$ctx")
    fi
    # what lmstore run spends before the first token (its metrics line, and
    # the engine's start-up phases at LMSTORE_LOG=debug)
    for i in 1 2; do
      LMSTORE_LOG=debug "${lms_cmd[@]}" 2>&1 >/dev/null | grep -E "engine created|load .* ms" |
        sed "s/^/# $m ctx $ctx: /" >>"$log"
    done
    for cache in warm dropped; do
      [ $cache = dropped ] && [ $drop = 0 ] && continue
      dflag=
      [ $cache = dropped ] && dflag=--drop
      "${lms_cmd[@]}" >/dev/null 2>&1 && "${llama_cmd[@]}" >/dev/null 2>&1 # both once, untimed
      for r in $(seq "$rounds"); do
        $py "$src/bench/cold_start.py" --reps 1 --label "$m $ctx $cache lmstore" $dflag -- "${lms_cmd[@]}" |
          tee -a "$log" >>"$results"
        $py "$src/bench/cold_start.py" --reps 1 --label "$m $ctx $cache llama.cpp" $dflag -- "${llama_cmd[@]}" |
          tee -a "$log" >>"$results"
      done
    done
  done
done
echo "# load average at the end $(cut -d' ' -f1-3 /proc/loadavg)" >>"$log"
$py - "$results" <<'EOF'
import json, statistics, sys
rows = {}
for line in open(sys.argv[1]):
    r = json.loads(line)
    if "error" in r:
        print("error:", r); continue
    m, ctx, cache, side = r["label"].split(" ")
    rows.setdefault((m, ctx, cache), {}).setdefault(side, []).extend(r["all"])
print("| model | context | page cache | lmstore run: first token, s (median, min-max) | llama.cpp: first token, s "
      "| llama.cpp / lmstore | rounds |")
print("|---|---|---|---|---|---|---|")
for (m, ctx, cache), s in rows.items():
    a, b = s.get("lmstore", []), s.get("llama.cpp", [])
    if not a or not b:
        continue
    ma, mb = statistics.median(a), statistics.median(b)
    print(f"| {m} | {ctx} | {cache} | {ma:.3f} ({min(a):.3f}-{max(a):.3f}) | {mb:.3f} ({min(b):.3f}-{max(b):.3f}) | "
          f"{mb / ma:.1f}x | {min(len(a), len(b))} |")
EOF
echo "(log: $log)"
