/*
 * engine/cpu/kernels_avx512.c - AVX-512 kernels (F + BW + VL, with F16C and
 * FMA): the matrix products of decode and prefill over 16-bit or f32 weights
 * read in place, and the V accumulation of attention. Chosen at run time by
 * kernels.c when the CPU has AVX-512; compiled with per-function target
 * attributes so the rest of the library stays baseline x86-64.
 *
 * Weights are widened to f32 in registers (bf16: shift into the high half;
 * f16: vcvtph2ps) and accumulated in f32 with FMA. Prefill tiles 4 weight
 * rows x 4 tokens so each widened weight vector feeds 4 FMAs.
 */
#if defined(__x86_64__)
#include <immintrin.h>

#include "engine/internal.h"

#define T __attribute__((target("avx512f,avx512bw,avx512vl,fma,f16c")))

/* software prefetch distance (elements) in the one-token path: decode streams
 * four weight rows at once, a pattern the hardware prefetcher follows late */
#define PF 512

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

GEMM_IMPL(gemm_f32, ld_f32, ldm_f32, 4)
GEMM_IMPL(gemm_f16_rows, ld_f16, ldm_f16, 2)
GEMM_IMPL(gemm_bf16_rows, ld_bf16, ldm_bf16, 2)

/*
 * Prefill over 16-bit weights: widen 4 rows x KC columns to f32 once into an
 * L1 buffer, then run the f32 kernel over every token of the block, so the
 * widening is paid once per row instead of once per 4 tokens. Partial sums
 * of later column blocks accumulate into y.
 */
#define KC 512
#define GEMM_WIDEN(NAME, ROWS, LD, LDM, ESZ)                                                         \
    static T void NAME(const void *W, size_t ldw, const float *x, size_t ldx, float *y, size_t ldy,   \
                       int rows, int nb, int cols, bool acc)                                          \
    {                                                                                                 \
        if (nb < 8) {                                                                                 \
            ROWS(W, ldw, x, ldx, y, ldy, rows, nb, cols, acc);                                        \
            return;                                                                                   \
        }                                                                                             \
        float wf[4 * KC] __attribute__((aligned(64)));                                                \
        for (int r = 0; r < rows; r += 4) {                                                           \
            int rl = LMS_MIN(4, rows - r);                                                            \
            for (int k0 = 0; k0 < cols; k0 += KC) {                                                   \
                int kl = LMS_MIN(KC, cols - k0), k16 = kl & ~15;                                      \
                __mmask16 m = (__mmask16)((1u << (kl - k16)) - 1);                                    \
                for (int i = 0; i < rl; i++) {                                                        \
                    const uint8_t *src = (const uint8_t *)W + ((size_t)(r + i) * ldw + k0) * ESZ;     \
                    for (int k = 0; k < k16; k += 16) _mm512_store_ps(wf + i * KC + k, LD(src, k));   \
                    if (m)                                                                            \
                        _mm512_mask_storeu_ps(wf + i * KC + k16, m, LDM(src, k16, m));                \
                }                                                                                     \
                gemm_f32(wf, KC, x + k0, ldx, y + r, ldy, rl, nb, kl, acc || k0 > 0);                 \
            }                                                                                         \
        }                                                                                             \
    }

GEMM_WIDEN(gemm_f16, gemm_f16_rows, ld_f16, ldm_f16, 2)
GEMM_WIDEN(gemm_bf16, gemm_bf16_rows, ld_bf16, ldm_bf16, 2)

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

const lms__kernels lms__kernels_avx512 = {
    "avx512",
    {gemm_f32, gemm_f16, gemm_bf16},
    {axpy_f32, axpy_f16, axpy_bf16},
};
#endif
