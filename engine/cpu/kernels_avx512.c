/*
 * engine/cpu/kernels_avx512.c - AVX-512 kernels (F + BW + VL, with F16C and
 * FMA): the matrix products of decode and prefill over 16-bit or f32 weights
 * read in place, and the V accumulation of attention. Chosen at run time by
 * kernels.c when the CPU has AVX-512; compiled with per-function target
 * attributes so the rest of the library stays baseline x86-64.
 *
 * Weights are widened to f32 in registers (bf16: shift into the high half;
 * f16: vcvtph2ps) and accumulated in f32 with FMA. Decode streams each
 * call's rows in memory order; prefill packs blocks of 48 rows into L1 and
 * runs every token of the block over them (GEMM_PACKED below). The
 * avx512bf16 set at the end adds the products of BF16 weights with bf16
 * activations (vdpbf16ps), in the same two shapes.
 */
#if defined(__x86_64__)
#include <immintrin.h>

#include "engine/cpu/quant.h"
#include "engine/cpu/transpose_x86.h"
#include "engine/internal.h"

#define T __attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c")))

/* software prefetch distance (elements) in the 4-row path (4 to 7 tokens),
 * which streams four weight rows at once, a pattern the hardware prefetcher
 * follows late */
#define PF 512
/* decode (fewer than 4 tokens): rows in memory order, one weight stream,
 * prefetched this many bytes ahead */
#define PFB 4096

/* ---- loads of 16 weights widened to f32 (masked for the tail) -------------------- */

static inline T __m512 ld_f32(const void *p, size_t i) { return _mm512_loadu_ps((const float *)p + i); }
static inline T __m512 ldm_f32(const void *p, size_t i, __mmask16 m)
{
    return _mm512_maskz_loadu_ps(m, (const float *)p + i);
}
static inline T __m512 ld_f16(const void *p, size_t i)
{
    return _mm512_cvtph_ps(_mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i)));
}
static inline T __m512 ldm_f16(const void *p, size_t i, __mmask16 m)
{
    return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i));
}
static inline T __m512 ld_bf16(const void *p, size_t i)
{
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
static inline T __m512 ldm_bf16(const void *p, size_t i, __mmask16 m)
{
    __m256i h = _mm256_maskz_loadu_epi16(m, (const uint16_t *)p + i);
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

static inline void store_out(float *y, float v, bool acc) { *y = acc ? *y + v : v; }

/*
 * One instantiation per weight dtype. ESZ: bytes per weight element.
 */
#define GEMM_IMPL(NAME, LD, LDM, ESZ)                                                              \
    static T void NAME(const void *W, size_t ldw, const float *x, size_t ldx, float *y, size_t ldy,   \
                       int rows, int nb, int cols, bool acc)                                          \
    {                                                                                                 \
        const uint8_t *Wb = W;                                                                        \
        int kf = cols & ~15;                                                                          \
        __mmask16 mt = (__mmask16)((1u << (cols - kf)) - 1);                                         \
        int r = 0;                                                                                    \
        for (; r + 4 <= rows; r += 4) {                                                               \
            const void *w0 = Wb + (size_t)(r + 0) * ldw * ESZ, *w1 = Wb + (size_t)(r + 1) * ldw * ESZ; \
            const void *w2 = Wb + (size_t)(r + 2) * ldw * ESZ, *w3 = Wb + (size_t)(r + 3) * ldw * ESZ; \
            int b = 0;                                                                                \
            for (; b + 4 <= nb; b += 4) {                                                             \
                const float *x0 = x + (size_t)b * ldx, *x1 = x0 + ldx, *x2 = x1 + ldx, *x3 = x2 + ldx;   \
                __m512 a[4][4];                                                                       \
                for (int i = 0; i < 4; i++)                                                           \
                    for (int j = 0; j < 4; j++) a[i][j] = _mm512_setzero_ps();                        \
                for (int k = 0; k < kf; k += 16) {                                                    \
                    __m512 v0 = LD(w0, k), v1 = LD(w1, k), v2 = LD(w2, k), v3 = LD(w3, k);            \
                    __m512 xv;                                                                        \
                    xv = _mm512_loadu_ps(x0 + k);                                                     \
                    a[0][0] = _mm512_fmadd_ps(v0, xv, a[0][0]); a[1][0] = _mm512_fmadd_ps(v1, xv, a[1][0]); \
                    a[2][0] = _mm512_fmadd_ps(v2, xv, a[2][0]); a[3][0] = _mm512_fmadd_ps(v3, xv, a[3][0]); \
                    xv = _mm512_loadu_ps(x1 + k);                                                     \
                    a[0][1] = _mm512_fmadd_ps(v0, xv, a[0][1]); a[1][1] = _mm512_fmadd_ps(v1, xv, a[1][1]); \
                    a[2][1] = _mm512_fmadd_ps(v2, xv, a[2][1]); a[3][1] = _mm512_fmadd_ps(v3, xv, a[3][1]); \
                    xv = _mm512_loadu_ps(x2 + k);                                                     \
                    a[0][2] = _mm512_fmadd_ps(v0, xv, a[0][2]); a[1][2] = _mm512_fmadd_ps(v1, xv, a[1][2]); \
                    a[2][2] = _mm512_fmadd_ps(v2, xv, a[2][2]); a[3][2] = _mm512_fmadd_ps(v3, xv, a[3][2]); \
                    xv = _mm512_loadu_ps(x3 + k);                                                     \
                    a[0][3] = _mm512_fmadd_ps(v0, xv, a[0][3]); a[1][3] = _mm512_fmadd_ps(v1, xv, a[1][3]); \
                    a[2][3] = _mm512_fmadd_ps(v2, xv, a[2][3]); a[3][3] = _mm512_fmadd_ps(v3, xv, a[3][3]); \
                }                                                                                     \
                if (mt) {                                                                             \
                    __m512 v[4] = {LDM(w0, kf, mt), LDM(w1, kf, mt), LDM(w2, kf, mt), LDM(w3, kf, mt)}; \
                    const float *xs[4] = {x0, x1, x2, x3};                                            \
                    for (int j = 0; j < 4; j++) {                                                     \
                        __m512 xv = _mm512_maskz_loadu_ps(mt, xs[j] + kf);                            \
                        for (int i = 0; i < 4; i++) a[i][j] = _mm512_fmadd_ps(v[i], xv, a[i][j]);     \
                    }                                                                                 \
                }                                                                                     \
                for (int i = 0; i < 4; i++)                                                           \
                    for (int j = 0; j < 4; j++)                                                       \
                        store_out(y + (size_t)(b + j) * ldy + r + i, _mm512_reduce_add_ps(a[i][j]), acc); \
            }                                                                                         \
            for (; b < nb; b++) {                                                                     \
                const float *xb = x + (size_t)b * ldx;                                                \
                __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                           \
                __m512 c0 = a0, c1 = a0, c2 = a0, c3 = a0;                                            \
                int k = 0;                                                                            \
                for (; k + 32 <= kf; k += 32) {                                                       \
                    _mm_prefetch((const char *)w0 + (size_t)(k + PF) * ESZ, _MM_HINT_T0);               \
                    _mm_prefetch((const char *)w1 + (size_t)(k + PF) * ESZ, _MM_HINT_T0);               \
                    _mm_prefetch((const char *)w2 + (size_t)(k + PF) * ESZ, _MM_HINT_T0);               \
                    _mm_prefetch((const char *)w3 + (size_t)(k + PF) * ESZ, _MM_HINT_T0);               \
                    __m512 xv = _mm512_loadu_ps(xb + k), xw = _mm512_loadu_ps(xb + k + 16);           \
                    a0 = _mm512_fmadd_ps(LD(w0, k), xv, a0); a1 = _mm512_fmadd_ps(LD(w1, k), xv, a1); \
                    a2 = _mm512_fmadd_ps(LD(w2, k), xv, a2); a3 = _mm512_fmadd_ps(LD(w3, k), xv, a3); \
                    c0 = _mm512_fmadd_ps(LD(w0, k + 16), xw, c0); c1 = _mm512_fmadd_ps(LD(w1, k + 16), xw, c1); \
                    c2 = _mm512_fmadd_ps(LD(w2, k + 16), xw, c2); c3 = _mm512_fmadd_ps(LD(w3, k + 16), xw, c3); \
                }                                                                                     \
                for (; k < kf; k += 16) {                                                             \
                    __m512 xv = _mm512_loadu_ps(xb + k);                                              \
                    a0 = _mm512_fmadd_ps(LD(w0, k), xv, a0); a1 = _mm512_fmadd_ps(LD(w1, k), xv, a1); \
                    a2 = _mm512_fmadd_ps(LD(w2, k), xv, a2); a3 = _mm512_fmadd_ps(LD(w3, k), xv, a3); \
                }                                                                                     \
                if (mt) {                                                                             \
                    __m512 xv = _mm512_maskz_loadu_ps(mt, xb + kf);                                   \
                    a0 = _mm512_fmadd_ps(LDM(w0, kf, mt), xv, a0); a1 = _mm512_fmadd_ps(LDM(w1, kf, mt), xv, a1); \
                    a2 = _mm512_fmadd_ps(LDM(w2, kf, mt), xv, a2); a3 = _mm512_fmadd_ps(LDM(w3, kf, mt), xv, a3); \
                }                                                                                     \
                float *yb = y + (size_t)b * ldy + r;                                                  \
                store_out(yb + 0, _mm512_reduce_add_ps(_mm512_add_ps(a0, c0)), acc);                  \
                store_out(yb + 1, _mm512_reduce_add_ps(_mm512_add_ps(a1, c1)), acc);                  \
                store_out(yb + 2, _mm512_reduce_add_ps(_mm512_add_ps(a2, c2)), acc);                  \
                store_out(yb + 3, _mm512_reduce_add_ps(_mm512_add_ps(a3, c3)), acc);                  \
            }                                                                                         \
        }                                                                                             \
        for (; r < rows; r++) {                                                                       \
            const void *w0 = Wb + (size_t)r * ldw * ESZ;                                              \
            for (int b = 0; b < nb; b++) {                                                            \
                const float *xb = x + (size_t)b * ldx;                                                \
                __m512 a0 = _mm512_setzero_ps();                                                      \
                for (int k = 0; k < kf; k += 16)                                                      \
                    a0 = _mm512_fmadd_ps(LD(w0, k), _mm512_loadu_ps(xb + k), a0);                     \
                if (mt)                                                                               \
                    a0 = _mm512_fmadd_ps(LDM(w0, kf, mt), _mm512_maskz_loadu_ps(mt, xb + kf), a0);    \
                store_out(y + (size_t)b * ldy + r, _mm512_reduce_add_ps(a0), acc);                    \
            }                                                                                         \
        }                                                                                             \
    }

GEMM_IMPL(gemm_f32_rows4, ld_f32, ldm_f32, 4)
GEMM_IMPL(gemm_f16_rows4, ld_f16, ldm_f16, 2)
GEMM_IMPL(gemm_bf16_rows4, ld_bf16, ldm_bf16, 2)

/*
 * Fewer than 4 tokens (decode, and attention's scores over a kv head's 2 or 3
 * query heads): one row at a time in memory order, prefetched PFB bytes
 * ahead, each 16 of the row's weights loaded and widened once and met by
 * every token (NB of them, a constant in each expansion); per row and token
 * the same two accumulators and order of terms whatever NB is. 4 to 7 tokens
 * take the 4-row path above.
 */
#define GEMM_LINEAR(NAME, ROWS4, LD, LDM, ESZ)                                                       \
    static inline T __attribute__((always_inline)) void NAME##_nb(const void *W, size_t ldw, const float *x, \
                                                                 size_t ldx, float *y, size_t ldy, int rows, \
                                                                 const int NB, int cols, bool acc)  \
    {                                                                                                 \
        int kf = cols & ~15;                                                                          \
        __mmask16 mt = (__mmask16)((1u << (cols - kf)) - 1);                                         \
        for (int r = 0; r < rows; r++) {                                                              \
            const uint8_t *w = (const uint8_t *)W + (size_t)r * ldw * ESZ;                            \
            __m512 a0[3], a1[3];                                                                      \
            for (int b = 0; b < NB; b++) a0[b] = a1[b] = _mm512_setzero_ps();                          \
            int k = 0;                                                                                \
            for (; k + 32 <= kf; k += 32) {                                                           \
                for (int c = 0; c < 32 * ESZ; c += 64)                                                \
                    _mm_prefetch((const char *)w + (size_t)k * ESZ + PFB + c, _MM_HINT_T0);           \
                const __m512 w0 = LD(w, k), w1 = LD(w, k + 16);                                       \
                for (int b = 0; b < NB; b++) {                                                        \
                    a0[b] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + (size_t)b * ldx + k), a0[b]);      \
                    a1[b] = _mm512_fmadd_ps(w1, _mm512_loadu_ps(x + (size_t)b * ldx + k + 16), a1[b]); \
                }                                                                                     \
            }                                                                                         \
            if (k < kf) {                                                                             \
                const __m512 w0 = LD(w, k);                                                           \
                for (int b = 0; b < NB; b++)                                                          \
                    a0[b] = _mm512_fmadd_ps(w0, _mm512_loadu_ps(x + (size_t)b * ldx + k), a0[b]);      \
            }                                                                                         \
            if (mt) {                                                                                 \
                const __m512 wm = LDM(w, kf, mt);                                                     \
                for (int b = 0; b < NB; b++)                                                          \
                    a1[b] = _mm512_fmadd_ps(wm, _mm512_maskz_loadu_ps(mt, x + (size_t)b * ldx + kf), a1[b]); \
            }                                                                                         \
            for (int b = 0; b < NB; b++)                                                              \
                store_out(y + (size_t)b * ldy + r, _mm512_reduce_add_ps(_mm512_add_ps(a0[b], a1[b])), acc); \
        }                                                                                             \
    }                                                                                                 \
    static T void NAME(const void *W, size_t ldw, const float *x, size_t ldx, float *y, size_t ldy,   \
                       int rows, int nb, int cols, bool acc)                                          \
    {                                                                                                 \
        if (nb >= 4)                                                                                  \
            ROWS4(W, ldw, x, ldx, y, ldy, rows, nb, cols, acc);                                       \
        else if (nb == 3)                                                                             \
            NAME##_nb(W, ldw, x, ldx, y, ldy, rows, 3, cols, acc);                                    \
        else if (nb == 2)                                                                             \
            NAME##_nb(W, ldw, x, ldx, y, ldy, rows, 2, cols, acc);                                    \
        else if (nb == 1)                                                                             \
            NAME##_nb(W, ldw, x, ldx, y, ldy, rows, 1, cols, acc);                                    \
    }

GEMM_LINEAR(gemm_f32_rows, gemm_f32_rows4, ld_f32, ldm_f32, 4)
GEMM_LINEAR(gemm_f16_rows, gemm_f16_rows4, ld_f16, ldm_f16, 2)
GEMM_LINEAR(gemm_bf16_rows, gemm_bf16_rows4, ld_bf16, ldm_bf16, 2)

/* ---- prefill: a packed, cache-blocked GEMM ------------------------------------------ */

/*
 * The blocking shared by the packed products: a thread's rows go in blocks
 * of MR (three 16-lane vectors), their columns in blocks of KC or KCX; each
 * block of weights is packed once, transposed so that one vector holds one
 * column (f32) or one pair of columns (bf16) of 16 rows, into a panel, and
 * every token of the call runs over it, NR at a time, with a tile of
 * 3 x NR accumulators and each token's value broadcast: no horizontal sums,
 * and the outputs of 16 rows are one vector store. Weights are read from
 * memory once per call, and the next block's rows are prefetched while
 * this one's tiles run.
 */
#define MR 48
#define NR 8
#define KC 128 /* columns (f32 path) or column pairs (bf16 path) per block, in an L1 panel on the stack */
/* Products longer than KC take blocks of up to KCX columns (or pairs) in a
 * panel in this thread's scratch (lms__qscratch_slot(1): 192 KiB, held in
 * L2): a tile then runs over up to 1024 columns (2048 for bf16 pairs) with
 * its accumulators in registers, and a row is read from the mapping in runs
 * of 2-4 KiB. Without the scratch (ENOMEM) the blocks are KC on the stack. */
#define KCX 1024

static inline T __mmask16 lanes(int n) { return n >= 16 ? 0xffff : n <= 0 ? 0 : (__mmask16)((1u << n) - 1); }

/*
 * The next block's weights, fetched into L2 while this block's tiles run
 * (48 row streams at once are more than the hardware prefetchers follow, and
 * the weights come from memory once per call): the block's rows [0, rl)
 * at src, ldb bytes apart, lines_per_row cache lines each, n lines a step
 * in row order.
 */
typedef struct pf_next {
    const uint8_t *src;
    size_t ldb;
    int rl, lines_per_row, row, line; /* the next line to fetch: line `line` of row `row` */
} pf_next;

static inline void pf_step(pf_next *f, int n)
{
    for (; n > 0 && f->row < f->rl; n--) {
        _mm_prefetch((const char *)f->src + (size_t)f->row * f->ldb + (size_t)f->line * 64, _MM_HINT_T1);
        if (++f->line == f->lines_per_row) {
            f->line = 0;
            f->row++;
        }
    }
}

/* The block after rows [r, r + MR) of column block k0 (kn wide): the next
 * rows of the same columns, or the first rows of the next columns (none
 * after the last). esz: bytes per weight element. */
static inline pf_next pf_after(const uint8_t *W, size_t ldw, size_t esz, int rows, int cols, int r, int k0, int kb)
{
    pf_next f = {NULL, ldw * esz, 0, 0, 0, 0};
    int nr = r + MR, nk = k0;
    if (nr >= rows) {
        nr = 0;
        nk = k0 + kb;
    }
    if (nk >= cols)
        return f;
    int kn = LMS_MIN(kb, cols - nk);
    f.src = W + ((size_t)nr * ldw + (size_t)nk) * esz;
    f.rl = LMS_MIN(MR, rows - nr);
    f.lines_per_row = (int)((kn * esz + 63) / 64);
    return f;
}

/* The panel of a product n columns (or column pairs) long, and its block width *kb: this
 * thread's scratch panel (KCX wide) when n > KC and it can be had, else `stack` (KC). */
static inline void *panel_for(void *stack, int n, int *kb)
{
    void *p = n > KC ? lms__qscratch_slot(1, (size_t)KCX * MR * 4) : NULL;
    *kb = LMS_MIN(p ? KCX : KC, n);
    return p ? p : stack;
}

/* Lines of the next block that each of a block's tiles (nb tokens, NR a tile) prefetches. */
static inline int pf_share(const pf_next *f, int nb)
{
    int tiles = (nb + NR - 1) / NR;
    return (f->rl * f->lines_per_row + tiles - 1) / tiles;
}

/* Stores or adds the 3 x nr tile c into y[t*ldy + 16g + i], for the rl rows left. */
static inline T __attribute__((always_inline)) void tile_out(__m512 c[3][NR], int nr, float *y, size_t ldy,
                                                              int rl, bool acc)
{
    for (int g = 0; g < 3; g++) {
        __mmask16 m = lanes(rl - 16 * g);
        if (!m)
            break;
        for (int t = 0; t < nr; t++) {
            float *o = y + (size_t)t * ldy + 16 * g;
            __m512 v = acc ? _mm512_add_ps(c[g][t], _mm512_maskz_loadu_ps(m, o)) : c[g][t];
            _mm512_mask_storeu_ps(o, m, v);
        }
    }
}

/*
 * A tile: the packed block wp[k*MR + row] (kn columns, or column pairs)
 * against nr tokens' x[t*ldx + k] broadcast, 3 x nr accumulators (VT: the
 * vector type the weights load as; MAC(c, a, b) adds a * b into c), and
 * NAME_N, which calls it with a constant nr (the loops unroll, the tile
 * lives in registers).
 */
#define TILE_IMPL(NAME, NAME_N, ATTR, WT, XT, VT, LOADW, BCAST, MAC)                                 \
    static inline ATTR __attribute__((always_inline)) void NAME(const WT *wp, int kn, const XT *x,    \
                                                                size_t ldx, int nr, float *y,         \
                                                                size_t ldy, int rl, bool acc)         \
    {                                                                                                 \
        __m512 c[3][NR];                                                                              \
        for (int g = 0; g < 3; g++)                                                                   \
            for (int t = 0; t < nr; t++) c[g][t] = _mm512_setzero_ps();                               \
        for (int k = 0; k < kn; k++) {                                                                \
            VT a0 = LOADW(wp + k * MR), a1 = LOADW(wp + k * MR + 16), a2 = LOADW(wp + k * MR + 32);   \
            for (int t = 0; t < nr; t++) {                                                            \
                VT b = BCAST(x[(size_t)t * ldx + k]);                                                 \
                c[0][t] = MAC(c[0][t], a0, b);                                                        \
                c[1][t] = MAC(c[1][t], a1, b);                                                        \
                c[2][t] = MAC(c[2][t], a2, b);                                                        \
            }                                                                                         \
        }                                                                                             \
        tile_out(c, nr, y, ldy, rl, acc);                                                             \
    }                                                                                                 \
    static ATTR void NAME_N(const WT *wp, int kn, const XT *x, size_t ldx, int nr, float *y, size_t ldy, \
                            int rl, bool acc)                                                         \
    {                                                                                                 \
        switch (nr) {                                                                                 \
        case 8: NAME(wp, kn, x, ldx, 8, y, ldy, rl, acc); break;                                      \
        case 7: NAME(wp, kn, x, ldx, 7, y, ldy, rl, acc); break;                                      \
        case 6: NAME(wp, kn, x, ldx, 6, y, ldy, rl, acc); break;                                      \
        case 5: NAME(wp, kn, x, ldx, 5, y, ldy, rl, acc); break;                                      \
        case 4: NAME(wp, kn, x, ldx, 4, y, ldy, rl, acc); break;                                      \
        case 3: NAME(wp, kn, x, ldx, 3, y, ldy, rl, acc); break;                                      \
        case 2: NAME(wp, kn, x, ldx, 2, y, ldy, rl, acc); break;                                      \
        default: NAME(wp, kn, x, ldx, 1, y, ldy, rl, acc); break;                                     \
        }                                                                                             \
    }

#define FMA_ACC(c, a, b) _mm512_fmadd_ps(a, b, c)
TILE_IMPL(tile_f32, tile_f32_n, T, float, float, __m512, _mm512_load_ps, _mm512_set1_ps, FMA_ACC)

/*
 * Packs rows [0, rl) x columns (or column pairs) [k0, k0 + kn) of W as
 * wp[k*MR + row], rows past rl 0; LOAD(W, ldw, row, k, mask) gives 16 of a
 * row's 32-bit elements from k on (widened f32, or bf16 pairs).
 */
#define PACK_IMPL(NAME, ATTR, ST, LOAD)                                                               \
    static inline ATTR void NAME(const void *W, size_t ldw, int rl, int k0, int kn, ST *wp)           \
    {                                                                                                 \
        for (int g = 0; g < 3; g++)                                                                   \
            for (int k = 0; k < kn; k += 16) {                                                        \
                __mmask16 m = lanes(kn - k);                                                          \
                __m512i v[16];                                                                        \
                for (int i = 0; i < 16; i++) {                                                        \
                    int r = 16 * g + i;                                                               \
                    v[i] = r < rl ? LOAD(W, ldw, r, k0 + k, m) : _mm512_setzero_si512();              \
                }                                                                                     \
                lms__tr16(v);                                                                         \
                for (int j = 0; j < 16 && k + j < kn; j++) _mm512_store_si512(wp + (k + j) * MR + 16 * g, v[j]); \
            }                                                                                         \
    }

#define LOAD_F32(W, ldw, r, k, m) _mm512_castps_si512(ldm_f32((const float *)(W) + (size_t)(r) * (ldw), (size_t)(k), m))
#define LOAD_F16(W, ldw, r, k, m) _mm512_castps_si512(ldm_f16((const uint16_t *)(W) + (size_t)(r) * (ldw), (size_t)(k), m))
#define LOAD_BF16(W, ldw, r, k, m) _mm512_castps_si512(ldm_bf16((const uint16_t *)(W) + (size_t)(r) * (ldw), (size_t)(k), m))
PACK_IMPL(pack_f32, T, float, LOAD_F32)
PACK_IMPL(pack_f16, T, float, LOAD_F16)
PACK_IMPL(pack_bf16, T, float, LOAD_BF16)

/* Prefill (8 tokens or more) over f32/f16/bf16 weights; fewer tokens take the row kernels. */
#define GEMM_PACKED(NAME, ROWS, PACK, ESZ)                                                              \
    static T void NAME(const void *W, size_t ldw, const float *x, size_t ldx, float *y, size_t ldy,   \
                       int rows, int nb, int cols, bool acc)                                          \
    {                                                                                                 \
        if (nb < 8) {                                                                                 \
            ROWS(W, ldw, x, ldx, y, ldy, rows, nb, cols, acc);                                        \
            return;                                                                                   \
        }                                                                                             \
        float wps[KC * MR] __attribute__((aligned(64)));                                              \
        int kb;                                                                                       \
        float *wp = panel_for(wps, cols, &kb);                                                        \
        const uint8_t *Wb = W;                                                                        \
        for (int k0 = 0; k0 < cols; k0 += kb) {                                                       \
            int kn = LMS_MIN(kb, cols - k0);                                                          \
            for (int r = 0; r < rows; r += MR) {                                                      \
                int rl = LMS_MIN(MR, rows - r);                                                       \
                PACK(Wb + (size_t)r * ldw * ESZ, ldw, rl, k0, kn, wp);                                \
                pf_next f = pf_after(Wb, ldw, ESZ, rows, cols, r, k0, kb);                            \
                int per = pf_share(&f, nb);                                                           \
                for (int t = 0; t < nb; t += NR) {                                                    \
                    pf_step(&f, per);                                                                 \
                    tile_f32_n(wp, kn, x + (size_t)t * ldx + k0, ldx, LMS_MIN(NR, nb - t),            \
                               y + (size_t)t * ldy + r, ldy, rl, acc || k0 > 0);                      \
                }                                                                                     \
            }                                                                                         \
        }                                                                                             \
    }

GEMM_PACKED(gemm_f32, gemm_f32_rows, pack_f32, 4)
GEMM_PACKED(gemm_f16, gemm_f16_rows, pack_f16, 2)
GEMM_PACKED(gemm_bf16, gemm_bf16_rows, pack_bf16, 2)

#define AXPY_IMPL(NAME, LD, LDM)                                                                     \
    static T void NAME(float *y, const void *v, float a, int n)                                       \
    {                                                                                                 \
        __m512 av = _mm512_set1_ps(a);                                                                \
        int kf = n & ~15;                                                                             \
        for (int k = 0; k < kf; k += 16)                                                              \
            _mm512_storeu_ps(y + k, _mm512_fmadd_ps(LD(v, k), av, _mm512_loadu_ps(y + k)));            \
        if (n - kf) {                                                                                 \
            __mmask16 m = (__mmask16)((1u << (n - kf)) - 1);                                          \
            _mm512_mask_storeu_ps(y + kf, m, _mm512_fmadd_ps(LDM(v, kf, m), av, _mm512_maskz_loadu_ps(m, y + kf))); \
        }                                                                                             \
    }

AXPY_IMPL(axpy_f32, ld_f32, ldm_f32)
AXPY_IMPL(axpy_f16, ld_f16, ldm_f16)
AXPY_IMPL(axpy_bf16, ld_bf16, ldm_bf16)

/* 64 columns of y in four registers across all nv rows, then the next 64;
 * a tail of under 64 by masked 16s. */
#define AXPYN_IMPL(NAME, LD, LDM)                                                                    \
    static T void NAME(float *y, const void *v, size_t ldv, const float *a, int nv, int n)            \
    {                                                                                                 \
        int k = 0;                                                                                    \
        for (; k + 64 <= n; k += 64) {                                                                \
            __m512 y0 = _mm512_loadu_ps(y + k), y1 = _mm512_loadu_ps(y + k + 16);                      \
            __m512 y2 = _mm512_loadu_ps(y + k + 32), y3 = _mm512_loadu_ps(y + k + 48);                 \
            for (int j = 0; j < nv; j++) {                                                            \
                const uint8_t *vj = (const uint8_t *)v + (size_t)j * ldv;                             \
                __m512 aj = _mm512_set1_ps(a[j]);                                                     \
                y0 = _mm512_fmadd_ps(LD(vj, k), aj, y0);                                              \
                y1 = _mm512_fmadd_ps(LD(vj, k + 16), aj, y1);                                         \
                y2 = _mm512_fmadd_ps(LD(vj, k + 32), aj, y2);                                         \
                y3 = _mm512_fmadd_ps(LD(vj, k + 48), aj, y3);                                         \
            }                                                                                         \
            _mm512_storeu_ps(y + k, y0);                                                              \
            _mm512_storeu_ps(y + k + 16, y1);                                                         \
            _mm512_storeu_ps(y + k + 32, y2);                                                         \
            _mm512_storeu_ps(y + k + 48, y3);                                                         \
        }                                                                                             \
        for (; k < n; k += 16) {                                                                      \
            __mmask16 m = (__mmask16)(n - k >= 16 ? 0xffff : (1u << (n - k)) - 1);                   \
            __m512 acc = _mm512_maskz_loadu_ps(m, y + k);                                             \
            for (int j = 0; j < nv; j++)                                                              \
                acc = _mm512_fmadd_ps(LDM((const uint8_t *)v + (size_t)j * ldv, k, m), _mm512_set1_ps(a[j]), acc); \
            _mm512_mask_storeu_ps(y + k, m, acc);                                                     \
        }                                                                                             \
    }

AXPYN_IMPL(axpyn_f32, ld_f32, ldm_f32)
AXPYN_IMPL(axpyn_f16, ld_f16, ldm_f16)
AXPYN_IMPL(axpyn_bf16, ld_bf16, ldm_bf16)

/*
 * exp(x) for 16 lanes: x = n ln2 + r, |r| <= ln2/2 (ln2 in two parts),
 * exp(r) by its Taylor polynomial to r^7 (relative error under 1e-9 there),
 * times 2^n by vscalefps; x below -87.3 (exp under FLT_MIN) gives about 1e-38.
 */
static inline T __m512 exp16(__m512 x)
{
    x = _mm512_min_ps(_mm512_max_ps(x, _mm512_set1_ps(-87.3f)), _mm512_set1_ps(88.7f));
    __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                    _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
    __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693145751953125f), x);
    r = _mm512_fnmadd_ps(n, _mm512_set1_ps(1.428606765330187e-06f), r);
    __m512 p = _mm512_set1_ps(1.f / 5040);
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 720));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 120));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 24));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f / 6));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(0.5f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
    p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.f));
    return _mm512_scalef_ps(p, n);
}

static T float expsum(float *s, int n, float m)
{
    __m512 mv = _mm512_set1_ps(m), acc = _mm512_setzero_ps();
    for (int k = 0; k < n; k += 16) {
        __mmask16 msk = lanes(n - k);
        __m512 e = exp16(_mm512_sub_ps(_mm512_maskz_loadu_ps(msk, s + k), mv));
        _mm512_mask_storeu_ps(s + k, msk, e);
        acc = _mm512_mask_add_ps(acc, msk, acc, e);
    }
    return _mm512_reduce_add_ps(acc);
}

/* o = g / (1 + exp(t)) * u: SiLU with t = -g, GELU-tanh with t = -2z (0.5 (1 + tanh z) =
 * sigmoid(2z)); GELU a constant in each caller. */
static inline T __attribute__((always_inline)) void sigmoid_gate(float *o, const float *g, const float *u, int n,
                                                                  const bool gelu)
{
    const __m512 c1 = _mm512_set1_ps(-2.f * 0.7978845608028654f), c3 = _mm512_set1_ps(0.044715f);
    for (int k = 0; k < n; k += 16) {
        __mmask16 m = lanes(n - k);
        __m512 gv = _mm512_maskz_loadu_ps(m, g + k);
        /* SiLU: -g; GELU: -2 z = -2 sqrt(2 / pi) (g + 0.044715 g^3) */
        __m512 t = gelu ? _mm512_mul_ps(c1, _mm512_fmadd_ps(_mm512_mul_ps(c3, gv), _mm512_mul_ps(gv, gv), gv))
                        : _mm512_sub_ps(_mm512_setzero_ps(), gv);
        __m512 s = _mm512_div_ps(gv, _mm512_add_ps(_mm512_set1_ps(1.f), exp16(t)));
        _mm512_mask_storeu_ps(o + k, m, _mm512_mul_ps(s, _mm512_maskz_loadu_ps(m, u + k)));
    }
}

static T void silu_mul(float *o, const float *g, const float *u, int n) { sigmoid_gate(o, g, u, n, false); }
static T void gelu_mul(float *o, const float *g, const float *u, int n) { sigmoid_gate(o, g, u, n, true); }

static T double sumsq(const float *x, int n)
{
    __m512d a0 = _mm512_setzero_pd(), a1 = a0;
    for (int k = 0; k < n; k += 16) {
        __m512 v = _mm512_maskz_loadu_ps(lanes(n - k), x + k);
        __m512d lo = _mm512_cvtps_pd(_mm512_castps512_ps256(v));
        __m512d hi = _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(v), 1)));
        a0 = _mm512_fmadd_pd(lo, lo, a0);
        a1 = _mm512_fmadd_pd(hi, hi, a1);
    }
    return _mm512_reduce_add_pd(_mm512_add_pd(a0, a1));
}

static T void to_f16(const float *x, uint16_t *out, int n)
{
    for (int k = 0; k < n; k += 16) {
        __mmask16 m = lanes(n - k);
        __m256i h = _mm512_cvtps_ph(_mm512_maskz_loadu_ps(m, x + k), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
        _mm256_mask_storeu_epi16(out + k, m, h);
    }
}

static T void from_f16(const uint16_t *x, float *out, int n)
{
    for (int k = 0; k < n; k += 16) {
        __mmask16 m = lanes(n - k);
        _mm512_mask_storeu_ps(out + k, m, _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, x + k)));
    }
}

const lms__kernels lms__kernels_avx512 = {
    "avx512",
    {gemm_f32, gemm_f16, gemm_bf16},
    {axpy_f32, axpy_f16, axpy_bf16},
    NULL,
    NULL,
    {axpyn_f32, axpyn_f16, axpyn_bf16},
    expsum,
    silu_mul,
    gelu_mul,
    sumsq,
    to_f16,
    from_f16,
};

/* ---- AVX-512 BF16: bf16 weights x bf16 activations (vdpbf16ps) ------------------------ */

#define TB __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,fma,f16c")))


static inline TB __m512 dp(__m512 c, __m512i a, __m512i b) { return _mm512_dpbf16_ps(c, (__m512bh)a, (__m512bh)b); }

static TB void to_bf16(const float *x, uint16_t *out, int n)
{
    int k = 0;
    for (; k + 16 <= n; k += 16)
        _mm256_storeu_si256((__m256i *)(out + k), (__m256i)_mm512_cvtneps_pbh(_mm512_loadu_ps(x + k)));
    if (k < n) {
        __mmask16 m = lanes(n - k);
        _mm256_mask_storeu_epi16(out + k, m, (__m256i)_mm512_cvtneps_pbh(_mm512_maskz_loadu_ps(m, x + k)));
    }
}

/*
 * Fewer than 4 tokens (decode): the rows in memory order, one weight stream
 * per call with software prefetch PFB bytes ahead, each row's 32 columns
 * per vdpbf16ps against every token's row.
 */
static TB void gemm_xbf16_rows(const uint16_t *W, size_t ldw, const uint16_t *xb, size_t ldxb, float *y, size_t ldy,
                               int rows, int nb, int cols, bool acc)
{
    int np = cols / 2, nf = np & ~15;
    __mmask16 mt = lanes(np - nf);
    for (int r = 0; r < rows; r++) {
        const uint32_t *w = (const uint32_t *)(W + (size_t)r * ldw);
        for (int b = 0; b < nb; b++) {
            const uint32_t *x = (const uint32_t *)(xb + (size_t)b * ldxb);
            __m512 a0 = _mm512_setzero_ps(), a1 = a0;
            int p = 0;
            for (; p + 32 <= nf; p += 32) {
                _mm_prefetch((const char *)(w + p) + PFB, _MM_HINT_T0);
                _mm_prefetch((const char *)(w + p) + PFB + 64, _MM_HINT_T0);
                a0 = dp(a0, _mm512_loadu_si512(w + p), _mm512_loadu_si512(x + p));
                a1 = dp(a1, _mm512_loadu_si512(w + p + 16), _mm512_loadu_si512(x + p + 16));
            }
            if (p < nf) {
                _mm_prefetch((const char *)(w + p) + PFB, _MM_HINT_T0);
                a0 = dp(a0, _mm512_loadu_si512(w + p), _mm512_loadu_si512(x + p));
            }
            if (mt)
                a1 = dp(a1, _mm512_maskz_loadu_epi32(mt, w + nf), _mm512_maskz_loadu_epi32(mt, x + nf));
            store_out(y + (size_t)b * ldy + r, _mm512_reduce_add_ps(_mm512_add_ps(a0, a1)), acc);
        }
    }
}

#define LOAD_PAIRS(W, ldw, r, p, m) _mm512_maskz_loadu_epi32(m, (const uint32_t *)((const uint16_t *)(W) + (size_t)(r) * (ldw)) + (p))
#define BCAST_PAIR(v) _mm512_set1_epi32((int)(v))
PACK_IMPL(pack_pairs, TB, uint32_t, LOAD_PAIRS)
TILE_IMPL(tile_bf16, tile_bf16_n, TB, uint32_t, uint32_t, __m512i, _mm512_load_si512, BCAST_PAIR, dp)

/* Prefill (4 tokens or more): the bf16 pairs' packed product (GEMM_PACKED's blocking, vdpbf16ps).
 * Also what the amxbf16 set's tiles leave (kernels_amx.c). */
TB void lms__gemm_xbf16_avx512(const uint16_t *W, size_t ldw, const uint16_t *xb, size_t ldxb, float *y, size_t ldy,
                               int rows, int nb, int cols, bool acc)
{
    if (nb < 4) {
        gemm_xbf16_rows(W, ldw, xb, ldxb, y, ldy, rows, nb, cols, acc);
        return;
    }
    uint32_t wps[KC * MR] __attribute__((aligned(64)));
    const uint32_t *x = (const uint32_t *)xb;
    size_t ldx = ldxb / 2;
    int np = cols / 2;
    int kb;
    uint32_t *wp = panel_for(wps, np, &kb);
    for (int p0 = 0; p0 < np; p0 += kb) {
        int pn = LMS_MIN(kb, np - p0);
        for (int r = 0; r < rows; r += MR) {
            int rl = LMS_MIN(MR, rows - r);
            pack_pairs(W + (size_t)r * ldw, ldw, rl, p0, pn, wp);
            /* in 16-bit elements: column pairs 2 * p0 on */
            pf_next f = pf_after((const uint8_t *)W, ldw, 2, rows, cols, r, 2 * p0, 2 * kb);
            int per = pf_share(&f, nb);
            for (int t = 0; t < nb; t += NR) {
                pf_step(&f, per);
                tile_bf16_n(wp, pn, x + (size_t)t * ldx + p0, ldx, LMS_MIN(NR, nb - t), y + (size_t)t * ldy + r, ldy,
                            rl, acc || p0 > 0);
            }
        }
    }
}

#define XBF16_SET(NAME, GEMM_XBF16)                                                                   \
    {                                                                                                 \
        NAME, {gemm_f32, gemm_f16, gemm_bf16}, {axpy_f32, axpy_f16, axpy_bf16}, GEMM_XBF16, to_bf16,  \
            {axpyn_f32, axpyn_f16, axpyn_bf16}, expsum, silu_mul, gelu_mul, sumsq, to_f16, from_f16,  \
    }
const lms__kernels lms__kernels_avx512bf16 = XBF16_SET("avx512bf16", lms__gemm_xbf16_avx512);
/* avx512bf16 with the prefill products of BF16 weights on AMX tiles (kernels_amx.c) */
const lms__kernels lms__kernels_amxbf16 = XBF16_SET("amxbf16", lms__gemm_xbf16_amx);
#endif
