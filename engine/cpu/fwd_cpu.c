/*
 * engine/cpu/fwd_cpu.c - the CPU backend of the forward operations
 * (engine/backend.h): matrix products split by rows over the thread pool
 * through the SIMD kernel tables (engine/cpu/kernels*.c for 16/32-bit
 * weights, engine/cpu/quant*.c for GGUF block types and MLX affine),
 * weights read in place from the mapping, every accumulation in f32, and
 * every activation, except that with kernels that have gemm_xbf16 (AVX-512
 * BF16) the input of a BF16 weight product is rounded to bf16 once per
 * product (into xb), as llama.cpp does for BF16 weights.
 *
 * A block of up to max_block tokens shares each pass over the weights
 * (prefill); decode is a block of one. The jobs of one matmul call (q/k/v,
 * gate/up) run as one pool dispatch. For GGUF block types the call's input
 * is quantized once (8-bit blocks: one form for the 32-element types, one
 * for the K types) before that dispatch, and every thread reads the same
 * quantized rows, as llama.cpp does. A prefill block's inputs (norm,
 * activation, rounding) are computed a token per task over the pool. All
 * scratch is allocated at create: nothing is allocated per token.
 *
 * Segments (the batched engine): a step's rows may belong to several
 * sequences; begin() resolves each row's position and KV view (rpos, rkv),
 * which qk_rope and attention read, so matrix products stay one pass over
 * all rows.
 */
#include <assert.h>
#include <math.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/cpu/quant.h"

/* The two forms of quantized activations: for Q4_0 .. Q8_0 and for the K types. */
enum { XQ_32 = 0, XQ_K = 1 };

/* Consecutive tokens of one sequence whose attention runs as one block. */
typedef struct lms__attchunk {
    uint32_t t0, nt;
} lms__attchunk;

struct lms__bk {
    const lms__hparams *hp;
    const lms__weights *w;
    const lms__kernels *k;
    const lms__qkernels *qk;   /* quantized weights' kernels */
    void *xq[2];               /* [B] quantized input rows of the current matmul, per form (or NULL
                                * when the model has no GGUF-type matrix) */
    lms_pool *pool;
    int nthreads;
    uint32_t B, n_ctx, G;
    float *buf[LMS__B_COUNT_]; /* [B][width] each */
    uint32_t width[LMS__B_COUNT_];
    float *xin;                /* [B][max width]: a matmul's transformed input */
    uint16_t *xb;              /* [B][ldxb]: that input rounded to bf16 (kernels with gemm_xbf16) */
    size_t ldxb;
    float *inv_freq[2];        /* [hd/2] global, local */
    float *cs;                 /* [B][hd] cos | sin per token (tables of the current qk_rope) */
    float *scores;             /* [threads][G][n_ctx] */
    float *ascr;               /* [threads][att_scratch_floats] blocked attention's scratch */
    lms__attchunk *achunk;     /* [B] this step's query chunks (cpu_attention) */
    uint32_t n_achunk;
    uint32_t *rpos;            /* [B] each row's position in its sequence (this step) */
    const lms__kvview **rkv;   /* [B] each row's KV view (this step) */
    const lms__step *st;       /* the step in progress */
};

/* ---- matrix products over the pool ------------------------------------------------------- */

typedef struct mm_job {
    const lms__wt *w;
    const float *x;
    size_t ldx;
    const void *xq;     /* GGUF block types: x quantized for w's dtype (lms__qx_quantize) */
    const uint16_t *xb; /* BF16 weights with k->gemm_xbf16: x rounded to bf16 */
    size_t ldxb;
    float *y;
    size_t ldy;
    bool acc;
    uint32_t chunk, items;
} mm_job;

typedef struct mm_run {
    const lms__kernels *k;
    const lms__qkernels *qk;
    mm_job *jobs;
    int n_jobs;
    uint32_t nb;
} mm_run;

static bool quantized(lms_dtype dt) { return lms_dtype_is_quantized(dt); }

/* Rows [r0, r1) of an MLX_AFFINE matrix as the kernels take it. */
static lms__mlx_mat mlx_rows(const lms__wt *w, uint32_t r0)
{
    const lms__mlx_q *q = w->mlx;
    size_t lds = w->cols / q->group, es = lms_dtype_size(q->sdt);
    return (lms__mlx_mat){(const uint8_t *)w->p + (size_t)r0 * lms__wt_row_bytes(w), lms__wt_row_bytes(w),
                          (const uint8_t *)q->scales + (size_t)r0 * lds * es,
                          (const uint8_t *)q->biases + (size_t)r0 * lds * es, lds, q->sdt, q->bits, q->group};
}

static void mm_task(void *arg, size_t i, int worker)
{
    mm_run *r = arg;
    int j = 0;
    (void)worker;
    while (i >= r->jobs[j].items) i -= r->jobs[j++].items;
    mm_job *jb = &r->jobs[j];
    const lms__wt *w = jb->w;
    uint32_t r0 = (uint32_t)i * jb->chunk, r1 = LMS_MIN(r0 + jb->chunk, w->rows);
    int rows = (int)(r1 - r0), cols = (int)w->cols;
    if (w->dt == LMS_DTYPE_MLX_AFFINE) {
        lms__mlx_mat m = mlx_rows(w, r0);
        r->qk->mlx(&m, jb->x, jb->ldx, jb->y + r0, jb->ldy, rows, (int)r->nb, cols, jb->acc);
    } else if (quantized(w->dt)) {
        size_t rb = lms__wt_row_bytes(w);
        r->qk->gemm_q[w->dt]((const uint8_t *)w->p + (size_t)r0 * rb, rb, jb->xq, jb->y + r0, jb->ldy, rows,
                             (int)r->nb, cols, jb->acc);
    } else if (jb->xb) {
        r->k->gemm_xbf16((const uint16_t *)w->p + (size_t)r0 * w->cols, w->cols, jb->xb, jb->ldxb, jb->y + r0,
                         jb->ldy, rows, (int)r->nb, cols, jb->acc);
    } else {
        size_t esz = w->dt == LMS_DTYPE_F32 ? 4 : 2;
        r->k->gemm[lms__dt_index(w->dt)]((const uint8_t *)w->p + (size_t)r0 * w->cols * esz, w->cols, jb->x,
                                         jb->ldx, jb->y + r0, jb->ldy, rows, (int)r->nb, cols, jb->acc);
    }
}

typedef struct xq_run {
    lms_dtype dt;
    const float *x;
    size_t ldx;
    int cols;
    uint8_t *out;
    size_t rb;
} xq_run;

static void xq_task(void *arg, size_t i, int worker)
{
    xq_run *r = arg;
    (void)worker;
    lms__qx_quantize(r->dt, r->x + i * r->ldx, r->ldx, 1, r->cols, r->out + i * r->rb);
}

/* Quantize the jobs' shared input once per form their weights need, rows
 * over the pool; each GGUF-type job gets its form's rows. */
static void mm_quantize_input(lms__bk *b, mm_job *jobs, int n, uint32_t nb)
{
    bool done[2] = {false, false};
    for (int j = 0; j < n; j++) {
        lms_dtype dt = jobs[j].w->dt;
        if (!quantized(dt) || dt == LMS_DTYPE_MLX_AFFINE)
            continue;
        int form = lms_dtype_block_elems(dt, 0) == LMS__QK_K ? XQ_K : XQ_32;
        assert(b->xq[form]);
        jobs[j].xq = b->xq[form];
        if (done[form])
            continue;
        done[form] = true;
        xq_run r = {dt, jobs[j].x, jobs[j].ldx, (int)jobs[j].w->cols, b->xq[form],
                    lms__qx_row_bytes(dt, (int)jobs[j].w->cols)};
        if (nb == 1) /* decode: a row is microseconds of work, less than a dispatch */
            xq_task(&r, 0, 0);
        else
            lms__pool_run(b->pool, nb, xq_task, &r);
    }
}

static void mm_multi(lms__bk *b, mm_job *jobs, int n, uint32_t nb)
{
    mm_quantize_input(b, jobs, n, nb);
    size_t items = 0;
    /* chunks of whole row blocks of the prefill kernels (48 rows; 8 chunks a
     * thread or more, the threads finish together), 16 rows (4 a thread) in decode */
    uint32_t unit = nb >= 4 ? 48 : 16, per = nb >= 4 ? 8 : 4;
    for (int j = 0; j < n; j++) {
        uint32_t rows = jobs[j].w->rows;
        uint32_t c = rows / (uint32_t)(b->nthreads * per);
        c = (c + unit - 1) / unit * unit;
        c = LMS_MAX(c, unit);
        c = LMS_MIN(c, 512u / unit * unit);
        jobs[j].chunk = c;
        jobs[j].items = (rows + c - 1) / c;
        items += jobs[j].items;
    }
    mm_run r = {b->k, b->qk, jobs, n, nb};
    lms__pool_run(b->pool, items, mm_task, &r);
}

/* ---- small ops --------------------------------------------------------------------------- */

static void rmsnorm(const lms__kernels *k, float *out, const float *x, const float *w, uint32_t n, float eps)
{
    double ss = 0;
    if (k->sumsq)
        ss = k->sumsq(x, (int)n);
    else
        for (uint32_t i = 0; i < n; i++) ss += (double)x[i] * x[i];
    float r = 1.0f / sqrtf((float)(ss / n) + eps);
    for (uint32_t i = 0; i < n; i++) out[i] = w[i] * (x[i] * r);
}

static void rope(float *v, const float *cs, uint32_t hd)
{
    uint32_t h = hd / 2;
    const float *c = cs, *s = cs + h;
    for (uint32_t i = 0; i < h; i++) {
        float x1 = v[i], x2 = v[i + h];
        v[i] = x1 * c[i] - x2 * s[i];
        v[i + h] = x2 * c[i] + x1 * s[i];
    }
}

static void store_kv(const lms__kernels *k, void *dst, const float *src, uint32_t n, lms_dtype dt)
{
    if (dt == LMS_DTYPE_F32) {
        memcpy(dst, src, n * sizeof(float));
    } else if (dt == LMS_DTYPE_F16 && k->to_f16) {
        k->to_f16(src, dst, (int)n);
    } else if (dt == LMS_DTYPE_F16) {
        uint16_t *d = dst;
        for (uint32_t i = 0; i < n; i++) d[i] = lms__f32_to_f16(src[i]);
    } else {
        uint16_t *d = dst;
        for (uint32_t i = 0; i < n; i++) d[i] = lms__f32_to_bf16(src[i]);
    }
}

static float act_val(lms__act a, float g)
{
    if (a == LMS__ACT_SILU)
        return g / (1.0f + expf(-g));
    /* gelu, tanh approximation (transformers' gelu_pytorch_tanh) */
    return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
}

/* ---- attention --------------------------------------------------------------------------- */

typedef struct att_run {
    lms__bk *b;
    uint32_t layer, window;
    float scale, softcap;
} att_run;

/* Scores s[p0, p1) scaled (and soft-capped) in place; returns their max. */
static float att_logits(const att_run *a, float *s, uint32_t p0, uint32_t p1)
{
    float m = -INFINITY;
    for (uint32_t p = p0; p < p1; p++) {
        float v = s[p] * a->scale;
        if (a->softcap > 0)
            v = a->softcap * tanhf(v / a->softcap);
        s[p] = v;
        m = v > m ? v : m;
    }
    return m;
}

/* One kv head h for one token t: its G query heads over positions [lo, pos0+t]. */
static void att_one(const att_run *a, uint32_t h, uint32_t t, int worker)
{
    lms__bk *bk = a->b;
    const lms__hparams *hp = bk->hp;
    const lms__kvview *kv = bk->rkv[t];
    uint32_t hd = hp->head_dim, G = bk->G, P = bk->rpos[t] + 1, pt = kv->page_tokens;
    uint32_t lo = a->window && P > a->window ? P - a->window : 0;
    float *sc = bk->scores + (size_t)worker * G * bk->n_ctx;
    const float *q = bk->buf[LMS__B_Q] + (size_t)t * bk->width[LMS__B_Q] + (size_t)h * G * hd;
    float *out = bk->buf[LMS__B_ATT] + (size_t)t * bk->width[LMS__B_ATT] + (size_t)h * G * hd;
    int dti = lms__dt_index(kv->dtype);
    lms__kvloc L = lms__kv_layer(kv, a->layer);
    size_t lo_off = L.layer_off + (size_t)h * kv->head_bytes;
    assert(!L.group || lo / pt >= kv->wfirst); /* the window's pages are held */

    /* scores of positions [p0, p1) of each page, at sc[g][pos] */
    for (uint32_t i = lo / pt; i * pt < P; i++) {
        uint32_t p0 = LMS_MAX(i * pt, lo), p1 = LMS_MIN((i + 1) * pt, P);
        const uint8_t *K = L.base + (size_t)L.pages[i] * L.page_bytes + lo_off + (p0 - i * pt) * kv->token_bytes;
        bk->k->gemm[dti](K, hd, q, hd, sc + p0, bk->n_ctx, (int)(p1 - p0), (int)G, (int)hd, false);
    }
    for (uint32_t g = 0; g < G; g++) {
        float *s = sc + (size_t)g * bk->n_ctx, mx = att_logits(a, s, lo, P);
        double sum = 0;
        if (bk->k->expsum) {
            /* the exponentials by the kernels (the blocked prefill's), their sum in double
             * as below, in four chains: in double their order moves the sum by far less
             * than a float's unit */
            double s4[4] = {0, 0, 0, 0};
            uint32_t p = lo;
            bk->k->expsum(s + lo, (int)(P - lo), mx);
            for (; p + 4 <= P; p += 4)
                for (int i = 0; i < 4; i++) s4[i] += s[p + i];
            for (; p < P; p++) s4[0] += s[p];
            sum = (s4[0] + s4[1]) + (s4[2] + s4[3]);
        } else {
            for (uint32_t p = lo; p < P; p++) {
                s[p] = expf(s[p] - mx);
                sum += s[p];
            }
        }
        float inv = (float)(1.0 / sum);
        for (uint32_t p = lo; p < P; p++) s[p] *= inv;
        memset(out + (size_t)g * hd, 0, hd * sizeof(float));
    }
    for (uint32_t i = lo / pt; i * pt < P; i++) {
        uint32_t p0 = LMS_MAX(i * pt, lo), p1 = LMS_MIN((i + 1) * pt, P);
        const uint8_t *V = L.base + (size_t)L.pages[i] * L.page_bytes + lo_off + kv->v_offset;
        for (uint32_t g = 0; g < G; g++) {
            const float *s = sc + (size_t)g * bk->n_ctx;
            float *o = out + (size_t)g * hd;
            if (bk->k->axpyn[dti])
                bk->k->axpyn[dti](o, V + (p0 - i * pt) * kv->token_bytes, kv->token_bytes, s + p0, (int)(p1 - p0),
                                  (int)hd);
            else
                for (uint32_t p = p0; p < p1; p++)
                    bk->k->axpy[dti](o, V + (p - i * pt) * kv->token_bytes, s[p], (int)hd);
        }
    }
}

/*
 * Prefill attention by blocks of queries: a chunk of up to ATT_TQ
 * consecutive tokens of one sequence (consecutive positions, one KV view)
 * and one kv head. The chunk's nt * G query rows run over the keys ATT_PC
 * positions at a time, gathered from their pages into this thread's
 * scratch: the scores by the kernels' packed product (each block of keys
 * packed once for all the chunk's rows), then an online softmax (a running
 * max and sum per row; the row's partial output is rescaled when its max
 * grows) and the value rows weighted into the output, each row over its
 * own causal (and window) range only. Chunks of fewer than ATT_MIN tokens
 * (decode) take att_one a token at a time.
 *
 * Invariants: (1) a row's output is the softmax-weighted sum of exactly the
 * positions att_one gives it ([lo, pos]); the two differ only in float
 * rounding (f32 sums, a chunk's max); (2) items are claimed latest chunk
 * first: a later chunk has more positions to attend to, so the long items
 * start first and the threads finish together.
 */
enum { ATT_TQ = 32, ATT_PC = 48, ATT_MIN = 4 };

/* Floats of one worker's scratch for the blocked attention. */
static size_t att_scratch_floats(uint32_t G, uint32_t hd)
{
    size_t M = (size_t)ATT_TQ * G;
    size_t n = 2 * M * hd + M * ATT_PC + 2 * M + 2 * (size_t)ATT_PC * hd;
    return (n + 15) & ~(size_t)15;
}

static void att_chunk(const att_run *a, const lms__attchunk *c, uint32_t h, int worker)
{
    lms__bk *bk = a->b;
    const lms__hparams *hp = bk->hp;
    const lms__kvview *kv = bk->rkv[c->t0];
    uint32_t hd = hp->head_dim, G = bk->G, nt = c->nt, M = nt * G, pt = kv->page_tokens;
    uint32_t pos0 = bk->rpos[c->t0], P = pos0 + nt, W = a->window;
    uint32_t lo = W && pos0 + 1 > W ? pos0 + 1 - W : 0; /* the first token's; later ones' are later */
    size_t esz = kv->elem_size, qw = bk->width[LMS__B_Q], aw = bk->width[LMS__B_ATT];
    float *Q = bk->ascr + (size_t)worker * att_scratch_floats(G, hd);
    float *O = Q + (size_t)ATT_TQ * G * hd, *S = O + (size_t)ATT_TQ * G * hd, *mx = S + (size_t)ATT_TQ * G * ATT_PC;
    float *l = mx + (size_t)ATT_TQ * G;
    uint8_t *Kc = (uint8_t *)(l + (size_t)ATT_TQ * G), *Vc = Kc + (size_t)ATT_PC * hd * 4;
    int dti = lms__dt_index(kv->dtype);
    /* F16 values widened once as they are gathered (every query row reads them): the rows' sums in f32 */
    bool vwide = kv->dtype == LMS_DTYPE_F16 && bk->k->from_f16 && bk->k->axpyn[0];
    size_t vrow = vwide ? hd * 4 : hd * esz;
    int vdti = vwide ? 0 : dti;
    lms__kvloc L = lms__kv_layer(kv, a->layer);
    size_t lo_off = L.layer_off + (size_t)h * kv->head_bytes;
    assert(!L.group || lo / pt >= kv->wfirst); /* the window's pages are held */

    for (uint32_t t = 0; t < nt; t++)
        memcpy(Q + (size_t)t * G * hd, bk->buf[LMS__B_Q] + (size_t)(c->t0 + t) * qw + (size_t)h * G * hd,
               (size_t)G * hd * 4);
    memset(O, 0, (size_t)M * hd * 4);
    for (uint32_t j = 0; j < M; j++) {
        mx[j] = -INFINITY;
        l[j] = 0;
    }
    for (uint32_t c0 = lo; c0 < P;) {
        uint32_t c1 = LMS_MIN(c0 + ATT_PC, P);
        /* the rows that see any of [c0, c1): tokens at or past c0, and (window) starting before c1 */
        uint32_t tf = c0 > pos0 ? c0 - pos0 : 0, tl = nt;
        if (W)
            tl = LMS_MIN(nt, c1 + W - 1 - pos0);
        if (tf >= tl) {
            c0 = c1;
            continue;
        }
        for (uint32_t p = c0; p < c1; p++) {
            const uint8_t *src = L.base + (size_t)L.pages[p / pt] * L.page_bytes + lo_off + (p % pt) * kv->token_bytes;
            memcpy(Kc + (size_t)(p - c0) * hd * esz, src, hd * esz);
            if (vwide)
                bk->k->from_f16((const uint16_t *)(src + kv->v_offset), (float *)(Vc + (size_t)(p - c0) * vrow), (int)hd);
            else
                memcpy(Vc + (size_t)(p - c0) * vrow, src + kv->v_offset, hd * esz);
        }
        bk->k->gemm[dti](Kc, hd, Q + (size_t)tf * G * hd, hd, S + (size_t)tf * G * ATT_PC, ATT_PC, (int)(c1 - c0),
                         (int)((tl - tf) * G), (int)hd, false);
        for (uint32_t t = tf; t < tl; t++) {
            uint32_t pos = pos0 + t, lt = W && pos + 1 > W ? pos + 1 - W : 0;
            uint32_t a0 = LMS_MAX(c0, lt) - c0, a1 = LMS_MIN(c1, pos + 1) - c0;
            if (a0 >= a1)
                continue;
            for (uint32_t g = 0; g < G; g++) {
                uint32_t j = t * G + g;
                float *s = S + (size_t)j * ATT_PC, m = att_logits(a, s, a0, a1);
                float *o = O + (size_t)j * hd;
                if (m > mx[j]) {
                    float r = expf(mx[j] - m); /* 0 for the first block */
                    for (uint32_t i = 0; i < hd; i++) o[i] *= r;
                    l[j] *= r;
                    mx[j] = m;
                }
                float sum = 0;
                if (bk->k->expsum) {
                    sum = bk->k->expsum(s + a0, (int)(a1 - a0), mx[j]);
                } else {
                    for (uint32_t p = a0; p < a1; p++) {
                        s[p] = expf(s[p] - mx[j]);
                        sum += s[p];
                    }
                }
                l[j] += sum;
                const uint8_t *V = Vc + (size_t)a0 * vrow;
                if (bk->k->axpyn[vdti])
                    bk->k->axpyn[vdti](o, V, vrow, s + a0, (int)(a1 - a0), (int)hd);
                else
                    for (uint32_t p = a0; p < a1; p++) bk->k->axpy[vdti](o, V + (p - a0) * vrow, s[p], (int)hd);
            }
        }
        c0 = c1;
    }
    for (uint32_t t = 0; t < nt; t++)
        for (uint32_t g = 0; g < G; g++) {
            uint32_t j = t * G + g;
            float inv = 1.0f / l[j], *out = bk->buf[LMS__B_ATT] + (size_t)(c->t0 + t) * aw + (size_t)(h * G + g) * hd;
            for (uint32_t i = 0; i < hd; i++) out[i] = O[(size_t)j * hd + i] * inv;
        }
}

/* Item i: kv head i % n_kv_heads of chunk (n_chunks - 1 - i / n_kv_heads) (invariant 2). */
static void att_task(void *arg, size_t item, int worker)
{
    att_run *a = arg;
    lms__bk *bk = a->b;
    uint32_t nkv = bk->hp->n_kv_heads, h = (uint32_t)(item % nkv);
    const lms__attchunk *c = &bk->achunk[bk->n_achunk - 1 - item / nkv];
    if (c->nt < ATT_MIN) {
        for (uint32_t t = 0; t < c->nt; t++) att_one(a, h, c->t0 + t, worker);
        return;
    }
    att_chunk(a, c, h, worker);
}

/* ---- the operations ------------------------------------------------------------------------ */

static void cpu_destroy(lms__bk *b)
{
    if (!b)
        return;
    for (int i = 0; i < LMS__B_COUNT_; i++) lms__free(b->buf[i]);
    lms__free(b->xin);
    lms__free(b->xb);
    lms__free(b->inv_freq[0]);
    lms__free(b->inv_freq[1]);
    lms__free(b->cs);
    lms__free(b->scores);
    lms__free(b->ascr);
    lms__free(b->achunk);
    lms__free(b->rpos);
    lms__free(b->rkv);
    lms__free(b->xq[0]);
    lms__free(b->xq[1]);
    lms__free(b);
}

static int cpu_create(const lms__fwd_cfg *cfg, lms__bk **out)
{
    const lms__hparams *hp = cfg->hp;
    lms__bk *b = lms__calloc(1, sizeof *b);
    *out = NULL;
    if (!b)
        return LMS_ENOMEM;
    b->hp = hp;
    b->w = cfg->w;
    b->k = cfg->k;
    b->qk = lms__qkernels_best();
    b->pool = cfg->pool;
    b->nthreads = lms__pool_threads(cfg->pool);
    b->B = cfg->max_block;
    b->n_ctx = cfg->n_ctx;
    b->G = hp->n_heads / hp->n_kv_heads;
    size_t B = cfg->max_block, maxw = 0;
    for (int i = 0; i < LMS__B_COUNT_; i++) {
        b->width[i] = lms__buf_width(hp, (lms__buf)i);
        maxw = LMS_MAX(maxw, (size_t)b->width[i]);
        if (!(b->buf[i] = lms__aligned_alloc(64, B * b->width[i] * 4)))
            goto nomem;
        /* touch all scratch now: no page faults (RSS growth) on the token path */
        memset(b->buf[i], 0, B * b->width[i] * 4);
    }
    size_t hd = hp->head_dim, ssz = (size_t)b->nthreads * b->G * cfg->n_ctx * 4;
    if (!(b->xin = lms__aligned_alloc(64, B * maxw * 4)) || !(b->inv_freq[0] = lms__malloc(hd / 2 * 4 + 4)) ||
        !(b->inv_freq[1] = lms__malloc(hd / 2 * 4 + 4)) || !(b->cs = lms__malloc(B * hd * 4)) ||
        !(b->scores = lms__aligned_alloc(64, ssz)) || !(b->rpos = lms__calloc(B, sizeof *b->rpos)) ||
        !(b->rkv = lms__calloc(B, sizeof *b->rkv)) || !(b->achunk = lms__calloc(B, sizeof *b->achunk)))
        goto nomem;
    if (B >= ATT_MIN) {
        size_t an = (size_t)b->nthreads * att_scratch_floats(b->G, (uint32_t)hd) * 4;
        if (!(b->ascr = lms__aligned_alloc(64, an)))
            goto nomem;
        memset(b->ascr, 0, an);
    }
    memset(b->xin, 0, B * maxw * 4);
    if (b->k->gemm_xbf16) {
        b->ldxb = (maxw + 31) & ~(size_t)31;
        if (!(b->xb = lms__aligned_alloc(64, B * b->ldxb * 2)))
            goto nomem;
        memset(b->xb, 0, B * b->ldxb * 2);
    }
    if (lms__weights_quantized(cfg->w, hp, NULL, 0)) {
        /* every matmul input is at most maxw wide; its rows in both quantized forms */
        size_t n32 = B * lms__qx_row_bytes(LMS_DTYPE_Q8_0, (int)maxw), nk = B * lms__qx_row_bytes(LMS_DTYPE_Q4_K, (int)maxw);
        if (!(b->xq[XQ_32] = lms__aligned_alloc(64, n32 + 64)) || !(b->xq[XQ_K] = lms__aligned_alloc(64, nk + 64)))
            goto nomem;
        memset(b->xq[XQ_32], 0, n32 + 64);
        memset(b->xq[XQ_K], 0, nk + 64);
    }
    memset(b->cs, 0, B * hd * 4);
    memset(b->scores, 0, ssz);
    lms__rope_freqs(hp, LMS__ROPE_GLOBAL, b->inv_freq[0]);
    lms__rope_freqs(hp, LMS__ROPE_LOCAL, b->inv_freq[1]);
    *out = b;
    return 0;
nomem:
    cpu_destroy(b);
    return LMS_ENOMEM;
}

static const char *cpu_describe(const lms__bk *b) { return b->k->name; }

static int cpu_begin(lms__bk *b, const lms__step *st, bool *replayed)
{
    assert(st->nb >= 1 && st->nb <= b->B && (st->n_segs || st->pos0 + st->nb <= b->n_ctx));
    lms__seg one = {0, st->nb, st->pos0, st->kv};
    const lms__seg *sg = st->n_segs ? st->segs : &one;
    uint32_t ns = st->n_segs ? st->n_segs : 1, row = 0;
    for (uint32_t i = 0; i < ns; i++) {
        assert(sg[i].row0 == row && sg[i].nb >= 1 && sg[i].pos0 + sg[i].nb <= b->n_ctx);
        for (uint32_t t = 0; t < sg[i].nb; t++, row++) {
            b->rpos[row] = sg[i].pos0 + t;
            b->rkv[row] = sg[i].kv;
        }
    }
    assert(row == st->nb);
    b->st = st;
    *replayed = false;
    return 0;
}

static int cpu_end(lms__bk *b)
{
    b->st = NULL;
    return 0;
}

void lms__embed_row(const lms__wt *e, uint32_t row, float scale, float *out)
{
    if (e->dt == LMS_DTYPE_MLX_AFFINE) {
        lms__mlx_mat m = mlx_rows(e, row);
        lms__mlx_dequant_row(m.w, m.bits, m.group, m.scales, m.biases, m.sdt, out, e->cols);
    } else if (quantized(e->dt)) {
        int rc = lms__dequant_row(e->dt, (const uint8_t *)e->p + (size_t)row * lms__wt_row_bytes(e), out, e->cols);
        assert(rc == 0); /* weights.c bound only dtypes it dequantizes, in whole blocks */
        (void)rc;
    } else {
        lms__row_to_f32(e, row, out);
    }
    if (scale == 1.0f)
        return;
    /* in the weights' dtype, as transformers multiplies embeddings by a scale cast to it */
    if (e->dt == LMS_DTYPE_BF16) {
        float s = lms__bf16_to_f32(lms__f32_to_bf16(scale));
        for (uint32_t i = 0; i < e->cols; i++) out[i] = lms__bf16_to_f32(lms__f32_to_bf16(out[i] * s));
    } else if (e->dt == LMS_DTYPE_F16) {
        float s = lms__f16_to_f32(lms__f32_to_f16(scale));
        for (uint32_t i = 0; i < e->cols; i++) out[i] = lms__f16_to_f32(lms__f32_to_f16(out[i] * s));
    } else {
        for (uint32_t i = 0; i < e->cols; i++) out[i] *= scale;
    }
}

static void cpu_embed(lms__bk *b, float scale)
{
    const lms__step *st = b->st;
    uint32_t E = b->hp->n_embd;
    for (uint32_t t = 0; t < st->nb; t++) {
        assert(st->tokens[t] >= 0 && (uint32_t)st->tokens[t] < b->hp->n_vocab);
        lms__embed_row(&b->w->embed, (uint32_t)st->tokens[t], scale, b->buf[LMS__B_X] + (size_t)t * E);
    }
}

typedef struct in_run {
    lms__bk *b;
    const lms__mm *j;
    const float *x, *x2; /* [nb][W] the input, and the gate's other half */
    bool xform, tobf;
} in_run;

/* Row t of a matmul's input: normalized or activated into xin, rounded to bf16 into xb. */
static void in_task(void *arg, size_t t, int worker)
{
    in_run *r = arg;
    lms__bk *b = r->b;
    const lms__mm *j = r->j;
    uint32_t W = b->width[j->x];
    const float *x = r->x + t * W;
    float *o = b->xin + t * W;
    (void)worker;
    if (j->norm) {
        rmsnorm(b->k, o, x, j->norm, W, b->hp->eps);
    } else if (j->act != LMS__ACT_NONE) {
        const float *x2 = r->x2 + t * W;
        if (j->act == LMS__ACT_SILU && b->k->silu_mul)
            b->k->silu_mul(o, x, x2, (int)W);
        else if (j->act == LMS__ACT_GELU_TANH && b->k->gelu_mul)
            b->k->gelu_mul(o, x, x2, (int)W);
        else
            for (uint32_t i = 0; i < W; i++) o[i] = act_val(j->act, x[i]) * x2[i];
    }
    if (r->tobf)
        b->k->to_bf16(r->xform ? o : x, b->xb + t * b->ldxb, (int)W);
}

/* The jobs' shared input, transformed (norm or activation) into b->xin, or x
 * itself; with tobf also rounded to bf16 into b->xb. Rows over the pool
 * when there are several. */
static const float *mm_input(lms__bk *b, const lms__mm *j, uint32_t row0, uint32_t nb, bool tobf)
{
    uint32_t W = b->width[j->x];
    assert(j->w->cols == W);
    in_run r = {b, j, b->buf[j->x] + (size_t)row0 * W, NULL, j->norm || j->act != LMS__ACT_NONE, tobf};
    if (j->act != LMS__ACT_NONE)
        r.x2 = b->buf[j->x2] + (size_t)row0 * W;
    if (!r.xform && !tobf)
        return r.x;
    if (nb == 1)
        in_task(&r, 0, 0);
    else
        lms__pool_run(b->pool, nb, in_task, &r);
    return r.xform ? b->xin : r.x;
}

/* BF16 weights go through the kernels' bf16 products when they have them. */
static bool use_xbf16(const lms__bk *b, const lms__wt *w)
{
    return b->k->gemm_xbf16 && w->dt == LMS_DTYPE_BF16 && w->cols % 2 == 0;
}

static void cpu_matmul(lms__bk *b, const lms__mm *jobs, int n)
{
    uint32_t nb = b->st->nb;
    mm_job mj[4];
    bool tobf = false;
    assert(n >= 1 && n <= 4);
    for (int i = 0; i < n; i++) tobf |= use_xbf16(b, jobs[i].w);
    const float *x = mm_input(b, &jobs[0], 0, nb, tobf);
    for (int i = 0; i < n; i++) {
        const lms__mm *j = &jobs[i];
        assert(j->x == jobs[0].x && j->norm == jobs[0].norm && j->act == jobs[0].act);
        assert(b->width[j->y] == j->w->rows);
        mj[i] = (mm_job){j->w, x, b->width[j->x], NULL, use_xbf16(b, j->w) ? b->xb : NULL, b->ldxb,
                         b->buf[j->y], b->width[j->y], j->acc, 0, 0};
    }
    mm_multi(b, mj, n, nb);
    for (int i = 0; i < n; i++) {
        const lms__mm *j = &jobs[i];
        if (!j->bias)
            continue;
        for (uint32_t t = 0; t < nb; t++) {
            float *y = b->buf[j->y] + (size_t)t * b->width[j->y];
            for (uint32_t r = 0; r < j->w->rows; r++) y[r] += j->bias[r];
        }
    }
}

typedef struct rope_run {
    lms__bk *b;
    uint32_t layer;
    const float *q_norm, *k_norm, *inv_freq;
} rope_run;

/* Token t: its q and k heads normed (Qwen3, Gemma 3) and rotated, k and v stored into its KV slot. */
static void rope_task(void *arg, size_t item, int worker)
{
    rope_run *r = arg;
    lms__bk *b = r->b;
    const lms__hparams *hp = b->hp;
    uint32_t t = (uint32_t)item, hd = hp->head_dim, qd = b->width[LMS__B_Q], kvd = b->width[LMS__B_K];
    const lms__kvview *kv = b->rkv[t];
    lms__kvloc L = lms__kv_layer(kv, r->layer);
    float *q = b->buf[LMS__B_Q] + (size_t)t * qd, *k = b->buf[LMS__B_K] + (size_t)t * kvd;
    const float *v = b->buf[LMS__B_V] + (size_t)t * kvd;
    float p = (float)b->rpos[t], *cs = b->cs + (size_t)t * hd;
    (void)worker;
    for (uint32_t i = 0; i < hd / 2; i++) {
        float fr = p * r->inv_freq[i];
        cs[i] = cosf(fr);
        cs[hd / 2 + i] = sinf(fr);
    }
    for (uint32_t h = 0; h < hp->n_heads; h++) {
        if (r->q_norm)
            rmsnorm(b->k, q + h * hd, q + h * hd, r->q_norm, hd, hp->eps);
        rope(q + h * hd, cs, hd);
    }
    uint32_t pos = b->rpos[t], page = L.pages[pos / kv->page_tokens], slot = pos % kv->page_tokens;
    assert(!L.group || pos / kv->page_tokens >= kv->wfirst);
    uint8_t *dst = L.base + (size_t)page * L.page_bytes + L.layer_off + (size_t)slot * kv->token_bytes;
    for (uint32_t h = 0; h < hp->n_kv_heads; h++) {
        if (r->k_norm)
            rmsnorm(b->k, k + h * hd, k + h * hd, r->k_norm, hd, hp->eps);
        rope(k + h * hd, cs, hd);
        store_kv(b->k, dst + (size_t)h * kv->head_bytes, k + h * hd, hd, kv->dtype);
        store_kv(b->k, dst + kv->v_offset + (size_t)h * kv->head_bytes, v + h * hd, hd, kv->dtype);
    }
}

/* Tokens over the pool (each writes its own KV slot and cs row). */
static void cpu_qk_rope(lms__bk *b, uint32_t layer, const float *q_norm, const float *k_norm, int which)
{
    rope_run r = {b, layer, q_norm, k_norm, b->inv_freq[which == LMS__ROPE_LOCAL]};
    if (b->st->nb == 1)
        rope_task(&r, 0, 0);
    else
        lms__pool_run(b->pool, b->st->nb, rope_task, &r);
}

static void cpu_attention(lms__bk *b, uint32_t layer, uint32_t window, float scale, float softcap)
{
    att_run ar = {b, layer, window, scale, softcap};
    uint32_t nb = b->st->nb, n = 0;
    for (uint32_t t = 0; t < nb;) {
        uint32_t e = t + 1;
        while (e < nb && e - t < ATT_TQ && b->rkv[e] == b->rkv[t] && b->rpos[e] == b->rpos[e - 1] + 1) e++;
        b->achunk[n++] = (lms__attchunk){t, e - t};
        t = e;
    }
    b->n_achunk = n;
    lms__pool_run(b->pool, (size_t)b->hp->n_kv_heads * n, att_task, &ar);
}

static void cpu_norm_add(lms__bk *b, lms__buf y, lms__buf x, const float *w)
{
    uint32_t E = b->hp->n_embd;
    for (uint32_t t = 0; t < b->st->nb; t++) {
        float *yr = b->buf[y] + (size_t)t * E, *tmp = b->xin;
        rmsnorm(b->k, tmp, b->buf[x] + (size_t)t * E, w, E, b->hp->eps);
        for (uint32_t i = 0; i < E; i++) yr[i] += tmp[i];
    }
}

static void cpu_head(lms__bk *b, const lms__mm *j, uint32_t row0, uint32_t n, float softcap, float *host_out)
{
    assert(row0 + n <= b->st->nb);
    bool tobf = use_xbf16(b, j->w);
    const float *x = mm_input(b, j, row0, n, tobf);
    mm_job mj = {j->w, x, b->width[j->x], NULL, tobf ? b->xb : NULL, b->ldxb, host_out, j->w->rows, false, 0, 0};
    mm_multi(b, &mj, 1, n);
    if (softcap > 0)
        for (size_t i = 0; i < (size_t)n * j->w->rows; i++) host_out[i] = softcap * tanhf(host_out[i] / softcap);
}

static void cpu_gather(lms__bk *b, lms__buf id, const uint32_t *rows, uint32_t n)
{
    size_t W = b->width[id];
    for (uint32_t i = 0; i < n; i++) {
        assert(rows[i] >= i && rows[i] < b->st->nb && (i == 0 || rows[i] > rows[i - 1]));
        if (rows[i] != i)
            memcpy(b->buf[id] + i * W, b->buf[id] + rows[i] * W, W * sizeof(float));
    }
}

typedef struct bw_run {
    const uint64_t *p;
    size_t n, per;
    uint64_t *out; /* [threads] */
} bw_run;

static void bw_task(void *arg, size_t i, int worker)
{
    bw_run *r = arg;
    size_t a = i * r->per, e = LMS_MIN(a + r->per, r->n);
    uint64_t x0 = 0, x1 = 0, x2 = 0, x3 = 0;
    for (; a + 4 <= e; a += 4) x0 ^= r->p[a], x1 ^= r->p[a + 1], x2 ^= r->p[a + 2], x3 ^= r->p[a + 3];
    r->out[worker] ^= x0 ^ x1 ^ x2 ^ x3;
}

/* Read bandwidth of host memory over the pool's threads (the roofline of the
 * CPU's decode, which streams the mapped weights). */
static double cpu_membw(lms__bk *b, size_t bytes)
{
    size_t n = bytes / 8;
    uint64_t *buf = lms__aligned_alloc(64, n * 8), out[256] = {0};
    double best = 0;
    if (!buf)
        return 0;
    for (size_t i = 0; i < n; i++) buf[i] = i * 0x9e3779b97f4a7c15ull;
    bw_run r = {buf, n, (n + (size_t)b->nthreads - 1) / (size_t)b->nthreads, out};
    for (int rep = 0; rep < 6; rep++) {
        double t0 = lms__now();
        lms__pool_run(b->pool, (size_t)b->nthreads, bw_task, &r);
        double t = lms__now() - t0;
        if (rep > 0 && t > 0)
            best = LMS_MAX(best, n * 8 / t / 1e9);
    }
    lms__free(buf);
    return out[0] == 1 ? best + 1e-9 : best; /* keeps the sums alive */
}

static int cpu_read(lms__bk *b, lms__buf id, uint32_t n, float *host)
{
    memcpy(host, b->buf[id], (size_t)n * b->width[id] * 4);
    return 0;
}

static int cpu_write(lms__bk *b, lms__buf id, uint32_t n, const float *host)
{
    memcpy(b->buf[id], host, (size_t)n * b->width[id] * 4);
    return 0;
}

const lms__fwd_ops lms__fwd_cpu = {
    .name = "cpu",
    .segments = true,
    .create = cpu_create,
    .destroy = cpu_destroy,
    .describe = cpu_describe,
    .begin = cpu_begin,
    .end = cpu_end,
    .embed = cpu_embed,
    .matmul = cpu_matmul,
    .qk_rope = cpu_qk_rope,
    .attention = cpu_attention,
    .norm_add = cpu_norm_add,
    .head = cpu_head,
    .head_argmax = NULL,
    .gather = cpu_gather,
    .membw = cpu_membw,
    .read = cpu_read,
    .write = cpu_write,
};
