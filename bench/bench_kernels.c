/*
 * bench/bench_kernels.c - the 16/32-bit weight kernels (engine/cpu/kernels*.c)
 * on one thread: a ROWS x COLS matrix of DTYPE times NB activation rows,
 * repeated, through every kernel set this CPU has (for BF16 weights also the
 * bf16-activation product where the set has one). Times are the thread's
 * CPU time, so that a busy machine disturbs them less than wall time would;
 * prints the median per product, multiply-adds per second and weight bytes
 * per second.
 *
 * With --chunk R the product runs as the engine runs it: calls of R rows
 * each (a thread's share), in order, so that a matrix larger than the
 * caches streams its weights from memory once per product.
 *
 *   bench_kernels [--rows R] [--cols C] [--nb N] [--reps K] [--dtype bf16|f16|f32] [--chunk R]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/internal.h"

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int rows = 2048, cols = 2048, nb = 1, reps = 20, chunk = 0;
    lms_dtype dt = LMS_DTYPE_BF16;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--rows"))
            rows = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--cols"))
            cols = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--nb"))
            nb = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--chunk"))
            chunk = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--dtype"))
            dt = !strcmp(argv[i + 1], "f32") ? LMS_DTYPE_F32 : !strcmp(argv[i + 1], "f16") ? LMS_DTYPE_F16 : LMS_DTYPE_BF16;
        else {
            fprintf(stderr, "usage: bench_kernels [--rows R] [--cols C] [--nb N] [--reps K] [--dtype bf16|f16|f32] [--chunk R]\n");
            return 2;
        }
    }
    if (rows <= 0 || cols <= 0 || cols % 2 || nb <= 0 || reps <= 0 || chunk < 0) {
        fprintf(stderr, "bench_kernels: rows, nb, reps positive, cols positive and even, chunk not negative\n");
        return 2;
    }
    size_t esz = dt == LMS_DTYPE_F32 ? 4 : 2, wbytes = (size_t)rows * cols * esz;
    uint8_t *W = malloc(wbytes);
    float *x = malloc(sizeof(float) * nb * cols), *y = malloc(sizeof(float) * nb * rows);
    uint16_t *xb = malloc(2 * (size_t)nb * cols);
    double *t = malloc(sizeof(double) * reps);
    if (!W || !x || !y || !xb || !t)
        return 1;
    srand(1);
    for (size_t i = 0; i < (size_t)rows * cols; i++) {
        float v = (float)rand() / RAND_MAX - 0.5f;
        if (dt == LMS_DTYPE_F32)
            ((float *)W)[i] = v;
        else
            ((uint16_t *)W)[i] = dt == LMS_DTYPE_F16 ? lms__f32_to_f16(v) : lms__f32_to_bf16(v);
    }
    for (size_t i = 0; i < (size_t)nb * cols; i++) x[i] = (float)rand() / RAND_MAX - 0.5f;
    if (chunk == 0 || chunk > rows)
        chunk = rows;
    printf("# %d x %d %s, %d tokens, %d reps, calls of %d rows, one thread (thread CPU time)\n", rows, cols,
           lms_dtype_name(dt), nb, reps, chunk);
    const char *sets[] = {"amxbf16", "avx512bf16", "avx512", "avx2", "generic"};
    for (size_t s = 0; s < sizeof sets / sizeof *sets; s++) {
        const lms__kernels *k = lms__kernels_by_name(sets[s]);
        if (!k)
            continue;
        for (int bf = 0; bf < 2; bf++) {
            if (bf && (!k->gemm_xbf16 || dt != LMS_DTYPE_BF16))
                continue;
            for (int r = 0; r < reps; r++) {
                double t0 = cpu_now();
                if (bf)
                    for (int b = 0; b < nb; b++) k->to_bf16(x + (size_t)b * cols, xb + (size_t)b * cols, cols);
                for (int r0 = 0; r0 < rows; r0 += chunk) {
                    int n = rows - r0 < chunk ? rows - r0 : chunk;
                    const uint8_t *Wr = W + (size_t)r0 * cols * esz;
                    if (bf)
                        k->gemm_xbf16((const uint16_t *)Wr, cols, xb, cols, y + r0, rows, n, nb, cols, false);
                    else
                        k->gemm[lms__dt_index(dt)](Wr, cols, x, cols, y + r0, rows, n, nb, cols, false);
                }
                t[r] = cpu_now() - t0;
            }
            qsort(t, reps, sizeof *t, cmp_d);
            double m = t[reps / 2];
            printf("%-10s %-14s %9.3f ms  %7.1f GMAC/s  %6.1f GB/s of weights\n", k->name,
                   bf ? "bf16 x" : "f32 x", m * 1e3, (double)rows * cols * nb / m / 1e9, wbytes / m / 1e9);
        }
    }
    free(W);
    free(x);
    free(y);
    free(xb);
    free(t);
    return 0;
}
