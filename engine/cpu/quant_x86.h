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
 *   QX_ZMM     (quant_avx512.c) also compile the 512-bit section below
 *
 * Each weight row is a run of blocks; one block's integer sums land in
 * int32 lanes, are converted to float and scaled by the block's factors
 * into a float accumulator (one rounding per block, as the portable set).
 * For one activation vector (decode) rows are taken one at a time, so that
 * each thread reads its weights as one sequential stream (the hardware
 * prefetchers' best case: two rows in step, or a per-row activation record
 * larger than the weights, measured half the bandwidth on the 2-core
 * Zen 4 VM); with several (prefill) each weight block is unpacked once for
 * four of them, or, in the 512-bit section (quant_zmm.h), weights are
 * repacked 16 rows at a time into panels that one vpdpbusd multiplies with
 * 4 codes of one vector for all 16 rows, in tiles of 16 rows x 8 vectors.
 * The 512-bit section also holds the decode kernels of Q8_0 / Q4_0 / Q5_0
 * and the MLX affine 4- and 8-bit kernel (below). Decode loops prefetch
 * their row stream (qprefetch). The activations of every set are
 * quantized here too (->qx), to the
 * portable quantizer's bytes. Layouts: quant/quant.h; contract:
 * engine/cpu/quant.h.
 *
 * Invariants:
 *   1. every block's integer sum is exact (no saturation: unsigned codes
 *      <= 64 against vpmaddubsw, any byte against vpdpbusd), so all sets
 *      differ only in the order of float additions;
 *   2. a kernel's own memory (activation panels) comes from
 *      lms__qscratch_slot(1, ...) and, when that fails, the kernel falls
 *      back to a path that needs none: no product fails for memory.
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

/* Decode reads each thread's rows as one stream; one core's loads alone keep
 * too few lines in flight to reach the memory's rate, so the decode loops ask
 * for the lines QPF bytes ahead of the block they compute (the next row's
 * start, at a row's end). n bytes from p + QPF, a line at a time.
 * __builtin_prefetch, not _mm_prefetch: GCC 12 emits no instruction for
 * _mm_prefetch inlined through this file's target-attributed functions. */
#define QPF 4096
static inline void qprefetch(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i += 64)
        __builtin_prefetch(p + QPF + i, 0, 3);
}

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

/* A block's codes as DOT takes them: u unsigned (|q| for the signed types,
 * whose sign q then moves onto x; the offset types made signed first:
 * Q4_0 q - 8, Q5_0 q - 16), or the plain codes of Q4_1 / Q5_1. */
static INLINE T void wcodes(lms_dtype t, const uint8_t *p, __m256i *u, __m256i *q)
{
    if (t == LMS_DTYPE_Q8_0)
        *q = _mm256_loadu_si256((const __m256i *)(p + 2));
    else if (t == LMS_DTYPE_Q4_0)
        *q = _mm256_sub_epi8(codes32(t, p), _mm256_set1_epi8(8));
    else if (t == LMS_DTYPE_Q5_0)
        *q = _mm256_sub_epi8(codes32(t, p), _mm256_set1_epi8(16));
    else { /* Q4_1, Q5_1: unsigned codes, the minimum apart */
        *u = codes32(t, p);
        return;
    }
    *u = _mm256_abs_epi8(*q);
}

static INLINE T bool minimum_type(lms_dtype t) { return t == LMS_DTYPE_Q4_1 || t == LMS_DTYPE_Q5_1; }

/* One weight block (codes u, q from wcodes, at p) against activation block xb. */
static INLINE T void acc32(lms_dtype t, const uint8_t *p, __m256i u, __m256i q, const lms__q8a *xb, __m256 *a,
                           float *s)
{
    __m256i xq = _mm256_loadu_si256((const __m256i *)xb->q);
    __m256i d = minimum_type(t) ? DOT(u, xq) : DOT(u, _mm256_sign_epi8(xq, q));
    *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(d), _mm256_set1_ps(h2f(p) * xb->d), *a);
    if (minimum_type(t))
        *s += h2f(p + 2) * xb->s;
}

static INLINE T size_t block_bytes32(lms_dtype t)
{
    return t == LMS_DTYPE_Q4_0 ? 18 : t == LMS_DTYPE_Q4_1 ? 20 : t == LMS_DTYPE_Q5_0 ? 22 : t == LMS_DTYPE_Q5_1 ? 24 : 34;
}

/* Row w against x: four blocks per step on four accumulators, so the float
 * additions do not wait on each other. One row at a time: the weights are
 * one sequential stream (two rows read in step stream at half the rate).
 * Always inlined: each caller passes a constant t, so the tests on it go away. */
static INLINE T float dot32_1(lms_dtype t, const uint8_t *w, const lms__q8a *x, int nblk)
{
    const size_t bb = block_bytes32(t);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    __m256i u, q = _mm256_setzero_si256();
    int b = 0;
    for (; b + 4 <= nblk; b += 4) {
        const uint8_t *p = w + (size_t)b * bb;
        qprefetch(p, 4 * bb);
        wcodes(t, p, &u, &q);
        acc32(t, p, u, q, x + b, &a0, &s0);
        wcodes(t, p + bb, &u, &q);
        acc32(t, p + bb, u, q, x + b + 1, &a1, &s1);
        wcodes(t, p + 2 * bb, &u, &q);
        acc32(t, p + 2 * bb, u, q, x + b + 2, &a2, &s2);
        wcodes(t, p + 3 * bb, &u, &q);
        acc32(t, p + 3 * bb, u, q, x + b + 3, &a3, &s3);
    }
    for (; b < nblk; b++) {
        const uint8_t *p = w + (size_t)b * bb;
        wcodes(t, p, &u, &q);
        acc32(t, p, u, q, x + b, &a0, &s0);
    }
    return hsum_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3))) + ((s0 + s1) + (s2 + s3));
}

/* Row w against four activation vectors (prefill): each weight block is
 * unpacked once for the four. */
static INLINE T void dot32_4(lms_dtype t, const uint8_t *w, const lms__q8a *x0, const lms__q8a *x1,
                             const lms__q8a *x2, const lms__q8a *x3, int nblk, float out[4])
{
    const size_t bb = block_bytes32(t);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    float s0 = 0, s1 = 0, s2 = 0, s3 = 0;
    __m256i u, q = _mm256_setzero_si256();
    for (int b = 0; b < nblk; b++) {
        const uint8_t *p = w + (size_t)b * bb;
        wcodes(t, p, &u, &q);
        acc32(t, p, u, q, x0 + b, &a0, &s0);
        acc32(t, p, u, q, x1 + b, &a1, &s1);
        acc32(t, p, u, q, x2 + b, &a2, &s2);
        acc32(t, p, u, q, x3 + b, &a3, &s3);
    }
    out[0] = hsum_ps(a0) + s0;
    out[1] = hsum_ps(a1) + s1;
    out[2] = hsum_ps(a2) + s2;
    out[3] = hsum_ps(a3) + s3;
}

/* ---- K types against lms__q8k ---------------------------------------------------------------------- */

/*
 * A K super-block's codes, unpacked once for every activation vector it
 * meets: 8 registers of 32 unsigned codes (Q4_K / Q5_K: sub-block j; Q6_K:
 * codes + 32 in element order), the integer scales (broadcast per 32-code
 * register; Q6_K: two 16-groups a register), and the 16-bit factors that
 * turn the activation's 16-sums (bsums) into the offset term
 * (Q4_K / Q5_K: the minimums, each twice; Q6_K: 32 x the scales).
 */
typedef struct kblock {
    __m256i q[8], sc[8], off16;
    float d, dmin; /* Q6_K: dmin = d (the offset term is subtracted) */
} kblock;

static INLINE T void kunpack(lms_dtype t, const uint8_t *b, kblock *k)
{
    if (t == LMS_DTYPE_Q6_K) {
        const int8_t *sc = (const int8_t *)(b + 192);
        const __m256i m15 = _mm256_set1_epi8(15), m3 = _mm256_set1_epi8(3);
        for (int h = 0; h < 2; h++) {
            const uint8_t *ql = b + 64 * h, *qh = b + 128 + 32 * h;
            __m256i l0 = _mm256_loadu_si256((const __m256i *)ql), l1 = _mm256_loadu_si256((const __m256i *)(ql + 32));
            __m256i hb = _mm256_loadu_si256((const __m256i *)qh);
            k->q[4 * h] = _mm256_or_si256(_mm256_and_si256(l0, m15), _mm256_slli_epi16(_mm256_and_si256(hb, m3), 4));
            k->q[4 * h + 1] = _mm256_or_si256(_mm256_and_si256(l1, m15),
                                              _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 2), m3), 4));
            k->q[4 * h + 2] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), m15),
                                              _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 4), m3), 4));
            k->q[4 * h + 3] = _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), m15),
                                              _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(hb, 6), m3), 4));
        }
        /* register r holds 16-groups 2r (lanes 0-3) and 2r+1 (lanes 4-7) */
        for (int r = 0; r < 8; r++)
            k->sc[r] = _mm256_setr_epi32(sc[2 * r], sc[2 * r], sc[2 * r], sc[2 * r], sc[2 * r + 1], sc[2 * r + 1],
                                         sc[2 * r + 1], sc[2 * r + 1]);
        k->off16 = _mm256_slli_epi16(_mm256_cvtepi8_epi16(_mm_loadu_si128((const __m128i *)sc)), 5);
        k->d = k->dmin = h2f(b + 208);
        return;
    }
    const bool five = t == LMS_DTYPE_Q5_K;
    /* the 12 scale bytes -> 8 six-bit scales (bytes 0-7 of u) and 8 minimums
     * (bytes 8-15): sub-blocks 0-3 in the low 6 bits of bytes 0-3 / 4-7,
     * sub-blocks 4-7 in the nibbles of bytes 8-11 with their top 2 bits in
     * the top bits of bytes 0-3 / 4-7 (lms__k4_scale_min, four at a time) */
    uint32_t u[4], a0, a1, a2;
    memcpy(u, b + 4, 12);
    a0 = u[0], a1 = u[1], a2 = u[2];
    u[0] = a0 & 0x3f3f3f3f;
    u[1] = (a2 & 0x0f0f0f0f) | ((a0 >> 6) & 0x03030303) << 4;
    u[2] = a1 & 0x3f3f3f3f;
    u[3] = ((a2 >> 4) & 0x0f0f0f0f) | ((a1 >> 6) & 0x03030303) << 4;
    __m128i sm = _mm_loadu_si128((const __m128i *)u);
    __m256i scv = _mm256_cvtepu8_epi32(sm);
    const uint8_t *qs = b + (five ? 48 : 16);
    const __m256i m15 = _mm256_set1_epi8(15), one = _mm256_set1_epi8(1);
    __m256i qh = five ? _mm256_loadu_si256((const __m256i *)(b + 16)) : _mm256_setzero_si256();
    for (int j2 = 0; j2 < 4; j2++) {
        __m256i q = _mm256_loadu_si256((const __m256i *)(qs + 32 * j2));
        __m256i lo = _mm256_and_si256(q, m15), hi = _mm256_and_si256(_mm256_srli_epi16(q, 4), m15);
        if (five) {
            lo = _mm256_or_si256(lo, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j2), one), 4));
            hi = _mm256_or_si256(hi, _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(qh, 2 * j2 + 1), one), 4));
        }
        k->q[2 * j2] = lo;
        k->q[2 * j2 + 1] = hi;
    }
    for (int j = 0; j < 8; j++)
        k->sc[j] = _mm256_permutevar8x32_epi32(scv, _mm256_set1_epi32(j));
    __m128i mins = _mm_unpackhi_epi64(sm, sm);
    k->off16 = _mm256_cvtepu8_epi16(_mm_unpacklo_epi8(mins, mins)); /* each minimum twice: for its two 16-sums */
    k->d = h2f(b);
    k->dmin = h2f(b + 2);
}

/* One unpacked super-block against activation super-block x: the scaled
 * code products into *a, the offset term (minimums x bsums; Q6_K: 32 x
 * scales x bsums) into *m, both in float lanes summed at the row's end. */
static INLINE T void kacc(const kblock *k, const lms__q8k *x, __m256 *a, __m256 *m)
{
    __m256i ai = _mm256_setzero_si256();
    for (int r = 0; r < 8; r++)
        ai = _mm256_add_epi32(ai, _mm256_mullo_epi32(DOT(k->q[r], _mm256_loadu_si256((const __m256i *)(x->q + 32 * r))),
                                                     k->sc[r]));
    __m256i mi = _mm256_madd_epi16(_mm256_loadu_si256((const __m256i *)x->bsums), k->off16);
    *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(ai), _mm256_set1_ps(k->d * x->d), *a);
    *m = _mm256_fmadd_ps(_mm256_cvtepi32_ps(mi), _mm256_set1_ps(k->dmin * x->d), *m);
}

/* Row w against NX (1 or 4) activation vectors: each super-block unpacked once. */
static INLINE T void dotk_n(lms_dtype t, const uint8_t *w, const lms__q8k *const *xs, int nx, int nblk, float *out)
{
    const uint32_t bb = lms_dtype_block_bytes(t, 0);
    __m256 a[4], m[4];
    for (int i = 0; i < nx; i++)
        a[i] = m[i] = _mm256_setzero_ps();
    for (int b = 0; b < nblk; b++) {
        kblock k;
        if (nx == 1)
            qprefetch(w + (size_t)b * bb, bb);
        kunpack(t, w + (size_t)b * bb, &k);
        for (int i = 0; i < nx; i++)
            kacc(&k, xs[i] + b, &a[i], &m[i]);
    }
    for (int i = 0; i < nx; i++)
        out[i] = hsum_ps(a[i]) - hsum_ps(m[i]);
}


#ifdef QX_ZMM
/* One vector (decode) on 256-bit registers, the codes made unsigned for
 * vpdpbusd (Q8_0: q + 128; Q4_0 / Q5_0: the stored codes, offset 8 / 16;
 * no sign juggling), each block's correction -off * sum(x) from a
 * small panel of int32 (the accumulation's start, in lane 0); one row at
 * a time, four blocks in flight, as dot32_1. */
static T void zpanel1(lms_dtype t, const lms__q8a *x, int nblk, int32_t *corr)
{
    const int off = t == LMS_DTYPE_Q8_0 ? 128 : t == LMS_DTYPE_Q4_0 ? 8 : 16;
    for (int b = 0; b < nblk; b++)
        corr[b] = -off * x[b].sum;
}

static INLINE T __m256i ucodes(lms_dtype t, const uint8_t *p)
{
    if (t == LMS_DTYPE_Q8_0)
        return _mm256_xor_si256(_mm256_loadu_si256((const __m256i *)(p + 2)), _mm256_set1_epi8((char)0x80));
    return codes32(t, p);
}

static INLINE T void uacc(lms_dtype t, const uint8_t *p, const lms__q8a *xb, const int32_t *corr, __m256 *a)
{
    __m256i i = _mm256_dpbusd_epi32(_mm256_castsi128_si256(_mm_cvtsi32_si128(*corr)), ucodes(t, p),
                                    _mm256_loadu_si256((const __m256i *)xb->q));
    *a = _mm256_fmadd_ps(_mm256_cvtepi32_ps(i), _mm256_set1_ps(h2f(p) * xb->d), *a);
}

static INLINE T float udot_1(lms_dtype t, const uint8_t *w, const lms__q8a *x, const int32_t *z, int nblk)
{
    const size_t bb = block_bytes32(t);
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    int b = 0;
    for (; b + 4 <= nblk; b += 4) {
        const uint8_t *p = w + (size_t)b * bb;
        qprefetch(p, 4 * bb);
        uacc(t, p, x + b, z + b, &a0);
        uacc(t, p + bb, x + b + 1, z + b + 1, &a1);
        uacc(t, p + 2 * bb, x + b + 2, z + b + 2, &a2);
        uacc(t, p + 3 * bb, x + b + 3, z + b + 3, &a3);
    }
    for (; b < nblk; b++)
        uacc(t, w + (size_t)b * bb, x + b, z + b, &a0);
    return hsum_ps(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3)));
}


/*
 * Q4_0 against one vector, two blocks a 512-bit register from one row (one
 * sequential stream): the 16 nibble bytes of blocks b0 and b1 side by side,
 * their low nibbles then their high ones, so that the 128-bit lanes hold
 * b0's codes 0-15, b1's 0-15, b0's 16-31, b1's 16-31. The activation panel
 * has each pair's codes in that order, the corrections -8 * sum(x) of b0
 * and b1 in int32 lanes 0 and 4 (a 32-byte record, zero-extended), and
 * d_x of both. An odd last block goes through uacc.
 */
typedef struct zq4rec {
    int8_t q[64];
    int32_t corr[8];
    float dx[2], pad[6];
} zq4rec;

static T void zq4panel(const lms__q8a *x, int nblk, zq4rec *P)
{
    const __m256i ones = _mm256_set1_epi8(1);
    for (int p = 0; p < nblk / 2; p++) {
        const lms__q8a *x0 = x + 2 * p, *x1 = x0 + 1;
        zq4rec *z = P + p;
        memcpy(z->q, x0->q, 16);
        memcpy(z->q + 16, x1->q, 16);
        memcpy(z->q + 32, x0->q + 16, 16);
        memcpy(z->q + 48, x1->q + 16, 16);
        memset(z->corr, 0, sizeof z->corr);
        z->corr[0] = -8 * hsum_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ones,
                                                         _mm256_loadu_si256((const __m256i *)x0->q)));
        z->corr[4] = -8 * hsum_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), ones,
                                                         _mm256_loadu_si256((const __m256i *)x1->q)));
        z->dx[0] = x0->d;
        z->dx[1] = x1->d;
    }
}

static INLINE T void zq4acc(const uint8_t *p0, const zq4rec *z, __m512 *a)
{
    const uint8_t *p1 = p0 + 18;
    __m256i n = _mm256_inserti128_si256(_mm256_castsi128_si256(_mm_loadu_si128((const __m128i *)(p0 + 2))),
                                        _mm_loadu_si128((const __m128i *)(p1 + 2)), 1);
    __m512i u = _mm512_and_si512(_mm512_inserti64x4(_mm512_castsi256_si512(n), _mm256_srli_epi16(n, 4), 1),
                                 _mm512_set1_epi8(15));
    __m512i i = _mm512_dpbusd_epi32(_mm512_zextsi256_si512(_mm256_load_si256((const __m256i *)z->corr)), u,
                                    _mm512_load_si512(z->q));
    uint16_t h0, h1;
    memcpy(&h0, p0, 2);
    memcpy(&h1, p1, 2);
    __m128 f = _mm_mul_ps(_mm_cvtph_ps(_mm_cvtsi32_si128((int)(h0 | (uint32_t)h1 << 16))),
                          _mm_castpd_ps(_mm_load_sd((const double *)z->dx)));
    __m512 sc = _mm512_permutexvar_ps(_mm512_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1, 0, 0, 0, 0, 1, 1, 1, 1),
                                      _mm512_castps128_ps512(f));
    *a = _mm512_fmadd_ps(_mm512_cvtepi32_ps(i), sc, *a);
}

static INLINE T float zq4dot_1(const uint8_t *w, const lms__q8a *x, const zq4rec *z, int nblk)
{
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    const int np = nblk / 2;
    int p = 0;
    for (; p + 4 <= np; p += 4) {
        const uint8_t *q = w + (size_t)p * 36;
        qprefetch(q, 4 * 36);
        zq4acc(q, z + p, &a0);
        zq4acc(q + 36, z + p + 1, &a1);
        zq4acc(q + 72, z + p + 2, &a2);
        zq4acc(q + 108, z + p + 3, &a3);
    }
    for (; p < np; p++)
        zq4acc(w + (size_t)p * 36, z + p, &a0);
    float r = _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)));
    if (nblk % 2) { /* the odd last block */
        const lms__q8a *xb = x + nblk - 1;
        int32_t corr = -8 * hsum_epi32(_mm256_dpbusd_epi32(_mm256_setzero_si256(), _mm256_set1_epi8(1),
                                                           _mm256_loadu_si256((const __m256i *)xb->q)));
        __m256 a = _mm256_setzero_ps();
        uacc(LMS_DTYPE_Q4_0, w + (size_t)(nblk - 1) * 18, xb, &corr, &a);
        r += hsum_ps(a);
    }
    return r;
}

static INLINE T bool zq4_1(const void *W, size_t ldw, const uint8_t *X, float *y, int rows, int cols, bool acc)
{
    const int nblk = cols / 32;
    zq4rec *P = lms__qscratch_slot(1, (size_t)(nblk / 2 + 1) * sizeof(zq4rec));
    if (!P)
        return false;
    zq4panel((const lms__q8a *)X, nblk, P);
    for (int r = 0; r < rows; r++)
        store_y(y + r, zq4dot_1((const uint8_t *)W + (size_t)r * ldw, (const lms__q8a *)X, P, nblk), acc);
    return true;
}

/* Q8_0 / Q4_0 / Q5_0 against one vector; false when the panel's memory is not to be had. */
static INLINE T bool zmm32_1(lms_dtype t, const void *W, size_t ldw, const uint8_t *X, float *y, int rows, int cols,
                             bool acc)
{
    if (t == LMS_DTYPE_Q4_0)
        return zq4_1(W, ldw, X, y, rows, cols, acc);
    const int nblk = cols / 32;
    int32_t *P = lms__qscratch_slot(1, (size_t)nblk * sizeof(int32_t));
    if (!P)
        return false;
    zpanel1(t, (const lms__q8a *)X, nblk, P);
    for (int r = 0; r < rows; r++)
        store_y(y + r, udot_1(t, (const uint8_t *)W + (size_t)r * ldw, (const lms__q8a *)X, P, nblk), acc);
    return true;
}
#include "engine/cpu/quant_zmm.h"
#endif


/* ---- activation quantization (quant.c's, bit for bit: ggml's q8_1 and q8_K) -------------------------- */

/* 32 int32 lanes (four registers) to 32 int8 in element order. */
static INLINE T __m256i pack32(__m256i a, __m256i b, __m256i c, __m256i d)
{
    __m256i p = _mm256_packs_epi16(_mm256_packs_epi32(a, b), _mm256_packs_epi32(c, d));
    return _mm256_permutevar8x32_epi32(p, _mm256_setr_epi32(0, 4, 1, 5, 2, 6, 3, 7));
}

/* The sum of 32 signed bytes: byte sums of q + 128 by vpsadbw, less 32 x 128. */
static INLINE T int32_t sum_i8(__m256i q)
{
    __m256i s = _mm256_sad_epu8(_mm256_xor_si256(q, _mm256_set1_epi8((char)0x80)), _mm256_setzero_si256());
    __m128i h = _mm_add_epi64(_mm256_castsi256_si128(s), _mm256_extracti128_si256(s, 1));
    return (int32_t)(_mm_cvtsi128_si64(h) + _mm_extract_epi64(h, 1)) - 32 * 128;
}

/* quant.c's q8a_row: 127 / amax, x * that rounded to nearest even (the
 * default rounding of vcvtps2dq, as nearbyintf), d and d * sum as f16. */
static T void qx32_row(const float *x, lms__q8a *out, int cols)
{
    const __m256 sign = _mm256_set1_ps(-0.f);
    for (int b = 0; b < cols / 32; b++) {
        const float *v = x + 32 * b;
        __m256 v0 = _mm256_loadu_ps(v), v1 = _mm256_loadu_ps(v + 8), v2 = _mm256_loadu_ps(v + 16),
               v3 = _mm256_loadu_ps(v + 24);
        __m256 m = _mm256_max_ps(_mm256_max_ps(_mm256_andnot_ps(sign, v0), _mm256_andnot_ps(sign, v1)),
                                 _mm256_max_ps(_mm256_andnot_ps(sign, v2), _mm256_andnot_ps(sign, v3)));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        float amax = _mm_cvtss_f32(h);
        float d = amax / 127.f, id = amax != 0 ? 127.f / amax : 0.f;
        __m256 s = _mm256_set1_ps(id);
        __m256i q0 = _mm256_cvtps_epi32(_mm256_mul_ps(v0, s)), q1 = _mm256_cvtps_epi32(_mm256_mul_ps(v1, s)),
                q2 = _mm256_cvtps_epi32(_mm256_mul_ps(v2, s)), q3 = _mm256_cvtps_epi32(_mm256_mul_ps(v3, s));
        int sum = hsum_epi32(_mm256_add_epi32(_mm256_add_epi32(q0, q1), _mm256_add_epi32(q2, q3)));
        __m256i p = pack32(q0, q1, q2, q3);
        _mm256_storeu_si256((__m256i *)out[b].q, p);
        out[b].sum = sum_i8(p);
        out[b].d = _cvtsh_ss(_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT));
        out[b].s = _cvtsh_ss(_cvtss_sh(d * (float)sum, _MM_FROUND_TO_NEAREST_INT));
    }
}

/* quant/quantize.c's q8_k: the first value of largest magnitude (with its
 * sign) as max, -127 / max, codes rounded to nearest even, sums of 16. */
static T void qxk_row(const float *x, lms__q8k *out, int cols)
{
    const __m256 sign = _mm256_set1_ps(-0.f);
    for (int b = 0; b < cols / 256; b++) {
        const float *v = x + 256 * b;
        lms__q8k *o = out + b;
        __m256 m = _mm256_setzero_ps();
        for (int i = 0; i < 256; i += 8)
            m = _mm256_max_ps(m, _mm256_andnot_ps(sign, _mm256_loadu_ps(v + i)));
        __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
        h = _mm_max_ps(h, _mm_movehl_ps(h, h));
        h = _mm_max_ss(h, _mm_movehdup_ps(h));
        float amax = _mm_cvtss_f32(h);
        /* zeros, NaN, infinities, and subnormal maxima whose -127 / max is
         * infinite: the portable code's bytes (ggml's rounding trick) */
        if (!(amax > 0 && amax <= 3.4028235e38f && 127.f / amax <= 3.4028235e38f)) {
            lms__qx_quantize_ref(LMS_DTYPE_Q8_K, v, o);
            continue;
        }
        float max = 0;
        __m256 am = _mm256_set1_ps(amax);
        for (int i = 0; i < 256; i += 8) {
            int k = _mm256_movemask_ps(_mm256_cmp_ps(_mm256_andnot_ps(sign, _mm256_loadu_ps(v + i)), am, _CMP_EQ_OQ));
            if (k) {
                max = v[i + __builtin_ctz((unsigned)k)];
                break;
            }
        }
        float iscale = -127.f / max;
        __m256 s = _mm256_set1_ps(iscale);
        const __m256i one8 = _mm256_set1_epi8(1), one16 = _mm256_set1_epi16(1);
        for (int i = 0; i < 256; i += 32) {
            __m256i q = pack32(_mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + i), s)),
                               _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + i + 8), s)),
                               _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + i + 16), s)),
                               _mm256_cvtps_epi32(_mm256_mul_ps(_mm256_loadu_ps(v + i + 24), s)));
            _mm256_storeu_si256((__m256i *)(o->q + i), q);
            /* sums of 4, then lanes 0 and 4 the sums of 16 */
            __m256i s4 = _mm256_madd_epi16(_mm256_maddubs_epi16(one8, q), one16);
            s4 = _mm256_hadd_epi32(s4, s4);
            s4 = _mm256_hadd_epi32(s4, s4);
            o->bsums[i / 16] = (int16_t)_mm256_extract_epi32(s4, 0);
            o->bsums[i / 16 + 1] = (int16_t)_mm256_extract_epi32(s4, 4);
        }
        o->d = 1 / iscale;
    }
}

static T void k_qx(lms_dtype t, const float *x, int cols, void *out)
{
    if (t == LMS_DTYPE_Q8_K)
        qxk_row(x, out, cols);
    else
        qx32_row(x, out, cols);
}

/* ---- products ------------------------------------------------------------------------------------------ */

#ifdef QX_ZMM
#define ZMM32(DT, W, ldw, X, xr, y, ldy, rows, nb, cols, acc)                                                \
    (zpanel_type32(DT) && ((nb) == 1 ? zmm32_1(DT, W, ldw, X, y, rows, cols, acc)                            \
                                     : zgemm(DT, W, ldw, X, xr, y, ldy, rows, nb, cols, acc)))
#define ZMMK(DT, W, ldw, X, xr, y, ldy, rows, nb, cols, acc)                                                 \
    (zpanel_typek(DT) && (nb) >= 2 && zgemm(DT, W, ldw, X, xr, y, ldy, rows, nb, cols, acc))
#else
#define ZMM32(DT, W, ldw, X, xr, y, ldy, rows, nb, cols, acc) false
#define ZMMK(DT, W, ldw, X, xr, y, ldy, rows, nb, cols, acc) false
#endif

#define Q32(NAME, DT)                                                                                        \
    static T void NAME##_q(const void *W, size_t ldw, const void *xq, float *y, size_t ldy, int rows, int nb, \
                           int cols, bool acc)                                                               \
    {                                                                                                        \
        size_t xr = lms__qx_row_bytes(DT, cols);                                                             \
        const uint8_t *X = xq;                                                                               \
        if (ZMM32(DT, W, ldw, X, xr, y, ldy, rows, nb, cols, acc))                                           \
            return;                                                                                          \
        for (int r = 0; r < rows; r++) {                                                                     \
            const uint8_t *w = (const uint8_t *)W + (size_t)r * ldw;                                         \
            int b = 0;                                                                                       \
            for (; b + 4 <= nb; b += 4) {                                                                    \
                float v[4];                                                                                  \
                dot32_4(DT, w, (const lms__q8a *)(X + (size_t)b * xr), (const lms__q8a *)(X + (size_t)(b + 1) * xr), \
                        (const lms__q8a *)(X + (size_t)(b + 2) * xr), (const lms__q8a *)(X + (size_t)(b + 3) * xr), \
                        cols / 32, v);                                                                       \
                for (int k = 0; k < 4; k++)                                                                  \
                    store_y(y + (size_t)(b + k) * ldy + r, v[k], acc);                                       \
            }                                                                                                \
            for (; b < nb; b++)                                                                              \
                store_y(y + (size_t)b * ldy + r, dot32_1(DT, w, (const lms__q8a *)(X + (size_t)b * xr), cols / 32), \
                        acc);                                                                                \
        }                                                                                                    \
    }

#define QK(NAME, DT)                                                                                         \
    static T void NAME##_q(const void *W, size_t ldw, const void *xq, float *y, size_t ldy, int rows, int nb, \
                           int cols, bool acc)                                                               \
    {                                                                                                        \
        size_t xr = lms__qx_row_bytes(DT, cols);                                                             \
        const uint8_t *X = xq;                                                                               \
        if (ZMMK(DT, W, ldw, X, xr, y, ldy, rows, nb, cols, acc))                                            \
            return;                                                                                          \
        for (int r = 0; r < rows; r++) {                                                                     \
            const uint8_t *w = (const uint8_t *)W + (size_t)r * ldw;                                         \
            int b = 0;                                                                                       \
            for (; b + 4 <= nb; b += 4) {                                                                    \
                const lms__q8k *xs[4];                                                                       \
                float v[4];                                                                                  \
                for (int k = 0; k < 4; k++)                                                                  \
                    xs[k] = (const lms__q8k *)(X + (size_t)(b + k) * xr);                                    \
                dotk_n(DT, w, xs, 4, cols / 256, v);                                                         \
                for (int k = 0; k < 4; k++)                                                                  \
                    store_y(y + (size_t)(b + k) * ldy + r, v[k], acc);                                       \
            }                                                                                                \
            for (; b < nb; b++) {                                                                            \
                const lms__q8k *x1 = (const lms__q8k *)(X + (size_t)b * xr);                                 \
                float v;                                                                                     \
                dotk_n(DT, w, &x1, 1, cols / 256, &v);                                                       \
                store_y(y + (size_t)b * ldy + r, v, acc);                                                    \
            }                                                                                                \
        }                                                                                                    \
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

/* lms__mlx_scale inlined (a call per group cost more than the group's products) */
static INLINE T float mlx_sc(const void *p, size_t i, lms_dtype t)
{
    float f;
    if (t == LMS_DTYPE_F32) {
        memcpy(&f, (const uint8_t *)p + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, (const uint8_t *)p + 2 * i, 2);
    if (t == LMS_DTYPE_F16)
        return _cvtsh_ss(h);
    const uint32_t u = (uint32_t)h << 16; /* bf16 */
    memcpy(&f, &u, 4);
    return f;
}

/* sx[b * ng + k] = the sum of vector b's group k (g elements, a multiple of 8): the
 * b * sum(x) term of every row, once per call */
static INLINE T void mlx_group_sums(const float *x, size_t ldx, int nb, int ng, uint32_t g, float *sx)
{
    for (int b = 0; b < nb; b++)
        for (int k = 0; k < ng; k++) {
            __m256 a = _mm256_setzero_ps();
            for (uint32_t i = 0; i < g; i += 8)
                a = _mm256_add_ps(a, _mm256_loadu_ps(x + (size_t)b * ldx + (size_t)k * g + i));
            sx[(size_t)b * ng + k] = hsum_ps(a);
        }
}

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

#ifdef QX_ZMM
/*
 * MLX affine 4- and 8-bit on 512-bit registers, up to four activation
 * vectors a row, each with its own accumulators; per group as k_mlx:
 * s * sum(q x) + b * sum(x), the group's sum of x from a panel. 8-bit codes
 * 16 a register (zero-extended bytes). 4-bit codes 32 at a time from 16
 * bytes zero-extended to 16 lanes: the low nibbles are the even codes and
 * the high nibbles the odd ones, so the panel holds each vector's 32
 * elements of a chunk reordered, even ones first; one load, one widening,
 * an AND and a shift for 32 codes. Decode prefetches the row stream as the
 * GGUF kernels do. Vectors are taken MLX_TB at a time (the panel's size).
 */
enum { MLX_TB = 64 };

/* Row w against NT (1..4) vectors: xs[t] (4-bit: its reordered panel), sx[t] its group sums. */
static INLINE T void mlx_row_nt(const lms__mlx_mat *W, int r, const uint8_t *w, const float *const *xs,
                                const float *const *sx, int ng, const int NT, float *out)
{
    const uint32_t g = W->group, bits = W->bits;
    __m512 a[4];
    float bias[4] = {0, 0, 0, 0};
    for (int t = 0; t < NT; t++)
        a[t] = _mm512_setzero_ps();
    for (int k = 0; k < ng; k++) {
        const size_t si = (size_t)r * W->lds + (size_t)k, e0 = (size_t)k * g;
        if (NT == 1)
            qprefetch(w + e0 * bits / 8, g * bits / 8);
        __m512 g0[4], g1[4];
        for (int t = 0; t < NT; t++)
            g0[t] = g1[t] = _mm512_setzero_ps();
        if (bits == 4) {
            for (uint32_t i = 0; i < g; i += 32) {
                const __m512i v = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(w + (e0 + i) / 2)));
                const __m512 lo = _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(15)));
                const __m512 hi = _mm512_cvtepi32_ps(_mm512_srli_epi32(v, 4));
                for (int t = 0; t < NT; t++) {
                    g0[t] = _mm512_fmadd_ps(lo, _mm512_loadu_ps(xs[t] + e0 + i), g0[t]);
                    g1[t] = _mm512_fmadd_ps(hi, _mm512_loadu_ps(xs[t] + e0 + i + 16), g1[t]);
                }
            }
        } else {
            for (uint32_t i = 0; i < g; i += 32) {
                const __m512 q0 =
                    _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(w + e0 + i))));
                const __m512 q1 =
                    _mm512_cvtepi32_ps(_mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(w + e0 + i + 16))));
                for (int t = 0; t < NT; t++) {
                    g0[t] = _mm512_fmadd_ps(q0, _mm512_loadu_ps(xs[t] + e0 + i), g0[t]);
                    g1[t] = _mm512_fmadd_ps(q1, _mm512_loadu_ps(xs[t] + e0 + i + 16), g1[t]);
                }
            }
        }
        const __m512 s = _mm512_set1_ps(mlx_sc(W->scales, si, W->sdt));
        const float b = mlx_sc(W->biases, si, W->sdt);
        for (int t = 0; t < NT; t++) {
            a[t] = _mm512_fmadd_ps(_mm512_add_ps(g0[t], g1[t]), s, a[t]);
            bias[t] += b * sx[t][k];
        }
    }
    for (int t = 0; t < NT; t++)
        out[t] = _mm512_reduce_add_ps(a[t]) + bias[t];
}

/* false where the shape is not for it (bits other than 4 and 8, groups not of 32 codes) or the
 * panel's memory is not to be had: k_mlx then */
static INLINE T bool zmlx(const lms__mlx_mat *W, const float *x, size_t ldx, float *y, size_t ldy, int rows, int nb,
                          int cols, bool acc)
{
    const uint32_t g = W->group, bits = W->bits;
    if ((bits != 4 && bits != 8) || g % 32 || cols % (int)g)
        return false;
    const int ng = cols / (int)g, tb = nb < MLX_TB ? nb : MLX_TB;
    const size_t xp_floats = bits == 4 ? (size_t)tb * (size_t)cols : 0;
    float *sx = lms__qscratch_slot(1, ((size_t)tb * (size_t)ng + xp_floats) * sizeof(float));
    if (!sx)
        return false;
    float *xp = sx + (size_t)tb * ng;
    const __m512i even = _mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30);
    const __m512i odd = _mm512_add_epi32(even, _mm512_set1_epi32(1));
    for (int c0 = 0; c0 < nb; c0 += MLX_TB) {
        const int nc = nb - c0 < MLX_TB ? nb - c0 : MLX_TB;
        mlx_group_sums(x + (size_t)c0 * ldx, ldx, nc, ng, g, sx);
        for (int c = 0; bits == 4 && c < nc; c++) { /* the panel: each chunk's even elements, then its odd ones */
            const float *xc = x + (size_t)(c0 + c) * ldx;
            for (int e = 0; e < cols; e += 32) {
                const __m512 v0 = _mm512_loadu_ps(xc + e), v1 = _mm512_loadu_ps(xc + e + 16);
                _mm512_storeu_ps(xp + (size_t)c * cols + e, _mm512_permutex2var_ps(v0, even, v1));
                _mm512_storeu_ps(xp + (size_t)c * cols + e + 16, _mm512_permutex2var_ps(v0, odd, v1));
            }
        }
        for (int r = 0; r < rows; r++) {
            const uint8_t *w = (const uint8_t *)W->w + (size_t)r * W->ldw;
            for (int t0 = 0; t0 < nc; t0 += 4) {
                const int nt = nc - t0 < 4 ? nc - t0 : 4;
                const float *xs[4], *sxs[4];
                float v[4];
                for (int t = 0; t < nt; t++) {
                    xs[t] = bits == 4 ? xp + (size_t)(t0 + t) * cols : x + (size_t)(c0 + t0 + t) * ldx;
                    sxs[t] = sx + (size_t)(t0 + t) * ng;
                }
                switch (nt) { /* a constant NT in each expansion */
                case 1: mlx_row_nt(W, r, w, xs, sxs, ng, 1, v); break;
                case 2: mlx_row_nt(W, r, w, xs, sxs, ng, 2, v); break;
                case 3: mlx_row_nt(W, r, w, xs, sxs, ng, 3, v); break;
                default: mlx_row_nt(W, r, w, xs, sxs, ng, 4, v); break;
                }
                for (int t = 0; t < nt; t++)
                    store_y(y + (size_t)(c0 + t0 + t) * ldy + r, v[t], acc);
            }
        }
    }
    return true;
}
#endif

static T void k_mlx(const lms__mlx_mat *W, const float *x, size_t ldx, float *y, size_t ldy, int rows, int nb,
                    int cols, bool acc)
{
    uint32_t g = W->group, bits = W->bits;
    if (bits != 4 && bits != 8) {
        lms__qkernels_by_name("generic")->mlx(W, x, ldx, y, ldy, rows, nb, cols, acc);
        return;
    }
#ifdef QX_ZMM
    if (zmlx(W, x, ldx, y, ldy, rows, nb, cols, acc))
        return;
#endif
    int ng = cols / (int)g;
    /* the sums of x over each group, once per vector */
    float *sx = lms__qscratch((size_t)nb * (size_t)ng * sizeof(float));
    if (!sx) {
        lms__qkernels_by_name("generic")->mlx(W, x, ldx, y, ldy, rows, nb, cols, acc);
        return;
    }
    mlx_group_sums(x, ldx, nb, ng, g, sx);
    for (int r = 0; r < rows; r++) {
        const uint8_t *w = (const uint8_t *)W->w + (size_t)r * W->ldw;
        for (int b = 0; b < nb; b++) {
            const float *xb = x + (size_t)b * ldx;
            __m256 a = _mm256_setzero_ps();
            float bias = 0;
            for (int k = 0; k < ng; k++) {
                size_t si = (size_t)r * W->lds + (size_t)k;
                __m256 s = _mm256_set1_ps(mlx_sc(W->scales, si, W->sdt)), gq = _mm256_setzero_ps();
                for (uint32_t i = 0; i < g; i += 8) {
                    size_t e = (size_t)k * g + i;
                    gq = _mm256_fmadd_ps(mlx_codes8(w, e, bits), _mm256_loadu_ps(xb + e), gq);
                }
                a = _mm256_fmadd_ps(gq, s, a);
                bias += mlx_sc(W->biases, si, W->sdt) * sx[(size_t)b * ng + k];
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
    .qx = k_qx,
};
