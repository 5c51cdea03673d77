#!/bin/sh
# tools/install-deps.sh - install what building, running and testing lmstore
# needs from Debian's packages (Debian 12 or later; Ubuntu 24.04 too).
# Runs apt-get directly as root, through sudo otherwise. CUDA is optional and
# not installed here: the CUDA backends are built when nvcc is found.
set -eu
if [ "$(id -u)" = 0 ]; then run=""; else run=sudo; fi
export DEBIAN_FRONTEND=noninteractive
$run apt-get update -qq
# build: compiler, cmake, pkg-config, and the libraries lmstore links
#        (libedit: line editing and history in `lmstore chat`; libmicrohttpd:
#        HTTP for `lmstore serve`, optional at build time)
# tests: cmocka, python3 (numpy, safetensors and HF tokenizers come from PyPI
#        into a virtual environment), clang + libFuzzer for the fuzz stage
$run apt-get install -y -qq --no-install-recommends \
    build-essential cmake pkg-config python3 python3-pip python3-venv ca-certificates \
    liblmdb-dev libcjson-dev libzstd-dev libxxhash-dev libpcre2-dev libutf8proc-dev \
    libedit-dev libmicrohttpd-dev libcmocka-dev clang libclang-rt-14-dev >/dev/null
