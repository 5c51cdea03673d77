#!/bin/sh
# bench/gpu_bundle.sh - gather what a GPU machine without lmstore's
# dependencies needs to run a CUDA build made here: the lmstore binary, the
# CUDA test programs, and the shared libraries they load that such a machine
# lacks (LMDB, cJSON, zstd, xxHash, PCRE2, utf8proc, cmocka, ...; CUDA's own
# come from the machine). There: LD_LIBRARY_PATH=$DIR/lib LMS_BIN_DIR=$DIR/bin.
# Binaries lose their debug sections (about half their size; symbols stay,
# so profiles still name functions) unless LMS_BUNDLE_DEBUG=1.
#   bench/gpu_bundle.sh [BUILD] [DIR]     (default build, .gpu)
set -eu
b=${1:-build}
dir=${2:-.gpu}
mkdir -p "$dir/bin" "$dir/lib"
cp "$b/lmstore" "$dir/bin/"
for t in engine_test_backend_cuda engine_test_engine_cuda engine_test_batch_cuda loader_test_loader_cuda; do
    cp "$b/tests/$t" "$dir/bin/"
done
for f in "$dir"/bin/*; do
    ldd "$f" | awk '/=> \// {print $3}'
done | sort -u | grep -v -E '/(libc|libm|libpthread|libdl|librt|libgcc_s|libstdc\+\+|ld-linux)[.-]|libcud|libcublas|libnv' |
    while read -r lib; do cp -L "$lib" "$dir/lib/"; done
[ "${LMS_BUNDLE_DEBUG:-0}" = 1 ] || for f in "$dir"/bin/*; do objcopy --strip-debug "$f"; done
du -sh "$dir"
