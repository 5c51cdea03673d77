/*
 * engine/cpu/kernels.c - the portable kernels and the run-time choice of the
 * best kernel set for this CPU (AMX tiles with AVX-512 BF16, AVX-512 with
 * BF16, AVX-512, then AVX2/FMA/F16C, then portable C), overridable with
 * LMSTORE_KERNELS for
 * tests and benchmarks. The AVX-512 BF16 set rounds the activations of BF16
 * weights' products to bf16 (as llama.cpp does for BF16 weights);
 * LMSTORE_BF16_ACT=0 keeps them f32 (the exact products, same results as
 * the avx512 set). The amxbf16 set computes the same rounded products, its
 * prefill on AMX tiles.
 */
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "engine/internal.h"

/* lms__bf16_to_f32, lms__f32_to_bf16, lms__f16_to_f32, lms__f32_to_f16: common/half.c */

void lms__row_to_f32(const lms__wt *w, uint32_t row, float *out)
{
    size_t off = (size_t)row * w->cols;
    if (w->dt == LMS_DTYPE_F32) {
        memcpy(out, (const float *)w->p + off, (size_t)w->cols * 4);
    } else if (w->dt == LMS_DTYPE_F16) {
        const uint16_t *p = (const uint16_t *)w->p + off;
        for (uint32_t i = 0; i < w->cols; i++) out[i] = lms__f16_to_f32(p[i]);
    } else {
        const uint16_t *p = (const uint16_t *)w->p + off;
        for (uint32_t i = 0; i < w->cols; i++) out[i] = lms__bf16_to_f32(p[i]);
    }
}

/* ---- portable kernels ----------------------------------------------------------------- */

static inline float ld(const void *p, size_t i, int dti)
{
    if (dti == 0)
        return ((const float *)p)[i];
    if (dti == 1)
        return lms__f16_to_f32(((const uint16_t *)p)[i]);
    return lms__bf16_to_f32(((const uint16_t *)p)[i]);
}

static inline void gemm_generic(int dti, size_t esz, const void *W, size_t ldw, const float *x, size_t ldx,
                                float *y, size_t ldy, int rows, int nb, int cols, bool acc)
{
    for (int r = 0; r < rows; r++) {
        const uint8_t *w = (const uint8_t *)W + (size_t)r * ldw * esz;
        for (int b = 0; b < nb; b++) {
            const float *xb = x + (size_t)b * ldx;
            float s[4] = {0, 0, 0, 0};
            int k = 0;
            for (; k + 4 <= cols; k += 4)
                for (int j = 0; j < 4; j++) s[j] += ld(w, k + j, dti) * xb[k + j];
            for (; k < cols; k++) s[0] += ld(w, k, dti) * xb[k];
            float v = (s[0] + s[1]) + (s[2] + s[3]);
            float *o = y + (size_t)b * ldy + r;
            *o = acc ? *o + v : v;
        }
    }
}

static void gemm_f32(const void *W, size_t ldw, const float *x, size_t ldx, float *y, size_t ldy, int rows,
                     int nb, int cols, bool acc)
{
    gemm_generic(0, 4, W, ldw, x, ldx, y, ldy, rows, nb, cols, acc);
}
static void gemm_f16(const void *W, size_t ldw, const float *x, size_t ldx, float *y, size_t ldy, int rows,
                     int nb, int cols, bool acc)
{
    gemm_generic(1, 2, W, ldw, x, ldx, y, ldy, rows, nb, cols, acc);
}
static void gemm_bf16(const void *W, size_t ldw, const float *x, size_t ldx, float *y, size_t ldy, int rows,
                      int nb, int cols, bool acc)
{
    gemm_generic(2, 2, W, ldw, x, ldx, y, ldy, rows, nb, cols, acc);
}
static void axpy_f32(float *y, const void *v, float a, int n)
{
    for (int k = 0; k < n; k++) y[k] += a * ld(v, k, 0);
}
static void axpy_f16(float *y, const void *v, float a, int n)
{
    for (int k = 0; k < n; k++) y[k] += a * ld(v, k, 1);
}
static void axpy_bf16(float *y, const void *v, float a, int n)
{
    for (int k = 0; k < n; k++) y[k] += a * ld(v, k, 2);
}

static const lms__kernels kernels_generic = {
    "generic",
    {gemm_f32, gemm_f16, gemm_bf16},
    {axpy_f32, axpy_f16, axpy_bf16},
    NULL,
    NULL,    {NULL, NULL, NULL}, /* axpy row by row */
    NULL,    NULL, NULL, NULL, NULL, NULL,
};

/* ---- dispatch ---------------------------------------------------------------------------- */

#if defined(__x86_64__)
extern const lms__kernels lms__kernels_avx512;
extern const lms__kernels lms__kernels_avx512bf16;
extern const lms__kernels lms__kernels_amxbf16;
extern const lms__kernels lms__kernels_avx2;

static bool has_avx512(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("fma");
}
static bool has_avx512bf16(void) { return has_avx512() && __builtin_cpu_supports("avx512bf16"); }
static bool has_amxbf16(void) { return has_avx512bf16() && lms__amx_usable(); }
static bool has_avx2(void)
{
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && __builtin_cpu_supports("f16c");
}
#endif

const lms__kernels *lms__kernels_by_name(const char *name)
{
    if (!strcmp(name, "generic"))
        return &kernels_generic;
#if defined(__x86_64__)
    if (!strcmp(name, "amxbf16") && has_amxbf16())
        return &lms__kernels_amxbf16;
    if (!strcmp(name, "avx512bf16") && has_avx512bf16())
        return &lms__kernels_avx512bf16;
    if (!strcmp(name, "avx512") && has_avx512())
        return &lms__kernels_avx512;
    if (!strcmp(name, "avx2") && has_avx2())
        return &lms__kernels_avx2;
#endif
    return NULL;
}

const lms__kernels *lms__kernels_best(void)
{
    const char *force = getenv("LMSTORE_KERNELS");
    if (force && *force) {
        const lms__kernels *k = lms__kernels_by_name(force);
        if (k)
            return k;
        lms__warn("LMSTORE_KERNELS=%s is not available on this CPU; choosing automatically", force);
    }
#if defined(__x86_64__)
    /* LMSTORE_BF16_ACT=0: BF16 weights with f32 activations (the exact products) */
    const char *act = getenv("LMSTORE_BF16_ACT");
    if (!(act && !strcmp(act, "0"))) {
        if (has_amxbf16())
            return &lms__kernels_amxbf16;
        if (has_avx512bf16())
            return &lms__kernels_avx512bf16;
    }
    if (has_avx512())
        return &lms__kernels_avx512;
    if (has_avx2())
        return &lms__kernels_avx2;
#endif
    return &kernels_generic;
}
