/*
 * loader/params.c - the loader's defaults, in one place: lms_model_params
 * (stable) and lms_model_tuning (experimental) resolved into the plan a
 * load follows (lms__load_plan, loader_internal.h), checked for range on
 * the way. lms_model_open, the resident pipeline and lms_model_staging_bytes
 * all read the plan, so a default changes here and nowhere else.
 *
 * Where a default came from a measurement, the comment names the run in
 * bench/RESULTS.md ("Loader").
 */
#include <string.h>

#include "loader/loader_internal.h"

/* copy streams of a resident load */
#define DEFAULT_STREAMS 4
/* registration grid and copy size out of the mapping */
#define DEFAULT_CHUNK (64ull << 20)
/* copy size through the staging ring: best of 2/4/8/16/32 MiB (runs 3-6) */
#define DEFAULT_RING_CHUNK (4ull << 20)
/* ring slots that carry the first layer: best of 2/4/8/all (run 4) */
#define DEFAULT_RING_FIRST 8
/* copy SPLIT: share of the registration blocks pinned in place */
#define DEFAULT_REGISTER_PERCENT 50
/* copy AUTO, model mostly not in the page cache: at most this many O_DIRECT
 * readers (the disk bounds the load; more read no faster: run 6) */
#define AUTO_COLD_READERS 8
/* placement AUTO: device memory kept for the caller's KV cache and scratch */
#define DEFAULT_DEVICE_RESERVE (512ull << 20)
/* placement AUTO: memory left free besides that (context growth,
 * fragmentation): the larger of this and 1% of the device */
#define DEVICE_MARGIN_MIN (256ull << 20)

/* Threads when lms_model_params.threads is 0: 3/4 of the CPUs, 2..12 (12
 * read the page cache fastest into a reserved ring on a 16-core GPU host;
 * 16 were slower: run 6). */
static int default_threads(void) { return LMS_MAX(2, LMS_MIN(12, lms__cpu_count() * 3 / 4)); }

lms_model_params lms_model_default_params(void)
{
    lms_model_params p;
    memset(&p, 0, sizeof p);
    return p;
}

static int check(const lms_model_params *p, const lms_model_tuning *t)
{
    if ((unsigned)p->placement > LMS_PLACE_RESIDENT || (unsigned)p->prefetch > LMS_PREFETCH_POPULATE)
        return lms__err(LMS_EINVAL, "model params: placement or prefetch out of range");
    if (p->threads < 0 || p->threads > 256)
        return lms__err(LMS_EINVAL, "model params: threads %d out of range (0..256)", p->threads);
    if (p->placement >= LMS_PLACE_MAPPED && !p->device)
        return lms__err(LMS_EINVAL, "model params: mapped and resident placements need a device");
    if ((unsigned)t->order > LMS_ORDER_FILE || (unsigned)t->copy > LMS_COPY_SPLIT || t->register_percent < 0 ||
        t->register_percent > 100)
        return lms__err(LMS_EINVAL, "model tuning: order, copy or register_percent out of range");
    if (t->streams < 0 || t->streams > 64 || t->ring_slots < 0 || t->ring_slots > 1024 || t->ring_first_slots < 0 ||
        t->ring_first_slots > 1024)
        return lms__err(LMS_EINVAL, "model tuning: streams (0..64), ring_slots or ring_first_slots (0..1024) "
                        "out of range");
    if (t->chunk_bytes > (1ull << 34))
        return lms__err(LMS_EINVAL, "model tuning: chunk_bytes %llu is larger than 16 GiB",
                        (unsigned long long)t->chunk_bytes);
    return 0;
}

int lms__load_plan_resolve(const lms_model_params *params, lms__load_plan *out)
{
    static const lms_model_tuning no_tuning;
    lms_model_params p = params ? *params : lms_model_default_params();
    const lms_model_tuning *t = p.tuning ? p.tuning : &no_tuning;
    int rc = check(&p, t);
    if (rc)
        return rc;
    memset(out, 0, sizeof *out);
    out->device = p.device;
    out->placement = p.placement;
    out->prefetch = p.prefetch;
    out->mlock = p.mlock;
    out->verify = p.verify;
    out->sync = p.sync;
    out->threads = p.threads ? p.threads : default_threads();
    out->cold_readers = LMS_MIN(out->threads, AUTO_COLD_READERS);
    out->device_reserve = p.device_reserve_bytes ? p.device_reserve_bytes : DEFAULT_DEVICE_RESERVE;

    out->copy = t->copy;
    out->no_readers = t->no_readers;
    out->ring_host_alloc = t->ring_host_alloc;
    out->streams = t->streams ? t->streams : DEFAULT_STREAMS;
    /* a chunk size given is used for both; otherwise each has its own default */
    uint64_t given = t->chunk_bytes ? lms__align_up(t->chunk_bytes, LMS__CHUNK_ALIGN) : 0;
    out->chunk = given ? given : DEFAULT_CHUNK;
    out->ring_chunk = given ? given : DEFAULT_RING_CHUNK;
    out->ring_slots = t->ring_slots ? t->ring_slots : 2 * out->threads;
    out->ring_first_slots = t->ring_first_slots ? t->ring_first_slots : DEFAULT_RING_FIRST;
    out->register_percent = t->register_percent ? t->register_percent : DEFAULT_REGISTER_PERCENT;
    out->order = t->order;
    out->staging_bytes = (size_t)out->ring_slots * (size_t)(out->ring_chunk + 2 * LMS__PAGE);
    return 0;
}

uint64_t lms__load_plan_device_need(const lms__load_plan *pl, uint64_t arena_bytes, uint64_t total_mem)
{
    return arena_bytes + pl->device_reserve + LMS_MAX(DEVICE_MARGIN_MIN, total_mem / 100);
}

size_t lms_model_staging_bytes(const lms_model_params *p)
{
    lms__load_plan pl;
    return lms__load_plan_resolve(p, &pl) ? 0 : pl.staging_bytes;
}
