/*
 * common/pool.c - a small fixed thread pool for data-parallel loops
 * (hashing, copying, matrix rows). One run at a time; the calling thread
 * takes part, so a pool of N threads starts N-1 workers.
 *
 * Work is handed out by an atomic counter, so uneven items balance
 * themselves. Threads sleep on a condition variable between runs.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <unistd.h>

#include "common.h"

struct lms_pool {
    int nthreads; /* including the caller */
    pthread_t *threads;
    pthread_mutex_t mu;
    pthread_cond_t cv_start, cv_done;
    uint64_t generation; /* bumped per run, guarded by mu */
    int pending;         /* workers not yet finished with this run */
    bool quit;
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
    pthread_mutex_lock(&p->mu);
    for (;;) {
        while (!p->quit && p->generation == seen)
            pthread_cond_wait(&p->cv_start, &p->mu);
        if (p->quit)
            break;
        seen = p->generation;
        pthread_mutex_unlock(&p->mu);
        drain(p, id);
        pthread_mutex_lock(&p->mu);
        if (--p->pending == 0)
            pthread_cond_signal(&p->cv_done);
    }
    pthread_mutex_unlock(&p->mu);
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
    p->pending = p->nthreads - 1;
    p->generation++;
    pthread_cond_broadcast(&p->cv_start);
    pthread_mutex_unlock(&p->mu);
    drain(p, 0);
    pthread_mutex_lock(&p->mu);
    while (p->pending > 0)
        pthread_cond_wait(&p->cv_done, &p->mu);
    pthread_mutex_unlock(&p->mu);
}

void lms__pool_destroy(lms_pool *p)
{
    if (!p)
        return;
    pthread_mutex_lock(&p->mu);
    p->quit = true;
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
