#!/usr/bin/env bash
# bench/bench_serve_load.sh - the load test of `lmstore serve`
# (tests/server/test_server_load.py) for longer than ctest runs it: CLIENTS
# concurrent clients (default 64) for SECONDS (default 120) on loopback,
# mostly streamed greedy completions checked against `lmstore run`, about 10%
# malformed or abandoned; fails on a crash, a wrong answer, RSS growth after
# warm-up or /metrics disagreeing with the clients.
# usage: bench/bench_serve_load.sh [SECONDS] [CLIENTS]
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${LMS_BUILD_DIR:-$src/build}
py=${PYTHON:-python3}
[ -x "$src/.venv-test/bin/python" ] && py=${PYTHON:-$src/.venv-test/bin/python}
export LMS_SRC_DIR=$src LMS_BIN=$build/lmstore LMS_BUILD_DIR=$build
export LMS_TMP=${LMS_TMP:-${TMPDIR:-/tmp}/lmstore-bench-serve-load}
export LMS_SERVER_LOAD_SECONDS=${1:-120} LMS_SERVER_LOAD_CLIENTS=${2:-64}
echo "# $(date -u +%Y-%m-%d) load $(cut -d' ' -f1-3 /proc/loadavg)"
exec "$py" "$src/tests/server/test_server_load.py"
