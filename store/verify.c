/*
 * store/verify.c - `lmstore verify`: checks the index against itself and
 * against the segment files, and recomputes every blob's XXH3-128 from a
 * shared mapping on several threads (lmstore/store.h, guarantee 3).
 *
 * One read snapshot gives the records; the segments holding the blobs to
 * hash are mapped (with the readers' shared lock, so gc leaves them alone)
 * before the snapshot ends, then hashed outside it so a long verify does
 * not pin old LMDB pages. Problems are reported in a fixed order: index
 * problems as found, then corrupt blobs in (segment, offset) order, each
 * naming every model and tensor that uses the blob.
 */
#include <fcntl.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <xxh_x86dispatch.h>
#include <xxhash.h>

#include "common/common.h"
#include "lmstore/store.h"
#include "store/admin_internal.h"
#include "store/store_internal.h"
#include "store/tokimg.h"

lms_verify_params lms_verify_default_params(void)
{
    lms_verify_params p = {0};
    p.hash = true;
    return p;
}

/* ---- state ---------------------------------------------------------------------- */

typedef struct vtensor {
    char *model;  /* owned */
    char *name;   /* owned */
    size_t blob;  /* index into blobs; SIZE_MAX when its blob is not in the index */
    lms__tensor_rec rec;
} vtensor;

typedef struct vstate {
    lms_store *s;
    const lms_verify_params *p;
    lms_verify_cb cb;
    void *ctx;
    lms_verify_report *rep;
    lms__blobset blobs;
    vtensor *tensors;        /* in key order: a model's tensors are contiguous */
    size_t n_tensors, cap_tensors;
    lms__kvset kv;           /* sessions and KV pages (not with params->model) */
    lms__segset segs;
    size_t *order;           /* blobs to hash, largest first */
    size_t n_order;
    lms_progress *progress;
    atomic_uint_fast64_t hashed;
} vstate;

static void problem(vstate *v, const char *kind, const char *model, const char *item, uint32_t seg, uint64_t off,
                    const char *fmt, ...) LMS_PRINTF(7, 8);

static void problem(vstate *v, const char *kind, const char *model, const char *item, uint32_t seg, uint64_t off,
                    const char *fmt, ...)
{
    if (v->p->model && model && strcmp(model, v->p->model) != 0)
        return; /* another model's business */
    char detail[1400];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(detail, sizeof detail, fmt, ap);
    va_end(ap);
    v->rep->problems++;
    if (v->cb) {
        lms_verify_problem pr = {kind, model, item, seg, off, detail};
        v->cb(v->ctx, &pr);
    }
}

static bool model_wanted(vstate *v, const char *model)
{
    return !v->p->model || strcmp(model, v->p->model) == 0;
}

/* ---- index pass --------------------------------------------------------------------- */

typedef struct vmodel {
    char *name;
    lms__model_rec rec;  /* strings not used after the snapshot */
    uint64_t seen_tensors, seen_bytes, seen_params, seen_files;
    uint32_t seen_mask;
    size_t t_first, t_count; /* its tensors in vstate.tensors */
    bool tensors_bad;    /* a tensor record of it fails its checksum or does not decode */
    char *config;        /* config.json as stored (owned), NULL when none */
    size_t config_len;
    bool config_bad;     /* config.json's record fails */
    bool bad;
} vmodel;

static int cmp_vmodel(const void *a, const void *b)
{
    return strcmp(((const vmodel *)a)->name, ((const vmodel *)b)->name);
}

static vmodel *find_model(vmodel *models, size_t n, const char *name)
{
    vmodel key = {.name = (char *)name};
    return n ? bsearch(&key, models, n, sizeof *models, cmp_vmodel) : NULL;
}

static int add_tensor(vstate *v, const char *model, size_t mlen, const char *name, size_t nlen, size_t blob,
                      const lms__tensor_rec *rec)
{
    if (v->n_tensors == v->cap_tensors) {
        size_t cap = v->cap_tensors ? v->cap_tensors * 2 : 256;
        vtensor *t = lms__realloc(v->tensors, cap * sizeof *t);
        if (!t)
            return LMS_ENOMEM;
        v->tensors = t;
        v->cap_tensors = cap;
    }
    vtensor *t = &v->tensors[v->n_tensors];
    t->model = lms__strndup(model, mlen);
    t->name = lms__strndup(name, nlen);
    t->blob = blob;
    t->rec = *rec;
    if (!t->model || !t->name) {
        lms__free(t->model);
        lms__free(t->name);
        return LMS_ENOMEM;
    }
    v->n_tensors++;
    return 0;
}

static void kv_problem(void *ctx, const char *session, const char *detail)
{
    vstate *v = ctx;
    problem(v, "kv", session, NULL, UINT32_MAX, 0, "%s", detail);
}

/*
 * Walk every "model NUL item" record of db (tensors, files) in key order: a
 * record failing its checksum or with a malformed key is a problem and
 * skipped; fn gets the model and item names NUL-terminated (valid during
 * the call) and the record. Stops at fn's first non-zero return (ENOMEM:
 * the check cannot go on) and returns it.
 */
typedef int (*item_fn)(vstate *v, vmodel *models, size_t n_models, const char *model, size_t mlen,
                       const char *item, const MDB_val *d);

static int each_item(vstate *v, MDB_txn *txn, int db, vmodel *models, size_t n_models, item_fn fn)
{
    lms_store *s = v->s;
    MDB_cursor *cur;
    MDB_val k, d;
    char name[LMS__MODEL_NAME_MAX + LMS__ITEM_NAME_MAX + 2];
    int rc = 0, check, mrc = mdb_cursor_open(txn, s->dbi[db], &cur);
    if (mrc)
        return lms__mdb_err(mrc, "%s: cursor", s->index_path);
    for (mrc = lms__cursor_get(s, cur, db, &k, &d, MDB_FIRST, &check); mrc == 0;
         mrc = lms__cursor_get(s, cur, db, &k, &d, MDB_NEXT, &check)) {
        size_t mlen;
        bool split = lms__key_split(k.mv_data, k.mv_size, &mlen) && k.mv_size < sizeof name;
        if (split) {
            memcpy(name, k.mv_data, k.mv_size);
            name[k.mv_size] = '\0';
        }
        if (check) {
            vmodel *m = split ? find_model(models, n_models, name) : NULL;
            if (m && db == LMS__DB_TENSORS)
                m->tensors_bad = true;
            if (m && db == LMS__DB_FILES && !strcmp(name + mlen + 1, "config.json"))
                m->config_bad = true;
            problem(v, "record", split ? name : NULL, split ? name + mlen + 1 : NULL, UINT32_MAX, 0, "%s",
                    lms_last_error());
            continue;
        }
        if (!split) {
            problem(v, "record", NULL, NULL, UINT32_MAX, 0, "%s: malformed key of %zu bytes", lms__db_names[db],
                    k.mv_size);
            continue;
        }
        if ((rc = fn(v, models, n_models, name, mlen, name + mlen + 1, &d)))
            break;
    }
    mdb_cursor_close(cur);
    if (!rc && mrc != MDB_NOTFOUND)
        rc = lms__mdb_err(mrc, "%s: read %s", s->index_path, lms__db_names[db]);
    return rc;
}

/* item_fn for tensors: each must reach an existing tensor blob of its size; count references. */
static int check_tensor(vstate *v, vmodel *models, size_t n_models, const char *model, size_t mlen,
                        const char *tname, const MDB_val *d)
{
    bool wanted = model_wanted(v, model);
    if (wanted)
        v->rep->tensors++;
    vmodel *m = find_model(models, n_models, model);
    if (!m)
        problem(v, "record", model, tname, UINT32_MAX, 0,
                "tensor '%s' belongs to model '%s', which has no model record", tname, model);
    size_t tlen = strlen(tname);
    if (tlen == 0 || tlen > LMS__ITEM_NAME_MAX || !lms__utf8_valid(tname, tlen))
        problem(v, "record", model, tname, UINT32_MAX, 0, "model '%s': a tensor name is empty, too long or not UTF-8",
                model);
    lms__tensor_rec tr;
    if (lms__tensor_rec_decode(d->mv_data, d->mv_size, &tr)) {
        if (m)
            m->tensors_bad = true;
        problem(v, "record", model, tname, UINT32_MAX, 0, "model '%s' tensor '%s': %s", model, tname,
                lms_last_error());
        return 0;
    }
    if (m) {
        if (!m->t_count)
            m->t_first = v->n_tensors;
        m->t_count++;
        m->seen_tensors++;
        m->seen_bytes += tr.nbytes;
        uint64_t ne = 1;
        for (uint32_t i = 0; i < tr.ndim; i++)
            ne *= tr.shape[i];
        m->seen_params += ne;
        m->seen_mask |= 1u << tr.dtype;
    }
    size_t bi;
    if (!lms__blobset_find(&v->blobs, tr.hash, &bi)) {
        char hex[33];
        lms__admin_hex16(tr.hash, hex);
        problem(v, "missing-blob", model, tname, UINT32_MAX, 0,
                "model '%s' tensor '%s': its blob %s is not in the index", model, tname, hex);
        return add_tensor(v, model, mlen, tname, tlen, SIZE_MAX, &tr);
    }
    lms__blobent *b = &v->blobs.v[bi];
    b->counted++;
    if (wanted)
        b->wanted = true;
    if (!b->bad && b->rec.size != tr.nbytes)
        problem(v, "record", model, tname, b->rec.segment, b->rec.offset,
                "model '%s' tensor '%s' is %llu bytes but its blob is %llu bytes", model, tname,
                (unsigned long long)tr.nbytes, (unsigned long long)b->rec.size);
    else if (!b->bad && b->rec.kind != LMS__BLOB_TENSOR)
        problem(v, "record", model, tname, b->rec.segment, b->rec.offset,
                "model '%s' tensor '%s': its blob is recorded as a KV page", model, tname);
    return add_tensor(v, model, mlen, tname, tlen, bi, &tr);
}

/* item_fn for side files: decodable, decompress to their recorded size and checksum. */
static int check_file(vstate *v, vmodel *models, size_t n_models, const char *model, size_t mlen,
                      const char *fname, const MDB_val *d)
{
    (void)mlen;
    vmodel *m = find_model(models, n_models, model);
    if (m)
        m->seen_files++;
    if (!model_wanted(v, model))
        return 0;
    if (!m)
        problem(v, "record", model, fname, UINT32_MAX, 0,
                "file '%s' belongs to model '%s', which has no model record", fname, model);
    bool config = !strcmp(fname, "config.json");
    lms__file_rec fr;
    char *data = NULL;
    size_t len = 0;
    int frc = lms__file_rec_decode(d->mv_data, d->mv_size, &fr);
    if (!frc && fr.raw_size > (1ull << 32))
        frc = lms__err(LMS_ECORRUPT, "file record: raw size %llu out of range",
                       (unsigned long long)fr.raw_size);
    if (!frc)
        frc = lms__file_rec_inflate(&fr, fname, &data, &len);
    if (!frc && !strcmp(fname, LMS__TOKREF_NAME)) /* and the compiled tokenizer it names */
        frc = lms__tokimg_check(v->s, data, len, v->p->hash);
    if (frc == LMS_ENOMEM)
        return frc;
    if (frc) {
        if (m && config)
            m->config_bad = true;
        problem(v, "file", model, fname, UINT32_MAX, 0, "model '%s' file '%s': %s", model, fname,
                lms_last_error());
    } else if (m && config && !m->config) {
        m->config = data; /* for the model id */
        m->config_len = len;
        data = NULL;
    }
    lms__free(data);
    return 0;
}

/*
 * What a model record says against what its tensor and file records hold:
 * counts and totals, the storage order, and the model id, a hash over
 * config.json and every tensor's name, dtype, shape, size and blob
 * (docs/FORMAT.md 3.2): a tensor record or config.json that changed under
 * the model (a flipped dtype, shape or name) gives another id.
 */
static int check_model(vstate *v, vmodel *m)
{
    if (m->bad || !model_wanted(v, m->name))
        return 0;
    if (m->seen_tensors != m->rec.n_tensors || m->seen_bytes != m->rec.tensor_bytes)
        problem(v, "model", m->name, NULL, UINT32_MAX, 0,
                "model '%s' records %llu tensors (%llu bytes) but the index holds %llu (%llu bytes)", m->name,
                (unsigned long long)m->rec.n_tensors, (unsigned long long)m->rec.tensor_bytes,
                (unsigned long long)m->seen_tensors, (unsigned long long)m->seen_bytes);
    else if (!m->tensors_bad && (m->seen_params != m->rec.n_params || m->seen_mask != m->rec.dtype_mask))
        problem(v, "model", m->name, NULL, UINT32_MAX, 0,
                "model '%s' records %llu parameters (dtype mask 0x%x) but its tensors hold %llu (0x%x)", m->name,
                (unsigned long long)m->rec.n_params, m->rec.dtype_mask, (unsigned long long)m->seen_params,
                m->seen_mask);
    if (m->seen_files != m->rec.n_files)
        problem(v, "model", m->name, NULL, UINT32_MAX, 0, "model '%s' records %u side files but the index holds %llu",
                m->name, m->rec.n_files, (unsigned long long)m->seen_files);
    if (m->tensors_bad || m->config_bad || m->seen_tensors != m->rec.n_tensors)
        return 0; /* reported already; the id below would only repeat it */
    uint8_t *seen = lms__calloc(m->t_count ? m->t_count : 1, 1);
    lms__id_tensor *ids = lms__calloc(m->t_count ? m->t_count : 1, sizeof *ids);
    if (!seen || !ids) {
        lms__free(seen);
        lms__free(ids);
        return LMS_ENOMEM;
    }
    bool order_ok = true;
    for (size_t i = 0; i < m->t_count; i++) {
        const vtensor *t = &v->tensors[m->t_first + i];
        ids[i] = (lms__id_tensor){t->name, &t->rec};
        if (t->rec.order >= m->t_count || seen[t->rec.order]++)
            order_ok = false;
    }
    if (!order_ok)
        problem(v, "model", m->name, NULL, UINT32_MAX, 0,
                "model '%s': its tensors' storage orders are not 0 .. %zu, each once", m->name,
                m->t_count ? m->t_count - 1 : 0);
    uint8_t id[16];
    int rc = lms__model_id(m->config, m->config_len, ids, m->t_count, id);
    if (!rc && memcmp(id, m->rec.id, 16) != 0) {
        char a[33], b[33];
        lms__admin_hex16(m->rec.id, a);
        lms__admin_hex16(id, b);
        problem(v, "model", m->name, NULL, UINT32_MAX, 0,
                "model '%s': its id is %s but its config.json and tensor records (names, dtypes, shapes, blobs) "
                "give %s: one of them changed under it",
                m->name, a, b);
    }
    lms__free(seen);
    lms__free(ids);
    return rc;
}

/* Bytes of one element of a session's dtype (F16, BF16, F32), else 0. */
static uint32_t kv_elem_size(uint32_t dtype)
{
    return dtype == LMS_DTYPE_F16 || dtype == LMS_DTYPE_BF16 ? 2 : dtype == LMS_DTYPE_F32 ? 4 : 0;
}

/* KV pages hold references to their blobs; sessions name pages that must be
 * stored and agree with them. */
static void check_kv(vstate *v)
{
    lms__kvset *ks = &v->kv;
    char hex[33], bhex[33];
    for (size_t i = 0; i < ks->n_pages; i++) {
        lms__kvpage_ent *pe = &ks->pages[i];
        if (pe->bad)
            continue;
        lms__admin_hex16(pe->key, hex);
        size_t bi;
        if (!lms__blobset_find(&v->blobs, pe->rec.blob, &bi)) {
            lms__admin_hex16(pe->rec.blob, bhex);
            problem(v, "kv", NULL, NULL, UINT32_MAX, 0, "KV page %s: its blob %s is not in the index", hex, bhex);
            continue;
        }
        lms__blobent *b = &v->blobs.v[bi];
        b->counted++;
        if (!b->bad && (b->rec.size != pe->rec.stored_size || b->rec.kind != LMS__BLOB_KVPAGE))
            problem(v, "kv", NULL, NULL, b->rec.segment, b->rec.offset,
                    "KV page %s: stored size %llu but its blob is %llu bytes of kind %u", hex,
                    (unsigned long long)pe->rec.stored_size, (unsigned long long)b->rec.size, b->rec.kind);
    }
    for (size_t i = 0; i < v->blobs.n; i++)
        if (!v->blobs.v[i].bad && v->blobs.v[i].rec.kind == LMS__BLOB_KVPAGE)
            v->blobs.v[i].count_known = true;
    for (size_t i = 0; i < ks->n_sess; i++) {
        const lms__kvsess_ent *se = &ks->sess[i];
        if (se->dec_rc)
            continue; /* reported by lms__kvset_load */
        const lms__session_rec *r = &se->rec;
        uint32_t es = kv_elem_size(r->dtype);
        /* keys n_pages.. are the window group's pages: those of the last `window` positions */
        uint32_t first = r->window && r->n_tokens > r->window ? (r->n_tokens - r->window) / r->page_tokens : 0;
        for (uint32_t p = 0; p < lms__session_n_keys(r); p++) {
            uint32_t at = p < r->n_pages ? p : first + (p - r->n_pages); /* the page's place in the sequence */
            lms__kvpage_ent *pe = lms__kvset_page(ks, lms__session_page_key(r, p));
            lms__admin_hex16(lms__session_page_key(r, p), hex);
            if (!pe) {
                problem(v, "kv", se->name, NULL, UINT32_MAX, 0, "session '%s': page %u (%s) is not stored", se->name,
                        p, hex);
                break;
            }
            if (pe->bad) {
                problem(v, "kv", se->name, NULL, UINT32_MAX, 0, "session '%s': the record of page %u (%s) is damaged",
                        se->name, p, hex);
                continue;
            }
            uint32_t n = LMS_MIN(r->page_tokens, r->n_tokens - at * r->page_tokens);
            if (pe->rec.n_tokens != n || pe->rec.elem_size != es)
                problem(v, "kv", se->name, NULL, UINT32_MAX, 0,
                        "session '%s': page %u (%s) holds %u tokens of %u-byte elements, the session says %u of %u",
                        se->name, p, hex, pe->rec.n_tokens, pe->rec.elem_size, n, es);
        }
    }
}

static int index_pass(vstate *v, MDB_txn *txn, vmodel **models_out, size_t *n_models_out)
{
    lms_store *s = v->s;
    vmodel *models = NULL;
    size_t n_models = 0, cap_models = 0;
    MDB_cursor *cur = NULL;
    MDB_val k, d;
    int rc = 0, mrc, check;

    /* meta: read at open; here only their checksums */
    if ((mrc = mdb_cursor_open(txn, s->dbi[LMS__DB_META], &cur)))
        return lms__mdb_err(mrc, "%s: cursor", s->index_path);
    for (mrc = lms__cursor_get(s, cur, LMS__DB_META, &k, &d, MDB_FIRST, &check); mrc == 0;
         mrc = lms__cursor_get(s, cur, LMS__DB_META, &k, &d, MDB_NEXT, &check))
        if (check && !(k.mv_size == 6 && !memcmp(k.mv_data, "format", 6))) /* format: checked at open */
            problem(v, "record", NULL, NULL, UINT32_MAX, 0, "%s", lms_last_error());
    mdb_cursor_close(cur);
    cur = NULL;
    if (mrc != MDB_NOTFOUND)
        return lms__mdb_err(mrc, "%s: read meta", s->index_path);

    /* models */
    if ((mrc = mdb_cursor_open(txn, s->dbi[LMS__DB_MODELS], &cur)))
        return lms__mdb_err(mrc, "%s: cursor", s->index_path);
    for (mrc = lms__cursor_get(s, cur, LMS__DB_MODELS, &k, &d, MDB_FIRST, &check); mrc == 0;
         mrc = lms__cursor_get(s, cur, LMS__DB_MODELS, &k, &d, MDB_NEXT, &check)) {
        if (n_models == cap_models) {
            size_t cap = cap_models ? cap_models * 2 : 16;
            vmodel *m = lms__realloc(models, cap * sizeof *m);
            if (!m) {
                rc = LMS_ENOMEM;
                goto out;
            }
            models = m;
            cap_models = cap;
        }
        vmodel *m = &models[n_models];
        memset(m, 0, sizeof *m);
        m->name = lms__strndup(k.mv_data, k.mv_size);
        if (!m->name) {
            rc = LMS_ENOMEM;
            goto out;
        }
        n_models++;
        if (check || lms__model_rec_decode(d.mv_data, d.mv_size, &m->rec)) {
            m->bad = true;
            if (check)
                problem(v, "record", m->name, NULL, UINT32_MAX, 0, "%s", lms_last_error());
            else
                problem(v, "record", m->name, NULL, UINT32_MAX, 0, "model '%s': %s", m->name, lms_last_error());
        } else if (k.mv_size == 0 || k.mv_size > LMS__MODEL_NAME_MAX || !lms__utf8_valid(k.mv_data, k.mv_size) ||
                   memchr(k.mv_data, '\0', k.mv_size)) {
            problem(v, "record", m->name, NULL, UINT32_MAX, 0, "a model name is empty, too long or not UTF-8");
        }
    }
    mdb_cursor_close(cur);
    cur = NULL;
    if (mrc != MDB_NOTFOUND) {
        rc = lms__mdb_err(mrc, "%s: read models", s->index_path);
        goto out;
    }
    if (v->p->model && !find_model(models, n_models, v->p->model)) {
        rc = lms__err(LMS_ENOENT, "no model '%s' in %s", v->p->model, s->path);
        goto out;
    }
    v->rep->models = v->p->model ? 1 : n_models;

    /* tensors: each must reach an existing blob of its size; count references */
    if ((rc = each_item(v, txn, LMS__DB_TENSORS, models, n_models, check_tensor)))
        goto out;
    /* side files: decodable, decompress to their recorded size and checksum */
    if ((rc = each_item(v, txn, LMS__DB_FILES, models, n_models, check_file)))
        goto out;
    for (size_t i = 0; i < n_models; i++)
        if ((rc = check_model(v, &models[i])))
            goto out;

    /* KV pages hold references too; sessions name pages (all of them a
     * whole-store check: a KV session is no model's) */
    if ((rc = lms__kvset_load(s, txn, &v->kv, v->p->model ? NULL : kv_problem, v)))
        goto out;
    if (!v->p->model)
        check_kv(v);
    else
        for (size_t i = 0; i < v->kv.n_pages; i++) { /* still count: their blobs' counts include them */
            size_t bi;
            if (!v->kv.pages[i].bad && lms__blobset_find(&v->blobs, v->kv.pages[i].rec.blob, &bi))
                v->blobs.v[bi].counted++;
        }
out:
    if (cur)
        mdb_cursor_close(cur);
    *models_out = models;
    *n_models_out = n_models;
    return rc;
}

/* Blob records against the counts and the segment files. */
static void blob_checks(vstate *v)
{
    lms_store *s = v->s;
    lms__blobset *bs = &v->blobs;
    if (v->p->model) /* KV blobs' counts were counted (above) */
        for (size_t i = 0; i < bs->n; i++)
            if (!bs->v[i].bad && bs->v[i].rec.kind == LMS__BLOB_KVPAGE)
                bs->v[i].count_known = true;
    for (size_t i = 0; i < bs->n; i++) {
        lms__blobent *b = &bs->v[i];
        char hex[33];
        lms__admin_hex16(b->hash, hex);
        bool relevant = !v->p->model || b->wanted;
        if (b->bad) {
            if (relevant)
                problem(v, "record", NULL, NULL, UINT32_MAX, 0, "blobs record %s %s", hex,
                        b->sum_bad ? "fails its checksum (the index is damaged)" : "does not decode");
            continue;
        }
        if (b->rec.refs != b->counted && relevant && b->count_known)
            problem(v, "refcount", NULL, NULL, b->rec.segment, b->rec.offset,
                    "blob %s records %llu references but %llu records reference it", hex,
                    (unsigned long long)b->rec.refs, (unsigned long long)b->counted);
        if (!v->p->model && b->rec.refs == 0 && b->counted == 0)
            v->rep->garbage_bytes += b->rec.size;
        lms__segent *g = lms__segset_find(&v->segs, b->rec.segment);
        if (!g) {
            if (relevant)
                problem(v, "blob-range", NULL, NULL, b->rec.segment, b->rec.offset,
                        "blob %s lies in segment %u, which does not exist", hex, b->rec.segment);
            b->bad = true;
            continue;
        }
        g->has_blobs = true;
        g->wanted |= relevant;
        uint64_t end = b->rec.offset + b->rec.size; /* no overflow: the decoder checked */
        if (b->rec.offset % s->alignment || b->rec.offset < LMS__SEG_HEADER_SIZE || end > g->size) {
            if (relevant)
                problem(v, "blob-range", NULL, NULL, b->rec.segment, b->rec.offset,
                        "blob %s at offset %llu (%llu bytes) is misaligned or outside segment %u (%llu bytes)",
                        hex, (unsigned long long)b->rec.offset, (unsigned long long)b->rec.size, b->rec.segment,
                        (unsigned long long)g->size);
            b->bad = true;
            continue;
        }
        if (end > g->live_end)
            g->live_end = end;
    }
    /* overlaps: sort by place, compare neighbours */
    size_t *idx = lms__blobset_by_place(bs);
    if (idx) {
        for (size_t j = 1; j < bs->n; j++) {
            lms__blobent *a = &bs->v[idx[j - 1]], *b = &bs->v[idx[j]];
            if (a->bad || b->bad || a->rec.segment != b->rec.segment)
                continue;
            if (a->rec.offset + a->rec.size > b->rec.offset && b->rec.size && a->rec.size) {
                bool relevant = !v->p->model || a->wanted || b->wanted;
                if (relevant)
                    problem(v, "blob-overlap", NULL, NULL, b->rec.segment, b->rec.offset,
                            "two blobs overlap in segment %u at offset %llu", b->rec.segment,
                            (unsigned long long)b->rec.offset);
            }
        }
        lms__free(idx);
    }
    /* segment headers; segments no blob uses are garbage for gc */
    for (size_t i = 0; i < v->segs.n; i++) {
        lms__segent *g = &v->segs.v[i];
        v->rep->segments++;
        if (!g->has_blobs) {
            if (!v->p->model)
                v->rep->garbage_bytes += g->size;
            continue;
        }
        if (!g->header_ok && g->wanted)
            problem(v, "segment-header", NULL, NULL, g->id, 0, "%s", g->header_err);
        if (!v->p->model && g->size > lms__align_up(g->live_end, s->alignment))
            v->rep->garbage_bytes += g->size - lms__align_up(g->live_end, s->alignment);
    }
}

/* ---- hashing -------------------------------------------------------------------- */

/* Hashing uses libxxhash's runtime-dispatched XXH3 (AVX2 / AVX-512 where
 * the CPU has them; the same digests as lms__hasher, which the import uses),
 * since verify is bound by hashing speed when the pages are cached. */
typedef struct vworker {
    vstate *v;
    XXH3_state_t **hashers; /* one per worker */
} vworker;

#define VERIFY_CHUNK (8u << 20)

static void hash_one(void *arg, size_t i, int worker)
{
    vworker *w = arg;
    vstate *v = w->v;
    lms__blobent *b = &v->blobs.v[v->order[i]];
    lms__segent *g = lms__segset_find(&v->segs, b->rec.segment);
    XXH3_state_t *h = w->hashers[worker];
    XXH3_128bits_reset(h);
    assert(g->map.base && g->map.fd >= 0); /* mapped (share-locked) while the snapshot pinned it */
    const uint8_t *p = g->map.base + b->rec.offset;
    uint64_t left = b->rec.size;
    while (left) {
        size_t n = (size_t)LMS_MIN(left, (uint64_t)VERIFY_CHUNK);
        /* start reading the next chunk while this one is hashed (cold cache) */
        if (left > n) {
            uintptr_t a = (uintptr_t)(p + n) & ~(uintptr_t)4095;
            (void)madvise((void *)a, (size_t)LMS_MIN(left - n, (uint64_t)VERIFY_CHUNK) + 4096, MADV_WILLNEED);
        }
        XXH3_128bits_update_dispatch(h, p, n);
        p += n;
        left -= n;
        lms__progress_add(v->progress, n);
    }
    XXH128_hash_t d = XXH3_128bits_digest(h);
    b->corrupt = !lms__hash128_eq((lms_hash128){d.low64, d.high64}, lms__hash128_get(b->hash));
    atomic_fetch_add(&v->hashed, b->rec.size);
}

static int cmp_size_desc(const void *a, const void *b, void *ctx)
{
    const lms__blobset *bs = ctx;
    uint64_t x = bs->v[*(const size_t *)a].rec.size, y = bs->v[*(const size_t *)b].rec.size;
    return x > y ? -1 : x < y;
}

static int hash_pass(vstate *v)
{
    lms__blobset *bs = &v->blobs;
    int rc = 0;
    v->order = lms__calloc(bs->n ? bs->n : 1, sizeof *v->order);
    if (!v->order)
        return LMS_ENOMEM;
    uint64_t total = 0;
    for (size_t i = 0; i < bs->n; i++) {
        lms__blobent *b = &bs->v[i];
        if (b->bad || (v->p->model && !b->wanted))
            continue;
        lms__segent *g = lms__segset_find(&v->segs, b->rec.segment);
        if (!g || !g->map.base)
            continue;
        v->order[v->n_order++] = i;
        total += b->rec.size;
    }
    qsort_r(v->order, v->n_order, sizeof *v->order, cmp_size_desc, bs);

    lms_pool *pool = NULL;
    vworker w = {v, NULL};
    if ((rc = lms__pool_create(v->p->threads, &pool)))
        return rc;
    int nt = lms__pool_threads(pool);
    w.hashers = lms__calloc((size_t)nt, sizeof *w.hashers);
    if (!w.hashers) {
        rc = LMS_ENOMEM;
        goto out;
    }
    for (int i = 0; i < nt; i++)
        if (!(w.hashers[i] = XXH3_createState())) {
            rc = lms__err(LMS_ENOMEM, "verify: out of memory for hash states");
            goto out;
        }
    if (v->p->progress)
        v->progress = lms__progress_start("verify", total, "B");
    lms__pool_run(pool, v->n_order, hash_one, &w);
    lms__progress_done(v->progress);
    v->progress = NULL;
    v->rep->bytes_hashed = atomic_load(&v->hashed);
    v->rep->blobs = v->n_order;
out:
    if (w.hashers)
        for (int i = 0; i < nt; i++)
            XXH3_freeState(w.hashers[i]);
    lms__free(w.hashers);
    lms__pool_destroy(pool);
    return rc;
}

static void report_corrupt(vstate *v)
{
    /* in place order: stable, readable output */
    size_t *idx = lms__blobset_by_place(&v->blobs);
    if (!idx)
        return;
    for (size_t j = 0; j < v->blobs.n; j++) {
        size_t bi = idx[j];
        lms__blobent *b = &v->blobs.v[bi];
        if (!b->corrupt)
            continue;
        char hex[33];
        lms__admin_hex16(b->hash, hex);
        bool named = false;
        for (size_t t = 0; t < v->n_tensors; t++) {
            if (v->tensors[t].blob != bi)
                continue;
            named = true;
            problem(v, "corrupt", v->tensors[t].model, v->tensors[t].name, b->rec.segment, b->rec.offset,
                    "model '%s' tensor '%s': bytes fail their XXH3-128 (blob %s, segment %u, offset %llu, %llu bytes)",
                    v->tensors[t].model, v->tensors[t].name, hex, b->rec.segment,
                    (unsigned long long)b->rec.offset, (unsigned long long)b->rec.size);
        }
        /* a KV page's bytes: every session whose K/V it holds */
        for (size_t i = 0; i < v->kv.n_sess; i++) {
            const lms__kvsess_ent *se = &v->kv.sess[i];
            for (uint32_t p = 0; !se->dec_rc && p < lms__session_n_keys(&se->rec); p++) {
                const lms__kvpage_ent *pe = lms__kvset_page(&v->kv, lms__session_page_key(&se->rec, p));
                if (!pe || pe->bad || memcmp(pe->rec.blob, b->hash, 16))
                    continue;
                named = true;
                problem(v, "corrupt", se->name, NULL, b->rec.segment, b->rec.offset,
                        "KV session '%s' page %u: bytes fail their XXH3-128 (blob %s, segment %u, offset %llu, %llu "
                        "bytes); the session cannot be resumed",
                        se->name, p, hex, b->rec.segment, (unsigned long long)b->rec.offset,
                        (unsigned long long)b->rec.size);
            }
        }
        if (!named)
            problem(v, "corrupt", NULL, NULL, b->rec.segment, b->rec.offset,
                    "%s blob %s: bytes fail their XXH3-128 (segment %u, offset %llu, %llu bytes)",
                    b->rec.kind == LMS__BLOB_KVPAGE ? "KV page" : "unreferenced", hex, b->rec.segment,
                    (unsigned long long)b->rec.offset, (unsigned long long)b->rec.size);
    }
    lms__free(idx);
}

/* ---- entry ------------------------------------------------------------------------ */

int lms_store_verify(lms_store *s, const lms_verify_params *params, lms_verify_cb cb, void *ctx,
                     lms_verify_report *report)
{
    lms_verify_params defp = lms_verify_default_params();
    lms_verify_report rep0;
    if (!params)
        params = &defp;
    if (!report)
        report = &rep0;
    memset(report, 0, sizeof *report);
    double t0 = lms__now();
    vstate v = {0};
    v.s = s;
    v.p = params;
    v.cb = cb;
    v.ctx = ctx;
    v.rep = report;
    vmodel *models = NULL;
    size_t n_models = 0;
    MDB_txn *txn = NULL;
    int rc = lms__txn_read(s, &txn);
    if (rc)
        return rc;
    if ((rc = lms__blobset_load(s, txn, &v.blobs)))
        goto out;
    if ((rc = index_pass(&v, txn, &models, &n_models)))
        goto out;
    if ((rc = lms__segset_load(s, &v.segs)))
        goto out;
    blob_checks(&v);
    if (params->hash) {
        /* map while the snapshot still pins the blobs: gc cannot unlink them under us */
        for (size_t i = 0; i < v.segs.n; i++) {
            lms__segent *g = &v.segs.v[i];
            if (!g->has_blobs || !g->header_ok)
                continue;
            int mrc = lms__segment_map(s, g->id, &g->map);
            if (mrc == LMS_ENOMEM) { /* a resource of this process, not damage */
                rc = lms__err_prefix(mrc, "verify maps each segment whole: ");
                goto out;
            }
            if (mrc) {
                problem(&v, "segment-header", NULL, NULL, g->id, 0, "%s", lms_last_error());
                continue;
            }
            (void)madvise((void *)g->map.base, (size_t)g->map.size, MADV_SEQUENTIAL);
        }
    }
    lms__txn_end(s, txn);
    txn = NULL;
    uint64_t tok_garbage = 0; /* compiled tokenizers no model names (store/tokimg.h) */
    if (!params->model && (rc = lms__tokimg_garbage(s, &tok_garbage)))
        goto out;
    report->garbage_bytes += tok_garbage;
    if (params->hash) {
        if ((rc = hash_pass(&v)))
            goto out;
        report_corrupt(&v);
    } else {
        for (size_t i = 0; i < v.blobs.n; i++)
            if (!v.p->model || v.blobs.v[i].wanted)
                report->blobs++;
    }
    rc = 0;
out:
    lms__txn_end(s, txn);
    for (size_t i = 0; i < n_models; i++) {
        lms__free(models[i].name);
        lms__free(models[i].config);
    }
    lms__kvset_free(&v.kv);
    lms__free(models);
    for (size_t i = 0; i < v.n_tensors; i++) {
        lms__free(v.tensors[i].model);
        lms__free(v.tensors[i].name);
    }
    lms__free(v.tensors);
    lms__free(v.order);
    lms__segset_free(&v.segs);
    lms__blobset_free(&v.blobs);
    report->seconds = lms__now() - t0;
    return rc;
}
