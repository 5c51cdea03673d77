#!/usr/bin/env bash
# tests/run.sh - the test command: builds lmstore twice (a normal build and an
# AddressSanitizer + UndefinedBehaviorSanitizer build) and runs every test in
# each with ctest. Exit status non-zero if any build or test fails.
#   LMS_JOBS=N  parallel build and test jobs (default: number of CPUs)
#   LMS_FUZZ=0  skip the fuzz stage (tests/fuzz/run.sh, needs clang)
#   LMS_KEEP_TMP=1  keep every test's scratch folder (build*/testtmp/NAME; by
#               default only a failed test's stays)
set -euo pipefail
cd "$(dirname "$0")/.."
jobs=${LMS_JOBS:-$(nproc)}

# Disk: a run holds about 2.2 GB at its peak (the builds, the test environment, the
# scratch folders of the tests running; tests/in_tmp.sh removes each when it passes).
# A full disk fails tests in ways that read like bugs: say so first.
free_mb=$(df -Pm . | awk 'NR == 2 {print $4}')
if [ "${free_mb:-0}" -lt 3072 ]; then
  echo "tests/run.sh: warning: ${free_mb} MB free where the tests run; a full run needs about 2.2 GB" >&2
fi

# Python tests compare against numpy, safetensors, HF tokenizers and gguf-py
# (PyPI gguf: GGUF reading and the reference (de)quantizers); the server's
# tests talk to it with OpenAI's own client (PyPI openai). Use the
# python3 on PATH when it has them, else a private virtual environment.
py=python3
if ! $py -c 'import numpy, safetensors, tokenizers, gguf, openai' 2>/dev/null; then
  if ! .venv-test/bin/python -c 'import numpy, safetensors, tokenizers, gguf, openai' 2>/dev/null; then
    python3 -m venv .venv-test
    .venv-test/bin/python -m pip install -q numpy safetensors tokenizers gguf openai
  fi
  py=$PWD/.venv-test/bin/python
fi

cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo -DLMS_BUILD_TESTS=ON \
      -DPython3_EXECUTABLE="$(command -v $py)" >/dev/null
cmake --build build -j "$jobs"
cmake -S . -B build-asan -DCMAKE_BUILD_TYPE=Debug -DLMS_CUDA=OFF -DLMS_SANITIZE=address,undefined \
      -DLMS_BUILD_TESTS=ON -DPython3_EXECUTABLE="$(command -v $py)" >/dev/null
cmake --build build-asan -j "$jobs"

status=0
if [ "${LMS_FUZZ:-1}" != 0 ]; then
  echo "== fuzz: libFuzzer targets, seed corpora + ${LMS_FUZZ_SECONDS:-20} s each (build-fuzz/) =="
  tests/fuzz/run.sh || status=1
fi
echo "== tests: normal build (build/) =="
(cd build && ctest --output-on-failure -j "$jobs") || status=1
echo "== tests: ASan+UBSan build (build-asan/) =="
export ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1:abort_on_error=0}
export UBSAN_OPTIONS=${UBSAN_OPTIONS:-print_stacktrace=1:halt_on_error=1}
(cd build-asan && ctest --output-on-failure -j "$jobs") || status=1
exit $status
