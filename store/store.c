/*
 * store/store.c - the store handle: opening and creating a store (LMDB
 * environment with its named databases, segment folder), transactions that
 * grow the map on MDB_MAP_FULL, small database helpers, blob reference
 * counts, and the read side of the public API (models, tensors, files).
 *
 * docs/FORMAT.md is the normative spec of the bytes; store_internal.h lists
 * the invariants every writer keeps.
 */
#include <errno.h>
#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "store/admin_internal.h"
#include "store/kv_index.h"
#include "store/store_internal.h"

const char *const lms__db_names[LMS__DB_COUNT] = {
    "meta", "models", "tensors", "blobs", "files", "kvpages", "sessions",
};

/* dtypes: quant/dtype.c */

void lms_free(void *p) { lms__free(p); }

/* ---- errors and transactions --------------------------------------------------------- */

static _Thread_local bool tl_map_full;

int lms__mdb_err(int mdb_rc, const char *fmt, ...)
{
    int code;
    switch (mdb_rc) {
    case MDB_NOTFOUND: code = LMS_ENOENT; break;
    case MDB_MAP_FULL: code = LMS_ENOSPACE; tl_map_full = true; break;
    case MDB_VERSION_MISMATCH: code = LMS_EVERSION; break;
    case MDB_INVALID:
    case MDB_CORRUPTED:
    case MDB_PAGE_NOTFOUND: code = LMS_ECORRUPT; break;
    case ENOMEM: code = LMS_ENOMEM; break;
    case EIO:
    case EACCES:
    case ENOSPC: code = LMS_EIO; break;
    default: code = LMS_EDB; break;
    }
    char what[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    return lms__err(code, "%s: %s", what, mdb_strerror(mdb_rc));
}

/*
 * Readers of a handle opened without LMDB's lock file (s->nolock: the user
 * may read the store but not write index/lock.mdb) are not in LMDB's reader
 * table, so a writer could reuse the pages their snapshot reads. Instead
 * they hold flock(LOCK_SH) on index/data.mdb while a read transaction of
 * theirs is open, and every write transaction holds flock(LOCK_EX) on it
 * (lms__txn_write): such a snapshot never sees a writer. Counted per handle
 * (one flock per open file description).
 */
static void nolock_enter(lms_store *s)
{
    pthread_mutex_lock(&s->nolock_mu);
    if (s->nolock_readers++ == 0)
        while (flock(s->data_fd, LOCK_SH) && errno == EINTR)
            ;
    pthread_mutex_unlock(&s->nolock_mu);
}

static void nolock_leave(lms_store *s)
{
    pthread_mutex_lock(&s->nolock_mu);
    assert(s->nolock_readers > 0);
    if (--s->nolock_readers == 0)
        (void)flock(s->data_fd, LOCK_UN);
    pthread_mutex_unlock(&s->nolock_mu);
}

/* The raw meta "format" of txn's snapshot: 4 bytes in format 1, 4 bytes and
 * the record checksum from format 2. 0 when absent; LMS_ECORRUPT. */
static int format_of(lms_store *s, MDB_txn *txn, uint32_t *fmt)
{
    MDB_val k = {6, (void *)"format"}, v;
    int mrc = mdb_get(txn, s->dbi[LMS__DB_META], &k, &v);
    *fmt = 0;
    if (mrc == MDB_NOTFOUND)
        return 0;
    if (mrc)
        return lms__mdb_err(mrc, "%s: read meta", s->index_path);
    const uint8_t *p = v.mv_data;
    if (v.mv_size == 4 && lms__get_u32(p) == 1) {
        *fmt = 1;
        return 0;
    }
    if (v.mv_size == 4 + LMS__REC_SUM_SIZE && lms__get_u32(p) >= LMS__FORMAT_SUMS &&
        lms__get_u64(p + 4) == lms__rec_sum("format", 6, p, 4)) {
        *fmt = lms__get_u32(p);
        return 0;
    }
    return lms__err(LMS_ECORRUPT, "%s: meta record 'format' is damaged (%zu bytes)", s->index_path, v.mv_size);
}

static int txn_begin(lms_store *s, unsigned flags, MDB_txn **out)
{
    if (s->nolock)
        nolock_enter(s);
    for (int tries = 0;; tries++) {
        pthread_rwlock_rdlock(&s->map_lock);
        int rc = mdb_txn_begin(s->env, NULL, flags, out);
        if (rc == 0) {
            /* a store another process upgraded meanwhile: records now carry
             * checksums (the format only grows) */
            uint32_t fmt;
            if (s->dbis_open && atomic_load(&s->format) < LMS__FORMAT_VERSION && format_of(s, *out, &fmt) == 0 &&
                fmt > atomic_load(&s->format) && fmt <= LMS__FORMAT_VERSION)
                atomic_store(&s->format, fmt);
            return 0;
        }
        pthread_rwlock_unlock(&s->map_lock);
        if (rc == MDB_MAP_RESIZED && tries < 8) {
            /* another process grew the map: adopt its size */
            pthread_rwlock_wrlock(&s->map_lock);
            rc = mdb_env_set_mapsize(s->env, 0);
            pthread_rwlock_unlock(&s->map_lock);
            if (rc == 0)
                continue;
        }
        *out = NULL;
        if (s->nolock)
            nolock_leave(s);
        return lms__mdb_err(rc, "%s: begin transaction", s->index_path);
    }
}

int lms__txn_read(lms_store *s, MDB_txn **out) { return txn_begin(s, MDB_RDONLY, out); }

/* After a transaction ended (aborted or committed). */
static void txn_done(lms_store *s)
{
    pthread_rwlock_unlock(&s->map_lock);
    if (s->nolock)
        nolock_leave(s);
}

void lms__txn_end(lms_store *s, MDB_txn *txn)
{
    if (!txn)
        return;
    mdb_txn_abort(txn);
    txn_done(s);
}

static int grow_map(lms_store *s)
{
    pthread_rwlock_wrlock(&s->map_lock);
    MDB_envinfo info;
    int rc = mdb_env_info(s->env, &info);
    if (rc == 0) {
        size_t want = info.me_mapsize * 2;
        lms__debug("store %s: growing the LMDB map to %zu bytes", s->path, want);
        rc = mdb_env_set_mapsize(s->env, want);
    }
    pthread_rwlock_unlock(&s->map_lock);
    return rc ? lms__mdb_err(rc, "%s: grow map", s->index_path) : 0;
}

/* Bytes of index/data.mdb that LMDB uses: pages 0 .. last page of the last
 * committed transaction (that number never goes down). */
static uint64_t data_used(lms_store *s)
{
    MDB_envinfo info;
    MDB_stat st;
    if (mdb_env_info(s->env, &info) || mdb_env_stat(s->env, &st))
        return UINT64_MAX;
    return ((uint64_t)info.me_last_pgno + 1) * st.ms_psize;
}

/*
 * Give back what a failed commit left in index/data.mdb: LMDB writes a
 * transaction's pages past the end of the file before its meta page makes
 * them part of the index, and a commit that fails (a full disk) leaves them
 * there, unused; no snapshot can reach a page past the last one committed.
 * Holding a write transaction (LMDB's writer lock) no other writer extends
 * the file meanwhile. Best effort: a failure leaves the bytes for next time.
 */
static void trim_data_file(lms_store *s)
{
    struct stat st;
    if (fstat(s->data_fd, &st) || (uint64_t)st.st_size <= data_used(s))
        return;
    MDB_txn *txn;
    if (txn_begin(s, 0, &txn))
        return;
    uint64_t used = data_used(s);
    if (used != UINT64_MAX && fstat(s->data_fd, &st) == 0 && (uint64_t)st.st_size > used &&
        ftruncate(s->data_fd, (off_t)used) == 0)
        lms__debug("store %s: gave back %llu bytes a failed commit left in data.mdb", s->path,
                   (unsigned long long)((uint64_t)st.st_size - used));
    lms__txn_end(s, txn);
}

/* A commit that failed: a full file system is named as such (LMDB reports a
 * short write as EIO). */
static int commit_err(lms_store *s, int mrc)
{
    struct statvfs vs;
    uint64_t avail = fstatvfs(s->data_fd, &vs) == 0 ? (uint64_t)vs.f_bavail * vs.f_frsize : UINT64_MAX;
    if (mrc == ENOSPC || mrc == EDQUOT || (mrc == EIO && avail < (4u << 20)))
        return lms__err(LMS_ENOSPACE,
                        "%s: commit: no space left on the file system holding the index (%llu bytes free); "
                        "nothing was changed",
                        s->index_path, (unsigned long long)(avail == UINT64_MAX ? 0 : avail));
    return lms__mdb_err(mrc, "%s: commit", s->index_path);
}

int lms__txn_write(lms_store *s, lms__txn_fn fn, void *ctx)
{
    if (s->rdonly)
        return lms__err(LMS_EINVAL, "%s: store is open read-only", s->path);
    /* no reader without a reader slot reads while we write (nolock_enter) */
    pthread_mutex_lock(&s->write_mu);
    while (flock(s->data_fd, LOCK_EX) && errno == EINTR)
        ;
    int rc = 0;
    bool done = false, trim = false;
    for (int attempt = 0; attempt < 32 && !done; attempt++) {
        MDB_txn *txn;
        if ((rc = txn_begin(s, 0, &txn)))
            break;
        tl_map_full = false;
        rc = fn(s, txn, ctx);
        bool full = tl_map_full;
        if (rc) {
            lms__txn_end(s, txn);
            if (!(rc == LMS_ENOSPACE && full))
                break;
        } else {
            int mrc = mdb_txn_commit(txn);
            txn_done(s);
            trim = true;
            if (mrc == 0) {
                done = true;
                break;
            }
            if (mrc != MDB_MAP_FULL) {
                rc = commit_err(s, mrc);
                break;
            }
        }
        if ((rc = grow_map(s)))
            break;
        rc = lms__err(LMS_ENOSPACE, "%s: LMDB map still full after growing it", s->index_path);
    }
    if (trim) {
        char keep[1024]; /* the error detail outlives the clean-up */
        snprintf(keep, sizeof keep, "%s", rc ? lms_last_error() : "");
        trim_data_file(s);
        if (rc)
            lms__err(rc, "%s", keep);
    }
    (void)flock(s->data_fd, LOCK_UN);
    pthread_mutex_unlock(&s->write_mu);
    return done ? 0 : rc;
}

/* ---- record checksums --------------------------------------------------------------------- */

uint64_t lms__rec_sum(const void *key, size_t klen, const void *val, size_t vlen)
{
    return lms__hash64(val, vlen, lms__hash64(key, klen, 0));
}

/* Append `n` bytes of a key part to buf: as they are when they are UTF-8
 * without control characters, else printable ASCII with \xNN escapes. */
static size_t name_part(char *buf, size_t cap, size_t o, const uint8_t *p, size_t n)
{
    bool plain = lms__utf8_valid((const char *)p, n);
    for (size_t i = 0; plain && i < n; i++)
        plain = p[i] >= 0x20 && p[i] != 0x7f && p[i] != '\'';
    size_t shown = LMS_MIN(n, (size_t)160);
    for (size_t i = 0; i < shown && o + 5 < cap; i++) {
        if (plain || (p[i] >= 0x20 && p[i] < 0x7f && p[i] != '\\' && p[i] != '\''))
            buf[o++] = (char)p[i];
        else
            o += (size_t)snprintf(buf + o, cap - o, "\\x%02x", p[i]);
    }
    if (shown < n && o + 4 < cap)
        o += (size_t)snprintf(buf + o, cap - o, "...");
    return o;
}

void lms__rec_name(int db, const void *key, size_t klen, char *buf, size_t cap)
{
    const uint8_t *k = key;
    size_t o = (size_t)snprintf(buf, cap, "%s record ", lms__db_names[db]);
    if (o >= cap)
        return;
    if ((db == LMS__DB_BLOBS || db == LMS__DB_KVPAGES) && klen == 16) {
        char hex[33];
        lms__admin_hex16(key, hex);
        snprintf(buf + o, cap - o, "%s", hex);
        return;
    }
    size_t ml = klen;
    bool composite = (db == LMS__DB_TENSORS || db == LMS__DB_FILES) && lms__key_split(key, klen, &ml);
    if (o + 2 < cap)
        buf[o++] = '\'';
    o = name_part(buf, cap, o, k, ml);
    if (composite && o + 4 < cap) {
        memcpy(buf + o, "'/'", 3);
        o = name_part(buf, cap, o + 3, k + ml + 1, klen - ml - 1);
    }
    if (o + 1 < cap)
        buf[o++] = '\'';
    buf[LMS_MIN(o, cap - 1)] = '\0';
}

int lms__rec_check(lms_store *s, int db, const MDB_val *k, MDB_val *v)
{
    if (!lms__has_sums(s))
        return 0;
    char name[512];
    if (v->mv_size < LMS__REC_SUM_SIZE) {
        lms__rec_name(db, k->mv_data, k->mv_size, name, sizeof name);
        return lms__err(LMS_ECORRUPT, "%s: %s is shorter than its checksum (the index is damaged)", s->index_path,
                        name);
    }
    v->mv_size -= LMS__REC_SUM_SIZE;
    const uint8_t *p = v->mv_data;
    if (lms__get_u64(p + v->mv_size) != lms__rec_sum(k->mv_data, k->mv_size, p, v->mv_size)) {
        lms__rec_name(db, k->mv_data, k->mv_size, name, sizeof name);
        return lms__err(LMS_ECORRUPT, "%s: %s fails its checksum (the index is damaged)", s->index_path, name);
    }
    return 0;
}

int lms__cursor_get(lms_store *s, MDB_cursor *c, int db, MDB_val *k, MDB_val *v, MDB_cursor_op op, int *check)
{
    int mrc = mdb_cursor_get(c, k, v, op);
    *check = mrc == 0 ? lms__rec_check(s, db, k, v) : 0;
    return mrc;
}

int lms__db_get(lms_store *s, MDB_txn *txn, int db, const void *key, size_t klen, MDB_val *val)
{
    MDB_val k = {klen, (void *)key};
    int rc = mdb_get(txn, s->dbi[db], &k, val);
    if (rc == MDB_NOTFOUND)
        return LMS_ENOENT;
    if (rc)
        return lms__mdb_err(rc, "%s: read %s", s->index_path, lms__db_names[db]);
    return lms__rec_check(s, db, &k, val);
}

int lms__db_put(lms_store *s, MDB_txn *txn, int db, const void *key, size_t klen, const void *val,
                size_t vlen, unsigned flags)
{
    MDB_val k = {klen, (void *)key}, v = {vlen, (void *)val};
    bool sums = lms__has_sums(s);
    if (sums) { /* room for the value and its checksum, filled below */
        v.mv_size = vlen + LMS__REC_SUM_SIZE;
        v.mv_data = NULL;
        flags |= MDB_RESERVE;
    }
    int rc = mdb_put(txn, s->dbi[db], &k, &v, flags);
    if (rc == MDB_KEYEXIST)
        return LMS_EEXIST;
    if (rc)
        return lms__mdb_err(rc, "%s: write %s", s->index_path, lms__db_names[db]);
    if (sums) {
        uint8_t *p = v.mv_data;
        if (vlen)
            memcpy(p, val, vlen);
        lms__put_u64(p + vlen, lms__rec_sum(key, klen, p, vlen));
    }
    return 0;
}

int lms__db_del(lms_store *s, MDB_txn *txn, int db, const void *key, size_t klen)
{
    MDB_val k = {klen, (void *)key};
    int rc = mdb_del(txn, s->dbi[db], &k, NULL);
    if (rc == MDB_NOTFOUND)
        return LMS_ENOENT;
    return rc ? lms__mdb_err(rc, "%s: delete from %s", s->index_path, lms__db_names[db]) : 0;
}

size_t lms__key_item(char *buf, size_t cap, const char *model, const char *item)
{
    size_t a = strlen(model), b = strlen(item);
    if (a + 1 + b > cap || a + 1 + b > 511)
        return 0;
    memcpy(buf, model, a);
    buf[a] = '\0';
    memcpy(buf + a + 1, item, b);
    return a + 1 + b;
}

bool lms__key_split(const void *key, size_t len, size_t *model_len)
{
    const char *p = memchr(key, '\0', len);
    if (!p)
        return false;
    *model_len = (size_t)(p - (const char *)key);
    return true;
}

int lms__db_del_prefix(lms_store *s, MDB_txn *txn, int db, const char *model)
{
    MDB_cursor *c;
    size_t plen = strlen(model) + 1;
    int rc = mdb_cursor_open(txn, s->dbi[db], &c);
    if (rc)
        return lms__mdb_err(rc, "%s: cursor", s->index_path);
    MDB_val k = {plen, (void *)model}, v;
    rc = mdb_cursor_get(c, &k, &v, MDB_SET_RANGE);
    while (rc == 0 && k.mv_size >= plen && memcmp(k.mv_data, model, plen) == 0) {
        if ((rc = mdb_cursor_del(c, 0)))
            break;
        rc = mdb_cursor_get(c, &k, &v, MDB_GET_CURRENT);
        if (rc == EINVAL || rc == MDB_NOTFOUND) /* deleted the last item */
            break;
        if (rc == 0 && !(k.mv_size >= plen && memcmp(k.mv_data, model, plen) == 0))
            break;
    }
    mdb_cursor_close(c);
    if (rc && rc != MDB_NOTFOUND && rc != EINVAL)
        return lms__mdb_err(rc, "%s: delete from %s", s->index_path, lms__db_names[db]);
    return 0;
}

int lms__db_prefix_each(lms_store *s, MDB_txn *txn, int db, const char *model, lms__prefix_fn fn, void *ctx)
{
    MDB_cursor *c;
    size_t plen = strlen(model) + 1;
    int mrc = mdb_cursor_open(txn, s->dbi[db], &c);
    if (mrc)
        return lms__mdb_err(mrc, "%s: cursor", s->index_path);
    MDB_val k = {plen, (void *)model}, v;
    int rc = 0, check;
    for (mrc = lms__cursor_get(s, c, db, &k, &v, MDB_SET_RANGE, &check); mrc == 0;
         mrc = lms__cursor_get(s, c, db, &k, &v, MDB_NEXT, &check)) {
        if (k.mv_size < plen || memcmp(k.mv_data, model, plen) != 0)
            break;
        if ((rc = check) || (rc = fn(s, txn, ctx, (const char *)k.mv_data + plen, k.mv_size - plen, &v)))
            break;
    }
    mdb_cursor_close(c);
    if (!rc && mrc && mrc != MDB_NOTFOUND)
        rc = lms__mdb_err(mrc, "%s: read %s", s->index_path, lms__db_names[db]);
    return rc;
}

/* A meta value that must be exactly `size` bytes (a little-endian integer). */
static int meta_get_fixed(lms_store *s, MDB_txn *txn, const char *key, size_t size, const uint8_t **p)
{
    MDB_val val;
    int rc = lms__db_get(s, txn, LMS__DB_META, key, strlen(key), &val);
    if (rc)
        return rc;
    if (val.mv_size != size)
        return lms__err(LMS_ECORRUPT, "%s: meta '%s' has %zu bytes, expected %zu", s->index_path, key,
                        val.mv_size, size);
    *p = val.mv_data;
    return 0;
}

int lms__meta_get_u32(lms_store *s, MDB_txn *txn, const char *key, uint32_t *v)
{
    const uint8_t *p = NULL;
    int rc = meta_get_fixed(s, txn, key, 4, &p);
    if (!rc)
        *v = lms__get_u32(p);
    return rc;
}

int lms__meta_get_u64(lms_store *s, MDB_txn *txn, const char *key, uint64_t *v)
{
    const uint8_t *p = NULL;
    int rc = meta_get_fixed(s, txn, key, 8, &p);
    if (!rc)
        *v = lms__get_u64(p);
    return rc;
}

/* ---- blobs ------------------------------------------------------------------------------ */

int lms__blob_get(lms_store *s, MDB_txn *txn, const uint8_t hash[16], lms__blob_rec *out)
{
    MDB_val v;
    int rc = lms__db_get(s, txn, LMS__DB_BLOBS, hash, 16, &v);
    if (rc)
        return rc;
    rc = lms__blob_rec_decode(v.mv_data, v.mv_size, out);
    if (rc) {
        char hex[33];
        lms__hash128_hex(lms__hash128_get(hash), hex);
        return lms__err_prefix(rc, "%s: blob %s: ", s->index_path, hex);
    }
    return 0;
}

static int blob_write(lms_store *s, MDB_txn *txn, const uint8_t hash[16], const lms__blob_rec *r)
{
    uint8_t buf[LMS__BLOB_REC_SIZE];
    lms__blob_rec_encode(r, buf);
    return lms__db_put(s, txn, LMS__DB_BLOBS, hash, 16, buf, sizeof buf, 0);
}

int lms__blob_put(lms_store *s, MDB_txn *txn, const uint8_t hash[16], const lms__blob_rec *r)
{
    assert(lms__append_locked(s)); /* invariant 3: no gc deletes or moves blobs meanwhile */
    return blob_write(s, txn, hash, r);
}

int lms__blob_ref(lms_store *s, MDB_txn *txn, const uint8_t hash[16], int64_t delta, uint64_t *refs_after)
{
    /* invariant 3: a reference is added only while gc cannot be deleting
     * the blob; references are dropped by rm without the lock */
    assert(delta <= 0 || lms__append_locked(s));
    lms__blob_rec r;
    int rc = lms__blob_get(s, txn, hash, &r);
    char hex[33];
    if (rc == LMS_ENOENT) {
        lms__hash128_hex(lms__hash128_get(hash), hex);
        return lms__err(LMS_ENOENT, "%s: blob %s is not in the index", s->index_path, hex);
    }
    if (rc)
        return rc;
    if (delta < 0 && (uint64_t)(-delta) > r.refs) {
        lms__hash128_hex(lms__hash128_get(hash), hex);
        return lms__err(LMS_ECORRUPT, "%s: blob %s: reference count %llu would go below zero", s->index_path,
                        hex, (unsigned long long)r.refs);
    }
    uint64_t before = r.refs;
    r.refs = (uint64_t)((int64_t)r.refs + delta);
    assert(delta < 0 ? r.refs < before : r.refs >= before); /* never wraps, either way */
    if (refs_after)
        *refs_after = r.refs;
    return blob_write(s, txn, hash, &r);
}

/* ---- open / close ----------------------------------------------------------------- */

lms_store_params lms_store_default_params(void)
{
    return (lms_store_params){.alignment = LMS__DEFAULT_ALIGNMENT, .segment_max = LMS__DEFAULT_SEGMENT_MAX};
}

lms_import_params lms_import_default_params(void)
{
    return (lms_import_params){.name = NULL, .replace = false, .threads = 0, .progress = true};
}

void lms__store_ref(lms_store *s) { atomic_fetch_add(&s->users, 1); }
void lms__store_unref(lms_store *s) { atomic_fetch_sub(&s->users, 1); }

const char *lms_store_path(const lms_store *s) { return s->path; }
uint32_t lms_store_alignment(const lms_store *s) { return s->alignment; }
uint32_t lms_store_format(const lms_store *s) { return atomic_load(&((lms_store *)s)->format); }

int lms_store_segment_path(const lms_store *s, uint32_t segment, char *buf, size_t len)
{
    return lms__segment_path(s, segment, buf, len);
}

typedef struct init_ctx {
    const lms_store_params *p;
} init_ctx;

/* Create the named databases and, in a new store, the meta records. */
static int init_txn(lms_store *s, MDB_txn *txn, void *vctx)
{
    init_ctx *c = vctx;
    for (int i = 0; i < LMS__DB_COUNT; i++) {
        int rc = mdb_dbi_open(txn, lms__db_names[i], MDB_CREATE, &s->dbi[i]);
        if (rc)
            return lms__mdb_err(rc, "%s: create database '%s'", s->index_path, lms__db_names[i]);
    }
    MDB_val k = {6, (void *)"format"}, v;
    int rc = mdb_get(txn, s->dbi[LMS__DB_META], &k, &v);
    if (rc != MDB_NOTFOUND)
        return rc ? lms__mdb_err(rc, "%s: read meta", s->index_path) : 0; /* initialised by someone */
    uint8_t b4[4], b8[8], uuid[16];
    if (getrandom(uuid, sizeof uuid, 0) != (ssize_t)sizeof uuid)
        return lms__err_errno(LMS_EIO, errno, "getrandom");
    atomic_store(&s->format, LMS__FORMAT_VERSION); /* a new store: records with checksums */
    lms__put_u32(b4, LMS__FORMAT_VERSION);
    if ((rc = lms__db_put(s, txn, LMS__DB_META, "format", 6, b4, 4, 0)))
        return rc;
    if ((rc = lms__db_put(s, txn, LMS__DB_META, "uuid", 4, uuid, 16, 0)))
        return rc;
    lms__put_u32(b4, c->p->alignment);
    if ((rc = lms__db_put(s, txn, LMS__DB_META, "alignment", 9, b4, 4, 0)))
        return rc;
    lms__put_u64(b8, c->p->segment_max);
    if ((rc = lms__db_put(s, txn, LMS__DB_META, "segment_max", 11, b8, 8, 0)))
        return rc;
    lms__put_u64(b8, lms__unix_time());
    return lms__db_put(s, txn, LMS__DB_META, "created", 7, b8, 8, 0);
}

/* Open existing databases in a read transaction (committed so the handles
 * stay valid) and load the meta records. LMS_ENOENT when not initialised. */
static int load_meta(lms_store *s)
{
    MDB_txn *txn;
    int rc = lms__txn_read(s, &txn);
    if (rc)
        return rc;
    for (int i = 0; i < LMS__DB_COUNT; i++) {
        int mrc = mdb_dbi_open(txn, lms__db_names[i], 0, &s->dbi[i]);
        if (mrc == MDB_NOTFOUND) {
            rc = LMS_ENOENT;
            goto out;
        }
        if (mrc) {
            rc = lms__mdb_err(mrc, "%s: open database '%s'", s->index_path, lms__db_names[i]);
            goto out;
        }
    }
    uint32_t fmt;
    if ((rc = format_of(s, txn, &fmt)))
        goto out;
    if (fmt == 0) {
        rc = LMS_ENOENT;
        goto out;
    }
    if (fmt > LMS__FORMAT_VERSION) {
        rc = lms__err(LMS_EVERSION, "%s: store format %u is newer than this build (%u)", s->path, fmt,
                      LMS__FORMAT_VERSION);
        goto out;
    }
    atomic_store(&s->format, fmt); /* the meta records below are read through their checksums */
    if ((rc = lms__meta_get_u32(s, txn, "alignment", &s->alignment)) ||
        (rc = lms__meta_get_u64(s, txn, "segment_max", &s->segment_max)))
        goto out;
    MDB_val v;
    if ((rc = lms__db_get(s, txn, LMS__DB_META, "uuid", 4, &v)))
        goto out;
    if (v.mv_size != 16) {
        rc = lms__err(LMS_ECORRUPT, "%s: meta 'uuid' is not 16 bytes", s->index_path);
        goto out;
    }
    memcpy(s->uuid, v.mv_data, 16);
    if (s->alignment < 64 || s->alignment > LMS__MAX_ALIGNMENT || (s->alignment & (s->alignment - 1)) ||
        s->segment_max < 2 * LMS__SEG_HEADER_SIZE) {
        rc = lms__err(LMS_ECORRUPT, "%s: meta alignment %u / segment_max %llu invalid", s->index_path,
                      s->alignment, (unsigned long long)s->segment_max);
        goto out;
    }
    rc = mdb_txn_commit(txn); /* committed, not aborted: keeps the dbi handles */
    txn_done(s);
    s->dbis_open = rc == 0;
    return rc ? lms__mdb_err(rc, "%s: open databases", s->index_path) : 0;
out:
    lms__txn_end(s, txn);
    if (rc == LMS_ENOENT)
        lms_clear_error();
    return rc;
}

/* ---- format upgrade ------------------------------------------------------------------------- */

typedef struct raw_rec {
    size_t klen, vlen;
    uint8_t *kv; /* key then value */
} raw_rec;

/*
 * Format 1 -> 2 in one write transaction: every record of every database
 * gets its checksum, then meta "format" says 2. Records are rewritten as
 * they are (a damaged one stays damaged; verify's checks that do not rest
 * on checksums still find it). The caller holds the append lock, so no
 * writer of this or an older build appends meanwhile; a concurrent rm or mv
 * of an older build is serialized by LMDB before or after the whole upgrade
 * and refuses the store once it is format 2.
 */
static int upgrade_txn(lms_store *s, MDB_txn *txn, void *vctx)
{
    (void)vctx;
    uint32_t fmt;
    int rc = format_of(s, txn, &fmt);
    if (rc || fmt >= LMS__FORMAT_SUMS)
        return rc; /* upgraded meanwhile by another process */
    raw_rec *v = NULL;
    size_t n = 0, cap = 0;
    for (int db = 0; db < LMS__DB_COUNT && !rc; db++) {
        MDB_cursor *cur;
        MDB_val k, d;
        int mrc = mdb_cursor_open(txn, s->dbi[db], &cur);
        if (mrc)
            return lms__mdb_err(mrc, "%s: cursor", s->index_path);
        n = 0;
        for (mrc = mdb_cursor_get(cur, &k, &d, MDB_FIRST); mrc == 0; mrc = mdb_cursor_get(cur, &k, &d, MDB_NEXT)) {
            if (db == LMS__DB_META && k.mv_size == 6 && !memcmp(k.mv_data, "format", 6))
                continue; /* written last */
            if (n == cap) {
                size_t nc = cap ? 2 * cap : 256;
                raw_rec *nv = lms__realloc(v, nc * sizeof *nv);
                if (!nv) {
                    rc = LMS_ENOMEM;
                    break;
                }
                v = nv;
                cap = nc;
            }
            raw_rec *r = &v[n];
            if (!(r->kv = lms__malloc(k.mv_size + d.mv_size + 1))) {
                rc = LMS_ENOMEM;
                break;
            }
            memcpy(r->kv, k.mv_data, k.mv_size);
            memcpy(r->kv + k.mv_size, d.mv_data, d.mv_size);
            r->klen = k.mv_size;
            r->vlen = d.mv_size;
            n++;
        }
        mdb_cursor_close(cur);
        if (!rc && mrc != MDB_NOTFOUND)
            rc = lms__mdb_err(mrc, "%s: read %s", s->index_path, lms__db_names[db]);
        for (size_t i = 0; i < n; i++) {
            if (!rc) {
                MDB_val nk = {v[i].klen, v[i].kv}, nd = {v[i].vlen + LMS__REC_SUM_SIZE, NULL};
                int prc = mdb_put(txn, s->dbi[db], &nk, &nd, MDB_RESERVE);
                if (prc) {
                    rc = lms__mdb_err(prc, "%s: upgrade %s", s->index_path, lms__db_names[db]);
                } else {
                    uint8_t *p = nd.mv_data;
                    memcpy(p, v[i].kv + v[i].klen, v[i].vlen);
                    lms__put_u64(p + v[i].vlen, lms__rec_sum(v[i].kv, v[i].klen, p, v[i].vlen));
                }
            }
            lms__free(v[i].kv);
        }
    }
    lms__free(v);
    if (rc)
        return rc;
    uint8_t b[4 + LMS__REC_SUM_SIZE];
    lms__put_u32(b, LMS__FORMAT_VERSION);
    lms__put_u64(b + 4, lms__rec_sum("format", 6, b, 4));
    MDB_val fk = {6, (void *)"format"}, fd = {sizeof b, b};
    int prc = mdb_put(txn, s->dbi[LMS__DB_META], &fk, &fd, 0);
    return prc ? lms__mdb_err(prc, "%s: upgrade meta", s->index_path) : 0;
}

static int store_upgrade(lms_store *s)
{
    lms__lock lock;
    int rc = lms__lock_take(s, &lock);
    if (rc)
        return rc;
    uint32_t from = atomic_load(&s->format);
    rc = lms__txn_write(s, upgrade_txn, NULL);
    lms__lock_release(s, &lock);
    if (rc)
        return lms__err_prefix(rc, "%s: upgrading the store from format %u to %u: ", s->path, from,
                               LMS__FORMAT_VERSION);
    atomic_store(&s->format, LMS__FORMAT_VERSION);
    lms__info("store %s: upgraded from format %u to %u (index records now carry checksums)", s->path, from,
              LMS__FORMAT_VERSION);
    return 0;
}

/* ---- open / close --------------------------------------------------------------------------- */

static void store_free(lms_store *s)
{
    lms__kv_touch_wait(s); /* its transaction needs the environment */
    if (s->env)
        mdb_env_close(s->env);
    pthread_rwlock_destroy(&s->map_lock);
    pthread_mutex_destroy(&s->write_mu);
    pthread_mutex_destroy(&s->nolock_mu);
    pthread_mutex_destroy(&s->touch_mu);
    lms__free(s->path);
    lms__free(s->index_path);
    lms__free(s->seg_dir);
    lms__free(s->lock_path);
    lms__free(s);
}

static int env_open(lms_store *s, unsigned flags)
{
    if (s->env)
        mdb_env_close(s->env);
    s->env = NULL;
    int mrc = mdb_env_create(&s->env);
    if (mrc) {
        s->env = NULL;
        return mrc;
    }
    mdb_env_set_maxdbs(s->env, 16);
    mdb_env_set_maxreaders(s->env, 512);
    /* LMSTORE_INITIAL_MAP_SIZE (bytes) exists for tests of map growth. */
    const char *ms = getenv("LMSTORE_INITIAL_MAP_SIZE");
    size_t mapsize = ms && *ms ? (size_t)strtoull(ms, NULL, 10) : 0;
    mdb_env_set_mapsize(s->env, mapsize >= 65536 ? mapsize : LMS__INITIAL_MAP_SIZE);
    return mdb_env_open(s->env, s->index_path, MDB_NOTLS | flags, 0644);
}

/* The first file of the store this process may not access as reading
 * (read, and search for folders) or writing needs, for a message that says
 * exactly what is missing; NULL when none. */
static const char *missing_access(lms_store *s, bool write, char *buf, size_t cap)
{
    static const struct {
        const char *name;
        bool dir, read;
    } f[] = {{"", true, true},          {"/index", true, true}, {"/index/data.mdb", false, true},
             {"/index/lock.mdb", false, false}, {"/lock", false, false}, {"/segments", true, true}};
    for (size_t i = 0; i < LMS_ARRAY_LEN(f); i++) {
        if (!write && !f[i].read)
            continue;
        snprintf(buf, cap, "%s%s", s->path, f[i].name);
        if (access(buf, F_OK) != 0)
            continue;
        if (access(buf, (write ? W_OK : R_OK) | (f[i].dir ? X_OK : 0)) != 0)
            return buf;
    }
    return NULL;
}

int lms_store_open(const char *path, unsigned flags, const lms_store_params *params, lms_store **out)
{
    *out = NULL;
    if (!path || !*path)
        return lms__err(LMS_EINVAL, "store path is empty");
    lms_store_params p = params ? *params : lms_store_default_params();
    if (!p.alignment)
        p.alignment = LMS__DEFAULT_ALIGNMENT;
    if (!p.segment_max)
        p.segment_max = LMS__DEFAULT_SEGMENT_MAX;
    if (p.alignment < 64 || p.alignment > LMS__MAX_ALIGNMENT || (p.alignment & (p.alignment - 1)))
        return lms__err(LMS_EINVAL, "alignment %u is not a power of two in [64, 2 MiB]", p.alignment);
    if (p.segment_max < 2 * LMS__SEG_HEADER_SIZE)
        return lms__err(LMS_EINVAL, "segment_max %llu is too small", (unsigned long long)p.segment_max);
    bool rdonly = flags & LMS_STORE_RDONLY;

    lms_store *s = lms__calloc(1, sizeof *s);
    if (!s)
        return LMS_ENOMEM;
    int rc = LMS_ENOMEM;
    pthread_rwlock_init(&s->map_lock, NULL);
    pthread_mutex_init(&s->write_mu, NULL);
    pthread_mutex_init(&s->nolock_mu, NULL);
    pthread_mutex_init(&s->touch_mu, NULL);
    s->data_fd = -1;
    s->rdonly = rdonly;
    s->path = lms__strdup(path);
    s->index_path = lms__asprintf("%s/index", path);
    s->seg_dir = lms__asprintf("%s/segments", path);
    s->lock_path = lms__asprintf("%s/lock", path);
    if (!s->path || !s->index_path || !s->seg_dir || !s->lock_path)
        goto fail;

    bool exists = lms__is_dir(s->index_path);
    if (!exists) {
        if (!(flags & LMS_STORE_CREATE) || rdonly) {
            rc = lms__err(LMS_ENOENT, "%s: no store here (create one with lmstore import)", path);
            goto fail;
        }
        if ((rc = lms__mkdir_p(s->index_path, 0755)) || (rc = lms__mkdir_p(s->seg_dir, 0755)))
            goto fail;
    }
    if (!rdonly && !lms__path_exists(s->lock_path)) {
        int fd = lms__open(s->lock_path, O_RDWR | O_CREAT, 0644);
        if (fd < 0) {
            rc = fd;
            goto fail;
        }
        close(fd);
    }
    if (!lms__is_dir(s->seg_dir)) {
        if (rdonly) {
            rc = lms__err(LMS_ECORRUPT, "%s: segments folder missing", path);
            goto fail;
        }
        if ((rc = lms__mkdir_p(s->seg_dir, 0755)))
            goto fail;
    }

    char miss[4200];
    int mrc = env_open(s, rdonly ? MDB_RDONLY : 0);
    if (mrc == EACCES && rdonly) {
        /* readable but not ours to write: LMDB cannot enter us in its
         * reader table (index/lock.mdb); read without it, under the data
         * file's shared lock (nolock_enter) */
        mrc = env_open(s, MDB_RDONLY | MDB_NOLOCK);
        s->nolock = mrc == 0;
    }
    if (mrc == EACCES) {
        const char *what = missing_access(s, !rdonly, miss, sizeof miss);
        rc = lms__err(LMS_EIO, "%s: permission denied: %s needs %s access to %s", path,
                      rdonly ? "reading the store" : "writing to the store", rdonly ? "read" : "write",
                      what ? what : s->index_path);
        goto fail;
    }
    if (mrc) {
        rc = lms__mdb_err(mrc, "%s: open LMDB environment", s->index_path);
        goto fail;
    }
    if ((mrc = mdb_env_get_fd(s->env, &s->data_fd))) {
        rc = lms__mdb_err(mrc, "%s: open LMDB environment", s->index_path);
        goto fail;
    }
    rc = load_meta(s);
    if (rc == LMS_ENOENT) {
        if (rdonly) {
            rc = lms__err(LMS_ENOENT, "%s: store is not initialised", path);
            goto fail;
        }
        init_ctx c = {&p};
        if ((rc = lms__txn_write(s, init_txn, &c)) || (rc = load_meta(s)))
            goto fail;
    } else if (rc) {
        goto fail;
    }
    if (s->nolock && atomic_load(&s->format) < LMS__FORMAT_SUMS) {
        /* writers of format 1 (older builds) do not take the data file's
         * lock: a snapshot without a reader slot would not be safe */
        rc = lms__err(LMS_EIO,
                      "%s: permission denied: reading a format-%u store needs write access to %s/lock.mdb "
                      "(LMDB's reader table); the store's owner can upgrade it to format %u (any writing lmstore "
                      "command does), which users who may only read it can read",
                      path, atomic_load(&s->format), s->index_path, LMS__FORMAT_VERSION);
        goto fail;
    }
    if (!rdonly && atomic_load(&s->format) < LMS__FORMAT_VERSION && (rc = store_upgrade(s)))
        goto fail;
    *out = s;
    return 0;
fail:
    store_free(s);
    return rc;
}

int lms_store_close(lms_store *s)
{
    if (!s)
        return 0;
    int users = atomic_load(&s->users);
    if (users > 0)
        return lms__err(LMS_EBUSY, "%s: %d model(s) or caches opened from the store are still open", s->path,
                        users);
    store_free(s);
    return 0;
}

/* ---- reading the index -------------------------------------------------------------- */

static char *dupn(const char *p, size_t n)
{
    return lms__strndup(p ? p : "", p ? n : 0);
}

typedef struct model_item {
    lms_model_info info;
    char *name, *arch, *source, *meta;
} model_item;

static int model_from_rec(const void *key, size_t klen, const void *val, size_t vlen, model_item *it,
                          const char *index_path)
{
    lms__model_rec r;
    memset(it, 0, sizeof *it);
    int rc = lms__model_rec_decode(val, vlen, &r);
    if (rc)
        return lms__err_prefix(rc, "%s: model '%.*s': ", index_path, (int)klen, (const char *)key);
    it->name = dupn(key, klen);
    it->arch = dupn(r.arch, r.arch_len);
    it->source = dupn(r.source, r.source_len);
    it->meta = dupn(r.st_meta, r.st_meta_len);
    if (!it->name || !it->arch || !it->source || !it->meta) {
        lms__free(it->name);
        lms__free(it->arch);
        lms__free(it->source);
        lms__free(it->meta);
        return LMS_ENOMEM;
    }
    lms_model_info *m = &it->info;
    m->name = it->name;
    m->architecture = it->arch;
    m->source = it->source;
    m->st_metadata = it->meta;
    memcpy(m->id, r.id, sizeof m->id);
    m->n_tensors = r.n_tensors;
    m->n_params = r.n_params;
    m->tensor_bytes = r.tensor_bytes;
    m->created = r.created;
    m->dtype_mask = r.dtype_mask;
    return 0;
}

static void free_items(model_item *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        lms__free(v[i].name);
        lms__free(v[i].arch);
        lms__free(v[i].source);
        lms__free(v[i].meta);
    }
    lms__free(v);
}

int lms_store_models(lms_store *s, lms_model_cb cb, void *ctx)
{
    MDB_txn *txn;
    MDB_cursor *c = NULL;
    model_item *v = NULL;
    size_t n = 0, cap = 0;
    int rc = lms__txn_read(s, &txn);
    if (rc)
        return rc;
    int mrc = mdb_cursor_open(txn, s->dbi[LMS__DB_MODELS], &c);
    if (mrc) {
        rc = lms__mdb_err(mrc, "%s: cursor", s->index_path);
        goto out;
    }
    MDB_val k, val;
    int check;
    for (mrc = lms__cursor_get(s, c, LMS__DB_MODELS, &k, &val, MDB_FIRST, &check); mrc == 0;
         mrc = lms__cursor_get(s, c, LMS__DB_MODELS, &k, &val, MDB_NEXT, &check)) {
        if ((rc = check))
            goto out;
        if (n == cap) {
            cap = cap ? cap * 2 : 16;
            model_item *nv = lms__realloc(v, cap * sizeof *v);
            if (!nv) {
                rc = LMS_ENOMEM;
                goto out;
            }
            v = nv;
        }
        if ((rc = model_from_rec(k.mv_data, k.mv_size, val.mv_data, val.mv_size, &v[n], s->index_path)))
            goto out;
        n++;
    }
    if (mrc != MDB_NOTFOUND)
        rc = lms__mdb_err(mrc, "%s: read models", s->index_path);
out:
    if (c)
        mdb_cursor_close(c);
    lms__txn_end(s, txn);
    for (size_t i = 0; rc == 0 && i < n; i++)
        rc = cb(ctx, &v[i].info);
    free_items(v, n);
    return rc;
}

int lms__model_get(lms_store *s, MDB_txn *txn, const char *model, MDB_val *val)
{
    int rc = lms__db_get(s, txn, LMS__DB_MODELS, model, strlen(model), val);
    if (rc == LMS_ENOENT)
        rc = lms__err(LMS_ENOENT, "model '%s' is not in the store %s", model, s->path);
    return rc;
}

int lms_store_model(lms_store *s, const char *model, lms_model_cb cb, void *ctx)
{
    MDB_txn *txn;
    model_item it;
    MDB_val val;
    int rc = lms__txn_read(s, &txn);
    if (rc)
        return rc;
    rc = lms__model_get(s, txn, model, &val);
    if (!rc)
        rc = model_from_rec(model, strlen(model), val.mv_data, val.mv_size, &it, s->index_path);
    lms__txn_end(s, txn);
    if (rc)
        return rc;
    rc = cb(ctx, &it.info);
    lms__free(it.name);
    lms__free(it.arch);
    lms__free(it.source);
    lms__free(it.meta);
    return rc;
}

typedef struct tensor_item {
    lms_tensor_record rec;
    uint32_t order;
} tensor_item;

static int cmp_order(const void *a, const void *b)
{
    const tensor_item *x = a, *y = b;
    return x->order < y->order ? -1 : x->order > y->order;
}

/* Begin a read transaction on which `model` exists and run fn over its
 * "model NUL item" records of db; the transaction is ended before return. */
static int model_items(lms_store *s, const char *model, int db, lms__prefix_fn fn, void *ctx)
{
    MDB_txn *txn;
    MDB_val val;
    int rc = lms__txn_read(s, &txn);
    if (rc)
        return rc;
    rc = lms__model_get(s, txn, model, &val);
    if (!rc)
        rc = lms__db_prefix_each(s, txn, db, model, fn, ctx);
    lms__txn_end(s, txn);
    return rc;
}

typedef struct tensor_list {
    const char *model;
    tensor_item *v;
    size_t n, cap;
} tensor_list;

static int tensor_collect(lms_store *s, MDB_txn *txn, void *vctx, const char *tname, size_t tlen, const MDB_val *val)
{
    tensor_list *l = vctx;
    lms__tensor_rec tr;
    lms__blob_rec br;
    int rc;
    if ((rc = lms__tensor_rec_decode(val->mv_data, val->mv_size, &tr)))
        return lms__err_prefix(rc, "%s: model '%s' tensor '%.*s': ", s->index_path, l->model, (int)tlen, tname);
    rc = lms__blob_get(s, txn, tr.hash, &br);
    if (rc == LMS_ENOENT)
        rc = lms__err(LMS_ECORRUPT, "%s: model '%s' tensor '%.*s': its blob is missing", s->index_path, l->model,
                      (int)tlen, tname);
    if (rc)
        return rc;
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 64;
        tensor_item *nv = lms__realloc(l->v, cap * sizeof *nv);
        if (!nv)
            return LMS_ENOMEM;
        l->v = nv;
        l->cap = cap;
    }
    tensor_item *t = &l->v[l->n];
    memset(t, 0, sizeof *t);
    t->rec.name = dupn(tname, tlen);
    if (!t->rec.name)
        return LMS_ENOMEM;
    l->n++;
    t->order = tr.order;
    t->rec.dtype = tr.dtype;
    t->rec.ndim = tr.ndim;
    memcpy(t->rec.shape, tr.shape, sizeof tr.shape);
    t->rec.nbytes = tr.nbytes;
    t->rec.layer = tr.layer;
    memcpy(t->rec.hash, tr.hash, 16);
    t->rec.segment = br.segment;
    t->rec.offset = br.offset;
    t->rec.bits = tr.bits;
    t->rec.group_size = tr.group;
    return 0;
}

int lms_store_tensors(lms_store *s, const char *model, lms_tensor_cb cb, void *ctx)
{
    tensor_list l = {.model = model};
    int rc = model_items(s, model, LMS__DB_TENSORS, tensor_collect, &l);
    if (l.n)
        qsort(l.v, l.n, sizeof *l.v, cmp_order);
    for (size_t i = 0; rc == 0 && i < l.n; i++)
        rc = cb(ctx, &l.v[i].rec);
    for (size_t i = 0; i < l.n; i++)
        lms__free((void *)l.v[i].rec.name);
    lms__free(l.v);
    return rc;
}

typedef struct file_item {
    char *name;
    uint64_t size;
} file_item;

typedef struct file_list {
    const char *model;
    file_item *v;
    size_t n, cap;
} file_list;

static int file_collect(lms_store *s, MDB_txn *txn, void *vctx, const char *fname, size_t flen, const MDB_val *val)
{
    (void)txn;
    file_list *l = vctx;
    lms__file_rec fr;
    int rc;
    if (flen && fname[0] == '.')
        return 0; /* lmstore's own (docs/FORMAT.md 3.5), not the model's */
    if ((rc = lms__file_rec_decode(val->mv_data, val->mv_size, &fr)))
        return lms__err_prefix(rc, "%s: model '%s' file '%.*s': ", s->index_path, l->model, (int)flen, fname);
    if (l->n == l->cap) {
        size_t cap = l->cap ? l->cap * 2 : 16;
        file_item *nv = lms__realloc(l->v, cap * sizeof *nv);
        if (!nv)
            return LMS_ENOMEM;
        l->v = nv;
        l->cap = cap;
    }
    if (!(l->v[l->n].name = dupn(fname, flen)))
        return LMS_ENOMEM;
    l->v[l->n++].size = fr.raw_size;
    return 0;
}

int lms_store_files(lms_store *s, const char *model, lms_file_cb cb, void *ctx)
{
    file_list l = {.model = model};
    int rc = model_items(s, model, LMS__DB_FILES, file_collect, &l);
    for (size_t i = 0; rc == 0 && i < l.n; i++)
        rc = cb(ctx, l.v[i].name, l.v[i].size);
    for (size_t i = 0; i < l.n; i++)
        lms__free(l.v[i].name);
    lms__free(l.v);
    return rc;
}

int lms_store_file(lms_store *s, const char *model, const char *file, void **data, size_t *len)
{
    MDB_txn *txn;
    MDB_val val;
    char key[512];
    *data = NULL;
    size_t klen = lms__key_item(key, sizeof key, model, file);
    if (!klen)
        return lms__err(LMS_ENOENT, "model '%s' has no file '%s'", model, file);
    int rc = lms__txn_read(s, &txn);
    if (rc)
        return rc;
    if ((rc = lms__model_get(s, txn, model, &val)))
        goto out;
    rc = lms__db_get(s, txn, LMS__DB_FILES, key, klen, &val);
    if (rc == LMS_ENOENT) {
        rc = lms__err(LMS_ENOENT, "model '%s' has no file '%s'", model, file);
        goto out;
    }
    if (rc)
        goto out;
    lms__file_rec fr;
    char what[600];
    snprintf(what, sizeof what, "model '%s' file '%s'", model, file);
    if ((rc = lms__file_rec_decode(val.mv_data, val.mv_size, &fr))) {
        rc = lms__err_prefix(rc, "%s: ", what);
        goto out;
    }
    rc = lms__file_rec_inflate(&fr, what, (char **)data, len);
out:
    lms__txn_end(s, txn);
    return rc;
}

void lms__named_recs_free(lms__named_rec *v, size_t n)
{
    for (size_t i = 0; v && i < n; i++) {
        lms__free(v[i].name);
        lms__free(v[i].rec);
    }
    lms__free(v);
}

/* ---- a new model's records ------------------------------------------------------------------- */

int lms__model_put_records(lms_store *s, MDB_txn *txn, const lms__model_put *mp)
{
    uint64_t n_params = 0, bytes = 0;
    uint32_t mask = 0;
    char key[512];
    uint8_t tb[LMS__TENSOR_REC_FIXED + 8 * LMS_MAX_DIMS];
    int rc;
    for (size_t k = 0; k < mp->nt; k++) {
        lms__tensor_rec tr = mp->trecs[k];
        tr.order = (uint32_t)k;
        size_t tl = lms__tensor_rec_encode(&tr, tb);
        size_t kl = lms__key_item(key, sizeof key, mp->name, mp->tnames[k]);
        if (!kl)
            return lms__err(LMS_EINVAL, "model '%s' tensor '%s': key longer than 511 bytes", mp->name,
                            mp->tnames[k]);
        if ((rc = lms__db_put(s, txn, LMS__DB_TENSORS, key, kl, tb, tl, 0)))
            return rc;
        uint64_t ne = 1;
        for (uint32_t d = 0; d < tr.ndim; d++)
            ne *= tr.shape[d];
        n_params += ne;
        bytes += tr.nbytes;
        mask |= 1u << tr.dtype;
    }
    for (size_t i = 0; i < mp->nf; i++) {
        size_t kl = lms__key_item(key, sizeof key, mp->name, mp->files[i].name);
        if (!kl)
            return lms__err(LMS_EINVAL, "model '%s' file '%s': key too long", mp->name, mp->files[i].name);
        if ((rc = lms__db_put(s, txn, LMS__DB_FILES, key, kl, mp->files[i].rec, mp->files[i].len, 0)))
            return rc;
    }
    const char *arch = mp->arch ? mp->arch : "", *meta = mp->st_meta ? mp->st_meta : "";
    lms__model_rec mr = {.created = lms__unix_time(), .n_tensors = mp->nt, .n_params = n_params,
                         .tensor_bytes = bytes, .dtype_mask = mask, .n_files = (uint32_t)mp->nf, .arch = arch,
                         .arch_len = (uint32_t)strlen(arch), .source = mp->source,
                         .source_len = (uint32_t)strlen(mp->source), .st_meta = meta,
                         .st_meta_len = (uint32_t)strlen(meta)};
    memcpy(mr.id, mp->id, 16);
    uint8_t *rec;
    size_t rl;
    if ((rc = lms__model_rec_encode(&mr, &rec, &rl)))
        return rc;
    rc = lms__db_put(s, txn, LMS__DB_MODELS, mp->name, strlen(mp->name), rec, rl, 0);
    lms__free(rec);
    return rc;
}
