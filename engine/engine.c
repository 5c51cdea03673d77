/*
 * engine/engine.c - lms_engine: ties a model opened by the loader (weights
 * read in place), the paged KV cache (one sequence per engine, prefix pages
 * kept for reuse) and the forward pass together; the step API and sessions.
 *
 * Sequence state: the KV cache's sequence holds the tokens whose K/V are
 * computed (length == committed). At most one more token, `pending`, may
 * follow it: the last sampled token of lms_generate, known but not yet run
 * through the model (running it would cost a forward pass nobody may need).
 * The next eval runs it first; a session save runs it before saving, so a
 * saved session always holds every token of the conversation.
 */
#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>

#include "engine/internal.h"
#include "engine/engine_priv.h"
#include "engine/backend.h"
#include "loader/device.h"
#include "lmstore/loader.h"

lms_engine_params lms_engine_default_params(void)
{
    lms_engine_params p;
    memset(&p, 0, sizeof p);
    return p;
}

/* ---- the loader as weight source ---------------------------------------------------------- */

static int model_tensor(void *ctx, const char *name, lms_dtype *dt, uint32_t *ndim, uint64_t shape[LMS_MAX_DIMS],
                        const void **data, const void **dev, uint64_t *nbytes)
{
    const lms_tensor *t = lms_model_tensor(ctx, name);
    if (!t) {
        lms_clear_error();
        return LMS_ENOENT;
    }
    *dt = t->dtype;
    *ndim = t->ndim;
    memcpy(shape, t->shape, sizeof t->shape);
    *data = t->host;
    *dev = t->device;
    *nbytes = t->nbytes;
    return 0;
}

static int model_file(void *ctx, const char *name, char **data, size_t *len)
{
    void *d = NULL;
    int rc = lms_model_file(ctx, name, &d, len);
    *data = d;
    return rc;
}

static int model_tokenizer(void *ctx, lms_tokenizer **out) { return lms_model_tokenizer(ctx, out); }

static int wait_layer(void *ctx, int32_t layer) { return lms_model_wait_layer(ctx, layer); }

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

/* The tensors' pages, in storage (forward-pass) order, 16 MiB at a time. A
 * hint: what it does not reach, the forward pass faults in. */
static void model_prefetch(void *ctx, const atomic_bool *stop)
{
    const lms_model *m = ctx;
    for (size_t i = 0, n = lms_model_tensor_count(m); i < n && !atomic_load(stop); i++) {
        const lms_tensor *t = lms_model_tensor_at(m, i);
        uintptr_t a = (uintptr_t)t->host & ~(uintptr_t)4095, e = (uintptr_t)t->host + t->nbytes;
        for (; t->host && a < e && !atomic_load(stop); a += (uintptr_t)16 << 20)
            (void)madvise((void *)a, LMS_MIN((uintptr_t)16 << 20, e - a), MADV_POPULATE_READ);
    }
}

/* ---- creation ---------------------------------------------------------------------------------- */

static int read_opt_file(const lms__wsrc *src, const char *name, char **out)
{
    size_t len;
    int rc = src->file(src->ctx, name, out, &len);
    if (rc == LMS_ENOENT) {
        lms_clear_error();
        *out = NULL;
        return 0;
    }
    return rc;
}

/* ---- the tokenizer, opened beside the rest of start-up --------------------------------------- */

/*
 * Opening the tokenizer needs nothing the rest of engine creation makes, so
 * it runs on a thread of its own meanwhile (a compiled image opens in well
 * under a millisecond; tokenizer.json of a model imported before images
 * existed takes 0.1-1.5 s to parse). On the CPU that thread then reads the
 * weights' pages into the page tables for as long as this one still works
 * (committing the KV arena, mostly): a core that would idle does what the
 * first forward pass would do in its page faults (bench/RESULTS.md, cold
 * start). Errors are thread-local: the job keeps the message and the
 * creating thread raises it again.
 */
typedef struct tok_job {
    const lms__wsrc *src;
    bool skip;          /* lms_engine_params.no_tokenizer */
    bool prefetch;      /* then src->prefetch */
    lms_tokenizer *tok; /* NULL: the model has none */
    int rc;
    char err[1024];
    double ms, prefetch_ms;
    atomic_bool stop;   /* the creating thread is done: prefetching ends */
    pthread_t th;
    bool started;
} tok_job;

static int open_tokenizer(const lms__wsrc *src, lms_tokenizer **out)
{
    char *tokj = NULL, *tokc = NULL;
    int rc;
    *out = NULL;
    if (src->tokenizer) {
        rc = src->tokenizer(src->ctx, out);
        if (rc == LMS_ENOENT) { /* a model may come without one */
            lms_clear_error();
            rc = 0;
        }
        return rc;
    }
    if ((rc = read_opt_file(src, "tokenizer.json", &tokj)) || (rc = read_opt_file(src, "tokenizer_config.json", &tokc)))
        goto out;
    if (tokj && (rc = lms_tokenizer_load(tokj, strlen(tokj), tokc, out)))
        lms__err_prefix(rc, "%s: tokenizer.json: ", src->name);
out:
    src->free_file(tokj);
    src->free_file(tokc);
    return rc;
}

static void *tok_job_run(void *arg)
{
    tok_job *j = arg;
    double t0 = lms__now();
    j->rc = j->skip ? 0 : open_tokenizer(j->src, &j->tok);
    if (j->rc)
        snprintf(j->err, sizeof j->err, "%s", lms_last_error());
    double t1 = lms__now();
    j->ms = (t1 - t0) * 1e3;
    if (j->prefetch && !j->rc)
        j->src->prefetch(j->src->ctx, &j->stop);
    j->prefetch_ms = (lms__now() - t1) * 1e3;
    return NULL;
}

static void tok_job_start(tok_job *j)
{
    j->started = pthread_create(&j->th, NULL, tok_job_run, j) == 0;
    if (!j->started)
        tok_job_run(j); /* no thread to be had: in series */
}

static void tok_job_join(tok_job *j)
{
    atomic_store(&j->stop, true); /* prefetching only while this thread works */
    if (j->started) {
        pthread_join(j->th, NULL);
        j->started = false;
    }
}

/* Wait for the job; its error (if any) becomes this thread's. */
static int tok_job_finish(tok_job *j)
{
    tok_job_join(j);
    return j->rc ? lms__err(j->rc, "%s", j->err) : 0;
}

/* Settings in effect: defaults resolved, ranges checked. */
static int resolve_params(lms_engine *e, const lms__hparams *hp, const lms__wsrc *src)
{
    bool on_device = e->dev->kind != LMS_DEVICE_CPU;
    if (e->p.threads <= 0)
        e->p.threads = lms__cpu_count();
    if (e->p.n_ctx == 0)
        e->p.n_ctx = LMS_MIN(hp->max_pos, 4096u);
    if (e->p.n_ctx > (1u << 20))
        return lms__err(LMS_EINVAL, "engine: n_ctx %u is too large", e->p.n_ctx);
    if (e->p.kv_dtype == LMS_DTYPE_BOOL)
        e->p.kv_dtype = LMS_DTYPE_F16;
    if (e->p.kv_dtype != LMS_DTYPE_F32 && e->p.kv_dtype != LMS_DTYPE_F16 && e->p.kv_dtype != LMS_DTYPE_BF16)
        return lms__err(LMS_EINVAL, "engine: KV dtype must be F32, F16 or BF16");
    if (e->p.kv_page_tokens == 0)
        e->p.kv_page_tokens = LMS_KV_PAGE_TOKENS_DEFAULT;
    if (e->p.prefill_block == 0) {
        if (!on_device) {
            /* each weight read from memory once per 512 tokens; the packed products
             * amortize their panels over more tokens (bench_kernels, 8192 x 2048
             * bf16: 98 GMAC/s at 128 tokens, 106 at 512) for 15-70 MiB of scratch */
            e->p.prefill_block = 512;
        } else {
            /* a device computes a whole prompt per pass while its scratch (the f32
             * activation rows of every buffer and the GEMM input) stays under 4%
             * of the weights' bytes; 2048 rows at most, 64 at least */
            uint64_t wb = lms__weights_bytes(&e->w, hp);
            uint64_t qd = (uint64_t)hp->n_heads * hp->head_dim, kvd = (uint64_t)hp->n_kv_heads * hp->head_dim;
            uint64_t row = 4 * (2 * hp->n_embd + 2 * qd + 2 * kvd + 2 * hp->n_ff +
                                LMS_MAX(LMS_MAX((uint64_t)hp->n_embd, qd), (uint64_t)hp->n_ff));
            uint32_t blk = 64;
            while (blk < 2048 && 2 * blk * row <= wb / 25) blk *= 2;
            e->p.prefill_block = blk;
        }
    }
    e->p.prefill_block = LMS_MIN(e->p.prefill_block, on_device ? 4096u : 512u);
    e->p.prefill_block = LMS_MIN(e->p.prefill_block, e->p.n_ctx);
    e->max_block = LMS_MAX(e->max_block, e->p.prefill_block);
    return 0;
}

/* The KV cache on the engine's device, its arena touched now so that memory
 * stays flat while tokens flow. Sliding-window layers get the cache's window
 * group, sized for what sequences hold of it (not for n_ctx): the last window
 * and a prefill block, for the live sequence and one more (a resumed session,
 * a looked-up prefix), and as many again for pages that slid out, which a
 * prefix lookup or a truncation may attach again. */
static int create_kv(lms_engine *e, const lms__hparams *hp, const uint8_t *model_id)
{
    int rc;
    uint32_t P = e->p.kv_page_tokens;
    lms_kv_layout lay = {hp->n_layers, hp->n_kv_heads, hp->head_dim, e->p.kv_dtype, P, 0, NULL};
    lms_kv_params kp = lms_kv_default_params();
    uint64_t pages_ctx = (e->p.n_ctx + P - 1) / P + 1;
    if (e->p.kv_bytes)
        kp.budget_bytes = e->p.kv_bytes;
    else
        kp.budget_pages = e->kv_pages ? e->kv_pages : 2 * pages_ctx;
    if (hp->window) {
        uint64_t per_seq = ((uint64_t)hp->window + e->max_block + P - 1) / P + 2;
        lay.window = hp->window;
        lay.sliding = hp->sliding;
        kp.window_pages = LMS_MIN((4 + (uint64_t)e->kv_seqs) * per_seq, (2 + (uint64_t)e->kv_seqs) * pages_ctx);
    }
    kp.max_seqs = 4 + e->kv_seqs;
    kp.max_seq_tokens = e->p.n_ctx;
    memcpy(kp.model_id, model_id, LMS_MODEL_ID_LEN);
    if ((rc = lms_kv_create(e->dev, &lay, &kp, &e->kv)) || (rc = lms_kv_seq_new(e->kv, &e->seq)))
        return rc;
    lms_kv_geometry g;
    lms_kv_get_geometry(e->kv, &g);
    e->kvv.base = g.base;
    e->kvv.dtype = e->p.kv_dtype;
    e->kvv.page_tokens = g.page_tokens;
    e->kvv.elem_size = g.elem_size;
    e->kvv.token_bytes = g.token_bytes;
    e->kvv.head_bytes = g.head_bytes;
    e->kvv.v_offset = g.v_offset;
    e->kvv.layer_bytes = g.layer_bytes;
    e->kvv.page_bytes = g.page_bytes;
    if (hp->window) {
        if (!(e->kv_group = lms__malloc(hp->n_layers)) || !(e->kv_index = lms__malloc(hp->n_layers * sizeof(uint32_t))))
            return LMS_ENOMEM;
        for (uint32_t l = 0; l < hp->n_layers; l++)
            e->kv_group[l] = (uint8_t)lms_kv_layer_group(e->kv, l, &e->kv_index[l]);
        e->kvv.window = hp->window;
        e->kvv.group = e->kv_group;
        e->kvv.index = e->kv_index;
        e->kvv.wbase = g.window_base;
        e->kvv.wpage_bytes = g.window_page_bytes;
    }
    return 0;
}

/* The view's block tables: the sequence's now. */
static void view_tables(lms_engine *e)
{
    uint32_t np;
    e->kvv.pages = lms_kv_seq_pages(e->seq, &np);
    e->kvv.n_pages = np;
    if (e->kvv.window)
        e->kvv.wpages = lms_kv_seq_window_pages(e->seq, &e->kvv.wfirst, &np);
}

static bool not_supported(const lms__wt *m) { return !lms__fwd_cuda->supports(m); }

/* The backend of the engine's device; every matrix must be on that device. */
static int choose_backend(lms_engine *e, const lms__wsrc *src, const lms__fwd_ops **ops)
{
    if (e->dev->kind == LMS_DEVICE_CPU) {
        *ops = &lms__fwd_cpu;
        return 0;
    }
    if (!lms__fwd_cuda)
        return lms__err(LMS_EUNSUPPORTED, "engine: this build has no CUDA engine backend");
    char what[128];
    const lms__wt *q = lms__fwd_cuda->supports ? lms__weights_find(&e->w, &e->hp, not_supported, what, sizeof what) : NULL;
    if (q) {
        char enc[48];
        if (q->mlx)
            snprintf(enc, sizeof enc, "MLX affine with %u-bit codes", q->mlx->bits);
        else
            snprintf(enc, sizeof enc, "%s", lms_dtype_name(q->dt) ? lms_dtype_name(q->dt) : "?");
        return lms__err(LMS_EUNSUPPORTED,
                        "%s: tensor '%s' is %s: the CUDA engine backend runs BF16, F16, F32 and MLX 4- and 8-bit "
                        "weights (run this model on the CPU, or quantize it with --type mlx4 or mlx8)",
                        src->name, what, enc);
    }
    if (!lms__weights_on_device(&e->w, &e->hp))
        return lms__err(LMS_EINVAL,
                        "%s: the model's weights are not on the engine's device: open the model on it "
                        "(lms_model_params.device) with a mapped or resident placement",
                        src->name);
    *ops = lms__fwd_cuda;
    return 0;
}

int lms__engine_create_src(const lms__wsrc *src, const uint8_t *model_id, lms_device *dev,
                           const lms_engine_params *params, lms_engine **out)
{
    return lms__engine_create_ex(src, model_id, dev, params, NULL, out);
}

int lms__engine_create_ex(const lms__wsrc *src, const uint8_t *model_id, lms_device *dev,
                          const lms_engine_params *params, const lms__engine_opts *opts, lms_engine **out)
{
    int rc;
    double t0 = lms__now(), t;
    char *cfg = NULL, *gen = NULL;
    size_t len;
    const lms__fwd_ops *ops = NULL;
    /* weights read on the CPU from the mapping: prefetched beside (not a device's copy) */
    tok_job tj = {.src = src, .skip = params && params->no_tokenizer, .prefetch = !dev && src->prefetch};
    lms_engine *e = lms__calloc(1, sizeof *e);
    *out = NULL;
    if (!e)
        return LMS_ENOMEM;
    e->p = params ? *params : lms_engine_default_params();
    e->src = *src;
    e->pending = -1;
    if (opts) {
        e->kv_seqs = opts->kv_seqs;
        e->kv_pages = opts->kv_pages;
        e->max_block = opts->max_block;
    }
    tok_job_start(&tj);
    if ((rc = src->file(src->ctx, "config.json", &cfg, &len))) {
        if (rc == LMS_ENOENT)
            rc = lms__err(LMS_ENOENT, "%s: no config.json among the model's files", src->name);
        goto fail;
    }
    if ((rc = read_opt_file(src, "generation_config.json", &gen)))
        goto fail;
    if ((rc = lms__config_parse(cfg, gen, src->name, &e->hp)))
        goto fail;
    if ((rc = lms__weights_bind(src, &e->hp, &e->w)))
        goto fail;
    if (dev) {
        e->dev = dev;
    } else {
        if ((rc = lms_device_open(LMS_DEVICE_CPU, 0, &e->dev)))
            goto fail;
        e->own_dev = true;
    }
    const lms__hparams *hp = &e->hp;
    if ((rc = resolve_params(e, hp, src)) || (rc = choose_backend(e, src, &ops)))
        goto fail;
    e->kernels = lms__kernels_best();
    double t_cfg = lms__now();
    if ((rc = lms__pool_create(ops == &lms__fwd_cpu ? e->p.threads : 1, &e->pool)))
        goto fail;
    if ((rc = create_kv(e, hp, model_id)))
        goto fail;
    double t_kv = lms__now();
    /* the batched engine's steps take a segment per sequence it runs (kv_seqs) */
    if ((rc = lms__fwd_create(ops, hp, &e->w, e->dev, e->kernels, e->pool, e->max_block, 1 + e->kv_seqs, e->p.n_ctx,
                              &e->kvv, &e->fwd)))
        goto fail;
    lms_device_info di;
    if (lms_device_get_info(e->dev, &di) == 0)
        snprintf(e->device_name, sizeof e->device_name, "%s", di.name);
    else
        snprintf(e->device_name, sizeof e->device_name, "%s", e->dev->ops->name);

    if (!(e->tokbuf = lms__malloc(((size_t)e->p.n_ctx + 2) * sizeof(int32_t))) ||
        !(e->evalbuf = lms__malloc(((size_t)e->p.n_ctx + 2) * sizeof(int32_t))) ||
        !(e->keepbuf = lms__malloc(((size_t)e->p.n_ctx + 2) * sizeof(int32_t))) ||
        !(e->logits = lms__aligned_alloc(64, (size_t)hp->n_vocab * sizeof(float)))) {
        rc = LMS_ENOMEM;
        goto fail;
    }

    /* the tokenizer (optional: a model may come without one), opened meanwhile */
    t = lms__now();
    rc = tok_job_finish(&tj);
    e->tok = tj.tok;
    if (rc)
        goto fail;
    snprintf(e->name, sizeof e->name, "%s", src->name);
    e->load_ms = (lms__now() - t0) * 1e3;
    lms__debug("%s: engine created in %.1f ms: config and weights %.1f ms, KV cache %.1f ms, forward pass %.1f ms; "
               "beside them tokenizer %.1f ms, weights prefetch %.1f ms (waited %.1f ms for them)",
               src->name, e->load_ms, (t_cfg - t0) * 1e3, (t_kv - t_cfg) * 1e3, (t - t_kv) * 1e3, tj.ms,
               tj.prefetch_ms, (lms__now() - t) * 1e3);
    src->free_file(cfg);
    src->free_file(gen);
    *out = e;
    return 0;
fail:
    tok_job_join(&tj); /* this thread's error is the one reported */
    if (!e->tok)
        lms_tokenizer_free(tj.tok);
    src->free_file(cfg);
    src->free_file(gen);
    lms_engine_free(e);
    return rc;
}

int lms_engine_create(lms_model *model, const lms_engine_params *params, lms_engine **out)
{
    return lms__engine_create_model(model, params, NULL, out);
}

int lms__engine_create_model(lms_model *model, const lms_engine_params *params, const lms__engine_opts *opts,
                             lms_engine **out)
{
    if (!out)
        return lms__err(LMS_EINVAL, "lms_engine_create: out is NULL");
    *out = NULL;
    if (!model)
        return lms__err(LMS_EINVAL, "lms_engine_create: model is NULL");
    lms_device *dev = params && params->device ? params->device : lms_model_device(model);
    if (dev && lms_model_device(model) != dev && dev->kind != LMS_DEVICE_CPU)
        return lms__err(LMS_EINVAL, "%s: the engine's device is not the one the model was opened on",
                        lms_model_name(model));
    if (dev && dev->kind == LMS_DEVICE_CPU)
        dev = NULL; /* the CPU backend reads host views; its KV cache lives in host memory */
    lms__wsrc src = {model, model_tensor, model_file, lms_free, lms_model_name(model), model_tokenizer,
                     model_prefetch};
    /* A resident load may still be copying: the engine is created meanwhile (its
     * scratch, KV cache and libraries while the weights arrive) and its first
     * steps run each layer as that layer's weights are in (lms__fwd_gate). */
    lms_engine *e = NULL;
    int rc = lms__engine_create_ex(&src, lms_model_id(model), dev, params, opts, &e);
    if (!rc && dev && !lms_model_layer_ready(model, LMS_LAYER_ALL))
        rc = lms__fwd_gate(e->fwd, wait_layer, model);
    if (rc) {
        lms_engine_free(e);
        return rc;
    }
    *out = e;
    return 0;
}

void lms_engine_free(lms_engine *e)
{
    if (!e)
        return;
    lms_tokenizer_free(e->tok);
    lms__fwd_free(e->fwd);
    if (e->kv) {
        lms_kv_seq_free(e->kv, e->seq);
        lms_kv_destroy(e->kv);
        e->kv = NULL;
    }
    if (e->own_dev)
        lms_device_close(e->dev);
    lms__pool_destroy(e->pool);
    lms__weights_release(&e->w);
    lms__free(e->tokbuf);
    lms__free(e->evalbuf);
    lms__free(e->keepbuf);
    lms__free(e->kv_group);
    lms__free(e->kv_index);
    lms__free(e->logits);
    lms__free(e);
}

void lms_engine_get_info(const lms_engine *e, lms_engine_info *o)
{
    memset(o, 0, sizeof *o);
    o->arch = e->hp.family->name;
    o->n_vocab = e->hp.n_vocab;
    o->n_layers = e->hp.n_layers;
    o->n_embd = e->hp.n_embd;
    o->n_heads = e->hp.n_heads;
    o->n_kv_heads = e->hp.n_kv_heads;
    o->head_dim = e->hp.head_dim;
    o->n_ff = e->hp.n_ff;
    o->n_ctx = e->p.n_ctx;
    o->max_pos = e->hp.max_pos;
    o->threads = lms__pool_threads(e->pool);
    o->kv_dtype = e->p.kv_dtype;
    o->kv_page_tokens = e->p.kv_page_tokens;
    o->prefill_block = e->p.prefill_block;
    o->eos_ids = e->hp.eos_ids;
    o->n_eos = (size_t)e->hp.n_eos;
    o->bos_id = e->hp.bos_id;
    o->load_ms = e->load_ms;
    o->device = e->device_name;
    o->kernels = lms__fwd_describe(e->fwd);
}

lms_tokenizer *lms_engine_tokenizer(lms_engine *e) { return e ? e->tok : NULL; }

const char *lms__engine_kernels(const lms_engine *e) { return lms__fwd_describe(e->fwd); }

/* ---- step API ------------------------------------------------------------------------------------ */

size_t lms__engine_len(const lms_engine *e) { return lms_kv_seq_len(e->seq) + (e->pending >= 0); }

static int run_tokens_out(lms_engine *e, const int32_t *toks, size_t n, float *logits, bool all, int32_t *argmax);

/* Make the computed sequence its first n tokens (n <= its length). With
 * sliding-window layers the window pages those need may be gone (given back
 * and evicted): then the sequence goes back to where they are there
 * (lms_kv_seq_keepable) and the tokens after that are run again. If that run
 * fails, the sequence is left where the failure left it (at least m tokens)
 * and the error returned: a failure while restoring does not restore again. */
static int keep_tokens(lms_engine *e, uint32_t n)
{
    uint32_t m = lms_kv_seq_keepable(e->kv, e->seq, n);
    if (m == n)
        return lms_kv_seq_truncate(e->kv, e->seq, n);
    lms_kv_seq_tokens(e->kv, e->seq, e->keepbuf, n);
    int rc = lms_kv_seq_truncate(e->kv, e->seq, m);
    assert(!rc); /* keepable said so */
    lms__debug("%s: recomputing %u tokens whose sliding-window K/V were given back", e->name, n - m);
    e->restoring = true;
    rc = run_tokens_out(e, e->keepbuf + m, n - m, NULL, false, NULL);
    e->restoring = false;
    return rc;
}

/* Run tokens (all new) through the model after the computed part of the
 * sequence. Output: logits (the last row's, or every row's with all), or
 * with argmax the last row's largest logit's id computed on the device.
 * Without sliding-window layers every position is reserved first and
 * committed at the end; with them each prefill block is appended and
 * committed in turn, so that window pages slide along the prompt. After a
 * failure the sequence is as it was (keep_tokens). */
static int run_tokens_out(lms_engine *e, const int32_t *toks, size_t n, float *logits, bool all, int32_t *argmax)
{
    uint32_t len = lms_kv_seq_len(e->seq);
    bool windowed = e->kvv.window != 0;
    int rc;
    assert(lms_kv_seq_committed(e->seq) == len);
    if (n > e->p.n_ctx || len + n > e->p.n_ctx)
        return lms__err(LMS_ENOSPACE, "%s: %zu more tokens would pass the context of %u tokens (%u in use)",
                        e->name, n, e->p.n_ctx, len);
    if (!windowed && (rc = lms_kv_seq_append(e->kv, e->seq, toks, (uint32_t)n)))
        return rc;
    view_tables(e);
    uint32_t B = e->p.prefill_block, V = e->hp.n_vocab;
    for (size_t i = 0; i < n; i += B) {
        uint32_t nb = (uint32_t)LMS_MIN((size_t)B, n - i), pos = len + (uint32_t)i;
        bool last = i + nb == n;
        if (windowed) {
            if ((rc = lms_kv_seq_append(e->kv, e->seq, toks + i, nb)))
                goto fail;
            view_tables(e);
        }
        if (last && argmax) {
            rc = lms__fwd_block_argmax(e->fwd, toks + i, nb, pos, &e->kvv, argmax);
        } else {
            float *lg = !logits ? NULL : all ? logits + i * V : last ? logits : NULL;
            rc = lms__fwd_block(e->fwd, toks + i, nb, pos, &e->kvv, lg, all);
        }
        if (!rc && windowed)
            rc = lms_kv_seq_commit(e->kv, e->seq, pos + nb);
        if (rc)
            goto fail;
    }
    return windowed ? 0 : lms_kv_seq_commit(e->kv, e->seq, len + (uint32_t)n);
fail:
    if (!windowed) {
        lms_kv_seq_truncate(e->kv, e->seq, len);
    } else {
        /* what this call committed, then back to len (the error of the step first) */
        char detail[512];
        snprintf(detail, sizeof detail, "%s", lms_last_error());
        lms_kv_seq_truncate(e->kv, e->seq, lms_kv_seq_committed(e->seq));
        if (!e->restoring && keep_tokens(e, len))
            lms__warn("%s: after a failed step the sequence could not be restored to %u tokens: %s", e->name, len,
                      lms_last_error());
        lms__err(rc, "%s", detail);
    }
    return rc;
}

static int run_tokens(lms_engine *e, const int32_t *toks, size_t n, float *logits, bool all)
{
    return run_tokens_out(e, toks, n, logits, all, NULL);
}

static int check_ids(const lms_engine *e, const int32_t *t, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (t[i] < 0 || (uint32_t)t[i] >= e->hp.n_vocab)
            return lms__err(LMS_EINVAL, "%s: token id %d (at %zu) is outside the vocabulary of %u", e->name,
                            (int)t[i], i, e->hp.n_vocab);
    return 0;
}

/* Run the pending token if there is one (its logits are not needed). */
int lms__engine_flush_pending(lms_engine *e)
{
    if (e->pending < 0)
        return 0;
    int32_t t = e->pending;
    int rc = run_tokens(e, &t, 1, NULL, false);
    if (!rc)
        e->pending = -1;
    return rc;
}

int lms_engine_eval(lms_engine *e, const int32_t *tokens, size_t n, float *logits, unsigned flags)
{
    int rc;
    if (!e || (!tokens && n))
        return lms__err(LMS_EINVAL, "lms_engine_eval: bad arguments");
    if (n == 0)
        return lms__err(LMS_EINVAL, "lms_engine_eval: no tokens");
    if ((rc = check_ids(e, tokens, n)))
        return rc;
    bool all = flags & LMS_EVAL_ALL;
    if (e->pending >= 0 && !all) {
        /* run the pending token in the same pass */
        if (n + 1 > e->p.n_ctx)
            return lms__err(LMS_ENOSPACE, "%s: %zu tokens pass the context of %u", e->name, n + 1, e->p.n_ctx);
        e->evalbuf[0] = e->pending;
        memcpy(e->evalbuf + 1, tokens, n * sizeof *tokens);
        if ((rc = run_tokens(e, e->evalbuf, n + 1, logits, false)))
            return rc;
        e->pending = -1;
        return 0;
    }
    if ((rc = lms__engine_flush_pending(e)))
        return rc;
    return run_tokens(e, tokens, n, logits, all);
}

const int32_t *lms_engine_tokens(const lms_engine *e, size_t *n)
{
    lms_engine *m = (lms_engine *)e;
    uint32_t len = lms_kv_seq_tokens(e->kv, e->seq, m->tokbuf, e->p.n_ctx);
    if (e->pending >= 0)
        m->tokbuf[len++] = e->pending;
    *n = len;
    return m->tokbuf;
}

int lms_engine_truncate(lms_engine *e, size_t n_keep)
{
    uint32_t len = lms_kv_seq_len(e->seq);
    if (n_keep > lms__engine_len(e))
        return lms__err(LMS_EINVAL, "%s: cannot keep %zu tokens of %zu", e->name, n_keep, lms__engine_len(e));
    if (n_keep > len)
        return 0; /* keeps the pending token */
    e->pending = -1;
    return keep_tokens(e, (uint32_t)n_keep);
}

size_t lms__engine_keepable(const lms_engine *e, size_t n)
{
    uint32_t len = lms_kv_seq_len(e->seq);
    return n > len ? n : lms_kv_seq_keepable(e->kv, e->seq, (uint32_t)n);
}

void lms_engine_reset(lms_engine *e)
{
    lms_kv_seq *s = NULL;
    e->pending = -1;
    /* free first so the sequence's full pages become cached prefix pages */
    lms_kv_seq_free(e->kv, e->seq);
    e->seq = NULL;
    if (lms_kv_seq_new(e->kv, &s) == 0)
        e->seq = s;
    assert(e->seq); /* a slot was just released */
}

/* ---- sessions ------------------------------------------------------------------------------------- */

int lms_engine_session_save(lms_engine *e, lms_store *store, const char *name)
{
    int rc;
    if (!e || !store || !name || !*name)
        return lms__err(LMS_EINVAL, "lms_engine_session_save: bad arguments");
    if ((rc = lms__engine_flush_pending(e)))
        return rc;
    if (lms_kv_seq_len(e->seq) == 0)
        return lms__err(LMS_EINVAL, "%s: session '%s': the sequence is empty", e->name, name);
    return lms_kv_save(e->kv, e->seq, store, name);
}

int lms_engine_session_load(lms_engine *e, lms_store *store, const char *name)
{
    lms_kv_seq *s = NULL;
    int rc;
    if (!e || !store || !name || !*name)
        return lms__err(LMS_EINVAL, "lms_engine_session_load: bad arguments");
    if ((rc = lms_kv_resume(e->kv, store, name, &s)))
        return rc;
    uint32_t n = lms_kv_seq_len(s);
    if (n > e->p.n_ctx) {
        lms_kv_seq_free(e->kv, s);
        return lms__err(LMS_ENOSPACE, "session '%s' holds %u tokens, more than the context of %u", name, n,
                        e->p.n_ctx);
    }
    for (uint32_t i = 0; i < n; i++) {
        int32_t t = lms_kv_seq_token(e->kv, s, i);
        if (t < 0 || (uint32_t)t >= e->hp.n_vocab) {
            lms_kv_seq_free(e->kv, s);
            return lms__err(LMS_ECORRUPT, "session '%s': token %d at %u is outside the vocabulary", name, (int)t, i);
        }
    }
    lms_kv_seq_free(e->kv, e->seq);
    e->seq = s;
    e->pending = -1;
    return 0;
}

/* Run the pending token and write its logits (the decode step of lms_generate). */
int lms__engine_step(lms_engine *e, float *logits)
{
    assert(e->pending >= 0);
    int32_t t = e->pending;
    int rc = run_tokens(e, &t, 1, logits, false);
    if (!rc)
        e->pending = -1;
    return rc;
}

/* Run the pending token; *id = its next token by greedy arg max, computed
 * on the device (lms__engine_has_argmax). */
int lms__engine_step_argmax(lms_engine *e, int32_t *id)
{
    assert(e->pending >= 0);
    int32_t t = e->pending;
    int rc = run_tokens_out(e, &t, 1, NULL, false, id);
    if (!rc)
        e->pending = -1;
    return rc;
}

bool lms__engine_has_argmax(const lms_engine *e) { return lms__fwd_has_argmax(e->fwd); }

/* Replace the sequence by the longest cached prefix of toks[0..n) if it is
 * longer than `have` tokens; returns the tokens now reused. */
uint32_t lms__engine_lookup(lms_engine *e, const int32_t *toks, uint32_t n, uint32_t have)
{
    lms_kv_seq *s = NULL;
    uint32_t nr = 0;
    if (lms_kv_lookup(e->kv, toks, n, &s, &nr) || !s) {
        lms_clear_error();
        return have;
    }
    if (nr <= have) {
        lms_kv_seq_free(e->kv, s);
        return have;
    }
    lms_kv_seq_free(e->kv, e->seq);
    e->seq = s;
    e->pending = -1;
    return nr;
}
