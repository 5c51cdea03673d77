/*
 * tests/quant/test_quant.c - the reference (de)quantizers of quant/ against
 * implementations we did not write, bit for bit:
 *   - GGUF types: gguf-py's numpy dequantizers and quantizers (PyPI `gguf`,
 *     run live by tests/quant/gguf_ref.py into a scratch folder), and its
 *     table of block sizes;
 *   - MLX affine: mlx.core.quantize / dequantize outputs committed in
 *     tests/fixtures/quant/mlx_affine.bin (tests/reference/make_quant_fixtures.py);
 * plus the dtype table's byte sizes and what gguf-py cannot check (Q4_K and
 * Q8_K quantization: bounded error, exact on zero blocks).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/quant.h"
#include "testutil.h"

static char *refdir;

static int setup(void **state)
{
    (void)state;
    refdir = lms_test_tmpdir("gguf-ref");
    int st = lms_test_sh(NULL, "python3 '%s/tests/quant/gguf_ref.py' '%s'", lms_test_src(), refdir);
    if (st != 0) {
        fprintf(stderr, "tests/quant/gguf_ref.py failed (status %d): the gguf package (PyPI) is required\n", st);
        return -1;
    }
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    lms_test_rmrf(refdir);
    free(refdir);
    return 0;
}

static void *slurp_ref(const char *name, const char *ext, size_t *len)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.%s", refdir, name, ext);
    void *p = lms_test_slurp(path, len);
    if (!p)
        fail_msg("cannot read %s", path);
    return p;
}

static lms_dtype dt(const char *name)
{
    lms_dtype t;
    assert_int_equal(lms_dtype_from_name(name, &t), 0);
    return t;
}

/* ---- the dtype table ------------------------------------------------------------------------- */

static void block_sizes_equal_gguf_py_and_sizes_come_from_blocks(void **state)
{
    (void)state;
    static const struct {
        const char *name;
        uint32_t elems, bytes; /* ggml's (= gguf.GGML_QUANT_SIZES) */
    } want[] = {{"Q4_0", 32, 18}, {"Q4_1", 32, 20}, {"Q5_0", 32, 22}, {"Q5_1", 32, 24}, {"Q8_0", 32, 34},
                {"Q2_K", 256, 84}, {"Q3_K", 256, 110}, {"Q4_K", 256, 144}, {"Q5_K", 256, 176},
                {"Q6_K", 256, 210}, {"Q8_K", 256, 292}};
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        lms_dtype t = dt(want[i].name);
        assert_true(lms_dtype_is_quantized(t));
        assert_int_equal(lms_dtype_size(t), 0);
        assert_int_equal(lms_dtype_block_elems(t, 0), want[i].elems);
        assert_int_equal(lms_dtype_block_bytes(t, 0), want[i].bytes);
        uint32_t g;
        lms_dtype back;
        assert_true(lms__dtype_to_ggml(t, &g));
        assert_true(lms__dtype_from_ggml(g, &back));
        assert_int_equal(back, t);
        assert_string_equal(lms__ggml_type_name(g), want[i].name);
        uint64_t shape[2] = {3, 2 * want[i].elems}, n;
        assert_int_equal(lms_dtype_nbytes(t, 0, shape, 2, &n), 0);
        assert_int_equal(n, 3 * 2 * want[i].bytes);
        shape[1] = want[i].elems + 1; /* a partial block */
        assert_int_equal(lms_dtype_nbytes(t, 0, shape, 2, &n), LMS_EINVAL);
        assert_non_null(strstr(lms_last_error(), "whole number"));
        assert_int_equal(lms_dtype_nbytes(t, 0, shape, 0, &n), LMS_EINVAL); /* a scalar */
    }
    /* MLX affine: bits x 32 codes per 4 x bits bytes */
    uint64_t shape[2] = {5, 128}, n;
    for (uint32_t bits = 1; bits <= 9; bits++) {
        int rc = lms_dtype_nbytes(LMS_DTYPE_MLX_AFFINE, bits, shape, 2, &n);
        if (bits == 1 || bits == 7 || bits == 9) {
            assert_int_equal(rc, LMS_EINVAL);
        } else {
            assert_int_equal(rc, 0);
            assert_int_equal(n, 5 * 128 * bits / 8);
        }
    }
    /* plain dtypes keep their element sizes; the mask bit of every code fits 32 bits */
    assert_int_equal(lms_dtype_size(LMS_DTYPE_BF16), 2);
    assert_false(lms_dtype_is_quantized(LMS_DTYPE_F32));
    assert_true(LMS_DTYPE_COUNT_ <= 32);
    uint64_t big[2] = {UINT64_MAX / 2, 64};
    assert_int_equal(lms_dtype_nbytes(LMS_DTYPE_Q8_0, 0, big, 2, &n), LMS_ERANGE);
}

/* ---- against gguf-py -------------------------------------------------------------------------- */

static void dequantizers_equal_gguf_py_bit_for_bit(void **state)
{
    (void)state;
    static const char *const names[] = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0",
                                        "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        lms_dtype t = dt(names[i]);
        size_t in_len, out_len;
        uint8_t *in = slurp_ref(names[i], "deq.in", &in_len);
        float *want = slurp_ref(names[i], "deq.out", &out_len);
        size_t n = out_len / 4;
        assert_int_equal(in_len / lms_dtype_block_bytes(t, 0) * lms_dtype_block_elems(t, 0), n);
        float *got = malloc(out_len);
        assert_int_equal(lms__dequant_row(t, in, got, n), 0);
        size_t bad = 0, first = n;
        for (size_t k = 0; k < n; k++)
            if (memcmp(&got[k], &want[k], 4)) {
                if (!bad)
                    first = k;
                bad++;
            }
        if (bad)
            fail_msg("%s: %zu of %zu values differ from gguf-py (first at %zu: %.9g, want %.9g)", names[i], bad, n,
                     first, got[first], want[first]);
        /* a partial block is refused */
        assert_int_equal(lms__dequant_row(t, in, got, lms_dtype_block_elems(t, 0) - 1), LMS_EINVAL);
        free(got);
        free(in);
        free(want);
    }
}

static void quantizers_write_the_bytes_of_gguf_py(void **state)
{
    (void)state;
    static const char *const names[] = {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q8_0"};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        lms_dtype t = dt(names[i]);
        size_t in_len, out_len;
        float *x = slurp_ref(names[i], "q.in", &in_len);
        uint8_t *want = slurp_ref(names[i], "q.out", &out_len);
        size_t n = in_len / 4;
        assert_int_equal(n / 32 * lms_dtype_block_bytes(t, 0), out_len);
        uint8_t *got = malloc(out_len);
        assert_int_equal(lms__quant_row(t, x, got, n), 0);
        for (size_t k = 0; k < out_len; k++)
            if (got[k] != want[k])
                fail_msg("%s: byte %zu (block %zu, input %g) is %02x, gguf-py writes %02x", names[i], k,
                         k / lms_dtype_block_bytes(t, 0), x[k / lms_dtype_block_bytes(t, 0) * 32], got[k], want[k]);
        free(got);
        free(x);
        free(want);
    }
}

/* ---- what gguf-py cannot check: Q4_K, Q6_K and Q8_K quantization ---------------------------------
 * (their bytes are checked against llama-quantize's on real and random models by
 * tests/tools/test_llamacpp.py) */

static float frand(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (float)((double)(*s >> 11) / 9007199254740992.0) * 2.f - 1.f;
}

static void k_types_round_trip_within_their_step(void **state)
{
    (void)state;
    const size_t n = 256 * 12;
    float *x = malloc(n * 4), *y = malloc(n * 4);
    uint8_t *q = malloc(n / 256 * 292);
    uint64_t seed = 16;
    for (size_t i = 0; i < n; i++)
        x[i] = frand(&seed) * (i < 256 ? 1e-3f : i < 512 ? 50.f : 1.f) + (i >= 1024 && i < 1280 ? 3.f : 0.f);
    memset(x + 1280, 0, 256 * 4); /* a zero super-block */
    for (size_t i = 1536; i < 1792; i++)
        x[i] = fabsf(x[i]);       /* all positive: the min is 0 */
    static const lms_dtype ts[] = {LMS_DTYPE_Q4_K, LMS_DTYPE_Q6_K, LMS_DTYPE_Q8_K};
    for (size_t k = 0; k < 3; k++) {
        assert_int_equal(lms__quant_row(ts[k], x, q, n), 0);
        assert_int_equal(lms__dequant_row(ts[k], q, y, n), 0);
        for (size_t b = 0; b < n / 256; b++) {
            float amax = 0, err = 0, mn = x[b * 256], mx = x[b * 256];
            for (size_t i = b * 256; i < (b + 1) * 256; i++) {
                amax = fmaxf(amax, fabsf(x[i]));
                err = fmaxf(err, fabsf(y[i] - x[i]));
                mn = fminf(mn, x[i]);
                mx = fmaxf(mx, x[i]);
            }
            /* 4-bit codes over a sub-block's range (and 6-bit scales): within ~1/12 of the
             * super-block's span; 6-bit symmetric codes of 16-groups (8-bit scales): about
             * half a step of amax/32, plus codes x scales times the f16 rounding of a
             * subnormal d (2^-25); 8-bit: half a step of amax/127 */
            float bound = ts[k] == LMS_DTYPE_Q4_K   ? (mx - fminf(mn, 0.f)) / 12.f
                          : ts[k] == LMS_DTYPE_Q6_K ? amax / 40.f + 32.f * 127.f * 0x1p-25f
                                                    : amax / 127.f * 0.5001f;
            if (err > bound)
                fail_msg("%s super-block %zu: error %g above %g", lms_dtype_name(ts[k]), b, err, bound);
            if (amax == 0)
                for (size_t i = b * 256; i < (b + 1) * 256; i++)
                    assert_true(y[i] == 0);
        }
    }
    free(x);
    free(y);
    free(q);
}

/* ---- against mlx -------------------------------------------------------------------------------- */

static size_t esz(lms_dtype t) { return t == LMS_DTYPE_F32 ? 4 : 2; }

static float load(const uint8_t *p, size_t i, lms_dtype t)
{
    float f;
    if (t == LMS_DTYPE_F32) {
        memcpy(&f, p + 4 * i, 4);
        return f;
    }
    uint16_t h;
    memcpy(&h, p + 2 * i, 2);
    return t == LMS_DTYPE_F16 ? lms__f16_to_f32(h) : lms__bf16_to_f32(h);
}

static void mlx_affine_equals_mlx_quantize_and_dequantize(void **state)
{
    (void)state;
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/quant/mlx_affine.bin", lms_test_src());
    size_t len, off = 0, cases = 0;
    uint8_t *f = (uint8_t *)lms_test_slurp(path, &len);
    assert_non_null(f);
    while (off < len) {
        assert_memory_equal(f + off, "MLXQ", 4);
        uint32_t h[5];
        memcpy(h, f + off + 4, 20);
        off += 24;
        uint32_t bits = h[0], group = h[1], rows = h[3], cols = h[4];
        lms_dtype sdt = (lms_dtype)h[2];
        size_t n = (size_t)rows * cols, ng = n / group, cb = n * bits / 8;
        const float *w = (const float *)(f + off);
        const uint8_t *codes = f + off + 4 * n, *scales = codes + cb, *biases = scales + ng * esz(sdt),
                      *deq = biases + ng * esz(sdt);
        off += 4 * n + cb + 2 * ng * esz(sdt) + n * esz(sdt);
        assert_true(off <= len);
        uint8_t *qc = calloc(1, cb), *qs = calloc(ng, 4), *qb = calloc(ng, 4);
        float *y = malloc(cols * 4);
        for (uint32_t r = 0; r < rows; r++) {
            size_t rg = cols / group;
            lms__mlx_quant_row(w + (size_t)r * cols, cols, bits, group, sdt, qc + (size_t)r * cols * bits / 8,
                               qs + r * rg * esz(sdt), qb + r * rg * esz(sdt));
        }
        if (memcmp(qc, codes, cb))
            fail_msg("bits %u group %u %s: codes differ from mlx.core.quantize", bits, group, lms_dtype_name(sdt));
        if (memcmp(qs, scales, ng * esz(sdt)) || memcmp(qb, biases, ng * esz(sdt)))
            fail_msg("bits %u group %u %s: scales or biases differ from mlx.core.quantize", bits, group,
                     lms_dtype_name(sdt));
        for (uint32_t r = 0; r < rows; r++) {
            size_t rg = cols / group;
            lms__mlx_dequant_row(codes + (size_t)r * cols * bits / 8, bits, group, scales + r * rg * esz(sdt),
                                 biases + r * rg * esz(sdt), sdt, y, cols);
            for (uint32_t c = 0; c < cols; c++) {
                float want = load(deq, (size_t)r * cols + c, sdt), got = y[c];
                if (memcmp(&got, &want, 4))
                    fail_msg("bits %u group %u %s: dequantized [%u][%u] = %.9g, mlx gives %.9g", bits, group,
                             lms_dtype_name(sdt), r, c, got, want);
            }
        }
        free(qc);
        free(qs);
        free(qb);
        free(y);
        cases++;
    }
    assert_int_equal(cases, 6 * 3 * 3);
    free(f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(block_sizes_equal_gguf_py_and_sizes_come_from_blocks),
        cmocka_unit_test(dequantizers_equal_gguf_py_bit_for_bit),
        cmocka_unit_test(quantizers_write_the_bytes_of_gguf_py),
        cmocka_unit_test(k_types_round_trip_within_their_step),
        cmocka_unit_test(mlx_affine_equals_mlx_quantize_and_dequantize),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
