/*
 * store/admin.c - `lmstore rm`, `cp` and `mv` (one LMDB write transaction
 * each, lmstore/store.h guarantee 1), and the pieces verify, gc and export
 * share (store/admin_internal.h): the blob table of a snapshot, the segment
 * files on disk, KV references, the append lock, the reader grace period.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <unistd.h>

#include "common/crashpoint.h"
#include "lmstore/store.h"
#include "store/admin_internal.h"
#include "store/kv_records.h"
#include "store/names.h"

void lms__admin_hex16(const void *key, char out[33])
{
    static const char digits[] = "0123456789abcdef";
    const uint8_t *k = key;
    for (int i = 0; i < 16; i++) {
        out[2 * i] = digits[k[i] >> 4];
        out[2 * i + 1] = digits[k[i] & 15];
    }
    out[32] = '\0';
}

/* ---- blob table ---------------------------------------------------------------------- */

int lms__blobset_load(lms_store *s, MDB_txn *txn, lms__blobset *out)
{
    memset(out, 0, sizeof *out);
    MDB_stat st;
    int mrc = mdb_stat(txn, s->dbi[LMS__DB_BLOBS], &st);
    if (mrc)
        return lms__mdb_err(mrc, "%s: stat blobs", s->index_path);
    size_t cap = st.ms_entries ? st.ms_entries : 1;
    out->v = lms__calloc(cap, sizeof *out->v);
    if (!out->v)
        return LMS_ENOMEM;
    MDB_cursor *cur;
    if ((mrc = mdb_cursor_open(txn, s->dbi[LMS__DB_BLOBS], &cur)))
        return lms__mdb_err(mrc, "%s: cursor", s->index_path);
    MDB_val k, d;
    int check;
    for (mrc = lms__cursor_get(s, cur, LMS__DB_BLOBS, &k, &d, MDB_FIRST, &check); mrc == 0;
         mrc = lms__cursor_get(s, cur, LMS__DB_BLOBS, &k, &d, MDB_NEXT, &check)) {
        if (out->n == cap)
            break; /* cannot happen in one snapshot */
        lms__blobent *b = &out->v[out->n++];
        memset(b, 0, sizeof *b);
        memcpy(b->hash, k.mv_data, LMS_MIN(k.mv_size, (size_t)16));
        b->sum_bad = check != 0;
        if (check || k.mv_size != 16 || lms__blob_rec_decode(d.mv_data, d.mv_size, &b->rec))
            b->bad = true;
        b->count_known = !b->bad && b->rec.kind == LMS__BLOB_TENSOR;
    }
    mdb_cursor_close(cur);
    if (mrc && mrc != MDB_NOTFOUND)
        return lms__mdb_err(mrc, "%s: read blobs", s->index_path);
    return 0;
}

bool lms__blobset_find(const lms__blobset *bs, const uint8_t hash[16], size_t *index)
{
    size_t lo = 0, hi = bs->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        int c = memcmp(bs->v[mid].hash, hash, 16);
        if (c == 0) {
            *index = mid;
            return true;
        }
        if (c < 0)
            lo = mid + 1;
        else
            hi = mid;
    }
    return false;
}

static int cmp_place(const void *a, const void *b, void *ctx)
{
    const lms__blobset *bs = ctx;
    const lms__blob_rec *x = &bs->v[*(const size_t *)a].rec, *y = &bs->v[*(const size_t *)b].rec;
    if (x->segment != y->segment)
        return x->segment < y->segment ? -1 : 1;
    return x->offset < y->offset ? -1 : x->offset > y->offset;
}

size_t *lms__blobset_by_place(const lms__blobset *bs)
{
    size_t *idx = lms__calloc(bs->n ? bs->n : 1, sizeof *idx);
    if (!idx)
        return NULL;
    for (size_t i = 0; i < bs->n; i++)
        idx[i] = i;
    qsort_r(idx, bs->n, sizeof *idx, cmp_place, (void *)bs);
    return idx;
}

void lms__blobset_free(lms__blobset *bs)
{
    lms__free(bs->v);
    bs->v = NULL;
    bs->n = 0;
}

/* ---- segment files ----------------------------------------------------------------------- */

int lms__segset_load(lms_store *s, lms__segset *out)
{
    memset(out, 0, sizeof *out);
    uint32_t *ids = NULL;
    size_t n = 0;
    int rc = lms__segment_list(s, &ids, &n);
    if (rc)
        return rc;
    out->v = lms__calloc(n ? n : 1, sizeof *out->v);
    uint8_t *hdr = lms__malloc(LMS__SEG_HEADER_SIZE);
    if (!out->v || !hdr) {
        rc = LMS_ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        lms__segent *g = &out->v[out->n++];
        g->id = ids[i];
        g->map.fd = -1;
        char path[4096];
        if ((rc = lms__segment_path(s, g->id, path, sizeof path)))
            goto out;
        int fd = lms__open(path, O_RDONLY, 0);
        if (fd < 0) {
            if (fd == LMS_ENOMEM)
                goto out_enomem;
            /* vanished meanwhile (another gc): an empty entry */
            snprintf(g->header_err, sizeof g->header_err, "%s", lms_last_error());
            continue;
        }
        int frc = lms__fstat_size(fd, &g->size, path);
        uint64_t have = LMS_MIN(g->size, (uint64_t)LMS__SEG_HEADER_SIZE);
        if (!frc)
            frc = lms__pread_all(fd, hdr, (size_t)have, 0, path);
        if (!frc)
            frc = lms__segment_header_check(hdr, (size_t)have, s->uuid, g->id, path);
        close(fd);
        if (frc == LMS_ENOMEM)
            goto out_enomem;
        g->header_ok = frc == 0;
        if (frc)
            snprintf(g->header_err, sizeof g->header_err, "%s", lms_last_error());
    }
    rc = 0;
    goto out;
out_enomem:
    rc = LMS_ENOMEM;
out:
    lms__free(hdr);
    lms__free(ids);
    if (rc)
        lms__segset_free(out);
    return rc;
}

lms__segent *lms__segset_find(const lms__segset *ss, uint32_t id)
{
    size_t lo = 0, hi = ss->n;
    while (lo < hi) {
        size_t mid = lo + (hi - lo) / 2;
        if (ss->v[mid].id == id)
            return &ss->v[mid];
        if (ss->v[mid].id < id)
            lo = mid + 1;
        else
            hi = mid;
    }
    return NULL;
}

void lms__segset_free(lms__segset *ss)
{
    for (size_t i = 0; i < ss->n; i++)
        if (ss->v[i].map.base || ss->v[i].map.fd >= 0)
            lms__segment_unmap(&ss->v[i].map);
    lms__free(ss->v);
    ss->v = NULL;
    ss->n = 0;
}

/* ---- KV references ------------------------------------------------------------------------- */

static int cmp_page_key(const void *key, const void *ent)
{
    return memcmp(key, ((const lms__kvpage_ent *)ent)->key, 16);
}

lms__kvpage_ent *lms__kvset_page(const lms__kvset *ks, const uint8_t key[16])
{
    return ks->n_pages ? bsearch(key, ks->pages, ks->n_pages, sizeof *ks->pages, cmp_page_key) : NULL;
}

void lms__kvset_free(lms__kvset *ks)
{
    for (size_t i = 0; i < ks->n_sess; i++) {
        lms__free(ks->sess[i].name);
        lms__free(ks->sess[i].copy);
    }
    lms__free(ks->sess);
    lms__free(ks->pages);
    memset(ks, 0, sizeof *ks);
}

static int grow(void **v, size_t *cap, size_t n, size_t size)
{
    if (n < *cap)
        return 0;
    size_t nc = *cap ? 2 * *cap : 64;
    void *nv = lms__realloc(*v, nc * size);
    if (!nv)
        return LMS_ENOMEM;
    *v = nv;
    *cap = nc;
    return 0;
}

int lms__kvset_load(lms_store *s, MDB_txn *txn, lms__kvset *ks, lms__kv_problem_fn fn, void *ctx)
{
    MDB_cursor *cur;
    MDB_val k, d;
    char name[512], msg[1100];
    size_t cap = 0;
    int check, rc = 0;
    memset(ks, 0, sizeof *ks);
    int mrc = mdb_cursor_open(txn, s->dbi[LMS__DB_KVPAGES], &cur);
    if (mrc)
        return lms__mdb_err(mrc, "%s: cursor", s->index_path);
    for (mrc = lms__cursor_get(s, cur, LMS__DB_KVPAGES, &k, &d, MDB_FIRST, &check); mrc == 0;
         mrc = lms__cursor_get(s, cur, LMS__DB_KVPAGES, &k, &d, MDB_NEXT, &check)) {
        if ((rc = grow((void **)&ks->pages, &cap, ks->n_pages, sizeof *ks->pages)))
            break;
        lms__kvpage_ent *e = &ks->pages[ks->n_pages++];
        memset(e, 0, sizeof *e);
        memcpy(e->key, k.mv_data, LMS_MIN(k.mv_size, (size_t)16));
        lms__rec_name(LMS__DB_KVPAGES, k.mv_data, k.mv_size, name, sizeof name);
        if (check || k.mv_size != 16 || lms__kvpage_rec_decode(d.mv_data, d.mv_size, &e->rec)) {
            e->bad = true;
            if (!check && k.mv_size != 16)
                lms__err(LMS_ECORRUPT, "key of %zu bytes, not 16", k.mv_size);
            snprintf(msg, sizeof msg, "%s%s%s", check ? "" : name, check ? "" : ": ", lms_last_error());
            if (fn)
                fn(ctx, NULL, msg);
        }
    }
    mdb_cursor_close(cur);
    if (!rc && mrc != MDB_NOTFOUND)
        rc = lms__mdb_err(mrc, "%s: read kvpages", s->index_path);
    if (rc)
        return rc;

    cap = 0;
    if ((mrc = mdb_cursor_open(txn, s->dbi[LMS__DB_SESSIONS], &cur)))
        return lms__mdb_err(mrc, "%s: cursor", s->index_path);
    for (mrc = lms__cursor_get(s, cur, LMS__DB_SESSIONS, &k, &d, MDB_FIRST, &check); mrc == 0;
         mrc = lms__cursor_get(s, cur, LMS__DB_SESSIONS, &k, &d, MDB_NEXT, &check)) {
        if ((rc = grow((void **)&ks->sess, &cap, ks->n_sess, sizeof *ks->sess)))
            break;
        lms__kvsess_ent *e = &ks->sess[ks->n_sess];
        memset(e, 0, sizeof *e);
        e->name = lms__strndup(k.mv_data, k.mv_size);
        e->copy = lms__malloc(d.mv_size ? d.mv_size : 1);
        if (!e->name || !e->copy) {
            lms__free(e->name);
            lms__free(e->copy);
            rc = LMS_ENOMEM;
            break;
        }
        ks->n_sess++;
        memcpy(e->copy, d.mv_data, d.mv_size);
        e->dec_rc = check ? check : lms__session_rec_decode(e->copy, d.mv_size, e->name, &e->rec);
        if (e->dec_rc == LMS_EVERSION)
            ks->newer = true;
        if (e->dec_rc) {
            if (fn)
                fn(ctx, e->name, lms_last_error());
            continue;
        }
        for (uint32_t p = 0; p < lms__session_n_keys(&e->rec); p++) {
            lms__kvpage_ent *pe = lms__kvset_page(ks, lms__session_page_key(&e->rec, p));
            if (pe)
                pe->named = true;
        }
    }
    mdb_cursor_close(cur);
    if (!rc && mrc != MDB_NOTFOUND)
        rc = lms__mdb_err(mrc, "%s: read sessions", s->index_path);
    return rc;
}

/* ---- locks and readers ---------------------------------------------------------------------------- */

typedef struct readers_ctx {
    uint64_t min_txnid; /* oldest snapshot in use; UINT64_MAX if none */
} readers_ctx;

static int reader_line(const char *msg, void *vctx)
{
    readers_ctx *c = vctx;
    /* "%10d %zx %s\n": pid, thread, txnid or "-"; the first line is a header */
    int pid;
    unsigned long long thr;
    char txn[32];
    if (sscanf(msg, "%d %llx %31s", &pid, &thr, txn) == 3 && txn[0] != '-') {
        char *end;
        unsigned long long t = strtoull(txn, &end, 10);
        if (end != txn && t < c->min_txnid)
            c->min_txnid = t;
    }
    return 0;
}

bool lms__admin_wait_readers(lms_store *s, double seconds)
{
    int dead;
    (void)mdb_reader_check(s->env, &dead);
    MDB_envinfo info;
    if (mdb_env_info(s->env, &info))
        return false;
    uint64_t last = (uint64_t)info.me_last_txnid;
    double t0 = lms__now();
    for (;;) {
        readers_ctx c = {UINT64_MAX};
        if (mdb_reader_list(s->env, reader_line, &c) < 0)
            return false;
        if (c.min_txnid >= last)
            return true;
        if (lms__now() - t0 >= seconds)
            return false;
        usleep(20000);
        (void)mdb_reader_check(s->env, &dead);
    }
}

static char *barrier_path(lms_store *s) { return lms__asprintf("%s/readers.lock", s->path); }

void lms__read_barrier_enter(lms_store *s, int *fd)
{
    *fd = -1;
    char *path = barrier_path(s);
    if (!path)
        return;
    int f = open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    if (f < 0)
        f = open(path, O_RDONLY | O_CLOEXEC);
    lms__free(path);
    if (f < 0)
        return;
    while (flock(f, LOCK_SH)) {
        if (errno != EINTR) {
            close(f);
            return;
        }
    }
    *fd = f;
}

void lms__read_barrier_leave(int fd)
{
    if (fd >= 0)
        close(fd);
}

bool lms__read_barrier_wait(lms_store *s, double seconds)
{
    char *path = barrier_path(s);
    if (!path)
        return false;
    int f = lms__open(path, O_RDWR | O_CREAT | O_CLOEXEC, 0644);
    lms__free(path);
    if (f < 0)
        return false;
    double t0 = lms__now();
    bool ok;
    while (!(ok = flock(f, LOCK_EX | LOCK_NB) == 0) && (errno == EWOULDBLOCK || errno == EINTR) &&
           lms__now() - t0 < seconds)
        usleep(5000);
    close(f);
    return ok;
}

/* ---- rm ------------------------------------------------------------------------------------------- */

typedef struct rm_ctx {
    const char *model;
    uint64_t tensors;
} rm_ctx;

typedef struct unref_ctx {
    const char *model;
    int64_t delta;
    uint64_t *count;
} unref_ctx;

/* lms__prefix_fn: drop (or add) one reference to the blob of one tensor. */
static int unref_one(lms_store *s, MDB_txn *txn, void *ctx, const char *name, size_t name_len, const MDB_val *d)
{
    unref_ctx *u = ctx;
    lms__tensor_rec tr;
    int rc;
    if ((rc = lms__tensor_rec_decode(d->mv_data, d->mv_size, &tr)))
        rc = lms__err_prefix(rc, "model '%s' tensor '%.*s': ", u->model, (int)name_len, name);
    if (!rc) {
        rc = lms__blob_ref(s, txn, tr.hash, u->delta, NULL);
        if ((rc == LMS_ENOENT || rc == LMS_ECORRUPT) && u->delta < 0) {
            /* a damaged store (verify reports it): removing the model
             * must still work; there is no count to drop */
            lms__warn("rm '%s' tensor '%.*s': %s", u->model, (int)name_len, name, lms_last_error());
            rc = 0;
        }
    }
    if (rc)
        return rc;
    (*u->count)++;
    return 0;
}

/* Drop one reference from the blob of every tensor of `model`. */
static int unref_tensors(lms_store *s, MDB_txn *txn, const char *model, int64_t delta, uint64_t *count)
{
    unref_ctx u = {model, delta, count};
    return lms__db_prefix_each(s, txn, LMS__DB_TENSORS, model, unref_one, &u);
}

static int rm_txn(lms_store *s, MDB_txn *txn, void *vctx)
{
    rm_ctx *c = vctx;
    MDB_val v;
    c->tensors = 0;
    int rc = lms__db_get(s, txn, LMS__DB_MODELS, c->model, strlen(c->model), &v);
    if (rc == LMS_ENOENT)
        return lms__err(LMS_ENOENT, "no model '%s' in %s", c->model, s->path);
    if (rc)
        return rc;
    if ((rc = unref_tensors(s, txn, c->model, -1, &c->tensors)))
        return rc;
    if ((rc = lms__db_del_prefix(s, txn, LMS__DB_TENSORS, c->model)) ||
        (rc = lms__db_del_prefix(s, txn, LMS__DB_FILES, c->model)) ||
        (rc = lms__db_del(s, txn, LMS__DB_MODELS, c->model, strlen(c->model))))
        return rc;
    lms__crashpoint("rm:before-commit");
    return 0;
}

int lms_model_remove(lms_store *s, const char *model)
{
    if (!s || !model)
        return lms__err(LMS_EINVAL, "rm: no store or model name");
    if (s->rdonly)
        return lms__err(LMS_EINVAL, "%s: store is open read-only", s->path);
    rm_ctx c = {model, 0};
    int rc = lms__txn_write(s, rm_txn, &c);
    if (rc)
        return rc;
    lms__crashpoint("rm:after-commit");
    return 0;
}

/* ---- cp and mv ------------------------------------------------------------------------------------- */

typedef struct kv_item {
    void *key;
    size_t klen;
    void *val;
    size_t vlen;
} kv_item;

typedef struct cp_ctx {
    const char *src, *dst;
    bool move;
} cp_ctx;

static void free_items(kv_item *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        lms__free(v[i].key);
        lms__free(v[i].val);
    }
    lms__free(v);
}

typedef struct collect_ctx {
    const char *dst;
    size_t dlen; /* strlen(dst) + 1 */
    kv_item *v;
    size_t n, cap;
} collect_ctx;

/* lms__prefix_fn: copy one record, keyed "dst NUL item". */
static int collect_one(lms_store *s, MDB_txn *txn, void *ctx, const char *item, size_t ilen, const MDB_val *d)
{
    (void)s;
    (void)txn;
    collect_ctx *c = ctx;
    if (c->dlen + ilen > 511)
        return lms__err(LMS_EINVAL, "model name '%s' is too long for item '%.*s'", c->dst, (int)ilen, item);
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 64;
        kv_item *nv = lms__realloc(c->v, cap * sizeof *nv);
        if (!nv)
            return LMS_ENOMEM;
        c->v = nv;
        c->cap = cap;
    }
    kv_item *it = &c->v[c->n];
    it->key = lms__malloc(c->dlen + ilen);
    it->val = lms__malloc(d->mv_size ? d->mv_size : 1);
    if (!it->key || !it->val) {
        lms__free(it->key);
        lms__free(it->val);
        return LMS_ENOMEM;
    }
    c->n++;
    memcpy(it->key, c->dst, c->dlen);
    memcpy((char *)it->key + c->dlen, item, ilen);
    it->klen = c->dlen + ilen;
    memcpy(it->val, d->mv_data, d->mv_size);
    it->vlen = d->mv_size;
    return 0;
}

/* Copy every "src NUL item" record of db into memory, keyed "dst NUL item". */
static int collect(lms_store *s, MDB_txn *txn, int db, const char *src, const char *dst, kv_item **out, size_t *n_out)
{
    *out = NULL;
    *n_out = 0;
    collect_ctx c = {.dst = dst, .dlen = strlen(dst) + 1};
    int rc = lms__db_prefix_each(s, txn, db, src, collect_one, &c);
    if (rc) {
        free_items(c.v, c.n);
        return rc;
    }
    *out = c.v;
    *n_out = c.n;
    return 0;
}

static int put_items(lms_store *s, MDB_txn *txn, int db, const kv_item *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        int rc = lms__db_put(s, txn, db, v[i].key, v[i].klen, v[i].val, v[i].vlen, MDB_NOOVERWRITE);
        if (rc == LMS_EEXIST)
            return lms__err(LMS_ECORRUPT, "%s: stray %s record '%s' in the index", s->index_path,
                            lms__db_names[db], (const char *)v[i].key);
        if (rc)
            return rc;
    }
    return 0;
}

static int cp_txn(lms_store *s, MDB_txn *txn, void *vctx)
{
    cp_ctx *c = vctx;
    MDB_val mv;
    kv_item *tens = NULL, *files = NULL;
    size_t nt = 0, nf = 0;
    uint64_t count = 0;
    int rc = lms__db_get(s, txn, LMS__DB_MODELS, c->src, strlen(c->src), &mv);
    if (rc == LMS_ENOENT)
        return lms__err(LMS_ENOENT, "no model '%s' in %s", c->src, s->path);
    if (rc)
        return rc;
    MDB_val dv;
    rc = lms__db_get(s, txn, LMS__DB_MODELS, c->dst, strlen(c->dst), &dv);
    if (rc == 0)
        return lms__err(LMS_EEXIST, "model '%s' already exists in %s", c->dst, s->path);
    if (rc != LMS_ENOENT)
        return rc;
    /* the model record holds no name: the same bytes serve the new name */
    if ((rc = lms__db_put(s, txn, LMS__DB_MODELS, c->dst, strlen(c->dst), mv.mv_data, mv.mv_size, MDB_NOOVERWRITE)))
        return rc;
    if ((rc = collect(s, txn, LMS__DB_TENSORS, c->src, c->dst, &tens, &nt)) ||
        (rc = collect(s, txn, LMS__DB_FILES, c->src, c->dst, &files, &nf)))
        goto out;
    if ((rc = put_items(s, txn, LMS__DB_TENSORS, tens, nt)) || (rc = put_items(s, txn, LMS__DB_FILES, files, nf)))
        goto out;
    if (c->move) {
        if ((rc = lms__db_del_prefix(s, txn, LMS__DB_TENSORS, c->src)) ||
            (rc = lms__db_del_prefix(s, txn, LMS__DB_FILES, c->src)) ||
            (rc = lms__db_del(s, txn, LMS__DB_MODELS, c->src, strlen(c->src))))
            goto out;
    } else if ((rc = unref_tensors(s, txn, c->src, +1, &count))) {
        goto out;
    }
    lms__crashpoint(c->move ? "mv:before-commit" : "cp:before-commit");
out:
    free_items(tens, nt);
    free_items(files, nf);
    return rc;
}

static int copy_or_move(lms_store *s, const char *src, const char *dst, bool move)
{
    if (!s || !src || !dst)
        return lms__err(LMS_EINVAL, "%s: no store or model name", move ? "mv" : "cp");
    int rc = lms__name_check(LMS__NAME_MODEL, dst);
    if (rc)
        return rc;
    if (!strcmp(src, dst))
        return lms__err(LMS_EEXIST, "model '%s' already exists in %s", dst, s->path);
    /* cp adds references to existing blobs: hold the append lock so gc
     * cannot be deleting one of them (store_internal.h invariant 3) */
    lms__lock lock = LMS__LOCK_NONE;
    if (!move && (rc = lms__lock_take(s, &lock)))
        return rc;
    cp_ctx c = {src, dst, move};
    rc = lms__txn_write(s, cp_txn, &c);
    lms__lock_release(s, &lock);
    return rc;
}

int lms_model_copy(lms_store *s, const char *src, const char *dst) { return copy_or_move(s, src, dst, false); }
int lms_model_rename(lms_store *s, const char *src, const char *dst) { return copy_or_move(s, src, dst, true); }
