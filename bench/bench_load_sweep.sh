#!/usr/bin/env bash
# bench/bench_load_sweep.sh - the loader's parameter sweep on a GPU machine, in
# one go: which copy source, thread count, chunk size and ring allocation load
# a Llama-3-8B-shaped bf16 model (16 GB) fastest with the page cache warm, each
# next to the pinned host-to-device bandwidth measured in the same run.
#   1. the CUDA loader tests (device bytes == host bytes in every path);
#   2. optional extra commands (LMS_SWEEP_PRE, e.g. other modules' GPU benches);
#   3. the model (bench_load_hf.py make, as bench_load_gpu.sh does) and its import;
#   4. warm: pinned H2D, then `lmstore bench load` over the settings below, each
#      one process and one JSON line in $OUT/results.jsonl; the fastest setting
#      is run three more times, and the default (AUTO) three times;
#   5. cold (LMS_BENCH_DROP=1 only): sequential read of the segments, AUTO.
# LMS_SWEEP_SET=ring runs, instead of the settings of step 4, only the ring's
# first-layer settings (--ring-first, 4 MiB chunks, 12 threads), each
# LMS_SWEEP_REPS times (default 3), and the pinned H2D again at the end.
# LMS_SWEEP_SET=reserve runs the host's limits first (bench/readbw: the staged
# reads without a device; bench/membw: read bandwidth), then, interleaved
# LMS_SWEEP_REPS times, the default load without and with the staging ring
# reserved at device open (--reserve) and the ring's shape, thread count and
# split share with it reserved.
#
# Usage (repository root, CUDA build in $LMS_BUILD, LD_LIBRARY_PATH set):
#   LMS_BUILD=build-cuda OUT=/tmp/out LMS_BENCH_DROP=1 bench/bench_load_sweep.sh [WORKDIR]
set -u
B=${LMS_BUILD:-build}
OUT=${OUT:-/tmp/lms-bench-sweep}
W=${1:-/tmp/lms-bench-load-work}
mkdir -p "$OUT" "$W"
LOG=$OUT/sweep.log
RES=$OUT/results.jsonl
: >"$RES"
LMS="$B/lmstore"
HF="$W/llama3-8b-shape"
ST="$W/store"
PY=${PYTHON:-python3}
export PYTHONUNBUFFERED=1

say() { echo "== $(date +%T) $*" | tee -a "$LOG"; }

lmsload() { # LABEL CACHE ARGS...
    local label=$1 cache=$2 line
    shift 2
    line=$(timeout 120 "$LMS" bench load llama8b --store "$ST" --device cuda --place resident --json "$@" 2>>"$LOG")
    if [ -n "$line" ]; then
        $PY -c "import json,sys; d=json.loads(sys.argv[1]); d['what']='$label'; d['cache']='$cache'; d['args']='$*'; print(json.dumps(d))" "$line" >>"$RES"
        $PY -c "import json,sys; d=json.loads(sys.argv[1]); print('%-34s %-44s %7.3f s %6.2f GB/s first %.4f s (%.1f%%)' % ('$label', '$*', d['all_s'], d['gb_per_s'], d['first_layer_s'], 100*d['first_layer_fraction']))" "$line" | tee -a "$LOG"
    else
        echo "{\"what\": \"$label\", \"cache\": \"$cache\", \"error\": true, \"args\": \"$*\"}" | tee -a "$RES"
    fi
}

say "machine"
{ nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv
  nproc; free -g; uname -r; cat /sys/kernel/mm/transparent_hugepage/enabled; lscpu; } >>"$LOG" 2>&1

say "1. CUDA loader tests"
LMS_TMP=$W/t timeout 300 "$B/tests/loader_test_loader_cuda" >"$OUT/tests_cuda.log" 2>&1
echo "loader_test_loader_cuda exit $?" | tee -a "$LOG"
grep -E "^\[ +(OK|FAILED|PASSED|SKIPPED) +\]|resident copy|mapped" "$OUT/tests_cuda.log" | tee -a "$LOG"

if [ -n "${LMS_SWEEP_PRE:-}" ]; then
    say "2. extra: $LMS_SWEEP_PRE"
    bash -c "$LMS_SWEEP_PRE" 2>&1 | tee -a "$LOG"
fi

say "3. model"
if [ ! -f "$HF/config.json" ]; then
    timeout 300 $PY bench/bench_load_hf.py make "$HF" 2>>"$LOG" | tail -1 | tee -a "$RES"
fi
rm -rf "$ST"
s=$(date +%s%N)
timeout 300 "$LMS" import "$HF" --store "$ST" --name llama8b 2>&1 | tail -1 | tee -a "$LOG"
e=$(date +%s%N)
echo "import took $(( (e - s) / 1000000 )) ms" | tee -a "$LOG"
SEGS=$(ls "$ST"/segments/*.seg)

say "4. warm"
cat $SEGS >/dev/null
timeout 120 $PY bench/bench_load_hf.py h2d 2>>"$LOG" | tail -1 | tee -a "$RES" "$LOG"
if [ "${LMS_SWEEP_SET:-all}" = reserve ]; then
    for t in 8 12 16; do
        "$B/readbw" --threads $t --reps 3 --json $SEGS | tee -a "$RES" "$LOG"
    done
    "$B/readbw" --threads 8 --chunk 2 --reps 3 --json $SEGS | tee -a "$RES" "$LOG"
    "$B/readbw" --threads 8 --slots 0 --reps 3 --json $SEGS | tee -a "$RES" "$LOG"
    "$B/readbw" --threads 16 --slots 0 --reps 3 --json $SEGS | tee -a "$RES" "$LOG"
    for t in 8 16; do "$B/membw" --threads $t --mib 2048 --reps 5 --json | tee -a "$LOG"; done
    for i in $(seq "${LMS_SWEEP_REPS:-3}"); do
        lmsload auto warm
        lmsload reserve warm --reserve
        lmsload reserve_c2 warm --reserve --chunk 2M
        lmsload reserve_c4 warm --reserve --chunk 4M
        lmsload reserve_c2_s32_t12 warm --reserve --chunk 2M --slots 32 --threads 12
        lmsload reserve_t12 warm --reserve --threads 12
        lmsload reserve_t16 warm --reserve --threads 16
        lmsload reserve_split15 warm --reserve --copy split --register-percent 15
        lmsload reserve_split30 warm --reserve --copy split --register-percent 30
    done
    timeout 120 $PY bench/bench_load_hf.py h2d 2>>"$LOG" | tail -1 | tee -a "$RES" "$LOG"
elif [ "${LMS_SWEEP_SET:-all}" = ring ]; then
    # the ring's first layer: how many slots carry layer 0 (--ring-first; the
    # whole ring = the behaviour before ring_first_slots), 4 MiB chunks, 12
    # threads; LMS_SWEEP_REPS rounds, the settings interleaved in each
    for i in $(seq "${LMS_SWEEP_REPS:-3}"); do
        lmsload auto warm
        lmsload ring_first_all warm --ring-first 1024
        lmsload ring_first_2 warm --ring-first 2
        lmsload ring_first_8 warm --ring-first 8
        lmsload c4 warm --chunk 4M
        lmsload c4_ring_first_all warm --chunk 4M --ring-first 1024
        lmsload t12 warm --threads 12
        lmsload t12_ring_first_all warm --threads 12 --ring-first 1024
    done
    timeout 120 $PY bench/bench_load_hf.py h2d 2>>"$LOG" | tail -1 | tee -a "$RES" "$LOG"
else
lmsload old_default warm --copy stage-read --threads 8 --ring-hostalloc
lmsload stage_read_t8 warm --copy stage-read --threads 8
lmsload old_default warm --copy stage-read --threads 8 --ring-hostalloc
lmsload stage_read_t8 warm --copy stage-read --threads 8
lmsload stage_read_t12 warm --copy stage-read --threads 12
lmsload stage_read_t16 warm --copy stage-read --threads 16
lmsload stage_read_t8_c8 warm --copy stage-read --threads 8 --chunk 8M
lmsload stage_read_t8_c32 warm --copy stage-read --threads 8 --chunk 32M
lmsload stage_read_t8_s32 warm --copy stage-read --threads 8 --slots 32
lmsload stage_read_t8_st2 warm --copy stage-read --threads 8 --streams 2
lmsload stage_read_t8_st8 warm --copy stage-read --threads 8 --streams 8
lmsload stage_map_t8 warm --copy stage-map --threads 8
lmsload stage_map_t16 warm --copy stage-map --threads 16
lmsload register_t8 warm --copy register --threads 8
lmsload register_t8_populate warm --copy register --threads 8 --prefetch populate
lmsload split_t8_p25 warm --copy split --threads 8 --register-percent 25
lmsload split_t8_p50 warm --copy split --threads 8 --register-percent 50
lmsload split_t8_p75 warm --copy split --threads 8 --register-percent 75
lmsload split_t12_p50 warm --copy split --threads 12 --register-percent 50
lmsload split_t16_p50 warm --copy split --threads 16 --register-percent 50
lmsload split_t12_p35 warm --copy split --threads 12 --register-percent 35
lmsload split_t8_p50_hostalloc warm --copy split --threads 8 --register-percent 50 --ring-hostalloc
best=$($PY - "$RES" <<'EOF'
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
rows = [r for r in rows if r.get("cache") == "warm" and "all_s" in r and r.get("what") != "make"]
print(min(rows, key=lambda r: r["all_s"])["args"] if rows else "")
EOF
)
say "best: $best (three more runs)"
for i in 1 2 3; do lmsload best warm $best; done
for i in 1 2 3; do lmsload auto warm; done
fi

if [ "${LMS_BENCH_DROP:-0}" = 1 ]; then
    say "5. cold"
    sync; echo 3 >/proc/sys/vm/drop_caches
    s=$(date +%s%N); cat $SEGS >/dev/null; e=$(date +%s%N)
    b=$(stat -c %s $SEGS | awk '{s+=$1} END {print s}')
    echo "{\"what\": \"seqread_segments\", \"cache\": \"cold\", \"bytes\": $b, \"all_s\": $(( (e - s) / 1000 ))e-6}" | tee -a "$RES"
    sync; echo 3 >/proc/sys/vm/drop_caches
    lmsload auto cold
fi

say "summary"
$PY - "$RES" <<'EOF' | tee "$OUT/summary.txt"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
h2d = next((r["pinned_gb_per_s"] for r in rows if r.get("what") == "h2d"), None)
print(f"pinned H2D: {h2d} GB/s")
for d in rows:
    if d.get("what") == "readbw":
        print(f"readbw threads {d['threads']} chunk {d['chunk_bytes'] >> 20} MiB slots {d['slots']}: best {d['best_gb_per_s']:.2f} GB/s, mean {d['mean_gb_per_s']:.2f} GB/s")
for d in rows:
    if "all_s" not in d or d.get("what") in ("make", "readbw"):
        continue
    gbs = d.get("gb_per_s") or d["bytes"] / d["all_s"] / 1e9
    share = f"{100 * gbs / h2d:5.1f}%" if h2d else ""
    fl = d.get("first_layer_s")
    flt = f"{fl:.4f} ({100 * d['first_layer_fraction']:.1f}%)" if fl is not None else ""
    extra = f" setup {d['setup_s']:.4f} copy0 {d['first_copy_s']:.4f} resv {d['ring_reserved']}" if "setup_s" in d else ""
    print(f"{d['what']:24} {d.get('cache',''):5} {d.get('path',''):10} {d.get('args',''):52} {d['all_s']:7.3f} {gbs:6.2f} {share} {flt}{extra}")
EOF
