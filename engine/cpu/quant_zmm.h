/*
 * engine/cpu/quant_zmm.h - the AVX-512 VNNI product of quantized weights
 * with several activation vectors (prefill), part of quant_x86.h's 512-bit
 * section (included there, compiled into quant_avx512.c only).
 *
 * A cache-blocked GEMM: the weights are repacked, 16 rows at a time, as
 * they are read from the mapping into a panel in this thread's scratch
 * (never a converted copy of the model), each block's codes unpacked to
 * unsigned bytes and interleaved so that one 512-bit register holds 4
 * consecutive codes of each of the 16 rows (lane r = row r). One vpdpbusd
 * then multiplies 4 codes of 16 rows by 4 codes of one activation vector,
 * broadcast from its quantized row, and a register tile of 16 rows x up to
 * 8 vectors uses each loaded weight register for all 8. A lane's int32 sum
 * is a whole block's (or K group's) exact integer dot, so the float work
 * per block is one conversion and one multiply-add per 16 rows x vector,
 * and the results land as 16 contiguous floats of y per vector.
 *
 * Codes and their offsets (the products are of unsigned weights with the
 * signed activation codes, so each block's sum is corrected):
 *   Q8_0: q + 128, correction -128 * sum(x);  Q4_0: q (0..15), -8 * sum(x);
 *   Q5_0: q (0..31), -16 * sum(x)  (sum(x) exact: lms__q8a.sum);
 *   Q4_K, Q5_K: q (0..15 / 0..31) per 32-group j with integer scale sc_j,
 *     minus dmin * sum_j m_j * (the activation's sums of 16, in pairs);
 *   Q6_K: q + 32 (0..63) per 16-group with signed scale sc_g, minus
 *     d * 32 * sum_g sc_g * bsum_g.
 * The minimums term is one vpdpwssd per pair of 16-sums (int16 x int16).
 *
 * Invariants:
 *   1. every integer sum is exact in int32 (|sum| < 2^28 for every type),
 *      so the only roundings are the portable kernel's kind: per block
 *      (32 types) or per super-block (K types), in float32;
 *   2. lanes past the last row read a copy of the last row and are never
 *      stored;
 *   3. the panel comes from lms__qscratch_slot(1, ...); without it the
 *      caller falls back to its unpanelled kernels (false returned).
 */

enum { ZROWS = 16, ZTOK = 8 };

/* 16 rows of 32 bytes (row r at src + r * stride) to 8 registers stored at
 * dst: register g, lane r = bytes 4g..4g+3 of row r. Rows p and p + 8 share
 * a register at first; three exchanges of a register index bit with a lane
 * index bit (a 16 x 8 transpose of 32-bit words). */
static INLINE T void zt16x8(const uint8_t *src, size_t stride, uint8_t *dst)
{
    static const int32_t idx[3][2][16] = {
        {{0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30},
         {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31}},
        {{0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29},
         {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31}},
        {{0, 1, 2, 3, 16, 17, 18, 19, 8, 9, 10, 11, 24, 25, 26, 27},
         {4, 5, 6, 7, 20, 21, 22, 23, 12, 13, 14, 15, 28, 29, 30, 31}},
    };
    __m512i z[8];
    for (int p = 0; p < 8; p++)
        z[p] = _mm512_inserti64x4(_mm512_castsi256_si512(_mm256_loadu_si256((const __m256i *)(src + p * stride))),
                                  _mm256_loadu_si256((const __m256i *)(src + (p + 8) * stride)), 1);
    for (int s = 0; s < 3; s++) {
        const __m512i ia = _mm512_loadu_si512(idx[s][0]), ib = _mm512_loadu_si512(idx[s][1]);
        for (int p = 0; p < 8; p++) {
            if (p & (1 << s))
                continue;
            __m512i a = z[p], b = z[p | (1 << s)];
            z[p] = _mm512_permutex2var_epi32(a, ia, b);
            z[p | (1 << s)] = _mm512_permutex2var_epi32(a, ib, b);
        }
    }
    for (int g = 0; g < 8; g++)
        _mm512_store_si512(dst + 64 * g, z[g]);
}

static inline int32_t zload32(const int8_t *p)
{
    int32_t v;
    memcpy(&v, p, 4);
    return v;
}

/* Ask for the lines of [p, p + n) ahead of their use: the next panel's
 * rows are fetched while this panel is computed (16 row streams at once
 * are more than the hardware prefetchers follow). */
static inline void zprefetch(const uint8_t *p, size_t n)
{
    for (size_t i = 0; i < n; i += 64)
        __builtin_prefetch(p + i, 0, 2); /* _MM_HINT_T1; see qprefetch on _mm_prefetch */
}

/* Masked store of 16 results of one vector (lanes past nr untouched). */
static INLINE T void zstore(float *y, __mmask16 m, __m512 v, bool acc)
{
    if (acc)
        v = _mm512_add_ps(_mm512_maskz_loadu_ps(m, y), v);
    _mm512_mask_storeu_ps(y, m, v);
}

/* ---- 32-element blocks (Q8_0, Q4_0, Q5_0) against lms__q8a ---------------------------------------------- */

/* A block's panel record: 8 code registers, then the 16 rows' d_w. */
enum { ZREC32 = 9 * 64 };

static INLINE T bool zpanel_type32(lms_dtype t)
{
    return t == LMS_DTYPE_Q8_0 || t == LMS_DTYPE_Q4_0 || t == LMS_DTYPE_Q5_0;
}

static INLINE T int zoff32(lms_dtype t) { return t == LMS_DTYPE_Q8_0 ? 128 : t == LMS_DTYPE_Q4_0 ? 8 : 16; }

/* Q4_0: the 16 nibble bytes of 16 rows transposed as 32-bit words first
 * (rows p, p + 4, p + 8, p + 12 share a register; two exchanges of index
 * bits, as zt16x8), then split: word g's low nibbles are codes 4g..4g+3,
 * its high nibbles codes 16 + 4g.. (half the shuffles of unpacking first). */
static T void zpack_q4_0(const uint8_t *W, size_t ldw, int nr, int nblk, uint8_t *P)
{
    static const int32_t idx[2][2][16] = {
        {{0, 16, 2, 18, 4, 20, 6, 22, 8, 24, 10, 26, 12, 28, 14, 30},
         {1, 17, 3, 19, 5, 21, 7, 23, 9, 25, 11, 27, 13, 29, 15, 31}},
        {{0, 1, 16, 17, 4, 5, 20, 21, 8, 9, 24, 25, 12, 13, 28, 29},
         {2, 3, 18, 19, 6, 7, 22, 23, 10, 11, 26, 27, 14, 15, 30, 31}},
    };
    const __m512i m15 = _mm512_set1_epi8(15);
    const uint8_t *rp[ZROWS];
    for (int r = 0; r < ZROWS; r++)
        rp[r] = W + (size_t)LMS_MIN(r, nr - 1) * ldw + 2;
    for (int b = 0; b < nblk; b++) {
        uint8_t *rec = P + (size_t)b * ZREC32;
        const size_t o = (size_t)b * 18;
        __m512i z[4];
        uint16_t h[ZROWS];
        for (int p = 0; p < 4; p++) {
            __m512i v = _mm512_castsi128_si512(_mm_loadu_si128((const __m128i *)(rp[p] + o)));
            v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(rp[p + 4] + o)), 1);
            v = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(rp[p + 8] + o)), 2);
            z[p] = _mm512_inserti32x4(v, _mm_loadu_si128((const __m128i *)(rp[p + 12] + o)), 3);
        }
        for (int s = 0; s < 2; s++) {
            const __m512i ia = _mm512_loadu_si512(idx[s][0]), ib = _mm512_loadu_si512(idx[s][1]);
            for (int p = 0; p < 4; p++) {
                if (p & (1 << s))
                    continue;
                __m512i a = z[p], c = z[p | (1 << s)];
                z[p] = _mm512_permutex2var_epi32(a, ia, c);
                z[p | (1 << s)] = _mm512_permutex2var_epi32(a, ib, c);
            }
        }
        for (int g = 0; g < 4; g++) {
            _mm512_store_si512(rec + 64 * g, _mm512_and_si512(z[g], m15));
            _mm512_store_si512(rec + 64 * (g + 4), _mm512_and_si512(_mm512_srli_epi16(z[g], 4), m15));
        }
        for (int r = 0; r < ZROWS; r++)
            memcpy(&h[r], rp[r] + o - 2, 2);
        _mm512_store_ps(rec + 512, _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)h)));
    }
}

static T void zpack32(lms_dtype t, const uint8_t *W, size_t ldw, int nr, int nblk, uint8_t *P)
{
    if (t == LMS_DTYPE_Q4_0) {
        zpack_q4_0(W, ldw, nr, nblk, P);
        return;
    }
    const size_t bb = block_bytes32(t);
    _Alignas(64) uint8_t tmp[ZROWS][32];
    for (int b = 0; b < nblk; b++) {
        uint8_t *rec = P + (size_t)b * ZREC32;
        float *dw = (float *)(rec + 512);
        for (int r = 0; r < ZROWS; r++) {
            const uint8_t *p = W + (size_t)LMS_MIN(r, nr - 1) * ldw + (size_t)b * bb;
            _mm256_store_si256((__m256i *)tmp[r], ucodes(t, p));
            dw[r] = h2f(p);
        }
        zt16x8(&tmp[0][0], 32, rec);
    }
}

/* The panel (nblk records) against NT vectors x[0..NT): f[i] = 16 rows' sums for x[i]. */
static INLINE T void ztile32(const uint8_t *P, int nblk, const lms__q8a *const *x, const int off, const int NT,
                             __m512 *f)
{
    for (int i = 0; i < NT; i++)
        f[i] = _mm512_setzero_ps();
    for (int b = 0; b < nblk; b++) {
        const uint8_t *rec = P + (size_t)b * ZREC32;
        __m512i a[ZTOK];
        for (int i = 0; i < NT; i++)
            a[i] = _mm512_set1_epi32(-off * x[i][b].sum);
        for (int g = 0; g < 8; g++) {
            const __m512i w = _mm512_load_si512(rec + 64 * g);
            for (int i = 0; i < NT; i++)
                a[i] = _mm512_dpbusd_epi32(a[i], w, _mm512_set1_epi32(zload32(x[i][b].q + 4 * g)));
        }
        const __m512 dw = _mm512_load_ps(rec + 512);
        for (int i = 0; i < NT; i++)
            f[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(a[i]), _mm512_mul_ps(dw, _mm512_set1_ps(x[i][b].d)), f[i]);
    }
}

#define ZT32_CASE(N)                                                                                         \
    case N: ztile32(P, nblk, xs, off, N, f); break;

static T void zgemm32_panel(lms_dtype t, const uint8_t *P, int nblk, const uint8_t *X, size_t xr, float *y,
                            size_t ldy, int nr, int nb, bool acc)
{
    const int off = zoff32(t);
    const __mmask16 m = (__mmask16)((1u << nr) - 1);
    for (int c0 = 0; c0 < nb; c0 += ZTOK) {
        const int nt = LMS_MIN(ZTOK, nb - c0);
        const lms__q8a *xs[ZTOK];
        for (int i = 0; i < nt; i++)
            xs[i] = (const lms__q8a *)(X + (size_t)(c0 + i) * xr);
        __m512 f[ZTOK];
        switch (nt) {
            ZT32_CASE(1) ZT32_CASE(2) ZT32_CASE(3) ZT32_CASE(4) ZT32_CASE(5) ZT32_CASE(6) ZT32_CASE(7)
        default: ztile32(P, nblk, xs, off, ZTOK, f); break;
        }
        for (int i = 0; i < nt; i++)
            zstore(y + (size_t)(c0 + i) * ldy, m, f[i], acc);
    }
}

/* ---- K super-blocks (Q4_K, Q5_K, Q6_K) against lms__q8k --------------------------------------------------- */

/* A super-block's panel record: 64 code registers (4 codes of 16 rows
 * each, in element order), then the int32 scales of the 256 / G groups
 * (16 rows each), 8 registers of int16 pairs for the minimums term, the
 * rows' d and the minimums' factor (dmin; Q6_K: d). */
static INLINE T int zgroup(lms_dtype t) { return t == LMS_DTYPE_Q6_K ? 16 : 32; }
static INLINE T size_t zreck(lms_dtype t) { return (size_t)(64 + 256 / zgroup(t) + 8 + 2) * 64; }

static INLINE T bool zpanel_typek(lms_dtype t)
{
    return t == LMS_DTYPE_Q4_K || t == LMS_DTYPE_Q5_K || t == LMS_DTYPE_Q6_K;
}

static T void zpackk(lms_dtype t, const uint8_t *W, size_t ldw, int nr, int nsb, uint8_t *P)
{
    const size_t bb = lms_dtype_block_bytes(t, 0), rec_bytes = zreck(t);
    const int ng = 256 / zgroup(t);
    _Alignas(64) uint8_t tmp[ZROWS][256];
    for (int b = 0; b < nsb; b++) {
        uint8_t *rec = P + (size_t)b * rec_bytes;
        int32_t *sc = (int32_t *)(rec + 64 * 64), *mp = sc + 16 * ng;
        float *d = (float *)(mp + 16 * 8), *dm = d + 16;
        for (int r = 0; r < ZROWS; r++) {
            const uint8_t *p = W + (size_t)LMS_MIN(r, nr - 1) * ldw + (size_t)b * bb;
            kblock k;
            kunpack(t, p, &k);
            for (int j = 0; j < 8; j++)
                _mm256_store_si256((__m256i *)(tmp[r] + 32 * j), k.q[j]);
            d[r] = k.d;
            dm[r] = k.dmin;
            if (t == LMS_DTYPE_Q6_K) {
                const int8_t *s = (const int8_t *)(p + 192);
                for (int g = 0; g < 16; g++)
                    sc[16 * g + r] = s[g];
                for (int i = 0; i < 8; i++)
                    mp[16 * i + r] = (int32_t)(uint16_t)(int16_t)(32 * s[2 * i]) |
                                     (int32_t)((uint32_t)(uint16_t)(int16_t)(32 * s[2 * i + 1]) << 16);
            } else {
                for (int j = 0; j < 8; j++) {
                    int s, m;
                    lms__k4_scale_min(p + 4, j, &s, &m);
                    sc[16 * j + r] = s;
                    mp[16 * j + r] = m | m << 16; /* 0..63 each */
                }
            }
        }
        for (int c = 0; c < 8; c++)
            zt16x8(&tmp[0][32 * c], 256, rec + 512 * c);
    }
}

static INLINE T void ztilek(const uint8_t *P, size_t rec_bytes, const int G, int nsb, const lms__q8k *const *x,
                            const int NT, __m512 *f)
{
    const int ng = 256 / G;
    for (int i = 0; i < NT; i++)
        f[i] = _mm512_setzero_ps();
    for (int b = 0; b < nsb; b++) {
        const uint8_t *rec = P + (size_t)b * rec_bytes;
        const uint8_t *sc = rec + 64 * 64, *mp = sc + 64 * ng, *dp = mp + 64 * 8;
        __m512i s[ZTOK], a[ZTOK];
        for (int i = 0; i < NT; i++)
            s[i] = _mm512_setzero_si512();
        for (int j = 0; j < ng; j++) {
            for (int i = 0; i < NT; i++)
                a[i] = _mm512_setzero_si512();
            for (int g = 0; g < G / 4; g++) {
                const __m512i w = _mm512_load_si512(rec + 64 * (j * G / 4 + g));
                for (int i = 0; i < NT; i++)
                    a[i] = _mm512_dpbusd_epi32(a[i], w, _mm512_set1_epi32(zload32(x[i][b].q + j * G + 4 * g)));
            }
            const __m512i scv = _mm512_load_si512(sc + 64 * j);
            for (int i = 0; i < NT; i++)
                s[i] = _mm512_add_epi32(s[i], _mm512_mullo_epi32(a[i], scv));
        }
        for (int i = 0; i < NT; i++)
            a[i] = _mm512_setzero_si512();
        for (int p = 0; p < 8; p++) {
            const __m512i mv = _mm512_load_si512(mp + 64 * p);
            for (int i = 0; i < NT; i++) {
                int32_t bs;
                memcpy(&bs, x[i][b].bsums + 2 * p, 4);
                a[i] = _mm512_dpwssd_epi32(a[i], mv, _mm512_set1_epi32(bs));
            }
        }
        const __m512 dv = _mm512_load_ps(dp), dmv = _mm512_load_ps(dp + 64);
        for (int i = 0; i < NT; i++) {
            const __m512 dx = _mm512_set1_ps(x[i][b].d);
            f[i] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s[i]), _mm512_mul_ps(dv, dx), f[i]);
            f[i] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(a[i]), _mm512_mul_ps(dmv, dx), f[i]);
        }
    }
}

#define ZTK_CASE(N)                                                                                          \
    case N:                                                                                                  \
        if (G == 16)                                                                                         \
            ztilek(P, rb, 16, nsb, xs, N, f);                                                                \
        else                                                                                                 \
            ztilek(P, rb, 32, nsb, xs, N, f);                                                                \
        break;

static T void zgemmk_panel(lms_dtype t, const uint8_t *P, int nsb, const uint8_t *X, size_t xr, float *y,
                           size_t ldy, int nr, int nb, bool acc)
{
    const int G = zgroup(t);
    const size_t rb = zreck(t);
    const __mmask16 m = (__mmask16)((1u << nr) - 1);
    for (int c0 = 0; c0 < nb; c0 += ZTOK) {
        const int nt = LMS_MIN(ZTOK, nb - c0);
        const lms__q8k *xs[ZTOK];
        for (int i = 0; i < nt; i++)
            xs[i] = (const lms__q8k *)(X + (size_t)(c0 + i) * xr);
        __m512 f[ZTOK];
        switch (nt) {
            ZTK_CASE(1) ZTK_CASE(2) ZTK_CASE(3) ZTK_CASE(4) ZTK_CASE(5) ZTK_CASE(6) ZTK_CASE(7)
            ZTK_CASE(8)
        }
        for (int i = 0; i < nt; i++)
            zstore(y + (size_t)(c0 + i) * ldy, m, f[i], acc);
    }
}

/* Q8_0 / Q4_0 / Q5_0 / Q4_K / Q5_K / Q6_K against nb vectors, 16-row
 * panels one after the other; false (nothing done) when the panel's memory
 * is not to be had. */
static INLINE T bool zgemm(lms_dtype t, const void *W, size_t ldw, const uint8_t *X, size_t xr, float *y, size_t ldy,
                           int rows, int nb, int cols, bool acc)
{
    const bool k = zpanel_typek(t);
    const int nblk = cols / (k ? 256 : 32);
    uint8_t *P = lms__qscratch_slot(1, (size_t)nblk * (k ? zreck(t) : ZREC32));
    if (!P)
        return false;
    zprefetch(W, (size_t)LMS_MIN(ZROWS, rows) * ldw);
    for (int r0 = 0; r0 < rows; r0 += ZROWS) {
        const int nr = LMS_MIN(ZROWS, rows - r0);
        const uint8_t *w = (const uint8_t *)W + (size_t)r0 * ldw;
        if (k)
            zpackk(t, w, ldw, nr, nblk, P);
        else
            zpack32(t, w, ldw, nr, nblk, P);
        if (r0 + ZROWS < rows) /* the next panel's rows, while this one is computed */
            zprefetch(w + ZROWS * ldw, (size_t)LMS_MIN(ZROWS, rows - r0 - ZROWS) * ldw);
        if (k)
            zgemmk_panel(t, P, nblk, X, xr, y + r0, ldy, nr, nb, acc);
        else
            zgemm32_panel(t, P, nblk, X, xr, y + r0, ldy, nr, nb, acc);
    }
    return true;
}
