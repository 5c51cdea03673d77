/*
 * engine/cpu/quant_x86.h - the x86 quantized kernels, written once and
 * compiled twice: quant_avx2.c (u8 x s8 products by vpmaddubsw + vpmaddwd)
 * and quant_avx512.c (by AVX-512 VNNI's vpdpbusd). The includer defines
 *   T          the target attribute of every function here
 *   DOT(a, x)  8 int32 lanes, each the sum of 4 products of unsigned bytes
 *              of a (0..255) and signed bytes of x (int16 saturation-free
 *              for a <= 64, which is all that is passed, and for |Q8_0|)
 *   QSET       the name of the lms__qkernels table to define
 *   QSET_NAME  its "name"
 *
 * Each weight row is a run of blocks; one block's integer sums land in 8
 * int32 lanes, are converted to float and scaled by the block's factors
 * into a float accumulator (one rounding per block, as the portable set).
 * Rows are taken 2 at a time to reuse each activation load. Layouts:
 * quant/quant.h; contract: engine/cpu/quant.h.
 */
#include <immintrin.h>
#include <string.h>

#include "engine/cpu/quant.h"

static inline T float hsum_ps(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline T int hsum_epi32(__m256i v)
{
    __m128i s = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256(v, 1));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0x4e));
    s = _mm_add_epi32(s, _mm_shuffle_epi32(s, 0xb1));
    return _mm_cvtsi128_si32(s);
}

/* An f16 scale to float with F16C (every set here has it). */
static inline T float h2f(const uint8_t *p)
{
    uint16_t h;
    memcpy(&h, p, 2);
    return _cvtsh_ss(h);
}

/* 16 bytes of nibbles -> 32 codes: the low nibbles first, then the high ones. */
static inline T __m256i nibbles(const uint8_t *qs)
{
    __m128i b = _mm_loadu_si128((const __m128i *)qs), m = _mm_set1_epi8(15);
    return _mm256_set_m128i(_mm_and_si128(_mm_srli_epi16(b, 4), m), _mm_and_si128(b, m));
}

/* Bit j of qh as 0x10 in byte j (Q5_0 / Q5_1's fifth bit). */
static inline T __m256i fifth_bits(uint32_t qh)
{
    const __m256i shuf = _mm256_setr_epi8(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1, 2, 2, 2, 2, 2, 2, 2, 2, 3,
                                          3, 3, 3, 3, 3, 3, 3);
    const __m256i bit = _mm256_set1_epi64x((long long)0x8040201008040201ull);
    __m256i v = _mm256_shuffle_epi8(_mm256_set1_epi32((int)qh), shuf);
    v = _mm256_cmpeq_epi8(_mm256_and_si256(v, bit), bit);
    return _mm256_and_si256(v, _mm256_set1_epi8(0x10));
}

static inline void store_y(float *y, float v, bool acc) { *y = acc ? *y + v : v; }

/* ---- 32-element types against lms__q8a ------------------------------------------------------------ */

/* The codes of one block (unsigned; Q4_0 / Q5_0 keep their offset for the caller). */
#define INLINE inline __attribute__((always_inline))

static INLINE T __m256i codes32(lms_dtype t, const uint8_t *b)
{
    switch (t) {
    case LMS_DTYPE_Q4_0: return nibbles(b + 2);
    case LMS_DTYPE_Q4_1: return nibbles(b + 4);
    case LMS_DTYPE_Q5_0: return _mm256_or_si256(nibbles(b + 6), fifth_bits(lms__get_u32(b + 2)));
    default: return _mm256_or_si256(nibbles(b + 8), fifth_bits(lms__get_u32(b + 4))); /* Q5_1 */
    }
}

/* One block's integer dot in 8 lanes (offset codes made signed: Q4_0 q - 8, Q5_0 q - 16). */
static INLINE T __m256i block_dot(lms_dtype t, const uint8_t *p, __m256i xq)
{
    __m256i q;
    if (t == LMS_DTYPE_Q8_0)
        q = _mm256_loadu_si256((const __m256i *)(p + 2));
    else if (t == LMS_DTYPE_Q4_0)
        q = _mm256_sub_epi8(codes32(t, p), _mm256_set1_epi8(8));
    else if (t == LMS_DTYPE_Q5_0)
        q = _mm256_sub_epi8(codes32(t, p), _mm256_set1_epi8(16));
    else
        return DOT(codes32(t, p), xq); /* Q4_1, Q5_1: unsigned codes, the minimum apart */
    return DOT(_mm256_abs_epi8(q), _mm256_sign_epi8(xq, q));
}

/* One block of rows w0 (and w1 unless NULL) against x[b] into the accumulators. */
static INLINE T void block2(lms_dtype t, size_t bb, const uint8_t *w0, const uint8_t *w1, const lms__q8a *x, int b,
                            __m256 *a0, __m256 *a1, float *s0, float *s1)
{
    const bool minimum = t == LMS_DTYPE_Q4_1 || t == LMS_DTYPE_Q5_1;
    const uint8_t *p0 = w0 + (size_t)b * bb;
    __m256i xq = _mm256_loadu_si256((const __m256i *)x[b].q);
    float dx = x[b].d;
    *a0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(block_dot(t, p0, xq)), _mm256_set1_ps(h2f(p0) * dx), *a0);
    if (minimum)
        *s0 += h2f(p0 + 2) * x[b].s;
    if (w1) {
        const uint8_t *p1 = w1 + (size_t)b * bb;
        *a1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(block_dot(t, p1, xq)), _mm256_set1_ps(h2f(p1) * dx), *a1);
        if (minimum)
            *s1 += h2f(p1 + 2) * x[b].s;
    }
}

/* Rows w0 (and w1 unless NULL) against x, two blocks per step on separate
 * accumulators so the float additions do not wait on each other.
 * Always inlined: each caller passes a constant t, so the tests on it go away. */
static INLINE T void dot32_2(lms_dtype t, const uint8_t *w0, const uint8_t *w1, const lms__q8a *x, int nblk,
                             float *r0, float *r1)
{
    const size_t bb = t == LMS_DTYPE_Q4_0 ? 18 : t == LMS_DTYPE_Q4_1 ? 20 : t == LMS_DTYPE_Q5_0 ? 22
                      : t == LMS_DTYPE_Q5_1 ? 24 : 34;
    __m256 a0 = _mm256_setzero_ps(), a0b = a0, a1 = a0, a1b = a0;
    float s0 = 0, s0b = 0, s1 = 0, s1b = 0;
    int b = 0;
    for (; b + 2 <= nblk; b += 2) {
        block2(t, bb, w0, w1, x, b, &a0, &a1, &s0, &s1);
        block2(t, bb, w0, w1, x, b + 1, &a0b, &a1b, &s0b, &s1b);
    }
    if (b < nblk)
        block2(t, bb, w0, w1, x, b, &a0, &a1, &s0, &s1);
    *r0 = hsum_ps(_mm256_add_ps(a0, a0b)) + (s0 + s0b);
    if (w1)
        *r1 = hsum_ps(_mm256_add_ps(a1, a1b)) + (s1 + s1b);
}

/* ---- K types against lms__q8k ---------------------------------------------------------------------- */

/* Q4_K / Q5_K super-block against x: d*sum(sc*q.x) - dmin*sum(mn*bsums), scaled by x's d. */
static INLINE T float dot_q45k_block(const uint8_t *b, const lms__q8k *x, bool five)
{
    int sc[8], mn[8];
    for (int j = 0; j < 8; j++)
        lms__k4_scale_min(b + 4, j, &sc[j], &mn[j]);
    const uint8_t *qs = b + (five ? 48 : 16);
    __m256i acc = _mm256_setzero_si256(), m15 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    __m256i qh = five ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
    for (int j2 = 0; j2 < 4; j2++) {
        __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * j2));
        __m256i lo = _mm256_and_si256(q, m15), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m15);
        if (five) {
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j2), one), 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j2 + 1), one), 4));
        }
        __m256i xl = _mm256_loadu_si256((const __m256i *)(x->q + 64 * j2));
        __m256i xh = _mm256_loadu_si256((const __m256i *)(x->q + 64 * j2 + 32));
        acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(DOT(lo, xl), _mm256_set1_epi32(sc[2 * j2])));
        acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(DOT(hi, xh), _mm256_set1_epi32(sc[2 * j2 + 1])));
    }
    int msum = 0;
    for (int j = 0; j < 8; j++)
        msum += mn[j] * (x->bsums[2 * j] + x->bsums[2 * j + 1]);
    return x->d * (h2f(b) * (float)hsum_epi32(acc) - h2f(b + 2) * (float)msum);
}

static inline T float dot_q6k_block(const uint8_t *b, const lms__q8k *x)
{
    const int8_t *sc = (const int8_t *)(b + 192);
    __m256i acc = _mm256_setzero_si256(), m15 = _mm256_set1_epi8(15), m3 = _mm256_set1_epi8(3);
    for (int h = 0; h < 2; h++) {
        const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
        __m256i l0 = _mm256_loadu_si256((const __m256i *)ql), l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
        __m256i hb = _mm256_loadu_si256((const __m256i *)qh);
        __m256i q[4] = {
            _mm256_or_si256(_mm256_and_si256(l0, m15), _mm256_slli_epi16(_mm256_and_si256(hb, m3), 4)),
            _mm256_or_si256(_mm256_and_si256(l1, m15),
                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m3), 4)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m15),
                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m3), 4)),
            _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m15),
                            _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m3), 4)),
        };
        for (int k = 0; k < 4; k++) {
            int g = 8 * h + 2 * k;
            __m256i xv = _mm256_loadu_si256((const __m256i *)(x->q + 128 * h + 32 * k));
            /* lanes 0-3 hold the first 16 codes (group g), lanes 4-7 the next 16 */
            __m256i s = _mm256_setr_epi32(sc[g], sc[g], sc[g], sc[g], sc[g + 1], sc[g + 1], sc[g + 1], sc[g + 1]);
            acc = _mm256_add_epi32(acc, _mm256_mullo_epi32(DOT(q[k], xv), s));
        }
    }
    int off = 0;
    for (int g = 0; g < 16; g++)
        off += sc[g] * x->bsums[g];
    return x->d * h2f(b + 208) * (float)(hsum_epi32(acc) - 32 * off);
}

static INLINE T float dotk(lms_dtype t, const uint8_t *w, const lms__q8k *x, int nblk)
{
    uint32_t bb = lms_dtype_block_bytes(t, 0);
    float s = 0;
    for (int b = 0; b < nblk; b++) {
        const uint8_t *p = w + (size_t)b * bb;
        s += t == LMS_DTYPE_Q6_K ? dot_q6k_block(p, x + b) : dot_q45k_block(p, x + b, t == LMS_DTYPE_Q5_K);
    }
    return s;
}

/* ---- products ------------------------------------------------------------------------------------------ */

#define Q32(NAME, DT)                                                                                        \
    static T void NAME##_q(const void *W, size_t ldw, const void *xq, float *y, size_t ldy, int rows, int nb, \
                           int cols, bool acc)                                                               \
    {                                                                                                        \
        size_t xr = lms__qx_row_bytes(DT, cols);                                                             \
        for (int r = 0; r < rows; r += 2) {                                                                  \
            const uint8_t *w0 = (const uint8_t *)W + (size_t)r * ldw;                                        \
            const uint8_t *w1 = r + 1 < rows ? w0 + ldw : NULL;                                              \
            for (int b = 0; b < nb; b++) {                                                                   \
                float v0, v1 = 0;                                                                            \
                dot32_2(DT, w0, w1, (const lms__q8a *)((const uint8_t *)xq + (size_t)b * xr), cols / 32,     \
                        &v0, &v1);                                                                           \
                store_y(y + (size_t)b * ldy + r, v0, acc);                                                   \
                if (w1)                                                                                      \
                    store_y(y + (size_t)b * ldy + r + 1, v1, acc);                                           \
            }                                                                                                \
        }                                                                                                    \
    }

#define QK(NAME, DT)                                                                                         \
    static T void NAME##_q(const void *W, size_t ldw, const void *xq, float *y, size_t ldy, int rows, int nb, \
                           int cols, bool acc)                                                               \
    {                                                                                                        \
        size_t xr = lms__qx_row_bytes(DT, cols);                                                             \
        for (int r = 0; r < rows; r++)                                                                       \
            for (int b = 0; b < nb; b++)                                                                     \
                store_y(y + (size_t)b * ldy + r,                                                             \
                        dotk(DT, (const uint8_t *)W + (size_t)r * ldw,                                       \
                             (const lms__q8k *)((const uint8_t *)xq + (size_t)b * xr), cols / 256),          \
                        acc);                                                                                \
    }

#define WRAP(NAME, DT)                                                                                       \
    static void NAME##_f(const void *W, size_t ldw, const float *x, size_t ldx, float *y, size_t ldy, int rows, \
                         int nb, int cols, bool acc)                                                         \
    {                                                                                                        \
        size_t xr = lms__qx_row_bytes(DT, cols);                                                             \
        void *xq = lms__qscratch(xr * (size_t)nb);                                                           \
        if (!xq) { /* no memory for the activations: one vector at a time on the stack */                    \
            for (int b = 0; b < nb; b++) {                                                                   \
                uint8_t one[xr];                                                                             \
                lms__qx_quantize(DT, x + (size_t)b * ldx, ldx, 1, cols, one);                                \
                NAME##_q(W, ldw, one, y + (size_t)b * ldy, ldy, rows, 1, cols, acc);                         \
            }                                                                                                \
            return;                                                                                          \
        }                                                                                                    \
        lms__qx_quantize(DT, x, ldx, nb, cols, xq);                                                          \
        NAME##_q(W, ldw, xq, y, ldy, rows, nb, cols, acc);                                                   \
    }

Q32(k_q4_0, LMS_DTYPE_Q4_0)
Q32(k_q4_1, LMS_DTYPE_Q4_1)
Q32(k_q5_0, LMS_DTYPE_Q5_0)
Q32(k_q5_1, LMS_DTYPE_Q5_1)
Q32(k_q8_0, LMS_DTYPE_Q8_0)
QK(k_q4_k, LMS_DTYPE_Q4_K)
QK(k_q5_k, LMS_DTYPE_Q5_K)
QK(k_q6_k, LMS_DTYPE_Q6_K)
WRAP(k_q4_0, LMS_DTYPE_Q4_0)
WRAP(k_q4_1, LMS_DTYPE_Q4_1)
WRAP(k_q5_0, LMS_DTYPE_Q5_0)
WRAP(k_q5_1, LMS_DTYPE_Q5_1)
WRAP(k_q8_0, LMS_DTYPE_Q8_0)
WRAP(k_q4_k, LMS_DTYPE_Q4_K)
WRAP(k_q5_k, LMS_DTYPE_Q5_K)
WRAP(k_q6_k, LMS_DTYPE_Q6_K)

/* ---- MLX affine (bits 4 and 8; the others go to the portable kernel) --------------------------------- */

/* 8 codes starting at code i of a row, as floats. */
static inline T __m256 mlx_codes8(const uint8_t *w, size_t i, uint32_t bits)
{
    if (bits == 8)
        return _mm256_cvtepi32_ps(_mm256_cvtepu8_epi32(_mm_loadl_epi64((const __m128i *)(w + i))));
    uint32_t word;
    memcpy(&word, w + i / 2, 4);
    __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32((int)word), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
    return _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(15)));
}

static T void k_mlx(const lms__mlx_mat *W, const float *x, size_t ldx, float *y, size_t ldy, int rows, int nb,
                    int cols, bool acc)
{
    uint32_t g = W->group, bits = W->bits;
    if (bits != 4 && bits != 8) {
        lms__qkernels_by_name("generic")->mlx(W, x, ldx, y, ldy, rows, nb, cols, acc);
        return;
    }
    int ng = cols / (int)g;
    /* the sums of x over each group, once per vector */
    float *sx = lms__qscratch((size_t)nb * (size_t)ng * sizeof(float));
    if (!sx) {
        lms__qkernels_by_name("generic")->mlx(W, x, ldx, y, ldy, rows, nb, cols, acc);
        return;
    }
    for (int b = 0; b < nb; b++)
        for (int k = 0; k < ng; k++) {
            __m256 a = _mm256_setzero_ps();
            for (uint32_t i = 0; i < g; i += 8)
                a = _mm256_add_ps(a, _mm256_loadu_ps(x + (size_t)b * ldx + (size_t)k * g + i));
            sx[(size_t)b * ng + k] = hsum_ps(a);
        }
    for (int r = 0; r < rows; r++) {
        const uint8_t *w = (const uint8_t *)W->w + (size_t)r * W->ldw;
        for (int b = 0; b < nb; b++) {
            const float *xb = x + (size_t)b * ldx;
            __m256 a = _mm256_setzero_ps();
            float bias = 0;
            for (int k = 0; k < ng; k++) {
                size_t si = (size_t)r * W->lds + (size_t)k;
                __m256 s = _mm256_set1_ps(lms__mlx_scale(W->scales, si, W->sdt)), gq = _mm256_setzero_ps();
                for (uint32_t i = 0; i < g; i += 8) {
                    size_t e = (size_t)k * g + i;
                    gq = _mm256_fmadd_ps(mlx_codes8(w, e, bits), _mm256_loadu_ps(xb + e), gq);
                }
                a = _mm256_fmadd_ps(gq, s, a);
                bias += lms__mlx_scale(W->biases, si, W->sdt) * sx[(size_t)b * ng + k];
            }
            store_y(y + (size_t)b * ldy + r, hsum_ps(a) + bias, acc);
        }
    }
}

const lms__qkernels QSET = {
    .name = QSET_NAME,
    .gemm = {[LMS_DTYPE_Q4_0] = k_q4_0_f, [LMS_DTYPE_Q4_1] = k_q4_1_f, [LMS_DTYPE_Q5_0] = k_q5_0_f,
             [LMS_DTYPE_Q5_1] = k_q5_1_f, [LMS_DTYPE_Q8_0] = k_q8_0_f, [LMS_DTYPE_Q4_K] = k_q4_k_f,
             [LMS_DTYPE_Q5_K] = k_q5_k_f, [LMS_DTYPE_Q6_K] = k_q6_k_f},
    .gemm_q = {[LMS_DTYPE_Q4_0] = k_q4_0_q, [LMS_DTYPE_Q4_1] = k_q4_1_q, [LMS_DTYPE_Q5_0] = k_q5_0_q,
               [LMS_DTYPE_Q5_1] = k_q5_1_q, [LMS_DTYPE_Q8_0] = k_q8_0_q, [LMS_DTYPE_Q4_K] = k_q4_k_q,
               [LMS_DTYPE_Q5_K] = k_q5_k_q, [LMS_DTYPE_Q6_K] = k_q6_k_q},
    .mlx = k_mlx,
};
