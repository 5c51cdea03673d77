/*
 * engine/cpu/quant.c - the portable quantized kernels (engine/cpu/quant.h),
 * the activation quantizers every set shares, the thread-local activation
 * buffer, and the run-time choice of a kernel set.
 *
 * The portable dots unpack each weight block into integers and sum the
 * products in integers, block by block: the SIMD sets compute the same
 * integer sums, so all sets agree up to the order of the float32 additions
 * over blocks.
 */
#include <math.h>
#include <stdint.h>
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cpu/quant.h"
#include "engine/internal.h"

/* ---- activation quantization ------------------------------------------------------------------ */

static bool is_k(lms_dtype t)
{
    return t == LMS_DTYPE_Q2_K || t == LMS_DTYPE_Q3_K || t == LMS_DTYPE_Q4_K || t == LMS_DTYPE_Q5_K ||
           t == LMS_DTYPE_Q6_K;
}

bool lms__qkernel_supported(lms_dtype t)
{
    return is_k(t) || t == LMS_DTYPE_Q4_0 || t == LMS_DTYPE_Q4_1 || t == LMS_DTYPE_Q5_0 || t == LMS_DTYPE_Q5_1 ||
           t == LMS_DTYPE_Q8_0;
}

size_t lms__qx_row_bytes(lms_dtype t, int cols)
{
    return is_k(t) ? (size_t)cols / 256 * sizeof(lms__q8k) : (size_t)cols / 32 * sizeof(lms__q8a);
}

/* vcvtps2dq: round to nearest even; NaN and values out of int32's range
 * give INT32_MIN (what ggml's packing then saturates to -128: a block of
 * subnormals, whose 127 / amax is infinite). */
static inline int32_t cvt_i32(float f)
{
    float r = nearbyintf(f);
    return r == r && fabsf(r) < 2147483648.f ? (int32_t)r : INT32_MIN;
}

/* ggml's x86 quantize_row_q8_1 (also its q8_0, whose d and q are the same):
 * the scale's reciprocal as 127 / amax, rounding to nearest even, codes
 * saturated to int8, d and d * sum(q) stored as f16. */
static void q8a_row(const float *x, lms__q8a *out, int cols)
{
    for (int b = 0; b < cols / 32; b++) {
        const float *v = x + 32 * b;
        float amax = 0;
        for (int j = 0; j < 32; j++)
            amax = fmaxf(amax, fabsf(v[j]));
        float d = amax / 127.f, id = amax != 0 ? 127.f / amax : 0.f;
        uint32_t sum = 0; /* wrapping, as ggml's 32-bit lanes */
        for (int j = 0; j < 32; j++) {
            int32_t q = cvt_i32(v[j] * id);
            out[b].q[j] = (int8_t)LMS_MAX(-128, LMS_MIN(127, q));
            sum += (uint32_t)q;
        }
        int32_t isum = 0;
        for (int j = 0; j < 32; j++)
            isum += out[b].q[j];
        out[b].sum = isum;
        out[b].d = lms__f16_to_f32(lms__f32_to_f16(d));
        out[b].s = lms__f16_to_f32(lms__f32_to_f16(d * (float)(int32_t)sum));
    }
}

static void g_qx(lms_dtype form, const float *x, int cols, void *out)
{
    if (form == LMS_DTYPE_Q8_K)
        lms__quant_row(LMS_DTYPE_Q8_K, x, out, (size_t)cols);
    else
        q8a_row(x, out, cols);
}

void lms__qx_quantize_ref(lms_dtype form, const float *x, void *out)
{
    g_qx(form, x, form == LMS_DTYPE_Q8_K ? LMS__QK_K : 32, out);
}

static const lms__qkernels *qx_set;
static pthread_once_t qx_once = PTHREAD_ONCE_INIT;
static void qx_choose(void) { qx_set = lms__qkernels_best(); }

void lms__qx_quantize(lms_dtype t, const float *x, size_t ldx, int nb, int cols, void *xq)
{
    pthread_once(&qx_once, qx_choose);
    size_t rb = lms__qx_row_bytes(t, cols);
    lms_dtype form = is_k(t) ? LMS_DTYPE_Q8_K : LMS_DTYPE_Q8_0;
    for (int b = 0; b < nb; b++)
        qx_set->qx(form, x + (size_t)b * ldx, cols, (uint8_t *)xq + (size_t)b * rb);
}

/* ---- the thread-local activation buffer --------------------------------------------------------- */

typedef struct scratch {
    void *p[2];
    size_t cap[2];
} scratch;

static pthread_key_t scratch_key;
static pthread_once_t scratch_once = PTHREAD_ONCE_INIT;

static void scratch_free(void *v)
{
    scratch *s = v;
    if (s) {
        for (int i = 0; i < 2; i++)
            lms__free(s->p[i]);
        lms__free(s);
    }
}

static void scratch_init(void) { (void)pthread_key_create(&scratch_key, scratch_free); }

void *lms__qscratch(size_t n) { return lms__qscratch_slot(0, n); }

void *lms__qscratch_slot(int slot, size_t n)
{
    pthread_once(&scratch_once, scratch_init);
    scratch *s = pthread_getspecific(scratch_key);
    if (!s) {
        if (!(s = lms__calloc(1, sizeof *s)))
            return NULL;
        if (pthread_setspecific(scratch_key, s)) {
            lms__free(s);
            return NULL;
        }
    }
    if (s->cap[slot] < n) {
        void *p = lms__aligned_alloc(64, (n + 63) & ~(size_t)63);
        if (!p)
            return NULL;
        lms__free(s->p[slot]);
        s->p[slot] = p;
        s->cap[slot] = n;
    }
    return s->p[slot];
}

/* ---- unpacking blocks into integers ---------------------------------------------------------------- */

static inline float h2f(const uint8_t *p) { return lms__f16_to_f32(lms__get_u16(p)); }

/* 32 codes of a Q4_0 .. Q8_0 block as integers (Q4_0 / Q5_0 without their
 * offset *off, which the caller subtracts); *d, *m (Q4_1, Q5_1 minimum). */
static inline void unpack32(lms_dtype t, const uint8_t *b, int q[32], float *d, float *m, int *off)
{
    *m = 0;
    *off = 0;
    switch (t) {
    case LMS_DTYPE_Q8_0:
        *d = h2f(b);
        for (int j = 0; j < 32; j++) q[j] = (int8_t)b[2 + j];
        break;
    case LMS_DTYPE_Q4_0:
    case LMS_DTYPE_Q4_1: {
        const uint8_t *qs = b + (t == LMS_DTYPE_Q4_0 ? 2 : 4);
        *d = h2f(b);
        if (t == LMS_DTYPE_Q4_1)
            *m = h2f(b + 2);
        else
            *off = 8;
        for (int j = 0; j < 16; j++) {
            q[j] = qs[j] & 15;
            q[j + 16] = qs[j] >> 4;
        }
        break;
    }
    default: { /* Q5_0, Q5_1 */
        bool one = t == LMS_DTYPE_Q5_1;
        uint32_t qh = lms__get_u32(b + (one ? 4 : 2));
        const uint8_t *qs = b + (one ? 8 : 6);
        *d = h2f(b);
        if (one)
            *m = h2f(b + 2);
        else
            *off = 16;
        for (int j = 0; j < 16; j++) {
            q[j] = (qs[j] & 15) | (int)(((qh >> j) & 1) << 4);
            q[j + 16] = (qs[j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
        }
        break;
    }
    }
}

/* A K super-block: 256 codes, the integer scale and minimum of each group
 * (of g = 16 or 32 codes), and the float factors: x = d*sc*q - dmin*mn. */
static inline int unpack256(lms_dtype t, const uint8_t *b, int8_t q[256], int sc[16], int mn[16], float *d,
                            float *dmin)
{
    *dmin = 0;
    switch (t) {
    case LMS_DTYPE_Q2_K: {
        const uint8_t *s = b, *qs = b + 16;
        *d = h2f(b + 80);
        *dmin = h2f(b + 82);
        for (int g = 0; g < 16; g++) {
            sc[g] = s[g] & 15;
            mn[g] = s[g] >> 4;
        }
        for (int e = 0; e < 256; e++)
            q[e] = (int8_t)((qs[(e / 128) * 32 + e % 32] >> (2 * ((e / 32) % 4))) & 3);
        return 16;
    }
    case LMS_DTYPE_Q3_K: {
        const uint8_t *hm = b, *qs = b + 32, *s = b + 96;
        *d = h2f(b + 108);
        for (int i = 0; i < 16; i++) {
            int lo = i < 8 ? s[i] & 15 : s[i - 8] >> 4, hi = (s[8 + i % 4] >> (2 * (i / 4))) & 3;
            sc[i] = (lo | (hi << 4)) - 32;
            mn[i] = 0;
        }
        for (int e = 0; e < 256; e++) {
            int ql = (qs[(e / 128) * 32 + e % 32] >> (2 * ((e / 32) % 4))) & 3;
            int h = ((hm[e % 32] >> (e / 32)) & 1) ^ 1;
            q[e] = (int8_t)(ql - (h << 2));
        }
        return 16;
    }
    case LMS_DTYPE_Q4_K:
    case LMS_DTYPE_Q5_K: {
        const uint8_t *s = b + 4, *qh = b + 16, *qs = b + (t == LMS_DTYPE_Q5_K ? 48 : 16);
        *d = h2f(b);
        *dmin = h2f(b + 2);
        for (int j = 0; j < 8; j++) {
            lms__k4_scale_min(s, j, &sc[j], &mn[j]);
            for (int l = 0; l < 32; l++) {
                int v = (qs[32 * (j / 2) + l] >> (4 * (j % 2))) & 15;
                if (t == LMS_DTYPE_Q5_K)
                    v |= ((qh[l] >> j) & 1) << 4;
                q[32 * j + l] = (int8_t)v;
            }
        }
        return 32;
    }
    default: { /* Q6_K */
        const uint8_t *ql = b, *qh = b + 128;
        const int8_t *s = (const int8_t *)(b + 192);
        *d = h2f(b + 208);
        for (int g = 0; g < 16; g++) {
            sc[g] = s[g];
            mn[g] = 0;
        }
        for (int e = 0; e < 256; e++) {
            int lo = (ql[(e / 128) * 64 + e % 64] >> (4 * ((e / 64) % 2))) & 15;
            int hi = (qh[(e / 128) * 32 + e % 32] >> (2 * ((e / 32) % 4))) & 3;
            q[e] = (int8_t)((lo | (hi << 4)) - 32);
        }
        return 16;
    }
    }
}

/* ---- portable dots and products ---------------------------------------------------------------------- */

static float dot32(lms_dtype t, const uint8_t *w, const lms__q8a *x, int nblk)
{
    uint32_t bb = lms_dtype_block_bytes(t, 0);
    float s = 0;
    for (int b = 0; b < nblk; b++) {
        int q[32], off, isum = 0;
        float d, m;
        unpack32(t, w + (size_t)b * bb, q, &d, &m, &off);
        for (int j = 0; j < 32; j++)
            isum += (q[j] - off) * x[b].q[j];
        s += d * x[b].d * (float)isum + m * x[b].s;
    }
    return s;
}

static float dot256(lms_dtype t, const uint8_t *w, const lms__q8k *x, int nblk)
{
    uint32_t bb = lms_dtype_block_bytes(t, 0);
    float s = 0;
    for (int b = 0; b < nblk; b++) {
        int8_t q[256];
        int sc[16], mn[16];
        float d, dmin;
        int g = unpack256(t, w + (size_t)b * bb, q, sc, mn, &d, &dmin);
        int isum = 0, msum = 0;
        for (int k = 0; k < 256 / g; k++) {
            int gs = 0;
            for (int i = k * g; i < (k + 1) * g; i++)
                gs += q[i] * x[b].q[i];
            isum += sc[k] * gs;
            int xs = 0;
            for (int i = k * g / 16; i < (k + 1) * g / 16; i++)
                xs += x[b].bsums[i];
            msum += mn[k] * xs;
        }
        s += x[b].d * (d * (float)isum - dmin * (float)msum);
    }
    return s;
}

static inline void store_y(float *y, float v, bool acc) { *y = acc ? *y + v : v; }

#define GENERIC(NAME, DT)                                                                                    \
    static void NAME##_q(const void *W, size_t ldw, const void *xq, float *y, size_t ldy, int rows, int nb,  \
                         int cols, bool acc)                                                                 \
    {                                                                                                        \
        size_t xr = lms__qx_row_bytes(DT, cols);                                                             \
        for (int r = 0; r < rows; r++) {                                                                     \
            const uint8_t *w = (const uint8_t *)W + (size_t)r * ldw;                                         \
            for (int b = 0; b < nb; b++) {                                                                   \
                const void *x = (const uint8_t *)xq + (size_t)b * xr;                                        \
                float v = is_k(DT) ? dot256(DT, w, x, cols / 256) : dot32(DT, w, x, cols / 32);              \
                store_y(y + (size_t)b * ldy + r, v, acc);                                                    \
            }                                                                                                \
        }                                                                                                    \
    }

GENERIC(g_q4_0, LMS_DTYPE_Q4_0)
GENERIC(g_q4_1, LMS_DTYPE_Q4_1)
GENERIC(g_q5_0, LMS_DTYPE_Q5_0)
GENERIC(g_q5_1, LMS_DTYPE_Q5_1)
GENERIC(g_q8_0, LMS_DTYPE_Q8_0)
GENERIC(g_q2_k, LMS_DTYPE_Q2_K)
GENERIC(g_q3_k, LMS_DTYPE_Q3_K)
GENERIC(g_q4_k, LMS_DTYPE_Q4_K)
GENERIC(g_q5_k, LMS_DTYPE_Q5_K)
GENERIC(g_q6_k, LMS_DTYPE_Q6_K)

static float load_s(const void *p, size_t i, lms_dtype t)
{
    if (t == LMS_DTYPE_F32) {
        float f;
        memcpy(&f, (const uint8_t *)p + 4 * i, 4);
        return f;
    }
    uint16_t h = lms__get_u16((const uint8_t *)p + 2 * i);
    return t == LMS_DTYPE_F16 ? lms__f16_to_f32(h) : lms__bf16_to_f32(h);
}

float lms__mlx_scale(const void *p, size_t i, lms_dtype t) { return load_s(p, i, t); }

static void g_mlx(const lms__mlx_mat *W, const float *x, size_t ldx, float *y, size_t ldy, int rows, int nb, int cols,
                  bool acc)
{
    uint32_t bits = W->bits, g = W->group, mask = (1u << bits) - 1;
    for (int r = 0; r < rows; r++) {
        const uint8_t *w = (const uint8_t *)W->w + (size_t)r * W->ldw;
        const uint8_t *sp = (const uint8_t *)W->scales, *bp = (const uint8_t *)W->biases;
        for (int b = 0; b < nb; b++) {
            const float *xb = x + (size_t)b * ldx;
            float s = 0;
            for (int k = 0; k < cols / (int)g; k++) {
                float qx = 0, sx = 0;
                for (uint32_t i = k * g; i < (k + 1) * g; i++) {
                    size_t bit = (size_t)i * bits;
                    uint32_t v = w[bit / 8];
                    if (bit % 8 + bits > 8)
                        v |= (uint32_t)w[bit / 8 + 1] << 8;
                    qx += (float)((v >> (bit % 8)) & mask) * xb[i];
                    sx += xb[i];
                }
                size_t si = (size_t)r * W->lds + (size_t)k;
                s += load_s(sp, si, W->sdt) * qx + load_s(bp, si, W->sdt) * sx;
            }
            store_y(y + (size_t)b * ldy + r, s, acc);
        }
    }
}

/* The lms__gemm_fn-shaped entry over a _q kernel: quantize x into this thread's buffer. */
#define WRAP(NAME, DT, QFN)                                                                                  \
    static void NAME(const void *W, size_t ldw, const float *x, size_t ldx, float *y, size_t ldy, int rows,  \
                     int nb, int cols, bool acc)                                                             \
    {                                                                                                        \
        void *xq = lms__qscratch(lms__qx_row_bytes(DT, cols) * (size_t)nb);                                  \
        if (!xq) { /* no memory for the activations: one vector at a time on the stack */                    \
            for (int b = 0; b < nb; b++) {                                                                   \
                uint8_t one[lms__qx_row_bytes(DT, cols)];                                                    \
                lms__qx_quantize(DT, x + (size_t)b * ldx, ldx, 1, cols, one);                                \
                QFN(W, ldw, one, y + (size_t)b * ldy, ldy, rows, 1, cols, acc);                              \
            }                                                                                                \
            return;                                                                                          \
        }                                                                                                    \
        lms__qx_quantize(DT, x, ldx, nb, cols, xq);                                                          \
        QFN(W, ldw, xq, y, ldy, rows, nb, cols, acc);                                                        \
    }

WRAP(g_q4_0_f, LMS_DTYPE_Q4_0, g_q4_0_q)
WRAP(g_q4_1_f, LMS_DTYPE_Q4_1, g_q4_1_q)
WRAP(g_q5_0_f, LMS_DTYPE_Q5_0, g_q5_0_q)
WRAP(g_q5_1_f, LMS_DTYPE_Q5_1, g_q5_1_q)
WRAP(g_q8_0_f, LMS_DTYPE_Q8_0, g_q8_0_q)
WRAP(g_q2_k_f, LMS_DTYPE_Q2_K, g_q2_k_q)
WRAP(g_q3_k_f, LMS_DTYPE_Q3_K, g_q3_k_q)
WRAP(g_q4_k_f, LMS_DTYPE_Q4_K, g_q4_k_q)
WRAP(g_q5_k_f, LMS_DTYPE_Q5_K, g_q5_k_q)
WRAP(g_q6_k_f, LMS_DTYPE_Q6_K, g_q6_k_q)

static const lms__qkernels generic = {
    .name = "generic",
    .gemm = {[LMS_DTYPE_Q4_0] = g_q4_0_f, [LMS_DTYPE_Q4_1] = g_q4_1_f, [LMS_DTYPE_Q5_0] = g_q5_0_f,
             [LMS_DTYPE_Q5_1] = g_q5_1_f, [LMS_DTYPE_Q8_0] = g_q8_0_f, [LMS_DTYPE_Q2_K] = g_q2_k_f,
             [LMS_DTYPE_Q3_K] = g_q3_k_f, [LMS_DTYPE_Q4_K] = g_q4_k_f, [LMS_DTYPE_Q5_K] = g_q5_k_f,
             [LMS_DTYPE_Q6_K] = g_q6_k_f},
    .gemm_q = {[LMS_DTYPE_Q4_0] = g_q4_0_q, [LMS_DTYPE_Q4_1] = g_q4_1_q, [LMS_DTYPE_Q5_0] = g_q5_0_q,
               [LMS_DTYPE_Q5_1] = g_q5_1_q, [LMS_DTYPE_Q8_0] = g_q8_0_q, [LMS_DTYPE_Q2_K] = g_q2_k_q,
               [LMS_DTYPE_Q3_K] = g_q3_k_q, [LMS_DTYPE_Q4_K] = g_q4_k_q, [LMS_DTYPE_Q5_K] = g_q5_k_q,
               [LMS_DTYPE_Q6_K] = g_q6_k_q},
    .mlx = g_mlx,
    .qx = g_qx,
};

/* ---- dispatch ------------------------------------------------------------------------------------------ */

#if defined(__x86_64__)
extern const lms__qkernels lms__qkernels_avx2_partial;
extern const lms__qkernels lms__qkernels_avx512_partial;

/* The CPU features of the engine's float kernel sets (engine/cpu/kernels.c),
 * plus VNNI for ours. */
static bool cpu_avx2(void) { return lms__kernels_by_name("avx2") != NULL; }

static bool cpu_avx512(void)
{
    __builtin_cpu_init();
    return cpu_avx2() && lms__kernels_by_name("avx512") && __builtin_cpu_supports("avx512vnni");
}
#endif

static lms__qkernels merged_avx2, merged_avx512;
static pthread_once_t merge_once = PTHREAD_ONCE_INIT;

/* A set over `base`: its own entries where it has them, base's elsewhere. */
static void merge(lms__qkernels *out, const lms__qkernels *base, const lms__qkernels *own)
{
    *out = *base;
    out->name = own->name;
    for (int t = 0; t < LMS_DTYPE_COUNT_; t++) {
        if (own->gemm[t])
            out->gemm[t] = own->gemm[t];
        if (own->gemm_q[t])
            out->gemm_q[t] = own->gemm_q[t];
    }
    if (own->mlx)
        out->mlx = own->mlx;
    if (own->qx)
        out->qx = own->qx;
}

static void merge_all(void)
{
#if defined(__x86_64__)
    merge(&merged_avx2, &generic, &lms__qkernels_avx2_partial);
    merge(&merged_avx512, &merged_avx2, &lms__qkernels_avx512_partial);
#endif
}

const lms__qkernels *lms__qkernels_by_name(const char *name)
{
    pthread_once(&merge_once, merge_all);
    if (!strcmp(name, "generic"))
        return &generic;
#if defined(__x86_64__)
    if (!strcmp(name, "avx2") && cpu_avx2())
        return &merged_avx2;
    if (!strcmp(name, "avx512") && cpu_avx512())
        return &merged_avx512;
#endif
    return NULL;
}

const lms__qkernels *lms__qkernels_best(void)
{
    const char *force = getenv("LMSTORE_KERNELS");
    if (force && *force) {
        /* the 16-bit kernel sets' names: avx512bf16 and amxbf16 differ from avx512 only for BF16 weights */
        const bool bf = !strcmp(force, "avx512bf16") || !strcmp(force, "amxbf16");
        const lms__qkernels *k = lms__qkernels_by_name(bf ? "avx512" : force);
        if (k)
            return k;
        lms__warn("LMSTORE_KERNELS=%s is not available on this CPU; choosing automatically", force);
    }
    const char *order[] = {"avx512", "avx2"};
    for (size_t i = 0; i < LMS_ARRAY_LEN(order); i++) {
        const lms__qkernels *k = lms__qkernels_by_name(order[i]);
        if (k)
            return k;
    }
    return &generic;
}
