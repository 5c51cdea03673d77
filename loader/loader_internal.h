/*
 * loader/loader_internal.h - the loader's internal pieces: the per-store
 * table of segment mappings (shared by all models of a store handle), the
 * shared registrations of mapped ranges with a device, the model struct and
 * the resident copy pipeline.
 *
 * Design notes (numbered invariants):
 * (1) A segment is mapped once per store handle (lms__segment_map: PROT_READ,
 *     MAP_SHARED, flock LOCK_SH held while mapped). A second mapping of the
 *     same segment is made only when a model needs bytes past the end of the
 *     existing one (the segment grew since); both stay until unused.
 * (2) Each mapping is reference-counted by the models that use it; the last
 *     release unmaps it and drops the segment's lock. A store handle's table
 *     exists while one of its models is open; each model holds a store
 *     reference (lms__store_ref), so lms_store_close fails with LMS_EBUSY.
 * (3) Registrations with a device are made on a fixed grid of blocks of the
 *     mapping and reference-counted per block, so two models (or a mapped and
 *     a resident load) never register the same page twice. A block is
 *     unregistered when its count drops to zero, and always before its
 *     mapping is unmapped (a mapping is released only by models that hold no
 *     block of it any more).
 * (4) One mutex (the table's) guards counts and states; the slow calls
 *     (cudaHostRegister / Unregister, mmap) run outside it with the block or
 *     mapping marked busy, so registrations proceed in parallel.
 */
#ifndef LMS_LOADER_INTERNAL_H
#define LMS_LOADER_INTERNAL_H

#include <pthread.h>
#include <stdatomic.h>

#include "common/common.h"
#include "lmstore/loader.h"
#include "loader/device.h"
#include "store/store_internal.h"

#define LMS__PAGE 4096u
#define LMS__DEFAULT_CHUNK (64ull << 20)
#define LMS__DEFAULT_RING_CHUNK (4ull << 20) /* best of 2/4/8/16/32 MiB measured (bench/RESULTS.md, runs 3-6) */
#define LMS__AUTO_COLD_READERS 8 /* AUTO, model not in the page cache: at most this many O_DIRECT readers */
#define LMS__DEFAULT_RING_FIRST 8 /* ring slots carrying the first layer (lms_model_params.ring_first_slots); best of 2/4/8/all measured (bench/RESULTS.md) */
#define LMS__CHUNK_ALIGN (2ull << 20)
#define LMS__DEFAULT_REGISTER_PERCENT 50 /* LMS_COPY_SPLIT */

typedef struct lms__regblock {
    int refs;
    int state;      /* 0 = not registered, 1 = busy (being (un)registered), 2 = registered, 3 = refused */
    void *dev_ptr;  /* device address of the block's first byte (when mapped was asked) */
} lms__regblock;

/* Registrations of one mapping with one device. */
typedef struct lms__regset {
    lms_device *dev;
    uint64_t block;       /* bytes per block (multiple of 2 MiB) */
    size_t nblocks;
    lms__regblock *b;
    struct lms__regset *next;
} lms__regset;

typedef struct lms__lmap {
    lms__segmap sm;       /* the mapping and its lock */
    int refs;             /* models holding it */
    int mlock_users;      /* models that mlocked ranges of it */
    int fd_direct;        /* O_DIRECT descriptor for readers; -1 = not opened, -2 = refused */
    lms__regset *regs;
    struct lms__lmap *next;
} lms__lmap;

/* Acquire a mapping of segment `seg` that covers [0, need_end): the current
 * one or a fresh one. Holds a store reference for the table. */
int lms__lmap_acquire(lms_store *st, uint32_t seg, uint64_t need_end, lms__lmap **out);
void lms__lmap_release(lms_store *st, lms__lmap *m);
/* A model mlocked ranges of m: munlock the mapping when it goes. */
void lms__lmap_note_mlock(lms__lmap *m);
int lms__lmap_mlock_users(lms__lmap *m);
/* The O_DIRECT descriptor of a mapping's file, or the buffered one when the
 * file system refuses O_DIRECT; *direct says which. */
int lms__lmap_fd_direct(lms__lmap *m, bool *direct);

/* Register block `k` of `m` on `dev` (grid `block` bytes, fixed by the first
 * caller for that pair; *block_out tells the grid in effect) and take a
 * reference on it. flags: LMS_REG_*. *dev_base gets the device address of the
 * block's first byte (NULL unless mapped). A refusal returns LMS_EDEVICE and
 * takes no reference. */
int lms__reg_acquire(lms__lmap *m, lms_device *dev, uint64_t block, size_t k, unsigned flags,
                     void **dev_base);
void lms__reg_release(lms__lmap *m, lms_device *dev, size_t k);
/* Grid block size in effect for (m, dev), or `want` if none yet. */
uint64_t lms__reg_grid(lms__lmap *m, lms_device *dev, uint64_t want);

/* Test hooks: make the loader's host registrations fail. */
enum {
    LMS__REFUSE_NONE = 0,
    LMS__REFUSE_SIMULATED,     /* return LMS_EDEVICE without calling the backend */
    LMS__REFUSE_DROP_READONLY, /* call the backend without LMS_REG_READONLY: a read-only
                                  mapping cannot be pinned writable, so the driver refuses */
};
extern atomic_int lms__loader_test_refuse;

/* ---- models -------------------------------------------------------------------- */

typedef struct lms__tinfo {
    uint32_t segment;
    uint64_t offset;
    lms__lmap *map;
    uint8_t hash[16];
    uint32_t canon;   /* index of the first tensor with the same (segment, offset) */
} lms__tinfo;

typedef struct lms__resident lms__resident;

struct lms_model {
    lms_store *store;
    char *name;
    uint8_t id[LMS_MODEL_ID_LEN];
    lms_model_params params;  /* with defaults filled in */
    bool chunk_given;         /* params.chunk_bytes was set by the caller */
    lms_device *dev;          /* params.device or NULL */
    lms_placement placement;
    size_t n;
    lms_tensor *t;            /* views, storage order */
    lms__tinfo *ti;
    char *strings;            /* tensor names */
    uint32_t *hidx;           /* name hash table (UINT32_MAX = empty), hcap entries */
    size_t hcap;
    int n_layers;
    lms__lmap **maps;         /* held mappings */
    size_t nmaps;
    struct { lms__lmap *m; size_t k; } *held; /* registered blocks held (mapped placement) */
    size_t nheld;
    bool mlocked;
    lms__resident *res;
    lms_model_stats stats;
    double t0;
};

/* Staging memory pinned once per device (loader/staging.c). borrow returns
 * the pool's base when it exists, holds `bytes` and is not lent (it is then
 * lent to the caller until lms__staging_return), NULL otherwise. */
typedef struct lms__staging lms__staging;
uint8_t *lms__staging_borrow(lms_device *dev, size_t bytes);
void lms__staging_return(lms_device *dev);
void lms__staging_release(lms_device *dev); /* lms_device_close */

/* Worker threads when lms_model_params.threads is 0: 3/4 of the CPUs, 2..12
 * (12 read the page cache fastest into a reserved ring on a 16-core GPU
 * host; 16 were slower: bench/RESULTS.md, loader run 6). */
static inline int lms__default_threads(void) { return LMS_MAX(2, LMS_MIN(12, lms__cpu_count() * 3 / 4)); }

/* Start the resident load (placement RESIDENT); m->t[i].device is set. */
int lms__resident_start(lms_model *m);
int lms__resident_wait(lms_model *m, int32_t layer, bool block);
void lms__resident_stop(lms_model *m);

#endif
