#!/usr/bin/env bash
# tests/tools/test_install.sh - lmstore as a user installs it and builds on it:
# `cmake --install` of this build into a scratch prefix gives the CLI, the
# shared library (with its SONAME, exporting the public API and no lms__
# symbol), the static library, the headers, lmstore.pc, the CMake package,
# the man page and the bash completion (tests/tools/test_manual.sh checks
# their contents). Then a program outside the project
# (tests/tools/consumer/consumer.c: open a store and a model, generate) is
# built and run against it four ways: pkg-config with the shared library,
# pkg-config with the static one, find_package(lmstore), and add_subdirectory
# of the source tree.
set -euo pipefail
: "${LMS_SRC_DIR:?}" "${LMS_BUILD_DIR:?}" "${LMS_TMP:?}"
rm -rf "$LMS_TMP" && mkdir -p "$LMS_TMP"
T=$LMS_TMP
P=$T/prefix
C=$LMS_SRC_DIR/tests/tools/consumer
fail() { echo "FAIL: $*" >&2; exit 1; }
for tool in cc pkg-config nm readelf; do
  command -v $tool >/dev/null || fail "$tool is needed (tools/install-deps.sh installs it)"
done

# The sanitizer build installs an instrumented library: consumers get the same flags.
san=$(sed -n 's/^LMS_SANITIZE:STRING=//p' "$LMS_BUILD_DIR/CMakeCache.txt")
cflags=""
[ -n "$san" ] && cflags="-fsanitize=$san -fno-omit-frame-pointer"

cmake --install "$LMS_BUILD_DIR" --prefix "$P" > "$T/install.log"
libdir=$(cd "$P" && dirname "$(find . -name liblmstore.so -print -quit)")
[ -n "$libdir" ] || fail "no liblmstore.so installed"
for f in bin/lmstore "$libdir/liblmstore.a" "$libdir/pkgconfig/lmstore.pc" "$libdir/cmake/lmstore/lmstoreConfig.cmake" \
         include/lmstore/lmstore.h include/lmstore/types.h share/man/man1/lmstore.1 \
         share/bash-completion/completions/lmstore; do
  [ -e "$P/$f" ] || fail "not installed: $f"
done

# ---- the shared library exports the public API and nothing else
so=$P/$libdir/liblmstore.so
readelf -d "$so" | grep 'SONAME.*\[liblmstore\.so\.0\]' > /dev/null || fail "SONAME is not liblmstore.so.0: $(readelf -d "$so" | grep SONAME)"
nm -D --defined-only "$so" | awk '{print $3}' | sort > "$T/exported"
if grep -q '^lms__' "$T/exported"; then
  fail "internal symbols exported: $(grep -c '^lms__' "$T/exported") (e.g. $(grep -m3 '^lms__' "$T/exported" | tr '\n' ' '))"
fi
python3 "$LMS_SRC_DIR/tools/lms_api.py" --list "$P"/include/lmstore/*.h | sort > "$T/declared"
missing=$(comm -23 "$T/declared" "$T/exported")
[ -z "$missing" ] || fail "public functions not exported: $missing"
extra=$(grep -v -x -F -f "$T/declared" "$T/exported" | grep -v '^_' || true)
[ -z "$extra" ] || fail "exported but not declared in a public header: $extra"
echo "exports: $(wc -l < "$T/declared") public functions, no lms__ symbol"

# ---- a model for the consumers, imported with the installed CLI
python3 "$LMS_SRC_DIR/tests/gen_model.py" "$T/src" --arch qwen3 --hidden 32 --layers 1 --vocab 16384 \
    --tokenizer "$LMS_SRC_DIR/tests/fixtures/tokenizers/qwen3" > /dev/null
"$P/bin/lmstore" import "$T/src" --store "$T/store" --name tiny -q > /dev/null
"$P/bin/lmstore" --version | grep '^lmstore 0\.' > /dev/null || fail "installed lmstore --version: $("$P/bin/lmstore" --version)"

run_consumer() { # NAME BINARY
  local out
  out=$("$2" "$T/store" tiny 2>&1) || fail "$1: consumer failed: $out"
  echo "$out" | grep 'consumer: ok (5 prompt tokens, 4 pieces)' > /dev/null || fail "$1: unexpected output: $out"
  echo "$1: ok"
}

# ---- pkg-config, shared and static
export PKG_CONFIG_PATH=$P/$libdir/pkgconfig
pkg-config --exists lmstore || fail "pkg-config does not find lmstore.pc"
[ "$(pkg-config --modversion lmstore)" = "$(sed -n 's/^CMAKE_PROJECT_VERSION:STATIC=//p' "$LMS_BUILD_DIR/CMakeCache.txt")" ] ||
  fail "lmstore.pc version $(pkg-config --modversion lmstore)"
pkg-config --print-requires-private lmstore | grep lmdb > /dev/null || fail "lmstore.pc lacks Requires.private"
# shellcheck disable=SC2046
cc $cflags "$C/consumer.c" -o "$T/c_shared" $(pkg-config --cflags --libs lmstore)
# (no grep -q after a pipe: with pipefail, its early exit would fail the writer)
LD_LIBRARY_PATH=$P/$libdir ldd "$T/c_shared" | grep "liblmstore.so.0 => $P/$libdir/liblmstore.so.0" > /dev/null ||
  fail "pkg-config shared consumer does not load the installed liblmstore.so.0"
LD_LIBRARY_PATH=$P/$libdir run_consumer "pkg-config shared" "$T/c_shared"
# shellcheck disable=SC2046
cc $cflags "$C/consumer.c" -o "$T/c_static" $(pkg-config --cflags lmstore) \
   $(pkg-config --static --libs lmstore | sed 's/-llmstore\b/-l:liblmstore.a/')
if ldd "$T/c_static" | grep liblmstore > /dev/null; then fail "static consumer loads liblmstore.so"; fi
run_consumer "pkg-config static" "$T/c_static"

# ---- find_package(lmstore)
cmake -S "$C/find_package" -B "$T/fp" -DCMAKE_PREFIX_PATH="$P" -DCMAKE_C_FLAGS="$cflags" > "$T/fp.log" 2>&1 ||
  { cat "$T/fp.log" >&2; fail "find_package(lmstore) consumer: configure"; }
cmake --build "$T/fp" >> "$T/fp.log" 2>&1 || { tail -30 "$T/fp.log" >&2; fail "find_package consumer: build"; }
run_consumer "find_package shared" "$T/fp/consumer_shared"
if ldd "$T/fp/consumer_static" | grep liblmstore > /dev/null; then fail "find_package static consumer loads liblmstore.so"; fi
run_consumer "find_package static" "$T/fp/consumer_static"

# ---- add_subdirectory(lmstore) (CPU only: the CMake plumbing is what is tested)
cmake -S "$C/subdir" -B "$T/sub" -DLMSTORE_SOURCE_DIR="$LMS_SRC_DIR" -DLMS_CUDA=OFF -DLMS_SANITIZE="$san" \
      -DCMAKE_BUILD_TYPE=Release -DCMAKE_C_FLAGS="$cflags" > "$T/sub.log" 2>&1 ||
  { cat "$T/sub.log" >&2; fail "add_subdirectory consumer: configure"; }
cmake --build "$T/sub" --target consumer -j "${LMS_JOBS:-2}" >> "$T/sub.log" 2>&1 ||
  { tail -30 "$T/sub.log" >&2; fail "add_subdirectory consumer: build"; }
LD_LIBRARY_PATH=$T/sub/lmstore run_consumer "add_subdirectory" "$T/sub/consumer"
echo "PASS"
