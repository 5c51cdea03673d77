#!/usr/bin/env bash
# bench/bench_engine_gpuhost.sh - the engine's CPU throughput on a many-core
# host (the GPU machine's CPUs) for a Llama-3-8B-shaped bf16 model, against
# the read bandwidth measured next to each round (bench/bench_engine.sh).
#
# The model is made with transformers on the GPU (random init, save_pretrained
# in 5 GB shards; bench/bench_load_hf.py make), which takes seconds where the
# numpy generator would take minutes for 16 GB.
#   LMS_BUILD_DIR=DIR bench/bench_engine_gpuhost.sh [WORKDIR]
#   THREADS=N (default: all CPUs), ROUNDS=R (default 3)
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
work=${1:-${TMPDIR:-/tmp}/lmstore-bench-engine-8b}
mkdir -p "$work"
if [ ! -f "$work/llama-3-8b/config.json" ]; then
  python3 "$src/bench/bench_load_hf.py" make "$work/llama-3-8b"
fi
exec "$src/bench/bench_engine.sh" --work "$work" --models llama-3-8b --threads "${THREADS:-$(nproc)}" \
  --rounds "${ROUNDS:-3}" --prompt 64 --decode 16
