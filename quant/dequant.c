/*
 * quant/dequant.c - reference dequantization of every stored encoding.
 *
 * Each function computes, operation for operation, what gguf-py's numpy
 * dequantizers compute (float32 products and sums, each rounded once; this
 * file is built with -ffp-contract=off), so the results are equal bit for
 * bit (tests/quant/test_dequant_gguf.py). Speed is not the point: the
 * engine's kernels (engine/cpu/quant*.c) dequantize in registers and are
 * tested against these.
 */
#include <string.h>

#include "quant/quant.h"

static inline float h2f(const uint8_t *p) { return lms__f16_to_f32(lms__get_u16(p)); }

static void deq_q4_0(const uint8_t *b, float *y)
{
    float d = h2f(b);
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)((b[2 + j] & 0x0f) - 8);
        y[j + 16] = d * (float)((b[2 + j] >> 4) - 8);
    }
}

static void deq_q4_1(const uint8_t *b, float *y)
{
    float d = h2f(b), m = h2f(b + 2);
    for (int j = 0; j < 16; j++) {
        y[j] = d * (float)(b[4 + j] & 0x0f) + m;
        y[j + 16] = d * (float)(b[4 + j] >> 4) + m;
    }
}

static void deq_q5_0(const uint8_t *b, float *y)
{
    float d = h2f(b);
    uint32_t qh = lms__get_u32(b + 2);
    for (int j = 0; j < 16; j++) {
        int q0 = (b[6 + j] & 0x0f) | (int)(((qh >> j) & 1) << 4);
        int q1 = (b[6 + j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
        y[j] = d * (float)(q0 - 16);
        y[j + 16] = d * (float)(q1 - 16);
    }
}

static void deq_q5_1(const uint8_t *b, float *y)
{
    float d = h2f(b), m = h2f(b + 2);
    uint32_t qh = lms__get_u32(b + 4);
    for (int j = 0; j < 16; j++) {
        int q0 = (b[8 + j] & 0x0f) | (int)(((qh >> j) & 1) << 4);
        int q1 = (b[8 + j] >> 4) | (int)(((qh >> (j + 16)) & 1) << 4);
        y[j] = d * (float)q0 + m;
        y[j + 16] = d * (float)q1 + m;
    }
}

static void deq_q8_0(const uint8_t *b, float *y)
{
    float d = h2f(b);
    for (int j = 0; j < 32; j++)
        y[j] = (float)(int8_t)b[2 + j] * d;
}

static void deq_q2_k(const uint8_t *b, float *y)
{
    const uint8_t *sc = b, *qs = b + 16;
    float d = h2f(b + 80), dmin = h2f(b + 82);
    for (int e = 0; e < 256; e++) {
        int half = e / 128, shift = (e / 32) % 4, l = e % 32, g = e / 16;
        float dl = d * (float)(sc[g] & 0x0f), ml = dmin * (float)(sc[g] >> 4);
        int q = (qs[half * 32 + l] >> (2 * shift)) & 3;
        y[e] = dl * (float)q - ml;
    }
}

static void deq_q3_k(const uint8_t *b, float *y)
{
    const uint8_t *hmask = b, *qs = b + 32, *sc = b + 96;
    float d = h2f(b + 108);
    float dl[16];
    for (int i = 0; i < 16; i++) {
        int lo = i < 8 ? sc[i] & 0x0f : sc[i - 8] >> 4;
        int hi = (sc[8 + i % 4] >> (2 * (i / 4))) & 3;
        dl[i] = d * (float)((int8_t)(uint8_t)(lo | (hi << 4)) - 32);
    }
    for (int e = 0; e < 256; e++) {
        int half = e / 128, shift = (e / 32) % 4, l = e % 32;
        int ql = (qs[half * 32 + l] >> (2 * shift)) & 3;
        int h = ((hmask[l] >> (e / 32)) & 1) ^ 1;
        y[e] = dl[e / 16] * (float)(ql - (h << 2));
    }
}

/* Q4_K, and Q5_K (five: a fifth bit per code in qh) */
static void deq_q45_k(const uint8_t *b, float *y, bool five)
{
    float d = h2f(b), dmin = h2f(b + 2);
    const uint8_t *scales = b + 4, *qh = b + 16, *qs = b + (five ? 48 : 16);
    for (int j = 0; j < 8; j++) {
        int sc, m;
        lms__k4_scale_min(scales, j, &sc, &m);
        float dd = d * (float)sc, mm = dmin * (float)m;
        const uint8_t *q = qs + 32 * (j / 2);
        int shift = 4 * (j % 2);
        for (int l = 0; l < 32; l++) {
            int v = (q[l] >> shift) & 0x0f;
            if (five)
                v |= ((qh[l] >> j) & 1) << 4;
            y[32 * j + l] = dd * (float)v - mm;
        }
    }
}

static void deq_q4_k(const uint8_t *b, float *y) { deq_q45_k(b, y, false); }
static void deq_q5_k(const uint8_t *b, float *y) { deq_q45_k(b, y, true); }

static void deq_q6_k(const uint8_t *b, float *y)
{
    const uint8_t *ql = b, *qh = b + 128;
    const int8_t *sc = (const int8_t *)(b + 192);
    float d = h2f(b + 208);
    for (int e = 0; e < 256; e++) {
        int half = e / 128, k = e % 64, lshift = 4 * ((e / 64) % 2);
        int hshift = 2 * ((e / 32) % 4), l = e % 32;
        int lo = (ql[half * 64 + k] >> lshift) & 0x0f;
        int hi = (qh[half * 32 + l] >> hshift) & 3;
        float dd = d * (float)sc[e / 16];
        y[e] = dd * (float)((lo | (hi << 4)) - 32);
    }
}

static void deq_q8_k(const uint8_t *b, float *y)
{
    float d;
    memcpy(&d, b, 4);
    for (int j = 0; j < 256; j++)
        y[j] = d * (float)(int8_t)b[4 + j];
}

int lms__dequant_row(lms_dtype t, const void *src, float *dst, size_t n)
{
    const uint8_t *p = src;
    void (*fn)(const uint8_t *, float *) = NULL;
    switch (t) {
    case LMS_DTYPE_F32: memcpy(dst, src, n * 4); return 0;
    case LMS_DTYPE_F16:
        for (size_t i = 0; i < n; i++) dst[i] = h2f(p + 2 * i);
        return 0;
    case LMS_DTYPE_BF16:
        for (size_t i = 0; i < n; i++) dst[i] = lms__bf16_to_f32(lms__get_u16(p + 2 * i));
        return 0;
    case LMS_DTYPE_Q4_0: fn = deq_q4_0; break;
    case LMS_DTYPE_Q4_1: fn = deq_q4_1; break;
    case LMS_DTYPE_Q5_0: fn = deq_q5_0; break;
    case LMS_DTYPE_Q5_1: fn = deq_q5_1; break;
    case LMS_DTYPE_Q8_0: fn = deq_q8_0; break;
    case LMS_DTYPE_Q2_K: fn = deq_q2_k; break;
    case LMS_DTYPE_Q3_K: fn = deq_q3_k; break;
    case LMS_DTYPE_Q4_K: fn = deq_q4_k; break;
    case LMS_DTYPE_Q5_K: fn = deq_q5_k; break;
    case LMS_DTYPE_Q6_K: fn = deq_q6_k; break;
    case LMS_DTYPE_Q8_K: fn = deq_q8_k; break;
    default:
        return lms__err(LMS_EINVAL, "no dequantizer for dtype %s", lms_dtype_name(t) ? lms_dtype_name(t) : "?");
    }
    uint32_t be = lms_dtype_block_elems(t, 0), bb = lms_dtype_block_bytes(t, 0);
    if (n % be)
        return lms__err(LMS_EINVAL, "%zu elements are not a whole number of %s blocks", n, lms_dtype_name(t));
    for (size_t i = 0; i < n / be; i++)
        fn(p + i * bb, dst + i * be);
    return 0;
}

static inline float load_scalar(const void *p, size_t i, lms_dtype dt)
{
    const uint8_t *b = p;
    if (dt == LMS_DTYPE_F32) {
        float f;
        memcpy(&f, b + 4 * i, 4);
        return f;
    }
    uint16_t h = lms__get_u16(b + 2 * i);
    return dt == LMS_DTYPE_F16 ? lms__f16_to_f32(h) : lms__bf16_to_f32(h);
}

void lms__mlx_dequant_row(const void *w, uint32_t bits, uint32_t group, const void *scales, const void *biases,
                          lms_dtype sdt, float *dst, size_t n)
{
    const uint8_t *p = w;
    uint32_t mask = (1u << bits) - 1;
    for (size_t i = 0; i < n; i++) {
        size_t bit = i * bits;
        /* a code spans at most two bytes (bits <= 8) */
        uint32_t v = p[bit / 8];
        if (bit % 8 + bits > 8)
            v |= (uint32_t)p[bit / 8 + 1] << 8;
        uint32_t q = (v >> (bit % 8)) & mask;
        float s = load_scalar(scales, i / group, sdt), b = load_scalar(biases, i / group, sdt);
        dst[i] = lms__round_to(lms__round_to(s * (float)q, sdt) + b, sdt);
    }
}
