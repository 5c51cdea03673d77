/*
 * tests/engine/test_qkernels.c - the quantized CPU kernels (engine/cpu/quant.h)
 * of every set this CPU has (generic, avx2, avx512), every stored type, on
 * awkward shapes (1 row, odd row counts, rows of 1 to many blocks, nb 1..9):
 *   - each result is the float32 dot of the dequantized weights (quant/'s
 *     reference dequantizers) with x, within the bound the 8-bit activation
 *     rounding allows (sum over blocks of |w|_1 * d_x / 2, more for the f16
 *     scales of 32-element blocks: engine/cpu/quant.h) and float slack;
 *   - the 32-element activation blocks are ggml's quantize_row_q8_1 bit for
 *     bit (q by 127 / amax rounded to nearest even, f16 d and d * sum(q));
 *   - the SIMD sets equal the portable one up to float summation order;
 *   - acc adds to y; the pre-quantized entry (gemm_q) gives the same bits;
 *   - MLX affine (bits 2-8, groups 32/64/128, F32/F16/BF16 scales) equals
 *     the float dot of lms__mlx_dequant_row's values within float slack;
 *   - every set's activation quantizer (->qx) writes the portable one's
 *     bytes, on random rows and edge blocks (zeros, -0, one large value, a
 *     tie of +amax and -amax, subnormals, values at .5 steps after scaling).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/cpu/quant.h"
#include "testutil.h"

static uint64_t seed = 16;
static float frand(void)
{
    seed = seed * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(seed >> 11) / 9007199254740992.0) * 2.f - 1.f;
}

static const lms_dtype types[] = {LMS_DTYPE_Q4_0, LMS_DTYPE_Q4_1, LMS_DTYPE_Q5_0, LMS_DTYPE_Q5_1, LMS_DTYPE_Q8_0,
                                  LMS_DTYPE_Q2_K, LMS_DTYPE_Q3_K, LMS_DTYPE_Q4_K, LMS_DTYPE_Q5_K, LMS_DTYPE_Q6_K};

/* Random weight rows: quantized from floats where quant/ has a quantizer, else
 * random bytes with finite f16 scales. */
static void make_weights(lms_dtype t, uint8_t *w, int rows, int cols, size_t ldw)
{
    float *f = malloc((size_t)cols * 4);
    for (int r = 0; r < rows; r++) {
        uint8_t *row = w + (size_t)r * ldw;
        if (lms__quant_supported(t) && t != LMS_DTYPE_Q8_K) {
            for (int k = 0; k < cols; k++)
                f[k] = frand() * (k % 97 == 0 ? 8.f : 1.f) + (t == LMS_DTYPE_Q4_1 ? 0.3f : 0.f);
            if (r == 1)
                memset(f, 0, (size_t)cols * 4); /* a zero row */
            assert_int_equal(lms__quant_row(t, f, row, (size_t)cols), 0);
            continue;
        }
        uint32_t bb = lms_dtype_block_bytes(t, 0);
        for (size_t i = 0; i < (size_t)cols / 256 * bb; i++)
            row[i] = (uint8_t)(frand() * 128 + 128);
        for (int b = 0; b < cols / 256; b++) { /* sane super-block scales */
            uint8_t *blk = row + (size_t)b * bb;
            size_t off = t == LMS_DTYPE_Q2_K ? 80 : t == LMS_DTYPE_Q3_K ? 108 : t == LMS_DTYPE_Q6_K ? 208 : 0;
            lms__put_u16(blk + off, lms__f32_to_f16(0.01f + 0.02f * fabsf(frand())));
            if (t == LMS_DTYPE_Q2_K || t == LMS_DTYPE_Q5_K)
                lms__put_u16(blk + off + 2, lms__f32_to_f16(0.01f * fabsf(frand())));
        }
    }
    free(f);
}

/* y (the set's gemm), yg (the portable set's), yq (the set's gemm_q):
 * each within the 8-bit activation bound of the float dot of the
 * dequantized weights with x (y started at 0.25 with acc), y equal to yg
 * up to float summation order and to yq bit for bit (yg, yq may be NULL). */
static void check_against_dequantized(const lms__qkernels *ks, lms_dtype t, const uint8_t *w, size_t ldw, int rows,
                                      int cols, const float *x, size_t ldx,
                                      int nb, const float *y, const float *yg, const float *yq, size_t ldy, bool acc)
{
    bool k = lms_dtype_block_elems(t, 0) == 256;
    float *deq = malloc((size_t)cols * 4);
    int be = k ? 256 : 32;
    for (int r = 0; r < rows; r++) {
        assert_int_equal(lms__dequant_row(t, w + (size_t)r * ldw, deq, (size_t)cols), 0);
        for (int b = 0; b < nb; b++) {
            const float *xb = x + (size_t)b * ldx;
            double ref = acc ? 0.25 : 0, mag = 0, bound = 0;
            for (int blk = 0; blk < cols / be; blk++) {
                double amax = 0, w1 = 0;
                for (int i = blk * be; i < (blk + 1) * be; i++) {
                    ref += (double)deq[i] * xb[i];
                    mag += fabs((double)deq[i] * xb[i]);
                    amax = fmax(amax, fabs(xb[i]));
                    w1 += fabs(deq[i]);
                }
                if (k) {
                    bound += w1 * amax / 127 * 0.5;
                } else { /* 32-element blocks: d in f16, and the minimum's d * sum(q) too */
                    bound += w1 * amax / 127 * (0.5 + 127.0 / 2048);
                    if (t == LMS_DTYPE_Q4_1 || t == LMS_DTYPE_Q5_1) {
                        const uint8_t *wb = w + (size_t)r * ldw + (size_t)blk * lms_dtype_block_bytes(t, 0);
                        bound += fabs(lms__f16_to_f32(lms__get_u16(wb + 2))) * 32 * amax / 2048;
                    }
                }
            }
            float got = y[(size_t)b * ldy + r];
            double slack = 2e-5 * mag + 1e-6;
            if (fabs(got - ref) > bound + slack)
                fail_msg("%s %s rows %d cols %d nb %d: y[%d][%d] = %.7g, dequantized dot %.7g "
                         "(bound %.3g)",
                         ks->name, lms_dtype_name(t), rows, cols, nb, b, r, got, ref, bound);
            if (yg && fabs(got - yg[(size_t)b * ldy + r]) > slack)
                fail_msg("%s %s: %.7g differs from the portable kernel's %.7g", ks->name,
                         lms_dtype_name(t), got, yg[(size_t)b * ldy + r]);
            if (yq && memcmp(&got, &yq[(size_t)b * ldy + r], 4))
                fail_msg("%s %s: gemm_q (or the 2-thread split) gives other bits", ks->name, lms_dtype_name(t));
        }
    }
    free(deq);
}

static void check_set(const lms__qkernels *ks, const lms__qkernels *gen)
{
    static const int rowss[] = {1, 3, 7, 33};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        lms_dtype t = types[ti];
        bool k = lms_dtype_block_elems(t, 0) == 256;
        const int colss[] = {k ? 256 : 32, k ? 512 : 96, k ? 1280 : 288, k ? 256 : 4096};
        assert_non_null(ks->gemm[t]);
        assert_non_null(ks->gemm_q[t]);
        for (size_t ri = 0; ri < 4; ri++)
            for (size_t ci = 0; ci < 4; ci++)
                for (int nb = 1; nb <= 9; nb += (ri == 0 ? 1 : 4)) {
                    int rows = rowss[ri], cols = colss[ci];
                    uint64_t rb;
                    uint64_t cc = (uint64_t)cols;
                    assert_int_equal(lms_dtype_nbytes(t, 0, &cc, 1, &rb), 0);
                    size_t ldw = (size_t)rb + 64; /* rows need not be packed */
                    uint8_t *w = calloc((size_t)rows, ldw);
                    make_weights(t, w, rows, cols, ldw);
                    size_t ldx = (size_t)cols + 3, ldy = (size_t)rows + 2;
                    float *x = malloc((size_t)nb * ldx * 4), *y = malloc((size_t)nb * ldy * 4);
                    float *yg = malloc((size_t)nb * ldy * 4), *yq = malloc((size_t)nb * ldy * 4);
                    for (size_t i = 0; i < (size_t)nb * ldx; i++)
                        x[i] = frand() * (i % 13 == 0 ? 5.f : 1.f);
                    for (size_t i = 0; i < (size_t)nb * ldy; i++)
                        y[i] = yg[i] = yq[i] = 0.25f;
                    bool acc = (nb % 2) == 0;
                    ks->gemm[t](w, ldw, x, ldx, y, ldy, rows, nb, cols, acc);
                    gen->gemm[t](w, ldw, x, ldx, yg, ldy, rows, nb, cols, acc);
                    void *xq = malloc(lms__qx_row_bytes(t, cols) * (size_t)nb);
                    lms__qx_quantize(t, x, ldx, nb, cols, xq);
                    ks->gemm_q[t](w, ldw, xq, yq, ldy, rows, nb, cols, acc);
                    check_against_dequantized(ks, t, w, ldw, rows, cols, x, ldx, nb, y, yg, yq, ldy, acc);
                    for (int b = 0; b < nb; b++) /* nothing past the rows is touched */
                        assert_true(y[(size_t)b * ldy + rows] == 0.25f && y[(size_t)b * ldy + rows + 1] == 0.25f);
                    free(w);
                    free(x);
                    free(y);
                    free(yg);
                    free(yq);
                    free(xq);
                }
    }
}

static void check_mlx(const lms__qkernels *ks)
{
    static const lms_dtype sdts[] = {LMS_DTYPE_F32, LMS_DTYPE_F16, LMS_DTYPE_BF16};
    for (uint32_t bits = 2; bits <= 8; bits++) {
        if (bits == 7)
            continue;
        for (uint32_t g = 32; g <= 128; g *= 2)
            for (size_t si = 0; si < 3 * 3; si++) {
                /* 1 vector (decode), 3, and 70 (a panel of 64, then four and two); 2 to 12 groups a row */
                static const int nbs[] = {1, 3, 70};
                int rows = 5, cols = si / 3 == 1 ? 384 : 256, nb = nbs[si / 3];
                lms_dtype sdt = sdts[si % 3];
                size_t es = sdt == LMS_DTYPE_F32 ? 4 : 2, ldw = (size_t)cols * bits / 8, lds = (size_t)cols / g;
                uint8_t *w = malloc(ldw * rows), *sc = malloc(lds * rows * es), *bi = malloc(lds * rows * es);
                float *src = malloc((size_t)cols * 4), *deq = malloc((size_t)cols * 4);
                for (int r = 0; r < rows; r++) {
                    for (int k = 0; k < cols; k++)
                        src[k] = frand() * (r + 1);
                    lms__mlx_quant_row(src, (size_t)cols, bits, g, sdt, w + r * ldw, sc + r * lds * es,
                                       bi + r * lds * es);
                }
                /* y rows of rows + 2 floats: the two past the rows must stay as they are; every
                 * other configuration accumulates into y (0.25 before) */
                const int ldy = rows + 2;
                const bool acc = si % 2 == 1;
                float *x = malloc((size_t)nb * cols * 4), *y = malloc((size_t)nb * ldy * 4);
                for (int i = 0; i < nb * cols; i++)
                    x[i] = frand();
                for (int i = 0; i < nb * ldy; i++) /* without acc, an output the kernel does not write fails */
                    y[i] = i % ldy >= rows ? 0.25f : acc ? 0.25f : NAN;
                lms__mlx_mat m = {w, ldw, sc, bi, lds, sdt, bits, g};
                ks->mlx(&m, x, (size_t)cols, y, (size_t)ldy, rows, nb, cols, acc);
                for (int r = 0; r < rows; r++) {
                    /* the kernel's sum: s*q + b per element in float32, unrounded */
                    for (int k = 0; k < cols; k++) {
                        size_t bit = (size_t)k * bits;
                        const uint8_t *p = w + r * ldw;
                        uint32_t v = p[bit / 8] | (bit % 8 + bits > 8 ? (uint32_t)p[bit / 8 + 1] << 8 : 0);
                        uint32_t q = (v >> (bit % 8)) & ((1u << bits) - 1);
                        deq[k] = lms__mlx_scale(sc, (size_t)r * lds + (size_t)k / g, sdt) * (float)q +
                                 lms__mlx_scale(bi, (size_t)r * lds + (size_t)k / g, sdt);
                    }
                    for (int b = 0; b < nb; b++) {
                        double ref = acc ? 0.25 : 0, mag = 0;
                        for (int k = 0; k < cols; k++) {
                            ref += (double)deq[k] * x[b * cols + k];
                            mag += fabs((double)deq[k] * x[b * cols + k]);
                        }
                        if (!(fabs(y[b * ldy + r] - ref) <= 2e-5 * mag + 1e-6)) /* NaN fails too */
                            fail_msg("%s MLX %u-bit group %u %s%s: %.7g, dequantized dot %.7g", ks->name, bits, g,
                                     lms_dtype_name(sdt), acc ? " acc" : "", y[b * ldy + r], ref);
                    }
                }
                for (int b = 0; b < nb; b++)
                    assert_true(y[b * ldy + rows] == 0.25f && y[b * ldy + rows + 1] == 0.25f);
                free(w);
                free(sc);
                free(bi);
                free(src);
                free(deq);
                free(x);
                free(y);
            }
    }
}

static void every_set_matches_the_dequantized_dot(void **state)
{
    (void)state;
    const lms__qkernels *gen = lms__qkernels_by_name("generic");
    assert_non_null(gen);
    static const char *const names[] = {"generic", "avx2", "avx512"};
    int ran = 0;
    for (size_t i = 0; i < 3; i++) {
        const lms__qkernels *ks = lms__qkernels_by_name(names[i]);
        if (!ks) {
            printf("kernel set %s: not on this CPU\n", names[i]);
            continue;
        }
        check_set(ks, gen);
        check_mlx(ks);
        printf("kernel set %s: every type and shape within bounds\n", names[i]);
        ran++;
    }
    assert_true(ran >= 1);
    for (size_t i = 0; i < sizeof types / sizeof types[0]; i++)
        assert_true(lms__qkernel_supported(types[i]));
    assert_false(lms__qkernel_supported(LMS_DTYPE_BF16));
}

/* The products as the engine runs them: x quantized once, rows split into
 * chunks over a pool of `threads` workers (each with its own panel
 * scratch), chunk boundaries not on 16-row panels. */
typedef struct split_run {
    const lms__qkernels *ks;
    lms_dtype t;
    const uint8_t *w;
    size_t ldw, ldy;
    const void *xq;
    float *y;
    int rows, nb, cols, chunk;
    bool acc;
} split_run;

static void split_task(void *arg, size_t i, int worker)
{
    split_run *r = arg;
    (void)worker;
    int r0 = (int)i * r->chunk, n = r->rows - r0 < r->chunk ? r->rows - r0 : r->chunk;
    r->ks->gemm_q[r->t](r->w + (size_t)r0 * r->ldw, r->ldw, r->xq, r->y + r0, r->ldy, n, r->nb, r->cols, r->acc);
}

static void panels_match_the_dequantized_product_on_awkward_shapes(void **state)
{
    (void)state;
    static const lms_dtype ptypes[] = {LMS_DTYPE_Q8_0, LMS_DTYPE_Q4_0, LMS_DTYPE_Q5_0,
                                       LMS_DTYPE_Q4_K, LMS_DTYPE_Q5_K, LMS_DTYPE_Q6_K};
    /* rows: under a panel, one, one plus one, several plus 15; vectors: one
     * (decode), the register tile's 8 and past it; 32-element rows of 5, 7,
     * 33 blocks (not a multiple of the 4-block decode step), K rows of 1 and
     * 3 super-blocks */
    static const int rowss[] = {15, 16, 17, 47}, nbs[] = {1, 2, 8, 9, 23};
    static const char *const names[] = {"generic", "avx2", "avx512"};
    lms_pool *pools[2];
    assert_int_equal(lms__pool_create(1, &pools[0]), 0);
    assert_int_equal(lms__pool_create(2, &pools[1]), 0);
    for (size_t si = 0; si < 3; si++) {
        const lms__qkernels *ks = lms__qkernels_by_name(names[si]);
        if (!ks)
            continue;
        for (size_t ti = 0; ti < sizeof ptypes / sizeof ptypes[0]; ti++) {
            lms_dtype t = ptypes[ti];
            bool k = lms_dtype_block_elems(t, 0) == 256;
            const int colss[] = {k ? 256 : 160, k ? 768 : 224, k ? 768 : 1056};
            for (size_t ri = 0; ri < 4; ri++)
                for (size_t ci = 0; ci < 3; ci++)
                    for (size_t ni = 0; ni < 5; ni++) {
                        int rows = rowss[ri], cols = colss[ci], nb = nbs[ni];
                        uint64_t rb, cc = (uint64_t)cols;
                        assert_int_equal(lms_dtype_nbytes(t, 0, &cc, 1, &rb), 0);
                        size_t ldw = (size_t)rb, ldx = (size_t)cols + 5, ldy = (size_t)rows + 1;
                        uint8_t *w = malloc((size_t)rows * ldw); /* packed: the last row ends the buffer */
                        make_weights(t, w, rows, cols, ldw);
                        float *x = malloc((size_t)nb * ldx * 4), *y[2];
                        for (size_t i = 0; i < (size_t)nb * ldx; i++)
                            x[i] = frand() * (i % 17 == 0 ? 6.f : 1.f);
                        void *xq = malloc(lms__qx_row_bytes(t, cols) * (size_t)nb);
                        lms__qx_quantize(t, x, ldx, nb, cols, xq);
                        bool acc = ni % 2 == 1;
                        for (int p = 0; p < 2; p++) {
                            y[p] = malloc((size_t)nb * ldy * 4);
                            for (size_t i = 0; i < (size_t)nb * ldy; i++)
                                y[p][i] = 0.25f;
                            /* chunks of 13 rows over 2 workers; one call over 1 */
                            split_run r = {ks, t, w, ldw, ldy, xq, y[p], rows, nb, cols, p ? 13 : rows, acc};
                            lms__pool_run(pools[p], (size_t)((rows + r.chunk - 1) / r.chunk), split_task, &r);
                        }
                        check_against_dequantized(ks, t, w, ldw, rows, cols, x, ldx, nb, y[0], NULL, y[1], ldy,
                                                  acc);
                        for (int b = 0; b < nb; b++)
                            assert_true(y[0][(size_t)b * ldy + rows] == 0.25f);
                        free(w);
                        free(x);
                        free(xq);
                        free(y[0]);
                        free(y[1]);
                    }
        }
        printf("kernel set %s: panel and decode paths within bounds, 1 and 2 threads alike\n", ks->name);
    }
    lms__pool_destroy(pools[0]);
    lms__pool_destroy(pools[1]);
}

/* A row of 1024 of edge blocks for block size be (32 or 256), then random values. */
static void edge_row(float *x, int n, int be, int seed_case)
{
    for (int i = 0; i < n; i++)
        x[i] = frand() * (i % 11 == 0 ? 30.f : 1.f);
    switch (seed_case) {
    case 0: memset(x, 0, (size_t)be * 4); break;                             /* a zero block */
    case 1: for (int i = 0; i < be; i++) x[i] = -0.f; break;                 /* -0 */
    case 2: for (int i = 0; i < be; i++) x[i] = i == be / 2 ? -1e6f : 1e-3f; break; /* one large value */
    case 3: x[3] = 50.f; x[7] = -50.f; x[be - 1] = 50.f; break;             /* a tie of +amax and -amax: the first wins */
    case 4: for (int i = 0; i < be; i++) x[i] = (float)(i % 5) * 1e-40f; break; /* subnormals */
    default: for (int i = 0; i < be; i++) x[i] = (float)(i - be / 2) * 0.5f; break; /* halves after scaling */
    }
}

static void activation_quantizers_write_the_portable_bytes(void **state)
{
    (void)state;
    const lms__qkernels *gen = lms__qkernels_by_name("generic");
    static const char *const names[] = {"avx2", "avx512"};
    enum { N = 1024 };
    float x[N];
    for (size_t i = 0; i < 2; i++) {
        const lms__qkernels *ks = lms__qkernels_by_name(names[i]);
        if (!ks)
            continue;
        for (int k = 0; k < 2; k++) {
            lms_dtype form = k ? LMS_DTYPE_Q8_K : LMS_DTYPE_Q8_0;
            size_t bytes = k ? N / 256 * sizeof(lms__q8k) : N / 32 * sizeof(lms__q8a);
            for (int c = 0; c < 6; c++) {
                edge_row(x, N, k ? 256 : 32, c);
                uint8_t *a = calloc(1, bytes), *b = calloc(1, bytes);
                gen->qx(form, x, N, a);
                ks->qx(form, x, N, b);
                if (memcmp(a, b, bytes))
                    fail_msg("%s: %s activations (case %d) differ from the portable quantizer's", ks->name,
                             k ? "Q8_K" : "32-element", c);
                free(a);
                free(b);
            }
        }
        printf("kernel set %s: activation quantizer equals the portable one\n", ks->name);
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_set_matches_the_dequantized_dot),
        cmocka_unit_test(panels_match_the_dequantized_product_on_awkward_shapes),
        cmocka_unit_test(activation_quantizers_write_the_portable_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
