/*
 * engine/cpu/kernels_avx2.c - AVX2 + FMA + F16C kernels for CPUs without
 * AVX-512: the same contract as kernels_avx512.c (see engine/internal.h,
 * lms__gemm_fn), 8 lanes wide, 4 weight rows per pass sharing each x load.
 */
#if defined(__x86_64__)
#include <immintrin.h>

#include "engine/internal.h"

#define T __attribute__((target("avx2,fma,f16c")))

static inline T __m256 ld_f32(const void *p, size_t i) { return _mm256_loadu_ps((const float *)p + i); }
static inline T __m256 ld_f16(const void *p, size_t i)
{
    return _mm256_cvtph_ps(_mm_loadu_si128((const __m128i *)((const uint16_t *)p + i)));
}
static inline T __m256 ld_bf16(const void *p, size_t i)
{
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
static inline float sc_f32(const void *p, size_t i) { return ((const float *)p)[i]; }
static inline float sc_f16(const void *p, size_t i) { return lms__f16_to_f32(((const uint16_t *)p)[i]); }
static inline float sc_bf16(const void *p, size_t i) { return lms__bf16_to_f32(((const uint16_t *)p)[i]); }

static inline T float hsum(__m256 v)
{
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
}

static inline void store_out(float *y, float v, bool acc) { *y = acc ? *y + v : v; }

#define GEMM_IMPL(NAME, LD, SC, ESZ)                                                                 \
    static T void NAME(const void *W, size_t ldw, const float *x, size_t ldx, float *y, size_t ldy,   \
                       int rows, int nb, int cols, bool acc)                                          \
    {                                                                                                 \
        const uint8_t *Wb = W;                                                                        \
        int kf = cols & ~7;                                                                           \
        int r = 0;                                                                                    \
        for (; r + 4 <= rows; r += 4) {                                                               \
            const void *w0 = Wb + (size_t)(r + 0) * ldw * ESZ, *w1 = Wb + (size_t)(r + 1) * ldw * ESZ; \
            const void *w2 = Wb + (size_t)(r + 2) * ldw * ESZ, *w3 = Wb + (size_t)(r + 3) * ldw * ESZ; \
            for (int b = 0; b < nb; b++) {                                                            \
                const float *xb = x + (size_t)b * ldx;                                                \
                __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;                           \
                for (int k = 0; k < kf; k += 8) {                                                     \
                    __m256 xv = _mm256_loadu_ps(xb + k);                                              \
                    a0 = _mm256_fmadd_ps(LD(w0, k), xv, a0); a1 = _mm256_fmadd_ps(LD(w1, k), xv, a1); \
                    a2 = _mm256_fmadd_ps(LD(w2, k), xv, a2); a3 = _mm256_fmadd_ps(LD(w3, k), xv, a3); \
                }                                                                                     \
                float s0 = hsum(a0), s1 = hsum(a1), s2 = hsum(a2), s3 = hsum(a3);                     \
                for (int k = kf; k < cols; k++) {                                                     \
                    s0 += SC(w0, k) * xb[k]; s1 += SC(w1, k) * xb[k];                                 \
                    s2 += SC(w2, k) * xb[k]; s3 += SC(w3, k) * xb[k];                                 \
                }                                                                                     \
                float *yb = y + (size_t)b * ldy + r;                                                  \
                store_out(yb, s0, acc); store_out(yb + 1, s1, acc);                                   \
                store_out(yb + 2, s2, acc); store_out(yb + 3, s3, acc);                               \
            }                                                                                         \
        }                                                                                             \
        for (; r < rows; r++) {                                                                       \
            const void *w0 = Wb + (size_t)r * ldw * ESZ;                                              \
            for (int b = 0; b < nb; b++) {                                                            \
                const float *xb = x + (size_t)b * ldx;                                                \
                __m256 a0 = _mm256_setzero_ps();                                                      \
                for (int k = 0; k < kf; k += 8) a0 = _mm256_fmadd_ps(LD(w0, k), _mm256_loadu_ps(xb + k), a0); \
                float s0 = hsum(a0);                                                                  \
                for (int k = kf; k < cols; k++) s0 += SC(w0, k) * xb[k];                              \
                store_out(y + (size_t)b * ldy + r, s0, acc);                                          \
            }                                                                                         \
        }                                                                                             \
    }

GEMM_IMPL(gemm_f32, ld_f32, sc_f32, 4)
GEMM_IMPL(gemm_f16, ld_f16, sc_f16, 2)
GEMM_IMPL(gemm_bf16, ld_bf16, sc_bf16, 2)

#define AXPY_IMPL(NAME, LD, SC)                                                                      \
    static T void NAME(float *y, const void *v, float a, int n)                                       \
    {                                                                                                 \
        __m256 av = _mm256_set1_ps(a);                                                                \
        int kf = n & ~7;                                                                              \
        for (int k = 0; k < kf; k += 8)                                                               \
            _mm256_storeu_ps(y + k, _mm256_fmadd_ps(LD(v, k), av, _mm256_loadu_ps(y + k)));            \
        for (int k = kf; k < n; k++) y[k] += a * SC(v, k);                                            \
    }

AXPY_IMPL(axpy_f32, ld_f32, sc_f32)
AXPY_IMPL(axpy_f16, ld_f16, sc_f16)
AXPY_IMPL(axpy_bf16, ld_bf16, sc_bf16)

const lms__kernels lms__kernels_avx2 = {
    "avx2",
    {gemm_f32, gemm_f16, gemm_bf16},
    {axpy_f32, axpy_f16, axpy_bf16},
    NULL,
    NULL,    {NULL, NULL, NULL}, /* axpy row by row */
    NULL,    NULL, NULL, NULL, NULL, NULL,
};
#endif
