/*
 * kvcache/kv_internal.h - the cache's internal state, shared by the arena and
 * sequence code (kv_arena.c) and persistence (kv_persist.c, kv_sessions.c).
 * Not public. Only kv_arena.c writes the bookkeeping below; persistence
 * reads the geometry and goes through the functions at the end of this
 * header (lms__kv_save_pages, lms__kv_resume_plan, lms__kv_seq_attach).
 *
 * Page bookkeeping, per group of pages (kv_group: group 0 holds the
 * full-context layers, group 1, with a window, the sliding-window layers;
 * page ids are group-relative), all arrays of the group's n_pages allocated
 * at creation:
 *   refs[p]     sequences referencing page p (a sequence holds at most one
 *               reference to a page)
 *   flags[p]    KV_KEYED: keys[p] is valid (page full and committed);
 *               KV_PUBLISHED: p is the prefix-index entry for keys[p]
 *               (PUBLISHED implies KEYED)
 *   free stack  pages with refs 0 and not published (contents meaningless)
 *   LRU list    pages with refs 0 and published (cached), oldest at lru_head
 *   ht          open-addressing (linear probing) table key -> page + 1
 * and for group 0 only:
 *   tokens[p*P + s]  token id at slot s of page p (P = page_tokens)
 * A window page's key is lms__kv_window_key(the key of the group-0 page of
 * the same positions): both name the same exact prefix.
 *
 * Invariants (checked whole by lms__kv_check in tests; asserted page by
 * page in kv_arena.c where they are kept: refs never below zero or past
 * UINT32_MAX, a free page unflagged, an LRU page unreferenced and
 * published, a published page keyed and its key in ht once), in each group:
 *  (1) every page is in exactly one of: free stack, LRU, used (refs > 0);
 *  (2) refs[p] equals the number of live sequences whose block table holds p
 *      (a window table holds entries [wfirst, ceil(len / P)));
 *  (3) a page is in ht iff it is PUBLISHED, and ht holds distinct keys;
 *  (4) a KEYED page's bytes and tokens never change while it stays KEYED;
 *  (5) in every sequence, pages fully below `committed` are KEYED;
 * and for sequences of a cache with a window:
 *  (6) wfirst == lms__kv_window_first(kv, committed): the window pages of the
 *      last `window` committed positions and every later one are held;
 *  (7) a held window page is KEYED iff the group-0 page of the same index is,
 *      and then its key is the window key of that page's key.
 */
#ifndef LMS_KV_INTERNAL_H
#define LMS_KV_INTERNAL_H

#include "common/common.h"
#include "lmstore/kvcache.h"
#include "loader/device.h"

#define KV_NONE UINT32_MAX

enum { KV_KEYED = 1, KV_PUBLISHED = 2 };

struct lms_kv_seq {
    uint32_t index;     /* slot in kv->seqs */
    bool live;
    uint32_t len;       /* tokens (reserved positions) */
    uint32_t committed; /* positions whose K/V are written */
    uint32_t page_tokens; /* the cache's P, so the handle alone answers lms_kv_seq_pages */
    uint32_t *table;    /* [max_seq_pages] group-0 page ids; ceil(len / P) in use */
    uint32_t *wtable;   /* [max_seq_pages] window page ids, [wfirst, ceil(len / P)) in use; NULL without a window */
    uint32_t wfirst;    /* first held window page (invariant 6) */
};

/* Where a resume's time went, in seconds (kv_persist.c; read by benchmarks). */
typedef struct lms__kv_resume_times {
    double prepare;  /* record, keys, page records and segments, plan */
    double setup;    /* threads, buffers, pinning the I/O ring (device arenas; 0 once kept) */
    double pipeline; /* reading, checking and uploading every page, until the last upload completed */
    double sync;     /* ...of which waiting for the last uploads once every page was read */
    double build, touch;  /* attaching the sequence; handing the last-use record to the store (lms__kv_touch_later) */
    double wait, read, hash, upload; /* summed over the workers: for a ring slot, pread, checksum
                                      * (or decode), the upload calls */
    int threads;
} lms__kv_resume_times;

/* The pages of one group and their bookkeeping (see the notes above). */
typedef struct kv_group {
    uint32_t n_layers;    /* layers whose K/V a page holds */
    size_t page_bytes;    /* n_layers * layer_bytes */
    uint32_t n_pages;
    uint8_t *arena;       /* device pointer: n_pages * page_bytes, inside lms_kv.arena */

    uint32_t *refs;
    uint8_t *flags;
    lms_hash128 *keys;

    uint32_t *free_stack;
    uint32_t n_free;
    uint32_t free_low; /* the least n_free has been: pages [0, n_pages - free_low) were handed
                        * out at least once (the stack hands out untouched pages in ascending
                        * order below every returned one) */

    uint32_t *lru_prev, *lru_next;
    uint32_t lru_head, lru_tail, n_cached;

    uint32_t *ht; /* [ht_mask + 1], page + 1, 0 = empty */
    uint32_t ht_mask;
    uint32_t n_keyed_published;

    uint64_t evictions, cow_copies;
} kv_group;

struct lms_kv {
    lms_device *dev;
    lms_kv_layout layout; /* layout.sliding points at `sliding` */
    uint8_t model_id[LMS_MODEL_ID_LEN];
    size_t elem, token_bytes, head_bytes, v_offset, layer_bytes;
    uint32_t P;
    uint8_t *arena;       /* device pointer: both groups' pages */
    size_t arena_bytes;

    kv_group g[2];        /* g[1] is used with a window only */
    uint32_t n_groups;    /* 1, or 2 with a window */
    uint8_t *sliding;     /* [n_layers] copy of layout.sliding (NULL without a window) */
    uint32_t *layer_at;   /* [n_layers] index of each layer within its group */
    lms_hash128 layout_digest; /* window and sliding layers, part of every page key (window > 0) */

    int32_t *tokens;      /* group 0: [n_pages * P] */

    lms_kv_seq *seqs;
    uint32_t *seq_free; /* stack of free seq slots */
    uint32_t n_seq_free, max_seqs, max_seq_pages, max_seq_tokens;
    uint32_t *table_mem;

    struct lms__kv_io *io; /* save/resume buffers of a device arena, kept between calls (kv_persist.c) */
    lms__kv_resume_times last_resume; /* where the last resume's time went (benchmarks read it) */
};

/* Free the save/resume I/O buffers and streams of kv (lms_kv_destroy). */
void lms__kv_io_free(lms_kv *kv);

/* Device arenas: make the save/resume workers' page-locked ring, pool and streams for `threads`
 * workers (0 = online CPUs) now rather than in the first save or resume, which would pay the
 * pinning (tens of milliseconds); 0 and nothing done for host arenas. */
int lms__kv_io_reserve(lms_kv *kv, int threads);

/* Key of a page holding tokens[0..n) after the page keyed `parent` (zero
 * hash for the first page): XXH3-128 over parent, model id, layout (with a
 * window: the window and the sliding layers too), n and the token ids
 * (little-endian). Full pages have n == P; save uses n < P for a sequence's
 * partial last page. */
lms_hash128 lms__kv_page_key(const lms_kv *kv, lms_hash128 parent, const int32_t *tokens, uint32_t n);
/* The key of the window page of the positions whose group-0 page has `key`. */
lms_hash128 lms__kv_window_key(lms_hash128 key);
/* The first window page (index in the block table) a sequence of `committed`
 * positions holds: the page of position committed - window (0 below that). */
uint32_t lms__kv_window_first(const lms_kv *kv, uint32_t committed);

/* Prefix index of a group. */
uint32_t lms__kv_ht_find(const kv_group *G, lms_hash128 key); /* page or KV_NONE */
void lms__kv_ht_insert(kv_group *G, uint32_t page);            /* keys[page] not present */

/* Take a page: a free one, else evict the oldest cached one. KV_NONE if none. */
uint32_t lms__kv_take_page(kv_group *G);
/* Take a specific cached page (refs 0, published) out of the LRU and the
 * prefix index; the caller then owns it. */
void lms__kv_evict(kv_group *G, uint32_t page);
/* Undo lms__kv_take_page of a page that was free (push it back). */
void lms__kv_return_free(kv_group *G, uint32_t page);
/* Add one reference to a page (removing it from the LRU if it was cached). */
void lms__kv_ref(kv_group *G, uint32_t page);
/* Drop one reference; at 0 the page goes to the LRU (published) or free. */
void lms__kv_unref(kv_group *G, uint32_t page);
/* A free sequence slot, or NULL with LMS_ENOSPACE detail. */
lms_kv_seq *lms__kv_seq_take(lms_kv *kv);

/* ---- pages for persistence: kv_persist.c reads and builds sequences only
 * through these, so every write to the bookkeeping above stays in kv_arena.c */

/* Page i of the first n_tokens (<= committed) positions of a sequence, as
 * a save stores it. */
typedef struct lms__kv_save_page {
    uint32_t page;      /* arena page (of its group) */
    uint32_t n_tokens;  /* valid positions: P, or fewer in the last page */
    lms_hash128 key;    /* a full page's key; for a partial last page the
                         * chained key of its n_tokens tokens */
} lms__kv_save_page;
/* Fill out[0, np) with the group-0 pages (np = ceil(n_tokens / P)) and, with
 * a window, out[np, 2 np - first) with the window pages [first, np) the
 * sequence holds (first = lms__kv_window_first(kv, n_tokens); n_tokens must
 * then be the committed count). Reads only. */
void lms__kv_save_pages(const lms_kv *kv, const lms_kv_seq *seq, uint32_t n_tokens, lms__kv_save_page *out);

/*
 * Where the n pages of group g of a session being resumed go. cached[i] !=
 * KV_NONE: page i is attached from the group's prefix cache. Every other
 * page gets target[i]: a free page (from the top of the free stack down) or,
 * when those run out, the oldest cached page that no cached[] names
 * (evict[i] = true). *evictable = cached pages that may be evicted for it.
 * mark: the group's n_pages bytes of zeros, scratch (the arena does not
 * allocate after creation). LMS_ENOSPACE (no detail) when free + evictable
 * pages are too few. Reads only: the plan holds until the cache next changes.
 */
int lms__kv_resume_plan(const lms_kv *kv, uint32_t g, const uint32_t *cached, uint32_t n, uint8_t *mark,
                        uint32_t *target, bool *evict, uint32_t *evictable);
/* One group's plan for lms__kv_seq_attach: block-table entries [first, n),
 * the arrays indexed from 0 for entry first. */
typedef struct lms__kv_attach {
    uint32_t first, n;
    const uint32_t *cached, *target;
    const bool *evict;
    const lms_hash128 *keys;
} lms__kv_attach;
/*
 * Build the resumed sequence from plans of lms__kv_resume_plan (att[0] for
 * group 0: entries [0, ceil(n_tokens / P)); with a window att[1]: entries
 * [lms__kv_window_first(kv, n_tokens), ceil(n_tokens / P))) whose target
 * pages hold their bytes now: attach the cached pages (refs + 1), take the
 * targets out of the free stack / LRU and prefix index, give them refs 1,
 * their tokens (tokens[n_tokens], group 0) and, for full pages, their keys,
 * published unless the index has that key. Needs a free sequence slot;
 * cannot fail.
 */
lms_kv_seq *lms__kv_seq_attach(lms_kv *kv, const lms__kv_attach *att, const int32_t *tokens, uint32_t n_tokens);

static inline uint8_t *lms__kv_gpage_ptr(const kv_group *G, uint32_t page)
{
    return G->arena + (size_t)page * G->page_bytes;
}

static inline uint8_t *lms__kv_page_ptr(const lms_kv *kv, uint32_t page) { return lms__kv_gpage_ptr(&kv->g[0], page); }

/* Check every invariant above; 0 or LMS_ECORRUPT with a detail. For tests. */
int lms__kv_check(const lms_kv *kv);

#endif
