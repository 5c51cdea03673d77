#!/usr/bin/env bash
# bench/bench_load_gpu.sh - the loader's GPU run, all in one go:
#   1. the CUDA loader tests (device bytes == host bytes in every placement and path);
#   2. a Llama-3-8B-shaped bf16 model with random weights, written by transformers'
#      save_pretrained in 5 GB shards, imported with `lmstore import`;
#   3. page cache warm: pinned host-to-device bandwidth, a plain sequential read of
#      the files, the staged reads without a device (bench/readbw), `lmstore bench load` (resident: several settings; mapped),
#      safetensors load_file(device="cuda"), transformers from_pretrained(device_map="cuda");
#      then LMS_BENCH_REPS (default 5) rounds of the default load with and without
#      the staging ring reserved at device open (--reserve), interleaved, and the
#      pinned host-to-device bandwidth again;
#   4. page cache cold (echo 3 > /proc/sys/vm/drop_caches before each): the same
#      sequential reads and loaders.
# Every measurement is one process and one JSON line in $OUT/results.jsonl; a
# table is printed at the end.
#
# Usage (from the repository root, with a CUDA build in $LMS_BUILD):
#   LMS_BUILD=build-cuda OUT=/tmp/out LMS_BENCH_DROP=1 bench/bench_load_gpu.sh [WORKDIR]
# LMS_BENCH_DROP=1 lets it drop the page cache (root; a machine of your own);
# without it the "cold" rows are not cold, and the log says so.
# LD_LIBRARY_PATH must find the build's shared libraries (bench/carry-libs.sh copies them).
set -u
B=${LMS_BUILD:-build}
OUT=${OUT:-/tmp/lms-bench-load}
W=${1:-/tmp/lms-bench-load-work}
mkdir -p "$OUT" "$W"
LOG=$OUT/bench.log
RES=$OUT/results.jsonl
: >"$RES"
LMS="$B/lmstore"
HF="$W/llama3-8b-shape"
ST="$W/store"
PY=${PYTHON:-python3}
DEV=${LMS_BENCH_DEVICE:-cuda}
export PYTHONUNBUFFERED=1
export LMSTORE_LOG=${LMSTORE_LOG:-info}

say() { echo "== $(date +%T) $*" | tee -a "$LOG"; }
ms() { date +%s%N; }

# Dropping the page cache disturbs everything else on the machine: only when
# asked for (LMS_BENCH_DROP=1, on a machine of one's own).
can_drop=0
drop() {
    sync
    C=not-dropped
    [ "${LMS_BENCH_DROP:-0}" = 1 ] || return 0
    if echo 3 >/proc/sys/vm/drop_caches 2>/dev/null; then can_drop=1; C=cold; else can_drop=0; fi
}

# seqread LABEL FILES...: cat the files to /dev/null, one after another
seqread() {
    local label=$1 cache=$2
    shift 2
    local bytes=0 f
    for f in "$@"; do bytes=$((bytes + $(stat -c %s "$f"))); done
    local s e
    s=$(ms)
    cat "$@" >/dev/null
    e=$(ms)
    $PY -c "import json,sys; b=$bytes; t=($e-$s)/1e9; print(json.dumps({'what':'$label','cache':'$cache','bytes':b,'all_s':t,'gb_per_s':b/t/1e9}))" | tee -a "$RES"
}

# lmsload LABEL CACHE ARGS...: one `lmstore bench load` run
lmsload() {
    local label=$1 cache=$2
    shift 2
    local line
    line=$(timeout 300 "$LMS" bench load llama8b --store "$ST" --device "$DEV" --json "$@" 2>>"$LOG")
    if [ -n "$line" ]; then
        $PY -c "import json,sys; d=json.loads(sys.argv[1]); d['what']='$label'; d['cache']='$cache'; d['args']='$*'; print(json.dumps(d))" "$line" | tee -a "$RES"
    else
        echo "{\"what\": \"$label\", \"cache\": \"$cache\", \"error\": true, \"args\": \"$*\"}" | tee -a "$RES"
    fi
}

# pyload LABEL CACHE SUBCOMMAND ARGS...
pyload() {
    local label=$1 cache=$2
    shift 2
    local line
    line=$(timeout 300 $PY bench/bench_load_hf.py "$@" 2>>"$LOG" | tail -1)
    if [ -n "$line" ]; then
        $PY -c "import json,sys; d=json.loads(sys.argv[1]); d['cache']='$cache'; print(json.dumps(d))" "$line" | tee -a "$RES"
    else
        echo "{\"what\": \"$label\", \"cache\": \"$cache\", \"error\": true}" | tee -a "$RES"
    fi
}

say "machine"
{ nvidia-smi --query-gpu=name,memory.total,driver_version,pcie.link.gen.current,pcie.link.width.current --format=csv
  nproc; free -g; df -h "$W"; uname -r; lscpu; } >>"$LOG" 2>&1
drop; echo "drop_caches possible: $can_drop (LMS_BENCH_DROP=${LMS_BENCH_DROP:-0})" | tee -a "$LOG"

say "1. CUDA tests"
LMS_TMP=$W/t timeout 300 "$B/tests/loader_test_loader_cuda" 2>&1 | tee "$OUT/tests_cuda.log" | tail -25
echo "loader_test_loader_cuda exit ${PIPESTATUS[0]}" | tee -a "$LOG"
LMS_SRC_DIR=$PWD LMS_BUILD_DIR=$B LMS_BIN=$PWD/$B/lmstore LMS_TMP=$W/t timeout 120 "$B/tests/loader_test_loader" >"$OUT/tests_cpu.log" 2>&1
echo "loader_test_loader (cpu) exit $?" | tee -a "$LOG"

say "2. model"
if [ ! -f "$HF/config.json" ]; then
    pyload make none make "$HF"
fi
ls -la "$HF" >>"$LOG"
rm -rf "$ST"
s=$(ms)
timeout 400 "$LMS" import "$HF" --store "$ST" --name llama8b 2>&1 | tail -2 | tee -a "$LOG"
e=$(ms)
echo "import took $(( (e - s) / 1000000 )) ms" | tee -a "$LOG"
SEGS=$(ls "$ST"/segments/*.seg)
SHARDS=$(ls "$HF"/*.safetensors)

say "3. warm"
cat $SEGS $SHARDS >/dev/null # both in the page cache
pyload h2d warm h2d
seqread seqread_segments warm $SEGS
seqread seqread_shards warm $SHARDS
# the staged load's host side alone (pread into a ring, no device): 8 and 12 threads
for t in 8 12; do "$B/readbw" --threads $t --reps 3 --json $SEGS | tee -a "$RES"; done
lmsload lmstore_resident_auto warm --place resident
lmsload lmstore_resident_auto warm --place resident
lmsload lmstore_register_t4 warm --place resident --copy register
lmsload lmstore_register_t8_populate warm --place resident --copy register --threads 8 --prefetch populate
lmsload lmstore_stage_map_t8 warm --place resident --copy stage-map --threads 8
lmsload lmstore_stage_read_t4 warm --place resident --copy stage-read --threads 4
lmsload lmstore_stage_read_t8 warm --place resident --copy stage-read --threads 8
lmsload lmstore_stage_read_t12 warm --place resident --copy stage-read --threads 12
lmsload lmstore_stage_read_t8_c64 warm --place resident --copy stage-read --threads 8 --chunk 64M
lmsload lmstore_stage_read_t8_c8 warm --place resident --copy stage-read --threads 8 --chunk 8M --slots 32
lmsload lmstore_stage_read_t8_file warm --place resident --copy stage-read --threads 8 --order file
lmsload lmstore_mapped warm --place mapped
pyload safetensors warm st "$HF"
pyload transformers warm tf "$HF"
lmsload lmstore_resident_auto warm --place resident
lmsload lmstore_stage_read_t8 warm --place resident --copy stage-read --threads 8
for i in $(seq "${LMS_BENCH_REPS:-5}"); do
    lmsload lmstore_resident_auto warm --place resident
    lmsload lmstore_resident_reserve warm --place resident --reserve
    lmsload lmstore_resident_reserve_c8 warm --place resident --reserve --chunk 8M
    lmsload lmstore_resident_reserve_c2_s32 warm --place resident --reserve --chunk 2M --slots 32
    lmsload lmstore_resident_reserve_t8 warm --place resident --reserve --threads 8
done
# where the set-up time goes (arena allocation), in the log
LMSTORE_LOG=debug lmsload lmstore_resident_reserve_debuglog warm --place resident --reserve
grep "resident load set up" "$LOG" | tail -1
pyload h2d warm h2d

say "4. cold (drop_caches before each)"
drop; seqread seqread_segments "$C" $SEGS
drop; lmsload lmstore_resident_auto "$C" --place resident
drop; lmsload lmstore_resident_reserve "$C" --place resident --reserve
drop; lmsload lmstore_stage_direct_t8 "$C" --place resident --copy stage-direct --threads 8
drop; lmsload lmstore_stage_direct_t8_c8 "$C" --place resident --copy stage-direct --threads 8 --chunk 8M
drop; lmsload lmstore_stage_direct_t4 "$C" --place resident --copy stage-direct --threads 4
drop; lmsload lmstore_stage_direct_t12 "$C" --place resident --copy stage-direct --threads 12
drop; lmsload lmstore_stage_read_t8 "$C" --place resident --copy stage-read --threads 8
drop; lmsload lmstore_register_t4 "$C" --place resident --copy register
drop; seqread seqread_shards "$C" $SHARDS
drop; pyload safetensors "$C" st "$HF"
drop; pyload transformers "$C" tf "$HF"
echo "drop_caches possible: $can_drop" | tee -a "$LOG"

say "summary"
$PY - "$RES" <<'EOF' | tee "$OUT/summary.txt"
import json, sys
rows = [json.loads(l) for l in open(sys.argv[1]) if l.strip()]
h2d = [d for d in rows if d.get("what") == "h2d"]
h2d = h2d[0]["pinned_gb_per_s"] if h2d else None
print(f"{'what':34} {'cache':5} {'path':16} {'GB':>6} {'all s':>8} {'GB/s':>7} {'1st layer s':>11} {'peak RSS GB':>11} {'file share':>10} {'of H2D':>6} {'1st/all':>7} {'setup s':>7} {'1st copy':>8} {'resv s':>6}")
for d in rows:
    if d.get("error"):
        print(f"{d['what']:34} {d.get('cache',''):5} ERROR {d.get('args','')}")
        continue
    if d["what"] == "h2d":
        print(f"h2d pinned {d['pinned_gb_per_s']:.1f} GB/s, pageable {d['pageable_gb_per_s']:.1f} GB/s")
        continue
    if d["what"] == "readbw":
        print(f"readbw {d['threads']} threads, {d['chunk_bytes'] >> 20} MiB chunks, {d['slots']} slots: "
              f"best {d['best_gb_per_s']:.2f} GB/s, mean {d['mean_gb_per_s']:.2f} GB/s")
        continue
    if d["what"] == "make":
        print(f"make: init {d['init_s']:.1f} s, save {d['save_s']:.1f} s, {d['shards']} shards, {d['bytes']/1e9:.2f} GB")
        continue
    fl = d.get("first_layer_s")
    fs = d.get("file_backed_share")
    pr = d.get("peak_rss_bytes")
    print(f"{d['what']:34} {d.get('cache',''):5} {d.get('path',''):16} {d['bytes']/1e9:6.2f} {d['all_s']:8.3f} "
          f"{d['gb_per_s']:7.2f} {'' if fl is None else format(fl, '11.4f'):>11} "
          f"{'' if pr is None else format(pr/1e9, '11.2f'):>11} {'' if fs is None else format(fs, '10.2f'):>10} "
          f"{'' if not h2d else format(100 * d['gb_per_s'] / h2d, '5.1f') + '%':>6} "
          f"{'' if fl is None else format(100 * fl / d['all_s'], '6.1f') + '%':>7} "
          f"{'' if 'setup_s' not in d else format(d['setup_s'], '7.4f'):>7} "
          f"{'' if 'first_copy_s' not in d else format(d['first_copy_s'], '8.4f'):>8} "
          f"{'' if not d.get('ring_reserved') else format(d['reserve_s'], '6.3f'):>6}")
EOF
