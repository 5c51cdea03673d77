/*
 * store/kv_index.c - the kvpages and sessions databases and the page blobs
 * of saved KV caches, behind the calls of store/kv_index.h (its design notes
 * say which store invariant each call keeps). Record bytes are
 * store/kv_records.c's; the page bytes (codecs, layout) are kvcache's.
 */
#include <assert.h>
#include <stdio.h>
#include <string.h>

#include "store/kv_index.h"
#include "store/store_internal.h"

/* ======================================================================================
 * reading
 * ==================================================================================== */

struct lms__kv_reader {
    lms_store *s;
    MDB_txn *txn;       /* the snapshot; NULL once released */
    uint8_t *rec;       /* copy of the last session record read */
    lms__segmap *maps;  /* [n_maps], share-locked until read_end */
    int n_maps, cap_maps;
};

int lms__kv_read_begin(lms_store *s, lms__kv_reader **out)
{
    lms__kv_reader *r = *out = lms__calloc(1, sizeof *r);
    if (!r)
        return LMS_ENOMEM;
    r->s = s;
    int rc = lms__txn_read(s, &r->txn); /* NULL on failure */
    if (rc) {
        lms__kv_read_end(r);
        *out = NULL;
    }
    return rc;
}

void lms__kv_read_release(lms__kv_reader *r)
{
    lms__txn_end(r->s, r->txn);
    r->txn = NULL;
}

void lms__kv_read_end(lms__kv_reader *r)
{
    if (!r)
        return;
    lms__kv_read_release(r);
    for (int m = 0; m < r->n_maps; m++)
        lms__segment_unmap(&r->maps[m]);
    lms__free(r->maps);
    lms__free(r->rec);
    lms__free(r);
}

int lms__kv_read_session(lms__kv_reader *r, const char *name, lms__session_rec *rec)
{
    assert(r->txn);
    memset(rec, 0, sizeof *rec);
    MDB_val v;
    int rc = lms__db_get(r->s, r->txn, LMS__DB_SESSIONS, name, strlen(name), &v);
    if (rc == LMS_ENOENT)
        return lms__err(LMS_ENOENT, "KV session '%s' not found in %s", name, r->s->path);
    if (rc)
        return rc;
    lms__free(r->rec);
    if (!(r->rec = lms__malloc(v.mv_size ? v.mv_size : 1)))
        return LMS_ENOMEM;
    memcpy(r->rec, v.mv_data, v.mv_size);
    return lms__session_rec_decode(r->rec, v.mv_size, name, rec);
}

int lms__kv_read_sessions(lms__kv_reader *r, lms__kv_session_fn fn, void *ctx)
{
    assert(r->txn);
    lms_store *s = r->s;
    MDB_cursor *cur = NULL;
    int rc = 0, mrc = mdb_cursor_open(r->txn, s->dbi[LMS__DB_SESSIONS], &cur);
    if (mrc)
        return lms__mdb_err(mrc, "%s: sessions cursor", s->index_path);
    MDB_val k, v;
    char name[LMS__SESSION_NAME_MAX + 1];
    int check;
    for (mrc = lms__cursor_get(s, cur, LMS__DB_SESSIONS, &k, &v, MDB_FIRST, &check); mrc == 0;
         mrc = lms__cursor_get(s, cur, LMS__DB_SESSIONS, &k, &v, MDB_NEXT, &check)) {
        size_t n = LMS_MIN(k.mv_size, sizeof name - 1);
        memcpy(name, k.mv_data, n);
        name[n] = '\0';
        lms__session_rec rec;
        memset(&rec, 0, sizeof rec);
        int dec = check ? check : lms__session_rec_decode(v.mv_data, v.mv_size, name, &rec);
        if ((rc = fn(ctx, r, name, dec, &rec)))
            goto out;
    }
    rc = (mrc == MDB_NOTFOUND) ? 0 : lms__mdb_err(mrc, "%s: sessions cursor", s->index_path);
out:
    mdb_cursor_close(cur);
    return rc;
}

int lms__kv_read_page(lms__kv_reader *r, const uint8_t key[16], lms__kv_page_loc *loc)
{
    assert(r->txn);
    memset(loc, 0, sizeof *loc);
    MDB_val v;
    int rc = lms__db_get(r->s, r->txn, LMS__DB_KVPAGES, key, 16, &v);
    if (rc)
        return rc;
    if ((rc = lms__kvpage_rec_decode(v.mv_data, v.mv_size, &loc->rec)))
        return rc;
    lms__blob_rec b;
    rc = lms__blob_get(r->s, r->txn, loc->rec.blob, &b);
    if (rc == LMS_ENOENT)
        return 0;
    if (rc)
        return rc;
    loc->has_blob = true;
    loc->blob_ok = b.kind == LMS__BLOB_KVPAGE && b.size == loc->rec.stored_size;
    loc->segment = b.segment;
    loc->offset = b.offset;
    loc->size = b.size;
    return 0;
}

int lms__kv_read_map(lms__kv_reader *r, uint32_t segment, int *index, uint64_t *size, const char **path)
{
    /* mapped while the snapshot that named the segment is open: gc cannot
     * have unlinked it in between (design note 3) */
    assert(r->txn);
    int m;
    for (m = 0; m < r->n_maps && r->maps[m].id != segment; m++)
        ;
    if (m == r->n_maps) {
        if (r->n_maps == r->cap_maps) {
            int cap = r->cap_maps ? 2 * r->cap_maps : 4;
            lms__segmap *v = lms__realloc(r->maps, (size_t)cap * sizeof *v);
            if (!v)
                return LMS_ENOMEM;
            r->maps = v;
            r->cap_maps = cap;
        }
        int rc = lms__segment_map(r->s, segment, &r->maps[m]);
        if (rc)
            return rc;
        r->n_maps++;
    }
    *index = m;
    *size = r->maps[m].size;
    *path = r->maps[m].path;
    return 0;
}

int lms__kv_read_bytes(const lms__kv_reader *r, int index, void *buf, size_t len, uint64_t offset)
{
    assert(index >= 0 && index < r->n_maps && r->maps[index].fd >= 0); /* mapped (and locked) before read */
    const lms__segmap *m = &r->maps[index];
    return lms__pread_all(m->fd, buf, len, offset, m->path);
}

/* ======================================================================================
 * writing
 * ==================================================================================== */

struct lms__kv_writer {
    lms_store *s;
    const char *name;
    lms__appender *app;  /* holds the append lock */
    bool committed;
};

int lms__kv_write_begin(lms_store *s, const char *name, lms__kv_writer **out)
{
    lms__kv_writer *w = *out = lms__calloc(1, sizeof *w);
    if (!w)
        return LMS_ENOMEM;
    *w = (lms__kv_writer){.s = s, .name = name};
    int rc = lms__append_begin(s, &w->app); /* NULL on failure */
    if (rc) {
        lms__kv_write_end(w);
        *out = NULL;
    }
    return rc;
}

void lms__kv_write_end(lms__kv_writer *w)
{
    if (!w)
        return;
    lms__append_end(w->app, w->committed);
    lms__free(w);
}

/* fn(w, txn, ctx, i) for i < n in one read snapshot, up to the first error. */
typedef int (*snapshot_fn)(lms__kv_writer *w, MDB_txn *txn, void *ctx, uint32_t i);
static int each_in_snapshot(lms__kv_writer *w, uint32_t n, snapshot_fn fn, void *ctx)
{
    MDB_txn *txn;
    int rc = lms__txn_read(w->s, &txn);
    for (uint32_t i = 0; i < n && !rc; i++)
        rc = fn(w, txn, ctx, i);
    lms__txn_end(w->s, txn);
    return rc;
}

typedef struct lookup_ctx {
    const uint8_t *keys;
    bool *stored;
} lookup_ctx;

static int lookup_one(lms__kv_writer *w, MDB_txn *txn, void *arg, uint32_t i)
{
    lookup_ctx *c = arg;
    MDB_val v;
    int rc = lms__db_get(w->s, txn, LMS__DB_KVPAGES, c->keys + 16 * (size_t)i, 16, &v);
    c->stored[i] = rc == 0;
    return rc == LMS_ENOENT ? 0 : rc;
}

int lms__kv_write_lookup(lms__kv_writer *w, const uint8_t *keys, uint32_t n, bool *stored)
{
    lookup_ctx c = {keys, stored};
    return each_in_snapshot(w, n, lookup_one, &c);
}

/* Does the stored blob `b` hold exactly `data`? (dedup by hash AND bytes) */
static int blob_same_bytes(lms_store *s, const lms__blob_rec *b, const uint8_t *data, uint64_t len, bool *same)
{
    *same = false;
    if (b->kind != LMS__BLOB_KVPAGE || b->size != len)
        return 0;
    lms__segmap m;
    int rc = lms__segment_map(s, b->segment, &m);
    if (rc)
        return rc;
    if (b->offset <= m.size && len <= m.size - b->offset)
        *same = memcmp(lms__segmap_at(&m, b->offset, len), data, len) == 0;
    lms__segment_unmap(&m);
    return 0;
}

static int find_blob_one(lms__kv_writer *w, MDB_txn *txn, void *arg, uint32_t i)
{
    lms__kv_blob_query *q = (lms__kv_blob_query *)arg + i;
    lms__blob_rec b;
    q->exists = false;
    int rc = lms__blob_get(w->s, txn, q->hash, &b);
    if (rc)
        return rc == LMS_ENOENT ? 0 : rc;
    if ((rc = blob_same_bytes(w->s, &b, q->data, q->len, &q->exists)))
        return rc;
    if (!q->exists)
        return lms__err(LMS_EEXIST, "KV save '%s': page %u's bytes collide with a different blob of the same hash",
                        w->name, q->page);
    return 0;
}

int lms__kv_write_find_blobs(lms__kv_writer *w, lms__kv_blob_query *q, uint32_t n)
{
    return each_in_snapshot(w, n, find_blob_one, q);
}

int lms__kv_write_reserve(lms__kv_writer *w, uint64_t size, uint32_t *segment, uint64_t *offset)
{
    return lms__append_reserve(w->app, size, segment, offset);
}

int lms__kv_write_bytes(lms__kv_writer *w, uint32_t segment, uint64_t offset, const void *data, size_t len)
{
    return lms__append_write(w->app, segment, offset, data, len);
}

int lms__kv_write_same(lms__kv_writer *w, uint32_t segment, uint64_t offset, const void *data, size_t len,
                       bool *same)
{
    int fd, rc;
    const char *path;
    *same = false;
    if ((rc = lms__append_fd(w->app, segment, &fd, &path)))
        return rc;
    uint8_t *buf = lms__malloc(len);
    if (!buf)
        return LMS_ENOMEM;
    rc = lms__pread_all(fd, buf, len, offset, path);
    if (!rc)
        *same = memcmp(buf, data, len) == 0;
    lms__free(buf);
    return rc;
}

int lms__kv_write_sync(lms__kv_writer *w) { return lms__append_sync(w->app); }

typedef struct commit_ctx {
    lms__kv_writer *w;
    const lms__session_rec *rec;
    const lms__kv_page_put *pages;
    bool no_replace;
} commit_ctx;

/* The page records and blob references of one page (lms__txn_fn's part). */
static int commit_page(lms_store *s, MDB_txn *txn, const commit_ctx *c, uint32_t i)
{
    const lms__kv_page_put *p = &c->pages[i];
    const uint8_t *key = lms__session_page_key(c->rec, i);
    MDB_val v;
    if (p->put == LMS__KV_PUT_SKIP)
        return 0;
    int rc = lms__db_get(s, txn, LMS__DB_KVPAGES, key, 16, &v);
    if (p->put == LMS__KV_PUT_STORED) {
        if (rc == LMS_ENOENT)
            return lms__err(LMS_EBUSY, "KV save '%s': page %u's record vanished during the save", c->w->name, i);
        return rc;
    }
    if (rc == 0)
        return 0; /* appeared meanwhile: our bytes become garbage for gc */
    if (rc != LMS_ENOENT)
        return rc;
    if (p->put == LMS__KV_PUT_SHARE) {
        rc = lms__blob_ref(s, txn, p->rec.blob, 1, NULL);
    } else {
        lms__blob_rec b = {.kind = LMS__BLOB_KVPAGE, .segment = p->segment, .offset = p->offset,
                           .size = p->rec.stored_size, .refs = 1};
        rc = lms__blob_put(s, txn, p->rec.blob, &b);
    }
    if (rc)
        return rc;
    uint8_t buf[LMS__KVPAGE_REC_SIZE];
    lms__kvpage_rec_encode(&p->rec, buf);
    return lms__db_put(s, txn, LMS__DB_KVPAGES, key, 16, buf, sizeof buf, 0);
}

static int commit_txn(lms_store *s, MDB_txn *txn, void *arg)
{
    const commit_ctx *c = arg;
    const char *name = c->w->name;
    MDB_val v;
    int rc = lms__db_get(s, txn, LMS__DB_SESSIONS, name, strlen(name), &v);
    if (rc == 0 && c->no_replace)
        return lms__err(LMS_EEXIST, "KV session '%s' already exists", name);
    if (rc && rc != LMS_ENOENT)
        return rc;
    for (uint32_t i = 0; i < lms__session_n_keys(c->rec); i++)
        if ((rc = commit_page(s, txn, c, i)))
            return rc;
    size_t len = lms__session_rec_size(c->rec);
    uint8_t *buf = lms__malloc(len);
    if (!buf)
        return LMS_ENOMEM;
    lms__session_rec_encode(c->rec, buf);
    rc = lms__db_put(s, txn, LMS__DB_SESSIONS, name, strlen(name), buf, len, 0);
    lms__free(buf);
    return rc;
}

int lms__kv_write_commit(lms__kv_writer *w, const lms__session_rec *rec, const lms__kv_page_put *pages,
                         bool no_replace)
{
    assert(!w->committed && lms__append_locked(w->s)); /* design note 1 */
    commit_ctx c = {w, rec, pages, no_replace};
    int rc = lms__txn_write(w->s, commit_txn, &c);
    if (!rc)
        w->committed = true;
    return rc;
}

/* ======================================================================================
 * sessions
 * ==================================================================================== */

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
    size_t len = v.mv_size;
    uint8_t *copy = lms__malloc(len);
    if (!copy)
        return LMS_ENOMEM;
    memcpy(copy, v.mv_data, len);
    lms__session_rec_touch(copy, len, lms__unix_time());
    rc = lms__db_put(s, txn, LMS__DB_SESSIONS, name, strlen(name), copy, len, 0);
    lms__free(copy);
    return rc;
}

int lms__kv_touch(lms_store *s, const char *name)
{
    if (s->rdonly)
        return 0;
    return lms__txn_write(s, touch_txn, (void *)name);
}

struct lms__touch {
    struct lms__touch *next;
    char name[];
};

/* Write the waiting names' records until none is left. A session deleted
 * meanwhile is no error. */
static void *touch_main(void *arg)
{
    lms_store *s = arg;
    pthread_mutex_lock(&s->touch_mu);
    while (s->touch_head) {
        struct lms__touch *t = s->touch_head;
        if (!(s->touch_head = t->next))
            s->touch_tail = NULL;
        pthread_mutex_unlock(&s->touch_mu);
        int rc = lms__kv_touch(s, t->name);
        if (rc && rc != LMS_ENOENT)
            lms__warn("KV session '%s': could not update its last-used time: %s", t->name, lms_last_error());
        lms__free(t);
        pthread_mutex_lock(&s->touch_mu);
    }
    s->touch_busy = false;
    pthread_mutex_unlock(&s->touch_mu);
    return NULL;
}

void lms__kv_touch_later(lms_store *s, const char *name)
{
    if (s->rdonly)
        return;
    size_t n = strlen(name) + 1;
    struct lms__touch *t = lms__malloc(sizeof *t + n);
    if (!t) {
        (void)lms__kv_touch(s, name);
        return;
    }
    memcpy(t->name, name, n);
    t->next = NULL;
    pthread_mutex_lock(&s->touch_mu);
    if (s->touch_tail)
        s->touch_tail->next = t;
    else
        s->touch_head = t;
    s->touch_tail = t;
    if (!s->touch_busy) {
        if (s->touch_joinable) /* it has emptied the list: returns at once */
            pthread_join(s->touch_th, NULL);
        s->touch_busy = s->touch_joinable = pthread_create(&s->touch_th, NULL, touch_main, s) == 0;
    }
    bool here = !s->touch_busy;
    pthread_mutex_unlock(&s->touch_mu);
    if (here)
        touch_main(s); /* no thread to be had: now */
}

void lms__kv_touch_wait(lms_store *s)
{
    pthread_mutex_lock(&s->touch_mu);
    bool joinable = s->touch_joinable;
    pthread_t th = s->touch_th;
    s->touch_joinable = false;
    pthread_mutex_unlock(&s->touch_mu);
    if (joinable)
        pthread_join(th, NULL); /* it empties the list first */
}

static int remove_txn(lms_store *s, MDB_txn *txn, void *arg)
{
    const char *name = arg;
    int rc = lms__db_del(s, txn, LMS__DB_SESSIONS, name, strlen(name));
    if (rc == LMS_ENOENT)
        return lms__err(LMS_ENOENT, "KV session '%s' not found in %s", name, s->path);
    return rc;
}

int lms__kv_remove(lms_store *s, const char *name) { return lms__txn_write(s, remove_txn, (void *)name); }
