/*
 * bench/bench_qkernels.c - the quantized CPU kernels (engine/cpu/quant.h)
 * on one thread: a ROWS x COLS matrix of each stored type (and bf16 through
 * the engine's kernel, for scale) times NB activation vectors, repeated;
 * prints the median time per product, the weight bytes read per second and
 * the multiply-adds per second. The matrix (64 MiB of bf16 by default)
 * exceeds the caches, as a decode step's weights do.
 *
 *   bench_qkernels [--rows R] [--cols C] [--nb N] [--reps K] [--set generic|avx2|avx512]
 *                  [--cpu-time 1] [--only "Q8_0 Q4_K ..."] [--preq 1]
 * --cpu-time 1 times this thread's CPU time; --preq 1 quantizes x once
 * beforehand and times the product alone (gemm_q, as the engine calls it).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/cpu/quant.h"
#include "engine/internal.h"

/* CLOCK_MONOTONIC, or this thread's CPU time with --cpu-time (steadier on a
 * loaded machine: time spent waiting for a core is not counted) */
static clockid_t clock_id = CLOCK_MONOTONIC;

static double now(void)
{
    struct timespec ts;
    clock_gettime(clock_id, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int rows = 4096, cols = 8192, nb = 1, reps = 15, preq = 0;
    const char *set = NULL, *only = NULL;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--rows")) rows = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--cols")) cols = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--nb")) nb = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps")) reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--set")) set = argv[i + 1];
        else if (!strcmp(argv[i], "--cpu-time")) clock_id = atoi(argv[i + 1]) ? CLOCK_THREAD_CPUTIME_ID : CLOCK_MONOTONIC;
        else if (!strcmp(argv[i], "--only")) only = argv[i + 1];
        else if (!strcmp(argv[i], "--preq")) preq = atoi(argv[i + 1]);
    }
    if (cols % 256 || rows < 1 || nb < 1 || reps < 1) {
        fprintf(stderr, "bench_qkernels: COLS must be a multiple of 256\n");
        return 2;
    }
    const lms__qkernels *ks = set ? lms__qkernels_by_name(set) : lms__qkernels_best();
    if (!ks) {
        fprintf(stderr, "bench_qkernels: set %s is not available on this CPU\n", set);
        return 2;
    }
    float *f = malloc((size_t)cols * 4), *x = malloc((size_t)nb * cols * 4), *y = malloc((size_t)nb * rows * 4);
    for (int i = 0; i < cols; i++)
        f[i] = (float)((i * 2654435761u) % 1000) / 500.f - 1.f;
    for (int i = 0; i < nb * cols; i++)
        x[i] = (float)((i * 40503u) % 1000) / 500.f - 1.f;
    printf("# %d x %d, nb %d, 1 thread, set %s, median of %d\n", rows, cols, nb, ks->name, reps);
    printf("%-6s %10s %10s %10s %10s\n", "type", "ms", "min ms", "GB/s", "GMAC/s");
    static const lms_dtype types[] = {LMS_DTYPE_BF16, LMS_DTYPE_Q8_0, LMS_DTYPE_Q4_0, LMS_DTYPE_Q4_1,
                                      LMS_DTYPE_Q5_0, LMS_DTYPE_Q4_K, LMS_DTYPE_Q5_K, LMS_DTYPE_Q6_K,
                                      LMS_DTYPE_MLX_AFFINE, LMS_DTYPE_MLX_AFFINE};
    for (size_t ti = 0; ti < sizeof types / sizeof types[0]; ti++) {
        lms_dtype t = types[ti];
        uint32_t bits = ti + 1 == sizeof types / sizeof types[0] ? 8 : 4;
        uint64_t c = (uint64_t)cols, rb;
        lms_dtype_nbytes(t, bits, &c, 1, &rb);
        uint8_t *w = malloc((size_t)rb * rows);
        size_t lds = (size_t)cols / 64;
        uint16_t *sc = malloc(lds * rows * 2), *bi = malloc(lds * rows * 2);
        for (int r = 0; r < rows; r++) {
            uint8_t *row = w + (size_t)r * rb;
            if (t == LMS_DTYPE_BF16)
                for (int k = 0; k < cols; k++) ((uint16_t *)row)[k] = lms__f32_to_bf16(f[k]);
            else if (t == LMS_DTYPE_MLX_AFFINE)
                lms__mlx_quant_row(f, (size_t)cols, bits, 64, LMS_DTYPE_BF16, row, sc + r * lds, bi + r * lds);
            else if (lms__quant_supported(t))
                lms__quant_row(t, f, row, (size_t)cols);
            else
                for (size_t i = 0; i < rb; i++) row[i] = (uint8_t)(i * 7 + r); /* Q5_K, Q6_K: any bytes */
        }
        lms__mlx_mat m = {w, (size_t)rb, sc, bi, lds, LMS_DTYPE_BF16, bits, 64};
        char name[16];
        snprintf(name, sizeof name, "%s", t == LMS_DTYPE_MLX_AFFINE ? (bits == 4 ? "mlx4" : "mlx8") : lms_dtype_name(t));
        if (only && !strstr(only, name)) {
            free(w);
            free(sc);
            free(bi);
            continue;
        }
        double *ts = malloc((size_t)reps * sizeof *ts);
        void *xq = NULL;
        if (preq && lms__qkernel_supported(t)) { /* the product alone, x quantized once beforehand */
            xq = malloc(lms__qx_row_bytes(t, cols) * (size_t)nb);
            lms__qx_quantize(t, x, (size_t)cols, nb, cols, xq);
        }
        for (int k = 0; k <= reps; k++) {
            double t0 = now();
            if (t == LMS_DTYPE_BF16)
                lms__kernels_best()->gemm[2](w, (size_t)cols, x, (size_t)cols, y, (size_t)rows, rows, nb, cols, false);
            else if (t == LMS_DTYPE_MLX_AFFINE)
                ks->mlx(&m, x, (size_t)cols, y, (size_t)rows, rows, nb, cols, false);
            else if (xq)
                ks->gemm_q[t](w, (size_t)rb, xq, y, (size_t)rows, rows, nb, cols, false);
            else
                ks->gemm[t](w, (size_t)rb, x, (size_t)cols, y, (size_t)rows, rows, nb, cols, false);
            if (k) /* the first run warms up */
                ts[k - 1] = now() - t0;
        }
        qsort(ts, (size_t)reps, sizeof *ts, cmp_d);
        double med = ts[reps / 2];
        printf("%-6s %10.3f %10.3f %10.2f %10.2f\n", name, med * 1e3, ts[0] * 1e3, (double)rb * rows / med / 1e9,
               (double)rows * cols * nb / med / 1e9);
        free(w);
        free(sc);
        free(bi);
        free(ts);
        free(xq);
    }
    free(f);
    free(x);
    free(y);
    return 0;
}
