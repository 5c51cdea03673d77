/*
 * common/pool.c - a small fixed thread pool for data-parallel loops
 * (hashing, copying, matrix rows). One run at a time; the calling thread
 * takes part, so a pool of N threads starts N-1 workers.
 *
 * Work is handed out by an atomic counter, so uneven items balance
 * themselves. Between runs a thread first spins on the run counter for a
 * while (SPIN_NS) and only then sleeps on a condition variable: the
 * engine's decode step issues hundreds of short runs per token, a few
 * microseconds apart, and a sleeping thread takes tens of microseconds to
 * wake. The caller waits for the workers the same way. A pool left idle
 * for longer than the spin costs nothing.
 *
 * Invariants: (1) generation changes only under mu, after the run's fields
 * are set (a worker that sees the new value, acquire, sees them);
 * (2) a thread sleeps only after checking, under mu, that there is nothing
 * to wait for, and every change it waits for signals its condition
 * variable under mu: no wake-up is lost.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

#define SPIN_NS 200000 /* spin this long before sleeping */

struct lms_pool {
    int nthreads; /* including the caller */
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv_start, cv_done;
    atomic_uint_fast64_t generation; /* bumped per run */
    atomic_int pending;              /* workers not yet finished with this run */
    atomic_bool quit;
    /* the current run */
    lms_pool_fn fn;
    void *arg;
    size_t n;
    atomic_size_t next;
};

typedef struct {
    lms_pool *pool;
    int id;
} worker_arg;

static inline void cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#endif
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

/* Spin until *v != old or SPIN_NS pass; true when it changed. */
static bool spin_gen(atomic_uint_fast64_t *v, uint64_t old)
{
    uint64_t t0 = 0;
    for (unsigned i = 0;; i++) {
        if (atomic_load_explicit(v, memory_order_acquire) != old)
            return true;
        cpu_relax();
        if ((i & 255) == 255) {
            uint64_t t = now_ns();
            if (!t0)
                t0 = t;
            else if (t - t0 > SPIN_NS)
                return false;
        }
    }
}

static bool spin_zero(atomic_int *v)
{
    uint64_t t0 = 0;
    for (unsigned i = 0;; i++) {
        if (atomic_load_explicit(v, memory_order_acquire) == 0)
            return true;
        cpu_relax();
        if ((i & 255) == 255) {
            uint64_t t = now_ns();
            if (!t0)
                t0 = t;
            else if (t - t0 > SPIN_NS)
                return false;
        }
    }
}

static void drain(lms_pool *p, int worker)
{
    for (;;) {
        size_t i = atomic_fetch_add(&p->next, 1);
        if (i >= p->n)
            break;
        p->fn(p->arg, i, worker);
    }
}

static void *worker_main(void *v)
{
    lms_pool *p = ((worker_arg *)v)->pool;
    int id = ((worker_arg *)v)->id;
    uint64_t seen = 0;
    lms__free(v);
    for (;;) {
        if (!spin_gen(&p->generation, seen)) {
            pthread_mutex_lock(&p->mu);
            while (!atomic_load(&p->quit) && atomic_load(&p->generation) == seen)
                pthread_cond_wait(&p->cv_start, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->quit))
            break;
        seen = atomic_load_explicit(&p->generation, memory_order_acquire);
        drain(p, id);
        if (atomic_fetch_sub_explicit(&p->pending, 1, memory_order_acq_rel) == 1) {
            pthread_mutex_lock(&p->mu);
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
    }
    return NULL;
}

int lms__cpu_count(void)
{
    long n = sysconf(_SC_NPROCESSORS_ONLN);
    return n > 0 ? (int)n : 1;
}

int lms__pool_create(int threads, lms_pool **out)
{
    lms_pool *p;
    *out = NULL;
    if (threads <= 0)
        threads = lms__cpu_count();
    p = lms__calloc(1, sizeof *p);
    if (!p)
        return LMS_ENOMEM;
    p->nthreads = threads;
    pthread_mutex_init(&p->mu, NULL);
    pthread_cond_init(&p->cv_start, NULL);
    pthread_cond_init(&p->cv_done, NULL);
    if (threads > 1) {
        p->threads = lms__calloc((size_t)threads - 1, sizeof *p->threads);
        if (!p->threads)
            goto fail;
        for (int i = 0; i < threads - 1; i++) {
            worker_arg *wa = lms__malloc(sizeof *wa);
            if (!wa) {
                p->nthreads = i + 1;
                goto fail;
            }
            wa->pool = p;
            wa->id = i + 1;
            if (pthread_create(&p->threads[i], NULL, worker_main, wa)) {
                lms__free(wa);
                p->nthreads = i + 1;
                lms__err(LMS_ENOMEM, "cannot start thread %d of the pool", i + 1);
                goto fail;
            }
        }
    }
    *out = p;
    return 0;
fail:
    lms__pool_destroy(p);
    return LMS_ENOMEM;
}

int lms__pool_threads(const lms_pool *pool) { return pool ? pool->nthreads : 1; }

void lms__pool_run(lms_pool *p, size_t n, lms_pool_fn fn, void *arg)
{
    if (n == 0)
        return;
    if (!p || p->nthreads == 1 || n == 1) {
        for (size_t i = 0; i < n; i++)
            fn(arg, i, 0);
        return;
    }
    pthread_mutex_lock(&p->mu);
    p->fn = fn;
    p->arg = arg;
    p->n = n;
    atomic_store(&p->next, 0);
    atomic_store(&p->pending, p->nthreads - 1);
    atomic_fetch_add_explicit(&p->generation, 1, memory_order_release);
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    drain(p, 0);
    if (!spin_zero(&p->pending)) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->pending) > 0)
            pthread_cond_wait(&p->cv_done, &p->mu);
        pthread_mutex_unlock(&p->mu);
    }
}

void lms__pool_destroy(lms_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    atomic_store(&p->quit, true);
    atomic_fetch_add(&p->generation, 1); /* spinning workers see it too */
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    if (p->threads)
        for (int i = 0; i < p->nthreads - 1; i++)
            pthread_join(p->threads[i], NULL);
    lms__free(p->threads);
    pthread_mutex_destroy(&p->mu);
    pthread_cond_destroy(&p->cv_start);
    pthread_cond_destroy(&p->cv_done);
    lms__free(p);
}
