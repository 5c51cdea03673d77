/*
 * store/import.c - lms_import: packs a HuggingFace model folder (or one
 * .safetensors file) into the store.
 *
 * Steps, each of which may fail without touching the store until step 5:
 *   1. read and validate the source (safetensors.c) and the side files;
 *   2. order the tensors for the forward pass (embedding, blocks 0..N-1,
 *      final norm, LM head) and hash them (XXH3-128, threads);
 *   3. take the append lock; find tensors already stored (hash + byte
 *      comparison) and identical tensors within the model;
 *   4. append the new blobs at aligned offsets (copy_file_range, threads),
 *      read each back and hash it again (the store keeps the bytes it hashed:
 *      a source rewritten between the two passes fails the import, naming
 *      the file), fsync them, and check that no shard's size or modification
 *      time changed since it was opened;
 *   5. one LMDB write transaction adds blob references, tensor, file and
 *      model records (the model becomes visible atomically);
 *   6. on any failure before 5 commits, the appender truncates the segments
 *      back and unlinks new ones: the store is as before.
 *
 * Crash points (common/crashpoint.h), in the order an import passes them;
 * the crash tests kill the process at each (tests/store/test_crash_import.py):
 *   import:hashed          after each batch's tensors are hashed (nothing
 *                          written yet for that batch)
 *   import:data-written    after each batch's blobs are copied into segments
 *                          (not yet durable; no record reaches them)
 *   import:data-synced     after the fsync of the new bytes (and of the
 *                          segment folder when a segment was created)
 *   import:before-commit   inside the LMDB write transaction, all records
 *                          put, before the commit
 *   import:after-commit    after the commit (the model is visible), before
 *                          the append lock is released
 *   import:done            after the append lock is released
 * and on the failure path (step 6) only:
 *   import:before-rollback / import:after-rollback  around the truncation
 *                          and unlinking of what the failed attempt appended
 * A kill at any of them leaves either no model (its bytes unreferenced,
 * reclaimed by lms_store_gc) or the whole model.
 */
#include <assert.h>
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/crashpoint.h"
#include "store/admin_internal.h"
#include "store/gguf.h"
#include "store/mlx.h"
#include "store/names.h"
#include "store/safetensors.h"
#include "store/store_internal.h"
#include "store/tokimg.h"

#define SIDE_FILE_MAX LMS__FILE_RAW_MAX
#define COPY_CHUNK (64ull << 20)

/* BLOB_REPAIR: a stored blob whose bytes fail their own hash (damaged on
 * disk, or left by an older build that stored bytes other than it hashed):
 * written anew like BLOB_NEW, and the commit repoints its record there. */
enum { BLOB_NEW, BLOB_STORED, BLOB_REPAIR };

typedef struct ublob {
    uint8_t key[16];
    uint64_t size;
    int status;       /* BLOB_NEW, BLOB_STORED or BLOB_REPAIR */
    uint32_t segment;
    uint64_t offset;
    uint64_t count;   /* tensors of this model referencing it */
    size_t first;     /* a tensor holding these bytes (index into tensors) */
} ublob;

typedef struct itensor {
    const lms__st_tensor *st;
    size_t shard;
    int group;
    int32_t layer;
    lms_hash128 hash;
    size_t blob;        /* index into blobs */
} itensor;

typedef lms__named_rec side_file; /* name, encoded file record */

typedef struct shard_map {
    int fd;
    uint64_t size;
    struct timespec mtime; /* at open: a source that changes during the import is refused */
} shard_map;

typedef struct copy_job {
    size_t blob;
    uint64_t off, len; /* within the blob */
} copy_job;

typedef struct imp {
    lms_store *s;
    const char *name;
    lms_import_params p;
    lms__st_source *src;
    shard_map *maps;
    itensor *t;
    size_t nt;
    size_t *order;      /* tensor indices in storage order */
    ublob *blobs;
    size_t nb;
    side_file *files;
    size_t nf;
    char *config;       /* config.json bytes or NULL */
    size_t config_len;
    char *arch;
    char *st_meta;
    char *source;       /* absolute path of the source */
    lms__appender *app;
    copy_job *jobs;
    size_t njobs, cap_jobs;
    struct task *tasks;
    size_t ntasks, cap_tasks;
    uint64_t batch;     /* bytes per pipeline batch */
    uint8_t **bufs;     /* one IO_CHUNK read buffer per pool worker */
    lms_hasher **hashers; /* one per pool worker */
    int nworkers;
    uint8_t *cmp_a, *cmp_b; /* IO_CHUNK buffers for byte comparisons (calling thread) */
    size_t *slots;      /* open-addressing table: blob hash -> index into blobs */
    size_t cap_slots;   /* power of two */
    lms__segmap map;    /* the segment last compared against */
    bool mapped;
    lms_progress *prog;
    uint8_t id[16];
    lms__tokimg *tokimg; /* the compiled tokenizer, NULL without one (store/tokimg.h) */
    /* worker errors */
    pthread_mutex_t mu;
    int wrc;
    char wmsg[1024];
} imp;

static void worker_fail(imp *m, int rc)
{
    pthread_mutex_lock(&m->mu);
    if (!m->wrc) {
        m->wrc = rc;
        snprintf(m->wmsg, sizeof m->wmsg, "%s", lms_last_error());
    }
    pthread_mutex_unlock(&m->mu);
}

static int worker_rc(imp *m)
{
    if (!m->wrc)
        return 0;
    return lms__err(m->wrc, "%s", m->wmsg);
}

/* ---- ordering --------------------------------------------------------------------- */

static bool all_digits(const char *s, size_t n)
{
    if (n == 0 || n > 9)
        return false;
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return false;
    return true;
}

/* Block index from ".layers.N." / ".h.N." / ".blocks.N." (also at the start), else -1. */
static int32_t layer_of(const char *name)
{
    static const char *const keys[] = {"layers", "h", "blocks", "layer"};
    const char *p = name;
    while (*p) {
        const char *e = strchr(p, '.');
        size_t n = e ? (size_t)(e - p) : strlen(p);
        if (!e)
            break;
        for (size_t k = 0; k < LMS_ARRAY_LEN(keys); k++) {
            if (n == strlen(keys[k]) && !memcmp(p, keys[k], n)) {
                const char *q = e + 1, *qe = strchr(q, '.');
                if (qe && all_digits(q, (size_t)(qe - q)))
                    return (int32_t)strtol(q, NULL, 10);
            }
        }
        p = e + 1;
    }
    return -1;
}

static bool has_component(const char *name, const char *const *set, size_t n)
{
    const char *p = name;
    for (;;) {
        const char *e = strchr(p, '.');
        size_t len = e ? (size_t)(e - p) : strlen(p);
        for (size_t k = 0; k < n; k++)
            if (strlen(set[k]) == len && !memcmp(p, set[k], len))
                return true;
        if (!e)
            return false;
        p = e + 1;
    }
}

static void classify(itensor *t)
{
    static const char *const head[] = {"lm_head", "output", "embed_out"};
    static const char *const post[] = {"norm", "ln_f", "final_layernorm", "final_norm", "output_norm"};
    const char *nm = t->st->name;
    t->layer = layer_of(nm);
    if (t->layer >= 0) {
        t->group = 1;
    } else if (has_component(nm, head, LMS_ARRAY_LEN(head))) {
        t->group = 3;
        t->layer = INT32_MAX;
    } else if (strstr(nm, "embed") || has_component(nm, (const char *const[]){"wte", "wpe", "tok_embeddings"}, 3)) {
        t->group = 0;
        t->layer = -1;
    } else if (has_component(nm, post, LMS_ARRAY_LEN(post))) {
        t->group = 2;
        t->layer = INT32_MAX;
    } else {
        t->group = 0;
        t->layer = -1;
    }
}

static int cmp_storage(const void *a, const void *b, void *ctx)
{
    const imp *m = ctx;
    const itensor *x = &m->t[*(const size_t *)a], *y = &m->t[*(const size_t *)b];
    if (x->group != y->group)
        return x->group < y->group ? -1 : 1;
    if (x->layer != y->layer)
        return x->layer < y->layer ? -1 : 1;
    return strcmp(x->st->name, y->st->name);
}

/* ---- source ------------------------------------------------------------------------ */

static bool side_file_wanted(const char *nm)
{
    static const char *const exts[] = {".json", ".jinja", ".txt", ".model", ".tiktoken"};
    if (nm[0] == '.' || !strcmp(nm, "model.safetensors.index.json"))
        return false;
    size_t n = strlen(nm);
    for (size_t i = 0; i < LMS_ARRAY_LEN(exts); i++) {
        size_t e = strlen(exts[i]);
        if (n > e && !strcmp(nm + n - e, exts[i]))
            return true;
    }
    return false;
}

static int cmp_side(const void *a, const void *b) { return strcmp(((const side_file *)a)->name, ((const side_file *)b)->name); }

/* Check and encode one side file; `path` names it in errors. */
static int add_side_file(imp *m, const char *name, const char *data, size_t len, const char *path, size_t *cap)
{
    int rc = 0;
    size_t nl = strlen(name);
    if (nl > 5 && !strcmp(name + nl - 5, ".json")) {
        cJSON *j = lms__json_parse_strict(path, "the file", data, len);
        if (!j) {
            rc = LMS_EFORMAT;
        } else if (!strcmp(name, "config.json")) {
            if (!cJSON_IsObject(j)) {
                rc = lms__err(LMS_EFORMAT, "%s: not a JSON object", path);
            } else {
                const cJSON *a = cJSON_GetObjectItemCaseSensitive(j, "architectures");
                const cJSON *mt = cJSON_GetObjectItemCaseSensitive(j, "model_type");
                const char *arch = cJSON_IsArray(a) && cJSON_IsString(a->child) ? a->child->valuestring
                                   : cJSON_IsString(mt)                         ? mt->valuestring
                                                                                : "";
                if (!lms__utf8_valid(arch, strlen(arch)))
                    arch = "";
                m->arch = lms__strdup(arch);
                m->config = lms__malloc(len ? len : 1);
                if (!m->arch || !m->config)
                    rc = LMS_ENOMEM;
                else {
                    memcpy(m->config, data, len);
                    m->config_len = len;
                }
            }
        }
        cJSON_Delete(j);
    }
    if (!rc && m->nf == *cap) {
        *cap = *cap ? *cap * 2 : 16;
        side_file *nv = lms__realloc(m->files, *cap * sizeof *nv);
        if (!nv)
            rc = LMS_ENOMEM;
        else
            m->files = nv;
    }
    if (!rc) {
        side_file *f = &m->files[m->nf];
        memset(f, 0, sizeof *f);
        f->name = lms__strdup(name);
        rc = f->name ? lms__file_rec_encode(data, len, 3, &f->rec, &f->len) : LMS_ENOMEM;
        m->nf++;
        if (rc)
            rc = lms__err_prefix(rc, "%s: ", path);
    }
    return rc;
}

static int read_side_files(imp *m)
{
    const char *dir = m->src->src;
    DIR *d = opendir(dir);
    if (!d)
        return lms__err_errno(LMS_EIO, errno, "%s", dir);
    int rc = 0;
    size_t cap = 0;
    struct dirent *e;
    while ((e = readdir(d))) {
        if (!side_file_wanted(e->d_name))
            continue;
        char *path = lms__asprintf("%s/%s", dir, e->d_name);
        if (!path) {
            rc = LMS_ENOMEM;
            break;
        }
        struct stat st;
        if (stat(path, &st) || !S_ISREG(st.st_mode)) {
            lms__free(path);
            continue;
        }
        if (strlen(e->d_name) > LMS__ITEM_NAME_MAX || !lms__utf8_valid(e->d_name, strlen(e->d_name))) {
            lms__warn("%s: skipped (file name too long or not UTF-8)", path);
            lms__free(path);
            continue;
        }
        char *data;
        size_t len;
        rc = lms__read_file(path, SIDE_FILE_MAX, &data, &len);
        if (!rc) {
            rc = add_side_file(m, e->d_name, data, len, path, &cap);
            lms__free(data);
        }
        lms__free(path);
        if (rc)
            break;
    }
    closedir(d);
    if (!rc && m->nf)
        qsort(m->files, m->nf, sizeof *m->files, cmp_side);
    return rc;
}

/* The compiled tokenizer (store/tokimg.h): made from the side files before
 * the append lock is taken; its reference is one more side file. */
static int add_tokimg(imp *m)
{
    int rc = lms__tokimg_prepare(m->s, m->files, m->nf, &m->tokimg);
    if (rc || !m->tokimg)
        return rc;
    side_file *nv = lms__realloc(m->files, (m->nf + 1) * sizeof *nv);
    if (!nv)
        return LMS_ENOMEM;
    m->files = nv;
    side_file *f = &m->files[m->nf++];
    memset(f, 0, sizeof *f);
    if (!(f->name = lms__strdup(LMS__TOKREF_NAME)))
        return LMS_ENOMEM;
    if ((rc = lms__file_rec_encode(m->tokimg->ref, sizeof m->tokimg->ref, 0, &f->rec, &f->len)))
        return rc;
    qsort(m->files, m->nf, sizeof *m->files, cmp_side);
    return 0;
}

/* The side files a reader made (GGUF metadata -> config.json, ...). */
static int add_gen_files(imp *m)
{
    size_t cap = 0;
    int rc = 0;
    for (size_t i = 0; i < m->src->n_gen_files && !rc; i++) {
        const lms__gen_file *g = &m->src->gen_files[i];
        char what[400];
        snprintf(what, sizeof what, "%s (%s made from %s metadata)", g->name, m->src->src, m->src->kind);
        rc = add_side_file(m, g->name, g->data, g->len, what, &cap);
    }
    if (!rc && m->nf)
        qsort(m->files, m->nf, sizeof *m->files, cmp_side);
    return rc;
}

static int open_shards(imp *m)
{
    m->maps = lms__calloc(m->src->n_shards, sizeof *m->maps);
    if (!m->maps)
        return LMS_ENOMEM;
    for (size_t i = 0; i < m->src->n_shards; i++)
        m->maps[i].fd = -1;
    for (size_t i = 0; i < m->src->n_shards; i++) {
        lms__st_file *f = m->src->shards[i];
        shard_map *sm = &m->maps[i];
        sm->fd = lms__open_regular(f->path);
        if (sm->fd < 0) {
            int rc = sm->fd;
            sm->fd = -1;
            return rc;
        }
        struct stat st;
        if (fstat(sm->fd, &st))
            return lms__err_errno(LMS_EIO, errno, "%s: stat", f->path);
        if ((uint64_t)st.st_size != f->file_size)
            return lms__err(LMS_EIO, "%s: file changed size during import", f->path);
        sm->size = (uint64_t)st.st_size;
        sm->mtime = st.st_mtim;
        (void)posix_fadvise(sm->fd, 0, 0, POSIX_FADV_SEQUENTIAL);
    }
    return 0;
}

/* Every shard still has the size and modification time it had when the
 * import opened it (checked after the data is written, before the commit):
 * a source rewritten meanwhile is refused, naming the file. */
static int check_shards_unchanged(imp *m)
{
    for (size_t i = 0; i < m->src->n_shards; i++) {
        const shard_map *sm = &m->maps[i];
        const char *path = m->src->shards[i]->path;
        struct stat st;
        if (fstat(sm->fd, &st))
            return lms__err_errno(LMS_EIO, errno, "%s: stat", path);
        if ((uint64_t)st.st_size != sm->size || st.st_mtim.tv_sec != sm->mtime.tv_sec ||
            st.st_mtim.tv_nsec != sm->mtime.tv_nsec)
            return lms__err(LMS_EIO, "%s: the file changed during the import (its %s); nothing was imported", path,
                            (uint64_t)st.st_size != sm->size ? "size" : "modification time");
    }
    return 0;
}

/* Source bytes are read with pread, not mapped: a shard truncated or
 * rewritten under the import then gives an error, never SIGBUS. */
#define IO_CHUNK ((size_t)4 << 20)

/* Source row of HF row r of a tensor whose rows are in llama.cpp's rotary
 * order, in heads of d rows (gguf_model.c): gguf row 2i + j of a head holds
 * HF row j*d/2 + i. */
static uint64_t rotary_src_row(uint64_t r, uint64_t d)
{
    uint64_t h = r / d, w = r % d;
    return h * d + 2 * (w % (d / 2)) + w / (d / 2);
}

/* Bytes [off, off + n) of tensor t as stored: the source bytes, or for a
 * permuted tensor its rows in HF order. */
static int src_read(const imp *m, const itensor *t, uint64_t off, void *buf, size_t n)
{
    const lms__st_file *f = m->src->shards[t->shard];
    uint64_t base = f->data_off + t->st->begin;
    if (!t->st->perm_heads)
        return lms__pread_all(m->maps[t->shard].fd, buf, n, base + off, f->path);
    uint64_t rows = t->st->shape[0], rb = t->st->nbytes / rows, d = rows / t->st->perm_heads;
    uint8_t *out = buf;
    while (n) {
        uint64_t r = off / rb, in = off % rb;
        size_t k = (size_t)LMS_MIN((uint64_t)n, rb - in);
        int rc = lms__pread_all(m->maps[t->shard].fd, out, k, base + rotary_src_row(r, d) * rb + in, f->path);
        if (rc)
            return rc;
        out += k;
        off += k;
        n -= k;
    }
    return 0;
}

/* 0 when tensor t's bytes equal `other` (another tensor when mem is NULL,
 * else the n bytes at mem), 1 when they differ, < 0 on a read error. */
static int src_equal(imp *m, const itensor *t, const itensor *other, const uint8_t *mem)
{
    uint64_t n = t->st->nbytes;
    if (other && other->st->nbytes != n)
        return 1;
    for (uint64_t off = 0; off < n; off += IO_CHUNK) {
        size_t k = (size_t)LMS_MIN((uint64_t)IO_CHUNK, n - off);
        int rc = src_read(m, t, off, m->cmp_a, k);
        if (!rc && other)
            rc = src_read(m, other, off, m->cmp_b, k);
        if (rc)
            return rc;
        if (memcmp(m->cmp_a, other ? m->cmp_b : mem + off, k) != 0)
            return 1;
    }
    return 0;
}

/* ---- dedup and copy, pipelined ----------------------------------------------------
 * Tensors are taken in storage order, in batches of about BATCH bytes. While
 * batch b is copied, batch b+1 is hashed (one pool run does both); between
 * runs the calling thread decides, for each tensor of the hashed batch, in
 * storage order, whether its bytes are already stored (store lookup + byte
 * comparison), equal to an earlier tensor of this model (table lookup + byte
 * comparison), or new (reserve an aligned range, queue copy jobs). */

#define BATCH (256ull << 20)
#define EMPTY SIZE_MAX

struct task {
    int kind; /* 0: hash tensor i, 1: copy job i, 2: re-hash written blob i */
    size_t i;
};
typedef struct task task;

static void hash_one(imp *m, size_t i, int worker)
{
    itensor *t = &m->t[i];
    assert(worker >= 0 && worker < m->nworkers);
    uint8_t *buf = m->bufs[worker];
    lms_hasher *h = m->hashers[worker];
    lms__hasher_reset(h);
    for (uint64_t off = 0; off < t->st->nbytes; off += IO_CHUNK) {
        size_t k = (size_t)LMS_MIN((uint64_t)IO_CHUNK, t->st->nbytes - off);
        int rc = src_read(m, t, off, buf, k);
        if (rc) {
            worker_fail(m, rc);
            return;
        }
        lms__hasher_update(h, buf, k);
    }
    t->hash = lms__hasher_digest(h);
}

static void copy_one(imp *m, size_t i, int worker)
{
    if (m->wrc)
        return;
    const copy_job *j = &m->jobs[i];
    const ublob *b = &m->blobs[j->blob];
    const itensor *t = &m->t[b->first];
    const lms__st_file *f = m->src->shards[t->shard];
    int fd;
    const char *path;
    int rc = lms__append_fd(m->app, b->segment, &fd, &path);
    if (!rc && !t->st->perm_heads) {
        rc = lms__copy_range(m->maps[t->shard].fd, f->data_off + t->st->begin + j->off, fd, b->offset + j->off,
                             j->len, f->path, path);
    } else {
        /* rows in another order: through the worker's buffer */
        for (uint64_t o = 0; !rc && o < j->len; o += IO_CHUNK) {
            size_t k = (size_t)LMS_MIN((uint64_t)IO_CHUNK, j->len - o);
            rc = src_read(m, t, j->off + o, m->bufs[worker], k);
            if (!rc)
                rc = lms__append_write(m->app, b->segment, b->offset + j->off + o, m->bufs[worker], k);
        }
    }
    /* Start writeback now so the disk works while we copy the next chunks
     * and the final fsync only waits for the tail. A hint: errors surface in
     * that fsync (lms__append_sync). */
    if (!rc)
        (void)sync_file_range(fd, (off64_t)(b->offset + j->off), (off64_t)j->len, SYNC_FILE_RANGE_WRITE);
    if (rc)
        worker_fail(m, rc);
    lms__progress_add(m->prog, j->len);
}

/* Hash what was written for new blob i, read back from its segment: the
 * store keeps what it hashed, or the import fails (a source rewritten
 * between the hashing pass and the copy). */
static void check_one(imp *m, size_t i, int worker)
{
    if (m->wrc)
        return;
    const ublob *b = &m->blobs[i];
    const itensor *t = &m->t[b->first];
    uint8_t *buf = m->bufs[worker];
    lms_hasher *h = m->hashers[worker];
    int fd;
    const char *path;
    int rc = lms__append_fd(m->app, b->segment, &fd, &path);
    lms__hasher_reset(h);
    for (uint64_t off = 0; !rc && off < b->size; off += IO_CHUNK) {
        size_t k = (size_t)LMS_MIN((uint64_t)IO_CHUNK, b->size - off);
        if (!(rc = lms__pread_all(fd, buf, k, b->offset + off, path)))
            lms__hasher_update(h, buf, k);
    }
    if (!rc) {
        uint8_t key[16];
        lms__hash128_put(key, lms__hasher_digest(h));
        if (memcmp(key, b->key, 16))
            rc = lms__err(LMS_EIO,
                          "%s: tensor '%s': the bytes copied differ from the bytes hashed: the file changed during "
                          "the import; nothing was imported",
                          m->src->shards[t->shard]->path, t->st->name);
    }
    if (rc)
        worker_fail(m, rc);
}

static void run_task(void *arg, size_t i, int worker)
{
    imp *m = arg;
    const task *tk = &m->tasks[i];
    if (tk->kind == 0)
        hash_one(m, tk->i, worker);
    else if (tk->kind == 1)
        copy_one(m, tk->i, worker);
    else
        check_one(m, tk->i, worker);
}

static int add_task(imp *m, int kind, size_t i)
{
    if (m->ntasks == m->cap_tasks) {
        size_t cap = m->cap_tasks ? m->cap_tasks * 2 : 256;
        task *nv = lms__realloc(m->tasks, cap * sizeof *nv);
        if (!nv)
            return LMS_ENOMEM;
        m->tasks = nv;
        m->cap_tasks = cap;
    }
    m->tasks[m->ntasks++] = (task){kind, i};
    return 0;
}

static int queue_copies(imp *m, size_t blob)
{
    ublob *b = &m->blobs[blob];
    size_t cap = m->cap_jobs;
    for (uint64_t off = 0; off < b->size; off += COPY_CHUNK) {
        if (m->njobs == cap) {
            cap = cap ? cap * 2 : 256;
            copy_job *nv = lms__realloc(m->jobs, cap * sizeof *nv);
            if (!nv)
                return LMS_ENOMEM;
            m->jobs = nv;
            m->cap_jobs = cap;
        }
        m->jobs[m->njobs++] = (copy_job){blob, off, LMS_MIN(COPY_CHUNK, b->size - off)};
    }
    return 0;
}

/* The store must not hold the name yet (unless replacing); checked again at commit. */
static int check_absent(imp *m)
{
    MDB_txn *txn;
    MDB_val v;
    int rc = lms__txn_read(m->s, &txn);
    if (rc)
        return rc;
    rc = lms__db_get(m->s, txn, LMS__DB_MODELS, m->name, strlen(m->name), &v);
    lms__txn_end(m->s, txn);
    if (rc == 0 && !m->p.replace)
        return lms__err(LMS_EEXIST, "model '%s' already exists in %s (use --replace)", m->name, m->s->path);
    return rc == LMS_ENOENT ? 0 : rc;
}

/*
 * Tensor t hashes to `key`, a stored blob's key, but its bytes differ from
 * the blob's: say why. The source changed since it was hashed (its bytes
 * hash otherwise now): an error naming the file. The stored bytes fail
 * their own key (damaged, or stored by an older build that kept bytes other
 * than it hashed): 0, and the caller writes the blob anew. Else a true
 * XXH3-128 collision: an error.
 */
static int unequal_stored(imp *m, const itensor *t, const uint8_t key[16], const uint8_t *stored, uint64_t size)
{
    lms_hasher *h = m->hashers[0];
    const char *path = m->src->shards[t->shard]->path;
    lms__hasher_reset(h);
    for (uint64_t off = 0; off < t->st->nbytes; off += IO_CHUNK) {
        size_t k = (size_t)LMS_MIN((uint64_t)IO_CHUNK, t->st->nbytes - off);
        int rc = src_read(m, t, off, m->cmp_a, k);
        if (rc)
            return rc;
        lms__hasher_update(h, m->cmp_a, k);
    }
    if (!lms__hash128_eq(lms__hasher_digest(h), t->hash))
        return lms__err(LMS_EIO, "%s: tensor '%s': the file changed during the import; nothing was imported", path,
                        t->st->name);
    uint8_t got[16];
    lms__hash128_put(got, lms__hash128(stored, (size_t)size));
    if (memcmp(got, key, 16)) {
        char hex[33];
        lms__admin_hex16(key, hex);
        lms__warn("import '%s': tensor '%s': the stored blob %s with its hash is damaged (its bytes fail their "
                  "hash); this import writes it anew for every model that uses it",
                  m->name, t->st->name, hex);
        return 0;
    }
    return lms__err(LMS_ECORRUPT,
                    "tensor '%s' has the XXH3-128 hash of a stored blob with other bytes (collision); not importing",
                    t->st->name);
}

/* Decide storage for tensors order[from, to); caller holds the append lock. */
static int decide(imp *m, size_t from, size_t to, uint64_t *bytes_new)
{
    lms_store *s = m->s;
    MDB_txn *txn;
    int rc = lms__txn_read(s, &txn);
    if (rc)
        return rc;
    for (size_t k = from; k < to && !rc; k++) {
        size_t ti = m->order[k];
        itensor *t = &m->t[ti];
        uint8_t key[16];
        lms__hash128_put(key, t->hash);
        size_t h = (size_t)(t->hash.lo ^ t->hash.hi) & (m->cap_slots - 1);
        bool found = false;
        while (m->slots[h] != EMPTY) {
            ublob *b = &m->blobs[m->slots[h]];
            if (!memcmp(b->key, key, 16)) {
                const itensor *f = &m->t[b->first];
                int eq = src_equal(m, t, f, NULL);
                if (eq < 0) {
                    rc = eq;
                    break;
                }
                if (eq) {
                    rc = lms__err(LMS_ECORRUPT, "tensors '%s' and '%s' differ but have the same XXH3-128 hash",
                                  f->st->name, t->st->name);
                    break;
                }
                b->count++;
                t->blob = m->slots[h];
                lms__progress_add(m->prog, t->st->nbytes);
                found = true;
                break;
            }
            h = (h + 1) & (m->cap_slots - 1);
        }
        if (rc || found)
            continue;
        ublob *b = &m->blobs[m->nb];
        memcpy(b->key, key, 16);
        b->size = t->st->nbytes;
        b->count = 1;
        b->first = ti;
        lms__blob_rec r;
        int grc = lms__blob_get(s, txn, key, &r);
        if (grc == LMS_ENOENT) {
            b->status = BLOB_NEW;
            if ((rc = lms__append_reserve(m->app, b->size, &b->segment, &b->offset)) ||
                (rc = queue_copies(m, m->nb)))
                break;
            *bytes_new += b->size;
        } else if (grc) {
            rc = grc;
            break;
        } else {
            if (r.size != b->size) {
                rc = lms__err(LMS_ECORRUPT, "tensor '%s' has the hash of a stored blob of another size", t->st->name);
                break;
            }
            if (!m->mapped || m->map.id != r.segment) {
                lms__segment_unmap(&m->map);
                m->mapped = false;
                if ((rc = lms__segment_map(s, r.segment, &m->map)))
                    break;
                m->mapped = true;
            }
            uint64_t end;
            if (lms__add_overflow(r.offset, r.size, &end) || end > m->map.size) {
                rc = lms__err(LMS_ECORRUPT, "%s: blob of tensor '%s' lies past the end of the segment", m->map.path,
                              t->st->name);
                break;
            }
            const uint8_t *stored = lms__segmap_at(&m->map, r.offset, r.size);
            int eq = src_equal(m, t, NULL, stored);
            if (eq < 0) {
                rc = eq;
                break;
            }
            if (eq && (rc = unequal_stored(m, t, key, stored, r.size)) == 0) {
                /* the stored copy is damaged: this import writes it anew */
                b->status = BLOB_REPAIR;
                if ((rc = lms__append_reserve(m->app, b->size, &b->segment, &b->offset)) ||
                    (rc = queue_copies(m, m->nb)))
                    break;
                *bytes_new += b->size;
            } else if (eq) {
                break;
            } else {
                b->status = BLOB_STORED;
                b->segment = r.segment;
                b->offset = r.offset;
                lms__progress_add(m->prog, t->st->nbytes);
            }
        }
        m->slots[h] = m->nb;
        t->blob = m->nb++;
    }
    lms__txn_end(s, txn);
    return rc;
}

/* End of the batch starting at order[from]: about BATCH bytes, at least one tensor. */
static size_t batch_end(const imp *m, size_t from)
{
    uint64_t bytes = 0;
    size_t k = from;
    while (k < m->nt && (k == from || bytes + m->t[m->order[k]].st->nbytes <= m->batch))
        bytes += m->t[m->order[k++]].st->nbytes;
    return k;
}

static int store_tensors(imp *m, lms_pool *pool, uint64_t *bytes_new)
{
    size_t cap = 16;
    while (cap < 2 * m->nt)
        cap *= 2;
    m->cap_slots = cap;
    /* LMSTORE_IMPORT_BATCH_BYTES exists for tests of the batch boundaries. */
    const char *eb = getenv("LMSTORE_IMPORT_BATCH_BYTES");
    m->batch = eb && *eb ? strtoull(eb, NULL, 10) : BATCH;
    m->slots = lms__malloc(cap * sizeof *m->slots);
    m->blobs = lms__calloc(m->nt ? m->nt : 1, sizeof *m->blobs);
    m->nworkers = lms__pool_threads(pool);
    m->bufs = lms__calloc((size_t)m->nworkers, sizeof *m->bufs);
    m->hashers = lms__calloc((size_t)m->nworkers, sizeof *m->hashers);
    m->cmp_a = lms__malloc(IO_CHUNK);
    m->cmp_b = lms__malloc(IO_CHUNK);
    if (!m->slots || !m->blobs || !m->bufs || !m->hashers || !m->cmp_a || !m->cmp_b)
        return LMS_ENOMEM;
    for (int w = 0; w < m->nworkers; w++)
        if (!(m->bufs[w] = lms__malloc(IO_CHUNK)) || !(m->hashers[w] = lms__hasher_new()))
            return LMS_ENOMEM;
    for (size_t i = 0; i < cap; i++)
        m->slots[i] = EMPTY;
    *bytes_new = 0;
    int rc = 0;
    size_t from = 0, to = batch_end(m, 0);
    m->ntasks = 0;
    for (size_t k = from; k < to; k++)
        if ((rc = add_task(m, 0, m->order[k])))
            return rc;
    lms__pool_run(pool, m->ntasks, run_task, m);
    if ((rc = worker_rc(m)))
        return rc;
    if (m->ntasks)
        lms__crashpoint("import:hashed");
    size_t copied0 = 0, copied1 = 0; /* blobs whose copies the last run made: re-hashed in the next */
    for (;;) {
        size_t jobs0 = m->njobs, nb0 = m->nb, next = from < m->nt ? batch_end(m, to) : to;
        if (from < m->nt && (rc = decide(m, from, to, bytes_new)))
            return rc;
        m->ntasks = 0;
        for (size_t j = jobs0; j < m->njobs; j++)
            if ((rc = add_task(m, 1, j)))
                return rc;
        for (size_t k = to; k < next; k++)
            if ((rc = add_task(m, 0, m->order[k])))
                return rc;
        for (size_t b = copied0; b < copied1; b++)
            if (m->blobs[b].status != BLOB_STORED && (rc = add_task(m, 2, b)))
                return rc;
        if (!m->ntasks)
            break;
        lms__pool_run(pool, m->ntasks, run_task, m);
        if ((rc = worker_rc(m)))
            return rc;
        if (m->njobs > jobs0)
            lms__crashpoint("import:data-written");
        if (next > to)
            lms__crashpoint("import:hashed");
        copied0 = nb0;
        copied1 = m->nb;
        from = to;
        to = next;
    }
    return 0;
}

static int model_id(imp *m)
{
    lms__tensor_rec *recs = lms__calloc(m->nt ? m->nt : 1, sizeof *recs);
    lms__id_tensor *ids = lms__calloc(m->nt ? m->nt : 1, sizeof *ids);
    int rc = recs && ids ? 0 : LMS_ENOMEM;
    for (size_t k = 0; !rc && k < m->nt; k++) {
        const itensor *t = &m->t[k];
        recs[k] = (lms__tensor_rec){.dtype = t->st->dtype, .ndim = t->st->ndim, .nbytes = t->st->nbytes,
                                    .bits = t->st->bits, .group = t->st->group};
        memcpy(recs[k].shape, t->st->shape, sizeof recs[k].shape);
        lms__hash128_put(recs[k].hash, t->hash);
        ids[k] = (lms__id_tensor){t->st->name, &recs[k]};
    }
    if (!rc)
        rc = lms__model_id(m->config, m->config ? m->config_len : 0, ids, m->nt, m->id);
    lms__free(recs);
    lms__free(ids);
    return rc;
}

/* ---- commit ------------------------------------------------------------------------ */

static int drop_model(lms_store *s, MDB_txn *txn, const char *model)
{
    MDB_cursor *c;
    size_t plen = strlen(model) + 1;
    int mrc = mdb_cursor_open(txn, s->dbi[LMS__DB_TENSORS], &c), rc = 0;
    if (mrc)
        return lms__mdb_err(mrc, "%s: cursor", s->index_path);
    MDB_val k = {plen, (void *)model}, v;
    int check;
    for (mrc = lms__cursor_get(s, c, LMS__DB_TENSORS, &k, &v, MDB_SET_RANGE, &check); mrc == 0;
         mrc = lms__cursor_get(s, c, LMS__DB_TENSORS, &k, &v, MDB_NEXT, &check)) {
        if (k.mv_size < plen || memcmp(k.mv_data, model, plen) != 0)
            break;
        lms__tensor_rec tr;
        if ((rc = check) || (rc = lms__tensor_rec_decode(v.mv_data, v.mv_size, &tr)) ||
            (rc = lms__blob_ref(s, txn, tr.hash, -1, NULL)))
            break;
    }
    mdb_cursor_close(c);
    if (rc)
        return lms__err_prefix(rc, "replacing model '%s': ", model);
    if (mrc && mrc != MDB_NOTFOUND)
        return lms__mdb_err(mrc, "%s: read tensors", s->index_path);
    if ((rc = lms__db_del_prefix(s, txn, LMS__DB_TENSORS, model)) ||
        (rc = lms__db_del_prefix(s, txn, LMS__DB_FILES, model)))
        return rc;
    rc = lms__db_del(s, txn, LMS__DB_MODELS, model, strlen(model));
    return rc == LMS_ENOENT ? 0 : rc;
}

static int commit_fn(lms_store *s, MDB_txn *txn, void *vctx)
{
    imp *m = vctx;
    MDB_val v;
    int rc = lms__db_get(s, txn, LMS__DB_MODELS, m->name, strlen(m->name), &v);
    if (rc == 0) {
        if (!m->p.replace)
            return lms__err(LMS_EEXIST, "model '%s' already exists in %s (use --replace)", m->name, s->path);
        if ((rc = drop_model(s, txn, m->name)))
            return rc;
    } else if (rc != LMS_ENOENT) {
        return rc;
    }
    for (size_t i = 0; i < m->nb; i++) {
        ublob *b = &m->blobs[i];
        if (b->status == BLOB_STORED) {
            rc = lms__blob_ref(s, txn, b->key, (int64_t)b->count, NULL);
        } else if (b->status == BLOB_REPAIR) { /* the verified copy replaces the damaged one */
            lms__blob_rec r;
            if (!(rc = lms__blob_get(s, txn, b->key, &r))) {
                r.segment = b->segment;
                r.offset = b->offset;
                r.refs += b->count;
                rc = lms__blob_put(s, txn, b->key, &r);
            } else if (rc == LMS_ENOENT) {
                lms__blob_rec nr = {.kind = LMS__BLOB_TENSOR, .segment = b->segment, .offset = b->offset,
                                    .size = b->size, .refs = b->count};
                rc = lms__blob_put(s, txn, b->key, &nr);
            }
        } else {
            lms__blob_rec r = {.kind = LMS__BLOB_TENSOR, .segment = b->segment, .offset = b->offset,
                               .size = b->size, .refs = b->count};
            rc = lms__blob_put(s, txn, b->key, &r);
        }
        if (rc)
            return rc;
    }
    const char **names = lms__malloc((m->nt ? m->nt : 1) * sizeof *names);
    lms__tensor_rec *recs = lms__calloc(m->nt ? m->nt : 1, sizeof *recs);
    if (!names || !recs) {
        lms__free(names);
        lms__free(recs);
        return LMS_ENOMEM;
    }
    for (size_t k = 0; k < m->nt; k++) {
        const itensor *t = &m->t[m->order[k]];
        recs[k] = (lms__tensor_rec){.dtype = t->st->dtype, .ndim = t->st->ndim, .nbytes = t->st->nbytes,
                                    .layer = t->layer, .bits = t->st->bits, .group = t->st->group};
        memcpy(recs[k].shape, t->st->shape, sizeof recs[k].shape);
        memcpy(recs[k].hash, m->blobs[t->blob].key, 16);
        names[k] = t->st->name;
    }
    lms__model_put mp = {.name = m->name, .arch = m->arch, .source = m->source, .st_meta = m->st_meta,
                         .id = m->id, .nt = m->nt, .tnames = names, .trecs = recs, .nf = m->nf,
                         .files = m->files};
    rc = lms__model_put_records(s, txn, &mp);
    lms__free(names);
    lms__free(recs);
    if (!rc)
        lms__crashpoint("import:before-commit");
    return rc;
}

/* ---- driver -------------------------------------------------------------------------- */

static char *default_name(const char *src, bool is_dir)
{
    size_t n = strlen(src);
    while (n > 1 && src[n - 1] == '/')
        n--;
    const char *b = src;
    for (size_t i = 0; i < n; i++)
        if (src[i] == '/')
            b = src + i + 1;
    size_t bl = (size_t)(src + n - b);
    if (!is_dir && bl > 12 && !memcmp(b + bl - 12, ".safetensors", 12))
        bl -= 12;
    if (!is_dir && bl > 5 && !memcmp(b + bl - 5, ".gguf", 5)) {
        bl -= 5;
        /* the first of a split set: NAME-00001-of-0000N */
        if (bl > 15 && b[bl - 15] == '-' && !memcmp(b + bl - 9, "-of-", 4))
            bl -= 15;
    }
    return lms__strndup(b, bl);
}

int lms_import(lms_store *s, const char *src, const lms_import_params *params, lms_import_stats *stats)
{
    double t0 = lms__now();
    imp m;
    memset(&m, 0, sizeof m);
    pthread_mutex_init(&m.mu, NULL);
    m.s = s;
    m.p = params ? *params : lms_import_default_params();
    char *owned_name = NULL;
    lms_pool *pool = NULL;
    uint64_t bytes_total = 0, bytes_new = 0;
    int rc;
    if (stats)
        memset(stats, 0, sizeof *stats);
    if (!s || !src)
        return lms__err(LMS_EINVAL, "lms_import: store and source are required");
    if (s->rdonly)
        return lms__err(LMS_EINVAL, "%s: store is open read-only", s->path);

    /* 1. source (a GGUF file's refusal says it is GGUF: its messages are its own format's) */
    bool gguf = lms__gguf_is_source(src);
    if ((rc = gguf ? lms__gguf_source_open(src, &m.src) : lms__st_source_open(src, &m.src))) {
        if (gguf && rc == LMS_EFORMAT)
            lms__err_prefix(rc, "GGUF ");
        goto out;
    }
    if (m.p.name) {
        m.name = m.p.name;
    } else {
        if (!(owned_name = default_name(src, m.src->is_dir))) {
            rc = LMS_ENOMEM;
            goto out;
        }
        m.name = owned_name;
    }
    if ((rc = lms__name_check(LMS__NAME_MODEL, m.name)))
        goto out;
    char abs[PATH_MAX];
    if (!realpath(src, abs)) {
        rc = lms__err_errno(LMS_EIO, errno, "%s", src);
        goto out;
    }
    if (!(m.source = lms__strdup(abs))) {
        rc = LMS_ENOMEM;
        goto out;
    }
    if (m.src->n_gen_files)
        rc = add_gen_files(&m);
    else if (m.src->is_dir)
        rc = read_side_files(&m);
    if (!rc && !m.src->n_gen_files) { /* MLX quantized safetensors: packed weights -> MLX_AFFINE */
        char *cpath = lms__asprintf("%s/config.json", m.src->src);
        rc = cpath ? lms__mlx_bind(m.config, m.config_len, cpath, m.src) : LMS_ENOMEM;
        lms__free(cpath);
    }
    if (!rc)
        rc = add_tokimg(&m);
    if (rc)
        goto out;
    for (size_t i = 0; i < m.src->n_shards; i++) {
        m.nt += m.src->shards[i]->n_tensors;
        if (!m.st_meta && m.src->shards[i]->metadata && !(m.st_meta = lms__strdup(m.src->shards[i]->metadata))) {
            rc = LMS_ENOMEM;
            goto out;
        }
    }
    if (m.nt > UINT32_MAX) {
        rc = lms__err(LMS_ERANGE, "%s: too many tensors", src);
        goto out;
    }
    m.t = lms__calloc(m.nt, sizeof *m.t);
    m.order = lms__malloc(m.nt * sizeof *m.order);
    if (!m.t || !m.order) {
        rc = LMS_ENOMEM;
        goto out;
    }
    if ((rc = open_shards(&m)))
        goto out;
    size_t k = 0;
    for (size_t i = 0; i < m.src->n_shards; i++) {
        const lms__st_file *f = m.src->shards[i];
        for (size_t j = 0; j < f->n_tensors; j++, k++) {
            itensor *t = &m.t[k];
            t->st = &f->tensors[j];
            t->shard = i;
            classify(t);
            m.order[k] = k;
            bytes_total += t->st->nbytes;
        }
    }

    /* 2. storage order */
    qsort_r(m.order, m.nt, sizeof *m.order, cmp_storage, &m);
    if ((rc = lms__pool_create(m.p.threads, &pool)))
        goto out;
    if (m.p.progress)
        m.prog = lms__progress_start("import", bytes_total, "B"); /* each byte counts once: copied or deduplicated */

    /* 3-4. under the append lock: hash, dedup, append (pipelined), sync */
    if ((rc = lms__append_begin(s, &m.app)) || (rc = check_absent(&m)))
        goto out;
    double t_copy = lms__now();
    if ((rc = store_tensors(&m, pool, &bytes_new)))
        goto out;
    lms__debug("import: hashed %llu bytes and copied %llu in %.3f s", (unsigned long long)bytes_total,
               (unsigned long long)bytes_new, lms__now() - t_copy);
    if ((rc = model_id(&m)))
        goto out;
    double t_sync = lms__now();
    if ((rc = lms__append_sync(m.app)) || (rc = check_shards_unchanged(&m)))
        goto out;
    lms__crashpoint("import:data-synced");
    lms__debug("import: fsync in %.3f s", lms__now() - t_sync);

    /* the compiled tokenizer's file, complete before a record names it */
    if (m.tokimg && (rc = lms__tokimg_write(s, m.tokimg)))
        goto out;

    /* 5. one transaction makes it visible */
    if ((rc = lms__txn_write(s, commit_fn, &m)))
        goto out;
    lms__crashpoint("import:after-commit");
    lms__append_end(m.app, true);
    m.app = NULL;
    lms__crashpoint("import:done");
    if (stats) {
        stats->tensors = m.nt;
        stats->bytes_total = bytes_total;
        stats->bytes_written = bytes_new;
        stats->bytes_dedup = bytes_total - bytes_new;
        stats->seconds = lms__now() - t0;
    }
out:
    if (rc && m.name)
        rc = lms__err_prefix(rc, "import '%s': ", m.name);
    lms__progress_done(m.prog);
    if (m.app) { /* 6. roll back; NULL after a commit */
        lms__tokimg_unwrite(m.tokimg);
        lms__crashpoint("import:before-rollback");
        lms__append_end(m.app, false);
        lms__crashpoint("import:after-rollback");
    }
    lms__pool_destroy(pool);
    if (m.maps) {
        for (size_t i = 0; i < m.src->n_shards; i++) {
            if (m.maps[i].fd >= 0)
                close(m.maps[i].fd);
        }
        lms__free(m.maps);
    }
    lms__named_recs_free(m.files, m.nf);
    lms__tokimg_free(m.tokimg);
    lms__free(m.jobs);
    lms__free(m.tasks);
    for (int w = 0; w < m.nworkers; w++) {
        if (m.bufs)
            lms__free(m.bufs[w]);
        if (m.hashers)
            lms__hasher_free(m.hashers[w]);
    }
    lms__free(m.bufs);
    lms__free(m.hashers);
    lms__free(m.cmp_a);
    lms__free(m.cmp_b);
    lms__free(m.slots);
    lms__segment_unmap(&m.map);
    lms__free(m.blobs);
    lms__free(m.t);
    lms__free(m.order);
    lms__free(m.config);
    lms__free(m.arch);
    lms__free(m.st_meta);
    lms__free(m.source);
    lms__free(owned_name);
    lms__st_source_free(m.src);
    pthread_mutex_destroy(&m.mu);
    return rc;
}
