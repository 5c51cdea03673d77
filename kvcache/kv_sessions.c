/*
 * kvcache/kv_sessions.c - listing, describing and removing saved KV sessions
 * (what `lmstore kv ls|info|rm` shows), read from one snapshot of the
 * store's KV index (store/kv_index.h).
 */
#include <stdio.h>
#include <string.h>

#include "kvcache/kv_internal.h"
#include "store/kv_index.h"

/* Fill info from a decoded record (dec_rc: the decoder's result); sums page
 * sizes when the page records are there. */
static int describe(lms__kv_reader *rd, const char *name, int dec_rc, const lms__session_rec *r,
                    lms_kv_session_info *info, lms_kv_page_cb page_cb, void *ctx)
{
    memset(info, 0, sizeof *info);
    info->name = name;
    info->version = r->version;
    if (dec_rc)
        return dec_rc;
    memcpy(info->model_id, r->model_id, LMS_MODEL_ID_LEN);
    info->layout.n_layers = r->n_layers;
    info->layout.n_kv_heads = r->n_kv_heads;
    info->layout.head_dim = r->head_dim;
    info->layout.dtype = (lms_dtype)r->dtype;
    info->layout.page_tokens = r->page_tokens;
    info->layout.window = r->window;
    info->layout.sliding = r->sliding;
    info->n_tokens = r->n_tokens;
    info->n_pages = r->n_pages;
    info->n_window_pages = r->n_window_pages;
    info->created = r->created;
    info->last_used = r->last_used;
    for (uint32_t k = 0; k < lms__session_n_keys(r); k++) {
        lms_kv_page_info pi;
        memset(&pi, 0, sizeof pi);
        pi.window = k >= r->n_pages; /* the window pages follow the pages (kv_persist.c design note 5) */
        pi.index = pi.window ? k - r->n_window_pages : k;
        memcpy(pi.key, lms__session_page_key(r, k), 16);
        pi.n_tokens = LMS_MIN(r->page_tokens, r->n_tokens - pi.index * r->page_tokens);
        pi.segment = UINT32_MAX;
        lms__kv_page_loc loc;
        int rc = lms__kv_read_page(rd, pi.key, &loc);
        if (rc == 0) {
            pi.present = loc.has_blob;
            pi.codec = (lms_kv_codec)loc.rec.codec;
            pi.raw_size = loc.rec.raw_size;
            pi.stored_size = loc.rec.stored_size;
            if (loc.has_blob) {
                pi.segment = loc.segment;
                pi.offset = loc.offset;
            }
        } else if (rc != LMS_ENOENT && rc != LMS_ECORRUPT && rc != LMS_EVERSION) {
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

typedef struct list_ctx {
    lms_kv_session_cb cb;
    void *ctx;
} list_ctx;

static int list_one(void *arg, lms__kv_reader *rd, const char *name, int dec_rc, const lms__session_rec *r)
{
    list_ctx *l = arg;
    lms_kv_session_info info;
    int rc = describe(rd, name, dec_rc, r, &info, NULL, NULL);
    if (rc && rc != LMS_ECORRUPT && rc != LMS_EVERSION)
        return rc;
    return l->cb(l->ctx, &info);
}

int lms_kv_sessions(lms_store *store, lms_kv_session_cb cb, void *ctx)
{
    lms__kv_reader *rd;
    int rc = lms__kv_read_begin(store, &rd);
    if (rc)
        return rc;
    list_ctx l = {cb, ctx};
    rc = lms__kv_read_sessions(rd, list_one, &l);
    lms__kv_read_end(rd);
    return rc;
}

int lms_kv_session(lms_store *store, const char *name, lms_kv_session_cb cb, lms_kv_page_cb page_cb, void *ctx)
{
    if (!name || !*name)
        return lms__err(LMS_EINVAL, "KV session: empty name");
    lms__kv_reader *rd;
    int rc = lms__kv_read_begin(store, &rd);
    if (rc)
        return rc;
    lms__session_rec r;
    rc = lms__kv_read_session(rd, name, &r);
    if (rc == LMS_ENOENT)
        goto out;
    lms_kv_session_info info;
    if ((rc = describe(rd, name, rc, &r, &info, page_cb, ctx)))
        goto out;
    if (cb)
        rc = cb(ctx, &info);
out:
    lms__kv_read_end(rd);
    return rc;
}

int lms_kv_session_rm(lms_store *store, const char *name)
{
    if (!name || !*name)
        return lms__err(LMS_EINVAL, "KV session: empty name");
    return lms__kv_remove(store, name);
}
