/*
 * bench/membw.c - a STREAM-like read bandwidth probe: the physical limit the
 * engine's decode is measured against (decode reads every weight once per
 * token). T threads each sum their share of a buffer much larger than the
 * caches, with the widest loads the CPU has (the same instruction set the
 * engine's kernels use), repeated; prints the best and median GB/s.
 *
 *   membw [--threads T] [--mib N] [--reps R] [--json]
 */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#if defined(__x86_64__)
#include <immintrin.h>
#endif

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

#if defined(__x86_64__)
__attribute__((target("avx512f"))) static float sum_avx512(const float *p, size_t n)
{
    /* 8 independent sums over two cache lines per step, with software
     * prefetch ahead (as the engine's decode kernel does), so that the
     * probe is not slower than the code it is the limit for */
    __m512 a0 = _mm512_setzero_ps(), a1 = a0, a2 = a0, a3 = a0, a4 = a0, a5 = a0, a6 = a0, a7 = a0;
    for (size_t i = 0; i + 128 <= n; i += 128) {
        _mm_prefetch((const char *)(p + i + 1024), _MM_HINT_T0);
        _mm_prefetch((const char *)(p + i + 1024 + 16), _MM_HINT_T0);
        _mm_prefetch((const char *)(p + i + 1024 + 32), _MM_HINT_T0);
        _mm_prefetch((const char *)(p + i + 1024 + 48), _MM_HINT_T0);
        _mm_prefetch((const char *)(p + i + 1024 + 64), _MM_HINT_T0);
        _mm_prefetch((const char *)(p + i + 1024 + 80), _MM_HINT_T0);
        _mm_prefetch((const char *)(p + i + 1024 + 96), _MM_HINT_T0);
        _mm_prefetch((const char *)(p + i + 1024 + 112), _MM_HINT_T0);
        a0 = _mm512_add_ps(a0, _mm512_load_ps(p + i));
        a1 = _mm512_add_ps(a1, _mm512_load_ps(p + i + 16));
        a2 = _mm512_add_ps(a2, _mm512_load_ps(p + i + 32));
        a3 = _mm512_add_ps(a3, _mm512_load_ps(p + i + 48));
        a4 = _mm512_add_ps(a4, _mm512_load_ps(p + i + 64));
        a5 = _mm512_add_ps(a5, _mm512_load_ps(p + i + 80));
        a6 = _mm512_add_ps(a6, _mm512_load_ps(p + i + 96));
        a7 = _mm512_add_ps(a7, _mm512_load_ps(p + i + 112));
    }
    __m512 s = _mm512_add_ps(_mm512_add_ps(_mm512_add_ps(a0, a1), _mm512_add_ps(a2, a3)),
                             _mm512_add_ps(_mm512_add_ps(a4, a5), _mm512_add_ps(a6, a7)));
    return _mm512_reduce_add_ps(s);
}
__attribute__((target("avx2"))) static float sum_avx2(const float *p, size_t n)
{
    __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
    for (size_t i = 0; i + 32 <= n; i += 32) {
        a0 = _mm256_add_ps(a0, _mm256_load_ps(p + i));
        a1 = _mm256_add_ps(a1, _mm256_load_ps(p + i + 8));
        a2 = _mm256_add_ps(a2, _mm256_load_ps(p + i + 16));
        a3 = _mm256_add_ps(a3, _mm256_load_ps(p + i + 24));
    }
    __m256 s = _mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3));
    float o[8];
    _mm256_storeu_ps(o, s);
    return o[0] + o[1] + o[2] + o[3] + o[4] + o[5] + o[6] + o[7];
}
#endif
static float sum_c(const float *p, size_t n)
{
    float s[8] = {0};
    for (size_t i = 0; i + 8 <= n; i += 8)
        for (int j = 0; j < 8; j++) s[j] += p[i + j];
    return s[0] + s[1] + s[2] + s[3] + s[4] + s[5] + s[6] + s[7];
}

static float (*sum_fn)(const float *, size_t) = sum_c;
static const char *isa = "c";

typedef struct job {
    const float *p;
    size_t n;
    pthread_barrier_t *bar;
    int reps;
    double *secs; /* per rep, filled by thread 0 */
    float sink;
} job;

static void *worker(void *v)
{
    job *j = v;
    for (int r = 0; r < j->reps; r++) {
        pthread_barrier_wait(j->bar);
        double t = now();
        j->sink += sum_fn(j->p, j->n);
        pthread_barrier_wait(j->bar);
        if (j->secs)
            j->secs[r] = now() - t;
    }
    return NULL;
}

static int cmpd(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

int main(int argc, char **argv)
{
    int threads = (int)sysconf(_SC_NPROCESSORS_ONLN), reps = 10, json = 0;
    size_t mib = 1024;
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc)
            threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--mib") && i + 1 < argc)
            mib = (size_t)atol(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc)
            reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json"))
            json = 1;
        else {
            fprintf(stderr, "usage: membw [--threads T] [--mib N] [--reps R] [--json]\n");
            return 2;
        }
    }
    if (threads < 1 || reps < 1 || mib < 1)
        return 2;
#if defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx512f")) {
        sum_fn = sum_avx512;
        isa = "avx512";
    } else if (__builtin_cpu_supports("avx2")) {
        sum_fn = sum_avx2;
        isa = "avx2";
    }
#endif
    size_t bytes = mib << 20, n = bytes / sizeof(float);
    float *buf = aligned_alloc(4096, bytes);
    if (!buf) {
        fprintf(stderr, "membw: cannot allocate %zu MiB\n", mib);
        return 1;
    }
    for (size_t i = 0; i < n; i++) buf[i] = (float)(i & 1023);
    pthread_barrier_t bar;
    pthread_barrier_init(&bar, NULL, (unsigned)threads);
    job *jobs = calloc((size_t)threads, sizeof *jobs);
    pthread_t *th = calloc((size_t)threads, sizeof *th);
    double *secs = calloc((size_t)reps, sizeof *secs);
    size_t per = (n / threads) & ~(size_t)127;
    for (int t = 0; t < threads; t++) {
        jobs[t] = (job){buf + per * t, per, &bar, reps, t == 0 ? secs : NULL, 0};
        if (t)
            pthread_create(&th[t], NULL, worker, &jobs[t]);
    }
    worker(&jobs[0]);
    for (int t = 1; t < threads; t++) pthread_join(th[t], NULL);
    double read = (double)per * threads * sizeof(float);
    qsort(secs, (size_t)reps, sizeof *secs, cmpd);
    double best = read / secs[0] / 1e9, med = read / secs[reps / 2] / 1e9;
    if (json)
        printf("{\"threads\": %d, \"mib\": %zu, \"reps\": %d, \"isa\": \"%s\", \"best_gbs\": %.2f, \"median_gbs\": %.2f}\n",
               threads, mib, reps, isa, best, med);
    else
        printf("membw: %d threads, %zu MiB, %s loads: best %.2f GB/s, median %.2f GB/s\n", threads, mib, isa, best,
               med);
    float s = 0;
    for (int t = 0; t < threads; t++) s += jobs[t].sink;
    if (s == 1234.5f)
        printf("\n");
    free(buf);
    free(jobs);
    free(th);
    free(secs);
    return 0;
}
