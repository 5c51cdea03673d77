#!/usr/bin/env bash
# bench/bench_serve.sh - aggregate decode throughput of `lmstore serve`
# against llama.cpp's llama-server on the same model, at several numbers of
# concurrent streaming clients, measured alternately in one run.
#
# The model: SmolLM2-135M-Instruct (models/smollm2-135m-instruct, as
# tools/quickstart.sh fetches it), imported into a scratch store and written
# as one BF16 GGUF by `lmstore export` for llama-server: both servers compute
# over the same bf16 weights. Each server runs with --parallel C (as many
# slots as clients), THREADS threads and CTX tokens of context per slot
# (llama-server: -c C*CTX, which it splits over its slots).
#
# For each C in CLIENTS and each of ROUNDS rounds (lmstore first in odd
# rounds, llama-server first in even ones), a server is started, warmed with
# one request, and driven by bench/serve_load.py: C clients send greedy
# streamed completions (ignore_eos, 128 tokens) back to back; the token
# events received in a SECONDS window after a warm-up are the aggregate
# decode tok/s. Prints each measurement (with the load average) and, per C,
# the median over rounds of both and their ratio (lmstore / llama-server).
#
# usage: bench/bench_serve.sh [--llama DIR] [--clients "1 4 16 64"] [--rounds N] [--seconds S]
#            [--threads T] [--ctx N] [--work DIR]
# --llama: the folder holding llama-server (default $LLAMACPP_DIR/build/bin); build it with
#   cmake --build LLAMACPP/build --target llama-server
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${LMS_BUILD_DIR:-$src/build}
lms=$build/lmstore
llama=${LLAMACPP_DIR:-${TMPDIR:-/tmp}/lmstore-llamacpp}/build/bin
work=${LMS_BENCH_DIR:-${TMPDIR:-/tmp}/lmstore-bench-serve}
clients="1 4 16 64"
rounds=2
seconds=15
threads=2
ctx=256
while [ $# -gt 0 ]; do
  case $1 in
    --llama) llama=$2; shift 2 ;;
    --clients) clients=$2; shift 2 ;;
    --rounds) rounds=$2; shift 2 ;;
    --seconds) seconds=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --ctx) ctx=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
py=${PYTHON:-python3}
[ -x "$src/.venv-test/bin/python" ] && py=${PYTHON:-$src/.venv-test/bin/python}
model_dir=$src/models/smollm2-135m-instruct
[ -f "$model_dir/model.safetensors" ] || { echo "no $model_dir: run tools/quickstart.sh" >&2; exit 1; }
[ -x "$llama/llama-server" ] || { echo "no $llama/llama-server (--llama DIR)" >&2; exit 1; }
mkdir -p "$work"
store=$work/store
gguf=$work/smollm2-bf16.gguf
"$lms" info --store "$store" smollm2 >/dev/null 2>&1 || "$lms" import --store "$store" "$model_dir" --name smollm2 >/dev/null
[ -f "$gguf" ] || "$lms" export --store "$store" smollm2 "$gguf" >/dev/null
cat "$gguf" "$store"/segments/* >/dev/null # warm the page cache

pid=
stop_server() { if [ -n "$pid" ]; then kill -TERM "$pid" 2>/dev/null || true; wait "$pid" 2>/dev/null || true; pid=; fi; }
trap stop_server EXIT

wait_ready() { # URL: until /health answers 200
  for _ in $(seq 600); do
    curl -sf "$1/health" >/dev/null 2>&1 && return 0
    sleep 0.1
  done
  echo "server at $1 did not start" >&2; return 1
}

port=18431
measure() { # server clients -> tok/s
  local who=$1 c=$2 url out
  port=$((port + 1))
  url=http://127.0.0.1:$port
  if [ "$who" = lmstore ]; then
    "$lms" serve smollm2 --store "$store" --port $port --parallel "$c" --max-queue "$c" --ctx "$ctx" \
      --threads "$threads" 2>"$work/serve.log" &
  else
    "$llama/llama-server" -m "$gguf" --host 127.0.0.1 --port $port -np "$c" -c $((c * ctx)) -t "$threads" \
      -tb "$threads" --no-webui >"$work/llama-server.log" 2>&1 &
  fi
  pid=$!
  wait_ready "$url"
  curl -sf "$url/v1/completions" -H 'Content-Type: application/json' \
    -d '{"prompt": "Hello", "max_tokens": 8, "temperature": 0}' >/dev/null
  out=$("$py" "$src/bench/serve_load.py" "$url" --clients "$c" --seconds "$seconds" --model smollm2)
  stop_server
  echo "$out" | "$py" -c 'import json,sys; print(json.load(sys.stdin)["tok_s"])'
}

echo "# $(date -u +%Y-%m-%d) $(uname -m) $(nproc) CPUs; threads $threads, ctx $ctx per slot, ${seconds}s windows"
declare -A res
for r in $(seq "$rounds"); do
  for c in $clients; do
    order="lmstore llama"
    [ $((r % 2)) = 0 ] && order="llama lmstore"
    for who in $order; do
      v=$(measure "$who" "$c")
      res[$who,$c]="${res[$who,$c]:-} $v"
      echo "round $r clients $c $who: $v tok/s (load $(cut -d' ' -f1-3 /proc/loadavg))"
    done
  done
done
echo
echo "| clients | lmstore serve tok/s | llama-server tok/s | lmstore / llama-server |"
echo "|---|---|---|---|"
for c in $clients; do
  "$py" - "$c" "${res[lmstore,$c]}" "${res[llama,$c]}" <<'EOF'
import statistics, sys
c, a, b = sys.argv[1], [float(x) for x in sys.argv[2].split()], [float(x) for x in sys.argv[3].split()]
ma, mb = statistics.median(a), statistics.median(b)
print(f"| {c} | {ma:.1f} ({min(a):.1f}-{max(a):.1f}) | {mb:.1f} ({min(b):.1f}-{max(b):.1f}) | "
      f"{ma / mb if mb else float('nan'):.2f} |")
EOF
done
