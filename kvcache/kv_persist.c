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
 * Design notes:
 *  (1) save: pages the store lacks are encoded (thread pool), appended and
 *      fsync'd through the store's appender (holding its append lock, so gc
 *      cannot delete a page record we decided to reuse), then the blob,
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
 *      pages are taken from the free stack / LRU and the sequence built,
 *      steps that cannot fail. The one exception: a failed device copy into
 *      an evicted page drops the pages so written from the prefix cache (a
 *      device error), so a cached page never holds other bytes than its key.
 *  (3) Pages of the session already in the prefix cache (same key) are
 *      attached instead of read.
 *  (4) A page's raw form is its K/V bytes in arena order for its valid
 *      tokens: [layer][K,V][head][n_tokens][head_dim]; for a full page that
 *      is exactly the arena page (one contiguous run).
 */
#include <assert.h>
#include <stdio.h>
#include <string.h>

#include "common/crashpoint.h"
#include "kvcache/kv_codec.h"
#include "kvcache/kv_internal.h"
#include "store/kv_records.h"
#include "store/names.h"
#include "store/store_internal.h"

lms_kv_save_params lms_kv_default_save_params(void)
{
    lms_kv_save_params p;
    memset(&p, 0, sizeof p);
    p.codec = LMS_KV_CODEC_SHUFFLE_ZSTD;
    return p;
}

lms_kv_resume_params lms_kv_default_resume_params(void)
{
    lms_kv_resume_params p;
    memset(&p, 0, sizeof p);
    return p;
}

/* Raw bytes of a page with n valid tokens: n * (page_bytes / P). */
static size_t raw_size(const lms_kv *kv, uint32_t n) { return (size_t)n * (kv->page_bytes / kv->P); }

/* Copy the valid-token rows of arena page image `page` (host) into dst (packed). */
static void pack_page(const lms_kv *kv, const uint8_t *page, uint32_t n, uint8_t *dst)
{
    size_t rows = (size_t)kv->layout.n_layers * 2 * kv->layout.n_kv_heads, run = n * kv->token_bytes;
    for (size_t r = 0; r < rows; r++, dst += run)
        memcpy(dst, page + r * kv->head_bytes, run);
}

static void unpack_page(const lms_kv *kv, const uint8_t *src, uint32_t n, uint8_t *page)
{
    size_t rows = (size_t)kv->layout.n_layers * 2 * kv->layout.n_kv_heads, run = n * kv->token_bytes;
    for (size_t r = 0; r < rows; r++, src += run)
        memcpy(page + r * kv->head_bytes, src, run);
}

static bool host_arena(const lms_kv *kv) { return kv->dev->kind == LMS_DEVICE_CPU; }

/* ======================================================================================
 * save
 * ==================================================================================== */

typedef struct save_page {
    lms_hash128 key;
    uint32_t page;      /* arena page */
    uint32_t n_tokens;
    bool stored;        /* the store already has this key */
    bool dup;           /* same key as an earlier page of this save */
    bool blob_exists;   /* identical stored bytes already a blob */
    lms__kvpage_rec rec;
    const uint8_t *data; /* encoded bytes (stored_size): a batch slot or the arena page; valid during its batch */
    uint32_t segment;
    uint64_t offset;
    int rc;
    char err[200]; /* the failing worker's detail */
} save_page;

typedef struct save_ctx {
    lms_kv *kv;
    lms_store *store;
    const char *name;
    lms_kv_save_params params;
    save_page *pages;
    uint32_t n_pages, n_tokens;
    int32_t *tokens;
    uint8_t *keys;  /* n_pages x 16 */
    lms__kv_codec_ctx *codec; /* per worker */
    uint8_t **rawbuf;         /* per worker: 2 x page_bytes (packed page, device page image) */
    uint8_t **slot;           /* per batch slot: encode bound of a page */
    uint32_t batch0;          /* first page of the batch being encoded / written */
    lms__appender *app;
    uint64_t created;
    int rc;
} save_ctx;

/* Keep a worker's error detail with its page: lms_last_error() is per thread. */
static void keep_detail(char *dst, size_t n, int rc)
{
    const char *d = lms_last_error();
    snprintf(dst, n, "%s", d && *d ? d : lms_strerror(rc));
}

static void save_encode_one(void *arg, size_t bi, int worker)
{
    save_ctx *c = arg;
    save_page *sp = &c->pages[c->batch0 + bi];
    lms_kv *kv = c->kv;
    if (sp->stored || sp->dup)
        return;
    size_t n = raw_size(kv, sp->n_tokens);
    const uint8_t *raw;
    uint8_t *buf = c->rawbuf[worker];
    int rc = 0;
    if (host_arena(kv)) {
        const uint8_t *pg = lms__kv_page_ptr(kv, sp->page);
        if (sp->n_tokens == kv->P) {
            raw = pg;
        } else {
            pack_page(kv, pg, sp->n_tokens, buf);
            raw = buf;
        }
    } else {
        /* the staging half of rawbuf holds the device page image */
        uint8_t *img = buf + kv->page_bytes;
        rc = kv->dev->ops->copy_d2h(kv->dev, img, lms__kv_page_ptr(kv, sp->page), kv->page_bytes, NULL);
        if (rc) {
            keep_detail(sp->err, sizeof sp->err, rc);
            sp->rc = rc;
            return;
        }
        pack_page(kv, img, sp->n_tokens, buf);
        raw = buf;
    }
    size_t cap = lms__kv_encode_bound(n), len = n;
    uint8_t *out = c->slot[bi];
    if (c->params.codec == LMS_KV_CODEC_RAW) {
        /* A full host page is written straight from the arena; a packed or
         * device-copied page lives in this worker's buffer, which its next
         * page reuses, so it moves to the page's batch slot. */
        if (raw != lms__kv_page_ptr(kv, sp->page)) {
            memcpy(out, raw, n);
            raw = out;
        }
        sp->data = raw;
        sp->rec.codec = LMS__KV_CODEC_RAW;
    } else {
        rc = lms__kv_encode(&c->codec[worker], c->params.codec, c->params.level, raw, n, kv->elem, out, cap, &len);
        if (rc) {
            keep_detail(sp->err, sizeof sp->err, rc);
            sp->rc = rc;
            return;
        }
        /* Keep raw when a codec does not pay for itself. */
        if (len >= n) {
            memcpy(out, raw, n);
            len = n;
            sp->rec.codec = LMS__KV_CODEC_RAW;
        } else {
            sp->rec.codec = (uint16_t)c->params.codec;
        }
        sp->data = out;
    }
    sp->rec.elem_size = (uint16_t)kv->elem;
    sp->rec.n_tokens = sp->n_tokens;
    sp->rec.raw_size = n;
    sp->rec.raw_hash = lms__hash64(raw, n, 0);
    sp->rec.stored_size = len;
    lms__hash128_put(sp->rec.blob, lms__hash128(sp->data, len));
}

static void save_write_one(void *arg, size_t bi, int worker)
{
    save_ctx *c = arg;
    save_page *sp = &c->pages[c->batch0 + bi];
    (void)worker;
    if (sp->stored || sp->dup || sp->blob_exists)
        return;
    sp->rc = lms__append_write(c->app, sp->segment, sp->offset, sp->data, sp->rec.stored_size);
    if (sp->rc)
        keep_detail(sp->err, sizeof sp->err, sp->rc);
}

/* Does the stored blob `b` hold exactly `data`? (dedup by hash AND bytes) */
static int blob_same_bytes(lms_store *s, const lms__blob_rec *b, const uint8_t *data, size_t len, bool *same)
{
    *same = false;
    if (b->kind != LMS__BLOB_KVPAGE || b->size != len)
        return 0;
    lms__segmap m;
    int rc = lms__segment_map(s, b->segment, &m);
    if (rc)
        return rc;
    if (b->offset <= m.size && len <= m.size - b->offset)
        *same = memcmp(m.base + b->offset, data, len) == 0;
    lms__segment_unmap(&m);
    return 0;
}

/* Does the page this save wrote at (segment, offset) hold exactly `data`? */
static int written_same_bytes(lms__appender *a, const save_page *o, const uint8_t *data, size_t len, bool *same)
{
    int fd, rc;
    const char *path;
    *same = false;
    if (o->rec.stored_size != len)
        return 0;
    if ((rc = lms__append_fd(a, o->segment, &fd, &path)))
        return rc;
    uint8_t *buf = lms__malloc(len);
    if (!buf)
        return LMS_ENOMEM;
    rc = lms__pread_all(fd, buf, len, o->offset, path);
    if (!rc)
        *same = memcmp(buf, data, len) == 0;
    lms__free(buf);
    return rc;
}

static int save_txn(lms_store *s, MDB_txn *txn, void *arg)
{
    save_ctx *c = arg;
    MDB_val v;
    int rc;
    /* the session */
    rc = lms__db_get(s, txn, LMS__DB_SESSIONS, c->name, strlen(c->name), &v);
    if (rc == 0 && c->params.no_replace)
        return lms__err(LMS_EEXIST, "KV session '%s' already exists", c->name);
    if (rc && rc != LMS_ENOENT)
        return rc;
    for (uint32_t i = 0; i < c->n_pages; i++) {
        save_page *sp = &c->pages[i];
        uint8_t key[16];
        lms__hash128_put(key, sp->key);
        if (sp->dup)
            continue;
        rc = lms__db_get(s, txn, LMS__DB_KVPAGES, key, 16, &v);
        if (sp->stored) {
            if (rc == LMS_ENOENT)
                return lms__err(LMS_EBUSY, "KV save '%s': page %u's record vanished during the save", c->name, i);
            if (rc)
                return rc;
            continue;
        }
        if (rc == 0)
            continue; /* appeared meanwhile: our bytes become garbage for gc */
        if (rc != LMS_ENOENT)
            return rc;
        if (sp->blob_exists) {
            rc = lms__blob_ref(s, txn, sp->rec.blob, 1, NULL);
        } else {
            lms__blob_rec b = {.kind = LMS__BLOB_KVPAGE, .segment = sp->segment, .offset = sp->offset,
                               .size = sp->rec.stored_size, .refs = 1};
            rc = lms__blob_put(s, txn, sp->rec.blob, &b);
        }
        if (rc)
            return rc;
        uint8_t rec[LMS__KVPAGE_REC_SIZE];
        lms__kvpage_rec_encode(&sp->rec, rec);
        if ((rc = lms__db_put(s, txn, LMS__DB_KVPAGES, key, 16, rec, sizeof rec, 0)))
            return rc;
    }
    lms__session_rec r;
    memset(&r, 0, sizeof r);
    memcpy(r.model_id, c->kv->model_id, LMS_MODEL_ID_LEN);
    r.n_layers = c->kv->layout.n_layers;
    r.n_kv_heads = c->kv->layout.n_kv_heads;
    r.head_dim = c->kv->layout.head_dim;
    r.dtype = (uint32_t)c->kv->layout.dtype;
    r.page_tokens = c->kv->P;
    r.n_tokens = c->n_tokens;
    r.n_pages = c->n_pages;
    r.created = r.last_used = c->created;
    r.tokens = (const uint8_t *)c->tokens;
    r.page_keys = c->keys;
    size_t len = lms__session_rec_size(r.n_tokens, r.n_pages);
    MDB_val k = {strlen(c->name), (void *)c->name}, val = {len, NULL};
    int mrc = mdb_put(txn, s->dbi[LMS__DB_SESSIONS], &k, &val, MDB_RESERVE);
    if (mrc)
        return lms__mdb_err(mrc, "%s: write session '%s'", s->index_path, c->name);
    lms__session_rec_encode(&r, val.mv_data);
    return 0;
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
    lms_pool *pool = NULL;
    int rc, threads = 0;
    uint32_t n_slots = 0;
    MDB_txn *txn = NULL;

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
    c.store = store;
    c.name = name;
    c.params = params ? *params : lms_kv_default_save_params();
    if (c.params.codec > LMS_KV_CODEC_SHUFFLE_ZSTD)
        return lms__err(LMS_EINVAL, "KV save '%s': unknown codec %d", name, (int)c.params.codec);
    if (c.params.level == 0)
        c.params.level = 1;
    c.n_tokens = seq->committed;
    c.n_pages = (c.n_tokens + kv->P - 1) / kv->P;
    c.created = lms__unix_time();

    rc = LMS_ENOMEM;
    if (!(c.pages = lms__calloc(c.n_pages, sizeof *c.pages)) ||
        !(c.tokens = lms__malloc((size_t)c.n_tokens * 4)) || !(c.keys = lms__malloc((size_t)c.n_pages * 16)))
        goto out;
    /* tokens as little-endian int32 (the record's form) */
    for (uint32_t pos = 0; pos < c.n_tokens; pos++) {
        int32_t t = kv->tokens[(size_t)seq->table[pos / kv->P] * kv->P + pos % kv->P];
        lms__put_u32((uint8_t *)&c.tokens[pos], (uint32_t)t);
    }
    lms_hash128 parent = {0, 0};
    for (uint32_t i = 0; i < c.n_pages; i++) {
        save_page *sp = &c.pages[i];
        sp->page = seq->table[i];
        sp->n_tokens = LMS_MIN(kv->P, c.n_tokens - i * kv->P);
        if (sp->n_tokens == kv->P) {
            assert(kv->flags[sp->page] & KV_KEYED);
            sp->key = kv->keys[sp->page];
        } else {
            sp->key = lms__kv_page_key(kv, parent, kv->tokens + (size_t)sp->page * kv->P, sp->n_tokens);
        }
        parent = sp->key;
        lms__hash128_put(c.keys + 16 * (size_t)i, sp->key);
        for (uint32_t j = 0; j < i && !sp->dup; j++)
            sp->dup = lms__hash128_eq(c.pages[j].key, sp->key);
    }

    /* The append lock first: from here on no gc deletes what we see. */
    if ((rc = lms__append_begin(store, &c.app)))
        goto out;
    if ((rc = lms__txn_read(store, &txn)))
        goto out;
    uint32_t to_write = 0;
    for (uint32_t i = 0; i < c.n_pages; i++) {
        save_page *sp = &c.pages[i];
        MDB_val v;
        uint8_t key[16];
        if (sp->dup)
            continue;
        lms__hash128_put(key, sp->key);
        rc = lms__db_get(store, txn, LMS__DB_KVPAGES, key, 16, &v);
        if (rc == 0)
            sp->stored = true;
        else if (rc != LMS_ENOENT)
            goto out;
        else
            to_write++;
    }
    lms__txn_end(store, txn);
    txn = NULL;

    threads = c.params.threads > 0 ? c.params.threads : lms__cpu_count();
    if (threads > (int)to_write)
        threads = to_write ? (int)to_write : 1;
    if ((rc = lms__pool_create(threads, &pool)))
        goto out;
    threads = lms__pool_threads(pool);
    /* Pages go in batches through encode (threads) -> dedup and reserve
     * (this thread) -> write (threads), reusing one set of buffers: memory
     * stays bounded and warm whatever the session's size. */
    n_slots = (uint32_t)(4 * threads);
    rc = LMS_ENOMEM;
    if (!(c.codec = lms__calloc((size_t)threads, sizeof *c.codec)) ||
        !(c.rawbuf = lms__calloc((size_t)threads, sizeof *c.rawbuf)) ||
        !(c.slot = lms__calloc(n_slots, sizeof *c.slot)))
        goto out;
    for (int w = 0; w < threads; w++)
        if (!(c.rawbuf[w] = lms__malloc(2 * kv->page_bytes)) || !(c.codec[w].scratch = lms__malloc(kv->page_bytes)))
            goto out;
    for (uint32_t k = 0; k < n_slots; k++)
        if (!(c.slot[k] = lms__malloc(lms__kv_encode_bound(kv->page_bytes))))
            goto out;
    double t_enc = 0, t_wr = 0;
    for (c.batch0 = 0; c.batch0 < c.n_pages; c.batch0 += n_slots) {
        uint32_t bn = LMS_MIN(n_slots, c.n_pages - c.batch0);
        double t1 = lms__now();
        lms__pool_run(pool, bn, save_encode_one, &c);
        t_enc += lms__now() - t1;
        for (uint32_t i = c.batch0; i < c.batch0 + bn; i++)
            if ((rc = c.pages[i].rc)) {
                lms__err(rc, "KV save '%s': page %u: %s", name, i, c.pages[i].err);
                goto out;
            }
        /* Identical stored bytes already a blob (pages of zeros, say), in the
         * store or earlier in this save: reference that blob instead. */
        if ((rc = lms__txn_read(store, &txn)))
            goto out;
        for (uint32_t i = c.batch0; i < c.batch0 + bn; i++) {
            save_page *sp = &c.pages[i];
            if (sp->stored || sp->dup)
                continue;
            lms__blob_rec b;
            rc = lms__blob_get(store, txn, sp->rec.blob, &b);
            if (rc == 0) {
                bool same;
                if ((rc = blob_same_bytes(store, &b, sp->data, sp->rec.stored_size, &same)))
                    goto out;
                if (!same) {
                    rc = lms__err(LMS_EEXIST,
                                  "KV save '%s': page %u's bytes collide with a different blob of the same hash", name, i);
                    goto out;
                }
                sp->blob_exists = true;
            } else if (rc != LMS_ENOENT) {
                goto out;
            }
            for (uint32_t j = 0; j < i && !sp->blob_exists; j++) {
                save_page *o = &c.pages[j];
                if (o->stored || o->dup || o->blob_exists || memcmp(o->rec.blob, sp->rec.blob, 16))
                    continue;
                bool same;
                if (j >= c.batch0) {
                    same = o->rec.stored_size == sp->rec.stored_size && !memcmp(o->data, sp->data, sp->rec.stored_size);
                } else if ((rc = written_same_bytes(c.app, o, sp->data, sp->rec.stored_size, &same))) {
                    goto out;
                }
                if (same)
                    sp->blob_exists = true; /* o's blob record is put first, in the same transaction */
            }
        }
        lms__txn_end(store, txn);
        txn = NULL;
        for (uint32_t i = c.batch0; i < c.batch0 + bn; i++) {
            save_page *sp = &c.pages[i];
            if (sp->stored || sp->dup || sp->blob_exists)
                continue;
            if ((rc = lms__append_reserve(c.app, sp->rec.stored_size, &sp->segment, &sp->offset)))
                goto out;
        }
        if (c.batch0 == 0)
            lms__crashpoint("kv-save:before-write");
        t1 = lms__now();
        lms__pool_run(pool, bn, save_write_one, &c);
        t_wr += lms__now() - t1;
        for (uint32_t i = c.batch0; i < c.batch0 + bn; i++)
            if ((rc = c.pages[i].rc)) {
                lms__err(rc, "KV save '%s': page %u: %s", name, i, c.pages[i].err);
                goto out;
            }
    }
    lms__crashpoint("kv-save:before-sync");
    double t_sync0 = lms__now();
    (void)t_sync0;
    if ((rc = lms__append_sync(c.app)))
        goto out;
    double t_sync1 = lms__now();
    lms__crashpoint("kv-save:before-commit");
    if ((rc = lms__txn_write(store, save_txn, &c)))
        goto out;
    lms__debug("KV save '%s': %u pages (%u new): encode %.1f ms (%d threads), write %.1f ms, fsync %.1f ms, commit %.1f ms",
               name, c.n_pages, to_write, t_enc * 1e3, threads, t_wr * 1e3, (t_sync1 - t_sync0) * 1e3,
               (lms__now() - t_sync1) * 1e3);
    lms__crashpoint("kv-save:after-commit");
    lms__append_end(c.app, true);
    c.app = NULL;

    if (stats) {
        stats->tokens = c.n_tokens;
        stats->pages = c.n_pages;
        for (uint32_t i = 0; i < c.n_pages; i++) {
            save_page *sp = &c.pages[i];
            stats->raw_bytes += raw_size(kv, sp->n_tokens);
            if (sp->stored || sp->dup) {
                stats->pages_reused++;
            } else {
                stats->pages_written++;
                if (!sp->blob_exists)
                    stats->stored_bytes += sp->rec.stored_size;
            }
        }
        stats->seconds = lms__now() - t0;
    }
    rc = 0;
out:
    if (txn)
        lms__txn_end(store, txn);
    if (c.app)
        lms__append_end(c.app, false);
    lms__pool_destroy(pool);
    for (int w = 0; w < threads; w++) {
        if (c.codec)
            lms__kv_codec_ctx_free(&c.codec[w]);
        if (c.rawbuf)
            lms__free(c.rawbuf[w]);
    }
    lms__free(c.codec);
    lms__free(c.rawbuf);
    if (c.slot)
        for (uint32_t k = 0; k < n_slots; k++)
            lms__free(c.slot[k]);
    lms__free(c.slot);
    lms__free(c.pages);
    lms__free(c.tokens);
    lms__free(c.keys);
    return rc;
}

/* ======================================================================================
 * resume
 * ==================================================================================== */

typedef struct res_page {
    lms_hash128 key;
    uint32_t n_tokens;
    uint32_t cached;       /* page already in the prefix cache, or KV_NONE */
    uint32_t target;       /* arena page it goes to */
    bool staged;           /* target is a cached page to evict: decoded into staging, copied at commit */
    bool via_host;         /* device arena, free target: decoded in the worker's page image, copied there */
    uint8_t *dst;          /* where the decoded page goes (arena page or staging slot; NULL when via_host) */
    lms__kvpage_rec rec;
    lms__blob_rec blob;
    int seg;               /* index into maps */
    int rc;
    char err[200];         /* the failing worker's detail (thread-local there) */
} res_page;

typedef struct res_ctx {
    lms_kv *kv;
    const char *name;
    res_page *pages;
    uint32_t n_pages;
    lms__segmap *maps;
    int n_maps;
    lms__kv_codec_ctx *codec;
    uint8_t **unpack; /* per worker: raw page for partial pages */
    uint8_t **inbuf;  /* per worker: stored bytes of one page */
    uint8_t **image;  /* per worker: a page image for device arenas */
} res_ctx;

static void res_decode_one(void *arg, size_t i, int worker)
{
    res_ctx *c = arg;
    res_page *rp = &c->pages[i];
    lms_kv *kv = c->kv;
    if (rp->cached != KV_NONE)
        return;
    const lms__segmap *m = &c->maps[rp->seg];
    size_t n = (size_t)rp->rec.raw_size;
    uint8_t *dst = rp->via_host ? c->image[worker] : rp->dst;
    /* Full pages decode straight to their destination; a partial page is
     * packed, so it decodes to scratch and is spread into page layout. */
    bool full = rp->n_tokens == kv->P;
    uint8_t *out = full ? dst : c->unpack[worker];
    int rc;
    /* pread from the page cache rather than faulting the mapping in page
     * by page; a raw page reads straight into its destination. */
    uint64_t h = 0;
    if (rp->rec.codec == LMS__KV_CODEC_RAW) {
        /* Read and hash in 256 KiB pieces: each is hashed while in cache. */
        rc = lms__kv_hash_begin(&c->codec[worker]);
        for (size_t o = 0; !rc && o < n; o += 256 * 1024) {
            size_t len = LMS_MIN(n - o, (size_t)256 * 1024);
            rc = lms__pread_all(m->fd, out + o, len, rp->blob.offset + o, m->path);
            if (!rc)
                lms__kv_hash_update(&c->codec[worker], out + o, len);
        }
        if (!rc)
            h = lms__kv_hash_end(&c->codec[worker]);
    } else {
        uint8_t *in = c->inbuf[worker];
        rc = lms__pread_all(m->fd, in, rp->blob.size, rp->blob.offset, m->path);
        if (!rc)
            rc = lms__kv_decode(&c->codec[worker], rp->rec.codec, in, rp->blob.size, out, n, rp->rec.elem_size, &h);
    }
    if (rc) {
        if (rc != LMS_ECORRUPT)
            keep_detail(rp->err, sizeof rp->err, rc);
        rp->rc = rc;
        return;
    }
    /* The checksum of the decoded bytes covers the stored bytes and the codec. */
    if (h != rp->rec.raw_hash) {
        rp->rc = LMS_ECORRUPT;
        return;
    }
    if (!full)
        unpack_page(kv, out, rp->n_tokens, dst);
    /* A free target of a device arena takes its bytes now, from this
     * worker (overlapping with the others' decoding): a free page's bytes
     * belong to nobody, so a later failure leaves nothing to undo. */
    if (rp->via_host) {
        rc = kv->dev->ops->copy_h2d(kv->dev, lms__kv_page_ptr(kv, rp->target), dst, kv->page_bytes, NULL);
        if (rc) {
            keep_detail(rp->err, sizeof rp->err, rc);
            rp->rc = rc;
        }
    }
}

static bool same_layout_as(const lms_kv *kv, const lms__session_rec *r)
{
    return r->n_layers == kv->layout.n_layers && r->n_kv_heads == kv->layout.n_kv_heads &&
           r->head_dim == kv->layout.head_dim && r->dtype == (uint32_t)kv->layout.dtype && r->page_tokens == kv->P;
}

static int touch_txn(lms_store *s, MDB_txn *txn, void *arg)
{
    const char *name = arg;
    MDB_val v;
    int rc = lms__db_get(s, txn, LMS__DB_SESSIONS, name, strlen(name), &v);
    if (rc)
        return rc;
    lms__session_rec r;
    if (lms__session_rec_decode(v.mv_data, v.mv_size, name, &r))
        return 0;
    MDB_val k = {strlen(name), (void *)name}, nv = {v.mv_size, NULL};
    size_t len = v.mv_size;
    uint8_t *copy = lms__malloc(len);
    if (!copy)
        return LMS_ENOMEM;
    memcpy(copy, v.mv_data, len);
    int mrc = mdb_put(txn, s->dbi[LMS__DB_SESSIONS], &k, &nv, MDB_RESERVE);
    if (mrc) {
        lms__free(copy);
        return lms__mdb_err(mrc, "write session '%s'", name);
    }
    memcpy(nv.mv_data, copy, len);
    lms__free(copy);
    lms__session_rec_touch(nv.mv_data, len, lms__unix_time());
    return 0;
}

static void layout_str(char *buf, size_t n, uint32_t layers, uint32_t heads, uint32_t hd, uint32_t dtype, uint32_t pt)
{
    const char *dn = lms_kv_elem_size((lms_dtype)dtype) ? lms_dtype_name((lms_dtype)dtype) : NULL;
    snprintf(buf, n, "%u layers x %u kv heads x head dim %u, %s, %u tokens/page", layers, heads, hd,
             dn ? dn : "?", pt);
}

int lms_kv_resume(lms_kv *kv, lms_store *store, const char *name, lms_kv_seq **out)
{
    return lms_kv_resume_ex(kv, store, name, NULL, out, NULL);
}

int lms_kv_resume_ex(lms_kv *kv, lms_store *store, const char *name, const lms_kv_resume_params *params,
                     lms_kv_seq **out, lms_kv_io_stats *stats)
{
    double t0 = lms__now();
    res_ctx c;
    MDB_txn *txn = NULL;
    lms_pool *pool = NULL;
    uint8_t *staging = NULL, *mark = NULL;
    int32_t *tokens = NULL;
    int rc, threads = 0;
    lms__session_rec r;
    uint8_t *rec_copy = NULL;

    memset(&c, 0, sizeof c);
    if (out)
        *out = NULL;
    if (stats)
        memset(stats, 0, sizeof *stats);
    if (!kv || !store || !out)
        return lms__err(LMS_EINVAL, "KV resume: cache, store and output are required");
    if ((rc = lms__name_check(LMS__NAME_SESSION, name)))
        return rc;
    c.kv = kv;
    c.name = name;
    if (!kv->n_seq_free)
        return lms__err(LMS_ENOSPACE, "KV resume '%s': all %u sequence slots are in use", name, kv->max_seqs);

    /* ---- 1. the record, in one snapshot that stays open while segments are mapped */
    if ((rc = lms__txn_read(store, &txn)))
        goto out;
    MDB_val v;
    rc = lms__db_get(store, txn, LMS__DB_SESSIONS, name, strlen(name), &v);
    if (rc == LMS_ENOENT) {
        rc = lms__err(LMS_ENOENT, "KV session '%s' not found in %s", name, lms_store_path(store));
        goto out;
    }
    if (rc)
        goto out;
    rc = LMS_ENOMEM;
    if (!(rec_copy = lms__malloc(v.mv_size)))
        goto out;
    memcpy(rec_copy, v.mv_data, v.mv_size);
    if ((rc = lms__session_rec_decode(rec_copy, v.mv_size, name, &r)))
        goto out;
    if (memcmp(r.model_id, kv->model_id, LMS_MODEL_ID_LEN)) {
        char a[33], b[33];
        lms__hash128_hex(lms__hash128_get(r.model_id), a);
        lms__hash128_hex(lms__hash128_get(kv->model_id), b);
        rc = lms__err(LMS_EMISMATCH, "KV session '%s' was saved with other model (id %s); this cache is for model %s",
                      name, a, b);
        goto out;
    }
    if (!same_layout_as(kv, &r)) {
        char a[160], b[160];
        layout_str(a, sizeof a, r.n_layers, r.n_kv_heads, r.head_dim, r.dtype, r.page_tokens);
        layout_str(b, sizeof b, kv->layout.n_layers, kv->layout.n_kv_heads, kv->layout.head_dim,
                   (uint32_t)kv->layout.dtype, kv->P);
        rc = lms__err(LMS_EMISMATCH, "KV session '%s' has other layout (%s) than this cache (%s)", name, a, b);
        goto out;
    }
    if (r.n_tokens > kv->max_seq_tokens) {
        rc = lms__err(LMS_ENOSPACE, "KV resume '%s': %u tokens, more than the %u a sequence may hold", name,
                      r.n_tokens, kv->max_seq_tokens);
        goto out;
    }
    c.n_pages = r.n_pages;
    rc = LMS_ENOMEM;
    if (!(c.pages = lms__calloc(c.n_pages, sizeof *c.pages)) || !(tokens = lms__malloc((size_t)r.n_tokens * 4)) ||
        !(c.maps = lms__calloc(c.n_pages, sizeof *c.maps)))
        goto out;
    for (uint32_t i = 0; i < r.n_tokens; i++)
        tokens[i] = (int32_t)lms__get_u32(r.tokens + 4 * (size_t)i);

    /* ---- 2. keys: recompute from the tokens; they must match the record */
    lms_hash128 parent = {0, 0};
    uint32_t to_read = 0;
    for (uint32_t i = 0; i < c.n_pages; i++) {
        res_page *rp = &c.pages[i];
        rp->n_tokens = LMS_MIN(kv->P, r.n_tokens - i * kv->P);
        rp->key = lms__kv_page_key(kv, parent, tokens + (size_t)i * kv->P, rp->n_tokens);
        if (!lms__hash128_eq(rp->key, lms__hash128_get(lms__session_page_key(&r, i)))) {
            rc = lms__err(LMS_ECORRUPT, "KV session '%s': page %u's key does not match its tokens", name, i);
            goto out;
        }
        parent = rp->key;
        rp->cached = rp->n_tokens == kv->P ? lms__kv_ht_find(kv, rp->key) : KV_NONE;
        if (rp->cached == KV_NONE)
            to_read++;
    }

    /* ---- 3. page and blob records, segment ranges */
    size_t max_stored = 1;
    for (uint32_t i = 0; i < c.n_pages; i++) {
        res_page *rp = &c.pages[i];
        if (rp->cached != KV_NONE)
            continue;
        uint8_t key[16];
        lms__hash128_put(key, rp->key);
        rc = lms__db_get(store, txn, LMS__DB_KVPAGES, key, 16, &v);
        if (rc == LMS_ENOENT) {
            rc = lms__err(LMS_ECORRUPT, "KV session '%s': corrupt page %u: its page record is missing", name, i);
            goto out;
        }
        if (rc)
            goto out;
        if ((rc = lms__kvpage_rec_decode(v.mv_data, v.mv_size, &rp->rec))) {
            lms__err_prefix(rc, "KV session '%s': page %u: ", name, i);
            goto out;
        }
        if (rp->rec.n_tokens != rp->n_tokens || rp->rec.raw_size != raw_size(kv, rp->n_tokens) ||
            rp->rec.elem_size != kv->elem) {
            rc = lms__err(LMS_ECORRUPT, "KV session '%s': corrupt page %u: record sizes do not match the layout", name, i);
            goto out;
        }
        rc = lms__blob_get(store, txn, rp->rec.blob, &rp->blob);
        if (rc == LMS_ENOENT) {
            rc = lms__err(LMS_ECORRUPT, "KV session '%s': corrupt page %u: its blob record is missing", name, i);
            goto out;
        }
        if (rc) {
            lms__err_prefix(rc, "KV session '%s': page %u: ", name, i);
            goto out;
        }
        if (rp->blob.kind != LMS__BLOB_KVPAGE || rp->blob.size != rp->rec.stored_size ||
            rp->blob.size > lms__kv_encode_bound(kv->page_bytes)) {
            rc = lms__err(LMS_ECORRUPT, "KV session '%s': corrupt page %u: blob record disagrees with the page record",
                          name, i);
            goto out;
        }
        int m;
        for (m = 0; m < c.n_maps && c.maps[m].id != rp->blob.segment; m++)
            ;
        if (m == c.n_maps) {
            if ((rc = lms__segment_map(store, rp->blob.segment, &c.maps[m]))) {
                lms__err_prefix(rc == LMS_ECORRUPT ? LMS_EFORMAT : rc, "KV session '%s': page %u: ", name, i);
                rc = rc == LMS_ECORRUPT ? LMS_EFORMAT : rc;
                goto out;
            }
            c.n_maps++;
        }
        rp->seg = m;
        if (rp->blob.size > max_stored)
            max_stored = (size_t)rp->blob.size;
        if (rp->blob.offset > c.maps[m].size || rp->blob.size > c.maps[m].size - rp->blob.offset) {
            rc = lms__err(LMS_EFORMAT,
                          "KV session '%s': page %u: truncated KV segment %s: the page needs bytes [%llu, %llu) but "
                          "the file has %llu",
                          name, i, c.maps[m].path, (unsigned long long)rp->blob.offset,
                          (unsigned long long)(rp->blob.offset + rp->blob.size), (unsigned long long)c.maps[m].size);
            goto out;
        }
    }
    lms__txn_end(store, txn); /* segments stay mapped and share-locked: gc leaves them alone */
    txn = NULL;

    /* ---- 4. choose targets: free pages (top of the stack first), then the
     *         oldest cached pages that this session does not itself reuse */
    uint32_t reuse_from_lru = 0;
    rc = LMS_ENOMEM;
    if (!(mark = lms__calloc(kv->n_pages, 1)))
        goto out;
    for (uint32_t i = 0; i < c.n_pages; i++)
        if (c.pages[i].cached != KV_NONE) {
            uint32_t p = c.pages[i].cached;
            if (kv->refs[p] == 0 && !mark[p])
                reuse_from_lru++;
            mark[p] = 1;
        }
    if ((uint64_t)to_read > (uint64_t)kv->n_free + (kv->n_cached - reuse_from_lru)) {
        rc = lms__err(LMS_ENOSPACE, "KV resume '%s': %u pages to load, %u free and %u evictable cached pages", name,
                      to_read, kv->n_free, kv->n_cached - reuse_from_lru);
        goto out;
    }
    uint32_t n_from_free = LMS_MIN(to_read, kv->n_free), n_staged = 0;
    uint32_t fi = 0, lru = kv->lru_head;
    bool direct = host_arena(kv);
    for (uint32_t i = 0; i < c.n_pages; i++) {
        res_page *rp = &c.pages[i];
        if (rp->cached != KV_NONE)
            continue;
        if (fi < n_from_free) {
            rp->target = kv->free_stack[kv->n_free - 1 - fi];
            fi++;
            rp->via_host = !direct;
        } else {
            while (mark[lru])
                lru = kv->lru_next[lru];
            rp->target = lru;
            lru = kv->lru_next[lru];
            rp->staged = true;
        }
        if (rp->staged)
            n_staged++;
    }
    if (n_staged) {
        rc = LMS_ENOMEM;
        if (!(staging = lms__malloc((size_t)n_staged * kv->page_bytes)))
            goto out;
    }
    for (uint32_t i = 0, s = 0; i < c.n_pages; i++) {
        res_page *rp = &c.pages[i];
        if (rp->cached != KV_NONE || rp->via_host)
            continue;
        rp->dst = rp->staged ? staging + (size_t)(s++) * kv->page_bytes : lms__kv_page_ptr(kv, rp->target);
    }

    double t_prep = lms__now();
    /* ---- 5. verify and decode (threads) */
    threads = params && params->threads > 0 ? params->threads : lms__cpu_count();
    if (threads > (int)to_read)
        threads = to_read ? (int)to_read : 1;
    if ((rc = lms__pool_create(threads, &pool)))
        goto out;
    threads = lms__pool_threads(pool);
    rc = LMS_ENOMEM;
    if (!(c.codec = lms__calloc((size_t)threads, sizeof *c.codec)) ||
        !(c.unpack = lms__calloc((size_t)threads, sizeof *c.unpack)) ||
        !(c.inbuf = lms__calloc((size_t)threads, sizeof *c.inbuf)) ||
        !(c.image = lms__calloc((size_t)threads, sizeof *c.image)))
        goto out;
    for (int w = 0; w < threads; w++)
        if (!(c.codec[w].scratch = lms__malloc(kv->page_bytes)) || !(c.unpack[w] = lms__malloc(kv->page_bytes)) ||
            !(c.inbuf[w] = lms__malloc(max_stored)) || (!direct && !(c.image[w] = lms__malloc(kv->page_bytes))))
            goto out;
    lms__pool_run(pool, c.n_pages, res_decode_one, &c);
    for (uint32_t i = 0; i < c.n_pages; i++) {
        rc = c.pages[i].rc;
        if (rc == LMS_ECORRUPT) {
            rc = lms__err(LMS_ECORRUPT, "KV session '%s': corrupt page %u (segment %u, offset %llu): checksum mismatch or undecodable",
                          name, i, c.pages[i].blob.segment, (unsigned long long)c.pages[i].blob.offset);
            goto out;
        }
        if (rc) {
            lms__err(rc, "KV session '%s': page %u: %s", name, i, c.pages[i].err);
            goto out;
        }
    }
    /* ---- 6. commit to the cache. The only fallible step left is the device
     *         copy into evicted cached pages (non-host arenas); a page whose
     *         copy was attempted is dropped from the prefix index on failure,
     *         so a cached page never holds bytes other than its key says. */
    for (uint32_t i = 0; i < c.n_pages; i++) {
        res_page *rp = &c.pages[i];
        if (rp->cached != KV_NONE || !rp->staged)
            continue;
        rc = kv->dev->ops->copy_h2d(kv->dev, lms__kv_page_ptr(kv, rp->target), rp->dst, kv->page_bytes, NULL);
        if (rc) {
            lms__err_prefix(rc, "KV resume '%s': page %u to the device: ", name, i);
            for (uint32_t j = 0; j <= i; j++)
                if (c.pages[j].cached == KV_NONE && c.pages[j].staged) {
                    lms__kv_evict(kv, c.pages[j].target);
                    lms__kv_return_free(kv, c.pages[j].target);
                }
            goto out;
        }
    }
    double t_decoded = lms__now();
    lms_kv_seq *seq = lms__kv_seq_take(kv);
    assert(seq);
    /* Pages reused from the prefix cache (leave the LRU if cached). */
    for (uint32_t i = 0; i < c.n_pages; i++)
        if (c.pages[i].cached != KV_NONE) {
            lms__kv_ref(kv, c.pages[i].cached);
            seq->table[i] = c.pages[i].cached;
        }
    /* Targets leave their lists: free ones are the top n_from_free entries
     * of the free stack; cached ones are evicted (unlinked, unpublished)
     * before any new key enters the index. */
    kv->n_free -= n_from_free;
    for (uint32_t i = 0; i < c.n_pages; i++) {
        res_page *rp = &c.pages[i];
        if (rp->cached == KV_NONE && (kv->flags[rp->target] & KV_PUBLISHED))
            lms__kv_evict(kv, rp->target);
    }
    for (uint32_t i = 0; i < c.n_pages; i++) {
        res_page *rp = &c.pages[i];
        if (rp->cached != KV_NONE)
            continue;
        uint32_t p = rp->target;
        seq->table[i] = p;
        kv->flags[p] = 0;
        kv->refs[p] = 1;
        memcpy(kv->tokens + (size_t)p * kv->P, tokens + (size_t)i * kv->P, rp->n_tokens * sizeof(int32_t));
        if (rp->n_tokens == kv->P) {
            kv->keys[p] = rp->key;
            kv->flags[p] = KV_KEYED;
            if (lms__kv_ht_find(kv, rp->key) == KV_NONE)
                lms__kv_ht_insert(kv, p);
        }
    }
    seq->len = seq->committed = r.n_tokens;
    *out = seq;

    double t_built = lms__now();
    if (!store->rdonly && lms__txn_write(store, touch_txn, (void *)name))
        lms__warn("KV resume '%s': could not update its last-used time: %s", name, lms_last_error());
    lms__debug("KV resume '%s': %u pages (%u read): prepare %.1f ms, decode %.1f ms (%d threads), build %.1f ms, "
               "last-used %.1f ms",
               name, c.n_pages, to_read, (t_prep - t0) * 1e3, (t_decoded - t_prep) * 1e3, threads,
               (t_built - t_decoded) * 1e3, (lms__now() - t_built) * 1e3);
    if (stats) {
        stats->tokens = r.n_tokens;
        stats->pages = c.n_pages;
        for (uint32_t i = 0; i < c.n_pages; i++) {
            res_page *rp = &c.pages[i];
            stats->raw_bytes += raw_size(kv, rp->n_tokens);
            if (rp->cached != KV_NONE) {
                stats->pages_reused++;
            } else {
                stats->pages_written++;
                stats->stored_bytes += rp->blob.size;
            }
        }
        stats->seconds = lms__now() - t0;
    }
    rc = 0;
out:
    if (txn)
        lms__txn_end(store, txn);
    lms__pool_destroy(pool);
    for (int w = 0; w < threads; w++) {
        if (c.codec)
            lms__kv_codec_ctx_free(&c.codec[w]);
        if (c.unpack)
            lms__free(c.unpack[w]);
        if (c.inbuf)
            lms__free(c.inbuf[w]);
        if (c.image)
            lms__free(c.image[w]);
    }
    lms__free(c.codec);
    lms__free(c.unpack);
    lms__free(c.inbuf);
    lms__free(c.image);
    if (c.maps)
        for (int m = 0; m < c.n_maps; m++)
            lms__segment_unmap(&c.maps[m]);
    lms__free(c.maps);
    lms__free(c.pages);
    lms__free(tokens);
    lms__free(staging);
    lms__free(mark);
    lms__free(rec_copy);
    return rc;
}
