#!/usr/bin/env bash
# bench/bench_vs_llamacpp.sh - lmstore's CPU engine against llama.cpp on the
# same GGUF files, measured alternately in one run.
#
# The peer: llama.cpp as the PyPI sdist of llama-cpp-python vendors it,
# downloaded (pip download --no-binary :all: --no-deps) and built with cmake
# into LLAMACPP_DIR, outside the repository (-DGGML_NATIVE=ON: the build a
# user makes on this machine; shared libraries, so that
# tests/reference/make_llamacpp_fixtures.py can use the same build through
# the sdist's Python bindings). Built once; later runs reuse it.
#
# The models: Llama-3.2-1B- and Qwen3-0.6B-shaped (tied embeddings), random
# bf16 weights from tests/gen_model.py with a small byte-level BPE tokenizer
# (tests/tools/tinymodel.py), and smollm2-135m, the quick-start model
# (models/smollm2-135m-instruct, real bf16 weights), imported into a store,
# written as one BF16 GGUF by `lmstore export`, and converted by llama.cpp's
# own llama-quantize to each TYPE (Q8_0, Q4_0, Q4_K_M, F16; BF16 is the
# exported file itself): what a llama.cpp user runs. lmstore imports those
# GGUF files as they are, so both engines compute over the same tensor
# bytes.
#
# Each of PAIRS rounds measures, in alternating order (lmstore first in odd
# rounds, llama.cpp first in even ones), with the memory read bandwidth
# probed (bench/membw.c) before each round:
#   decode    DECODE tokens after a 128-token context: `lmstore bench engine
#             --prompt 128 --gen DECODE` / `llama-bench -p 0 -n DECODE -d 128`
#   prefill   128 and 512 tokens from an empty context: `lmstore bench engine
#             --prompt N` / `llama-bench -p N -n 0`
#   ttft      the whole process, from exec to exit, of a run that reads a
#             ~128-token text prompt and generates one token: `lmstore run
#             -p TEXT --max-tokens 1` / `llama-completion -p TEXT -n 1
#             -no-cnv`, page cache warm, both with a context of CTX tokens
#             (default 4096); its peak RSS (/usr/bin/time)
# Every tool runs with its defaults otherwise (llama-bench: batch 2048,
# ubatch 512, flash attention auto, its own warm-up run; lmstore: prefill
# blocks of 512 tokens on the CPU, its own warm-up). Prints each round and,
# per model and type, the median and min-max over rounds of lmstore /
# llama.cpp for speeds (above 1: lmstore faster) and of llama.cpp / lmstore
# for time to first token (above 1: lmstore faster), and both peak RSS.
#
# --base DIR also measures a second lmstore build (DIR holds its lmstore binary; e.g. the main branch
# built in a scratch tree) in the same rounds, between the two engines (order lmstore, base, llama.cpp
# in odd rounds, reversed in even ones), and prints its ratios to llama.cpp and lmstore's to it: the
# gain of a change in the same minutes as the comparison.
# --short measures decode and prefill 128 only (no prefill 512, no whole-process run): a quarter of
# the time, for a machine shared with other work.
# usage: bench/bench_vs_llamacpp.sh [--llama DIR] [--work DIR] [--build DIR] [--threads T] [--pairs N]
#            [--models "llama-3.2-1b qwen3-0.6b smollm2-135m"] [--types "Q8_0 Q4_0 Q4_K_M BF16 F16"] [--decode N]
#            [--ctx N] [--busy] [--short] [--base DIR]
#   --busy   also run lmstore's decode with a busy loop pinned on CPU 0 (another process holding a
#            core), alternating with quiet rounds, and print the ratio to the quiet rate
# Environment: LLAMACPP_DIR (the peer's folder, default ${TMPDIR:-/tmp}/lmstore-llamacpp),
#   LLAMACPP_PY_VERSION (the llama-cpp-python sdist, default 0.3.36), PYTHON (with numpy and
#   tokenizers; default: the tests' .venv-test, else python3), LMS_BENCH_DIR (work folder).
# Needs cmake, a C++ compiler, pip, /usr/bin/time, taskset (--busy), and about 10 GB in the work folder.
set -euo pipefail
src=$(cd "$(dirname "$0")/.." && pwd)
build=${LMS_BUILD_DIR:-$src/build}
llama=${LLAMACPP_DIR:-${TMPDIR:-/tmp}/lmstore-llamacpp}
work=${LMS_BENCH_DIR:-${TMPDIR:-/tmp}/lmstore-bench-vs-llamacpp}
pyver=${LLAMACPP_PY_VERSION:-0.3.36}
threads=2
pairs=5
models="llama-3.2-1b qwen3-0.6b"
types="Q8_0 Q4_0 Q4_K_M"
decode=64
short=0
ctx=4096
busy=0
base=
while [ $# -gt 0 ]; do
  case $1 in
    --llama) llama=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    --build) build=$2; shift 2 ;;
    --threads) threads=$2; shift 2 ;;
    --pairs) pairs=$2; shift 2 ;;
    --models) models=$2; shift 2 ;;
    --types) types=$2; shift 2 ;;
    --decode) decode=$2; shift 2 ;;
    --short) short=1; shift ;;
    --busy) busy=1; shift ;;
    --ctx) ctx=$2; shift 2 ;;
    --base) base=$2; shift 2 ;;
    *) sed -n '/^# usage/,/^# Needs/p' "$0" >&2; exit 2 ;;
  esac
done
if [ -z "${PYTHON:-}" ]; then
  if "$src/.venv-test/bin/python" -c 'import numpy, tokenizers' 2>/dev/null; then PYTHON=$src/.venv-test/bin/python
  else PYTHON=python3; fi
fi
for b in lmstore membw; do
  [ -x "$build/$b" ] || { echo "bench_vs_llamacpp.sh: $build/$b not built (cmake --build $build)" >&2; exit 1; }
done
lms=$build/lmstore
[ -z "$base" ] || [ -x "$base/lmstore" ] || { echo "bench_vs_llamacpp.sh: $base/lmstore not built" >&2; exit 1; }
mkdir -p "$work" "$llama"
store=$work/store
timef=$(mktemp) # /usr/bin/time's output (the work folder may be read-only once made)
trap 'rm -f "$timef"' EXIT

# ---- the peer ----------------------------------------------------------------------------------
bin=$llama/build/bin
if [ ! -x "$bin/llama-bench" ] || [ ! -x "$bin/llama-quantize" ] || [ ! -x "$bin/llama-completion" ]; then
  echo "== building llama.cpp from the llama-cpp-python $pyver sdist into $llama" >&2
  if [ ! -d "$llama/src" ]; then
    "$PYTHON" -m pip download --quiet --no-binary :all: --no-deps "llama-cpp-python==$pyver" -d "$llama/sdist"
    tar -xzf "$llama/sdist/llama_cpp_python-$pyver.tar.gz" -C "$llama"
    ln -sfn "$llama/llama_cpp_python-$pyver/vendor/llama.cpp" "$llama/src"
  fi
  cmake -S "$llama/src" -B "$llama/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER=OFF -DBUILD_SHARED_LIBS=ON >/dev/null
  cmake --build "$llama/build" -j "$(nproc)" --target llama-quantize llama-bench llama-completion >/dev/null
fi

# ---- the models ----------------------------------------------------------------------------------
gen() { # shape -> GGUF files $work/SHAPE-TYPE.gguf, imported as SHAPE-TYPE
  local m=$1 dir=$work/$1 need=0 args real=0
  for t in $types; do [ -f "$work/$m-$t.gguf" ] || need=1; done
  if [ $need = 1 ] && [ "$m" = smollm2-135m ]; then
    [ -f "$src/models/smollm2-135m-instruct/model.safetensors" ] ||
      { echo "smollm2-135m: models/smollm2-135m-instruct is missing (the quick-start model)" >&2; exit 1; }
    dir=$src/models/smollm2-135m-instruct real=1
  fi
  if [ $need = 1 ]; then
    [ $real = 1 ] || case $m in
      qwen3-0.6b) args="--arch qwen3 --hidden 1024 --intermediate 3072 --layers 28 --heads 16 --kv-heads 8 --head-dim 128 --vocab 151936 --max-pos 40960 --tied" ;;
      llama-3.2-1b) args="--arch llama --hidden 2048 --intermediate 8192 --layers 16 --heads 32 --kv-heads 8 --head-dim 64 --vocab 128256 --max-pos 131072 --tied" ;;
      *) echo "unknown model $m" >&2; exit 2 ;;
    esac
    echo "== $m: bf16 weights, BF16 GGUF, llama-quantize $types" >&2
    [ $real = 1 ] || { "$PYTHON" "$src/tests/gen_model.py" "$dir" $args --dtype BF16 --shard-size 2G --force >/dev/null
    "$PYTHON" - "$dir" <<'PY'
import json, os, sys
sys.path.insert(0, os.path.join(os.environ.get("LMS_SRC", "."), "tests", "tools"))
import tinymodel as tm
d = sys.argv[1]
tok = tm.build_tokenizer(400)
tok.save(os.path.join(d, "tokenizer.json"))
with open(os.path.join(d, "tokenizer_config.json"), "w") as f:
    json.dump({"bos_token": "<|endoftext|>", "eos_token": "<|im_end|>", "add_bos_token": False}, f)
PY
    }
    "$lms" rm --store "$store" "$m-bf16" >/dev/null 2>&1 || true
    "$lms" import --store "$store" "$dir" --name "$m-bf16" >/dev/null
    rm -f "$work/$m-bf16.gguf"
    "$lms" export --store "$store" "$m-bf16" "$work/$m-bf16.gguf" >/dev/null
    for t in $types; do
      if [ "$t" = BF16 ]; then cp "$work/$m-bf16.gguf" "$work/$m-$t.gguf"
      else "$bin/llama-quantize" "$work/$m-bf16.gguf" "$work/$m-$t.gguf" "$t" >/dev/null 2>&1; fi
      "$lms" rm --store "$store" "$m-$t" >/dev/null 2>&1 || true
    done
    "$lms" rm --store "$store" "$m-bf16" >/dev/null
    "$lms" gc --store "$store" >/dev/null
    [ $real = 1 ] || rm -rf "$dir"
    rm -f "$work/$m-bf16.gguf"
  fi
  for t in $types; do
    "$lms" info --store "$store" "$m-$t" >/dev/null 2>&1 || "$lms" import --store "$store" "$work/$m-$t.gguf" --name "$m-$t" >/dev/null
  done
}
export LMS_SRC=$src

# a text of about 128 tokens for the whole-process runs
prompt=$("$PYTHON" - <<'PY'
words = ("the quick brown fox jumps over the lazy dog while a model store keeps weights in memory "
         "mapped segments and sessions keep the cache for later ").split()
print(" ".join(words[i % len(words)] for i in range(100)))
PY
)

py_json() { "$PYTHON" -c "import json,sys; d=json.loads(sys.stdin.read()); print($1)"; }

lms_round() { # model type [lmstore binary] -> "decode pp128 pp512 ttft_s rss_kb"
  local name=$1-$2 lms=${3:-$lms} j1 j2 dec pp128 pp512 tt
  j1=$("$lms" bench engine "$name" --store "$store" --threads "$threads" --prompt 128 --gen "$decode" --reps 1 --membw-mib 16 --json)
  if [ "$short" = 1 ]; then echo "$(echo "$j1" | py_json 'd["decode_tps"]') $(echo "$j1" | py_json 'd["prefill_tps"]') 0 0 0"; return; fi
  j2=$("$lms" bench engine "$name" --store "$store" --threads "$threads" --prompt 512 --gen 2 --reps 1 --membw-mib 16 --json)
  dec=$(echo "$j1" | py_json 'd["decode_tps"]')
  pp128=$(echo "$j1" | py_json 'd["prefill_tps"]')
  pp512=$(echo "$j2" | py_json 'd["prefill_tps"]')
  /usr/bin/time -o "$timef" -f "%e %M" "$lms" run "$name" --store "$store" --threads "$threads" \
    --ctx "$ctx" -p "$prompt" --max-tokens 1 --ignore-eos >/dev/null 2>&1
  tt=$(tail -1 "$timef")
  echo "$dec $pp128 $pp512 $tt"
}

llama_round() { # model type -> "decode pp128 pp512 ttft_s rss_kb"
  local f=$work/$1-$2.gguf j1 j2 dec pp128 pp512 tt
  j1=$("$bin/llama-bench" -m "$f" -t "$threads" -r 1 -p 0 -n "$decode" -d 128 -o json 2>/dev/null)
  if [ "$short" = 1 ]; then
    j2=$("$bin/llama-bench" -m "$f" -t "$threads" -r 1 -p 128 -n 0 -o json 2>/dev/null)
    echo "$(echo "$j1" | py_json 'd[0]["avg_ts"]') $(echo "$j2" | py_json 'd[0]["avg_ts"]') 0 0 0"; return
  fi
  j2=$("$bin/llama-bench" -m "$f" -t "$threads" -r 1 -p 128,512 -n 0 -o json 2>/dev/null)
  dec=$(echo "$j1" | py_json 'd[0]["avg_ts"]')
  pp128=$(echo "$j2" | py_json '[x["avg_ts"] for x in d if x["n_prompt"] == 128][0]')
  pp512=$(echo "$j2" | py_json '[x["avg_ts"] for x in d if x["n_prompt"] == 512][0]')
  /usr/bin/time -o "$timef" -f "%e %M" "$bin/llama-completion" -m "$f" -t "$threads" -c "$ctx" -p "$prompt" \
    -n 1 -no-cnv --no-display-prompt >/dev/null 2>&1 </dev/null
  tt=$(tail -1 "$timef")
  echo "$dec $pp128 $pp512 $tt"
}

fig() { # "decode pp128 pp512 ttft_s rss_kb" -> words
  echo "decode $(echo $1 | cut -d' ' -f1) tok/s, prefill128 $(echo $1 | cut -d' ' -f2), prefill512 $(echo $1 | cut -d' ' -f3), ttft $(echo $1 | cut -d' ' -f4) s, rss $(echo $1 | cut -d' ' -f5) KB"
}

cpu=$(grep -m1 'model name' /proc/cpuinfo | cut -d: -f2 | sed 's/^ //')
echo "# bench_vs_llamacpp.sh: $(date -u +%Y-%m-%dT%H:%MZ), $(uname -n), $cpu, $(nproc) CPUs, threads $threads"
peer=$("$bin/llama-bench" --version 2>&1 | grep -m1 -o 'version: .*' || true)
echo "# peer: llama.cpp ${peer:-version ?} ($llama/build); lmstore $(git -C "$src" rev-parse --short HEAD 2>/dev/null || echo '?')"
echo "# command: bench/bench_vs_llamacpp.sh --threads $threads --pairs $pairs --models \"$models\" --types \"$types\" --decode $decode --ctx $ctx$([ -n "$base" ] && echo " --base $base")$([ $busy = 1 ] && echo ' --busy')$([ "$short" = 1 ] && echo ' --short')"
for m in $models; do
  gen "$m"
  for t in $types; do
    cat "$work/$m-$t.gguf" "$store"/segments/* >/dev/null 2>&1 || true # warm the page cache
    rows=()
    for r in $(seq 1 "$pairs"); do
      bw=$("$build/membw" --threads "$threads" --mib 1024 --reps 5 --json | py_json 'd["median_gbs"]')
      load=$(cut -d' ' -f1 /proc/loadavg)
      c=
      if [ $((r % 2)) = 1 ]; then a=$(lms_round "$m" "$t"); [ -z "$base" ] || c=$(lms_round "$m" "$t" "$base/lmstore"); b=$(llama_round "$m" "$t")
      else b=$(llama_round "$m" "$t"); [ -z "$base" ] || c=$(lms_round "$m" "$t" "$base/lmstore"); a=$(lms_round "$m" "$t"); fi
      echo "$m $t round $r: load $load, membw $bw GB/s | lmstore: $(fig "$a") | llama.cpp: $(fig "$b")$([ -z "$c" ] || echo " | base: $(fig "$c")")"
      rows+=("$bw $a $b $load $c")
    done
    printf '%s\n' "${rows[@]}" | "$PYTHON" -c '
import statistics as st, sys
m, t = sys.argv[1], sys.argv[2]
R = [[float(x) for x in l.split()] for l in sys.stdin if l.strip()]
def s(v, f="{:.2f}"):
    return (f + "x (" + f + "-" + f + ")").format(st.median(v), min(v), max(v))
bw = [r[0] for r in R]
a = [r[1:6] for r in R]; b = [r[6:11] for r in R]; ld = [r[11] for r in R]; c = [r[12:17] for r in R if len(r) > 12]
print(f"{m} {t}: {len(R)} pairs, membw {st.median(bw):.1f} GB/s ({min(bw):.1f}-{max(bw):.1f}), "
      f"load average {st.median(ld):.1f} ({min(ld):.1f}-{max(ld):.1f})")
print(f"  decode {st.median([x[0] for x in a]):.2f} vs {st.median([x[0] for x in b]):.2f} tok/s: lmstore/llama.cpp " + s([x[0] / y[0] for x, y in zip(a, b)]))
print(f"  prefill 128 {st.median([x[1] for x in a]):.1f} vs {st.median([x[1] for x in b]):.1f} tok/s: " + s([x[1] / y[1] for x, y in zip(a, b)]))
if all(x[2] > 0 for x in a + b):  # not --short
    print(f"  prefill 512 {st.median([x[2] for x in a]):.1f} vs {st.median([x[2] for x in b]):.1f} tok/s: " + s([x[2] / y[2] for x, y in zip(a, b)]))
    print(f"  process to first token {st.median([x[3] for x in a]):.2f} vs {st.median([x[3] for x in b]):.2f} s: llama.cpp/lmstore " + s([y[3] / x[3] for x, y in zip(a, b)]))
    print(f"  peak RSS {st.median([x[4] for x in a]) / 1024:.0f} vs {st.median([x[4] for x in b]) / 1024:.0f} MiB")
if c:  # --base: its own ratios to llama.cpp, and lmstore / base
    full = all(x[2] > 0 for x in a + b + c)
    for i, what in [(0, "decode"), (1, "prefill 128")] + ([(2, "prefill 512")] if full else []):
        print(f"  base {what} {st.median([x[i] for x in c]):.1f} tok/s: base/llama.cpp " + s([x[i] / y[i] for x, y in zip(c, b)])
              + ", lmstore/base " + s([x[i] / y[i] for x, y in zip(a, c)]))
' "$m" "$t"
    [ "$busy" = 1 ] || continue
    # contention: a busy loop pinned on CPU 0 in every other round; decode rates of both engines
    rows=()
    for r in $(seq 1 "$pairs"); do
      for mode in quiet busy; do
        bpid=
        if [ $mode = busy ]; then taskset -c 0 sh -c 'while :; do :; done' & bpid=$!; sleep 0.5; fi
        load=$(cut -d' ' -f1 /proc/loadavg)
        da=$("$lms" bench engine "$m-$t" --store "$store" --threads "$threads" --prompt 128 --gen "$decode" --reps 1 \
             --membw-mib 16 --json | py_json 'd["decode_tps"]')
        db=$("$bin/llama-bench" -m "$work/$m-$t.gguf" -t "$threads" -r 1 -p 0 -n "$decode" -d 128 -o json 2>/dev/null |
             py_json 'd[0]["avg_ts"]')
        if [ -n "$bpid" ]; then kill "$bpid"; wait "$bpid" 2>/dev/null || true; fi
        echo "$m $t contention round $r $mode: load $load | lmstore decode $da tok/s | llama.cpp decode $db tok/s"
        rows+=("$mode $da $db")
      done
    done
    printf '%s\n' "${rows[@]}" | "$PYTHON" -c '
import statistics as st, sys
m, t = sys.argv[1], sys.argv[2]
R = [l.split() for l in sys.stdin if l.strip()]
q = [(float(a), float(b)) for k, a, b in R if k == "quiet"]; u = [(float(a), float(b)) for k, a, b in R if k == "busy"]
def s(v):
    return "{:.2f}x ({:.2f}-{:.2f})".format(st.median(v), min(v), max(v))
print(f"{m} {t} with a busy process on CPU 0: {len(u)} pairs")
print(f"  lmstore decode busy {st.median([x[0] for x in u]):.2f} vs quiet {st.median([x[0] for x in q]):.2f} tok/s: busy/quiet " + s([x[0] / y[0] for x, y in zip(u, q)]))
print(f"  llama.cpp decode busy {st.median([x[1] for x in u]):.2f} vs quiet {st.median([x[1] for x in q]):.2f} tok/s: busy/quiet " + s([x[1] / y[1] for x, y in zip(u, q)]))
' "$m" "$t"
  done
done
