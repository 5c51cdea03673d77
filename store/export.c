/*
 * store/export.c - `lmstore export`: writes a stored model back out as a
 * HuggingFace folder (lmstore/store.h, guarantee 4): safetensors shards of
 * at most max_shard_size tensor bytes (model.safetensors when one is
 * enough, else model-0000K-of-0000N.safetensors plus
 * model.safetensors.index.json), and the stored side files.
 *
 * Tensors are written in storage (forward-pass) order with the dtype, shape
 * and bytes they were imported with, and the safetensors __metadata__ the
 * import kept, so importing the folder again gives the same model id. Every
 * tensor's bytes are hashed on their way out: a corrupt blob fails the
 * export with the tensor's name instead of producing a bad file.
 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lmstore/store.h"
#include "store/admin_internal.h"

lms_export_params lms_export_default_params(void)
{
    lms_export_params p = {0};
    return p;
}

typedef lms__etensor etensor;

typedef struct exp {
    lms__emodel m;      /* the model's tensors, in storage order, segments mapped */
    const char *model, *dir;
    char **written;     /* files created, for cleanup */
    size_t n_written;
    bool made_dir;
} exp;

static int cmp_order(const void *a, const void *b)
{
    const etensor *x = a, *y = b;
    return x->tr.order < y->tr.order ? -1 : x->tr.order > y->tr.order;
}

/* lms__prefix_fn: append one tensor record of e->model with its blob record. */
static int collect_tensor(lms_store *s, MDB_txn *txn, void *ctx, const char *name, size_t name_len,
                          const MDB_val *d)
{
    lms__emodel *e = ctx;
    int rc;
    if (e->n == e->cap) {
        size_t cap = e->cap ? e->cap * 2 : 64;
        etensor *nt = lms__realloc(e->t, cap * sizeof *nt);
        if (!nt)
            return LMS_ENOMEM;
        e->t = nt;
        e->cap = cap;
    }
    etensor *t = &e->t[e->n];
    memset(t, 0, sizeof *t);
    if (!(t->name = lms__strndup(name, name_len)))
        return LMS_ENOMEM;
    e->n++;
    if ((rc = lms__tensor_rec_decode(d->mv_data, d->mv_size, &t->tr)))
        return lms__err_prefix(rc, "model '%s' tensor '%s': ", e->model, t->name);
    rc = lms__blob_get(s, txn, t->tr.hash, &t->br);
    if (rc == LMS_ENOENT)
        rc = lms__err(LMS_ECORRUPT, "model '%s' tensor '%s': its blob is missing", e->model, t->name);
    return rc;
}

/* One snapshot: model record, tensors, their blobs; the segments are mapped
 * (shared lock) before it ends, so gc cannot take the bytes away. */
int lms__emodel_load(lms_store *s, const char *model, lms__emodel *e)
{
    MDB_txn *txn;
    MDB_val d;
    memset(e, 0, sizeof *e);
    e->s = s;
    e->model = model;
    int rc = lms__txn_read(s, &txn);
    if (rc)
        return rc;
    rc = lms__db_get(s, txn, LMS__DB_MODELS, model, strlen(model), &d);
    if (rc == LMS_ENOENT)
        rc = lms__err(LMS_ENOENT, "no model '%s' in %s", model, s->path);
    if (rc)
        goto out;
    lms__model_rec mr;
    if ((rc = lms__model_rec_decode(d.mv_data, d.mv_size, &mr))) {
        rc = lms__err_prefix(rc, "model '%s': ", model);
        goto out;
    }
    if (mr.st_meta_len && !(e->st_meta = lms__strndup(mr.st_meta, mr.st_meta_len))) {
        rc = LMS_ENOMEM;
        goto out;
    }
    if ((rc = lms__db_prefix_each(s, txn, LMS__DB_TENSORS, model, collect_tensor, e)))
        goto out;
    if ((rc = lms__segset_load(s, &e->segs)))
        goto out;
    for (size_t i = 0; i < e->n; i++) {
        etensor *t = &e->t[i];
        lms__segent *g = lms__segset_find(&e->segs, t->br.segment);
        if (!g) {
            rc = lms__err(LMS_ECORRUPT, "model '%s' tensor '%s': segment %u is missing", model, t->name,
                          t->br.segment);
            goto out;
        }
        if (!g->map.base && (rc = lms__segment_map(s, g->id, &g->map)))
            goto out;
        if (t->br.offset + t->br.size > g->map.size || t->br.size != t->tr.nbytes) {
            rc = lms__err(LMS_ECORRUPT, "model '%s' tensor '%s': blob lies outside segment %u", model, t->name,
                          g->id);
            goto out;
        }
        t->bytes = lms__segmap_at(&g->map, t->br.offset, t->br.size);
    }
    if (e->n)
        qsort(e->t, e->n, sizeof *e->t, cmp_order);
    rc = 0;
out:
    lms__txn_end(s, txn);
    return rc;
}

void lms__emodel_free(lms__emodel *e)
{
    for (size_t i = 0; i < e->n; i++)
        lms__free(e->t[i].name);
    lms__free(e->t);
    lms__free(e->st_meta);
    lms__segset_free(&e->segs);
    memset(e, 0, sizeof *e);
}

static int remember(exp *e, const char *path)
{
    char **w = lms__realloc(e->written, (e->n_written + 1) * sizeof *w);
    if (!w)
        return LMS_ENOMEM;
    e->written = w;
    if (!(w[e->n_written] = lms__strdup(path)))
        return LMS_ENOMEM;
    e->n_written++;
    return 0;
}

static int write_file(exp *e, const char *name, const void *buf, size_t len)
{
    char *path = lms__asprintf("%s/%s", e->dir, name);
    if (!path)
        return LMS_ENOMEM;
    int rc = remember(e, path);
    int fd = rc ? rc : lms__open(path, O_WRONLY | O_CREAT | O_EXCL, 0644);
    if (fd < 0) {
        rc = fd;
    } else {
        rc = lms__pwrite_all(fd, buf, len, 0, path);
        close(fd);
    }
    lms__free(path);
    return rc;
}

/* The safetensors header of shard `k`: tensors in storage order. */
static char *shard_header(exp *e, uint32_t k, size_t *len)
{
    cJSON *root = cJSON_CreateObject();
    if (!root)
        return NULL;
    cJSON *meta = NULL;
    if (e->m.st_meta && e->m.st_meta[0]) {
        meta = cJSON_Parse(e->m.st_meta);
        if (meta && cJSON_IsObject(meta))
            cJSON_AddItemToObject(root, "__metadata__", meta);
        else
            cJSON_Delete(meta);
    }
    for (size_t i = 0; i < e->m.n; i++) {
        etensor *t = &e->m.t[i];
        if (t->shard != k)
            continue;
        cJSON *o = cJSON_CreateObject();
        cJSON *shape = cJSON_CreateArray();
        cJSON *offs = cJSON_CreateArray();
        if (!o || !shape || !offs) {
            cJSON_Delete(o);
            cJSON_Delete(shape);
            cJSON_Delete(offs);
            goto fail;
        }
        cJSON_AddItemToObject(root, t->name, o);
        /* MLX_AFFINE goes out as MLX saves it: U32 words of packed codes */
        bool mlx = t->tr.dtype == LMS_DTYPE_MLX_AFFINE;
        cJSON_AddStringToObject(o, "dtype", mlx ? "U32" : lms_dtype_name(t->tr.dtype));
        for (uint32_t j = 0; j < t->tr.ndim; j++) {
            uint64_t d = t->tr.shape[j];
            if (mlx && j + 1 == t->tr.ndim)
                d = d * t->tr.bits / 32;
            cJSON_AddItemToArray(shape, cJSON_CreateNumber((double)d));
        }
        cJSON_AddItemToObject(o, "shape", shape);
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)t->begin));
        cJSON_AddItemToArray(offs, cJSON_CreateNumber((double)(t->begin + t->tr.nbytes)));
        cJSON_AddItemToObject(o, "data_offsets", offs);
    }
    char *json = cJSON_PrintUnformatted(root);
    cJSON_Delete(root);
    if (!json)
        return NULL;
    /* pad with spaces so the data starts 8-byte aligned, as safetensors does */
    size_t n = strlen(json), padded = (size_t)lms__align_up(n, 8);
    char *out = lms__malloc(padded + 1);
    if (out) {
        memcpy(out, json, n);
        memset(out + n, ' ', padded - n);
        out[padded] = '\0';
        *len = padded;
    }
    free(json);
    return out;
fail:
    cJSON_Delete(root);
    return NULL;
}

#define EXPORT_CHUNK (8u << 20)

static int write_shard(exp *e, uint32_t k, const char *name, lms_hasher *h, lms_progress *prog)
{
    size_t hlen = 0;
    char *hdr = shard_header(e, k, &hlen);
    if (!hdr)
        return lms__err(LMS_ENOMEM, "export: out of memory building the header of %s", name);
    char *path = lms__asprintf("%s/%s", e->dir, name);
    int rc = path ? remember(e, path) : LMS_ENOMEM;
    int fd = -1;
    if (rc)
        goto out;
    if ((fd = lms__open(path, O_WRONLY | O_CREAT | O_EXCL, 0644)) < 0) {
        rc = fd;
        goto out;
    }
    uint8_t len8[8];
    lms__put_u64(len8, hlen);
    if ((rc = lms__pwrite_all(fd, len8, 8, 0, path)) || (rc = lms__pwrite_all(fd, hdr, hlen, 8, path)))
        goto out;
    uint64_t base = 8 + hlen;
    for (size_t i = 0; i < e->m.n; i++) {
        etensor *t = &e->m.t[i];
        if (t->shard != k)
            continue;
        const uint8_t *p = t->bytes;
        lms__hasher_reset(h);
        for (uint64_t done = 0; done < t->tr.nbytes;) {
            size_t n = (size_t)LMS_MIN(t->tr.nbytes - done, (uint64_t)EXPORT_CHUNK);
            lms__hasher_update(h, p + done, n);
            if ((rc = lms__pwrite_all(fd, p + done, n, base + t->begin + done, path)))
                goto out;
            done += n;
            lms__progress_add(prog, n);
        }
        if (!lms__hash128_eq(lms__hasher_digest(h), lms__hash128_get(t->tr.hash))) {
            rc = lms__err(LMS_ECORRUPT,
                          "model '%s' tensor '%s': stored bytes fail their XXH3-128 (segment %u, offset %llu); "
                          "run `lmstore verify`",
                          e->model, t->name, t->br.segment, (unsigned long long)t->br.offset);
            goto out;
        }
    }
out:
    if (fd >= 0)
        close(fd);
    lms__free(path);
    lms__free(hdr);
    return rc;
}

typedef struct files_ctx {
    exp *e;
    char **names;
    size_t n;
    int rc;
} files_ctx;

static int collect_file(void *vctx, const char *file, uint64_t size)
{
    files_ctx *c = vctx;
    (void)size;
    char **v = lms__realloc(c->names, (c->n + 1) * sizeof *v);
    if (!v)
        return c->rc = LMS_ENOMEM;
    c->names = v;
    if (!(v[c->n] = lms__strdup(file)))
        return c->rc = LMS_ENOMEM;
    c->n++;
    return 0;
}

static bool safe_file_name(const char *f)
{
    size_t n = strlen(f);
    if (!n || f[0] == '.' || strchr(f, '/') || strchr(f, '\\'))
        return false;
    /* shards and the index are written from the tensors, never copied */
    if (!strcmp(f, "model.safetensors.index.json"))
        return false;
    return !(n > 12 && !strcmp(f + n - 12, ".safetensors"));
}

static int write_side_files(exp *e, uint64_t *count)
{
    files_ctx c = {e, NULL, 0, 0};
    int rc = lms_store_files(e->m.s, e->model, collect_file, &c);
    if (!rc)
        rc = c.rc;
    for (size_t i = 0; !rc && i < c.n; i++) {
        if (!safe_file_name(c.names[i]))
            continue;
        void *data = NULL;
        size_t len = 0;
        if ((rc = lms_store_file(e->m.s, e->model, c.names[i], &data, &len)))
            break;
        rc = write_file(e, c.names[i], data, len);
        lms_free(data);
        if (!rc)
            (*count)++;
    }
    for (size_t i = 0; i < c.n; i++)
        lms__free(c.names[i]);
    lms__free(c.names);
    return rc;
}

static int write_index(exp *e, uint32_t n_shards, uint64_t total)
{
    cJSON *root = cJSON_CreateObject(), *meta = cJSON_CreateObject(), *map = cJSON_CreateObject();
    int rc = LMS_ENOMEM;
    if (!root || !meta || !map) {
        cJSON_Delete(meta);
        cJSON_Delete(map);
        goto out;
    }
    cJSON_AddItemToObject(root, "metadata", meta);
    cJSON_AddItemToObject(root, "weight_map", map);
    cJSON_AddNumberToObject(meta, "total_size", (double)total);
    for (size_t i = 0; i < e->m.n; i++) {
        char name[64];
        snprintf(name, sizeof name, "model-%05u-of-%05u.safetensors", e->m.t[i].shard + 1, n_shards);
        cJSON_AddStringToObject(map, e->m.t[i].name, name);
    }
    char *json = cJSON_Print(root);
    if (json) {
        rc = write_file(e, "model.safetensors.index.json", json, strlen(json));
        free(json);
    }
out:
    cJSON_Delete(root);
    return rc;
}

int lms_model_export(lms_store *s, const char *model, const char *dir, const lms_export_params *params,
                     lms_export_stats *stats)
{
    lms_export_params defp = lms_export_default_params();
    lms_export_stats st0;
    if (!params)
        params = &defp;
    if (!stats)
        stats = &st0;
    memset(stats, 0, sizeof *stats);
    if (!s || !model || !dir)
        return lms__err(LMS_EINVAL, "export: no store, model or folder");
    double t0 = lms__now();
    uint64_t max = params->max_shard_size ? params->max_shard_size : (5ull << 30);
    exp e = {0};
    e.model = model;
    e.dir = dir;
    lms_hasher *h = NULL;
    lms_progress *prog = NULL;
    int rc;

    /* a new or empty folder: never mix our shards with someone's files */
    if (lms__path_exists(dir)) {
        DIR *d = opendir(dir);
        if (!d)
            return lms__err_errno(errno == ENOTDIR ? LMS_EEXIST : LMS_EIO, errno, "%s", dir);
        struct dirent *de;
        bool empty = true;
        while ((de = readdir(d)))
            if (strcmp(de->d_name, ".") && strcmp(de->d_name, ".."))
                empty = false;
        closedir(d);
        if (!empty)
            return lms__err(LMS_EEXIST, "%s: not empty; export writes into a new or empty folder", dir);
    }
    if ((rc = lms__emodel_load(s, model, &e.m)))
        goto out;
    for (size_t i = 0; i < e.m.n; i++)
        if (lms_dtype_is_quantized(e.m.t[i].tr.dtype) && e.m.t[i].tr.dtype != LMS_DTYPE_MLX_AFFINE) {
            rc = lms__err(LMS_EUNSUPPORTED, "model '%s' tensor '%s' is %s, which safetensors cannot hold: export the "
                          "model as GGUF (a path ending in .gguf)", model, e.m.t[i].name,
                          lms_dtype_name(e.m.t[i].tr.dtype));
            goto out;
        }
    if (!lms__path_exists(dir)) {
        if ((rc = lms__mkdir_p(dir, 0755)))
            goto out;
        e.made_dir = true;
    }

    /* shards: greedy in storage order */
    uint32_t shard = 0;
    uint64_t used = 0, total = 0;
    for (size_t i = 0; i < e.m.n; i++) {
        etensor *t = &e.m.t[i];
        if (used && used + t->tr.nbytes > max) {
            shard++;
            used = 0;
        }
        t->shard = shard;
        t->begin = used;
        used += t->tr.nbytes;
        total += t->tr.nbytes;
    }
    uint32_t n_shards = e.m.n ? shard + 1 : 1;
    if (!(h = lms__hasher_new())) {
        rc = LMS_ENOMEM;
        goto out;
    }
    if (params->progress)
        prog = lms__progress_start("export", total, "B");
    for (uint32_t k = 0; k < n_shards; k++) {
        char name[64];
        if (n_shards == 1)
            snprintf(name, sizeof name, "model.safetensors");
        else
            snprintf(name, sizeof name, "model-%05u-of-%05u.safetensors", k + 1, n_shards);
        if ((rc = write_shard(&e, k, name, h, prog)))
            goto out;
    }
    if (n_shards > 1 && (rc = write_index(&e, n_shards, total)))
        goto out;
    if ((rc = write_side_files(&e, &stats->files)))
        goto out;
    stats->tensors = e.m.n;
    stats->bytes = total;
    stats->shards = n_shards;
out:
    lms__progress_done(prog);
    if (rc) {
        for (size_t i = 0; i < e.n_written; i++)
            (void)unlink(e.written[i]);
        if (e.made_dir)
            (void)rmdir(dir);
    }
    for (size_t i = 0; i < e.n_written; i++)
        lms__free(e.written[i]);
    lms__free(e.written);
    lms__emodel_free(&e.m);
    lms__hasher_free(h);
    stats->seconds = lms__now() - t0;
    return rc;
}
