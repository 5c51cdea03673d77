#!/usr/bin/env bash
# tests/fuzz/run.sh - build the libFuzzer targets with clang (ASan + UBSan +
# libFuzzer) in build-fuzz/ and run each one on its seed corpus and then for
# a bounded time. Exit status non-zero if a target crashes, leaks or fails.
#   LMS_FUZZ_SECONDS=N  fuzzing time per target (default 20)
#   LMS_FUZZ_BUILD=DIR  build folder (default build-fuzz)
#   LMS_JOBS=N          build jobs and targets fuzzed at once (default: number of CPUs)
#   LMS_FUZZ_SEED=N     libFuzzer seed (default 1, so a CI run is repeatable)
# Inputs that crash are left as build-fuzz/crashes/<target>/crash-*; copy
# them into tests/fuzz/corpus/<target>/ once fixed: the corpus replay makes
# each one a regression test.
set -euo pipefail
cd "$(dirname "$0")/../.."
secs=${LMS_FUZZ_SECONDS:-20}
bdir=${LMS_FUZZ_BUILD:-build-fuzz}
jobs=${LMS_JOBS:-$(nproc)}
cc=${LMS_FUZZ_CC:-clang}

if ! command -v "$cc" >/dev/null; then
  echo "fuzz: $cc not found (install clang and libclang-rt-14-dev)" >&2
  exit 1
fi
CC=$cc cmake -S . -B "$bdir" -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLMS_CUDA=OFF \
  -DLMS_SANITIZE=address,undefined -DLMS_BUILD_TESTS=OFF -DLMS_BUILD_FUZZ=ON >/dev/null
targets=()
for f in tests/fuzz/fuzz_*.c; do
  [ -e "$f" ] || continue
  targets+=("$(basename "$f" .c)")
done
if [ ${#targets[@]} -eq 0 ]; then
  echo "fuzz: no targets"
  exit 0
fi
if ! cmake --build "$bdir" -j "$jobs" --target "${targets[@]}" >"$bdir/build.log" 2>&1; then
  tail -n 40 "$bdir/build.log" >&2
  echo "fuzz: build FAILED (log: $bdir/build.log)"
  exit 1
fi

export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
# One target per job, $jobs at a time; each writes its verdict beside its log.
fuzz_one() {
  local t=$1 seeds=tests/fuzz/corpus/$1
  local work=$bdir/corpus/$t        # grows while fuzzing; seeds stay untouched
  local crashes=$bdir/crashes/$t log=$bdir/$t.log runs
  mkdir -p "$work" "$crashes"
  if "$bdir/tests/fuzz/$t" -max_total_time="$secs" -seed="${LMS_FUZZ_SEED:-1}" -timeout=10 -rss_limit_mb=2048 -max_len=65536 \
       -print_final_stats=1 -artifact_prefix="$crashes/" "$work" "$seeds" >"$log" 2>&1; then
    runs=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n1)
    echo "ok (${runs:-?} runs, ${secs}s)" >"$bdir/$t.verdict"
  else
    echo "FAILED (log: $log)" >"$bdir/$t.verdict"
  fi
}
for t in "${targets[@]}"; do
  rm -f "$bdir/$t.verdict"
  while [ "$(jobs -rp | wc -l)" -ge "$jobs" ]; do wait -n || true; done
  fuzz_one "$t" &
done
wait
status=0
for t in "${targets[@]}"; do
  v=$(cat "$bdir/$t.verdict" 2>/dev/null || echo "FAILED (no verdict)")
  printf 'fuzz: %-28s %s\n' "$t" "$v"
  if [ "${v#ok}" = "$v" ]; then
    tail -n 40 "$bdir/$t.log" >&2
    status=1
  fi
done
exit $status
