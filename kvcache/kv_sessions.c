/*
 * kvcache/kv_sessions.c - listing, describing and removing saved KV sessions
 * (what `lmstore kv ls|info|rm` shows), read from one LMDB snapshot.
 */
#include <stdio.h>
#include <string.h>

#include "kvcache/kv_internal.h"
#include "store/kv_records.h"
#include "store/store_internal.h"

/* Fill info from a record; sums page sizes when the page records are there. */
static int describe(lms_store *s, MDB_txn *txn, const char *name, const void *buf, size_t len,
                    lms_kv_session_info *info, lms__session_rec *r, lms_kv_page_cb page_cb, void *ctx)
{
    memset(info, 0, sizeof *info);
    info->name = name;
    int rc = lms__session_rec_decode(buf, len, name, r);
    if (len >= 2)
        info->version = lms__get_u16(buf);
    if (rc)
        return rc;
    memcpy(info->model_id, r->model_id, LMS_MODEL_ID_LEN);
    info->layout.n_layers = r->n_layers;
    info->layout.n_kv_heads = r->n_kv_heads;
    info->layout.head_dim = r->head_dim;
    info->layout.dtype = (lms_dtype)r->dtype;
    info->layout.page_tokens = r->page_tokens;
    info->n_tokens = r->n_tokens;
    info->n_pages = r->n_pages;
    info->created = r->created;
    info->last_used = r->last_used;
    for (uint32_t i = 0; i < r->n_pages; i++) {
        lms_kv_page_info pi;
        memset(&pi, 0, sizeof pi);
        pi.index = i;
        memcpy(pi.key, lms__session_page_key(r, i), 16);
        pi.n_tokens = LMS_MIN(r->page_tokens, r->n_tokens - i * r->page_tokens);
        pi.segment = UINT32_MAX;
        MDB_val v;
        lms__kvpage_rec pr;
        lms__blob_rec b;
        rc = lms__db_get(s, txn, LMS__DB_KVPAGES, pi.key, 16, &v);
        if (rc == 0 && lms__kvpage_rec_decode(v.mv_data, v.mv_size, &pr) == 0) {
            pi.present = true;
            pi.codec = (lms_kv_codec)pr.codec;
            pi.raw_size = pr.raw_size;
            pi.stored_size = pr.stored_size;
            if (lms__blob_get(s, txn, pr.blob, &b) == 0) {
                pi.segment = b.segment;
                pi.offset = b.offset;
            } else {
                pi.present = false;
            }
        } else if (rc && rc != LMS_ENOENT) {
            return rc;
        }
        if (!pi.present)
            info->missing_pages++;
        info->raw_bytes += pi.raw_size;
        info->stored_bytes += pi.stored_size;
        if (page_cb && (rc = page_cb(ctx, &pi)))
            return rc;
    }
    return 0;
}

int lms_kv_sessions(lms_store *store, lms_kv_session_cb cb, void *ctx)
{
    MDB_txn *txn;
    MDB_cursor *cur = NULL;
    int rc = lms__txn_read(store, &txn);
    if (rc)
        return rc;
    int mrc = mdb_cursor_open(txn, store->dbi[LMS__DB_SESSIONS], &cur);
    if (mrc) {
        rc = lms__mdb_err(mrc, "%s: sessions cursor", store->index_path);
        goto out;
    }
    MDB_val k, v;
    char name[LMS__SESSION_NAME_MAX + 1];
    for (mrc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); mrc == 0; mrc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        size_t n = LMS_MIN(k.mv_size, sizeof name - 1);
        memcpy(name, k.mv_data, n);
        name[n] = '\0';
        lms_kv_session_info info;
        lms__session_rec r;
        rc = describe(store, txn, name, v.mv_data, v.mv_size, &info, &r, NULL, NULL);
        if (rc && rc != LMS_ECORRUPT && rc != LMS_EVERSION)
            goto out;
        if ((rc = cb(ctx, &info)))
            goto out;
    }
    rc = (mrc == MDB_NOTFOUND) ? 0 : lms__mdb_err(mrc, "%s: sessions cursor", store->index_path);
out:
    if (cur)
        mdb_cursor_close(cur);
    lms__txn_end(store, txn);
    return rc;
}

int lms_kv_session(lms_store *store, const char *name, lms_kv_session_cb cb, lms_kv_page_cb page_cb, void *ctx)
{
    MDB_txn *txn;
    if (!name || !*name)
        return lms__err(LMS_EINVAL, "KV session: empty name");
    int rc = lms__txn_read(store, &txn);
    if (rc)
        return rc;
    MDB_val v;
    rc = lms__db_get(store, txn, LMS__DB_SESSIONS, name, strlen(name), &v);
    if (rc == LMS_ENOENT)
        rc = lms__err(LMS_ENOENT, "KV session '%s' not found in %s", name, lms_store_path(store));
    if (rc)
        goto out;
    lms_kv_session_info info;
    lms__session_rec r;
    if ((rc = describe(store, txn, name, v.mv_data, v.mv_size, &info, &r, page_cb, ctx)))
        goto out;
    if (cb)
        rc = cb(ctx, &info);
out:
    lms__txn_end(store, txn);
    return rc;
}

static int rm_txn(lms_store *s, MDB_txn *txn, void *arg)
{
    const char *name = arg;
    int rc = lms__db_del(s, txn, LMS__DB_SESSIONS, name, strlen(name));
    if (rc == LMS_ENOENT)
        return lms__err(LMS_ENOENT, "KV session '%s' not found in %s", name, s->path);
    return rc;
}

int lms_kv_session_rm(lms_store *store, const char *name)
{
    if (!name || !*name)
        return lms__err(LMS_EINVAL, "KV session: empty name");
    return lms__txn_write(store, rm_txn, (void *)name);
}
