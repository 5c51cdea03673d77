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
 * (5) Bytes of a segment are read (views, verification, copies, pread into
 *     the ring) only through a mapping the reader holds that covers them.
 *
 * Functions that rely on one of these open with an assertion of it
 * (assert(lms__mutex_held(&mu)), assert(lms__lmap_covers(...))), as
 * SQLite's btree.c opens with assert( sqlite3BtreeHoldsMutex(p) ); the build
 * keeps assertions on in every build type.
 */
#ifndef LMS_LOADER_INTERNAL_H
#define LMS_LOADER_INTERNAL_H

#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>

#include "common/common.h"
#include "lmstore/loader.h"
#include "lmstore/loader_experimental.h"
#include "loader/device.h"
#include "store/segmap.h"

#define LMS__PAGE 4096u
#define LMS__CHUNK_ALIGN (2ull << 20) /* registration blocks and chunks are multiples of this */

/* ---- a mutex that knows its holder ------------------------------------------------ */

/* pthread mutex plus the holding thread, so that a function that needs the
 * lock can assert it is held (SQLite's sqlite3_mutex_held). Waits on a
 * condition variable go through lms__mutex_wait, which keeps the holder
 * right across the wait. */
typedef struct lms__mutex {
    pthread_mutex_t mu;
    _Atomic(const void *) holder; /* &lms__thread_tag of the holding thread; NULL = free */
} lms__mutex;
#define LMS__MUTEX_INIT {PTHREAD_MUTEX_INITIALIZER, NULL}
extern _Thread_local char lms__thread_tag; /* its address names the thread (loader/maps.c) */

static inline void lms__mutex_lock(lms__mutex *m)
{
    pthread_mutex_lock(&m->mu);
    atomic_store_explicit(&m->holder, &lms__thread_tag, memory_order_relaxed);
}
static inline void lms__mutex_unlock(lms__mutex *m)
{
    atomic_store_explicit(&m->holder, NULL, memory_order_relaxed);
    pthread_mutex_unlock(&m->mu);
}
static inline void lms__mutex_wait(pthread_cond_t *cv, lms__mutex *m)
{
    atomic_store_explicit(&m->holder, NULL, memory_order_relaxed);
    pthread_cond_wait(cv, &m->mu);
    atomic_store_explicit(&m->holder, &lms__thread_tag, memory_order_relaxed);
}
/* true when the calling thread holds m (only the holder ever stores its own
 * tag, so a relaxed load cannot see it otherwise) */
static inline bool lms__mutex_held(lms__mutex *m)
{
    return atomic_load_explicit(&m->holder, memory_order_relaxed) == &lms__thread_tag;
}

/* ---- the load plan: every default resolved in one place ------------------------ */

/*
 * What a load does, from lms_model_params and its tuning with every 0
 * replaced by its default (lms__load_plan_resolve, loader/params.c: the only
 * place that knows the defaults). The model keeps it; model.c, resident.c
 * and lms_model_staging_bytes read it and resolve nothing themselves.
 * Decisions that depend on the model or the machine at open (AUTO placement,
 * AUTO copy source) are made from it by model.c and resident.c.
 */
typedef struct lms__load_plan {
    lms_device *device;       /* NULL = CPU host views */
    lms_placement placement;  /* as asked; AUTO is decided at open (model.c) */
    lms_prefetch prefetch;
    bool mlock, verify, sync;
    int threads;              /* register / reader / verify threads */
    int cold_readers;         /* copy AUTO, model mostly not in the page cache: reader threads */
    uint64_t device_reserve;  /* AUTO: device bytes kept free besides the weights */
    /* tuning */
    lms_copy_source copy;
    bool no_readers, ring_host_alloc;
    int streams;
    uint64_t chunk;           /* registration grid; copy size out of the mapping (REGISTER, DIRECT) */
    uint64_t ring_chunk;      /* copy size through the staging ring (also SPLIT's staged chunks) */
    int ring_slots, ring_first_slots;
    int register_percent;     /* SPLIT */
    lms_load_order order;
    size_t staging_bytes;     /* the ring: ring_slots x (ring_chunk + 2 pages) */
} lms__load_plan;

/* Resolve p (NULL = defaults). LMS_EINVAL naming the field for a value out
 * of range; *out is then unspecified. */
int lms__load_plan_resolve(const lms_model_params *p, lms__load_plan *out);
/* Free device memory a RESIDENT load with an arena of `arena_bytes` needs
 * for placement AUTO to choose it, on a device of `total_mem` bytes: the
 * arena, the caller's reserve and a margin. */
uint64_t lms__load_plan_device_need(const lms__load_plan *pl, uint64_t arena_bytes, uint64_t total_mem);

/* ---- mappings and registrations ------------------------------------------------ */

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

/* Invariant 5: [off, off + len) of the segment lies in mapping m. */
static inline bool lms__lmap_covers(const lms__lmap *m, uint64_t off, uint64_t len)
{
    return m && m->sm.base && off <= m->sm.size && len <= m->sm.size - off;
}

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
    lms__load_plan plan;      /* the params, every default resolved */
    lms_device *dev;          /* plan.device */
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

/* Bytes of the device arena a RESIDENT load of m would allocate (its
 * unique tensors laid out in copy order, as lms__resident_start does). */
int lms__resident_arena_bytes(const lms_model *m, uint64_t *out);
/* Start the resident load (placement RESIDENT); m->t[i].device is set. */
int lms__resident_start(lms_model *m);
int lms__resident_wait(lms_model *m, int32_t layer, bool block);
void lms__resident_stop(lms_model *m);

#endif
