#!/usr/bin/env bash
# bench/crash_campaign.sh - the long fault-injection campaign: `lmstore
# import`, `rm`, `gc` and a KV save (`run --save-session`) each killed with
# SIGKILL at every crash point they pass and then at seeded random times
# within their run, TRIALS kills per operation in a fresh copy of the store
# each time; after every kill: `lmstore verify` (records, counts, every
# blob's hash), every surviving model exported and compared byte for byte
# with its source safetensors files, the KV session absent or resuming to a
# clean run's continuation, and gc giving exactly the segment size of a
# clean store with or without the operation (tests/store/test_crash.py holds
# the checks; CI runs them with 50 kills each).
#
#   bench/crash_campaign.sh [BUILD_DIR] [TRIALS] [SEED]
#
# BUILD_DIR defaults to build/ (a build with LMS_BUILD_TESTS=ON is not
# needed: only its lmstore), TRIALS to 1000, SEED to 20261122. Scratch space
# under $LMS_TMP (default /tmp/lmstore-crash-campaign). Prints one summary
# line per operation and exits non-zero on any inconsistency.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build}
trials=${2:-1000}
seed=${3:-20261122}
py=python3
if ! $py -c 'import numpy, safetensors' 2>/dev/null; then
  py=$PWD/.venv-test/bin/python
fi
case $build in /*) ;; *) build=$PWD/$build ;; esac
export LMS_SRC_DIR=$PWD LMS_BIN=$build/lmstore LMS_CRASH_TRIALS=$trials LMS_CRASH_SEED=$seed
tmp=${LMS_TMP:-/tmp/lmstore-crash-campaign}
status=0
echo "crash campaign: $trials kills per operation, seed $seed, $LMS_BIN"
for op in import rm gc kvsave; do
  script=tests/store/test_crash_$op.py
  [ "$op" = gc ] && script=tests/store/test_crash.py
  t0=$(date +%s)
  log=$(mktemp)
  if LMS_TMP=$tmp/$op $py "$script" > "$log" 2>&1; then rc=0; else rc=$?; status=1; fi
  # the campaign's own summary lines, and any inconsistency it named
  grep -E "^(import|rm|gc|kvsave):|^INCONSISTENCY|^crash test" "$log" || tail -20 "$log"
  echo "  $op: exit $rc, $(( $(date +%s) - t0 )) s"
  rm -f "$log"
done
exit $status
