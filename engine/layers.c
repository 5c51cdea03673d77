/*
 * engine/layers.c - the forward pass shared by every family: for a block of
 * tokens, embedding -> per layer [RMSNorm, q/k/v projections (+ biases),
 * per-head q/k RMSNorm (qwen3), RoPE, K/V written into the paged cache,
 * causal attention over the cache's pages read in place, o projection,
 * RMSNorm, SiLU-gated MLP] -> final RMSNorm -> LM head.
 *
 * Weights are read in place through the kernel table (engine/cpu/); every
 * activation and accumulation is f32. A block of up to max_block tokens
 * shares each pass over the weights (prefill); decode is a block of one.
 * Matrix products are split by rows over the thread pool; q/k/v and
 * gate/up run as one pool dispatch each. All scratch is allocated in
 * lms__fwd_create: nothing is allocated per token.
 */
#include <assert.h>
#include <math.h>
#include <string.h>

#include "engine/internal.h"

struct lms__fwd {
    const lms__hparams *hp;
    const lms__weights *w;
    const lms__kernels *k;
    lms_pool *pool;
    int nthreads;
    uint32_t B, n_ctx;
    uint32_t qd, kvd, G; /* q width, k/v width, query heads per kv head */
    float *x, *xb, *q, *kk, *vv, *att, *g, *u; /* [B][...] */
    float *inv_freq;                           /* [hd/2] */
    float *cs;                                 /* [B][hd] cos | sin per token */
    float *scores;                             /* [threads][G][n_ctx] */
};

/* ---- matrix products over the pool ------------------------------------------------------- */

typedef struct mm_job {
    const lms__wt *w;
    const float *x;
    size_t ldx;
    float *y;
    size_t ldy;
    bool acc;
    uint32_t chunk, items;
} mm_job;

typedef struct mm_run {
    const lms__kernels *k;
    mm_job *jobs;
    int n_jobs;
    uint32_t nb;
} mm_run;

static void mm_task(void *arg, size_t i, int worker)
{
    mm_run *r = arg;
    int j = 0;
    (void)worker;
    while (i >= r->jobs[j].items) i -= r->jobs[j++].items;
    mm_job *jb = &r->jobs[j];
    uint32_t r0 = (uint32_t)i * jb->chunk, r1 = LMS_MIN(r0 + jb->chunk, jb->w->rows);
    size_t esz = jb->w->dt == LMS_DTYPE_F32 ? 4 : 2;
    r->k->gemm[lms__dt_index(jb->w->dt)]((const uint8_t *)jb->w->p + (size_t)r0 * jb->w->cols * esz, jb->w->cols,
                                         jb->x, jb->ldx, jb->y + r0, jb->ldy, (int)(r1 - r0), (int)r->nb,
                                         (int)jb->w->cols, jb->acc);
}

static void mm_multi(lms__fwd *f, mm_job *jobs, int n, uint32_t nb)
{
    size_t items = 0;
    for (int j = 0; j < n; j++) {
        uint32_t rows = jobs[j].w->rows;
        uint32_t c = rows / (uint32_t)(f->nthreads * 4);
        c = (c + 15) & ~15u;
        c = LMS_MAX(c, 16u);
        c = LMS_MIN(c, 512u);
        jobs[j].chunk = c;
        jobs[j].items = (rows + c - 1) / c;
        items += jobs[j].items;
    }
    mm_run r = {f->k, jobs, n, nb};
    lms__pool_run(f->pool, items, mm_task, &r);
}

static void mm(lms__fwd *f, const lms__wt *w, const float *x, size_t ldx, float *y, size_t ldy, uint32_t nb, bool acc)
{
    mm_job j = {w, x, ldx, y, ldy, acc, 0, 0};
    mm_multi(f, &j, 1, nb);
}

/* ---- small ops --------------------------------------------------------------------------- */

static void rmsnorm(float *out, const float *x, const float *w, uint32_t n, float eps)
{
    double ss = 0;
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

static void store_kv(void *dst, const float *src, uint32_t n, lms_dtype dt)
{
    if (dt == LMS_DTYPE_F32) {
        memcpy(dst, src, n * sizeof(float));
    } else if (dt == LMS_DTYPE_F16) {
        uint16_t *d = dst;
        for (uint32_t i = 0; i < n; i++) d[i] = lms__f32_to_f16(src[i]);
    } else {
        uint16_t *d = dst;
        for (uint32_t i = 0; i < n; i++) d[i] = lms__f32_to_bf16(src[i]);
    }
}

/* ---- attention --------------------------------------------------------------------------- */

typedef struct att_run {
    lms__fwd *f;
    const lms__kvview *kv;
    uint32_t layer, pos0, nb;
} att_run;

/* One kv head h for one token b: its G query heads over positions [0, pos0+b]. */
static void att_task(void *arg, size_t item, int worker)
{
    att_run *a = arg;
    lms__fwd *f = a->f;
    const lms__hparams *hp = f->hp;
    const lms__kvview *kv = a->kv;
    uint32_t h = (uint32_t)(item % hp->n_kv_heads), b = (uint32_t)(item / hp->n_kv_heads);
    uint32_t hd = hp->head_dim, G = f->G, P = a->pos0 + b + 1, pt = kv->page_tokens;
    float *sc = f->scores + (size_t)worker * G * f->n_ctx;
    const float *q = f->q + (size_t)b * f->qd + (size_t)h * G * hd;
    float *out = f->att + (size_t)b * f->qd + (size_t)h * G * hd;
    int dti = lms__dt_index(kv->dtype);
    size_t lo = (size_t)a->layer * kv->layer_bytes + (size_t)h * kv->head_bytes;
    float scale = 1.0f / sqrtf((float)hd);

    for (uint32_t p0 = 0, i = 0; p0 < P; p0 += pt, i++) {
        const uint8_t *K = kv->base + (size_t)kv->pages[i] * kv->page_bytes + lo;
        f->k->gemm[dti](K, hd, q, hd, sc + p0, f->n_ctx, (int)LMS_MIN(pt, P - p0), (int)G, (int)hd, false);
    }
    for (uint32_t g = 0; g < G; g++) {
        float *s = sc + (size_t)g * f->n_ctx, mx = -INFINITY;
        double sum = 0;
        for (uint32_t t = 0; t < P; t++) {
            s[t] *= scale;
            mx = s[t] > mx ? s[t] : mx;
        }
        for (uint32_t t = 0; t < P; t++) {
            s[t] = expf(s[t] - mx);
            sum += s[t];
        }
        float inv = (float)(1.0 / sum);
        for (uint32_t t = 0; t < P; t++) s[t] *= inv;
        memset(out + (size_t)g * hd, 0, hd * sizeof(float));
    }
    for (uint32_t p0 = 0, i = 0; p0 < P; p0 += pt, i++) {
        const uint8_t *V = kv->base + (size_t)kv->pages[i] * kv->page_bytes + lo + kv->v_offset;
        uint32_t n = LMS_MIN(pt, P - p0);
        for (uint32_t g = 0; g < G; g++) {
            const float *s = sc + (size_t)g * f->n_ctx + p0;
            float *o = out + (size_t)g * hd;
            for (uint32_t t = 0; t < n; t++) f->k->axpy[dti](o, V + t * kv->token_bytes, s[t], (int)hd);
        }
    }
}

/* ---- creation ------------------------------------------------------------------------------ */

static void rope_freqs(const lms__hparams *hp, float *inv_freq)
{
    uint32_t hd = hp->head_dim;
    for (uint32_t i = 0; i < hd / 2; i++) {
        double f = 1.0 / pow(hp->rope_theta, (double)(2 * i) / hd);
        if (hp->rope_kind == LMS__ROPE_LINEAR) {
            f /= hp->rope_factor;
        } else if (hp->rope_kind == LMS__ROPE_LLAMA3) {
            double old = hp->rope_orig_max_pos, lf = hp->rope_low_freq, hf = hp->rope_high_freq;
            double low_wl = old / lf, high_wl = old / hf, wl = 2 * M_PI / f;
            if (wl > low_wl) {
                f = f / hp->rope_factor;
            } else if (!(wl < high_wl)) { /* medium band: interpolate */
                double smooth = (old / wl - lf) / (hf - lf);
                f = (1 - smooth) * f / hp->rope_factor + smooth * f;
            }
        }
        inv_freq[i] = (float)f;
    }
}

int lms__fwd_create(const lms__hparams *hp, const lms__weights *w, const lms__kernels *k, lms_pool *pool,
                    uint32_t max_block, uint32_t n_ctx, lms__fwd **out)
{
    lms__fwd *f = lms__calloc(1, sizeof *f);
    *out = NULL;
    if (!f)
        return LMS_ENOMEM;
    f->hp = hp;
    f->w = w;
    f->k = k;
    f->pool = pool;
    f->nthreads = lms__pool_threads(pool);
    f->B = max_block;
    f->n_ctx = n_ctx;
    f->qd = hp->n_heads * hp->head_dim;
    f->kvd = hp->n_kv_heads * hp->head_dim;
    f->G = hp->n_heads / hp->n_kv_heads;
    size_t B = max_block, E = hp->n_embd;
    if (!(f->x = lms__aligned_alloc(64, B * E * 4)) || !(f->xb = lms__aligned_alloc(64, B * E * 4)) ||
        !(f->q = lms__aligned_alloc(64, B * f->qd * 4)) || !(f->kk = lms__aligned_alloc(64, B * f->kvd * 4)) ||
        !(f->vv = lms__aligned_alloc(64, B * f->kvd * 4)) || !(f->att = lms__aligned_alloc(64, B * f->qd * 4)) ||
        !(f->g = lms__aligned_alloc(64, B * hp->n_ff * 4)) || !(f->u = lms__aligned_alloc(64, B * hp->n_ff * 4)) ||
        !(f->inv_freq = lms__malloc(hp->head_dim / 2 * 4 + 4)) ||
        !(f->cs = lms__malloc(B * hp->head_dim * 4)) ||
        !(f->scores = lms__aligned_alloc(64, (size_t)f->nthreads * f->G * n_ctx * 4))) {
        lms__fwd_free(f);
        return LMS_ENOMEM;
    }
    rope_freqs(hp, f->inv_freq);
    /* touch all scratch now: no page faults (RSS growth) on the token path */
    memset(f->x, 0, B * E * 4);
    memset(f->xb, 0, B * E * 4);
    memset(f->q, 0, B * f->qd * 4);
    memset(f->kk, 0, B * f->kvd * 4);
    memset(f->vv, 0, B * f->kvd * 4);
    memset(f->att, 0, B * f->qd * 4);
    memset(f->g, 0, B * hp->n_ff * 4);
    memset(f->u, 0, B * hp->n_ff * 4);
    memset(f->cs, 0, B * hp->head_dim * 4);
    memset(f->scores, 0, (size_t)f->nthreads * f->G * n_ctx * 4);
    *out = f;
    return 0;
}

void lms__fwd_free(lms__fwd *f)
{
    if (!f)
        return;
    lms__free(f->x);
    lms__free(f->xb);
    lms__free(f->q);
    lms__free(f->kk);
    lms__free(f->vv);
    lms__free(f->att);
    lms__free(f->g);
    lms__free(f->u);
    lms__free(f->inv_freq);
    lms__free(f->cs);
    lms__free(f->scores);
    lms__free(f);
}

/* ---- the block --------------------------------------------------------------------------- */

void lms__fwd_block(lms__fwd *f, const int32_t *tokens, uint32_t nb, uint32_t pos0, const lms__kvview *kv,
                    float *logits, bool all)
{
    const lms__hparams *hp = f->hp;
    const lms__weights *w = f->w;
    uint32_t E = hp->n_embd, hd = hp->head_dim, F = hp->n_ff, qd = f->qd, kvd = f->kvd;
    assert(nb >= 1 && nb <= f->B && pos0 + nb <= f->n_ctx);

    for (uint32_t b = 0; b < nb; b++) {
        assert(tokens[b] >= 0 && (uint32_t)tokens[b] < hp->n_vocab);
        lms__row_to_f32(&w->embed, (uint32_t)tokens[b], f->x + (size_t)b * E);
        float p = (float)(pos0 + b), *c = f->cs + (size_t)b * hd;
        for (uint32_t i = 0; i < hd / 2; i++) {
            float fr = p * f->inv_freq[i];
            c[i] = cosf(fr);
            c[hd / 2 + i] = sinf(fr);
        }
    }
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        const lms__layer_w *L = &w->layers[l];
        for (uint32_t b = 0; b < nb; b++)
            rmsnorm(f->xb + (size_t)b * E, f->x + (size_t)b * E, L->attn_norm, E, hp->eps);
        mm_job qkv[3] = {{&L->wq, f->xb, E, f->q, qd, false, 0, 0},
                         {&L->wk, f->xb, E, f->kk, kvd, false, 0, 0},
                         {&L->wv, f->xb, E, f->vv, kvd, false, 0, 0}};
        mm_multi(f, qkv, 3, nb);
        for (uint32_t b = 0; b < nb; b++) {
            float *q = f->q + (size_t)b * qd, *k = f->kk + (size_t)b * kvd, *v = f->vv + (size_t)b * kvd;
            const float *cs = f->cs + (size_t)b * hd;
            if (L->bq) {
                for (uint32_t i = 0; i < qd; i++) q[i] += L->bq[i];
                for (uint32_t i = 0; i < kvd; i++) k[i] += L->bk[i];
                for (uint32_t i = 0; i < kvd; i++) v[i] += L->bv[i];
            }
            for (uint32_t h = 0; h < hp->n_heads; h++) {
                if (L->q_norm)
                    rmsnorm(q + h * hd, q + h * hd, L->q_norm, hd, hp->eps);
                rope(q + h * hd, cs, hd);
            }
            uint32_t pos = pos0 + b, page = kv->pages[pos / kv->page_tokens], slot = pos % kv->page_tokens;
            uint8_t *dst = kv->base + (size_t)page * kv->page_bytes + (size_t)l * kv->layer_bytes +
                           (size_t)slot * kv->token_bytes;
            for (uint32_t h = 0; h < hp->n_kv_heads; h++) {
                if (L->k_norm)
                    rmsnorm(k + h * hd, k + h * hd, L->k_norm, hd, hp->eps);
                rope(k + h * hd, cs, hd);
                store_kv(dst + (size_t)h * kv->head_bytes, k + h * hd, hd, kv->dtype);
                store_kv(dst + kv->v_offset + (size_t)h * kv->head_bytes, v + h * hd, hd, kv->dtype);
            }
        }
        att_run ar = {f, kv, l, pos0, nb};
        lms__pool_run(f->pool, (size_t)hp->n_kv_heads * nb, att_task, &ar);
        mm(f, &L->wo, f->att, qd, f->x, E, nb, true);
        if (L->bo)
            for (uint32_t b = 0; b < nb; b++)
                for (uint32_t i = 0; i < E; i++) f->x[(size_t)b * E + i] += L->bo[i];
        for (uint32_t b = 0; b < nb; b++)
            rmsnorm(f->xb + (size_t)b * E, f->x + (size_t)b * E, L->ffn_norm, E, hp->eps);
        mm_job gu[2] = {{&L->w_gate, f->xb, E, f->g, F, false, 0, 0}, {&L->w_up, f->xb, E, f->u, F, false, 0, 0}};
        mm_multi(f, gu, 2, nb);
        for (size_t i = 0; i < (size_t)nb * F; i++) {
            float gv = f->g[i];
            f->g[i] = gv / (1.0f + expf(-gv)) * f->u[i];
        }
        mm(f, &L->w_down, f->g, F, f->x, E, nb, true);
    }
    if (!logits)
        return;
    uint32_t b0 = all ? 0 : nb - 1;
    for (uint32_t b = b0; b < nb; b++)
        rmsnorm(f->xb + (size_t)b * E, f->x + (size_t)b * E, w->final_norm, E, hp->eps);
    mm(f, &w->lm_head, f->xb + (size_t)b0 * E, E, logits, hp->n_vocab, nb - b0, false);
}
