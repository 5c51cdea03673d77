/*
 * kvcache/kv_persist.c - saving sequences into the store as sessions and
 * resuming them, in this or another process.
 *
 * Stored form (docs/FORMAT.md "kvpages", "sessions"; store/kv_records.h):
 * each page of a session is a blob (kind KV page) in a segment, found through
 * a kvpages record keyed by the page's content key; the session record lists
 * the page keys. Keys chain over the whole prefix (kvcache/kv_arena.c), so a
 * page key names the K/V of one exact prefix of one model and layout: two
 * sessions sharing a prefix share its stored pages.
 *
 * The split: this file owns the page bytes (packing, codecs, checksums,
 * device copies) and the order of the steps; the store's KV index
 * (store/kv_index.h) owns every record, lock, transaction and segment file;
 * the arena (kv_arena.c: lms__kv_save_pages, lms__kv_resume_plan,
 * lms__kv_seq_attach) owns every change to the cache's bookkeeping.
 *
 *   save:   save_prepare -> save_lookup (append lock) -> save_buffers ->
 *           save_choose_codec -> save_batches { encode | dedup + reserve |
 *           write } -> save_commit
 *   resume: res_open -> res_keys -> res_locate (snapshot, segments mapped)
 *           -> res_plan -> res_decode -> res_copy_staged -> res_build
 *
 * Design notes:
 *  (1) save: pages the store lacks are encoded (thread pool), appended and
 *      fsync'd through the index's writer (holding the store's append lock,
 *      so gc cannot delete a page record we decided to reuse), then the blob,
 *      kvpages and session records commit in ONE write transaction. A crash
 *      before that commit leaves only unreferenced segment bytes (gc's);
 *      after it, the whole session. The cache is only read.
 *  (2) resume: everything that can fail happens before the cache changes:
 *      record checks, page records, segment ranges, checksums and decoding.
 *      Pages whose target is a free arena page are decoded straight into it
 *      (host arenas) or into a worker's page image and copied to the device
 *      by that worker (device arenas): a free page's bytes belong to nobody.
 *      Pages whose target is a cached page to evict are decoded into a host
 *      staging buffer and copied only once every page checked out. Then
 *      lms__kv_seq_attach takes the pages and builds the sequence, a step
 *      that cannot fail. The one exception: a failed device copy into an
 *      evicted page drops the pages so written from the prefix cache (a
 *      device error), so a cached page never holds other bytes than its key.
 *  (3) Pages of the session already in the prefix cache (same key) are
 *      attached instead of read.
 *  (4) A page's raw form is its K/V bytes in arena order for its valid
 *      tokens: [layer][K,V][head][n_tokens][head_dim]; for a full page that
 *      is exactly the arena page (one contiguous run).
 *  (5) With a window, a session's pages are its group-0 pages (every
 *      position, the full-context layers) followed by the window pages of
 *      its last `window` positions (the sliding layers): one list of items
 *      that every step walks alike, each item knowing its group. The record
 *      lists the keys in that order and names the window and the sliding
 *      layers (record version 2).
 *  (6) Device arenas with page-locked memory move page bytes only through the cache's
 *      ring (struct lms__kv_io, made once, kept): a resume's worker reads
 *      and checks a page into its next slot and uploads it from there on
 *      its own stream; a slot is reused only after its event, and the
 *      resume returns only after every stream is synchronized, so a page
 *      is used, and a slot rewritten or freed, only once its upload is done.
 *  (7) LMS_KV_CODEC_AUTO is resolved before any page is encoded
 *      (save_choose_codec): records hold only real codecs.
 */
#include <stdio.h>
#include <string.h>

#include "common/crashpoint.h"
#include "kvcache/kv_codec.h"
#include "kvcache/kv_internal.h"
#include "store/kv_index.h"
#include "store/names.h"

lms_kv_save_params lms_kv_default_save_params(void)
{
    lms_kv_save_params p;
    memset(&p, 0, sizeof p);
    p.codec = LMS_KV_CODEC_AUTO;
    return p;
}

lms_kv_resume_params lms_kv_default_resume_params(void)
{
    lms_kv_resume_params p;
    memset(&p, 0, sizeof p);
    return p;
}

/* Raw bytes of a page of group g with n valid tokens: n * (page_bytes / P). */
static size_t raw_size(const lms_kv *kv, uint32_t g, uint32_t n) { return (size_t)n * (kv->g[g].page_bytes / kv->P); }

/* The larger page of the two groups: buffers that hold any page. */
static size_t max_page(const lms_kv *kv) { return LMS_MAX(kv->g[0].page_bytes, kv->g[1].page_bytes); }

/* Item k of a session with n0 group-0 pages and window pages from wfirst
 * (design note 5): its group and its page index in the sequence. */
static uint32_t item_group(uint32_t n0, uint32_t k) { return k >= n0; }
static uint32_t item_index(uint32_t n0, uint32_t wfirst, uint32_t k) { return k < n0 ? k : wfirst + (k - n0); }

/* Copy the valid-token rows of arena page image `page` (host, group g) into dst (packed). */
static void pack_page(const lms_kv *kv, uint32_t g, const uint8_t *page, uint32_t n, uint8_t *dst)
{
    size_t rows = (size_t)kv->g[g].n_layers * 2 * kv->layout.n_kv_heads, run = n * kv->token_bytes;
    for (size_t r = 0; r < rows; r++, dst += run)
        memcpy(dst, page + r * kv->head_bytes, run);
}

static void unpack_page(const lms_kv *kv, uint32_t g, const uint8_t *src, uint32_t n, uint8_t *page)
{
    size_t rows = (size_t)kv->g[g].n_layers * 2 * kv->layout.n_kv_heads, run = n * kv->token_bytes;
    for (size_t r = 0; r < rows; r++, src += run)
        memcpy(page + r * kv->head_bytes, src, run);
}

static bool host_arena(const lms_kv *kv) { return kv->dev->kind == LMS_DEVICE_CPU; }

/* Keep a worker's error detail with its page: lms_last_error() is per thread. */
static void keep_detail(char *dst, size_t n, int rc)
{
    const char *d = lms_last_error();
    snprintf(dst, n, "%s", d && *d ? d : lms_strerror(rc));
}

/* The workers of a save or a resume: a pool, per worker a codec context
 * (its scratch one raw page) and up to KV_SCRATCH host buffers, and for a
 * device arena the cache's I/O ring: KV_IO_SLOTS page-sized slots of
 * page-locked memory per worker, a stream per worker and an event per slot.
 * A device arena's cache keeps all of it between calls (struct lms__kv_io,
 * made by the first save or resume): pinning costs milliseconds per MiB and
 * starting threads and allocating buffers about a millisecond, against a
 * resume of 512 MiB in about ten. A resume's worker reads and checks a page
 * into its next slot and starts the slot's upload on its stream; the slot
 * is reused once its event says the upload is done, so up to KV_IO_SLOTS
 * uploads per worker run while the workers read on. No host copy of the
 * whole cache is ever made. */
#define KV_SCRATCH 3
#define KV_IO_SLOTS 3
#define KV_IO_MAX_WORKERS 64
typedef struct kv_workers {
    lms_pool *pool;
    int n;
    lms__kv_codec_ctx *codec;
    uint8_t **buf[KV_SCRATCH]; /* buf[k][worker], sizes[k] bytes (none when 0): host scratch */
    struct lms__kv_io *io;     /* device arenas with page-locked memory: the cache's (it owns all above) */
} kv_workers;

/* What a device arena's cache keeps for its save/resume workers. */
struct lms__kv_io {
    lms_pool *pool;
    lms__kv_codec_ctx codec[KV_IO_MAX_WORKERS];
    uint8_t *bufp[KV_SCRATCH][KV_IO_MAX_WORKERS]; /* host scratch, as kv_workers.buf */
    size_t size[KV_SCRATCH][KV_IO_MAX_WORKERS];
    size_t scratch;       /* bytes of each codec scratch */
    uint8_t *ring;        /* page-locked: workers x KV_IO_SLOTS slots of slot_bytes, worker-major */
    size_t slot_bytes;
    int workers;          /* workers the ring has slots for */
    bool registered;      /* lms__pinned_alloc's flag */
    lms_stream *stream[KV_IO_MAX_WORKERS];
    lms_event *event[KV_IO_MAX_WORKERS][KV_IO_SLOTS]; /* the last upload out of that slot */
};

static uint8_t *io_slot(const struct lms__kv_io *io, int worker, int k)
{
    return io->ring + ((size_t)worker * KV_IO_SLOTS + (size_t)k) * io->slot_bytes;
}

void lms__kv_io_free(lms_kv *kv)
{
    struct lms__kv_io *io = kv->io;
    lms_device *d = kv->dev;
    if (!io)
        return;
    lms__pool_destroy(io->pool);
    for (int i = 0; i < KV_IO_MAX_WORKERS; i++) {
        lms__kv_codec_ctx_free(&io->codec[i]);
        for (int k = 0; k < KV_SCRATCH; k++)
            lms__free(io->bufp[k][i]);
        for (int k = 0; k < KV_IO_SLOTS; k++)
            if (io->event[i][k])
                d->ops->event_destroy(d, io->event[i][k]);
        if (io->stream[i])
            d->ops->stream_destroy(d, io->stream[i]);
    }
    lms__pinned_free(d, io->ring, io->registered);
    lms__free(io);
    kv->io = NULL;
}

static bool pinned_io(const lms_kv *kv)
{
    const lms_device_ops *o = kv->dev->ops;
    return !host_arena(kv) && ((o->alloc_host && o->free_host) || (o->host_register && o->host_unregister));
}

/* kv->io with a pool of `threads` (at least, unless `exact`) and, for each of its workers, a codec
 * context, scratch buffers of sizes[k] and a ring slots, stream and events
 * (made or grown; every earlier upload out of the ring completed before
 * its call returned). The ring has slots for at least every CPU's worker,
 * so that a save and the resumes after it share one pinning. */
static int io_prepare(lms_kv *kv, int threads, bool exact, size_t scratch, const size_t sizes[KV_SCRATCH])
{
    lms_device *d = kv->dev;
    struct lms__kv_io *io = kv->io;
    int rc;
    if (!io && !(io = kv->io = lms__calloc(1, sizeof *io)))
        return LMS_ENOMEM;
    if (io->pool && (lms__pool_threads(io->pool) < threads || (exact && lms__pool_threads(io->pool) != threads))) {
        lms__pool_destroy(io->pool);
        io->pool = NULL;
    }
    if (!io->pool && (rc = lms__pool_create(threads, &io->pool)))
        return rc;
    int n = lms__pool_threads(io->pool);
    if (io->scratch < scratch)
        for (int i = 0; i < KV_IO_MAX_WORKERS; i++) {
            lms__free(io->codec[i].scratch);
            io->codec[i].scratch = NULL;
        }
    io->scratch = LMS_MAX(io->scratch, scratch);
    for (int i = 0; i < n; i++) {
        if (!io->codec[i].scratch && !(io->codec[i].scratch = lms__malloc(io->scratch)))
            return LMS_ENOMEM;
        for (int k = 0; k < KV_SCRATCH; k++) {
            if (io->size[k][i] >= sizes[k])
                continue;
            lms__free(io->bufp[k][i]);
            io->size[k][i] = 0;
            if (!(io->bufp[k][i] = lms__malloc(sizes[k])))
                return LMS_ENOMEM;
            io->size[k][i] = sizes[k];
        }
    }
    size_t slot = (size_t)lms__align_up(max_page(kv), 4096);
    if (io->workers < n || io->slot_bytes < slot) {
        double t0 = lms__now();
        int want = LMS_MAX(LMS_MAX(n, io->workers), LMS_MIN(lms__cpu_count(), KV_IO_MAX_WORKERS));
        lms__pinned_free(d, io->ring, io->registered);
        io->ring = NULL;
        io->workers = 0;
        void *p = NULL;
        if ((rc = lms__pinned_alloc(d, (size_t)want * KV_IO_SLOTS * slot, &p, &io->registered)))
            return rc;
        io->ring = p;
        io->slot_bytes = slot;
        io->workers = want;
        lms__debug("KV I/O ring: %d x %d slots of %zu KiB pinned in %.1f ms", want, KV_IO_SLOTS, slot >> 10,
                   (lms__now() - t0) * 1e3);
    }
    for (int i = 0; i < n && d->ops->stream_create && d->ops->event_create; i++) {
        if (!io->stream[i] && d->ops->stream_create(d, &io->stream[i]))
            return LMS_EDEVICE;
        for (int k = 0; k < KV_IO_SLOTS; k++)
            if (!io->event[i][k] && d->ops->event_create(d, &io->event[i][k]))
                return LMS_EDEVICE;
    }
    return 0;
}

/* I/O threads asked for (0 = online CPUs), at most KV_IO_MAX_WORKERS (per-worker arrays). */
static int io_threads(int asked) { return LMS_MIN(asked > 0 ? asked : lms__cpu_count(), KV_IO_MAX_WORKERS); }

int lms__kv_io_reserve(lms_kv *kv, int threads)
{
    const size_t sizes[KV_SCRATCH] = {0, 0, 0}; /* host scratch: made by the calls that need it */
    if (!pinned_io(kv))
        return 0;
    return io_prepare(kv, io_threads(threads), false, max_page(kv), sizes);
}

/* Threads for `jobs` pages: io_threads(asked), at most jobs, at least 1. */
static int workers_create(kv_workers *w, lms_kv *kv, int asked, uint32_t jobs, size_t scratch,
                          const size_t sizes[KV_SCRATCH])
{
    int threads = io_threads(asked), rc;
    if (threads > (int)jobs)
        threads = jobs ? (int)jobs : 1;
    if (pinned_io(kv)) {
        if ((rc = io_prepare(kv, threads, asked > 0, scratch, sizes)))
            return rc;
        w->io = kv->io;
        w->pool = w->io->pool;
        w->n = lms__pool_threads(w->pool);
        w->codec = w->io->codec;
        for (int k = 0; k < KV_SCRATCH; k++) w->buf[k] = w->io->bufp[k];
        return 0;
    }
    if ((rc = lms__pool_create(threads, &w->pool)))
        return rc;
    w->n = lms__pool_threads(w->pool);
    if (!(w->codec = lms__calloc((size_t)w->n, sizeof *w->codec)))
        return LMS_ENOMEM;
    for (int i = 0; i < w->n; i++)
        if (!(w->codec[i].scratch = lms__malloc(scratch)))
            return LMS_ENOMEM;
    for (int k = 0; k < KV_SCRATCH; k++)
        if (!(w->buf[k] = lms__calloc((size_t)w->n, sizeof *w->buf[k])))
            return LMS_ENOMEM;
    for (int i = 0; i < w->n; i++)
        for (int k = 0; k < KV_SCRATCH; k++)
            if (sizes[k] && !(w->buf[k][i] = lms__malloc(sizes[k])))
                return LMS_ENOMEM;
    return 0;
}

static void workers_free(kv_workers *w)
{
    if (w->io)
        return; /* the cache's */
    lms__pool_destroy(w->pool);
    for (int i = 0; i < w->n; i++) {
        if (w->codec)
            lms__kv_codec_ctx_free(&w->codec[i]);
        for (int k = 0; k < KV_SCRATCH; k++)
            if (w->buf[k])
                lms__free(w->buf[k][i]);
    }
    lms__free(w->codec);
    for (int k = 0; k < KV_SCRATCH; k++)
        lms__free(w->buf[k]);
}

/* ======================================================================================
 * save
 * ==================================================================================== */

/* LMS_KV_CODEC_AUTO: pages sampled, and the ratio (raw / stored) from
 * which a session is stored shuffle-zstd. At 1.25x the pages decode about
 * 3x slower than raw ones read (RESULTS.md, issue 5), which a 20% smaller
 * read from the page cache does not repay; on the GPU a raw resume is bound
 * by the host link, a compressed one by decoding. */
#define KV_AUTO_PROBE 8
#define KV_AUTO_MIN_RATIO 1.25

typedef struct save_page {
    const uint8_t *data;  /* encoded bytes (stored_size): a batch slot or the arena page; valid during its batch */
    int rc;
    char err[200];        /* the failing worker's detail */
} save_page;

typedef struct save_ctx {
    lms_kv *kv;
    const char *name;
    lms_kv_save_params params;
    save_page *pages;
    lms__kv_save_page *at;    /* [n_pages]: arena page, valid tokens and key of each page (item) */
    lms__kv_page_put *puts;   /* [n_pages]: what the commit does with each page (and its record) */
    uint32_t n_pages, n_tokens, to_write;
    uint32_t n0, wfirst;      /* group-0 pages, first window page (design note 5): n_pages = n0 + n0 - wfirst */
    int32_t *tokens;          /* n_tokens, little-endian (the record's form) */
    uint8_t *keys;            /* n_pages x 16 */
    lms__kv_writer *w;        /* holds the store's append lock */
    kv_workers wk;            /* buf[SAVE_PACK]: a packed page; buf[SAVE_IMAGE]: a device page image (no ring) */
    uint8_t **slot;           /* per batch slot: encode bound of a page */
    lms__kv_blob_query *query; /* per batch slot */
    uint32_t n_slots;
    uint32_t batch0;          /* first page of the batch being encoded / written */
    uint32_t probe[KV_AUTO_PROBE]; /* LMS_KV_CODEC_AUTO: the sample's pages, */
    size_t probe_raw[KV_AUTO_PROBE], probe_stored[KV_AUTO_PROBE]; /* their raw and shuffle-zstd sizes */
    uint64_t created;
    double t_enc, t_wr;
} save_ctx;
enum { SAVE_PACK, SAVE_IMAGE };

/* A page this save writes (the others are stored already or repeat a key). */
static bool save_encodes(const save_ctx *c, uint32_t i)
{
    return c->puts[i].put != LMS__KV_PUT_SKIP && c->puts[i].put != LMS__KV_PUT_STORED;
}

/* The page's raw form (design note 4) into the worker's buffer, or the arena page itself. */
static int save_raw(save_ctx *c, uint32_t g, const lms__kv_save_page *sp, int worker, const uint8_t **raw)
{
    lms_kv *kv = c->kv;
    const kv_group *G = &kv->g[g];
    uint8_t *buf = c->wk.buf[SAVE_PACK][worker];
    if (host_arena(kv)) {
        const uint8_t *pg = lms__kv_gpage_ptr(G, sp->page);
        if (sp->n_tokens == kv->P) {
            *raw = pg;
            return 0;
        }
        pack_page(kv, g, pg, sp->n_tokens, buf);
        *raw = buf;
        return 0;
    }
    /* the device page image: a slot of the worker's pinned ring where there is one */
    uint8_t *img = c->wk.io ? io_slot(c->wk.io, worker, 0) : c->wk.buf[SAVE_IMAGE][worker];
    int rc = kv->dev->ops->copy_d2h(kv->dev, img, lms__kv_gpage_ptr(G, sp->page), G->page_bytes, NULL);
    if (rc)
        return rc;
    if (sp->n_tokens == kv->P) {
        *raw = img;
        return 0;
    }
    pack_page(kv, g, img, sp->n_tokens, buf);
    *raw = buf;
    return 0;
}

static void save_encode_one(void *arg, size_t bi, int worker)
{
    save_ctx *c = arg;
    uint32_t i = c->batch0 + (uint32_t)bi;
    save_page *sp = &c->pages[i];
    const lms__kv_save_page *at = &c->at[i];
    lms__kvpage_rec *rec = &c->puts[i].rec;
    lms_kv *kv = c->kv;
    if (!save_encodes(c, i))
        return;
    uint32_t g = item_group(c->n0, i);
    size_t n = raw_size(kv, g, at->n_tokens), cap = lms__kv_encode_bound(n), len = n;
    const uint8_t *raw;
    uint8_t *out = c->slot[bi];
    int rc = save_raw(c, g, at, worker, &raw);
    if (!rc && c->params.codec == LMS_KV_CODEC_RAW) {
        /* A full host page is written straight from the arena; a packed or
         * device-copied page lives in this worker's buffer, which its next
         * page reuses, so it moves to the page's batch slot. */
        if (raw != lms__kv_gpage_ptr(&kv->g[g], at->page)) {
            memcpy(out, raw, n);
            raw = out;
        }
        sp->data = raw;
        rec->codec = LMS__KV_CODEC_RAW;
    } else if (!rc) {
        rc = lms__kv_encode(&c->wk.codec[worker], c->params.codec, c->params.level, raw, n, kv->elem, out, cap, &len);
        /* Keep raw when a codec does not pay for itself. */
        if (!rc && len >= n) {
            memcpy(out, raw, n);
            len = n;
        }
        rec->codec = len < n ? (uint16_t)c->params.codec : LMS__KV_CODEC_RAW;
        sp->data = out;
    }
    if (rc) {
        keep_detail(sp->err, sizeof sp->err, rc);
        sp->rc = rc;
        return;
    }
    rec->elem_size = (uint16_t)kv->elem;
    rec->n_tokens = at->n_tokens;
    rec->raw_size = n;
    rec->raw_hash = lms__hash64(raw, n, 0);
    rec->stored_size = len;
    lms__hash128_put(rec->blob, lms__hash128(sp->data, len));
}

static void save_write_one(void *arg, size_t bi, int worker)
{
    save_ctx *c = arg;
    uint32_t i = c->batch0 + (uint32_t)bi;
    save_page *sp = &c->pages[i];
    const lms__kv_page_put *p = &c->puts[i];
    (void)worker;
    if (p->put != LMS__KV_PUT_NEW)
        return;
    sp->rc = lms__kv_write_bytes(c->w, p->segment, p->offset, sp->data, p->rec.stored_size);
    if (sp->rc)
        keep_detail(sp->err, sizeof sp->err, sp->rc);
}

/* The first worker error of pages [from, from + n), named. */
static int save_worker_error(const save_ctx *c, uint32_t from, uint32_t n)
{
    for (uint32_t i = from; i < from + n; i++)
        if (c->pages[i].rc)
            return lms__err(c->pages[i].rc, "KV save '%s': page %u: %s", c->name, i, c->pages[i].err);
    return 0;
}

/* Tokens (little-endian), pages, keys, and which pages repeat an earlier key. */
static int save_prepare(save_ctx *c, const lms_kv_seq *seq)
{
    lms_kv *kv = c->kv;
    c->n_tokens = seq->committed;
    c->n0 = (c->n_tokens + kv->P - 1) / kv->P;
    c->wfirst = kv->n_groups == 2 ? lms__kv_window_first(kv, c->n_tokens) : c->n0;
    c->n_pages = c->n0 + (c->n0 - c->wfirst);
    if (!(c->pages = lms__calloc(c->n_pages, sizeof *c->pages)) || !(c->at = lms__calloc(c->n_pages, sizeof *c->at)) ||
        !(c->puts = lms__calloc(c->n_pages, sizeof *c->puts)) || !(c->tokens = lms__malloc((size_t)c->n_tokens * 4)) ||
        !(c->keys = lms__malloc((size_t)c->n_pages * 16)))
        return LMS_ENOMEM;
    lms_kv_seq_tokens(kv, seq, c->tokens, c->n_tokens);
    for (uint32_t pos = 0; pos < c->n_tokens; pos++)
        lms__put_u32((uint8_t *)&c->tokens[pos], (uint32_t)c->tokens[pos]);
    lms__kv_save_pages(kv, seq, c->n_tokens, c->at);
    for (uint32_t i = 0; i < c->n_pages; i++) {
        lms__hash128_put(c->keys + 16 * (size_t)i, c->at[i].key);
        c->puts[i].put = LMS__KV_PUT_NEW;
        for (uint32_t j = 0; j < i && c->puts[i].put != LMS__KV_PUT_SKIP; j++)
            if (lms__hash128_eq(c->at[j].key, c->at[i].key))
                c->puts[i].put = LMS__KV_PUT_SKIP;
    }
    return 0;
}

/* The append lock first: from here on no gc deletes what we see. Then which
 * pages the store has already. */
static int save_lookup(save_ctx *c, lms_store *store)
{
    int rc = lms__kv_write_begin(store, c->name, &c->w);
    if (rc)
        return rc;
    bool *stored = lms__calloc(c->n_pages, sizeof *stored);
    if (!stored)
        return LMS_ENOMEM;
    if (!(rc = lms__kv_write_lookup(c->w, c->keys, c->n_pages, stored)))
        for (uint32_t i = 0; i < c->n_pages; i++) {
            if (c->puts[i].put == LMS__KV_PUT_SKIP)
                continue;
            if (stored[i])
                c->puts[i].put = LMS__KV_PUT_STORED;
            else
                c->to_write++;
        }
    lms__free(stored);
    return rc;
}

/* Pages go in batches through encode (threads) -> dedup and reserve (this
 * thread) -> write (threads), reusing one set of buffers: memory stays
 * bounded and warm whatever the session's size. */
static int save_buffers(save_ctx *c)
{
    lms_kv *kv = c->kv;
    const size_t sizes[KV_SCRATCH] = {[SAVE_PACK] = max_page(kv),
                                      [SAVE_IMAGE] = host_arena(kv) || pinned_io(kv) ? 0 : max_page(kv)};
    int rc = workers_create(&c->wk, kv, c->params.threads, c->to_write, max_page(kv), sizes);
    if (rc)
        return rc;
    c->n_slots = (uint32_t)(4 * c->wk.n);
    if (!(c->slot = lms__calloc(c->n_slots, sizeof *c->slot)) || !(c->query = lms__calloc(c->n_slots, sizeof *c->query)))
        return LMS_ENOMEM;
    for (uint32_t k = 0; k < c->n_slots; k++)
        if (!(c->slot[k] = lms__malloc(lms__kv_encode_bound(max_page(kv)))))
            return LMS_ENOMEM;
    return 0;
}

static void save_probe_one(void *arg, size_t k, int worker)
{
    save_ctx *c = arg;
    lms_kv *kv = c->kv;
    uint32_t i = c->probe[k], g = item_group(c->n0, i);
    size_t n = raw_size(kv, g, c->at[i].n_tokens), len = n;
    const uint8_t *raw;
    /* a page that fails here counts as incompressible: saving it names the error */
    if (save_raw(c, g, &c->at[i], worker, &raw) ||
        lms__kv_encode(&c->wk.codec[worker], LMS_KV_CODEC_SHUFFLE_ZSTD, c->params.level, raw, n, kv->elem, c->slot[k],
                       lms__kv_encode_bound(n), &len))
        len = n;
    c->probe_raw[k] = n;
    c->probe_stored[k] = LMS_MIN(len, n);
}

/* LMS_KV_CODEC_AUTO: encode a sample of the pages to write (spread over
 * the session) and choose the session's codec from their ratio. */
static int save_choose_codec(save_ctx *c)
{
    if (c->params.codec != LMS_KV_CODEC_AUTO)
        return 0;
    uint32_t np = LMS_MIN(LMS_MIN((uint32_t)KV_AUTO_PROBE, c->to_write), c->n_slots), k = 0;
    for (uint32_t i = 0, seen = 0; i < c->n_pages && k < np; i++) {
        if (!save_encodes(c, i))
            continue;
        /* the (k+1)-th of np evenly spaced picks among to_write pages */
        if ((uint64_t)seen++ * np >= (uint64_t)k * c->to_write)
            c->probe[k++] = i;
    }
    lms__pool_run(c->wk.pool, k, save_probe_one, c);
    size_t raw = 0, stored = 0;
    for (uint32_t j = 0; j < k; j++) {
        raw += c->probe_raw[j];
        stored += c->probe_stored[j];
    }
    bool pays = stored && (double)raw >= KV_AUTO_MIN_RATIO * (double)stored;
    c->params.codec = pays ? LMS_KV_CODEC_SHUFFLE_ZSTD : LMS_KV_CODEC_RAW;
    lms__debug("KV save '%s': codec %s (a sample of %u pages compresses %.3fx)", c->name,
               lms_kv_codec_name(c->params.codec), k, stored ? (double)raw / (double)stored : 0.0);
    return 0;
}

/* Identical stored bytes already a blob (pages of zeros, say), in the store
 * or earlier in this save: reference that blob instead of writing them. */
static int save_dedup(save_ctx *c, uint32_t b0, uint32_t bn)
{
    uint32_t nq = 0;
    for (uint32_t i = b0; i < b0 + bn; i++)
        if (c->puts[i].put == LMS__KV_PUT_NEW)
            c->query[nq++] = (lms__kv_blob_query){c->puts[i].rec.blob, c->pages[i].data, c->puts[i].rec.stored_size, i, false};
    int rc = lms__kv_write_find_blobs(c->w, c->query, nq);
    if (rc)
        return rc;
    for (uint32_t q = 0; q < nq; q++) {
        uint32_t i = c->query[q].page;
        lms__kv_page_put *sp = &c->puts[i];
        if (c->query[q].exists)
            sp->put = LMS__KV_PUT_SHARE;
        for (uint32_t j = 0; j < i && sp->put == LMS__KV_PUT_NEW; j++) {
            const lms__kv_page_put *o = &c->puts[j];
            if (o->put != LMS__KV_PUT_NEW || memcmp(o->rec.blob, sp->rec.blob, 16))
                continue;
            bool same;
            if (j >= b0) {
                same = o->rec.stored_size == sp->rec.stored_size &&
                       !memcmp(c->pages[j].data, c->pages[i].data, sp->rec.stored_size);
            } else if (o->rec.stored_size != sp->rec.stored_size) {
                same = false;
            } else if ((rc = lms__kv_write_same(c->w, o->segment, o->offset, c->pages[i].data, sp->rec.stored_size,
                                                &same))) {
                return rc;
            }
            if (same)
                sp->put = LMS__KV_PUT_SHARE; /* o's blob record is put first, in the same transaction */
        }
    }
    return 0;
}

static int save_batches(save_ctx *c)
{
    int rc;
    for (c->batch0 = 0; c->batch0 < c->n_pages; c->batch0 += c->n_slots) {
        uint32_t b0 = c->batch0, bn = LMS_MIN(c->n_slots, c->n_pages - b0);
        double t1 = lms__now();
        lms__pool_run(c->wk.pool, bn, save_encode_one, c);
        c->t_enc += lms__now() - t1;
        if ((rc = save_worker_error(c, b0, bn)) || (rc = save_dedup(c, b0, bn)))
            return rc;
        for (uint32_t i = b0; i < b0 + bn; i++) {
            lms__kv_page_put *p = &c->puts[i];
            if (p->put == LMS__KV_PUT_NEW &&
                (rc = lms__kv_write_reserve(c->w, p->rec.stored_size, &p->segment, &p->offset)))
                return rc;
        }
        if (b0 == 0)
            lms__crashpoint("kv-save:before-write");
        t1 = lms__now();
        lms__pool_run(c->wk.pool, bn, save_write_one, c);
        c->t_wr += lms__now() - t1;
        if ((rc = save_worker_error(c, b0, bn)))
            return rc;
    }
    return 0;
}

/* fsync, then the records in one transaction (design note 1). */
static int save_commit(save_ctx *c)
{
    lms_kv *kv = c->kv;
    lms__crashpoint("kv-save:before-sync");
    double t_sync0 = lms__now();
    int rc = lms__kv_write_sync(c->w);
    if (rc)
        return rc;
    double t_sync1 = lms__now();
    lms__crashpoint("kv-save:before-commit");
    lms__session_rec r;
    memset(&r, 0, sizeof r);
    memcpy(r.model_id, kv->model_id, LMS_MODEL_ID_LEN);
    r.n_layers = kv->layout.n_layers;
    r.n_kv_heads = kv->layout.n_kv_heads;
    r.head_dim = kv->layout.head_dim;
    r.dtype = (uint32_t)kv->layout.dtype;
    r.page_tokens = kv->P;
    r.n_tokens = c->n_tokens;
    r.n_pages = c->n0;
    if (kv->n_groups == 2) {
        r.window = kv->layout.window;
        r.n_window_pages = c->n0 - c->wfirst;
        r.sliding = kv->sliding;
    }
    r.created = r.last_used = c->created;
    r.tokens = (const uint8_t *)c->tokens;
    r.page_keys = c->keys;
    if ((rc = lms__kv_write_commit(c->w, &r, c->puts, c->params.no_replace)))
        return rc;
    lms__debug("KV save '%s': %u pages (%u new): encode %.1f ms (%d threads), write %.1f ms, fsync %.1f ms, commit %.1f ms",
               c->name, c->n_pages, c->to_write, c->t_enc * 1e3, c->wk.n, c->t_wr * 1e3,
               (t_sync1 - t_sync0) * 1e3, (lms__now() - t_sync1) * 1e3);
    lms__crashpoint("kv-save:after-commit");
    lms__kv_write_end(c->w);
    c->w = NULL;
    return 0;
}

static void save_stats(const save_ctx *c, double t0, lms_kv_io_stats *stats)
{
    stats->tokens = c->n_tokens;
    stats->pages = c->n_pages;
    for (uint32_t i = 0; i < c->n_pages; i++) {
        const lms__kv_page_put *p = &c->puts[i];
        stats->raw_bytes += raw_size(c->kv, item_group(c->n0, i), c->at[i].n_tokens);
        if (p->put == LMS__KV_PUT_SKIP || p->put == LMS__KV_PUT_STORED) {
            stats->pages_reused++;
        } else {
            stats->pages_written++;
            if (p->put == LMS__KV_PUT_NEW)
                stats->stored_bytes += p->rec.stored_size;
        }
    }
    stats->seconds = lms__now() - t0;
}

static void save_free(save_ctx *c)
{
    lms__kv_write_end(c->w); /* not committed: rolls back what was appended */
    workers_free(&c->wk);
    if (c->slot)
        for (uint32_t k = 0; k < c->n_slots; k++)
            lms__free(c->slot[k]);
    lms__free(c->slot);
    lms__free(c->query);
    lms__free(c->pages);
    lms__free(c->at);
    lms__free(c->puts);
    lms__free(c->tokens);
    lms__free(c->keys);
}

int lms_kv_save(lms_kv *kv, const lms_kv_seq *seq, lms_store *store, const char *name)
{
    return lms_kv_save_ex(kv, seq, store, name, NULL, NULL);
}

int lms_kv_save_ex(lms_kv *kv, const lms_kv_seq *seq, lms_store *store, const char *name,
                   const lms_kv_save_params *params, lms_kv_io_stats *stats)
{
    double t0 = lms__now();
    save_ctx c;
    int rc;

    memset(&c, 0, sizeof c);
    if (stats)
        memset(stats, 0, sizeof *stats);
    if (!kv || !seq || !store)
        return lms__err(LMS_EINVAL, "KV save: cache, sequence and store are required");
    if ((rc = lms__name_check(LMS__NAME_SESSION, name)))
        return rc;
    if (seq->committed == 0)
        return lms__err(LMS_EINVAL, "KV save '%s': the sequence has no committed token", name);
    c.kv = kv;
    c.name = name;
    c.params = params ? *params : lms_kv_default_save_params();
    if (c.params.codec > LMS_KV_CODEC_AUTO)
        return lms__err(LMS_EINVAL, "KV save '%s': unknown codec %d", name, (int)c.params.codec);
    if (c.params.level == 0)
        c.params.level = 1;
    c.created = lms__unix_time();

    if (!(rc = save_prepare(&c, seq)) && !(rc = save_lookup(&c, store)) && !(rc = save_buffers(&c)) &&
        !(rc = save_choose_codec(&c)) && !(rc = save_batches(&c)) && !(rc = save_commit(&c)) && stats)
        save_stats(&c, t0, stats);
    save_free(&c);
    return rc;
}

/* ======================================================================================
 * resume
 * ==================================================================================== */

typedef struct res_page {
    uint32_t g;            /* its group */
    uint32_t n_tokens;
    bool via_host;         /* device arena, free target: decoded in a worker's page image, uploaded from there */
    uint8_t *dst;          /* where the decoded page goes (arena page or staging slot; NULL when via_host) */
    lms__kv_page_loc loc;  /* its page record and blob */
    int seg;               /* the reader's mapping of the blob's segment */
    int rc;
    char err[200];         /* the failing worker's detail (thread-local there) */
} res_page;

/* Where a worker's time went (seconds, summed over its pages). */
typedef struct res_times {
    double wait, read, hash, upload;
    uint64_t pages;
    char pad[24]; /* one worker per cache line */
} res_times;

typedef struct res_ctx {
    lms_kv *kv;
    const char *name;
    lms__kv_reader *rd;   /* the index snapshot, then the segments it mapped */
    lms__session_rec r;   /* the session record (the reader's copy) */
    int32_t *tokens;      /* r.n_tokens */
    uint32_t n_pages, to_read, n_staged, n_coded;
    uint32_t n0, wfirst;  /* group-0 pages, first window page (design note 5) */
    res_page *pages;
    /* the plan (kv_arena.c), per page (item) */
    lms_hash128 *keys;
    uint32_t *cached;     /* page already in the prefix cache, or KV_NONE */
    uint32_t *target;     /* arena page it goes to */
    bool *evict;          /* target is a cached page to evict: decoded into staging, copied at commit */
    uint8_t *mark;        /* pages of the larger group: scratch of the plan */
    uint32_t evictable[2]; /* cached pages the plan may evict, per group */
    uint8_t *staging;     /* n_staged host pages (max_page bytes each) */
    size_t max_stored;
    res_times times[KV_IO_MAX_WORKERS]; /* [worker]; pages each uploaded pick its next ring slot */
    kv_workers wk;        /* per worker: buf[RES_UNPACK] a raw partial page, buf[RES_IN] the stored bytes
                           * of one page, buf[RES_IMAGE] a page image (device arenas without a ring) */
} res_ctx;
enum { RES_UNPACK, RES_IN, RES_IMAGE };

/* Read page i's stored bytes and decode them into out (n raw bytes); *h = their checksum. */
static int res_read(res_ctx *c, const res_page *rp, int worker, uint8_t *out, size_t n, uint64_t *h)
{
    /* pread from the page cache rather than faulting the mapping in page
     * by page; a raw page reads straight into its destination. */
    res_times *t = &c->times[worker];
    int rc;
    if (rp->loc.rec.codec == LMS__KV_CODEC_RAW) {
        /* Read and hash in 256 KiB pieces: each is hashed while in cache. */
        rc = lms__kv_hash_begin(&c->wk.codec[worker]);
        for (size_t o = 0; !rc && o < n; o += 256 * 1024) {
            size_t len = LMS_MIN(n - o, (size_t)256 * 1024);
            double t0 = lms__now();
            rc = lms__kv_read_bytes(c->rd, rp->seg, out + o, len, rp->loc.offset + o);
            double t1 = lms__now();
            if (!rc)
                lms__kv_hash_update(&c->wk.codec[worker], out + o, len);
            t->read += t1 - t0;
            t->hash += lms__now() - t1;
        }
        if (!rc)
            *h = lms__kv_hash_end(&c->wk.codec[worker]);
        return rc;
    }
    uint8_t *in = c->wk.buf[RES_IN][worker];
    double t0 = lms__now();
    rc = lms__kv_read_bytes(c->rd, rp->seg, in, rp->loc.size, rp->loc.offset);
    double t1 = lms__now();
    if (!rc)
        rc = lms__kv_decode(&c->wk.codec[worker], rp->loc.rec.codec, in, rp->loc.size, out, n, rp->loc.rec.elem_size, h);
    t->read += t1 - t0;
    t->hash += lms__now() - t1; /* decoding, the checksum fused in */
    return rc;
}

static void res_decode_one(void *arg, size_t i, int worker)
{
    res_ctx *c = arg;
    res_page *rp = &c->pages[i];
    lms_kv *kv = c->kv;
    res_times *t = &c->times[worker];
    if (c->cached[i] != KV_NONE)
        return;
    /* A page bound for a device arena decodes into the worker's next ring
     * slot, once that slot's previous upload is done. */
    const struct lms__kv_io *io = c->wk.io;
    const int slot = (int)(t->pages % KV_IO_SLOTS);
    uint8_t *dst = !rp->via_host ? rp->dst : io ? io_slot(io, worker, slot) : c->wk.buf[RES_IMAGE][worker];
    lms_event *ev = io && rp->via_host ? io->event[worker][slot] : NULL;
    double t0 = lms__now();
    if (ev && kv->dev->ops->event_sync(kv->dev, ev)) {
        rp->rc = LMS_EDEVICE;
        keep_detail(rp->err, sizeof rp->err, rp->rc);
        return;
    }
    t->wait += lms__now() - t0;
    /* Full pages decode straight to their destination; a partial page is
     * packed, so it decodes to scratch and is spread into page layout. */
    const kv_group *G = &kv->g[rp->g];
    bool full = rp->n_tokens == kv->P;
    uint8_t *out = full ? dst : c->wk.buf[RES_UNPACK][worker];
    uint64_t h = 0;
    int rc = res_read(c, rp, worker, out, (size_t)rp->loc.rec.raw_size, &h);
    if (rc) {
        if (rc != LMS_ECORRUPT)
            keep_detail(rp->err, sizeof rp->err, rc);
        rp->rc = rc;
        return;
    }
    /* The checksum of the decoded bytes covers the stored bytes and the codec. */
    if (h != rp->loc.rec.raw_hash) {
        rp->rc = LMS_ECORRUPT;
        return;
    }
    if (!full)
        unpack_page(kv, rp->g, out, rp->n_tokens, dst);
    /* A free target of a device arena takes its bytes now, from this
     * worker (overlapping with the others' decoding, and with this worker's
     * next pages on its own stream): a free page's bytes belong to nobody, so
     * a later failure leaves nothing to undo. */
    if (rp->via_host) {
        t0 = lms__now();
        lms_stream *st = io ? io->stream[worker] : NULL;
        rc = kv->dev->ops->copy_h2d(kv->dev, lms__kv_gpage_ptr(G, c->target[i]), dst, G->page_bytes, st);
        if (!rc && ev)
            rc = kv->dev->ops->event_record(kv->dev, ev, st);
        t->pages++;
        t->upload += lms__now() - t0;
        if (rc) {
            keep_detail(rp->err, sizeof rp->err, rc);
            rp->rc = rc;
        }
    }
}

static bool same_layout_as(const lms_kv *kv, const lms__session_rec *r)
{
    if (r->n_layers != kv->layout.n_layers || r->n_kv_heads != kv->layout.n_kv_heads ||
        r->head_dim != kv->layout.head_dim || r->dtype != (uint32_t)kv->layout.dtype || r->page_tokens != kv->P ||
        r->window != kv->layout.window)
        return false;
    return !r->window || !memcmp(r->sliding, kv->sliding, r->n_layers);
}

static void layout_str(char *buf, size_t n, uint32_t layers, uint32_t heads, uint32_t hd, uint32_t dtype, uint32_t pt,
                       uint32_t window, const uint8_t *sliding)
{
    const char *dn = lms_kv_elem_size((lms_dtype)dtype) ? lms_dtype_name((lms_dtype)dtype) : NULL;
    int o = snprintf(buf, n, "%u layers x %u kv heads x head dim %u, %s, %u tokens/page", layers, heads, hd,
                     dn ? dn : "?", pt);
    if (window && o > 0 && (size_t)o < n) {
        uint32_t k = 0;
        for (uint32_t l = 0; l < layers; l++) k += sliding[l] != 0;
        snprintf(buf + o, n - (size_t)o, ", window %u on %u layers (digest %08x)", window, k,
                 (unsigned)lms__hash64(sliding, layers, 0));
    }
}

/* 1. The record, in one snapshot that stays open while segments are mapped:
 *    model, layout and size checks; the token ids. */
static int res_open(res_ctx *c, lms_store *store)
{
    lms_kv *kv = c->kv;
    const char *name = c->name;
    lms__session_rec *r = &c->r;
    int rc;
    if ((rc = lms__kv_read_begin(store, &c->rd)) || (rc = lms__kv_read_session(c->rd, name, r)))
        return rc;
    if (memcmp(r->model_id, kv->model_id, LMS_MODEL_ID_LEN)) {
        char a[33], b[33];
        lms__hash128_hex(lms__hash128_get(r->model_id), a);
        lms__hash128_hex(lms__hash128_get(kv->model_id), b);
        return lms__err(LMS_EMISMATCH, "KV session '%s' was saved with other model (id %s); this cache is for model %s",
                        name, a, b);
    }
    if (!same_layout_as(kv, r)) {
        char a[200], b[200];
        layout_str(a, sizeof a, r->n_layers, r->n_kv_heads, r->head_dim, r->dtype, r->page_tokens, r->window,
                   r->sliding);
        layout_str(b, sizeof b, kv->layout.n_layers, kv->layout.n_kv_heads, kv->layout.head_dim,
                   (uint32_t)kv->layout.dtype, kv->P, kv->layout.window, kv->sliding);
        return lms__err(LMS_EMISMATCH, "KV session '%s' has other layout (%s) than this cache (%s)", name, a, b);
    }
    if (r->n_tokens > kv->max_seq_tokens)
        return lms__err(LMS_ENOSPACE, "KV resume '%s': %u tokens, more than the %u a sequence may hold", name,
                        r->n_tokens, kv->max_seq_tokens);
    c->n0 = r->n_pages;
    c->wfirst = r->n_pages - r->n_window_pages;
    c->n_pages = r->n_pages + r->n_window_pages;
    if (!(c->pages = lms__calloc(c->n_pages, sizeof *c->pages)) ||
        !(c->tokens = lms__malloc((size_t)r->n_tokens * 4)) || !(c->keys = lms__calloc(c->n_pages, sizeof *c->keys)) ||
        !(c->cached = lms__calloc(c->n_pages, sizeof *c->cached)) ||
        !(c->target = lms__calloc(c->n_pages, sizeof *c->target)) ||
        !(c->evict = lms__calloc(c->n_pages, sizeof *c->evict)))
        return LMS_ENOMEM;
    for (uint32_t i = 0; i < r->n_tokens; i++)
        c->tokens[i] = (int32_t)lms__get_u32(r->tokens + 4 * (size_t)i);
    return 0;
}

/* 2. Keys: recompute from the tokens; they must match the record. Full
 *    pages already in the prefix cache are attached, not read. */
static int res_keys(res_ctx *c)
{
    lms_kv *kv = c->kv;
    lms_hash128 parent = {0, 0};
    for (uint32_t k = 0; k < c->n_pages; k++) {
        res_page *rp = &c->pages[k];
        uint32_t i = item_index(c->n0, c->wfirst, k);
        rp->g = item_group(c->n0, k);
        rp->n_tokens = LMS_MIN(kv->P, c->r.n_tokens - i * kv->P);
        if (rp->g == 0) {
            c->keys[k] = lms__kv_page_key(kv, parent, c->tokens + (size_t)i * kv->P, rp->n_tokens);
            parent = c->keys[k];
        } else {
            c->keys[k] = lms__kv_window_key(c->keys[i]);
        }
        if (!lms__hash128_eq(c->keys[k], lms__hash128_get(lms__session_page_key(&c->r, k))))
            return lms__err(LMS_ECORRUPT, "KV session '%s': %spage %u's key does not match its tokens", c->name,
                            rp->g ? "window " : "", i);
        c->cached[k] = rp->n_tokens == kv->P ? lms__kv_ht_find(&kv->g[rp->g], c->keys[k]) : KV_NONE;
        if (c->cached[k] == KV_NONE)
            c->to_read++;
    }
    return 0;
}

/* Page i's record and blob agree with each other and with the cache's
 * layout; its segment is mapped and holds the blob's range. */
static int res_locate_one(res_ctx *c, uint32_t i)
{
    lms_kv *kv = c->kv;
    const char *name = c->name;
    res_page *rp = &c->pages[i];
    lms__kv_page_loc *loc = &rp->loc;
    int rc = lms__kv_read_page(c->rd, lms__session_page_key(&c->r, i), loc);
    if (rc == LMS_ENOENT)
        return lms__err(LMS_ECORRUPT, "KV session '%s': corrupt page %u: its page record is missing", name, i);
    if (rc)
        return lms__err_prefix(rc, "KV session '%s': page %u: ", name, i);
    if (loc->rec.n_tokens != rp->n_tokens || loc->rec.raw_size != raw_size(kv, rp->g, rp->n_tokens) ||
        loc->rec.elem_size != kv->elem)
        return lms__err(LMS_ECORRUPT, "KV session '%s': corrupt page %u: record sizes do not match the layout", name, i);
    if (!loc->has_blob)
        return lms__err(LMS_ECORRUPT, "KV session '%s': corrupt page %u: its blob record is missing", name, i);
    if (!loc->blob_ok || loc->size > lms__kv_encode_bound(kv->g[rp->g].page_bytes))
        return lms__err(LMS_ECORRUPT, "KV session '%s': corrupt page %u: blob record disagrees with the page record",
                        name, i);
    uint64_t seg_size;
    const char *path;
    if ((rc = lms__kv_read_map(c->rd, loc->segment, &rp->seg, &seg_size, &path))) {
        rc = rc == LMS_ECORRUPT ? LMS_EFORMAT : rc;
        return lms__err_prefix(rc, "KV session '%s': page %u: ", name, i);
    }
    if (loc->size > c->max_stored)
        c->max_stored = (size_t)loc->size;
    c->n_coded += loc->rec.codec != LMS__KV_CODEC_RAW;
    if (loc->offset > seg_size || loc->size > seg_size - loc->offset)
        return lms__err(LMS_EFORMAT,
                        "KV session '%s': page %u: truncated KV segment %s: the page needs bytes [%llu, %llu) but "
                        "the file has %llu",
                        name, i, path, (unsigned long long)loc->offset, (unsigned long long)(loc->offset + loc->size),
                        (unsigned long long)seg_size);
    return 0;
}

/* 3. Page and blob records, segment ranges; then the snapshot ends (the
 *    segments stay mapped and share-locked: gc leaves them alone). */
static int res_locate(res_ctx *c)
{
    c->max_stored = 1;
    for (uint32_t i = 0; i < c->n_pages; i++) {
        int rc;
        if (c->cached[i] == KV_NONE && (rc = res_locate_one(c, i)))
            return rc;
    }
    lms__kv_read_release(c->rd);
    return 0;
}

/* 4. Targets, per group: free pages (top of the stack first), then the
 *    oldest cached pages that this session does not itself reuse; where
 *    each decodes to. */
static int res_plan(res_ctx *c)
{
    lms_kv *kv = c->kv;
    if (!(c->mark = lms__calloc(LMS_MAX(kv->g[0].n_pages, kv->g[1].n_pages), 1)))
        return LMS_ENOMEM;
    for (uint32_t g = 0, k0 = 0; g < kv->n_groups; g++) {
        uint32_t n = g ? c->n_pages - c->n0 : c->n0, to_read = 0;
        for (uint32_t k = k0; k < k0 + n; k++) to_read += c->cached[k] == KV_NONE;
        memset(c->mark, 0, kv->g[g].n_pages);
        if (lms__kv_resume_plan(kv, g, c->cached + k0, n, c->mark, c->target + k0, c->evict + k0, &c->evictable[g]))
            return lms__err(LMS_ENOSPACE, "KV resume '%s': %u %spages to load, %u free and %u evictable cached pages",
                            c->name, to_read, g ? "window " : "", kv->g[g].n_free, c->evictable[g]);
        k0 += n;
    }
    bool direct = host_arena(kv);
    for (uint32_t i = 0; i < c->n_pages; i++)
        if (c->cached[i] == KV_NONE) {
            c->pages[i].via_host = !direct && !c->evict[i];
            c->n_staged += c->evict[i];
        }
    if (c->n_staged && !(c->staging = lms__malloc((size_t)c->n_staged * max_page(kv))))
        return LMS_ENOMEM;
    for (uint32_t i = 0, s = 0; i < c->n_pages; i++) {
        res_page *rp = &c->pages[i];
        if (c->cached[i] != KV_NONE || rp->via_host)
            continue;
        rp->dst = c->evict[i] ? c->staging + (size_t)(s++) * max_page(kv)
                              : lms__kv_gpage_ptr(&kv->g[rp->g], c->target[i]);
    }
    return 0;
}

/* 5. Verify and decode (threads); device arenas: upload, all done on return. */
static int res_decode(res_ctx *c, const lms_kv_resume_params *params)
{
    lms_kv *kv = c->kv;
    lms__kv_resume_times *T = &kv->last_resume;
    double t0 = lms__now();
    const size_t sizes[KV_SCRATCH] = {[RES_UNPACK] = max_page(kv), [RES_IN] = c->n_coded ? c->max_stored : 0,
                                      [RES_IMAGE] = host_arena(kv) || pinned_io(kv) ? 0 : max_page(kv)};
    int rc = workers_create(&c->wk, kv, params ? params->threads : 0, c->to_read, max_page(kv), sizes);
    if (rc)
        return rc;
    double t1 = lms__now();
    lms__pool_run(c->wk.pool, c->n_pages, res_decode_one, c);
    double t2 = lms__now();
    /* every upload complete before any page is used (and before the ring is reused or freed) */
    bool synced = true;
    for (int w = 0; c->wk.io && w < c->wk.n; w++)
        synced = !kv->dev->ops->stream_sync(kv->dev, c->wk.io->stream[w]) && synced;
    double t3 = lms__now();
    T->setup = t1 - t0;
    T->pipeline = t3 - t1;
    T->sync = t3 - t2;
    T->threads = c->wk.n;
    for (int w = 0; w < c->wk.n; w++) {
        T->wait += c->times[w].wait;
        T->read += c->times[w].read;
        T->hash += c->times[w].hash;
        T->upload += c->times[w].upload;
    }
    if (!synced)
        return lms__err(LMS_EDEVICE, "KV session '%s': copying pages to the device failed", c->name);
    for (uint32_t i = 0; i < c->n_pages; i++) {
        const res_page *rp = &c->pages[i];
        if (rp->rc == LMS_ECORRUPT)
            return lms__err(LMS_ECORRUPT,
                            "KV session '%s': corrupt page %u (segment %u, offset %llu): checksum mismatch or undecodable",
                            c->name, i, rp->loc.segment, (unsigned long long)rp->loc.offset);
        if (rp->rc)
            return lms__err(rp->rc, "KV session '%s': page %u: %s", c->name, i, rp->err);
    }
    return 0;
}

/* 6. The only fallible step left: the device copy into evicted cached pages
 *    (non-host arenas). A page whose copy was attempted is dropped from the
 *    prefix index on failure, so a cached page never holds bytes other than
 *    its key says. */
static int res_copy_staged(res_ctx *c)
{
    lms_kv *kv = c->kv;
    for (uint32_t i = 0; i < c->n_pages; i++) {
        if (c->cached[i] != KV_NONE || !c->evict[i])
            continue;
        kv_group *G = &kv->g[c->pages[i].g];
        int rc = kv->dev->ops->copy_h2d(kv->dev, lms__kv_gpage_ptr(G, c->target[i]), c->pages[i].dst, G->page_bytes,
                                        NULL);
        if (rc) {
            lms__err_prefix(rc, "KV resume '%s': page %u to the device: ", c->name, i);
            for (uint32_t j = 0; j <= i; j++)
                if (c->cached[j] == KV_NONE && c->evict[j]) {
                    kv_group *Gj = &kv->g[c->pages[j].g];
                    lms__kv_evict(Gj, c->target[j]);
                    lms__kv_return_free(Gj, c->target[j]);
                }
            return rc;
        }
    }
    return 0;
}

static void res_stats(const res_ctx *c, double t0, lms_kv_io_stats *stats)
{
    stats->tokens = c->r.n_tokens;
    stats->pages = c->n_pages;
    for (uint32_t i = 0; i < c->n_pages; i++) {
        stats->raw_bytes += raw_size(c->kv, c->pages[i].g, c->pages[i].n_tokens);
        if (c->cached[i] != KV_NONE) {
            stats->pages_reused++;
        } else {
            stats->pages_written++;
            stats->stored_bytes += c->pages[i].loc.size;
        }
    }
    stats->seconds = lms__now() - t0;
}

static void res_free(res_ctx *c)
{
    workers_free(&c->wk);
    lms__kv_read_end(c->rd); /* unmaps the segments */
    lms__free(c->pages);
    lms__free(c->tokens);
    lms__free(c->keys);
    lms__free(c->cached);
    lms__free(c->target);
    lms__free(c->evict);
    lms__free(c->staging);
    lms__free(c->mark);
}

int lms_kv_resume(lms_kv *kv, lms_store *store, const char *name, lms_kv_seq **out)
{
    return lms_kv_resume_ex(kv, store, name, NULL, out, NULL);
}

int lms_kv_resume_ex(lms_kv *kv, lms_store *store, const char *name, const lms_kv_resume_params *params,
                     lms_kv_seq **out, lms_kv_io_stats *stats)
{
    double t0 = lms__now(), t_prep, t_decoded;
    res_ctx c;
    int rc;

    memset(&c, 0, sizeof c);
    if (out)
        *out = NULL;
    if (stats)
        memset(stats, 0, sizeof *stats);
    if (!kv || !store || !out)
        return lms__err(LMS_EINVAL, "KV resume: cache, store and output are required");
    if ((rc = lms__name_lookup_check(LMS__NAME_SESSION, name)))
        return rc;
    c.kv = kv;
    c.name = name;
    if (!kv->n_seq_free)
        return lms__err(LMS_ENOSPACE, "KV resume '%s': all %u sequence slots are in use", name, kv->max_seqs);
    lms__kv_resume_times *T = &kv->last_resume;
    memset(T, 0, sizeof *T);

    if ((rc = res_open(&c, store)) || (rc = res_keys(&c)) || (rc = res_locate(&c)) || (rc = res_plan(&c)))
        goto out;
    t_prep = lms__now();
    if ((rc = res_decode(&c, params)) || (rc = res_copy_staged(&c)))
        goto out;
    t_decoded = lms__now();
    /* 7. Build the sequence: cannot fail. */
    lms__kv_attach att[2] = {{0, c.n0, c.cached, c.target, c.evict, c.keys},
                             {c.wfirst, c.n0, c.cached + c.n0, c.target + c.n0, c.evict + c.n0, c.keys + c.n0}};
    *out = lms__kv_seq_attach(kv, att, c.tokens, c.r.n_tokens);

    /* The last-use record is a write transaction (a commit and its syncs,
     * up to tens of milliseconds right after a large save): the store writes
     * it on its own thread, and the sequence is usable at once. */
    double t_built = lms__now();
    lms__kv_touch_later(store, name);
    T->prepare = t_prep - t0;
    T->build = t_built - t_decoded;
    T->touch = lms__now() - t_built;
    lms__debug("KV resume '%s': %u pages (%u read): prepare %.1f ms, set-up %.1f ms, pages %.1f ms (%d threads; "
               "per thread: ring wait %.1f, read %.1f, check %.1f, upload calls %.1f ms; last uploads %.1f ms), "
               "build %.1f ms, last-used record handed over %.2f ms",
               name, c.n_pages, c.to_read, T->prepare * 1e3, T->setup * 1e3, T->pipeline * 1e3, T->threads,
               T->wait * 1e3 / LMS_MAX(1, T->threads), T->read * 1e3 / LMS_MAX(1, T->threads),
               T->hash * 1e3 / LMS_MAX(1, T->threads), T->upload * 1e3 / LMS_MAX(1, T->threads), T->sync * 1e3,
               T->build * 1e3, T->touch * 1e3);
    if (stats)
        res_stats(&c, t0, stats);
    rc = 0;
out:
    res_free(&c);
    return rc;
}
