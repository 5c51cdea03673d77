#!/usr/bin/env bash
# bench/bench_engine_gpu.sh - the CUDA engine's run on a GPU machine, in
# phases (each a few minutes, so that a run fits the machine's time slots):
#
#   tests            the CUDA tests: every forward operation against the CPU
#                    backend (engine_test_backend_cuda), the engine through its
#                    public API against transformers' references and across
#                    devices (engine_test_engine_cuda), the loader's CUDA test
#   make8b           a Llama-3-8B-shaped bf16 model with random weights
#                    (bench/bench_load_hf.py make), imported as llama8b
#   bench8b          `lmstore bench engine llama8b --device cuda`: decode at 128
#                    and 4096 tokens of context, prefill of 2048, a 4096-token
#                    session resumed against recomputed (raw, the default codec
#                    auto, shuffle-zstd; gc in between, as the pages of the same
#                    tokens would otherwise be found stored already);
#                    the HBM read bandwidth (torch sum) and bf16 matrix rate next to it
#   peers8b          transformers on the same weights: decode (eager and static
#                    cache compiled), prefill 2048; greedy ids against lmstore's
#   batch8b          `lmstore bench batch llama8b --device cuda`: aggregate decode
#                    tok/s of 1, 4, 16 and 64 concurrent greedy requests (one
#                    forward pass per step over every running sequence) against
#                    the single-sequence rate; then 16 requests with F32 K/V,
#                    each request's ids checked against lms_generate alone
#   serve8b          `lmstore serve --device cuda` over the 8B shape (given
#                    Llama 3's real tokenizer from tests/fixtures): aggregate
#                    decode of 1/4/16/64 streaming clients (bench/serve_load.py)
#   mlx8b            llama8b quantized by `lmstore quantize --type mlx4` (and
#                    mlx8): decode at 128 tokens of context against the HBM
#                    roofline of its own bytes, prefill of 2048 (dequantized
#                    rows in cuBLAS GEMMs)
#   gemma12b         a gemma-3-12b-shaped bf16 model (tests/gen_model.py; the
#                    8B model's files are removed first for disk space): decode
#                    at 128 and 4096 tokens of context against the roofline
#   smollm2 GGUF     the default model from its GGUF: greedy ids of lmstore on
#                    cuda against transformers bf16 on the same GPU
#   coldstart        whole process to the first token, warm and cold, and
#                    transformers as a whole process
#   profile          per-kernel times and DRAM traffic (Nsight Compute) of
#                    decode steps and of a 2048-token prefill
#   decode8b         decode only (128 tokens of context) of llama8b and its
#                    MLX 4- and 8-bit quantizations (made if missing), then
#                    per-kernel times of one decode step of llama8b and of
#                    llama8b-mlx4 (Nsight Compute)
#   gemma12bdec      the gemma-3-12b-shaped model as in gemma12b, decode at
#                    128 tokens of context only, then per-kernel times of one
#                    decode step
#
# Every measurement is one JSON line in $OUT/results.jsonl; logs in $OUT.
# Usage, from the repository root, with a CUDA build's binaries in $LMS_BIN_DIR
# (lmstore and the test programs) and their libraries on LD_LIBRARY_PATH:
#   OUT=/tmp/out bench/bench_engine_gpu.sh PHASE... [WORKDIR]
set -u
BIN=${LMS_BIN_DIR:-build}
OUT=${OUT:-/tmp/lms-bench-engine}
W=${LMS_WORK:-/tmp/lms-engine-work}
PY=${PYTHON:-python3}
mkdir -p "$OUT" "$W"
LOG=$OUT/bench.log
RES=$OUT/results.jsonl
LMS="$BIN/lmstore"
ST="$W/store"
HF="$W/llama3-8b-shape"
export PYTHONUNBUFFERED=1 LMS_SRC_DIR=$PWD LMS_BIN=$PWD/$LMS

say() { echo "== $(date +%T) $*" | tee -a "$LOG"; }
jl() { tee -a "$RES"; }

tests() {
    say "CUDA tests"
    nvidia-smi --query-gpu=name,memory.total,driver_version,clocks.max.sm --format=csv | tee -a "$LOG"
    for t in engine_test_backend_cuda engine_test_engine_cuda engine_test_batch_cuda loader_test_loader_cuda; do
        LMS_TMP=$W/t-$t timeout 400 "$BIN/$t" >"$OUT/$t.log" 2>&1
        rc=$?
        echo "{\"what\": \"test\", \"test\": \"$t\", \"exit\": $rc}" | jl
        grep -E "MISMATCH|mismatches|rel diff|ppl|diverges|FAIL|PASSED|ERROR|->|device free|error" "$OUT/$t.log" | head -60
    done
}

make8b() {
    say "Llama-3-8B-shaped model"
    [ -f "$HF/config.json" ] || timeout 500 $PY bench/bench_load_hf.py make "$HF" | jl
    rm -rf "$ST"
    timeout 400 "$LMS" import "$HF" --store "$ST" --name llama8b 2>&1 | tail -1 | tee -a "$LOG"
}

bench8b() {
    say "lmstore bench engine (H200, llama8b)"
    $PY bench/bench_engine_hf.py hbm 16 | jl
    $PY bench/bench_engine_hf.py matmul | jl
    for args in "--prompt 128 --gen 128" "--prompt 128 --ctx 4096 --gen 128" "--prompt 2048 --gen 16 --reps 5"; do
        timeout 300 "$LMS" bench engine llama8b --store "$ST" --device cuda $args --json 2>>"$LOG" | jl
    done
    for codec in raw auto shuffle-zstd; do
        "$LMS" gc --store "$ST" --grace 0 >>"$LOG" 2>&1
        timeout 300 "$LMS" bench engine llama8b --store "$ST" --device cuda --prompt 128 --gen 8 --reps 1 \
            --session 4096 --codec $codec --json 2>>"$LOG" | jl
    done
    LMSTORE_CUDA_PDL=0 timeout 300 "$LMS" bench engine llama8b --store "$ST" --device cuda --prompt 128 --gen 128 \
        --json 2>>"$LOG" | sed 's/^{/{"variant": "no PDL", /' | jl
    LMSTORE_CUDA_GRAPH=0 timeout 300 "$LMS" bench engine llama8b --store "$ST" --device cuda --prompt 128 --gen 128 \
        --json 2>>"$LOG" | sed 's/^{/{"variant": "no graph", /' | jl
}

peers8b() {
    say "transformers on the same weights"
    timeout 400 $PY bench/bench_engine_hf.py decode "$HF" 128 2>>"$LOG" | jl
    timeout 200 $PY bench/bench_engine_hf.py prefill "$HF" 2048 2>>"$LOG" | jl
    timeout 200 $PY bench/bench_engine_hf.py greedy "$HF" "$OUT/greedy_llama8b.json" 2>>"$LOG" | jl
    $PY bench/compare_greedy.py "$OUT/greedy_llama8b.json" "$LMS" "$ST" llama8b cuda | jl
}

# Whole process to the first token (bench/cold_start.py), prompt of 32 ids:
# lmstore run on the GPU with the page cache warm and dropped, the time to
# cat the segment files after a drop, and transformers as a whole process.
coldstart() {
    say "cold start to the first token (llama8b, 32-token prompt)"
    local ids segs
    ids=$($PY -c 'print(",".join(str(i + 1) for i in range(32)))')
    segs=$(ls "$ST"/segments/*.seg)
    cat $segs >/dev/null
    $PY bench/cold_start.py --reps 5 --label lmstore_cuda_warm -- "$LMS" run llama8b --store "$ST" --device cuda \
        --prompt-ids "$ids" --max-tokens 1 --json | jl
    $PY bench/cold_start.py --reps 3 --label transformers_warm -- $PY bench/bench_engine_hf.py first "$HF" 32 | jl
    # where the time went: the engine made while the weights arrive, the first
    # step's layers run as they arrive (debug lines of one more warm run)
    LMSTORE_LOG=debug "$LMS" run llama8b --store "$ST" --device cuda --prompt-ids "$ids" --max-tokens 1 --json \
        2>&1 >/dev/null | grep -E "engine created|weights arrived|resident" | tee -a "$LOG"
    if [ "${LMS_BENCH_DROP:-0}" = 1 ]; then
        local s e
        sync; echo 3 >/proc/sys/vm/drop_caches
        s=$(date +%s%N); cat $segs >/dev/null; e=$(date +%s%N)
        echo "{\"what\": \"cat_segments_cold\", \"s\": $(( (e - s) / 1000000 )).0e-3}" | jl
        $PY bench/cold_start.py --reps 3 --drop --label lmstore_cuda_cold -- "$LMS" run llama8b --store "$ST" \
            --device cuda --prompt-ids "$ids" --max-tokens 1 --json | jl
    fi
}

# Per-kernel times and DRAM traffic (Nsight Compute) of a 128-token prefill
# and 3 decode steps, and of a 2048-token prefill, without graphs.
profile() {
    local ncu
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    [ -n "$ncu" ] || { echo "no ncu" | tee -a "$LOG"; return; }
    say "ncu: prefill 128 + 3 decode steps; prefill 2048"
    local m=gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum
    local ids
    ids=$($PY -c 'print(",".join(str((i * 7919) % 128000) for i in range(128)))')
    LMSTORE_CUDA_GRAPH=0 timeout 300 "$ncu" --clock-control none --csv --page raw --metrics $m "$LMS" run llama8b \
        --store "$ST" --device cuda --prompt-ids "$ids" --max-tokens 4 --ignore-eos >"$OUT/ncu_decode.csv" 2>>"$LOG"
    $PY bench/ncu_summary.py "$OUT/ncu_decode.csv" | tee -a "$LOG"
    ids=$($PY -c 'print(",".join(str((i * 7919) % 128000) for i in range(2048)))')
    LMSTORE_CUDA_GRAPH=0 timeout 300 "$ncu" --clock-control none --csv --page raw --metrics $m "$LMS" run llama8b \
        --store "$ST" --device cuda --prompt-ids "$ids" --max-tokens 1 --ignore-eos >"$OUT/ncu_prefill.csv" 2>>"$LOG"
    $PY bench/ncu_summary.py "$OUT/ncu_prefill.csv" | tee -a "$LOG"
}

batch8b() {
    say "lmstore bench batch llama8b --device cuda"
    timeout 400 "$LMS" bench batch llama8b --store "$ST" --device cuda --parallel 1,4,16,64 --prompt 32 --gen 64 \
        --reps 3 --json 2>>"$LOG" | jl
    timeout 300 "$LMS" bench batch llama8b --store "$ST" --device cuda --parallel 16 --prompt 32 --gen 32 --reps 1 \
        --kv-dtype f32 --check --json 2>>"$LOG" | jl
}

# Per-kernel times of one decode step of model $1 (a 1-token prompt: every
# launch is a one-row step; graphs off so that each kernel is seen), the first
# $2 launches.
step_profile() {
    local ncu
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    [ -n "$ncu" ] || { echo "no ncu" | tee -a "$LOG"; return; }
    say "ncu: one decode step of $1"
    LMSTORE_CUDA_GRAPH=0 timeout 200 "$ncu" --clock-control none --csv --page raw -c "$2" \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum "$LMS" run "$1" --store "$ST" \
        --device cuda --prompt-ids 1 --max-tokens 2 --ignore-eos >"$OUT/ncu_step_$1.csv" 2>>"$LOG"
    $PY bench/ncu_summary.py "$OUT/ncu_step_$1.csv" | tee -a "$LOG"
}

decode8b() {
    say "decode of llama8b, bf16 and MLX 4/8-bit"
    $PY bench/bench_engine_hf.py hbm 16 | jl
    local t
    for ty in mlx4 mlx8; do
        "$LMS" info llama8b-$ty --store "$ST" >/dev/null 2>&1 && continue
        t=$(date +%s%N)
        timeout 400 "$LMS" quantize llama8b llama8b-$ty --type $ty --store "$ST" 2>&1 | tail -1 | tee -a "$LOG"
        echo "{\"what\": \"quantize\", \"type\": \"$ty\", \"s\": $(( ($(date +%s%N) - t) / 1000000 )).0e-3}" | jl
    done
    for m in llama8b-mlx4 llama8b-mlx8 llama8b; do
        timeout 200 "$LMS" bench engine $m --store "$ST" --device cuda --prompt 128 --gen 128 --json 2>>"$LOG" | jl
        LMSTORE_CUDA_PDL=1 timeout 200 "$LMS" bench engine $m --store "$ST" --device cuda --prompt 128 --gen 128 \
            --json 2>>"$LOG" | sed 's/^{/{"variant": "PDL", /' | jl
    done
    for m in llama8b-mlx4 llama8b-mlx8; do
        LMSTORE_CUDA_MLX_EXACT=1 timeout 200 "$LMS" bench engine $m --store "$ST" --device cuda --prompt 128 --gen 128 \
            --json 2>>"$LOG" | sed 's/^{/{"variant": "f32 activations", /' | jl
    done
    step_profile llama8b-mlx4 170
    step_profile llama8b 170
}

# The gemma-3-12b-shaped bf16 model in the store as gemma12b (the 8B model's
# files are removed first for disk space).
make12b() {
    local g=$W/gemma3-12b-shape
    say "gemma-3-12b-shaped model"
    rm -rf "$HF" "$ST"
    [ -f "$g/config.json" ] || timeout 500 $PY tests/gen_model.py "$g" --arch gemma3 --hidden 3840 --intermediate 15360 \
        --layers 48 --heads 16 --kv-heads 8 --head-dim 256 --vocab 262144 --tied --window 1024 --max-pos 8192 \
        --shard-size 4G --pooled 2>&1 | tail -1 | tee -a "$LOG"
    timeout 400 "$LMS" import "$g" --store "$ST" --name gemma12b 2>&1 | tail -1 | tee -a "$LOG"
    rm -rf "$g"
}

gemma12bdec() {
    make12b
    timeout 200 "$LMS" bench engine gemma12b --store "$ST" --device cuda --prompt 128 --gen 128 --json 2>>"$LOG" | jl
    LMSTORE_CUDA_PDL=1 timeout 200 "$LMS" bench engine gemma12b --store "$ST" --device cuda --prompt 128 --gen 128 \
        --json 2>>"$LOG" | sed 's/^{/{"variant": "PDL", /' | jl
    LMSTORE_CUDA_FUSE_ROPE=0 timeout 200 "$LMS" bench engine gemma12b --store "$ST" --device cuda --prompt 128 --gen 128 \
        --json 2>>"$LOG" | sed 's/^{/{"variant": "RoPE not fused", /' | jl
    step_profile gemma12b 250
}

# lmstore serve on the GPU: the 8B shape with Llama 3's tokenizer (its vocabulary
# is the shape's 128256), imported as llama8b-tok; for C clients a server with
# --parallel C, warmed by one request, then C streaming greedy clients
# (bench/serve_load.py) for 10 s after 3 s of warm-up.
serve8b() {
    say "lmstore serve --device cuda (llama8b with Llama 3's tokenizer)"
    [ -f "$HF/config.json" ] || timeout 500 $PY bench/bench_load_hf.py make "$HF" | jl
    for f in tokenizer.json tokenizer_config.json; do
        gzip -dc "tests/fixtures/tokenizers/llama3.$f.gz" >"$HF/$f"
    done
    "$LMS" info llama8b-tok --store "$ST" >/dev/null 2>&1 ||
        timeout 400 "$LMS" import "$HF" --store "$ST" --name llama8b-tok 2>&1 | tail -1 | tee -a "$LOG"
    local c port pid
    for c in 1 4 16 64; do
        port=$((18000 + c))
        "$LMS" serve llama8b-tok --store "$ST" --device cuda --parallel "$c" --ctx 512 --port "$port" \
            --no-prefix-store 2>>"$LOG" &
        pid=$!
        $PY - "$port" <<'EOF' 2>>"$LOG"
import json, sys, time, urllib.request
u = "http://127.0.0.1:%s" % sys.argv[1]
for _ in range(240):
    try:
        urllib.request.urlopen(u + "/health", timeout=2)
        break
    except Exception:
        time.sleep(0.5)
r = urllib.request.Request(u + "/v1/completions", json.dumps({"prompt": "Hello", "max_tokens": 8}).encode(),
                           {"Content-Type": "application/json"})
urllib.request.urlopen(r, timeout=120).read()
EOF
        timeout 60 $PY bench/serve_load.py "http://127.0.0.1:$port" --clients "$c" --seconds 10 --warmup 3 \
            --model llama8b-tok | sed 's/^{/{"what": "serve_cuda", /' | jl
        kill "$pid"; wait "$pid"
    done
}

mlx8b() {
    say "llama8b as MLX 4-bit and 8-bit"
    local t
    for ty in mlx4 mlx8; do
        t=$(date +%s%N)
        timeout 400 "$LMS" quantize llama8b llama8b-$ty --type $ty --store "$ST" 2>&1 | tail -1 | tee -a "$LOG"
        echo "{\"what\": \"quantize\", \"type\": \"$ty\", \"s\": $(( ($(date +%s%N) - t) / 1000000 )).0e-3}" | jl
        for args in "--prompt 128 --gen 128" "--prompt 2048 --gen 16 --reps 3"; do
            timeout 300 "$LMS" bench engine llama8b-$ty --store "$ST" --device cuda $args --json 2>>"$LOG" | jl
        done
    done
}

gemma12b() {
    make12b
    for args in "--prompt 128 --gen 128" "--prompt 128 --ctx 4096 --gen 128" "--prompt 2048 --gen 16 --reps 3"; do
        timeout 300 "$LMS" bench engine gemma12b --store "$ST" --device cuda $args --json 2>>"$LOG" | jl
    done
}

smollm2() {
    local gguf=$1 d=$W/smollm2
    say "SmolLM2-135M-Instruct"
    if [ ! -f "$d/model.safetensors" ]; then
        $PY tools/gguf_to_hf.py "$gguf" "$d" >>"$LOG" 2>&1 || { echo "conversion failed" | tee -a "$LOG"; return; }
    fi
    "$LMS" info smollm2 --store "$ST" >/dev/null 2>&1 || "$LMS" import "$d" --store "$ST" --name smollm2 | tail -1
    timeout 200 $PY bench/bench_engine_hf.py greedy "$d" "$OUT/greedy_smollm2.json" tests/fixtures/smollm2/reference.json \
        2>>"$LOG" | jl
    $PY bench/compare_greedy.py "$OUT/greedy_smollm2.json" "$LMS" "$ST" smollm2 cuda | jl
    $PY bench/compare_greedy.py "$OUT/greedy_smollm2.json" "$LMS" "$ST" smollm2 cpu | sed 's/^{/{"note": "cpu", /' | jl
    timeout 120 "$LMS" bench engine smollm2 --store "$ST" --device cuda --prompt 128 --gen 128 --json 2>>"$LOG" | jl
}

while [ $# -gt 0 ]; do
    case $1 in
    tests) tests ;;
    make8b) make8b ;;
    bench8b) bench8b ;;
    batch8b) batch8b ;;
    serve8b) serve8b ;;
    peers8b) peers8b ;;
    smollm2) smollm2 "$2"; shift ;;
    profile) profile ;;
    mlx8b) mlx8b ;;
    gemma12b) gemma12b ;;
    decode8b) decode8b ;;
    gemma12bdec) gemma12bdec ;;
    coldstart) coldstart ;;
    *) echo "unknown phase $1" >&2; exit 2 ;;
    esac
    shift
done
