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
#   peerbuild SRC    llama.cpp built for CUDA from SRC (a source tree, or the
#                    archive that bench/build_llamacpp_cuda.sh pack writes)
#                    into $W/llama.cpp, in the background (detached, so that
#                    it outlives the command; the phases below wait for it):
#                    make the model meanwhile
#   gguf8b           the 8B shape with Llama 3's tokenizer (llama8b-tok, as
#                    serve8b makes it) written as one BF16 GGUF by `lmstore
#                    export`, for llama.cpp; the HF shards are removed then
#                    (disk space: store, GGUF and HF copies are 16 GB each)
#   peerserve8b      llama-server (-ngl 99, the same --parallel, 512 tokens of
#                    context per slot) against `lmstore serve --device cuda`
#                    on those weights: greedy ids of one prompt on both first,
#                    then serve8b's load at 1/4/16/64 clients on each server,
#                    alternating, SERVE_ROUNDS rounds (default 2)
#   clusterab M...   (last) decode of the models M (llama8b, gemma12b) with the
#                    attention's splits merged in thread block clusters (the
#                    default) and through global memory
#                    (LMSTORE_CUDA_ATT_CLUSTER=0), alternating, AB_ROUNDS rounds
#                    (default 3) at 128 tokens of context, one at 4096
#   make12b          the gemma-3-12b-shaped model alone (as gemma12b makes it)
#   envab M          (last) decode of model M at 128 tokens of context under each
#                    setting of AB_ENVS ('|' between settings, each "none" or
#                    VAR=VALUE [VAR=VALUE ...]; default "none|LMSTORE_CUDA_PDL=1"),
#                    alternating, AB_ROUNDS rounds (default 3); a setting's
#                    LMS=PATH runs the lmstore at PATH instead (another build)
#   cpu8b            lmstore's CPU engine against llama.cpp's CPU path (the
#                    GPU hidden: CUDA_VISIBLE_DEVICES= -ngl 0 -nopo 1) on those
#                    weights, CPU_THREADS threads (default: every CPU), PAIRS
#                    alternating pairs (default 3): decode 64 tokens after
#                    128, prefill 128 and 512, the measurements of
#                    bench/bench_vs_llamacpp.sh
#
# LLAMACPP_BIN: the folder with llama-server and llama-bench (default: where
# peerbuild puts them).
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
GGUF="$W/llama8b-tok-bf16.gguf"
LLB=${LLAMACPP_BIN:-$W/llama.cpp/bin}
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
    # again with programmatic dependent launch on for every model (by default only MLX models
    # have it): a kernel of a step that read its predecessor's output without waiting for it
    # would show here as mismatches
    for t in engine_test_backend_cuda engine_test_engine_cuda engine_test_batch_cuda; do
        LMSTORE_CUDA_PDL=1 LMS_TMP=$W/tp-$t timeout 400 "$BIN/$t" >"$OUT/pdl_$t.log" 2>&1
        rc=$?
        echo "{\"what\": \"test\", \"test\": \"$t\", \"pdl\": 1, \"exit\": $rc}" | jl
        grep -E "mismatches|FAIL|PASSED" "$OUT/pdl_$t.log" | head -20
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
        timeout 300 "$LMS" bench engine llama8b --store "$ST" --device cuda --prompt 128 --gen 8 --reps 5 \
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
# launch is a one-row step; graphs off so that each kernel is seen): the
# second step among the first $2 launches (the first step carries the
# launches' one-time costs). The caches are left as the kernels leave them
# (--cache-control none), as in a replayed step.
step_profile() {
    local ncu
    ncu=$(command -v ncu || ls /opt/nvidia/nsight-compute/*/ncu 2>/dev/null | head -1)
    [ -n "$ncu" ] || { echo "no ncu" | tee -a "$LOG"; return; }
    say "ncu: one decode step of $1"
    LMSTORE_CUDA_GRAPH=0 timeout 200 "$ncu" --clock-control none --cache-control none --csv --page raw -c "$2" \
        --metrics gpu__time_duration.sum,dram__bytes_read.sum,dram__bytes_write.sum "$LMS" run "$1" --store "$ST" \
        --device cuda --prompt-ids 1 --max-tokens 3 --ignore-eos >"$OUT/ncu_step_$1.csv" 2>>"$LOG"
    $PY bench/ncu_summary.py "$OUT/ncu_step_$1.csv" --step 2 | tee -a "$LOG"
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
    step_profile llama8b-mlx4 400
    step_profile llama8b 400
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
    step_profile gemma12b 700
}

clusterab() {
    local m r v
    say "decode, attention merged in clusters and through global memory: $*"
    # model, clusters 1|0, tag, extra arguments
    ab_decode() {
        LMSTORE_CUDA_ATT_CLUSTER=$2 timeout 200 "$LMS" bench engine "$1" --store "$ST" --device cuda --prompt 128 \
            --gen 128 "${@:4}" --json 2>>"$LOG" | sed "s/^{/{\"variant\": \"cluster $2\", $3/" | jl
    }
    for r in $(seq "${AB_ROUNDS:-3}"); do
        for m in "$@"; do
            for v in 1 0; do ab_decode "$m" $v "\"round\": $r, "; done
        done
    done
    for m in "$@"; do
        for v in 1 0; do ab_decode "$m" $v "" --ctx 4096; done
    done
}

envab() {
    local m=$1 r v
    local -a vs
    IFS='|' read -ra vs <<<"${AB_ENVS:-none|LMSTORE_CUDA_PDL=1}"
    say "decode of $m under ${vs[*]}, alternating"
    for r in $(seq "${AB_ROUNDS:-3}"); do
        for v in "${vs[@]}"; do
            local lms=$LMS w
            local -a e=()
            for w in $v; do
                case $w in
                none) ;;
                LMS=*) lms=${w#LMS=} ;;
                *) e+=("$w") ;;
                esac
            done
            env "${e[@]}" timeout 200 "$lms" bench engine "$m" --store "$ST" --device cuda \
                --prompt 128 --gen 128 --json 2>>"$LOG" | sed "s|^{|{\"variant\": \"$v\", \"round\": $r, |" | jl
        done
    done
}

# The 8B shape with Llama 3's tokenizer (its vocabulary is the shape's
# 128256), imported as llama8b-tok.
tok8b() {
    "$LMS" info llama8b-tok --store "$ST" >/dev/null 2>&1 && return
    [ -f "$HF/config.json" ] || timeout 500 $PY bench/bench_load_hf.py make "$HF" | jl
    for f in tokenizer.json tokenizer_config.json; do
        gzip -dc "tests/fixtures/tokenizers/llama3.$f.gz" >"$HF/$f"
    done
    timeout 400 "$LMS" import "$HF" --store "$ST" --name llama8b-tok 2>&1 | tail -1 | tee -a "$LOG"
}

# Server $1 (lmstore or llama) over llama8b-tok with --parallel $2 and 512
# tokens of context per slot, on port $3, in the background ($SPID); returns
# once it has answered one 8-token request.
server_start() {
    if [ "$1" = lmstore ]; then
        "$LMS" serve llama8b-tok --store "$ST" --device cuda --parallel "$2" --ctx 512 --port "$3" \
            --no-prefix-store 2>>"$LOG" &
    else
        "$LLB/llama-server" -m "$GGUF" --host 127.0.0.1 --port "$3" -np "$2" -c $(($2 * 512)) -ngl 99 \
            --no-webui >>"$OUT/llama-server.log" 2>&1 &
    fi
    SPID=$!
    $PY bench/peer_gpu.py ready "http://127.0.0.1:$3" 2>>"$LOG"
}

# lmstore serve on the GPU: for C clients a server with --parallel C, warmed
# by one request, then C streaming greedy clients (bench/serve_load.py) for
# 10 s after 3 s of warm-up.
serve8b() {
    say "lmstore serve --device cuda (llama8b with Llama 3's tokenizer)"
    tok8b
    local c port
    for c in 1 4 16 64; do
        port=$((18000 + c))
        server_start lmstore "$c" "$port"
        timeout 60 $PY bench/serve_load.py "http://127.0.0.1:$port" --clients "$c" --seconds 10 --warmup 3 \
            --model llama8b-tok | sed 's/^{/{"what": "serve_cuda", /' | jl
        kill "$SPID"; wait "$SPID"
    done
}

peerbuild() {
    local src=$1
    case $src in /*) ;; *) src=$PWD/$src ;; esac
    say "llama.cpp CUDA build from $1 in the background (log $W/llama.cpp.log)"
    rm -f "$W/llama.cpp.rc"
    setsid bash -c '"$1" build "$2" "$3" >"$3.log" 2>&1; echo $? >"$3.rc"' _ "$PWD/bench/build_llamacpp_cuda.sh" \
        "$src" "$W/llama.cpp" </dev/null >/dev/null 2>&1 &
}

# Until peerbuild's build has ended (at most $1 s, default 560); fails if it
# failed. A LLAMACPP_BIN given, or a build already made, is used as it is.
peer_wait() {
    if [ ! -f "$W/llama.cpp.log" ] || [ -f "$W/llama.cpp.rc" ]; then
        [ -x "$LLB/llama-server" ] && return 0
    fi
    local i
    for ((i = 0; i < ${1:-560}; i += 5)); do
        [ -f "$W/llama.cpp.rc" ] && break
        sleep 5
    done
    tail -3 "$W/llama.cpp.log" | tee -a "$LOG"
    [ -x "$LLB/llama-server" ] || { say "no llama.cpp build in $LLB"; return 1; }
}

gguf8b() {
    say "llama8b-tok as a BF16 GGUF (lmstore export)"
    df -h "$W" | tee -a "$LOG"
    tok8b
    local t
    if [ ! -f "$GGUF" ]; then
        t=$(date +%s%N)
        timeout 400 "$LMS" export llama8b-tok "$GGUF" --store "$ST" 2>&1 | tail -1 | tee -a "$LOG"
        echo "{\"what\": \"export_gguf\", \"s\": $(( ($(date +%s%N) - t) / 1000000 )).0e-3}" | jl
    fi
    rm -f "$HF"/*.safetensors
}

# llama-server (CUDA) against lmstore serve: greedy ids of one prompt
# (bench/peer_gpu.py greedy), then for each of SERVE_ROUNDS rounds and each
# C, both servers in turn (the order alternating) as serve8b measures them.
peerserve8b() {
    say "llama-server (CUDA) against lmstore serve --device cuda, llama8b-tok"
    peer_wait || return
    [ -f "$GGUF" ] || gguf8b
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader | tee -a "$LOG"
    local r c who order port=18200
    timeout 120 "$LMS" run llama8b-tok --store "$ST" --device cuda --max-tokens 16 --ignore-eos --json \
        -p "$($PY bench/peer_gpu.py prompt)" >"$OUT/greedy_lmstore.json" 2>>"$LOG"
    timeout 120 "$LMS" logits llama8b-tok --store "$ST" --device cuda --out "$W/logits.f32" --prompt-ids \
        "$($PY -c 'import json, sys; print(",".join(map(str, json.load(sys.stdin)["prompt_ids"])))' \
        <"$OUT/greedy_lmstore.json")" 2>>"$LOG"
    server_start llama 1 "$port"
    $PY bench/peer_gpu.py greedy "http://127.0.0.1:$port" "$OUT/greedy_lmstore.json" "$W/logits.f32" | jl
    kill "$SPID"; wait "$SPID"
    for ((r = 1; r <= ${SERVE_ROUNDS:-2}; r++)); do
        for c in 1 4 16 64; do
            order="lmstore llama"
            [ $(((r + c) % 2)) = 1 ] || order="llama lmstore"
            for who in $order; do
                port=$((port + 1))
                server_start "$who" "$c" "$port"
                timeout 60 $PY bench/serve_load.py "http://127.0.0.1:$port" --clients "$c" --seconds 10 --warmup 3 \
                    --model llama8b-tok |
                    sed "s/^{/{\"what\": \"serve_peer\", \"engine\": \"$who\", \"round\": $r, /" | jl
                kill "$SPID"; wait "$SPID"
            done
        done
    done
    $PY bench/peer_gpu.py servetable "$RES" | tee -a "$LOG"
}

# CPU engines on the 8B shape: for each of PAIRS rounds (the order
# alternating) `lmstore bench engine --device cpu` and llama-bench with the
# GPU hidden, as bench/bench_vs_llamacpp.sh runs them; bench/membw.c's read
# bandwidth with the same threads before each round when it is in $BIN.
cpu8b() {
    local t=${CPU_THREADS:-$(nproc)} r a who bw
    say "CPU engines, llama8b-tok: lmstore --device cpu against llama.cpp (GPU hidden), $t threads"
    peer_wait || return
    [ -f "$GGUF" ] || gguf8b
    grep -m1 'model name' /proc/cpuinfo | tee -a "$LOG"
    cat "$GGUF" "$ST"/segments/* >/dev/null
    for ((r = 1; r <= ${PAIRS:-3}; r++)); do
        bw=null
        [ -x "$BIN/membw" ] && bw=$("$BIN/membw" --threads "$t" --mib 1024 --reps 5 --json)
        echo "{\"what\": \"cpu_pair\", \"round\": $r, \"load\": \"$(cut -d' ' -f1-3 /proc/loadavg)\", \"membw\": $bw}" | jl
        for who in $([ $((r % 2)) = 1 ] && echo "lmstore llama" || echo "llama lmstore"); do
            if [ "$who" = lmstore ]; then
                for a in "--prompt 128 --gen 64" "--prompt 512 --gen 2"; do
                    timeout 300 "$LMS" bench engine llama8b-tok --store "$ST" --device cpu --threads "$t" $a --reps 1 \
                        --membw-mib 16 --json 2>>"$LOG" | sed "s/^{/{\"what\": \"cpu_lmstore\", \"round\": $r, /" | jl
                done
            else
                for a in "-p 0 -n 64 -d 128" "-p 128,512 -n 0"; do
                    CUDA_VISIBLE_DEVICES= timeout 300 "$LLB/llama-bench" -m "$GGUF" -t "$t" -r 1 $a -ngl 0 -nopo 1 \
                        -o jsonl 2>>"$LOG" | sed "s/^{/{\"what\": \"cpu_llama\", \"round\": $r, /" | jl
                done
            fi
        done
    done
    $PY bench/peer_gpu.py cputable "$RES" | tee -a "$LOG"
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
    make12b) make12b ;;
    clusterab) shift; clusterab "$@"; break ;;
    envab) envab "$2"; break ;;
    coldstart) coldstart ;;
    peerbuild) peerbuild "$2"; shift ;;
    gguf8b) gguf8b ;;
    peerserve8b) peerserve8b ;;
    cpu8b) cpu8b ;;
    *) echo "unknown phase $1" >&2; exit 2 ;;
    esac
    shift
done
