/*
 * lmstore/kvcache.h - the paged KV cache: one arena allocated at creation on
 * a device, sequences as block tables of pages, prefix sharing through
 * content-keyed pages kept in an LRU, and persistence of sequences into the
 * store as sessions (save in one process, resume in another).
 *
 * ---- Memory layout (what attention kernels read in place) -----------------
 *
 * The arena is one device allocation of n_pages pages, PAGE-MAJOR:
 *
 *   arena  [n_pages] page
 *   page   [n_layers] { K [n_kv_heads][page_tokens][head_dim],
 *                       V [n_kv_heads][page_tokens][head_dim] }   of dtype
 *
 *   byte offset of element (page p, layer l, K=0/V=1 c, head h, slot t, dim d)
 *     = p*page_bytes + l*layer_bytes + c*v_offset + h*head_bytes + t*token_bytes
 *       + d*elem_size
 *   token_bytes = head_dim*elem; head_bytes = page_tokens*token_bytes;
 *   v_offset = n_kv_heads*head_bytes; layer_bytes = 2*v_offset;
 *   page_bytes = n_layers*layer_bytes.
 *
 * One page id addresses the same token slots in every layer, so a block
 * table (page ids in sequence order) serves all layers. Page-major rather
 * than layer-major because a page (all layers of page_tokens positions) is
 * then ONE contiguous run: copy-on-write is one device copy, save reads one
 * run per page and resume writes one run per page, and a page is the unit
 * that is keyed, shared, evicted and stored. The cost is a per-layer stride
 * of page_bytes between pages, which paged attention (gather by block table)
 * does not mind. Within a layer, one head's page_tokens x head_dim block is
 * contiguous: the K (or V) rows of a page for one head are a small dense
 * matrix, as paged-attention kernels want. lms_kv_get_geometry() returns the
 * base pointer and these strides; lms_kv_page_k/_v compute them for you.
 *
 * Position pos of a sequence lives in page table[pos / page_tokens], slot
 * pos % page_tokens (lms_kv_seq_slot).
 *
 * ---- Sliding-window layers (layout.window > 0) ------------------------------
 *
 * Layers marked in layout.sliding (Gemma 3's local layers) attend to the last
 * `window` positions only, so their K/V need not stay for the whole sequence.
 * They live in a second group of pages, the WINDOW GROUP, laid out as above
 * with n_layers replaced by the number of sliding layers (and the pages of
 * group 0 hold the other, full-context layers):
 *
 *   arena  [n_pages] page0 (full-context layers), then [window_pages] page1 (sliding layers)
 *   layer l lives in group lms_kv_layer_group(kv, l, &i), at index i within its group's pages
 *
 * A sequence has a block table per group, both indexed by pos / page_tokens.
 * The window table holds pages only from lms_kv_seq_window_pages()'s `first`
 * on: lms_kv_seq_commit(n) gives back the window pages wholly below position
 * n - window (what any later position, or a truncation by one token, can
 * still read), so the window group's pages in use stay bounded by the window
 * whatever the sequence's length. Released full pages are keyed, like group
 * 0's, and stay reusable in that group's own LRU and prefix index.
 *
 * ---- Page life ---------------------------------------------------------------
 *
 *   FREE --(alloc by append/fork-COW/resume)--> IN USE (refs >= 1)
 *   IN USE --(last ref dropped: seq_free/truncate)--> FREE    if not keyed
 *                                                  --> CACHED  if keyed
 *   CACHED (refs 0, in LRU) --(lookup/resume attaches)--> IN USE
 *   CACHED --(evicted, oldest first, when no FREE page is left)--> IN USE
 *
 * A page is keyed when it is full AND its K/V were committed by the caller
 * (lms_kv_seq_commit): key = XXH3-128(parent page key, model id, layout,
 * the page's token ids). Keyed pages are immutable: a sequence that must
 * write into a page that is shared (refs > 1) or keyed copies it first
 * (copy-on-write), so sharing never changes another sequence's data.
 *
 * ---- Allocation --------------------------------------------------------------
 *
 * lms_kv_create allocates everything: the arena (through the device
 * interface), page tables, the key hash table, the sequence slots and their
 * block tables. No sequence operation (new, append, slot, commit, fork,
 * truncate, free, lookup) allocates. Save and resume allocate I/O buffers.
 *
 * Thread safety: an lms_kv is used by one thread at a time (save and resume
 * run their own worker threads inside the call).
 *
 * Errors follow lmstore/error.h. Every sequence operation either succeeds or
 * leaves the cache exactly as it was.
 */
#ifndef LMSTORE_KVCACHE_H
#define LMSTORE_KVCACHE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lmstore/error.h"
#include "lmstore/types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lms_kv lms_kv;
typedef struct lms_kv_seq lms_kv_seq;

#define LMS_KV_PAGE_TOKENS_DEFAULT 16
#define LMS_KV_PAGE_TOKENS_MAX 1024

/* Shape of the cache. Two caches with equal layouts hold interchangeable pages. */
typedef struct lms_kv_layout {
    uint32_t n_layers;
    uint32_t n_kv_heads;
    uint32_t head_dim;
    lms_dtype dtype;      /* LMS_DTYPE_F32, LMS_DTYPE_F16 or LMS_DTYPE_BF16 */
    uint32_t page_tokens; /* tokens per page; 0 = 16; at most 1024 */
    uint32_t window;      /* positions a sliding-window layer attends to; 0 = no such layers (one group) */
    const uint8_t *sliding; /* [n_layers] 1 = a sliding-window layer, 0 = a full-context layer; NULL when
                               window is 0. lms_kv_create copies it; a layout the cache or a session
                               reports points at its own copy (valid while the cache lives / during the
                               callback). At least one layer must be full-context. */
} lms_kv_layout;

typedef struct lms_kv_params {
    uint64_t budget_pages;   /* pages in the arena; 0 = from budget_bytes */
    uint64_t budget_bytes;   /* arena bytes (rounded down to whole pages), used when
                                budget_pages is 0; both 0 = LMS_EINVAL */
    uint32_t max_seqs;       /* live sequences at once; 0 = 64 */
    uint64_t window_pages;   /* pages of the window group (layout.window > 0); 0 = as many as group 0
                                (then budget_bytes is split between the groups in that ratio) */
    uint32_t max_seq_tokens; /* tokens of one sequence; 0 = the whole arena */
    uint8_t model_id[LMS_MODEL_ID_LEN]; /* model whose K/V this holds (lms_model_info.id);
                                           part of every page key and session */
} lms_kv_params;

LMS_API lms_kv_params lms_kv_default_params(void);

/*
 * Create a cache on `dev` (borrowed: it must outlive the cache). Allocates
 * the whole arena now. Errors: LMS_EINVAL (layout: zero sizes, dtype not
 * f32/f16/bf16, page_tokens > 1024; budget under one page), LMS_ERANGE
 * (sizes overflow), LMS_ENOMEM (host tables or device arena; the detail says
 * how many bytes). A window needs `sliding` with at least one full-context
 * layer (LMS_EINVAL otherwise). On failure *out is NULL and nothing needs
 * freeing.
 */
LMS_API int lms_kv_create(lms_device *dev, const lms_kv_layout *layout, const lms_kv_params *params, lms_kv **out);

/*
 * Destroy the cache and its arena. LMS_EBUSY (nothing freed) while
 * sequences are live: free them first. NULL is accepted (returns 0).
 */
LMS_API int lms_kv_destroy(lms_kv *kv);

/* The layout in effect (page_tokens filled in), page count (group 0) and model id. */
LMS_API void lms_kv_get_layout(const lms_kv *kv, lms_kv_layout *out);
LMS_API uint32_t lms_kv_n_pages(const lms_kv *kv);
/* The group of `layer` (0: full-context, 1: the window group) and its index among
 * that group's layers (*index may be NULL). Without a window: 0 and the layer. */
LMS_API int lms_kv_layer_group(const lms_kv *kv, uint32_t layer, uint32_t *index);
LMS_API const uint8_t *lms_kv_model_id(const lms_kv *kv); /* LMS_MODEL_ID_LEN bytes, valid while kv lives */
LMS_API lms_device *lms_kv_device(const lms_kv *kv);
LMS_API size_t lms_kv_elem_size(lms_dtype dtype);           /* 4, 2, 2; 0 for other dtypes */

typedef struct lms_kv_geometry {
    void *base;           /* device pointer of page 0 (valid while kv lives) */
    uint32_t n_pages;
    uint32_t page_tokens;
    size_t elem_size;     /* bytes per element */
    size_t token_bytes;   /* head_dim * elem_size */
    size_t head_bytes;    /* page_tokens * token_bytes */
    size_t v_offset;      /* V of a layer starts this many bytes after its K */
    size_t layer_bytes;   /* 2 * v_offset */
    size_t page_bytes;    /* n_layers * layer_bytes: stride between pages (group 0's layers) */
    /* the window group (layout.window > 0; zeros without): its pages, same strides within a page */
    void *window_base;        /* device pointer of its page 0 */
    uint32_t window_n_pages;
    size_t window_page_bytes; /* sliding layers * layer_bytes */
} lms_kv_geometry;

LMS_API void lms_kv_get_geometry(const lms_kv *kv, lms_kv_geometry *out);

/*
 * Device pointers to the K (or V) block of `layer` in `page` (a page of the
 * layer's group): [n_kv_heads][page_tokens][head_dim] of the layout's dtype. Valid while kv
 * lives; writable only for the slots a sequence reserved with append and
 * has not committed. NULL (and LMS_EINVAL detail) for an out-of-range layer
 * or page.
 */
LMS_API void *lms_kv_page_k(const lms_kv *kv, uint32_t layer, uint32_t page);
LMS_API void *lms_kv_page_v(const lms_kv *kv, uint32_t layer, uint32_t page);

typedef struct lms_kv_stats {
    uint32_t n_pages;
    uint32_t free_pages;    /* never used or released unkeyed */
    uint32_t cached_pages;  /* keyed, no references, reusable (LRU) */
    uint32_t used_pages;    /* referenced by at least one sequence */
    uint32_t shared_pages;  /* referenced by more than one sequence */
    uint32_t keyed_pages;   /* in the prefix index (used or cached) */
    uint32_t n_seqs;        /* live sequences */
    uint64_t evictions;     /* cached pages reused for new data, since creation */
    uint64_t cow_copies;    /* copy-on-write page copies, since creation */
    /* the window group (0 without a window), counted like group 0's pages above */
    uint32_t window_pages, window_free_pages, window_cached_pages, window_used_pages;
    /* pages handed out at least once since creation: in a host arena, the pages
     * backed by memory (the others are address space only until written) */
    uint32_t touched_pages, window_touched_pages;
} lms_kv_stats;

LMS_API void lms_kv_get_stats(const lms_kv *kv, lms_kv_stats *out);

/* References of `page` (0 for a free or cached page, or an invalid id). */
LMS_API uint32_t lms_kv_page_refs(const lms_kv *kv, uint32_t page);

/* Drop every cached page (refs 0) from the prefix index: they become free. */
LMS_API void lms_kv_drop_cached(lms_kv *kv);

/* ---- sequences ---------------------------------------------------------------- */

/*
 * A sequence: its token ids, a block table of page ids, and how many of its
 * positions have K/V written (committed). Handles point into the cache's
 * preallocated slots; they stay valid until lms_kv_seq_free.
 *
 * The caller's protocol for new tokens:
 *   lms_kv_seq_append(kv, seq, ids, n);          reserve positions len..len+n-1
 *   for each new pos: lms_kv_seq_slot(kv, seq, pos, &page, &slot);
 *                     write K/V of every layer at (page, slot)
 *   lms_kv_seq_commit(kv, seq, len + n);          K/V of those positions are final
 * Only committed full pages become keyed and shareable by lookup.
 */

/* A new empty sequence. LMS_ENOSPACE when max_seqs sequences are live. */
LMS_API int lms_kv_seq_new(lms_kv *kv, lms_kv_seq **out);

/*
 * Release the sequence: each page loses one reference; pages nobody
 * references become cached (keyed) or free. NULL is accepted.
 */
LMS_API void lms_kv_seq_free(lms_kv *kv, lms_kv_seq *seq);

/*
 * Append token ids (reserve their positions). Takes free pages first, then
 * evicts the least recently used cached pages; if the last page is partial
 * and shared or keyed it is copied first (copy-on-write). Errors:
 * LMS_EINVAL (n == 0 or tokens NULL), LMS_ENOSPACE (no page left, or the
 * sequence would pass max_seq_tokens). After a failure nothing changed.
 */
LMS_API int lms_kv_seq_append(lms_kv *kv, lms_kv_seq *seq, const int32_t *tokens, uint32_t n);

/* Where position pos (< length) lives: page id and slot within the page.
 * LMS_ERANGE for pos >= length. */
LMS_API int lms_kv_seq_slot(const lms_kv *kv, const lms_kv_seq *seq, uint32_t pos, uint32_t *page, uint32_t *slot);

/*
 * Declare the K/V of positions [0, n_written) written (n_written <= length,
 * and not below the current committed count: LMS_EINVAL). Pages that are
 * full and committed get their chained key and enter the prefix index. With
 * a window, window pages wholly below n_written - window are given back
 * (see "Sliding-window layers").
 */
LMS_API int lms_kv_seq_commit(lms_kv *kv, lms_kv_seq *seq, uint32_t n_written);

LMS_API uint32_t lms_kv_seq_len(const lms_kv_seq *seq);       /* tokens (reserved positions) */
LMS_API uint32_t lms_kv_seq_committed(const lms_kv_seq *seq); /* positions with K/V written */

/*
 * The block table: page ids of positions 0, page_tokens, 2*page_tokens, ...
 * (*n_pages = ceil(len / page_tokens)). Borrowed: valid until the next call
 * that changes this sequence. Host memory.
 */
LMS_API const uint32_t *lms_kv_seq_pages(const lms_kv_seq *seq, uint32_t *n_pages);
/* The window group's block table (layout.window > 0): entries [*first, *n_pages)
 * are window pages of positions first*page_tokens ...; the ones before are given
 * back. NULL (and 0, 0) without a window. Borrowed like lms_kv_seq_pages. */
LMS_API const uint32_t *lms_kv_seq_window_pages(const lms_kv_seq *seq, uint32_t *first, uint32_t *n_pages);

/* Token id at position pos (pos < length; -1 otherwise). */
LMS_API int32_t lms_kv_seq_token(const lms_kv *kv, const lms_kv_seq *seq, uint32_t pos);
/* Copy tokens [0, min(n, len)) into out; returns how many were copied. */
LMS_API uint32_t lms_kv_seq_tokens(const lms_kv *kv, const lms_kv_seq *seq, int32_t *out, uint32_t n);

/*
 * A new sequence sharing all of src's pages (refs + 1 each), same tokens and
 * committed count. The first append to either one copies a shared partial
 * last page. Positions reserved but not yet committed are shared as well:
 * fork after commit, or write those positions once, through one of the two.
 * LMS_ENOSPACE when max_seqs sequences are live.
 */
LMS_API int lms_kv_seq_fork(lms_kv *kv, const lms_kv_seq *src, lms_kv_seq **out);

/*
 * Keep the first n_keep positions (n_keep <= length; LMS_EINVAL otherwise).
 * Pages past them lose a reference; committed becomes min(committed, n_keep).
 * Keyed pages keep their key (their bytes are unchanged): the next append
 * into a kept partial keyed page copies it. With a window, the window pages
 * the kept positions need and the sequence gave back are attached again
 * from the prefix index; when one is gone, LMS_ERANGE and nothing changes
 * (lms_kv_seq_keepable says how far back a truncation can go).
 */
LMS_API int lms_kv_seq_truncate(lms_kv *kv, lms_kv_seq *seq, uint32_t n_keep);
/* The largest m <= n (and <= length) that lms_kv_seq_truncate(kv, seq, m) accepts:
 * n itself without a window; with one, possibly less (0 at worst). Reads only. */
LMS_API uint32_t lms_kv_seq_keepable(const lms_kv *kv, const lms_kv_seq *seq, uint32_t n);

/*
 * Find the longest prefix of tokens[0..n) whose full pages are in the
 * prefix index (only whole pages match) and start a new sequence with those
 * pages attached (refs + 1), length and committed = *n_reused, which is a
 * multiple of page_tokens (0 when nothing matched: the sequence is then
 * empty). With a window, the match also needs the window pages of its last
 * `window` positions in the prefix index, and is shortened until it has them.
 * A caller that needs logits for the last prompt token passes n - 1.
 * LMS_ENOSPACE when max_seqs sequences are live.
 */
LMS_API int lms_kv_lookup(lms_kv *kv, const int32_t *tokens, uint32_t n, lms_kv_seq **out, uint32_t *n_reused);

/* ---- persistence (sessions in the store) ----------------------------------------- */

typedef enum lms_kv_codec {
    LMS_KV_CODEC_RAW = 0,          /* bytes as they are in the arena */
    LMS_KV_CODEC_ZSTD = 1,         /* zstd */
    LMS_KV_CODEC_SHUFFLE_ZSTD = 2, /* byte planes (element byte 0 of all elements, then byte 1...), then zstd */
    /* Save only, never stored: shuffle-zstd for a session whose pages (a
     * sample of up to 8, spread over it) compress at least 1.25x, else raw.
     * K/V that compresses less (f16 K/V stores at about 1.13x) resumes
     * several times faster raw, which on a GPU is bound by the host link
     * rather than by decoding (bench/RESULTS.md, issue 14). */
    LMS_KV_CODEC_AUTO = 3,
} lms_kv_codec;

/* "raw", "zstd", "shuffle-zstd", "auto"; NULL for unknown. */
LMS_API const char *lms_kv_codec_name(lms_kv_codec c);
LMS_API int lms_kv_codec_from_name(const char *name, lms_kv_codec *out); /* LMS_EINVAL if unknown */

typedef struct lms_kv_save_params {
    lms_kv_codec codec;  /* default LMS_KV_CODEC_AUTO (chosen per session) */
    int level;           /* zstd level; 0 = 1 (on bf16 K/V level 1 compresses as well as 3 and decodes faster) */
    int threads;         /* compression threads; 0 = online CPUs */
    bool no_replace;     /* fail with LMS_EEXIST if the session exists (default: replace) */
} lms_kv_save_params;

typedef struct lms_kv_resume_params {
    int threads;         /* decompression threads; 0 = online CPUs */
} lms_kv_resume_params;

typedef struct lms_kv_io_stats {
    uint32_t tokens;
    uint32_t pages;          /* pages of the session */
    uint32_t pages_written;  /* save: pages the store lacked; resume: pages read from the store */
    uint32_t pages_reused;   /* save: pages already stored; resume: pages found in the prefix cache */
    uint64_t raw_bytes;      /* K/V bytes of the session (all pages, valid tokens) */
    uint64_t stored_bytes;   /* bytes written (save) or read (resume) in segments */
    double seconds;
} lms_kv_io_stats;

LMS_API lms_kv_save_params lms_kv_default_save_params(void);
LMS_API lms_kv_resume_params lms_kv_default_resume_params(void);

/*
 * Save the committed positions of `seq` as session `name` in `store`:
 * pages the store lacks are compressed, checksummed and appended to KV
 * segments (fsync'd), then the session record and the new page records
 * commit in one LMDB transaction. A session of the same name is replaced
 * (unless params->no_replace). The cache is not changed. params and stats
 * may be NULL. With a window, the window group's pages of the last `window`
 * positions are saved beside the full-context pages (what resuming needs);
 * the record names the window and the sliding layers, and a resume into
 * another layout is refused. Errors: LMS_EINVAL (an invalid name: empty, over 400 bytes,
 * not UTF-8, a control character or a leading '-'; or no committed token),
 * LMS_EEXIST, LMS_EIO, LMS_EDB, LMS_ENOMEM. After a failure no session of
 * that name changed (a crash leaves at most unreferenced segment bytes for gc).
 */
LMS_API int lms_kv_save(lms_kv *kv, const lms_kv_seq *seq, lms_store *store, const char *name);
LMS_API int lms_kv_save_ex(lms_kv *kv, const lms_kv_seq *seq, lms_store *store, const char *name,
                   const lms_kv_save_params *params, lms_kv_io_stats *stats);

/*
 * Resume session `name` as a new sequence *out (length = committed = the
 * saved tokens; full pages keyed and shareable). Pages already in the
 * prefix cache are attached; the others are read, checksum-verified and
 * decompressed (multi-threaded) into any free pages (then evicted cached
 * pages). Errors, each with a detail naming the session:
 *   LMS_ENOENT     no such session
 *   LMS_EVERSION   the session or a page record has a version this build does not read
 *   LMS_EMISMATCH  saved with another model ("other model") or another layout ("other layout",
 *                  which includes the window and the set of sliding layers)
 *   LMS_ECORRUPT   a page fails its checksum or does not decode (page index named),
 *                  or the record is malformed
 *   LMS_EFORMAT    a KV segment is truncated (page index and segment named)
 *   LMS_ENOSPACE   not enough free + cached pages, or max_seqs reached
 * On any failure the cache is exactly as before (same sequences, pages,
 * refs, keys, LRU order and page bytes of every used or cached page) and
 * *out is NULL. (One exception, on device arenas: if the device fails a
 * copy into a cached page chosen for eviction, the cached pages written so
 * far leave the prefix cache; LMS_EDEVICE.)
 */
LMS_API int lms_kv_resume(lms_kv *kv, lms_store *store, const char *name, lms_kv_seq **out);
LMS_API int lms_kv_resume_ex(lms_kv *kv, lms_store *store, const char *name, const lms_kv_resume_params *params,
                     lms_kv_seq **out, lms_kv_io_stats *stats);

/* ---- sessions in the store (for `lmstore kv ...`) ---------------------------------- */

typedef struct lms_kv_session_info {
    const char *name;
    uint32_t version;         /* record version */
    uint8_t model_id[LMS_MODEL_ID_LEN];
    lms_kv_layout layout;
    uint32_t n_tokens;
    uint32_t n_pages;
    uint32_t n_window_pages;  /* window-group pages saved (layout.window > 0): the last window's */
    uint64_t created;         /* unix seconds */
    uint64_t last_used;       /* unix seconds (last save, or last resume once its pages began to be read) */
    uint64_t raw_bytes;       /* K/V bytes of its pages (valid tokens) */
    uint64_t stored_bytes;    /* bytes of its pages in segments (shared pages counted fully) */
    uint32_t missing_pages;   /* page records absent from the index (0 in a healthy store) */
} lms_kv_session_info;

typedef struct lms_kv_page_info {
    uint32_t index;           /* position in the session (0 = first page) */
    bool window;              /* a window-group page (the sliding layers' K/V of those positions) */
    uint8_t key[16];          /* content key */
    bool present;             /* record found in the index */
    lms_kv_codec codec;
    uint32_t n_tokens;        /* valid tokens in the page */
    uint32_t segment;
    uint64_t offset;
    uint64_t stored_size;
    uint64_t raw_size;
} lms_kv_page_info;

typedef int (*lms_kv_session_cb)(void *ctx, const lms_kv_session_info *info);
typedef int (*lms_kv_page_cb)(void *ctx, const lms_kv_page_info *page);

/* Every session, by name, from one snapshot. Strings valid during cb only.
 * A record this build cannot decode is reported with version set and
 * n_tokens 0 rather than failing the listing. */
LMS_API int lms_kv_sessions(lms_store *store, lms_kv_session_cb cb, void *ctx);
/* One session (LMS_ENOENT if absent); page_cb (may be NULL) gets each page. */
LMS_API int lms_kv_session(lms_store *store, const char *name, lms_kv_session_cb cb, lms_kv_page_cb page_cb, void *ctx);
/* Remove the session record (LMS_ENOENT if absent). Its pages stay until
 * `lmstore gc` finds no session referencing them. */
LMS_API int lms_kv_session_rm(lms_store *store, const char *name);

#ifdef __cplusplus
}
#endif
#endif
