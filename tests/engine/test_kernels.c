/*
 * tests/engine/test_kernels.c - the 16/32-bit weight kernels
 * (engine/cpu/kernels*.c) of every set this CPU has, on awkward shapes
 * (rows that are not whole blocks of 16 or 48, columns that are not whole
 * vectors, 1 to 20 tokens: the decode, 4-row and packed prefill paths, the
 * tails of the 8-token tiles), with strided x and y:
 *   - gemm[F32/F16/BF16] equals the double-precision dot of the weights'
 *     values with x, within float summation slack (1e-5 of sum |w x|);
 *   - gemm_xbf16 (AVX-512 BF16, and AMX tiles in the amxbf16 set) equals
 *     the double-precision dot with x rounded to bf16 by to_bf16 (round to
 *     nearest even, checked against lms__f32_to_bf16), within the same slack;
 *   - acc adds to y, other outputs are left alone;
 *   - axpyn (the attention's weighted sum of value rows) gives the bits of
 *     axpy row by row, on widths that are not whole 64s or 16s;
 *   - the optional element-wise kernels: expsum within 2 ulp of expf (and
 *     its sum that of its outputs), silu_mul and gelu_mul within 4 ulp of
 *     the formula in double (gelu_mul also within the conditioning of
 *     exp(2z)), sumsq within double rounding of the scalar loop, to_f16 the
 *     bits of lms__f32_to_f16 (ties, subnormals, overflow), from_f16 the
 *     values of lms__f16_to_f32 (every kind of bits), on lengths that are
 *     not whole 16s, elements past n untouched;
 *   - where the CPU has AMX-BF16 and AVX-512 BF16 and Linux grants the
 *     tiles' state to this process, the amxbf16 set is offered and is the
 *     default (so the checks above ran its tiles, not skipped it).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#if defined(__x86_64__)
#include <sys/syscall.h>
#include <unistd.h>
#endif

#include "engine/internal.h"
#include "testutil.h"

static uint64_t seed = 19;
static float frand(void)
{
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(seed >> 11) / 9007199254740992.0) * 2.f - 1.f;
}

static double wval(lms_dtype dt, const void *W, size_t i)
{
    if (dt == LMS_DTYPE_F32)
        return ((const float *)W)[i];
    uint16_t h = ((const uint16_t *)W)[i];
    return dt == LMS_DTYPE_F16 ? lms__f16_to_f32(h) : lms__bf16_to_f32(h);
}

/* One shape through one kernel; xbf: through gemm_xbf16. */
static void check_shape(const lms__kernels *k, lms_dtype dt, bool xbf, int rows, int nb, int cols, bool acc)
{
    size_t ldw = (size_t)cols + 3 * (dt != LMS_DTYPE_BF16 || !xbf), ldx = (size_t)cols + 5, ldy = (size_t)rows + 7;
    size_t esz = dt == LMS_DTYPE_F32 ? 4 : 2;
    if (xbf)
        ldw = (size_t)cols + 2; /* even: each row's pairs stay 4-byte aligned */
    uint8_t *W = malloc((size_t)rows * ldw * esz);
    float *x = malloc(sizeof(float) * nb * ldx), *y = malloc(sizeof(float) * nb * ldy);
    float *y0 = malloc(sizeof(float) * nb * ldy);
    uint16_t *xb = malloc(2 * (size_t)nb * (ldx + 1));
    size_t ldxb = ldx + 1;
    for (size_t i = 0; i < (size_t)rows * ldw; i++) {
        float v = frand();
        if (dt == LMS_DTYPE_F32)
            ((float *)W)[i] = v;
        else
            ((uint16_t *)W)[i] = dt == LMS_DTYPE_F16 ? lms__f32_to_f16(v) : lms__f32_to_bf16(v);
    }
    for (size_t i = 0; i < (size_t)nb * ldx; i++) x[i] = frand() * 3;
    for (size_t i = 0; i < (size_t)nb * ldy; i++) y0[i] = y[i] = frand();
    if (xbf) {
        for (int b = 0; b < nb; b++) {
            k->to_bf16(x + (size_t)b * ldx, xb + (size_t)b * ldxb, cols);
            for (int c = 0; c < cols; c++)
                assert_int_equal(xb[(size_t)b * ldxb + c], lms__f32_to_bf16(x[(size_t)b * ldx + c]));
        }
        k->gemm_xbf16((const uint16_t *)W, ldw, xb, ldxb, y, ldy, rows, nb, cols, acc);
    } else {
        k->gemm[lms__dt_index(dt)](W, ldw, x, ldx, y, ldy, rows, nb, cols, acc);
    }
    for (int b = 0; b < nb; b++)
        for (size_t r = 0; r < ldy; r++) {
            size_t o = (size_t)b * ldy + r;
            if (r >= (size_t)rows) {
                assert_true(y[o] == y0[o]); /* past the rows: untouched */
                continue;
            }
            double s = 0, m = 0;
            for (int c = 0; c < cols; c++) {
                double xv = xbf ? lms__bf16_to_f32(xb[(size_t)b * ldxb + c]) : x[(size_t)b * ldx + c];
                double p = wval(dt, W, r * ldw + c) * xv;
                s += p;
                m += fabs(p);
            }
            if (acc)
                s += y0[o];
            if (fabs(y[o] - s) > 1e-5 * (m + fabs(y0[o])) + 1e-6) {
                printf("%s %s%s rows %d nb %d cols %d acc %d: y[%d][%zu] = %.9g, want %.9g\n", k->name,
                       lms_dtype_name(dt), xbf ? " (bf16 x)" : "", rows, nb, cols, acc, b, r, y[o], s);
                fail();
            }
        }
    free(W);
    free(x);
    free(y);
    free(y0);
    free(xb);
}

static void kernels_equal_the_double_dot_on_awkward_shapes(void **state)
{
    (void)state;
    const char *names[] = {"amxbf16", "avx512bf16", "avx512", "avx2", "generic"};
    const lms_dtype dts[] = {LMS_DTYPE_F32, LMS_DTYPE_F16, LMS_DTYPE_BF16};
    const int rows[] = {1, 5, 16, 47, 49, 100}, nbs[] = {1, 2, 3, 4, 7, 8, 9, 17, 20}, cols[] = {2, 30, 64, 290, 576};
    int sets = 0;
    for (size_t s = 0; s < LMS_ARRAY_LEN(names); s++) {
        const lms__kernels *k = lms__kernels_by_name(names[s]);
        if (!k)
            continue;
        sets++;
        for (size_t d = 0; d < LMS_ARRAY_LEN(dts); d++)
            for (int xbf = 0; xbf < 2; xbf++) {
                if (xbf && (!k->gemm_xbf16 || dts[d] != LMS_DTYPE_BF16))
                    continue;
                for (size_t r = 0; r < LMS_ARRAY_LEN(rows); r++)
                    for (size_t n = 0; n < LMS_ARRAY_LEN(nbs); n++)
                        for (size_t c = 0; c < LMS_ARRAY_LEN(cols); c++)
                            check_shape(k, dts[d], xbf, rows[r], nbs[n], cols[c], (r + n + c) % 2 == 1);
            }
    }
    assert_true(sets >= 1); /* generic at least */
}

/* A product longer than one column block (KC) and taller than one row block (MR), prefill-sized. */
static void packed_prefill_spans_column_and_row_blocks(void **state)
{
    (void)state;
    const char *names[] = {"amxbf16", "avx512bf16", "avx512"};
    for (size_t s = 0; s < LMS_ARRAY_LEN(names); s++) {
        const lms__kernels *k = lms__kernels_by_name(names[s]);
        if (!k)
            continue;
        check_shape(k, LMS_DTYPE_BF16, false, 150, 33, 1000, false);
        check_shape(k, LMS_DTYPE_F16, false, 150, 33, 1000, true);
        if (k->gemm_xbf16) {
            check_shape(k, LMS_DTYPE_BF16, true, 150, 33, 1000, true);
            /* amxbf16's tiles: three column panels (the last partial), token tiles in a pair, alone
             * and a tail, row tiles in a pair, alone and a tail; and whole tiles only */
            check_shape(k, LMS_DTYPE_BF16, true, 83, 53, 1088, false);
            check_shape(k, LMS_DTYPE_BF16, true, 48, 64, 544, true);
            check_shape(k, LMS_DTYPE_BF16, true, 300, 40, 608, true); /* two blocks of packed rows */
        }
    }
}

/* axpyn over nv rows of width n (ldv apart) equals nv axpy calls bit for bit. */
static void axpyn_equals_axpy_row_by_row(void **state)
{
    (void)state;
    const char *names[] = {"amxbf16", "avx512bf16", "avx512", "avx2", "generic"};
    const lms_dtype dts[] = {LMS_DTYPE_F32, LMS_DTYPE_F16, LMS_DTYPE_BF16};
    const int ns[] = {1, 15, 64, 100, 128, 130}, nvs[] = {1, 2, 7, 33};
    int ran = 0;
    for (size_t s = 0; s < LMS_ARRAY_LEN(names); s++) {
        const lms__kernels *k = lms__kernels_by_name(names[s]);
        if (!k)
            continue;
        for (size_t d = 0; d < LMS_ARRAY_LEN(dts); d++) {
            if (!k->axpyn[d])
                continue;
            ran++;
            size_t es = dts[d] == LMS_DTYPE_F32 ? 4 : 2;
            for (size_t ni = 0; ni < LMS_ARRAY_LEN(ns); ni++)
                for (size_t vi = 0; vi < LMS_ARRAY_LEN(nvs); vi++) {
                    int n = ns[ni], nv = nvs[vi];
                    size_t ldv = (size_t)n * es + 36; /* rows apart, as value rows in a KV page */
                    uint8_t *v = malloc(ldv * (size_t)nv);
                    float *a = malloc((size_t)nv * 4), *y = malloc((size_t)(n + 1) * 4);
                    float *yr = malloc((size_t)(n + 1) * 4);
                    for (int j = 0; j < nv; j++) {
                        a[j] = frand();
                        for (int i = 0; i < n; i++) {
                            float f = frand() * 3;
                            uint8_t *p = v + (size_t)j * ldv + (size_t)i * es;
                            if (es == 4)
                                memcpy(p, &f, 4);
                            else
                                lms__put_u16(p, dts[d] == LMS_DTYPE_F16 ? lms__f32_to_f16(f) : lms__f32_to_bf16(f));
                        }
                    }
                    for (int i = 0; i <= n; i++)
                        y[i] = yr[i] = frand();
                    k->axpyn[d](y, v, ldv, a, nv, n);
                    for (int j = 0; j < nv; j++)
                        k->axpy[d](yr, v + (size_t)j * ldv, a[j], n);
                    if (memcmp(y, yr, (size_t)(n + 1) * 4))
                        fail_msg("%s %s axpyn n %d nv %d differs from axpy row by row", k->name,
                                 lms_dtype_name(dts[d]), n, nv);
                    free(v);
                    free(a);
                    free(y);
                    free(yr);
                }
        }
    }
    printf("axpyn checked for %d kernel set x dtype pairs\n", ran);
}

/* n random values in [-lim, lim], some specials mixed in. */
static void fill(float *x, int n, float lim)
{
    for (int i = 0; i < n; i++) x[i] = frand() * lim;
}

static void elementwise_kernels_match_the_scalar_forms(void **state)
{
    (void)state;
    const char *names[] = {"amxbf16", "avx512bf16", "avx512", "avx2", "generic"};
    const int ns[] = {1, 15, 16, 17, 100, 1000};
    int ran = 0;
    for (size_t s = 0; s < LMS_ARRAY_LEN(names); s++) {
        const lms__kernels *k = lms__kernels_by_name(names[s]);
        if (!k)
            continue;
        for (size_t ni = 0; ni < LMS_ARRAY_LEN(ns); ni++) {
            int n = ns[ni];
            float *x = malloc((n + 1) * 4), *e = malloc((n + 1) * 4), *u = malloc((n + 1) * 4);
            uint16_t *h = malloc((n + 1) * 2);
            if (k->expsum) {
                ran++;
                fill(x, n, 30);
                x[0] = -100; /* below exp's float range: ~0 */
                memcpy(e, x, (n + 1) * 4);
                float m = 2.5f, sum = k->expsum(e, n, m);
                double want_sum = 0;
                for (int i = 0; i < n; i++) {
                    double w = expf(x[i] - m);
                    if (fabs(e[i] - w) > 2.5e-7 * w + 1e-37)
                        fail_msg("%s expsum n %d: exp(%g) = %.9g, want %.9g", k->name, n, x[i] - m, e[i], w);
                    want_sum += e[i];
                }
                assert_true(e[n] == x[n]);
                assert_true(fabs(sum - want_sum) <= 1e-6 * want_sum);
            }
            if (k->silu_mul) {
                ran++;
                fill(x, n, 20);
                fill(u, n + 1, 3);
                x[0] = -120; /* exp(120) past float: silu ~ 0 */
                e[n] = 42;
                k->silu_mul(e, x, u, n);
                for (int i = 0; i < n; i++) {
                    double w = (double)x[i] / (1.0 + exp(-(double)x[i])) * u[i];
                    if (fabs(e[i] - w) > 5e-7 * fabs(w) + 1e-30)
                        fail_msg("%s silu_mul n %d: silu(%g) * %g = %.9g, want %.9g", k->name, n, x[i], u[i], e[i], w);
                }
                assert_true(e[n] == 42);
            }
            if (k->gelu_mul) {
                ran++;
                fill(x, n, 12);
                fill(u, n + 1, 3);
                x[0] = -60; /* exp(2 z) far past float: gelu ~ 0 */
                e[n] = 42;
                k->gelu_mul(e, x, u, n);
                for (int i = 0; i < n; i++) {
                    double g = x[i], z = 0.7978845608028654 * (g + 0.044715 * g * g * g);
                    /* 0.5 g (1 + tanh z) without its cancellation in double for z << 0 */
                    double w = (z < 0 ? g * exp(2 * z) / (1 + exp(2 * z)) : 0.5 * g * (1.0 + tanh(z))) * u[i];
                    /* plus the conditioning of exp(2 z): z itself carries float rounding */
                    if (fabs(e[i] - w) > (5e-7 + 2.4e-7 * fabs(2 * z)) * fabs(w) + 1e-30)
                        fail_msg("%s gelu_mul n %d: gelu(%g) * %g = %.9g, want %.9g", k->name, n, x[i], u[i], e[i], w);
                }
                assert_true(e[n] == 42);
            }
            if (k->sumsq) {
                ran++;
                fill(x, n, 1000);
                double want = 0;
                for (int i = 0; i < n; i++) want += (double)x[i] * x[i];
                assert_true(fabs(k->sumsq(x, n) - want) <= 1e-13 * want);
            }
            if (k->to_f16) {
                ran++;
                fill(x, n, 70000);
                if (n > 4) {
                    x[1] = 3e-6f;   /* subnormal in f16 */
                    x[2] = 1.0009765625f + 0.00048828125f; /* a tie: 1 + 2^-10 + 2^-11 */
                    x[3] = -65520.f; /* rounds to -inf */
                    x[4] = 1e-9f;   /* underflows to 0 */
                }
                h[n] = 0x1234;
                k->to_f16(x, h, n);
                for (int i = 0; i < n; i++)
                    if (h[i] != lms__f32_to_f16(x[i]))
                        fail_msg("%s to_f16 n %d: %.9g gave %04x, want %04x", k->name, n, x[i], h[i], lms__f32_to_f16(x[i]));
                assert_int_equal(h[n], 0x1234);
            }
            if (k->from_f16) {
                ran++;
                for (int i = 0; i < n; i++) { /* any bits: subnormals, inf, NaN */
                    frand();
                    h[i] = (uint16_t)(seed >> 48);
                }
                if (n > 2) {
                    h[0] = 0x0001; /* the smallest subnormal */
                    h[1] = 0xfc00; /* -inf */
                }
                e[n] = 42;
                k->from_f16(h, e, n);
                for (int i = 0; i < n; i++) {
                    float w = lms__f16_to_f32(h[i]);
                    if (memcmp(&e[i], &w, 4) && !(isnan(e[i]) && isnan(w)))
                        fail_msg("%s from_f16 n %d: %04x gave %.9g, want %.9g", k->name, n, h[i], e[i], w);
                }
                assert_true(e[n] == 42);
            }
            free(x);
            free(e);
            free(u);
            free(h);
        }
    }
    printf("element-wise kernels checked: %d (kernel set x length)\n", ran);
}

static void amx_set_is_offered_where_the_cpu_and_kernel_allow_it(void **state)
{
    (void)state;
#if defined(__x86_64__)
    __builtin_cpu_init();
    bool cpu = __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-bf16") &&
               __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
               __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512f") &&
               __builtin_cpu_supports("fma");
    /* ARCH_REQ_XCOMP_PERM for XFEATURE_XTILEDATA, asked here independently of the library */
    bool granted = cpu && syscall(SYS_arch_prctl, 0x1023, 18) == 0;
    const lms__kernels *k = lms__kernels_by_name("amxbf16");
    if (!granted) {
        printf("no AMX here (cpu %d): amxbf16 %s\n", cpu, k ? "offered" : "not offered");
        assert_null(k);
        return;
    }
    assert_non_null(k);
    assert_string_equal(k->name, "amxbf16");
    if (!getenv("LMSTORE_KERNELS") && !getenv("LMSTORE_BF16_ACT"))
        assert_ptr_equal(lms__kernels_best(), k);
#endif
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(kernels_equal_the_double_dot_on_awkward_shapes),
        cmocka_unit_test(packed_prefill_spans_column_and_row_blocks),
        cmocka_unit_test(axpyn_equals_axpy_row_by_row),
        cmocka_unit_test(elementwise_kernels_match_the_scalar_forms),
        cmocka_unit_test(amx_set_is_offered_where_the_cpu_and_kernel_allow_it),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
