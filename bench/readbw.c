/*
 * bench/readbw.c - the host side of a staged load, without a device: T
 * threads pread the given files, chunk by chunk in file order (chunk i to
 * thread i mod T, as the loader's workers take them), into a ring of S
 * buffers of the chunk size (S = 2 x T, the loader's default ring), and
 * nothing reads the ring. What the loader's staged copies can reach at most
 * on this host when the files are in the page cache: the DMA out of the ring
 * only adds memory traffic. --ring 0 reads each thread's chunks into one
 * small buffer (cache-resident), the page-cache copy alone.
 *
 *   readbw [--threads T] [--chunk MIB] [--slots S] [--reps R] [--json] FILE...
 */
#include <fcntl.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

typedef struct job {
    int fd;
    uint64_t off, len;
} job;

static job *g_jobs;
static size_t g_njobs;
static int g_threads, g_slots;
static uint64_t g_chunk;
static uint8_t *g_ring;
static volatile int g_fail;

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static void *worker(void *arg)
{
    int t = (int)(intptr_t)arg;
    for (size_t i = (size_t)t; i < g_njobs; i += (size_t)g_threads) {
        /* the slot the loader would use for chunk i; --slots 0: one per thread */
        size_t slot = g_slots ? i % (size_t)g_slots : (size_t)t;
        uint8_t *buf = g_ring + slot * g_chunk;
        uint64_t done = 0;
        while (done < g_jobs[i].len) {
            ssize_t n = pread(g_jobs[i].fd, buf + done, (size_t)(g_jobs[i].len - done), (off_t)(g_jobs[i].off + done));
            if (n <= 0) {
                g_fail = 1;
                return NULL;
            }
            done += (uint64_t)n;
        }
    }
    return NULL;
}

int main(int argc, char **argv)
{
    int reps = 3, json = 0, nfiles = 0;
    g_threads = 8;
    g_slots = -1;
    g_chunk = 8ull << 20;
    char **files = calloc((size_t)argc, sizeof *files);
    for (int i = 1; i < argc; i++) {
        if (!strcmp(argv[i], "--threads") && i + 1 < argc) g_threads = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--chunk") && i + 1 < argc) g_chunk = (uint64_t)atoi(argv[++i]) << 20;
        else if (!strcmp(argv[i], "--slots") && i + 1 < argc) g_slots = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--reps") && i + 1 < argc) reps = atoi(argv[++i]);
        else if (!strcmp(argv[i], "--json")) json = 1;
        else files[nfiles++] = argv[i];
    }
    if (!nfiles || g_threads < 1 || g_chunk == 0) {
        fprintf(stderr, "usage: readbw [--threads T] [--chunk MIB] [--slots S] [--reps R] [--json] FILE...\n");
        return 2;
    }
    if (g_slots < 0)
        g_slots = 2 * g_threads;
    uint64_t total = 0;
    size_t cap = 0;
    for (int f = 0; f < nfiles; f++) {
        int fd = open(files[f], O_RDONLY);
        struct stat sb;
        if (fd < 0 || fstat(fd, &sb) != 0) {
            perror(files[f]);
            return 1;
        }
        for (uint64_t off = 0; off < (uint64_t)sb.st_size; off += g_chunk) {
            if (g_njobs == cap) {
                cap = cap ? 2 * cap : 1024;
                g_jobs = realloc(g_jobs, cap * sizeof *g_jobs);
            }
            uint64_t len = (uint64_t)sb.st_size - off < g_chunk ? (uint64_t)sb.st_size - off : g_chunk;
            g_jobs[g_njobs++] = (job){fd, off, len};
            total += len;
        }
    }
    size_t nbuf = g_slots ? (size_t)g_slots : (size_t)g_threads;
    size_t ring_bytes = nbuf * g_chunk;
    if (posix_memalign((void **)&g_ring, 2u << 20, ring_bytes)) {
        fprintf(stderr, "readbw: out of memory\n");
        return 1;
    }
#ifdef MADV_HUGEPAGE
    madvise(g_ring, ring_bytes, MADV_HUGEPAGE);
#endif
    memset(g_ring, 0, ring_bytes); /* the loader's ring is pinned, so populated */
    double best = 1e30, sum = 0;
    pthread_t *th = calloc((size_t)g_threads, sizeof *th);
    for (int r = 0; r < reps; r++) {
        double t0 = now();
        for (int t = 0; t < g_threads; t++)
            pthread_create(&th[t], NULL, worker, (void *)(intptr_t)t);
        for (int t = 0; t < g_threads; t++)
            pthread_join(th[t], NULL);
        double dt = now() - t0;
        if (g_fail) {
            fprintf(stderr, "readbw: read failed\n");
            return 1;
        }
        best = dt < best ? dt : best;
        sum += dt;
    }
    if (json)
        printf("{\"what\": \"readbw\", \"threads\": %d, \"chunk_bytes\": %llu, \"slots\": %d, \"bytes\": %llu, "
               "\"best_s\": %.6f, \"mean_s\": %.6f, \"best_gb_per_s\": %.3f, \"mean_gb_per_s\": %.3f}\n",
               g_threads, (unsigned long long)g_chunk, g_slots, (unsigned long long)total, best, sum / reps,
               (double)total / best / 1e9, (double)total / (sum / reps) / 1e9);
    else
        printf("readbw: %d threads, %llu MiB chunks, %d slots: %.2f GB/s best, %.2f GB/s mean over %d reps\n",
               g_threads, (unsigned long long)(g_chunk >> 20), g_slots, (double)total / best / 1e9,
               (double)total / (sum / reps) / 1e9, reps);
    return 0;
}
