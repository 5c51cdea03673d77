#!/usr/bin/env bash
# bench/build_llamacpp_cuda.sh - llama.cpp built for CUDA: the peer of the
# GPU benchmarks (bench/bench_engine_gpu.sh phases peerserve8b and cpu8b).
#
#   bench/build_llamacpp_cuda.sh pack SRC ARCHIVE.tar.gz|ARCHIVE.tar.zst
#       the parts of a llama.cpp source tree SRC that the build below needs
#       (CMake files, cmake/, ggml/, src/, include/, common/, tools/,
#       vendor/, scripts/, licenses; no models, docs, tests, examples, web
#       UI sources or other GPU backends: about 6 MB as .tar.gz), as one
#       archive to carry to a machine without network (gzip: GPU machines
#       may lack zstd)
#   bench/build_llamacpp_cuda.sh build SRC|ARCHIVE BUILD [TARGET...]
#       configure and build SRC (or the archive, unpacked to BUILD/src) in
#       BUILD: Release, CUDA for CUDA_ARCH (default 90, Hopper), the CPU
#       backend for this CPU (-DGGML_NATIVE=ON), no network (no curl, no
#       OpenSSL, no prebuilt web UI), shared libraries; TARGETs default to
#       llama-server llama-bench llama-completion. The binaries land in
#       BUILD/bin; the time taken is printed at the end.
#
# Environment: CUDA_ARCH (default 90), JOBS (default: the number of CPUs).
# Needs cmake, a C++ compiler, nvcc, gzip (zstd for .zst); ninja when present.
set -euo pipefail
usage() { sed -n '/^#   bench/,/^# Needs/p' "$0" >&2; exit 2; }
[ $# -ge 3 ] || usage
mode=$1 src=$2 dst=$3
shift 3

case $mode in
pack)
    [ -f "$src/CMakeLists.txt" ] && [ -d "$src/ggml" ] || { echo "$src: not a llama.cpp source tree" >&2; exit 1; }
    parts=(CMakeLists.txt cmake ggml src include common tools vendor scripts licenses LICENSE)
    tar -C "$src" --exclude=.git --exclude='tools/ui/src' --exclude='tools/ui/tests' --exclude='tools/ui/static' \
        --exclude='ggml/src/ggml-sycl' --exclude='ggml/src/ggml-opencl' --exclude='ggml/src/ggml-hexagon' \
        --exclude='ggml/src/ggml-vulkan' --exclude='ggml/src/ggml-metal' --exclude='ggml/src/ggml-webgpu' \
        --exclude='ggml/src/ggml-openvino' --exclude='ggml/src/ggml-et' \
        -cf - "${parts[@]}" | case $dst in
        *.zst) zstd -q -19 -T0 -o "$dst" -f ;;
        *) gzip -9 >"$dst" ;;
        esac
    ls -l "$dst"
    ;;
build)
    targets=("$@")
    [ ${#targets[@]} -gt 0 ] || targets=(llama-server llama-bench llama-completion)
    mkdir -p "$dst"
    if [ -f "$src" ]; then
        rm -rf "$dst/src"
        mkdir -p "$dst/src"
        case $src in
        *.zst) zstd -dc "$src" | tar -C "$dst/src" -xf - ;;
        *) tar -C "$dst/src" -xf "$src" ;;
        esac
        src=$dst/src
    fi
    gen=()
    command -v ninja >/dev/null && gen=(-G Ninja)
    t0=$(date +%s)
    cmake -S "$src" -B "$dst" "${gen[@]}" -DCMAKE_BUILD_TYPE=Release -DGGML_CUDA=ON \
        -DCMAKE_CUDA_ARCHITECTURES="${CUDA_ARCH:-90}" -DGGML_NATIVE=ON -DGGML_CUDA_NCCL=OFF -DLLAMA_CURL=OFF \
        -DLLAMA_OPENSSL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_APP=OFF \
        -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF -DBUILD_SHARED_LIBS=ON >"$dst/cmake.log"
    cmake --build "$dst" -j "${JOBS:-$(nproc)}" --target "${targets[@]}"
    echo "llama.cpp (CUDA ${CUDA_ARCH:-90}) built in $(($(date +%s) - t0)) s: $dst/bin"
    ;;
*) usage ;;
esac
