#!/usr/bin/env bash
# bench/bench_tokenizer_open.sh - the cost of opening a stored model's
# tokenizer, compiled image against tokenizer.json, for the real Gemma 3
# (262,145 ids), Qwen3 and Llama 3 tokenizers (tests/fixtures/tokenizers/):
# each on a tiny random model (tests/gen_model.py), imported into a scratch
# store, timed by bench_tokenizer_open (bench/bench_tokenizer_open.c).
#
#   bench/bench_tokenizer_open.sh [BUILD_DIR] [--reps R]
#
# One JSON line per tokenizer (milliseconds, medians with min and max).
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=$src/build
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
  build=$(cd "$1" && pwd)
  shift
fi
reps=20
[ "${1:-}" = --reps ] && reps=$2
py=python3
$py -c 'import numpy' 2>/dev/null || py=$src/.venv-test/bin/python
work=$build/bench-tokenizer-open
rm -rf "$work"
mkdir -p "$work"
for tok in gemma3 qwen3 llama3; do
  $py "$src/tests/gen_model.py" "$work/$tok" --arch llama --hidden 32 --layers 1 \
    --tokenizer "$src/tests/fixtures/tokenizers/$tok" --force >/dev/null 2>&1
  "$build/lmstore" import "$work/$tok" --store "$work/store" --name "$tok" -q
  "$build/bench_tokenizer_open" "$work/store" "$tok" --reps "$reps"
done
