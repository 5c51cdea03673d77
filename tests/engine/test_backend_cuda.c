/*
 * tests/engine/test_backend_cuda.c - every forward operation of the CUDA
 * backend against the CPU backend (engine/backend.h), on random weights,
 * activations and K/V, over awkward shapes: rows of 1, 3, 8, 9 and 70
 * tokens (the GEMV and the GEMM paths, the decoding and the tensor-core
 * attention), positions crossing pages, a scrambled block table, head sizes
 * 64/128/256, inputs whose width is not a multiple of 8 (the scalar GEMV),
 * F32/F16/BF16 and MLX affine (4- and 8-bit codes, groups of 32, 64
 * and 128, BF16/F16/F32 scales) weights, F32/F16/BF16 K/V, norms, gated
 * activations, biases, residual adds, sliding windows and soft-capping;
 * again with the decoding attention split into many short or a few long
 * splits and the one-row GEMV's persistent grid capped at a few blocks;
 * the decoding attention over contexts of up to 5120 positions with 1 to 16
 * query heads a kv head, on tensor cores and off.
 * Then whole steps (the forward
 * pass of a random 2-layer model) on both backends, decode steps replayed
 * from the CUDA graph at moving positions, and the device argmax; and a
 * Gemma-3-like model whose sliding-window layer keeps its K/V in a second
 * group of pages (the cache's window group), whose pages below the window
 * are overwritten with NaN as the window moves: a read past the window
 * shows. Steps of several sequences (segments, as the batched engine runs
 * them): decode rows of many sequences with prefill chunks mixed in, each
 * sequence in its own scrambled pages, positions crossing page boundaries,
 * the wanted rows' logits against the CPU backend's.
 *
 * Every mismatch is printed (operation, shape, relative error) before the
 * test fails, so one run on a GPU host shows all of them. Without a GPU, or
 * in a build without CUDA, it exits 77: skipped.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "loader/device.h"
#include "testutil.h"

static lms_device *g_dev;
static int g_fail, g_checks;

/* ---- random data --------------------------------------------------------------------------- */

static uint64_t g_rng = 88172645463325252ull;
static float frand(void) /* uniform in [-1, 1) */
{
    g_rng ^= g_rng << 13, g_rng ^= g_rng >> 7, g_rng ^= g_rng << 17;
    return (float)((g_rng >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}

static size_t esz(lms_dtype dt) { return dt == LMS_DTYPE_F32 ? 4 : 2; }

static void put(void *p, size_t i, float v, lms_dtype dt)
{
    if (dt == LMS_DTYPE_F32)
        ((float *)p)[i] = v;
    else if (dt == LMS_DTYPE_F16)
        ((uint16_t *)p)[i] = lms__f32_to_f16(v);
    else
        ((uint16_t *)p)[i] = lms__f32_to_bf16(v);
}

static void *dev_copy(const void *h, size_t n)
{
    void *d = NULL;
    assert_int_equal(g_dev->ops->alloc(g_dev, n + 16, &d), 0);
    assert_int_equal(g_dev->ops->copy_h2d(g_dev, d, h, n, NULL), 0);
    return d;
}

/* MLX affine matrices of the model being made: codes of g_mlx_bits bits, groups of g_mlx_group,
 * scales and biases of g_mlx_sdt. */
static uint32_t g_mlx_bits, g_mlx_group;
static lms_dtype g_mlx_sdt = LMS_DTYPE_BF16;

/* An MLX affine matrix whose values s * q + b spread over about [-scale, scale]:
 * random codes, scales and biases per group. */
static void make_mlx(lms__wt *w, uint32_t rows, uint32_t cols, float scale)
{
    uint32_t bits = g_mlx_bits, group = g_mlx_group, ng = cols / group;
    size_t nbytes = (size_t)rows * cols * bits / 8, ns = (size_t)rows * ng;
    uint8_t *codes = malloc(nbytes);
    size_t es = esz(g_mlx_sdt);
    void *sc = malloc(ns * es), *bi = malloc(ns * es);
    for (size_t i = 0; i < nbytes; i++) codes[i] = (uint8_t)(g_rng = g_rng * 6364136223846793005ull + 1, g_rng >> 56);
    for (size_t i = 0; i < ns; i++) {
        put(sc, i, 2.0f * scale / (float)((1u << bits) - 1) * (0.75f + 0.25f * frand()), g_mlx_sdt);
        put(bi, i, -scale * (1.0f + 0.1f * frand()), g_mlx_sdt);
    }
    lms__mlx_q *q = calloc(1, sizeof *q);
    *q = (lms__mlx_q){sc, bi, dev_copy(sc, ns * es), dev_copy(bi, ns * es), g_mlx_sdt, bits, group};
    *w = (lms__wt){codes, dev_copy(codes, nbytes), LMS_DTYPE_MLX_AFFINE, rows, cols, q};
}

/* A matrix on both sides: host bytes and a device copy. */
static void make_wt(lms__wt *w, uint32_t rows, uint32_t cols, lms_dtype dt, float scale)
{
    if (dt == LMS_DTYPE_MLX_AFFINE) {
        make_mlx(w, rows, cols, scale);
        return;
    }
    size_t n = (size_t)rows * cols;
    void *h = malloc(n * esz(dt) + 16);
    for (size_t i = 0; i < n; i++) put(h, i, frand() * scale, dt);
    void *d = NULL;
    assert_int_equal(g_dev->ops->alloc(g_dev, n * esz(dt) + 16, &d), 0);
    assert_int_equal(g_dev->ops->copy_h2d(g_dev, d, h, n * esz(dt), NULL), 0);
    *w = (lms__wt){h, d, dt, rows, cols, NULL};
}

static void free_wt(lms__wt *w)
{
    free((void *)w->p);
    g_dev->ops->free(g_dev, (void *)w->dp);
    if (w->mlx) {
        lms__mlx_q *q = (lms__mlx_q *)w->mlx;
        free((void *)q->scales), free((void *)q->biases);
        g_dev->ops->free(g_dev, (void *)q->dscales);
        g_dev->ops->free(g_dev, (void *)q->dbiases);
        free(q);
    }
}

/* ---- a random model ------------------------------------------------------------------------------ */

typedef struct shape {
    uint32_t E, n_heads, n_kv, hd, F, V;
    lms_dtype wdt, kvdt;
    bool bias, qk_norm;
    uint32_t mlx_bits, mlx_group; /* wdt MLX_AFFINE */
} shape;

typedef struct model {
    lms__hparams hp;
    lms__weights w;
    lms__layer_w layers[2];
} model;

static float *vec(model *m, size_t *used, uint32_t n, float base, float scale)
{
    float *v = m->w.vec_store + *used;
    for (uint32_t i = 0; i < n; i++) v[i] = base + frand() * scale;
    *used += n;
    return v;
}

static void model_make(model *m, const shape *s)
{
    memset(m, 0, sizeof *m);
    g_mlx_bits = s->mlx_bits, g_mlx_group = s->mlx_group;
    lms__hparams *hp = &m->hp;
    hp->n_vocab = s->V, hp->n_embd = s->E, hp->n_layers = 2, hp->n_heads = s->n_heads, hp->n_kv_heads = s->n_kv;
    hp->head_dim = s->hd, hp->n_ff = s->F, hp->max_pos = 4096, hp->eps = 1e-5f, hp->rope_theta = 10000;
    hp->rope_kind = LMS__ROPE_LLAMA3, hp->rope_factor = 8, hp->rope_low_freq = 1, hp->rope_high_freq = 4;
    hp->rope_orig_max_pos = 64;
    hp->act = LMS__ACT_SILU, hp->embed_scale = 1, hp->attn_scale = 1.0f / sqrtf((float)s->hd);
    hp->qkv_bias = s->bias, hp->qk_norm = s->qk_norm;
    uint32_t qd = s->n_heads * s->hd, kvd = s->n_kv * s->hd;
    m->w.vec_len = 16 * (size_t)(s->E + qd + s->hd + s->F) + 64;
    m->w.vec_store = malloc(m->w.vec_len * 4);
    size_t used = 0;
    make_wt(&m->w.embed, s->V, s->E, s->wdt, 1.0f);
    make_wt(&m->w.lm_head, s->V, s->E, s->wdt, 0.2f);
    m->w.final_norm = vec(m, &used, s->E, 1.0f, 0.2f);
    m->w.layers = m->layers;
    for (int l = 0; l < 2; l++) {
        lms__layer_w *L = &m->layers[l];
        float sc = 1.0f / sqrtf((float)s->E);
        make_wt(&L->wq, qd, s->E, s->wdt, sc);
        make_wt(&L->wk, kvd, s->E, s->wdt, sc);
        make_wt(&L->wv, kvd, s->E, s->wdt, sc);
        make_wt(&L->wo, s->E, qd, s->wdt, 1.0f / sqrtf((float)qd));
        make_wt(&L->w_gate, s->F, s->E, s->wdt, sc);
        make_wt(&L->w_up, s->F, s->E, s->wdt, sc);
        make_wt(&L->w_down, s->E, s->F, s->wdt, 1.0f / sqrtf((float)s->F));
        L->attn_norm = vec(m, &used, s->E, 1.0f, 0.2f);
        L->ffn_norm = vec(m, &used, s->E, 1.0f, 0.2f);
        if (s->bias) {
            L->bq = vec(m, &used, qd, 0, 0.1f);
            L->bk = vec(m, &used, kvd, 0, 0.1f);
            L->bv = vec(m, &used, kvd, 0, 0.1f);
        }
        if (s->qk_norm) {
            L->q_norm = vec(m, &used, s->hd, 1.0f, 0.2f);
            L->k_norm = vec(m, &used, s->hd, 1.0f, 0.2f);
        }
    }
    assert_true(used <= m->w.vec_len);
}

static void model_free(model *m)
{
    free_wt(&m->w.embed);
    free_wt(&m->w.lm_head);
    for (int l = 0; l < 2; l++) {
        lms__layer_w *L = &m->layers[l];
        lms__wt *all[] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (size_t i = 0; i < 7; i++) free_wt(all[i]);
    }
    free(m->w.vec_store);
}

/* The end of a CPU-against-CUDA comparison: both forward passes, the pool, both
 * KV arenas (host and device) and the model. */
static void pair_free(lms__fwd *fc, lms__fwd *fg, lms_pool *pool, uint8_t *ac, void *ag, model *m)
{
    lms__fwd_free(fc);
    lms__fwd_free(fg);
    lms__pool_destroy(pool);
    free(ac);
    g_dev->ops->free(g_dev, ag);
    model_free(m);
}

/* ---- both backends over one model, with K/V arenas of equal content --------------------------------- */

#define N_PAGES 40
#define LONG_PAGES 320 /* long contexts: 5120 positions */
#define MAX_BLOCK 80
#define MAX_SEGS 8
#define N_CTX 512

typedef struct pair {
    model *m;
    lms__kvview kv_cpu, kv_gpu;
    uint8_t *arena_cpu;
    void *arena_gpu;
    size_t arena_bytes;
    uint32_t n_pages, table[LONG_PAGES];
    lms__bk *cpu, *gpu;
    lms_pool *pool;
    const lms__kernels *k;
} pair;

static void kv_geometry(lms__kvview *kv, const lms__hparams *hp, lms_dtype dt)
{
    memset(kv, 0, sizeof *kv);
    kv->dtype = dt;
    kv->page_tokens = 16;
    kv->elem_size = esz(dt);
    kv->token_bytes = hp->head_dim * kv->elem_size;
    kv->head_bytes = kv->page_tokens * kv->token_bytes;
    kv->v_offset = hp->n_kv_heads * kv->head_bytes;
    kv->layer_bytes = 2 * kv->v_offset;
    kv->page_bytes = hp->n_layers * kv->layer_bytes;
}

/* Both backends over n_pages pages of random K/V (a scrambled table), contexts of n_ctx. */
static void pair_open_n(pair *p, model *m, lms_dtype kvdt, uint32_t n_pages, uint32_t n_ctx)
{
    memset(p, 0, sizeof *p);
    p->m = m;
    p->n_pages = n_pages;
    kv_geometry(&p->kv_cpu, &m->hp, kvdt);
    p->arena_bytes = n_pages * p->kv_cpu.page_bytes;
    p->arena_cpu = malloc(p->arena_bytes);
    size_t n = p->arena_bytes / esz(kvdt);
    for (size_t i = 0; i < n; i++) put(p->arena_cpu, i, frand(), kvdt);
    assert_int_equal(g_dev->ops->alloc(g_dev, p->arena_bytes, &p->arena_gpu), 0);
    assert_int_equal(g_dev->ops->copy_h2d(g_dev, p->arena_gpu, p->arena_cpu, p->arena_bytes, NULL), 0);
    for (uint32_t i = 0; i < n_pages; i++) p->table[i] = (i * 17 + 5) % n_pages; /* scrambled */
    p->kv_cpu.base = p->arena_cpu;
    p->kv_cpu.pages = p->table;
    p->kv_cpu.n_pages = n_pages;
    p->kv_gpu = p->kv_cpu;
    p->kv_gpu.base = p->arena_gpu;
    p->k = lms__kernels_best();
    assert_int_equal(lms__pool_create(2, &p->pool), 0);
    lms__fwd_cfg c1 = {&m->hp, &m->w, NULL, p->k, p->pool, MAX_BLOCK, n_ctx, &p->kv_cpu, MAX_SEGS};
    lms__fwd_cfg c2 = {&m->hp, &m->w, g_dev, p->k, NULL, MAX_BLOCK, n_ctx, &p->kv_gpu, MAX_SEGS};
    assert_int_equal(lms__fwd_cpu.create(&c1, &p->cpu), 0);
    int rc = lms__fwd_cuda->create(&c2, &p->gpu);
    if (rc)
        printf("cuda create: %s\n", lms_last_error());
    assert_int_equal(rc, 0);
}

static void pair_open(pair *p, model *m, lms_dtype kvdt) { pair_open_n(p, m, kvdt, N_PAGES, N_CTX); }

static void pair_close(pair *p)
{
    lms__fwd_cpu.destroy(p->cpu);
    lms__fwd_cuda->destroy(p->gpu);
    lms__pool_destroy(p->pool);
    free(p->arena_cpu);
    g_dev->ops->free(g_dev, p->arena_gpu);
}

/* ---- comparing ------------------------------------------------------------------------------------ */

/* One-row MLX products' tolerance (mm_tol), that of softcapped logits (mm_softcap_tol), and
 * the largest error they showed. */
#define MLXQ_TOL 2e-2
#define MLXQ_SOFTCAP_TOL 3e-2
static double g_mlxq_max; /* the largest error seen on one-row MLX products */

static double rel_err(const float *a, const float *ref, size_t n, size_t *bad_at)
{
    double md = 0, mx = 1e-30;
    *bad_at = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - ref[i]);
        if (!(d <= md)) { /* NaN counts */
            md = isnan(d) ? INFINITY : d;
            *bad_at = i;
        }
        mx = fmax(mx, fabs((double)ref[i]));
    }
    return md / mx;
}

static void check(const char *what, const shape *s, uint32_t nb, uint32_t pos0, const float *got, const float *ref,
                  size_t n, double tol)
{
    size_t at;
    double e = rel_err(got, ref, n, &at);
    g_checks++;
    if ((tol == MLXQ_TOL || tol == MLXQ_SOFTCAP_TOL) && e > g_mlxq_max)
        g_mlxq_max = e;
    if (!(e <= tol)) {
        g_fail++;
        printf("MISMATCH %-22s E=%u heads=%u/%u hd=%u F=%u w=%s kv=%s nb=%u pos0=%u: rel err %.3g > %.1g "
               "(at %zu: %g vs %g)\n",
               what, s->E, s->n_heads, s->n_kv, s->hd, s->F, lms_dtype_name(s->wdt), lms_dtype_name(s->kvdt), nb,
               pos0, e, tol, at, got[at], ref[at]);
    }
}

/* Tolerance of a matrix product: exact arithmetic in f32 on both sides for steps
 * on the GEMV path, and for split 16-bit inputs (up to 64 rows); longer
 * steps round the activations to the weights' 16-bit type. One-row MLX
 * products round the activations to int8 per group (dp4a on the codes): about
 * 0.4% of a typical output element, up to 1.5e-2 of the largest over a
 * vocabulary's logits (seen on an H200), so 2e-2 (a wrong code, scale, group
 * or layout gave errors of 0.1 to 1e3). */
static double mm_tol(const shape *s, uint32_t nb)
{
    if (s->wdt == LMS_DTYPE_MLX_AFFINE && nb == 1)
        return MLXQ_TOL;
    if (nb <= 64 || s->wdt == LMS_DTYPE_F32) /* MLX: the GEMV on the codes, or bf16 pairs in the GEMM */
        return 2e-4;
    return s->wdt == LMS_DTYPE_F16 ? 3e-3 : 2e-2;
}

/* Tolerance of logits softcapped at 3 (relative to the largest, which the cap bounds): a
 * one-row MLX head's int8 error grows with the width while the largest logit stays at 3,
 * up to 2.5e-2 seen on an H200 at widths 1536 and 2048 (groups of 64 and 128), the same
 * with the scales loaded either way; the uncapped logits of the same steps stay within
 * MLXQ_TOL. */
static double mm_softcap_tol(const shape *s, uint32_t nb)
{
    return s->wdt == LMS_DTYPE_MLX_AFFINE && nb == 1 ? MLXQ_SOFTCAP_TOL : mm_tol(s, nb);
}

static float *rows(uint32_t n, uint32_t w, float scale)
{
    float *v = malloc((size_t)n * w * 4);
    for (size_t i = 0; i < (size_t)n * w; i++) v[i] = frand() * scale;
    return v;
}

/* ---- one operation on both sides --------------------------------------------------------------------- */

typedef struct stepset {
    int32_t tokens[MAX_BLOCK];
    lms__step cpu, gpu;
} stepset;

static void steps(pair *p, stepset *ss, uint32_t nb, uint32_t pos0)
{
    for (uint32_t i = 0; i < nb; i++) ss->tokens[i] = (int32_t)((i * 7 + pos0) % p->m->hp.n_vocab);
    ss->cpu = (lms__step){.tokens = ss->tokens, .nb = nb, .pos0 = pos0, .kv = &p->kv_cpu, .out = LMS__OUT_NONE};
    ss->gpu = ss->cpu;
    ss->gpu.kv = &p->kv_gpu;
}

static void begin2(pair *p, stepset *ss)
{
    bool r1, r2;
    assert_int_equal(lms__fwd_cpu.begin(p->cpu, &ss->cpu, &r1), 0);
    assert_int_equal(lms__fwd_cuda->begin(p->gpu, &ss->gpu, &r2), 0);
    assert_false(r1 || r2);
}

static void end2(pair *p)
{
    assert_int_equal(lms__fwd_cpu.end(p->cpu), 0);
    int rc = lms__fwd_cuda->end(p->gpu);
    if (rc)
        printf("cuda end: %s\n", lms_last_error());
    assert_int_equal(rc, 0);
}

static void write2(pair *p, lms__buf b, uint32_t nb, const float *v)
{
    assert_int_equal(lms__fwd_cpu.write(p->cpu, b, nb, v), 0);
    assert_int_equal(lms__fwd_cuda->write(p->gpu, b, nb, v), 0);
}

static void compare_buf(pair *p, const char *what, lms__buf b, const shape *s, uint32_t nb, uint32_t pos0, double tol)
{
    uint32_t w = lms__buf_width(&p->m->hp, b);
    float *a = malloc((size_t)nb * w * 4), *c = malloc((size_t)nb * w * 4);
    assert_int_equal(lms__fwd_cpu.read(p->cpu, b, nb, c), 0);
    assert_int_equal(lms__fwd_cuda->read(p->gpu, b, nb, a), 0);
    check(what, s, nb, pos0, a, c, (size_t)nb * w, tol);
    free(a);
    free(c);
}

/* The K/V of positions [pos0, pos0 + nb) of layer l, both arenas, as f32. */
static void compare_kv(pair *p, const shape *s, uint32_t l, uint32_t nb, uint32_t pos0, double tol)
{
    const lms__kvview *kv = &p->kv_cpu;
    uint8_t *g = malloc(p->arena_bytes);
    assert_int_equal(g_dev->ops->copy_d2h(g_dev, g, p->arena_gpu, p->arena_bytes, NULL), 0);
    size_t n = (size_t)nb * 2 * s->n_kv * s->hd, k = 0;
    float *a = malloc(n * 4), *c = malloc(n * 4);
    for (uint32_t t = 0; t < nb; t++) {
        uint32_t pos = pos0 + t;
        size_t off = (size_t)p->table[pos / 16] * kv->page_bytes + l * kv->layer_bytes + (pos % 16) * kv->token_bytes;
        for (int kvs = 0; kvs < 2; kvs++)
            for (uint32_t h = 0; h < s->n_kv; h++)
                for (uint32_t d = 0; d < s->hd; d++, k++) {
                    size_t o = off + kvs * kv->v_offset + h * kv->head_bytes;
                    lms__wt w1 = {p->arena_cpu + o, NULL, s->kvdt, 1, s->hd, NULL}, w2 = {g + o, NULL, s->kvdt, 1, s->hd, NULL};
                    float r1[256], r2[256];
                    lms__row_to_f32(&w1, 0, r1);
                    lms__row_to_f32(&w2, 0, r2);
                    c[k] = r1[d];
                    a[k] = r2[d];
                }
    }
    check("k/v written", s, nb, pos0, a, c, n, tol);
    free(a);
    free(c);
    free(g);
}

/* Attention of steps (nb, pos0) over the (equal) arenas: plain, with a window of `window`,
 * soft-capped (cache layer 1, a random q), then RoPE and attention in one step from q, k,
 * v (cache layer 0: one-token steps fuse them on the device) and the K/V it wrote. */
static void check_attention(pair *p, stepset *ss, const shape *s, uint32_t nb, uint32_t pos0, const float *q,
                            const float *k, const float *v, uint32_t window)
{
    const lms__hparams *hp = &p->m->hp;
    const lms__layer_w *L = &p->m->layers[1]; /* its q/k norms */
    double kv_tol = s->kvdt == LMS_DTYPE_F32 ? 2e-5 : s->kvdt == LMS_DTYPE_F16 ? 2e-3 : 1e-2;
    double at = nb <= 8 || s->kvdt == LMS_DTYPE_F32 ? 1e-4 : 2e-2;
    /* equal again: each backend's K/V writes of the steps before may round
     * apart by an ulp of a 16-bit type (compare_kv's own tolerance) */
    assert_int_equal(g_dev->ops->copy_h2d(g_dev, p->arena_gpu, p->arena_cpu, p->arena_bytes, NULL), 0);
    float *qq = rows(nb, hp->n_heads * hp->head_dim, 1.5f);
    write2(p, LMS__B_Q, nb, qq);
    struct { uint32_t window; float softcap; const char *name; } av[] = {
        {0, 0, "attention"}, {window, 0, "attention window"}, {0, 2.5f, "attention softcap"}};
    for (size_t ai = 0; ai < 3; ai++) {
        begin2(p, ss);
        lms__fwd_cpu.attention(p->cpu, 1, av[ai].window, hp->attn_scale, av[ai].softcap);
        lms__fwd_cuda->attention(p->gpu, 1, av[ai].window, hp->attn_scale, av[ai].softcap);
        end2(p);
        compare_buf(p, av[ai].name, LMS__B_ATT, s, nb, pos0, at);
    }
    free(qq);

    write2(p, LMS__B_Q, nb, q);
    write2(p, LMS__B_K, nb, k);
    write2(p, LMS__B_V, nb, v);
    begin2(p, ss);
    lms__fwd_cpu.qk_rope(p->cpu, 0, L->q_norm, L->k_norm, LMS__ROPE_GLOBAL);
    lms__fwd_cuda->qk_rope(p->gpu, 0, L->q_norm, L->k_norm, LMS__ROPE_GLOBAL);
    lms__fwd_cpu.attention(p->cpu, 0, 0, hp->attn_scale, 0);
    lms__fwd_cuda->attention(p->gpu, 0, 0, hp->attn_scale, 0);
    end2(p);
    compare_buf(p, "rope + attention", LMS__B_ATT, s, nb, pos0, at);
    compare_kv(p, s, 0, nb, pos0, kv_tol);
}

static void test_ops_shape(const shape *s)
{
    model m;
    pair p;
    stepset ss;
    model_make(&m, s);
    pair_open(&p, &m, s->kvdt);
    const lms__hparams *hp = &m.hp;
    const lms__layer_w *L = &m.layers[1];
    uint32_t qd = hp->n_heads * hp->head_dim;
    /* positions: one split, a few, many (the decoding attention's splits of 32 positions and
     * more, the last one holding the step's own token) */
    const uint32_t nbs[] = {1, 3, 8, 9, 70, 80}, pos0s[] = {0, 13, 133, 300};
    double kv_tol = s->kvdt == LMS_DTYPE_F32 ? 2e-5 : s->kvdt == LMS_DTYPE_F16 ? 2e-3 : 1e-2;
    for (size_t ni = 0; ni < 6; ni++)
        for (size_t pi = 0; pi < 4; pi++) {
            uint32_t nb = nbs[ni], pos0 = pos0s[pi];
            if (pos0 + nb > N_PAGES * 16)
                continue;
            steps(&p, &ss, nb, pos0);

            /* embedding */
            begin2(&p, &ss);
            lms__fwd_cpu.embed(p.cpu, 1.0f);
            lms__fwd_cuda->embed(p.gpu, 1.0f);
            end2(&p);
            compare_buf(&p, "embed", LMS__B_X, s, nb, pos0, 1e-6);
            begin2(&p, &ss);
            lms__fwd_cpu.embed(p.cpu, 5.65f);
            lms__fwd_cuda->embed(p.gpu, 5.65f);
            end2(&p);
            compare_buf(&p, "embed scaled", LMS__B_X, s, nb, pos0, 1e-6);

            /* q/k/v with the input norm and biases, one launch */
            float *x = rows(nb, hp->n_embd, 2.0f);
            write2(&p, LMS__B_X, nb, x);
            lms__mm qkv[3] = {{&L->wq, LMS__B_X, L->attn_norm, LMS__ACT_NONE, 0, LMS__B_Q, L->bq, false},
                              {&L->wk, LMS__B_X, L->attn_norm, LMS__ACT_NONE, 0, LMS__B_K, L->bk, false},
                              {&L->wv, LMS__B_X, L->attn_norm, LMS__ACT_NONE, 0, LMS__B_V, L->bv, false}};
            begin2(&p, &ss);
            lms__fwd_cpu.matmul(p.cpu, qkv, 3);
            lms__fwd_cuda->matmul(p.gpu, qkv, 3);
            end2(&p);
            compare_buf(&p, "matmul norm q", LMS__B_Q, s, nb, pos0, mm_tol(s, nb));
            compare_buf(&p, "matmul norm k", LMS__B_K, s, nb, pos0, mm_tol(s, nb));
            compare_buf(&p, "matmul norm v", LMS__B_V, s, nb, pos0, mm_tol(s, nb));

            /* rope + K/V write (the Q/K/V just computed are the same on both sides? no:
             * write the CPU's into both, so rope sees equal inputs) */
            float *q = malloc((size_t)nb * qd * 4), *k = malloc((size_t)nb * hp->n_kv_heads * hp->head_dim * 4),
                  *v = malloc((size_t)nb * hp->n_kv_heads * hp->head_dim * 4);
            lms__fwd_cpu.read(p.cpu, LMS__B_Q, nb, q);
            lms__fwd_cpu.read(p.cpu, LMS__B_K, nb, k);
            lms__fwd_cpu.read(p.cpu, LMS__B_V, nb, v);
            write2(&p, LMS__B_Q, nb, q);
            write2(&p, LMS__B_K, nb, k);
            write2(&p, LMS__B_V, nb, v);
            begin2(&p, &ss);
            lms__fwd_cpu.qk_rope(p.cpu, 1, L->q_norm, L->k_norm, LMS__ROPE_GLOBAL);
            lms__fwd_cuda->qk_rope(p.gpu, 1, L->q_norm, L->k_norm, LMS__ROPE_GLOBAL);
            end2(&p);
            compare_buf(&p, "rope q", LMS__B_Q, s, nb, pos0, 1e-5);
            compare_kv(&p, s, 1, nb, pos0, kv_tol);

            check_attention(&p, &ss, s, nb, pos0, q, k, v, 7);

            /* o projection with residual add; gate/up; down with the gated activation */
            float *att = rows(nb, qd, 1.0f);
            write2(&p, LMS__B_ATT, nb, att);
            write2(&p, LMS__B_X, nb, x);
            lms__mm wo = {&L->wo, LMS__B_ATT, NULL, LMS__ACT_NONE, 0, LMS__B_X, NULL, true};
            begin2(&p, &ss);
            lms__fwd_cpu.matmul(p.cpu, &wo, 1);
            lms__fwd_cuda->matmul(p.gpu, &wo, 1);
            end2(&p);
            compare_buf(&p, "matmul acc (o)", LMS__B_X, s, nb, pos0, mm_tol(s, nb));
            float *g = rows(nb, hp->n_ff, 3.0f), *u = rows(nb, hp->n_ff, 1.0f);
            write2(&p, LMS__B_G, nb, g);
            write2(&p, LMS__B_U, nb, u);
            write2(&p, LMS__B_X, nb, x);
            /* gate/up then down in one step: the device takes down's input from the gate/up epilogue */
            write2(&p, LMS__B_X, nb, x);
            {
                lms__mm gu[2] = {{&L->w_gate, LMS__B_X, L->ffn_norm, LMS__ACT_NONE, 0, LMS__B_G, NULL, false},
                                 {&L->w_up, LMS__B_X, L->ffn_norm, LMS__ACT_NONE, 0, LMS__B_U, NULL, false}};
                lms__mm dn = {&L->w_down, LMS__B_G, NULL, p.m->hp.act, LMS__B_U, LMS__B_X, NULL, true};
                begin2(&p, &ss);
                lms__fwd_cpu.matmul(p.cpu, gu, 2);
                lms__fwd_cuda->matmul(p.gpu, gu, 2);
                lms__fwd_cpu.matmul(p.cpu, &dn, 1);
                lms__fwd_cuda->matmul(p.gpu, &dn, 1);
                end2(&p);
                compare_buf(&p, "gate/up + down", LMS__B_X, s, nb, pos0, mm_tol(s, nb));
                compare_buf(&p, "gate", LMS__B_G, s, nb, pos0, mm_tol(s, nb));
            }
            write2(&p, LMS__B_X, nb, x);
            lms__act acts[2] = {LMS__ACT_SILU, LMS__ACT_GELU_TANH};
            for (int ai = 0; ai < 2; ai++) {
                lms__mm down = {&L->w_down, LMS__B_G, NULL, acts[ai], LMS__B_U, LMS__B_X, NULL, true};
                begin2(&p, &ss);
                lms__fwd_cpu.matmul(p.cpu, &down, 1);
                lms__fwd_cuda->matmul(p.gpu, &down, 1);
                end2(&p);
                compare_buf(&p, ai ? "matmul geglu (down)" : "matmul swiglu (down)", LMS__B_X, s, nb, pos0,
                            mm_tol(s, nb));
            }

            /* norm_add */
            float *tt = rows(nb, hp->n_embd, 1.0f);
            write2(&p, LMS__B_X, nb, x);
            write2(&p, LMS__B_T, nb, tt);
            begin2(&p, &ss);
            lms__fwd_cpu.norm_add(p.cpu, LMS__B_X, LMS__B_T, L->ffn_norm);
            lms__fwd_cuda->norm_add(p.gpu, LMS__B_X, LMS__B_T, L->ffn_norm);
            end2(&p);
            compare_buf(&p, "norm_add", LMS__B_X, s, nb, pos0, 1e-5);

            /* a product then its post-norm into the residual (Gemma 3), fused on the device;
             * twice, so that sums or tickets left over by the first would show */
            for (int rep = 0; rep < 2; rep++) {
                float *a2 = rows(nb, qd, rep ? 0.5f : 1.0f);
                write2(&p, LMS__B_ATT, nb, a2);
                write2(&p, LMS__B_X, nb, x);
                lms__mm wt = {&L->wo, LMS__B_ATT, NULL, LMS__ACT_NONE, 0, LMS__B_T, NULL, false};
                begin2(&p, &ss);
                lms__fwd_cpu.matmul(p.cpu, &wt, 1);
                lms__fwd_cpu.norm_add(p.cpu, LMS__B_X, LMS__B_T, L->ffn_norm);
                lms__fwd_cuda->matmul_norm_add(p.gpu, &wt, LMS__B_X, L->ffn_norm);
                end2(&p);
                compare_buf(&p, "matmul post-norm (T)", LMS__B_T, s, nb, pos0, mm_tol(s, nb));
                compare_buf(&p, "matmul post-norm (X)", LMS__B_X, s, nb, pos0, mm_tol(s, nb));
                free(a2);
            }

            /* Gemma 3's order in one step: o and its post-norm, gate/up reading X, down and its
             * post-norm, q/k/v reading X. Steps of GEMV rows launch each post-norm as its
             * product's programmatic dependent and the next product as the post-norm's
             * (fwd_cuda.c: cuda_matmul_norm_add), so that the next product reads X only after
             * the post-norm wrote it. MLX products keep the post-norm in their last block, and
             * their int8 (one row) or bf16 (GEMM) activations' errors compound over the chain
             * past mm_tol: dense types only */
            if (s->wdt != LMS_DTYPE_MLX_AFFINE) {
                float *a2 = rows(nb, qd, 0.7f);
                write2(&p, LMS__B_ATT, nb, a2);
                write2(&p, LMS__B_X, nb, x);
                lms__mm wt = {&L->wo, LMS__B_ATT, NULL, LMS__ACT_NONE, 0, LMS__B_T, NULL, false};
                lms__mm gu[2] = {{&L->w_gate, LMS__B_X, L->ffn_norm, LMS__ACT_NONE, 0, LMS__B_G, NULL, false},
                                 {&L->w_up, LMS__B_X, L->ffn_norm, LMS__ACT_NONE, 0, LMS__B_U, NULL, false}};
                lms__mm dn = {&L->w_down, LMS__B_G, NULL, p.m->hp.act, LMS__B_U, LMS__B_T, NULL, false};
                begin2(&p, &ss);
                lms__fwd_cpu.matmul(p.cpu, &wt, 1);
                lms__fwd_cpu.norm_add(p.cpu, LMS__B_X, LMS__B_T, L->ffn_norm);
                lms__fwd_cpu.matmul(p.cpu, gu, 2);
                lms__fwd_cpu.matmul(p.cpu, &dn, 1);
                lms__fwd_cpu.norm_add(p.cpu, LMS__B_X, LMS__B_T, L->attn_norm);
                lms__fwd_cpu.matmul(p.cpu, qkv, 3);
                lms__fwd_cuda->matmul_norm_add(p.gpu, &wt, LMS__B_X, L->ffn_norm);
                lms__fwd_cuda->matmul(p.gpu, gu, 2);
                lms__fwd_cuda->matmul_norm_add(p.gpu, &dn, LMS__B_X, L->attn_norm);
                lms__fwd_cuda->matmul(p.gpu, qkv, 3);
                end2(&p);
                compare_buf(&p, "post-norm chain (gate)", LMS__B_G, s, nb, pos0, mm_tol(s, nb));
                compare_buf(&p, "post-norm chain (up)", LMS__B_U, s, nb, pos0, mm_tol(s, nb));
                compare_buf(&p, "post-norm chain (T)", LMS__B_T, s, nb, pos0, mm_tol(s, nb));
                compare_buf(&p, "post-norm chain (X)", LMS__B_X, s, nb, pos0, mm_tol(s, nb));
                compare_buf(&p, "post-norm chain (q)", LMS__B_Q, s, nb, pos0, mm_tol(s, nb));
                compare_buf(&p, "post-norm chain (v)", LMS__B_V, s, nb, pos0, mm_tol(s, nb));
                free(a2);
            }

            /* the head: last row, every row, soft-capped; argmax */
            write2(&p, LMS__B_X, nb, x);
            lms__mm head = {&m.w.lm_head, LMS__B_X, m.w.final_norm, LMS__ACT_NONE, 0, 0, NULL, false};
            uint32_t V = hp->n_vocab;
            float *l1 = malloc((size_t)nb * V * 4), *l2 = malloc((size_t)nb * V * 4);
            stepset s2 = ss;
            s2.cpu.out = s2.gpu.out = LMS__OUT_LAST;
            s2.cpu.logits = l1, s2.gpu.logits = l2;
            begin2(&p, &s2);
            lms__fwd_cpu.head(p.cpu, &head, nb - 1, 1, 0, l1);
            lms__fwd_cuda->head(p.gpu, &head, nb - 1, 1, 0, l2);
            end2(&p);
            check("head last", s, nb, pos0, l2, l1, V, mm_tol(s, 1));
            s2.cpu.out = s2.gpu.out = LMS__OUT_ALL;
            begin2(&p, &s2);
            for (uint32_t r = 0; r < nb; r += 32) {
                uint32_t n = nb - r < 32 ? nb - r : 32;
                lms__fwd_cpu.head(p.cpu, &head, r, n, 3.0f, l1 + (size_t)r * V);
                lms__fwd_cuda->head(p.gpu, &head, r, n, 3.0f, l2 + (size_t)r * V);
            }
            end2(&p);
            check("head all softcap", s, nb, pos0, l2, l1, (size_t)nb * V, mm_softcap_tol(s, nb));
            int32_t id = -1;
            s2.gpu.out = LMS__OUT_ARGMAX;
            s2.gpu.argmax = &id;
            bool rp;
            assert_int_equal(lms__fwd_cuda->begin(p.gpu, &s2.gpu, &rp), 0);
            lms__fwd_cuda->head_argmax(p.gpu, &head, 0, &id);
            assert_int_equal(lms__fwd_cuda->end(p.gpu), 0);
            int32_t want = 0; /* the CPU's last row */
            const float *lr = l1 + (size_t)(nb - 1) * V;
            for (uint32_t i = 1; i < V; i++)
                if (lr[i] > lr[want])
                    want = (int32_t)i;
            /* the CPU row above was soft-capped at 3: recompute without */
            s2.cpu.out = LMS__OUT_LAST;
            begin2(&p, &s2);
            lms__fwd_cpu.head(p.cpu, &head, nb - 1, 1, 0, l1);
            lms__fwd_cuda->head(p.gpu, &head, nb - 1, 1, 0, l2);
            end2(&p);
            want = 0;
            for (uint32_t i = 1; i < V; i++)
                if (l1[i] > l1[want])
                    want = (int32_t)i;
            g_checks++;
            if (id != want && fabsf(l1[id] - l1[want]) > (float)mm_tol(s, 1) * 0.5f * fabsf(l1[want])) {
                g_fail++;
                printf("MISMATCH argmax nb=%u: %d vs %d\n", nb, id, want);
            }
            free(tt), free(l1), free(l2), free(x), free(q), free(k), free(v), free(att), free(g), free(u);
        }
    pair_close(&p);
    model_free(&m);
}

/* ---- whole steps: the forward pass on both backends ---------------------------------------------- */

static void test_forward_shape(const shape *s)
{
    model m;
    model_make(&m, s);
    lms__kvview kc, kg;
    kv_geometry(&kc, &m.hp, s->kvdt);
    size_t ab = N_PAGES * kc.page_bytes;
    uint8_t *ac = calloc(1, ab);
    void *ag;
    uint32_t table[N_PAGES];
    for (uint32_t i = 0; i < N_PAGES; i++) table[i] = (i * 23 + 3) % N_PAGES;
    assert_int_equal(g_dev->ops->alloc(g_dev, ab, &ag), 0);
    assert_int_equal(g_dev->ops->memset(g_dev, ag, 0, ab, NULL), 0);
    kc.base = ac, kc.pages = table, kc.n_pages = N_PAGES;
    kg = kc;
    kg.base = ag;
    lms_pool *pool;
    assert_int_equal(lms__pool_create(2, &pool), 0);
    lms__fwd *fc, *fg;
    setenv("LMSTORE_CUDA_GRAPH", "1", 1);
    assert_int_equal(lms__fwd_create(&lms__fwd_cpu, &m.hp, &m.w, NULL, lms__kernels_best(), pool, 64, 1, N_CTX, &kc, &fc), 0);
    assert_int_equal(lms__fwd_create(lms__fwd_cuda, &m.hp, &m.w, g_dev, NULL, NULL, 64, 1, N_CTX, &kg, &fg), 0);
    uint32_t V = m.hp.n_vocab;
    float *l1 = malloc((size_t)64 * V * 4), *l2 = malloc((size_t)64 * V * 4);
    int32_t toks[64];
    for (int i = 0; i < 64; i++) toks[i] = (int32_t)((i * 31 + 7) % V);
    /* prefill 41 tokens with every row's logits, then 40 decode steps (graph replays) */
    assert_int_equal(lms__fwd_block(fc, toks, 41, 0, &kc, l1, true), 0);
    int rc = lms__fwd_block(fg, toks, 41, 0, &kg, l2, true);
    if (rc)
        printf("cuda forward: %s\n", lms_last_error());
    assert_int_equal(rc, 0);
    /* MLX: decode steps multiply int8 activations (mm_tol) */
    double tol = s->wdt == LMS_DTYPE_BF16 || s->kvdt != LMS_DTYPE_F32            ? 3e-2
                 : s->wdt == LMS_DTYPE_MLX_AFFINE ? 2 * MLXQ_TOL : 1e-3;
    check("forward prefill 41", s, 41, 0, l2, l1, (size_t)41 * V, tol);
    for (uint32_t i = 0; i < 40; i++) {
        int32_t t = toks[i % 64];
        assert_int_equal(lms__fwd_block(fc, &t, 1, 41 + i, &kc, l1, false), 0);
        assert_int_equal(lms__fwd_block(fg, &t, 1, 41 + i, &kg, l2, false), 0);
        check("forward decode (graph)", s, 1, 41 + i, l2, l1, V, tol);
        int32_t id = -1;
        assert_int_equal(lms__fwd_block_argmax(fg, &t, 1, 41 + i, &kg, &id), 0);
        int32_t want = 0;
        for (uint32_t k = 1; k < V; k++)
            if (l1[k] > l1[want])
                want = (int32_t)k;
        g_checks++;
        float near = s->wdt == LMS_DTYPE_MLX_AFFINE ? (float)tol : 1e-3f; /* a tie within the products' error */
        if (id != want && fabsf(l1[id] - l1[want]) > near * fabsf(l1[want])) {
            g_fail++;
            printf("MISMATCH forward argmax at %u: %d vs %d\n", 41 + i, id, want);
        }
    }
    free(l1), free(l2);
    pair_free(fc, fg, pool, ac, ag, &m);
}

/* ---- sliding-window layers in the cache's window group -------------------------------------------------- */

/* Pages of a window group wholly below position `end` - window: NaN (all bits set) on both sides. */
static void poison_window(lms__kvview *kc, lms__kvview *kg, uint32_t end)
{
    uint32_t first = end > kc->window ? (end - kc->window) / kc->page_tokens : 0;
    for (uint32_t i = 0; i < first; i++) {
        memset(kc->wbase + (size_t)kc->wpages[i] * kc->wpage_bytes, 0xff, kc->wpage_bytes);
        assert_int_equal(g_dev->ops->memset(g_dev, kg->wbase + (size_t)kg->wpages[i] * kg->wpage_bytes, 0xff,
                                            kg->wpage_bytes, NULL),
                         0);
    }
}

static void test_window_shape(const shape *s)
{
    model m;
    model_make(&m, s);
    lms__hparams *hp = &m.hp;
    /* Gemma 3's layer: layer 0 local (window 20, its own RoPE base), post-norms, GELU-tanh,
     * scaled embeddings, a logit soft-cap */
    hp->window = 20;
    hp->sliding[0] = 1;
    hp->rope_local_theta = 10000;
    hp->rope_theta = 1e6, hp->rope_kind = LMS__ROPE_LINEAR, hp->rope_factor = 8;
    hp->post_norms = true;
    hp->act = LMS__ACT_GELU_TANH;
    hp->embed_scale = sqrtf((float)s->E);
    hp->final_softcap = 30;
    size_t used = m.w.vec_len - 4 * (size_t)s->E;
    for (int l = 0; l < 2; l++) {
        m.layers[l].post_attn_norm = vec(&m, &used, s->E, 1.0f, 0.2f);
        m.layers[l].post_ffn_norm = vec(&m, &used, s->E, 1.0f, 0.2f);
    }
    static const uint8_t group[2] = {1, 0};
    static const uint32_t index[2] = {0, 0};
    lms__kvview kc, kg;
    kv_geometry(&kc, hp, s->kvdt);
    kc.page_bytes = kc.layer_bytes; /* one layer in each group */
    kc.window = hp->window, kc.group = group, kc.index = index, kc.wpage_bytes = kc.layer_bytes;
    size_t ab = N_PAGES * kc.page_bytes;
    uint8_t *ac = calloc(1, ab), *wc = calloc(1, ab);
    void *ag, *wg;
    uint32_t table[N_PAGES], wtable[N_PAGES];
    for (uint32_t i = 0; i < N_PAGES; i++) table[i] = (i * 23 + 3) % N_PAGES, wtable[i] = (i * 13 + 7) % N_PAGES;
    assert_int_equal(g_dev->ops->alloc(g_dev, ab, &ag), 0);
    assert_int_equal(g_dev->ops->alloc(g_dev, ab, &wg), 0);
    assert_int_equal(g_dev->ops->memset(g_dev, ag, 0, ab, NULL), 0);
    assert_int_equal(g_dev->ops->memset(g_dev, wg, 0, ab, NULL), 0);
    kc.base = ac, kc.pages = table, kc.n_pages = N_PAGES, kc.wbase = wc, kc.wpages = wtable;
    kg = kc;
    kg.base = ag, kg.wbase = wg;
    lms_pool *pool;
    assert_int_equal(lms__pool_create(2, &pool), 0);
    lms__fwd *fc, *fg;
    setenv("LMSTORE_CUDA_GRAPH", "1", 1);
    assert_int_equal(lms__fwd_create(&lms__fwd_cpu, hp, &m.w, NULL, lms__kernels_best(), pool, 64, 1, N_CTX, &kc, &fc), 0);
    assert_int_equal(lms__fwd_create(lms__fwd_cuda, hp, &m.w, g_dev, NULL, NULL, 64, 1, N_CTX, &kg, &fg), 0);
    uint32_t V = hp->n_vocab;
    float *l1 = malloc((size_t)64 * V * 4), *l2 = malloc((size_t)64 * V * 4);
    int32_t toks[64];
    for (int i = 0; i < 64; i++) toks[i] = (int32_t)((i * 31 + 7) % V);
    /* MLX: decode steps multiply int8 activations (mm_tol) */
    double tol = s->wdt == LMS_DTYPE_BF16 || s->kvdt != LMS_DTYPE_F32            ? 3e-2
                 : s->wdt == LMS_DTYPE_MLX_AFFINE ? 2 * MLXQ_TOL : 1e-3;
    /* prefill 41, decode 40 (graph replays), prefill 30 more: the tensor-core kernel's
     * first key tile then starts below the window */
    uint32_t pos = 0, plan[3] = {41, 40, 30};
    for (int phase = 0; phase < 3; phase++) {
        for (uint32_t k = 0; k < (phase == 1 ? plan[1] : 1); k++) {
            uint32_t nb = phase == 1 ? 1 : plan[phase];
            kc.wfirst = kg.wfirst = pos > hp->window ? (pos - hp->window) / kc.page_tokens : 0;
            assert_int_equal(lms__fwd_block(fc, toks + (phase == 1 ? k % 64 : 0), nb, pos, &kc, l1, phase != 1), 0);
            int rc = lms__fwd_block(fg, toks + (phase == 1 ? k % 64 : 0), nb, pos, &kg, l2, phase != 1);
            if (rc)
                printf("cuda forward (window): %s\n", lms_last_error());
            assert_int_equal(rc, 0);
            check(phase == 1 ? "window decode (graph)" : "window prefill", s, nb, pos, l2, l1,
                  (size_t)(phase == 1 ? 1 : nb) * V, tol);
            pos += nb;
            poison_window(&kc, &kg, pos);
        }
    }
    free(l1), free(l2), free(wc);
    g_dev->ops->free(g_dev, wg);
    pair_free(fc, fg, pool, ac, ag, &m);
}

/* ---- steps of several sequences ------------------------------------------------------------------------ */

#define SEG_SEQS 5
#define SEG_PAGES 8 /* pages per sequence: 128 positions */

/* Each step of the schedule: rows per sequence (0: not in the step); a sequence's
 * logits are wanted when `out` has its bit. */
typedef struct seg_plan {
    uint32_t nb[SEG_SEQS];
    uint32_t out;
} seg_plan;

static const seg_plan SEG_PLAN[] = {
    {{17, 5, 30, 0, 0}, 0x7},   /* prefills of three sequences, one past a page */
    {{1, 1, 10, 15, 3}, 0x1f},  /* two decode rows, a chunk across a page boundary, two new prompts */
    {{1, 1, 1, 1, 1}, 0x1f},    /* decode rows only */
    {{1, 0, 1, 1, 1}, 0x0},     /* no logits: the cache only */
    {{1, 1, 1, 20, 1}, 0x17},   /* a long chunk (the tensor-core kernel with 16-bit K/V) amid decode rows */
    {{9, 1, 1, 1, 1}, 0x1e},    /* a 9-row chunk first, decode rows after */
    {{1, 1, 1, 1, 1}, 0x1f},
    {{1, 1, 1, 1, 1}, 0x1f},
};

static void test_segments_shape(const shape *s)
{
    model m;
    model_make(&m, s);
    lms__kvview kc, kg;
    kv_geometry(&kc, &m.hp, s->kvdt);
    size_t ab = SEG_SEQS * SEG_PAGES * kc.page_bytes;
    uint8_t *ac = calloc(1, ab);
    void *ag;
    assert_int_equal(g_dev->ops->alloc(g_dev, ab, &ag), 0);
    assert_int_equal(g_dev->ops->memset(g_dev, ag, 0, ab, NULL), 0);
    kc.base = ac;
    kg = kc;
    kg.base = ag;
    /* each sequence its own pages, scrambled over the arena */
    uint32_t tables[SEG_SEQS][SEG_PAGES], pos[SEG_SEQS] = {0};
    lms__kvview vc[SEG_SEQS], vg[SEG_SEQS];
    for (uint32_t q = 0; q < SEG_SEQS; q++) {
        for (uint32_t i = 0; i < SEG_PAGES; i++) tables[q][i] = ((q * SEG_PAGES + i) * 17 + 3) % (SEG_SEQS * SEG_PAGES);
        vc[q] = kc, vg[q] = kg;
        vc[q].pages = vg[q].pages = tables[q];
        vc[q].n_pages = vg[q].n_pages = SEG_PAGES;
    }
    lms_pool *pool;
    assert_int_equal(lms__pool_create(2, &pool), 0);
    lms__fwd *fc, *fg;
    assert_int_equal(lms__fwd_create(&lms__fwd_cpu, &m.hp, &m.w, NULL, lms__kernels_best(), pool, 64, SEG_SEQS, N_CTX,
                                     &kc, &fc),
                     0);
    assert_int_equal(lms__fwd_create(lms__fwd_cuda, &m.hp, &m.w, g_dev, NULL, NULL, 64, SEG_SEQS, N_CTX, &kg, &fg), 0);
    assert_true(lms__fwd_has_segments(fg));
    uint32_t V = m.hp.n_vocab;
    float *l1 = malloc((size_t)SEG_SEQS * V * 4), *l2 = malloc((size_t)SEG_SEQS * V * 4);
    double tol = s->wdt == LMS_DTYPE_BF16 || s->kvdt != LMS_DTYPE_F32 ? 3e-2 : 1e-3;
    for (size_t k = 0; k < LMS_ARRAY_LEN(SEG_PLAN); k++) {
        const seg_plan *pl = &SEG_PLAN[k];
        int32_t toks[64];
        lms__seg sc[SEG_SEQS], sg[SEG_SEQS];
        uint32_t out_rows[SEG_SEQS], nseg = 0, nrows = 0, nout = 0;
        for (uint32_t q = 0; q < SEG_SEQS; q++) {
            if (!pl->nb[q])
                continue;
            for (uint32_t t = 0; t < pl->nb[q]; t++) toks[nrows + t] = (int32_t)(((pos[q] + t) * 7 + q * 131 + 5) % V);
            sc[nseg] = (lms__seg){nrows, pl->nb[q], pos[q], &vc[q]};
            sg[nseg] = (lms__seg){nrows, pl->nb[q], pos[q], &vg[q]};
            nseg++;
            nrows += pl->nb[q];
            pos[q] += pl->nb[q];
            if (pl->out >> q & 1)
                out_rows[nout++] = nrows - 1;
        }
        assert_int_equal(lms__fwd_segments(fc, toks, nrows, sc, nseg, out_rows, nout, l1), 0);
        int rc = lms__fwd_segments(fg, toks, nrows, sg, nseg, out_rows, nout, l2);
        if (rc)
            printf("cuda segments: %s\n", lms_last_error());
        assert_int_equal(rc, 0);
        char what[48];
        snprintf(what, sizeof what, "segments step %zu (%u seqs)", k, nseg);
        if (nout)
            check(what, s, nrows, 0, l2, l1, (size_t)nout * V, tol);
    }
    /* the cache both wrote: every sequence's K/V of every position, as f32 */
    uint8_t *g = malloc(ab);
    assert_int_equal(g_dev->ops->copy_d2h(g_dev, g, ag, ab, NULL), 0);
    size_t n = ab / esz(s->kvdt);
    lms__wt w1 = {ac, NULL, s->kvdt, 1, (uint32_t)n, NULL}, w2 = {g, NULL, s->kvdt, 1, (uint32_t)n, NULL};
    float *a1 = malloc(n * 4), *a2 = malloc(n * 4);
    lms__row_to_f32(&w1, 0, a1);
    lms__row_to_f32(&w2, 0, a2);
    check("segments k/v", s, 0, 0, a2, a1, n, tol);
    free(a1), free(a2), free(g);
    free(l1), free(l2);
    pair_free(fc, fg, pool, ac, ag, &m);
}

/* ---- the shapes -------------------------------------------------------------------------------------- */

static const shape SHAPES[] = {
    /* E, heads, kv, hd, F, V, weights, kv, bias, qk_norm */
    {256, 4, 2, 64, 512, 1000, LMS_DTYPE_BF16, LMS_DTYPE_F16, false, false, 0, 0},
    {512, 8, 2, 128, 1024, 3001, LMS_DTYPE_BF16, LMS_DTYPE_BF16, true, true, 0, 0},
    {512, 4, 4, 128, 1000, 777, LMS_DTYPE_F16, LMS_DTYPE_F32, false, true, 0, 0},
    {136, 2, 1, 64, 300, 500, LMS_DTYPE_F32, LMS_DTYPE_F32, true, false, 0, 0},
    {260, 4, 1, 256, 515, 999, LMS_DTYPE_BF16, LMS_DTYPE_F16, false, false, 0, 0}, /* K % 8 != 0: scalar GEMV */
    {576, 9, 3, 64, 1536, 4097, LMS_DTYPE_BF16, LMS_DTYPE_F16, false, false, 0, 0}, /* SmolLM2's widths */
    {64, 4, 2, 24, 96, 384, LMS_DTYPE_BF16, LMS_DTYPE_F32, true, true, 0, 0},      /* the fixtures': head_dim 24, 16 */
    {64, 4, 2, 16, 96, 384, LMS_DTYPE_BF16, LMS_DTYPE_F16, false, false, 0, 0},
    /* MLX affine: bits, group */
    {256, 4, 2, 64, 512, 1000, LMS_DTYPE_MLX_AFFINE, LMS_DTYPE_F16, false, false, 4, 64},
    {512, 8, 2, 128, 1024, 3001, LMS_DTYPE_MLX_AFFINE, LMS_DTYPE_F32, true, true, 4, 128},
    {576, 9, 3, 64, 1536, 4097, LMS_DTYPE_MLX_AFFINE, LMS_DTYPE_F32, false, true, 8, 32},
    {64, 4, 2, 16, 96, 384, LMS_DTYPE_MLX_AFFINE, LMS_DTYPE_F32, true, true, 4, 32}, /* the fixture's */
    /* widths not a multiple of 512 with an odd number of groups a row, rows not a multiple
     * of a warp's 2; rows of several passes of a warp's loads with a partial last one, and
     * an input wider than one quantizing pass (4096 elements with a norm, 8192 without) */
    {320, 5, 1, 64, 960, 1003, LMS_DTYPE_MLX_AFFINE, LMS_DTYPE_F16, false, false, 4, 64},
    {288, 9, 3, 32, 800, 515, LMS_DTYPE_MLX_AFFINE, LMS_DTYPE_F32, false, true, 4, 32},
    {256, 4, 2, 64, 8320, 301, LMS_DTYPE_MLX_AFFINE, LMS_DTYPE_F16, false, false, 4, 64},
};

/* An MLX affine shape and the type of its scales and biases. */
typedef struct mlx_shape {
    shape s;
    lms_dtype sdt;
} mlx_shape;

/* test_ops_shape of each, with its scales' type (BF16 again after). */
static void test_mlx_shapes(const mlx_shape *t, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        g_mlx_sdt = t[i].sdt;
        test_ops_shape(&t[i].s);
    }
    g_mlx_sdt = LMS_DTYPE_BF16;
}

/* MLX affine shapes with F16 and F32 scales and biases (the others have BF16 ones) */
static const mlx_shape MLX_SDT[] = {
    {{320, 5, 1, 64, 960, 1003, LMS_DTYPE_MLX_AFFINE, LMS_DTYPE_F16, false, false, 4, 64}, LMS_DTYPE_F16},
    {{384, 6, 2, 64, 1152, 999, LMS_DTYPE_MLX_AFFINE, LMS_DTYPE_BF16, true, false, 8, 128}, LMS_DTYPE_F32},
    {{576, 9, 3, 64, 1536, 777, LMS_DTYPE_MLX_AFFINE, LMS_DTYPE_F32, false, true, 8, 32}, LMS_DTYPE_F16},
    {{288, 9, 3, 32, 800, 515, LMS_DTYPE_MLX_AFFINE, LMS_DTYPE_F32, false, true, 4, 32}, LMS_DTYPE_F32},
};

static void ops_match_cpu(void **state)
{
    setenv("LMSTORE_CUDA_GRAPH", "0", 1); /* activations are written between operations */
    for (size_t i = 0; i < LMS_ARRAY_LEN(SHAPES); i++) test_ops_shape(&SHAPES[i]);
    test_mlx_shapes(MLX_SDT, LMS_ARRAY_LEN(MLX_SDT));
    printf("ops: %d checks, %d mismatches; one-row MLX products (int8 activations): largest rel err %.3g\n",
           g_checks, g_fail, g_mlxq_max);
    assert_int_equal(g_fail, 0);
}

/* One-row MLX products whose 16-bit scales and biases can come as 16-byte loads (rows of a
 * multiple of 8 groups) under both ways of reading them (LMSTORE_CUDA_MLX_SB 0: a 2-byte
 * load per chunk; 1: 16-byte loads staged in shared memory), against the CPU: 4- and 8-bit
 * codes, groups of 32,
 * 64 and 128, widths that end inside a round of a warp's loads (1536 and 5120 4-bit, 1024
 * 8-bit), a down projection whose groups a row are not a multiple of 8 (the 2-byte path
 * in the same step), odd row counts, and F16 scales. */
static void mlx_scale_loads_match_cpu(void **state)
{
    static const mlx_shape T[] = {
        {{1536, 12, 4, 128, 2560, 1001, LMS_DTYPE_MLX_AFFINE, LMS_DTYPE_F16, false, true, 4, 64}, LMS_DTYPE_BF16},
        {{1024, 8, 2, 128, 3072, 999, LMS_DTYPE_MLX_AFFINE, LMS_DTYPE_F16, true, false, 4, 32}, LMS_DTYPE_BF16},
        {{2048, 16, 4, 128, 5120, 777, LMS_DTYPE_MLX_AFFINE, LMS_DTYPE_F16, false, false, 4, 128}, LMS_DTYPE_BF16},
        {{1024, 8, 2, 128, 2816, 1003, LMS_DTYPE_MLX_AFFINE, LMS_DTYPE_F16, false, true, 8, 64}, LMS_DTYPE_BF16},
        {{1024, 8, 2, 128, 3072, 515, LMS_DTYPE_MLX_AFFINE, LMS_DTYPE_F16, false, false, 8, 32}, LMS_DTYPE_F16},
        {{1536, 12, 4, 128, 2560, 1001, LMS_DTYPE_MLX_AFFINE, LMS_DTYPE_F16, false, false, 4, 64}, LMS_DTYPE_F16},
    };
    static const char *const mode[] = {"0", "1"};
    int before = g_fail;
    setenv("LMSTORE_CUDA_GRAPH", "0", 1);
    for (int v = 0; v < 2; v++) {
        setenv("LMSTORE_CUDA_MLX_SB", mode[v], 1);
        test_mlx_shapes(T, LMS_ARRAY_LEN(T));
    }
    unsetenv("LMSTORE_CUDA_MLX_SB");
    printf("MLX scales and biases by 16-byte loads: %d mismatches; largest one-row MLX rel err %.3g\n",
           g_fail - before, g_mlxq_max);
    assert_int_equal(g_fail - before, 0);
}

/* The same operations with the decoding attention split finer and coarser than by default
 * (splits of 7 positions: up to 32 of them, merged by the last block; of 100: several
 * tiles a split, the step's own token at a tile's start or alone in its split) and the
 * one-row GEMV's persistent grid capped at a few blocks, so that every block loops over
 * many groups of rows (the post-norm's sums gathered over them). Head dims 64, 128 and
 * 256 with 1 to 4 query heads per kv head, and 10 (not a multiple of 4: the CUDA-core
 * kernel, its splits merged a dimension a thread). */
static void split_attention_and_gemv_grid_match_cpu(void **state)
{
    static const shape T[] = {
        {256, 4, 2, 64, 512, 1000, LMS_DTYPE_BF16, LMS_DTYPE_F16, false, false, 0, 0},
        {512, 8, 2, 128, 1024, 3001, LMS_DTYPE_BF16, LMS_DTYPE_BF16, true, true, 0, 0},
        {576, 9, 3, 64, 1536, 4097, LMS_DTYPE_BF16, LMS_DTYPE_F16, false, false, 0, 0},
        {256, 4, 2, 256, 512, 1000, LMS_DTYPE_BF16, LMS_DTYPE_F16, false, true, 0, 0}, /* gemma-3's head */
        {256, 2, 2, 128, 512, 777, LMS_DTYPE_F16, LMS_DTYPE_F32, false, true, 0, 0},
        {256, 4, 2, 10, 512, 1000, LMS_DTYPE_BF16, LMS_DTYPE_F16, false, false, 0, 0}, /* merged a dimension a thread */
    };
    static const char *const chunk[] = {"7", "100"}, *const grid[] = {"7", "5"};
    int before = g_fail;
    setenv("LMSTORE_CUDA_GRAPH", "0", 1);
    for (int v = 0; v < 2; v++) {
        setenv("LMSTORE_CUDA_ATT_CHUNK", chunk[v], 1);
        setenv("LMSTORE_CUDA_GEMV_GRID", grid[v], 1);
        for (size_t i = 0; i < LMS_ARRAY_LEN(T); i++) test_ops_shape(&T[i]);
    }
    unsetenv("LMSTORE_CUDA_ATT_CHUNK");
    unsetenv("LMSTORE_CUDA_GEMV_GRID");
    printf("split attention, small GEMV grid: %d mismatches\n", g_fail - before);
    assert_int_equal(g_fail - before, 0);
}

/* Decoding attention over long contexts (up to 5120 positions, 320 scrambled pages) against
 * the CPU backend: one and three rows at positions crossing 1024 and 4096 and near the end,
 * with the splits by default, of 300 positions (a warp of the tensor-core kernel over several
 * tiles) and of 7 (many splits, none dividing the range), those again without thread block
 * clusters (one row at 1023 at head dims up to 128 merges its splits in one), and without
 * the tensor-core kernel; query heads a kv head 1, 2, 3, 4, 8 and 16, head dims 64/128/256,
 * 16-bit and f32 K/V; plain, windowed (1000), soft-capped, and with the token's RoPE fused. */
static void long_context_attention_matches_cpu(void **state)
{
    static const shape T[] = {
        {256, 8, 2, 128, 512, 1000, LMS_DTYPE_BF16, LMS_DTYPE_BF16, false, false, 0, 0}, /* llama-3-8b's */
        {256, 8, 1, 128, 512, 1000, LMS_DTYPE_BF16, LMS_DTYPE_F16, false, true, 0, 0},
        {256, 4, 2, 256, 512, 1000, LMS_DTYPE_BF16, LMS_DTYPE_BF16, false, true, 0, 0}, /* gemma-3's */
        {256, 2, 2, 64, 512, 1000, LMS_DTYPE_BF16, LMS_DTYPE_BF16, false, false, 0, 0},
        {256, 6, 2, 64, 512, 1000, LMS_DTYPE_BF16, LMS_DTYPE_F16, false, false, 0, 0},
        {256, 16, 1, 64, 512, 1000, LMS_DTYPE_BF16, LMS_DTYPE_BF16, false, false, 0, 0},
        {256, 4, 2, 128, 512, 1000, LMS_DTYPE_BF16, LMS_DTYPE_F32, false, false, 0, 0},
    };
    static const char *const chunk[] = {NULL, "300", "7", "7", NULL};
    const uint32_t nbs[] = {1, 3}, pos0s[] = {1023, 4094, 5116};
    int before = g_fail;
    setenv("LMSTORE_CUDA_GRAPH", "0", 1);
    for (size_t i = 0; i < LMS_ARRAY_LEN(T); i++)
        for (int c = 0; c < 5; c++) {
            if (chunk[c])
                setenv("LMSTORE_CUDA_ATT_CHUNK", chunk[c], 1);
            if (c == 3) /* the splits' partials merged through global memory, not in clusters */
                setenv("LMSTORE_CUDA_ATT_CLUSTER", "0", 1);
            if (c == 4)
                setenv("LMSTORE_CUDA_ATT_MMA", "0", 1);
            model m;
            pair p;
            stepset ss;
            model_make(&m, &T[i]);
            pair_open_n(&p, &m, T[i].kvdt, LONG_PAGES, LONG_PAGES * 16);
            const lms__hparams *hp = &m.hp;
            for (size_t ni = 0; ni < 2; ni++)
                for (size_t pi = 0; pi < 3; pi++) {
                    uint32_t nb = nbs[ni], pos0 = pos0s[pi];
                    steps(&p, &ss, nb, pos0);
                    float *q = rows(nb, hp->n_heads * hp->head_dim, 1.5f);
                    float *k = rows(nb, hp->n_kv_heads * hp->head_dim, 1.5f);
                    float *v = rows(nb, hp->n_kv_heads * hp->head_dim, 1.0f);
                    check_attention(&p, &ss, &T[i], nb, pos0, q, k, v, 1000);
                    free(q), free(k), free(v);
                }
            pair_close(&p);
            model_free(&m);
            unsetenv("LMSTORE_CUDA_ATT_CHUNK");
            unsetenv("LMSTORE_CUDA_ATT_CLUSTER");
            unsetenv("LMSTORE_CUDA_ATT_MMA");
        }
    printf("long-context attention: %d mismatches\n", g_fail - before);
    assert_int_equal(g_fail - before, 0);
}

static void forward_matches_cpu(void **state)
{
    int before = g_fail;
    for (size_t i = 0; i < LMS_ARRAY_LEN(SHAPES); i++) test_forward_shape(&SHAPES[i]);
    printf("forward: %d mismatches\n", g_fail - before);
    assert_int_equal(g_fail - before, 0);
}

/* fn over shapes [0, n); the mismatches they printed fail the test. */
static void each_shape(const char *what, void (*fn)(const shape *), const shape *shapes, size_t n)
{
    int before = g_fail;
    for (size_t i = 0; i < n; i++) fn(&shapes[i]);
    printf("%s: %d mismatches\n", what, g_fail - before);
    assert_int_equal(g_fail - before, 0);
}

static void window_group_forward_matches_cpu(void **state)
{
    /* head dims 64, 128, 256 (gemma-3's), 16-bit and f32 K/V (the decoding kernel for prefill too) */
    static const shape W[] = {
        {256, 4, 1, 256, 512, 1000, LMS_DTYPE_BF16, LMS_DTYPE_BF16, false, true, 0, 0},
        {512, 8, 2, 128, 1024, 3001, LMS_DTYPE_BF16, LMS_DTYPE_F16, false, true, 0, 0},
        {64, 4, 2, 32, 96, 384, LMS_DTYPE_BF16, LMS_DTYPE_F32, false, true, 0, 0},
    };
    each_shape("window group forward", test_window_shape, W, LMS_ARRAY_LEN(W));
}

static void segments_match_cpu(void **state)
{
    /* F32 K/V (the decoding kernel for every row), 16-bit K/V (the tensor-core kernel for
     * long chunks), head sizes 24 (the scalar paths), 64, 128 */
    static const shape S[] = {
        {512, 8, 2, 128, 1024, 3001, LMS_DTYPE_BF16, LMS_DTYPE_F32, true, true, 0, 0},
        {136, 2, 1, 64, 300, 500, LMS_DTYPE_F32, LMS_DTYPE_F32, true, false, 0, 0},
        {64, 4, 2, 24, 96, 384, LMS_DTYPE_BF16, LMS_DTYPE_F32, true, true, 0, 0},
        {256, 4, 2, 64, 512, 1000, LMS_DTYPE_BF16, LMS_DTYPE_F16, false, false, 0, 0},
        {512, 8, 2, 128, 1024, 3001, LMS_DTYPE_BF16, LMS_DTYPE_BF16, true, true, 0, 0},
        {64, 4, 2, 16, 96, 384, LMS_DTYPE_MLX_AFFINE, LMS_DTYPE_F32, true, true, 4, 32},
    };
    setenv("LMSTORE_CUDA_GRAPH", "1", 1); /* steps of segments are never recorded */
    each_shape("segments", test_segments_shape, S, LMS_ARRAY_LEN(S));
}

/* Every operation at gemma-3-27b's width (5376): norm_add's rows of more than 1024 float4,
 * more than 256 threads a block (kernels.cu: norm_add_threads). Last, so that the random
 * data of the tests before it stays as it was; f32 K/V, whose writes cannot round apart
 * between the backends. */
static void wide_rows_match_cpu(void **state)
{
    static const shape W = {5376, 4, 2, 128, 512, 1000, LMS_DTYPE_BF16, LMS_DTYPE_F32, false, true, 0, 0};
    int before = g_fail;
    setenv("LMSTORE_CUDA_GRAPH", "0", 1);
    test_ops_shape(&W);
    printf("wide rows: %d mismatches\n", g_fail - before);
    assert_int_equal(g_fail - before, 0);
}

int main(void)
{
    /* the CPU backend is the reference: f32 activations into every product (on CPUs with
     * AVX-512 BF16 it otherwise rounds the inputs of BF16 weight products to bf16) */
    setenv("LMSTORE_BF16_ACT", "0", 1);
    if (!lms__fwd_cuda) {
        fprintf(stderr, "built without CUDA: skipped\n");
        return 77;
    }
    if (lms_device_open(LMS_DEVICE_CUDA, 0, &g_dev)) {
        fprintf(stderr, "no CUDA device (%s): skipped\n", lms_last_error());
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(ops_match_cpu),
        cmocka_unit_test(split_attention_and_gemv_grid_match_cpu),
        cmocka_unit_test(long_context_attention_matches_cpu),
        cmocka_unit_test(mlx_scale_loads_match_cpu),
        cmocka_unit_test(forward_matches_cpu),
        cmocka_unit_test(window_group_forward_matches_cpu),
        cmocka_unit_test(segments_match_cpu),
        cmocka_unit_test(wide_rows_match_cpu),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    lms_device_close(g_dev);
    return rc;
}
