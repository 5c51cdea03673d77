/*
 * store/quantize.c - lms_model_quantize: a new model whose matrices are
 * quantized (GGUF block types or MLX affine) and whose other tensors are
 * the source's blobs, shared through the store's deduplication.
 *
 * Steps (the import's protocol, store_internal.h invariants 1-4):
 *   1. take the append lock; read the source's tensor, blob and file
 *      records in one snapshot (the lock keeps gc from deleting its blobs);
 *   2. for each tensor in the source's storage order: keep it (a reference
 *      to its blob) or quantize it: rows are dequantized to float32
 *      (quant/dequant.c) and quantized (quant/quantize.c) in batches on a
 *      thread pool, the calling thread hashes each batch and writes it into
 *      a range reserved in the current segment;
 *   3. a finished blob already stored (or made earlier in this run) is
 *      compared byte for byte and referenced instead; its range is given
 *      back (lms__append_unreserve), so quantizing twice writes nothing;
 *   4. fsync, then one write transaction adds the blob references, the
 *      tensor and file records and the model record;
 *   5. on failure the appender truncates the segments back.
 * MLX_AFFINE also writes X.scales and X.biases next to each X.weight and a
 * "quantization" object into config.json.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/quant.h"
#include "store/admin_internal.h"
#include "store/names.h"
#include "store/store_internal.h"

#define BATCH_BYTES (32u << 20) /* float32 bytes of source rows per batch */
#define CMP_CHUNK (4u << 20)

enum { KEEP, QUANT, FROM_MEM };

typedef struct qt {
    char *name;
    lms__tensor_rec src;   /* the source's record */
    const uint8_t *bytes;  /* the source's bytes (mapped; NULL for new side tensors) */
    lms__tensor_rec out;   /* the new model's record (hash filled when its blob is known) */
    int action;
    bool fresh;            /* its blob is new in this run (a blobs record to put) */
    uint32_t seg;          /* new blob: where */
    uint64_t off;
    uint8_t *mem;          /* FROM_MEM: the bytes (scales, biases) */
} qt;

typedef struct qctx {
    lms_store *s;
    const char *src_name, *dst_name;
    lms_quantize_params p;
    lms__appender *app;
    lms_pool *pool;
    lms_progress *prog;
    qt *t;
    size_t nt, cap;
    lms__named_rec *files; /* the source's side files (MLX: config.json replaced) */
    size_t nf;
    lms__model_rec mrec;   /* the source's (strings copied below) */
    char *arch, *st_meta, *source;
    uint8_t id[16];
    lms__emodel em;        /* the source's tensors, segments mapped */
    lms__segmap cmp_map;   /* a stored blob's segment, for byte comparisons */
    bool cmp_mapped;
    uint8_t *cmp_buf;
    /* the tensor being quantized: rows [row0, row0 + n) of the batch */
    const qt *cur;
    lms_dtype target, sdt; /* output dtype; MLX scales' dtype */
    uint32_t n_attn_v, n_down; /* Q4_K_M: the model's v_proj and down_proj matrices */
    bool has_lm_head;      /* Q4_K_M: an untied LM head (else the embedding is the head) */
    uint64_t cols, in_rb, out_rb, row0;
    const uint8_t *in;     /* the source rows */
    uint8_t *out;          /* the batch's output rows (GGUF blocks or MLX codes) */
    uint8_t *scales, *biases; /* MLX: the whole tensor's, in sdt */
    float **scratch;       /* one row of float32 per worker */
    int nworkers;
    volatile int werr;
    lms_quantize_stats st;
} qctx;

lms_quantize_params lms_quantize_default_params(void)
{
    lms_quantize_params p = {.type = LMS_DTYPE_Q8_0};
    return p;
}

/* ---- reading the source ------------------------------------------------------------------ */

static int add_tensor(qctx *c, const char *name, size_t nlen, qt **out)
{
    if (c->nt == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 64;
        qt *nv = lms__realloc(c->t, cap * sizeof *nv);
        if (!nv)
            return LMS_ENOMEM;
        c->t = nv;
        c->cap = cap;
    }
    qt *t = &c->t[c->nt];
    memset(t, 0, sizeof *t);
    if (!(t->name = lms__strndup(name, nlen)))
        return LMS_ENOMEM;
    c->nt++;
    *out = t;
    return 0;
}

static int read_file(lms_store *s, MDB_txn *txn, void *vctx, const char *item, size_t ilen, const MDB_val *val)
{
    (void)s, (void)txn;
    qctx *c = vctx;
    lms__named_rec *nv = lms__realloc(c->files, (c->nf + 1) * sizeof *nv);
    if (!nv)
        return LMS_ENOMEM;
    c->files = nv;
    lms__named_rec *f = &c->files[c->nf];
    f->name = lms__strndup(item, ilen);
    f->rec = lms__malloc(val->mv_size ? val->mv_size : 1);
    f->len = val->mv_size;
    if (!f->name || !f->rec) {
        lms__free(f->name);
        lms__free(f->rec);
        return LMS_ENOMEM;
    }
    memcpy(f->rec, val->mv_data, val->mv_size);
    c->nf++;
    return 0;
}

static int read_source(qctx *c)
{
    lms_store *s = c->s;
    MDB_txn *txn;
    MDB_val v;
    int rc = lms__txn_read(s, &txn);
    if (rc)
        return rc;
    rc = lms__db_get(s, txn, LMS__DB_MODELS, c->src_name, strlen(c->src_name), &v);
    if (rc == LMS_ENOENT)
        rc = lms__err(LMS_ENOENT, "model '%s' is not in the store %s", c->src_name, s->path);
    if (!rc && (rc = lms__model_rec_decode(v.mv_data, v.mv_size, &c->mrec)) == 0) {
        c->arch = lms__strndup(c->mrec.arch, c->mrec.arch_len);
        c->st_meta = lms__strndup(c->mrec.st_meta, c->mrec.st_meta_len);
        if (!c->arch || !c->st_meta)
            rc = LMS_ENOMEM;
    }
    if (!rc) {
        rc = lms__db_get(s, txn, LMS__DB_MODELS, c->dst_name, strlen(c->dst_name), &v);
        rc = rc == 0 ? lms__err(LMS_EEXIST, "model '%s' already exists in %s", c->dst_name, s->path)
             : rc == LMS_ENOENT ? 0
                                : rc;
    }
    if (!rc)
        rc = lms__db_prefix_each(s, txn, LMS__DB_FILES, c->src_name, read_file, c);
    lms__txn_end(s, txn);
    /* the tensors in storage order, their segments mapped */
    if (!rc)
        rc = lms__emodel_load(s, c->src_name, &c->em);
    for (size_t i = 0; !rc && i < c->em.n; i++) {
        const lms__etensor *e = &c->em.t[i];
        qt *t;
        if (!(rc = add_tensor(c, e->name, strlen(e->name), &t))) {
            t->src = e->tr;
            t->bytes = e->bytes;
        }
    }
    return rc;
}

/* ---- planning ------------------------------------------------------------------------------ */

static bool is_embedding(const char *name)
{
    return strstr(name, "embed") || !strcmp(name, "lm_head.weight") || !strcmp(name, "output.weight");
}

static size_t esz(lms_dtype t) { return t == LMS_DTYPE_F32 ? 4 : 2; }

/* llama-quantize's use_more_bits: the first and last eighth of the layers
 * and every third in between. */
static bool more_bits(uint32_t i, uint32_t n) { return i < n / 8 || i >= 7 * n / 8 || (i - n / 8) % 3 == 2; }

/* llama-quantize's Q4_K_M choice for a matrix of a dense Llama / Qwen model
 * (llama_tensor_get_type): Q6_K for the LM head (the embedding when the
 * head is tied to it) and for the v_proj and down_proj matrices of the
 * layers more_bits picks, Q4_K elsewhere. */
static lms_dtype k_m_type(const qctx *c, const char *name)
{
    unsigned l;
    if (!strcmp(name, "lm_head.weight") || (!c->has_lm_head && !strcmp(name, "model.embed_tokens.weight")))
        return LMS_DTYPE_Q6_K;
    if (sscanf(name, "model.layers.%u.", &l) == 1) {
        size_t n = strlen(name);
        if (n > 24 && !strcmp(name + n - 24, ".self_attn.v_proj.weight") && more_bits(l, c->n_attn_v))
            return LMS_DTYPE_Q6_K;
        if (n > 21 && !strcmp(name + n - 21, ".mlp.down_proj.weight") && more_bits(l, c->n_down))
            return LMS_DTYPE_Q6_K;
    }
    return LMS_DTYPE_Q4_K;
}

/* The dtype tensor t becomes, or KEEP. */
static int plan_one(qctx *c, qt *t, lms_dtype *target)
{
    const lms__tensor_rec *r = &t->src;
    size_t nl = strlen(t->name);
    bool matrix = r->ndim == 2 && nl > 7 && !strcmp(t->name + nl - 7, ".weight");
    if (!matrix || (c->p.keep_embeddings && is_embedding(t->name)))
        return KEEP;
    if (r->dtype == LMS_DTYPE_MLX_AFFINE)
        return lms__err(LMS_EUNSUPPORTED, "model '%s' tensor '%s' is MLX-quantized; quantizing from MLX models is "
                        "not supported", c->src_name, t->name);
    bool readable = r->dtype == LMS_DTYPE_F32 || r->dtype == LMS_DTYPE_F16 || r->dtype == LMS_DTYPE_BF16 ||
                    (lms_dtype_is_quantized(r->dtype) && r->dtype != LMS_DTYPE_Q8_K);
    if (!readable)
        return KEEP;
    uint64_t cols = r->shape[1];
    lms_dtype t_ = c->p.type;
    if (t_ == LMS_DTYPE_MLX_AFFINE) {
        if (cols % c->p.group_size)
            return KEEP;
    } else {
        if (c->p.mix_k_m)
            t_ = k_m_type(c, t->name);
        /* llama-quantize's fallbacks for rows of partial super-blocks */
        if (t_ == LMS_DTYPE_Q4_K && cols % LMS__QK_K)
            t_ = LMS_DTYPE_Q5_0;
        if (t_ == LMS_DTYPE_Q6_K && cols % LMS__QK_K)
            t_ = LMS_DTYPE_Q8_0;
        if (cols % lms_dtype_block_elems(t_, 0))
            return KEEP;
        if (r->dtype == t_)
            return KEEP; /* already that encoding: share it */
    }
    *target = t_;
    return QUANT;
}

/* ---- quantizing ------------------------------------------------------------------------------ */

static void quant_row(void *arg, size_t i, int worker)
{
    qctx *c = arg;
    if (c->werr)
        return;
    uint64_t row = c->row0 + i;
    float *x = c->scratch[worker];
    if (lms__dequant_row(c->cur->src.dtype, c->in + row * c->in_rb, x, (size_t)c->cols)) {
        c->werr = LMS_EINVAL;
        return;
    }
    if (c->target == LMS_DTYPE_MLX_AFFINE) {
        uint64_t per = c->cols / c->p.group_size;
        lms__mlx_quant_row(x, (size_t)c->cols, c->p.bits, c->p.group_size, c->sdt, c->out + i * c->out_rb,
                           c->scales + row * per * esz(c->sdt), c->biases + row * per * esz(c->sdt));
    } else if (lms__quant_row(c->target, x, c->out + i * c->out_rb, (size_t)c->cols)) {
        c->werr = LMS_EINVAL;
    }
}

/* 0 when the n bytes written at (seg, off) in this session equal those of
 * the stored blob b (or of the blob of an earlier tensor of this run, when
 * b is NULL and `other` is given), 1 when they differ. */
static int same_bytes(qctx *c, uint32_t seg, uint64_t off, uint64_t n, const lms__blob_rec *b, const qt *other)
{
    int fd, rc;
    const char *path;
    if ((rc = lms__append_fd(c->app, seg, &fd, &path)))
        return rc;
    int ofd = -1;
    const char *opath = NULL;
    const uint8_t *mem = NULL;
    if (b) {
        if (!c->cmp_mapped || c->cmp_map.id != b->segment) {
            lms__segment_unmap(&c->cmp_map);
            c->cmp_mapped = false;
            if ((rc = lms__segment_map(c->s, b->segment, &c->cmp_map)))
                return rc;
            c->cmp_mapped = true;
        }
        uint64_t end;
        if (lms__add_overflow(b->offset, b->size, &end) || end > c->cmp_map.size)
            return lms__err(LMS_ECORRUPT, "%s: a stored blob lies past the end of its segment", c->cmp_map.path);
        mem = c->cmp_map.base + b->offset;
    } else if ((rc = lms__append_fd(c->app, other->seg, &ofd, &opath))) {
        return rc;
    }
    uint8_t *x = c->cmp_buf, *y = c->cmp_buf + CMP_CHUNK;
    for (uint64_t o = 0; o < n; o += CMP_CHUNK) {
        size_t k = (size_t)LMS_MIN((uint64_t)CMP_CHUNK, n - o);
        if ((rc = lms__pread_all(fd, x, k, off + o, path)))
            return rc;
        if (!mem && (rc = lms__pread_all(ofd, y, k, other->off + o, opath)))
            return rc;
        if (memcmp(x, mem ? mem + o : y, k))
            return 1;
    }
    return 0;
}

/* Tensor t's blob is complete at (seg, off) with hash `key`: keep it as a
 * new blob, or give the range back and reference an identical one. */
static int settle(qctx *c, qt *t, uint32_t seg, uint64_t off)
{
    uint64_t n = t->out.nbytes;
    for (size_t i = 0; i < c->nt; i++) {
        qt *o = &c->t[i];
        if (o == t || !o->fresh || memcmp(o->out.hash, t->out.hash, 16))
            continue;
        int eq = same_bytes(c, seg, off, n, NULL, o);
        if (eq < 0)
            return eq;
        if (eq)
            return lms__err(LMS_ECORRUPT, "tensors '%s' and '%s' differ but have the same XXH3-128 hash", o->name,
                            t->name);
        c->st.bytes_shared += n;
        return lms__append_unreserve(c->app, seg, off, n);
    }
    MDB_txn *txn;
    lms__blob_rec r;
    int rc = lms__txn_read(c->s, &txn);
    if (rc)
        return rc;
    rc = lms__blob_get(c->s, txn, t->out.hash, &r);
    lms__txn_end(c->s, txn);
    if (rc == LMS_ENOENT) {
        t->fresh = true;
        t->seg = seg;
        t->off = off;
        c->st.bytes_written += n;
        return 0;
    }
    if (rc)
        return rc;
    int eq = r.size == n ? same_bytes(c, seg, off, n, &r, NULL) : 1;
    if (eq < 0)
        return eq;
    if (eq)
        return lms__err(LMS_ECORRUPT, "quantized tensor '%s' has the XXH3-128 hash of a stored blob with other bytes "
                        "(collision); not quantizing", t->name);
    c->st.bytes_shared += n;
    return lms__append_unreserve(c->app, seg, off, n);
}

/* Write a blob held in memory (MLX scales and biases). */
static int write_mem(qctx *c, qt *t)
{
    uint32_t seg;
    uint64_t off;
    lms__hash128_put(t->out.hash, lms__hash128(t->mem, (size_t)t->out.nbytes));
    int rc = lms__append_reserve(c->app, t->out.nbytes, &seg, &off);
    if (!rc)
        rc = lms__append_write(c->app, seg, off, t->mem, (size_t)t->out.nbytes);
    if (!rc)
        rc = settle(c, t, seg, off);
    lms__free(t->mem);
    t->mem = NULL;
    return rc;
}

static int quantize_tensor(qctx *c, qt *t, qt *scales, qt *biases)
{
    const uint8_t *in = t->bytes;
    int rc = 0;
    uint64_t rows = t->src.shape[0];
    c->cur = t;
    c->in = in;
    c->cols = t->src.shape[1];
    c->target = t->out.dtype;
    lms_dtype_nbytes(t->src.dtype, 0, &c->cols, 1, &c->in_rb);
    lms_dtype_nbytes(t->out.dtype, t->out.bits, &c->cols, 1, &c->out_rb);
    if (scales) {
        c->scales = scales->mem;
        c->biases = biases->mem;
    }
    uint64_t batch = LMS_MAX(1, BATCH_BYTES / (c->cols * 4));
    c->out = lms__malloc((size_t)(LMS_MIN(batch, rows) * c->out_rb));
    lms_hasher *h = lms__hasher_new();
    uint32_t seg;
    uint64_t off;
    if (!c->out || !h) {
        rc = LMS_ENOMEM;
        goto out;
    }
    if ((rc = lms__append_reserve(c->app, t->out.nbytes, &seg, &off)))
        goto out;
    for (c->row0 = 0; c->row0 < rows; c->row0 += batch) {
        uint64_t n = LMS_MIN(batch, rows - c->row0);
        lms__pool_run(c->pool, (size_t)n, quant_row, c);
        if (c->werr) {
            rc = lms__err(c->werr, "quantizing tensor '%s': %s", t->name, lms_last_error());
            goto out;
        }
        lms__hasher_update(h, c->out, (size_t)(n * c->out_rb));
        if ((rc = lms__append_write(c->app, seg, off + c->row0 * c->out_rb, c->out, (size_t)(n * c->out_rb))))
            goto out;
        lms__progress_add(c->prog, n * c->in_rb);
    }
    lms__hash128_put(t->out.hash, lms__hasher_digest(h));
    rc = settle(c, t, seg, off);
    if (!rc && scales)
        rc = write_mem(c, scales);
    if (!rc && biases)
        rc = write_mem(c, biases);
out:
    lms__hasher_free(h);
    lms__free(c->out);
    c->out = NULL;
    return rc;
}

/* ---- the plan ------------------------------------------------------------------------------------ */

static int mlx_config(qctx *c)
{
    for (size_t i = 0; i < c->nf; i++) {
        if (strcmp(c->files[i].name, "config.json"))
            continue;
        lms__file_rec fr;
        char *data = NULL;
        size_t len;
        int rc = lms__file_rec_decode(c->files[i].rec, c->files[i].len, &fr);
        if (!rc)
            rc = lms__file_rec_inflate(&fr, "config.json", &data, &len);
        if (rc)
            return lms__err_prefix(rc, "model '%s': ", c->src_name);
        cJSON *root = cJSON_ParseWithLength(data, len);
        lms__free(data);
        if (!cJSON_IsObject(root)) {
            cJSON_Delete(root);
            return lms__err(LMS_EFORMAT, "model '%s': config.json is not a JSON object", c->src_name);
        }
        for (int k = 0; k < 2; k++) {
            const char *key = k ? "quantization_config" : "quantization";
            cJSON *q = cJSON_CreateObject();
            cJSON_AddNumberToObject(q, "group_size", c->p.group_size);
            cJSON_AddNumberToObject(q, "bits", c->p.bits);
            cJSON_DeleteItemFromObjectCaseSensitive(root, key);
            cJSON_AddItemToObject(root, key, q);
        }
        char *txt = cJSON_Print(root);
        cJSON_Delete(root);
        if (!txt)
            return LMS_ENOMEM;
        uint8_t *rec;
        size_t rl;
        int rc2 = lms__file_rec_encode(txt, strlen(txt), 3, &rec, &rl);
        cJSON_free(txt);
        if (rc2)
            return rc2;
        lms__free(c->files[i].rec);
        c->files[i].rec = rec;
        c->files[i].len = rl;
        return 0;
    }
    return lms__err(LMS_EFORMAT, "model '%s' has no config.json, where MLX keeps its quantization", c->src_name);
}

/* Add the MLX side tensors of weight i (X.scales, X.biases) after it. */
static int add_mlx_side(qctx *c, size_t i, qt **scales, qt **biases)
{
    size_t nl = strlen(c->t[i].name) - 7;
    for (int k = 0; k < 2; k++) {
        char name[512];
        snprintf(name, sizeof name, "%.*s.%s", (int)nl, c->t[i].name, k ? "biases" : "scales");
        for (size_t j = 0; j < c->nt; j++)
            if (!strcmp(c->t[j].name, name))
                return lms__err(LMS_EEXIST, "model '%s' already has a tensor '%s'", c->src_name, name);
        qt *t;
        int rc = add_tensor(c, name, strlen(name), &t); /* may move c->t */
        if (rc)
            return rc;
        const qt *w = &c->t[i];
        t->action = FROM_MEM;
        t->out.dtype = c->sdt;
        t->out.ndim = 2;
        t->out.shape[0] = w->src.shape[0];
        t->out.shape[1] = w->src.shape[1] / c->p.group_size;
        t->out.layer = w->src.layer;
        t->out.order = w->src.order; /* placed right after the weight (see commit) */
        t->out.nbytes = t->out.shape[0] * t->out.shape[1] * esz(c->sdt);
        if (!(t->mem = lms__malloc((size_t)t->out.nbytes ? (size_t)t->out.nbytes : 1)))
            return LMS_ENOMEM;
    }
    *scales = &c->t[c->nt - 2];
    *biases = &c->t[c->nt - 1];
    return 0;
}

static int run(qctx *c)
{
    size_t n_src = c->nt;
    uint64_t total = 0;
    int8_t *plan = lms__calloc(n_src ? n_src : 1, 1);
    lms_dtype *targets = lms__calloc(n_src ? n_src : 1, sizeof *targets);
    int rc = plan && targets ? 0 : LMS_ENOMEM;
    for (size_t i = 0; i < n_src; i++) {
        const char *n = c->t[i].name;
        size_t nl = strlen(n);
        c->has_lm_head |= !strcmp(n, "lm_head.weight");
        c->n_attn_v += nl > 24 && !strcmp(n + nl - 24, ".self_attn.v_proj.weight");
        c->n_down += nl > 21 && !strcmp(n + nl - 21, ".mlp.down_proj.weight");
    }
    if (!rc && c->p.mix_k_m && c->n_attn_v == 80)
        rc = lms__err(LMS_EUNSUPPORTED, "model '%s' has 80 layers: llama-quantize's Q4_K_M gives its v_proj Q5_K, "
                      "which lmstore does not quantize to", c->src_name);
    for (size_t i = 0; !rc && i < n_src; i++) {
        int a = plan_one(c, &c->t[i], &targets[i]);
        if (a < 0)
            rc = a;
        else
            plan[i] = (int8_t)a;
        if (a == QUANT)
            total += c->t[i].src.nbytes;
    }
    /* the scales' dtype: the source's float dtype (F16 for GGUF-quantized sources) */
    c->sdt = LMS_DTYPE_F16;
    for (size_t i = 0; !rc && i < n_src; i++)
        if (plan[i] == QUANT && (c->t[i].src.dtype == LMS_DTYPE_BF16 || c->t[i].src.dtype == LMS_DTYPE_F32)) {
            c->sdt = c->t[i].src.dtype;
            break;
        }
    if (!rc && c->p.type == LMS_DTYPE_MLX_AFFINE)
        rc = mlx_config(c);
    if (!rc)
        c->prog = c->p.progress ? lms__progress_start("quantize", total, "B") : NULL;
    for (size_t i = 0; !rc && i < n_src; i++) {
        qt *t = &c->t[i];
        t->out = t->src;
        if (plan[i] == KEEP) {
            t->action = KEEP;
            c->st.bytes_shared += t->src.nbytes;
            continue;
        }
        t->action = QUANT;
        t->out.dtype = targets[i];
        t->out.bits = targets[i] == LMS_DTYPE_MLX_AFFINE ? c->p.bits : 0;
        t->out.group = targets[i] == LMS_DTYPE_MLX_AFFINE ? c->p.group_size : 0;
        if ((rc = lms_dtype_nbytes(t->out.dtype, t->out.bits, t->out.shape, 2, &t->out.nbytes)))
            break;
        qt *sc = NULL, *bi = NULL;
        if (targets[i] == LMS_DTYPE_MLX_AFFINE && (rc = add_mlx_side(c, i, &sc, &bi)))
            break;
        rc = quantize_tensor(c, &c->t[i], sc, bi);
        c->st.quantized++;
    }
    lms__progress_done(c->prog);
    c->prog = NULL;
    lms__free(plan);
    lms__free(targets);
    return rc;
}

/* ---- commit ------------------------------------------------------------------------------------ */

/* Storage order: the source's, MLX scales and biases right after their weight. */
static int cmp_out_order(const void *a, const void *b)
{
    const qt *x = a, *y = b;
    if (x->out.order != y->out.order)
        return x->out.order < y->out.order ? -1 : 1;
    if (x->action != y->action)
        return x->action == FROM_MEM ? 1 : -1;
    return strcmp(x->name, y->name);
}

static int commit_fn(lms_store *s, MDB_txn *txn, void *vctx)
{
    qctx *c = vctx;
    MDB_val v;
    int rc = lms__db_get(s, txn, LMS__DB_MODELS, c->src_name, strlen(c->src_name), &v);
    if (rc == LMS_ENOENT)
        return lms__err(LMS_ENOENT, "model '%s' was removed while it was being quantized", c->src_name);
    if (rc)
        return rc;
    rc = lms__db_get(s, txn, LMS__DB_MODELS, c->dst_name, strlen(c->dst_name), &v);
    if (rc == 0)
        return lms__err(LMS_EEXIST, "model '%s' already exists in %s", c->dst_name, s->path);
    if (rc != LMS_ENOENT)
        return rc;
    /* blobs: a new record per fresh blob (with all its references), +1 per other reference */
    for (size_t i = 0; i < c->nt; i++) {
        qt *t = &c->t[i];
        if (!t->fresh)
            continue;
        uint64_t refs = 0;
        for (size_t j = 0; j < c->nt; j++)
            refs += !memcmp(c->t[j].out.hash, t->out.hash, 16);
        lms__blob_rec r = {.kind = LMS__BLOB_TENSOR, .segment = t->seg, .offset = t->off, .size = t->out.nbytes,
                           .refs = refs};
        if ((rc = lms__blob_put(s, txn, t->out.hash, &r)))
            return rc;
    }
    const char **names = lms__malloc((c->nt ? c->nt : 1) * sizeof *names);
    lms__tensor_rec *recs = lms__malloc((c->nt ? c->nt : 1) * sizeof *recs);
    if (!names || !recs) {
        rc = LMS_ENOMEM;
        goto out;
    }
    c->st.bytes_total = 0;
    for (size_t k = 0; k < c->nt; k++) {
        qt *t = &c->t[k];
        bool fresh_here = false;
        for (size_t j = 0; j < c->nt && !fresh_here; j++)
            fresh_here = c->t[j].fresh && !memcmp(c->t[j].out.hash, t->out.hash, 16);
        if (!fresh_here && (rc = lms__blob_ref(s, txn, t->out.hash, 1, NULL))) {
            rc = lms__err_prefix(rc, "tensor '%s': ", t->name);
            goto out;
        }
        names[k] = t->name;
        recs[k] = t->out;
        c->st.bytes_total += t->out.nbytes;
    }
    lms__model_put mp = {.name = c->dst_name, .arch = c->arch, .source = c->source, .st_meta = c->st_meta,
                         .id = c->id, .nt = c->nt, .tnames = names, .trecs = recs, .nf = c->nf, .files = c->files};
    rc = lms__model_put_records(s, txn, &mp);
    c->st.tensors = c->nt;
out:
    lms__free(names);
    lms__free(recs);
    return rc;
}

/* The new model's id: over its config.json and tensor records. */
static int new_id(qctx *c)
{
    lms__id_tensor *ids = lms__calloc(c->nt ? c->nt : 1, sizeof *ids);
    char *cfg = NULL;
    size_t cfg_len = 0;
    int rc = ids ? 0 : LMS_ENOMEM;
    for (size_t i = 0; !rc && i < c->nf; i++) {
        if (strcmp(c->files[i].name, "config.json"))
            continue;
        lms__file_rec fr;
        rc = lms__file_rec_decode(c->files[i].rec, c->files[i].len, &fr);
        if (!rc)
            rc = lms__file_rec_inflate(&fr, "config.json", &cfg, &cfg_len);
    }
    for (size_t i = 0; !rc && i < c->nt; i++)
        ids[i] = (lms__id_tensor){c->t[i].name, &c->t[i].out};
    if (!rc)
        rc = lms__model_id(cfg, cfg_len, ids, c->nt, c->id);
    lms__free(ids);
    lms__free(cfg);
    return rc;
}

int lms_model_quantize(lms_store *s, const char *src, const char *dst, const lms_quantize_params *params,
                       lms_quantize_stats *stats)
{
    double t0 = lms__now();
    qctx c;
    memset(&c, 0, sizeof c);
    c.s = s;
    c.src_name = src;
    c.dst_name = dst;
    c.p = params ? *params : lms_quantize_default_params();
    if (stats)
        memset(stats, 0, sizeof *stats);
    if (!s || !src || !dst)
        return lms__err(LMS_EINVAL, "lms_model_quantize: store and model names are required");
    if (s->rdonly)
        return lms__err(LMS_EINVAL, "%s: store is open read-only", s->path);
    int rc = lms__name_check(LMS__NAME_MODEL, dst);
    if (rc)
        return rc;
    if (c.p.type == LMS_DTYPE_MLX_AFFINE) {
        if (!c.p.group_size)
            c.p.group_size = 64;
        if (!lms__mlx_bits_ok(c.p.bits) || !lms__mlx_group_ok(c.p.group_size))
            return lms__err(LMS_EINVAL, "MLX quantization takes bits 2, 3, 4, 5, 6 or 8 and group sizes 32, 64 or "
                            "128 (not %u bits in groups of %u)", c.p.bits, c.p.group_size);
    } else if (!lms__quant_supported(c.p.type) || c.p.type == LMS_DTYPE_Q8_K) {
        return lms__err(LMS_EINVAL, "cannot quantize to %s (Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K and MLX affine)",
                        lms_dtype_name(c.p.type) ? lms_dtype_name(c.p.type) : "?");
    }
    if (c.p.mix_k_m && c.p.type != LMS_DTYPE_Q4_K)
        return lms__err(LMS_EINVAL, "the K_M mix goes with Q4_K (Q4_K_M), not %s", lms_dtype_name(c.p.type));
    char tname[32];
    if (c.p.type == LMS_DTYPE_MLX_AFFINE)
        snprintf(tname, sizeof tname, "mlx%u (group %u)", c.p.bits, c.p.group_size);
    else
        snprintf(tname, sizeof tname, "%s%s", lms_dtype_name(c.p.type), c.p.mix_k_m ? "_M" : "");
    if (!(c.source = lms__asprintf("lmstore quantize '%s' to %s%s", src, tname,
                                   c.p.keep_embeddings ? ", embeddings kept" : ""))) {
        rc = LMS_ENOMEM;
        goto out;
    }
    if ((rc = lms__pool_create(c.p.threads, &c.pool)))
        goto out;
    c.nworkers = lms__pool_threads(c.pool);
    if (!(c.cmp_buf = lms__malloc(2 * CMP_CHUNK)) || !(c.scratch = lms__calloc((size_t)c.nworkers, sizeof *c.scratch))) {
        rc = LMS_ENOMEM;
        goto out;
    }
    /* 1. under the append lock, so the source's blobs stay while we reference them */
    if ((rc = lms__append_begin(s, &c.app)) || (rc = read_source(&c)))
        goto out;
    uint64_t maxcols = 1;
    for (size_t i = 0; i < c.nt; i++)
        if (c.t[i].src.ndim == 2)
            maxcols = LMS_MAX(maxcols, c.t[i].src.shape[1]);
    for (int w = 0; w < c.nworkers; w++)
        if (!(c.scratch[w] = lms__malloc((size_t)maxcols * 4))) {
            rc = LMS_ENOMEM;
            goto out;
        }
    /* 2-3. */
    if ((rc = run(&c)))
        goto out;
    if (c.nt > 1)
        qsort(c.t, c.nt, sizeof *c.t, cmp_out_order);
    if ((rc = new_id(&c)) || (rc = lms__append_sync(c.app)))
        goto out;
    /* 4. */
    if ((rc = lms__txn_write(s, commit_fn, &c)))
        goto out;
    lms__append_end(c.app, true);
    c.app = NULL;
    if (stats) {
        *stats = c.st;
        stats->seconds = lms__now() - t0;
    }
out:
    if (rc)
        rc = lms__err_prefix(rc, "quantize '%s' -> '%s': ", src, dst);
    lms__progress_done(c.prog);
    lms__append_end(c.app, false); /* 5. roll back; NULL after a commit */
    lms__pool_destroy(c.pool);
    lms__emodel_free(&c.em);
    lms__segment_unmap(&c.cmp_map);
    for (size_t i = 0; i < c.nt; i++) {
        lms__free(c.t[i].name);
        lms__free(c.t[i].mem);
    }
    lms__free(c.t);
    lms__named_recs_free(c.files, c.nf);
    for (int w = 0; c.scratch && w < c.nworkers; w++)
        lms__free(c.scratch[w]);
    lms__free(c.scratch);
    lms__free(c.cmp_buf);
    lms__free(c.arch);
    lms__free(c.st_meta);
    lms__free(c.source);
    return rc;
}
