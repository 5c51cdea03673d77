/*
 * common/pool.c - a small fixed thread pool for data-parallel loops
 * (hashing, copying, matrix rows). One run at a time; the calling thread
 * takes part, so a pool of N threads starts N-1 workers.
 *
 * Items are claimed from one atomic ticket (the run's generation in the
 * high 32 bits, the next item in the low 32), so uneven items balance
 * themselves, and a run ends when all its items are finished, not when every
 * worker has looked in: a worker that another process keeps off its core
 * (or that wakes late) only makes the others take its share, it never holds
 * the run up unless it is inside an item. Between runs a thread first spins
 * on the ticket for a while (SPIN_NS) and only then sleeps on a condition
 * variable: the engine's decode step issues a hundred or more short runs
 * per token, a few microseconds apart, and a sleeping thread takes tens of
 * microseconds to wake. The caller waits for the last item the same way. A
 * pool left idle for longer than the spin costs nothing.
 *
 * Invariants: (1) a run's fields (fn, arg, limit: generation and item count)
 * are written before its ticket is published (release), and only after the
 * previous run's items are all finished; an item is executed only by the
 * thread whose compare-and-swap moved the ticket past it, so that thread read
 * the fields of the item's own run (the ticket did not change between its
 * load and the swap, so no run ended or began in between); (2) a thread
 * sleeps only after checking, under mu, that there is nothing to wait for,
 * and every change it waits for signals its condition variable under mu: no
 * wake-up is lost.
 */
#include <assert.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <time.h>
#include <unistd.h>

#include "common.h"

#define SPIN_NS 200000 /* spin this long before sleeping */

struct lms_pool {
    int nthreads; /* including the caller */
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv_start, cv_done;
    atomic_uint_fast64_t ticket; /* generation << 32 | next item */
    atomic_uint_fast64_t limit;  /* generation << 32 | item count, of the current run */
    atomic_size_t done;          /* items of the current run finished */
    atomic_bool quit;
    _Atomic(lms_pool_fn) fn;
    _Atomic(void *) arg;
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

static inline uint64_t gen_of(uint64_t t) { return t >> 32; }

/* The spin's clock: false once SPIN_NS have passed since the first call that
 * reads it (every 256 spins; *t0 starts at 0). */
static bool spin_on(unsigned i, uint64_t *t0)
{
    if ((i & 255) != 255)
        return true;
    uint64_t t = now_ns();
    if (!*t0)
        *t0 = t;
    return t - *t0 <= SPIN_NS;
}

/* Spin until the ticket's generation is not `gen` or SPIN_NS pass; true when it changed. */
static bool spin_gen(atomic_uint_fast64_t *v, uint64_t gen)
{
    uint64_t t0 = 0;
    for (unsigned i = 0;; i++) {
        if (gen_of(atomic_load_explicit(v, memory_order_acquire)) != gen)
            return true;
        cpu_relax();
        if (!spin_on(i, &t0))
            return false;
    }
}

/* Spin until *v reaches n or SPIN_NS pass; true when it did. */
static bool spin_done(atomic_size_t *v, size_t n)
{
    uint64_t t0 = 0;
    for (unsigned i = 0;; i++) {
        if (atomic_load_explicit(v, memory_order_acquire) >= n)
            return true;
        cpu_relax();
        if (!spin_on(i, &t0))
            return false;
    }
}

/* Claim and run items of generation `gen` until there are none left. */
static void drain(lms_pool *p, uint64_t gen, int worker)
{
    for (;;) {
        uint64_t t = atomic_load_explicit(&p->ticket, memory_order_acquire);
        uint64_t l = atomic_load_explicit(&p->limit, memory_order_acquire);
        if (gen_of(t) != gen || gen_of(l) != gen || (uint32_t)t >= (uint32_t)l)
            return;
        lms_pool_fn fn = atomic_load_explicit(&p->fn, memory_order_relaxed);
        void *arg = atomic_load_explicit(&p->arg, memory_order_relaxed);
        if (!atomic_compare_exchange_weak_explicit(&p->ticket, &t, t + 1, memory_order_acq_rel,
                                                   memory_order_acquire))
            continue;
        fn(arg, (uint32_t)t, worker);
        size_t n = (uint32_t)l;
        if (atomic_fetch_add_explicit(&p->done, 1, memory_order_acq_rel) + 1 == n && worker != 0) {
            pthread_mutex_lock(&p->mu); /* the caller may be asleep */
            pthread_cond_signal(&p->cv_done);
            pthread_mutex_unlock(&p->mu);
        }
    }
}

static void *worker_main(void *v)
{
    lms_pool *p = ((worker_arg *)v)->pool;
    int id = ((worker_arg *)v)->id;
    uint64_t seen = 0;
    lms__free(v);
    for (;;) {
        if (!spin_gen(&p->ticket, seen)) {
            pthread_mutex_lock(&p->mu);
            while (!atomic_load(&p->quit) && gen_of(atomic_load(&p->ticket)) == seen)
                pthread_cond_wait(&p->cv_start, &p->mu);
            pthread_mutex_unlock(&p->mu);
        }
        if (atomic_load(&p->quit))
            break;
        seen = gen_of(atomic_load_explicit(&p->ticket, memory_order_acquire));
        drain(p, seen, id);
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
    assert(n < UINT32_MAX); /* items are counted in 32 bits */
    /* the previous run's items are all finished: its fields are free (invariant 1) */
    uint64_t gen = gen_of(atomic_load(&p->ticket)) + 1;
    atomic_store_explicit(&p->fn, fn, memory_order_relaxed);
    atomic_store_explicit(&p->arg, arg, memory_order_relaxed);
    atomic_store_explicit(&p->done, 0, memory_order_relaxed);
    atomic_store_explicit(&p->limit, gen << 32 | n, memory_order_release);
    pthread_mutex_lock(&p->mu);
    atomic_store_explicit(&p->ticket, gen << 32, memory_order_release);
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    drain(p, gen, 0);
    if (!spin_done(&p->done, n)) {
        pthread_mutex_lock(&p->mu);
        while (atomic_load(&p->done) < n)
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
    atomic_store(&p->ticket, (gen_of(atomic_load(&p->ticket)) + 1) << 32); /* spinning workers see it too */
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
