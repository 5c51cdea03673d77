#!/bin/sh
# bench/carry-libs.sh - copy the shared libraries that a build's programs load
# at run time (LMDB, cJSON, zstd, cmocka, xxHash, PCRE2, utf8proc, liburing,
# libmicrohttpd, libedit with libbsd and libmd) into DIR (default
# build/devlibs), so that the build runs on a
# machine that has none of them installed:
#   sh bench/carry-libs.sh build-cuda/devlibs
#   LD_LIBRARY_PATH=$PWD/build-cuda/devlibs build-cuda/lmstore ...
# The programs looked at are the executables up to three levels below DIR's
# parent folder (the build folder).
set -eu
dir=${1:-build/devlibs}
mkdir -p "$dir"
for bin in $(find "$(dirname "$dir")" -maxdepth 3 -type f -perm -u+x 2>/dev/null); do
  ldd "$bin" 2>/dev/null | awk '/=> \// {print $3}'
done | sort -u | grep -E '/lib(lmdb|cjson|zstd|cmocka|xxhash|pcre2-8|utf8proc|uring|microhttpd|edit|bsd|md)\.so' | while read -r lib; do
  cp -L "$lib" "$dir/"
done
ls "$dir"
