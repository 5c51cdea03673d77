/*
 * lmstore/loader_experimental.h - [EXPERIMENTAL] tuning of the loader's
 * resident copies: where the bytes come from, how they are cut, how many
 * streams and ring slots carry them. For benchmarks (`lmstore bench load`,
 * bench/bench_load_sweep.sh) and tests.
 *
 * NOT STABLE. Unlike lmstore/loader.h, nothing here is part of the stable
 * API: names, fields and meanings may change or go away in any release,
 * without a deprecation period (zstd's ZSTD_STATIC_LINKING_ONLY section,
 * llama.h's [EXPERIMENTAL] calls). A program that wants to keep building
 * against later releases leaves lms_model_params.tuning NULL.
 *
 * Every field's 0 is the default, so a zeroed struct is the defaults the
 * loader uses without one:
 *
 *   struct lms_model_tuning t = {0};
 *   t.copy = LMS_COPY_STAGE_READ;
 *   lms_model_params p = lms_model_default_params();
 *   p.tuning = &t;                 (read during lms_model_open only)
 *
 * The defaults were chosen by measurement; docs/LOADER.md says what each
 * path does and bench/RESULTS.md has the figures.
 */
#ifndef LMSTORE_LOADER_EXPERIMENTAL_H
#define LMSTORE_LOADER_EXPERIMENTAL_H

#include <stdbool.h>
#include <stdint.h>

#include "lmstore/loader.h"

#ifdef __cplusplus
extern "C" {
#endif

/* Order of the resident copies. */
typedef enum lms_load_order {
    /* the transformer blocks first (layer 0, 1, ... in file order), then the
     * tensors outside them (embedding, final norm, LM head), so layer 0 is
     * ready after ~1/n of the bytes; the embedding's host view can serve
     * token lookups meanwhile */
    LMS_ORDER_BLOCKS_FIRST = 0,
    LMS_ORDER_FILE, /* strict storage (file) order: embedding, layers, norm, head */
} lms_load_order;

/* Where resident copies read the weights from. A refused registration falls
 * back to LMS_COPY_STAGE_READ whatever was asked. */
typedef enum lms_copy_source {
    LMS_COPY_AUTO = 0,     /* page cache warm: STAGE_READ; mostly cold: STAGE_DIRECT */
    LMS_COPY_REGISTER,     /* pin the mapping in place (cudaHostRegister) and DMA from it */
    LMS_COPY_STAGE_MAP,    /* memcpy from the mapping into a pinned ring, DMA from the ring */
    LMS_COPY_STAGE_READ,   /* parallel pread (page cache) into a pinned ring */
    LMS_COPY_STAGE_DIRECT, /* parallel pread with O_DIRECT (where aligned) into a pinned ring */
    LMS_COPY_SPLIT,        /* both at once: register_percent of the registration blocks pinned in
                            * place and DMA'd from there, the rest pread into the pinned ring */
} lms_copy_source;

/* [EXPERIMENTAL] Every field: 0 = the default. Values out of range make
 * lms_model_open fail with LMS_EINVAL. */
struct lms_model_tuning {
    lms_copy_source copy;  /* resident: 0 = AUTO */
    int streams;           /* resident copy streams, 1..64; 0 = 4 */
    uint64_t chunk_bytes;  /* registration grid and copy size, rounded up to 2 MiB, at most 16 GiB;
                            * 0 = 64 MiB when registering, 4 MiB through the staging ring */
    int ring_slots;        /* staging ring slots of one chunk each, 1..1024; 0 = 2 x threads */
    int ring_first_slots;  /* slots that carry the first layer in copy order, 1..1024; the others
                            * are pinned once its copies are queued, so it does not wait for the
                            * whole ring; 0 = 8; >= ring_slots = the whole ring from the start */
    lms_load_order order;  /* 0 = BLOCKS_FIRST */
    int register_percent;  /* copy SPLIT: share of the registration blocks copied from the mapping
                            * pinned in place, 1..100; 0 = 50 */
    bool ring_host_alloc;  /* ring slots from the device's pinned allocator (cudaHostAlloc) instead
                            * of huge-page host memory registered with the device */
    bool no_readers;       /* copy AUTO: read through the page cache even when the model is
                            * mostly not in it (no O_DIRECT readers) */
};
typedef struct lms_model_tuning lms_model_tuning;

#ifdef __cplusplus
}
#endif
#endif
