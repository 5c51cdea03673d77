/*
 * server/sched.c - the scheduler of `lmstore serve` (see sched.h) over the
 * batched engine (lmstore/batch.h): one thread drives one lms_batch of the
 * model; every step is one forward pass over all running requests (decode
 * tokens and prompt chunks together; on the CPU one pass, on CUDA one per
 * sequence, as batch.h says).
 *
 * Design notes.
 *
 * The thread loops: end the running requests that were cancelled
 * (lms_batch_cancel frees their pages at once), admit queued requests in
 * order while the batch takes them (a slot and KV pages free: lms_batch_add
 * says LMS_ENOSPACE otherwise, and the queue waits for a later step), then
 * run one step without the lock and deliver its events. A step is short (one
 * token per running request and a prompt chunk), so a cancel is seen within
 * one step (sched.h invariant 4), and submit, cancel, next and stats never
 * wait for a forward pass.
 *
 * Prefix reuse is the batch's: whole KV pages of earlier prompts in RAM
 * (the prefix cache of its one arena) and, with a prefix store, prompts'
 * prefixes saved into the store and resumed from there, also after a
 * restart. The prompt tokens so reused are the requests' cached_tokens.
 *
 * Decoding and sampling are the batch's, which follows lms_generate step for
 * step: a greedy request computes the ids `lmstore run` computes.
 *
 * Invariants (beyond sched.h's):
 *  1. run[k] != NULL exactly when a request is RUNNING in the batch under
 *     id run[k]->id; such a request holds one reference for the scheduler
 *     (dropped by end_running_locked).
 *  2. Events are appended only by the scheduler thread, under s->mu; the END
 *     event is r->end, set once (r->ended), after which nothing is appended.
 *  3. The batch is called only by the scheduler thread; its stats are read
 *     after a step and published under s->mu.
 */
#include "server/sched.h"

#include <assert.h>
#include <errno.h>
#include <stdio.h>
#include <math.h>
#include <pthread.h>
#include <string.h>
#include <time.h>

#include "common/common.h"
#include "engine/sampler.h"
#include "lmstore/batch.h"

enum { RQ_QUEUED, RQ_RUNNING, RQ_ENDED };

struct lms__sreq {
    lms__sched *s;
    int32_t *prompt;        /* [n_prompt] */
    size_t n_prompt;
    lms__sreq_params p;
    int32_t *stop_ids;      /* [p.n_stop_ids], copied */
    lms__sreq *next;        /* queue link */
    uint64_t id;            /* the batch's id, while RUNNING */
    uint32_t cached;
    /* under s->mu */
    int state;
    bool cancel;
    int refs;
    lms__sched_event *ev;   /* [n_ev] reported, [rd..n_ev) not yet taken */
    size_t n_ev, cap_ev, rd;
    bool ended;
    lms__sched_event end;
    char errmsg[256];       /* STOP_ERROR's detail */
    pthread_cond_t cv;
};

struct lms__sched {
    lms__sched_params p;
    lms_batch *b;
    lms_batch_event *evs;   /* [p.n_slots] a step's events */
    lms__sreq **run;        /* [p.n_slots] RUNNING requests (invariant 1) */
    lms_tokenizer *tok;
    lms_engine_info info;
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t work;    /* a request was queued or cancelled, or stop */
    bool stopping;
    lms__sreq *qhead, *qtail;
    uint32_t n_queued, n_running;
    lms_batch_stats bs;     /* published after each step (invariant 3) */
};

/* ---- requests ------------------------------------------------------------------ */

static void req_unref_locked(lms__sreq *r)
{
    assert(r->refs > 0);
    if (--r->refs)
        return;
    pthread_cond_destroy(&r->cv);
    lms__free(r->prompt);
    lms__free(r->stop_ids);
    lms__free(r->ev);
    lms__free(r);
}

static void post_end_locked(lms__sreq *r, int stop, int error)
{
    if (r->ended)
        return;
    memset(&r->end, 0, sizeof r->end);
    r->end.kind = LMS__SEV_END;
    r->end.stop = stop;
    r->end.error = error;
    r->end.prompt_tokens = (uint32_t)r->n_prompt;
    r->end.cached_tokens = r->cached;
    r->end.t = lms__now();
    r->end.message = r->errmsg;
    r->ended = true;
    r->state = RQ_ENDED;
    pthread_cond_broadcast(&r->cv);
}

/* End the request running at run[k] (invariant 1). */
static void end_running_locked(lms__sched *s, uint32_t k, int stop, int error)
{
    lms__sreq *r = s->run[k];
    post_end_locked(r, stop, error);
    s->run[k] = NULL;
    s->n_running--;
    req_unref_locked(r);
}

static int push_event_locked(lms__sreq *r, const lms__sched_event *ev)
{
    if (r->rd == r->n_ev) /* everything taken: start the buffer over */
        r->rd = r->n_ev = 0;
    if (r->n_ev == r->cap_ev) {
        size_t cap = r->cap_ev ? 2 * r->cap_ev : 16;
        lms__sched_event *p = lms__realloc(r->ev, cap * sizeof *p);
        if (!p)
            return LMS_ENOMEM;
        r->ev = p;
        r->cap_ev = cap;
    }
    r->ev[r->n_ev++] = *ev;
    pthread_cond_broadcast(&r->cv);
    return 0;
}

/* ---- the thread --------------------------------------------------------------------- */

/* Admit queued requests in order while the batch takes them. */
static void admit_locked(lms__sched *s)
{
    while (s->qhead && s->n_running < s->p.n_slots) {
        lms__sreq *r = s->qhead;
        lms_batch_req rq = {&r->p.gp, r->stop_ids, r->p.n_stop_ids, r->p.top_logprobs, !r->p.logprobs};
        uint64_t id = 0;
        int rc = lms_batch_add_ex(s->b, r->prompt, r->n_prompt, &rq, &id);
        if (rc == LMS_ENOSPACE) { /* not now: a later step frees slots or pages */
            lms_clear_error();
            return;
        }
        s->qhead = r->next;
        if (!s->qhead)
            s->qtail = NULL;
        s->n_queued--;
        r->next = NULL;
        if (rc) {
            snprintf(r->errmsg, sizeof r->errmsg, "%s", lms_last_error());
            post_end_locked(r, LMS__SCHED_STOP_ERROR, rc);
            req_unref_locked(r);
            continue;
        }
        uint32_t k = 0;
        while (s->run[k]) k++; /* n_running < n_slots: a free place exists */
        r->id = id;
        r->state = RQ_RUNNING;
        s->run[k] = r;
        s->n_running++;
    }
}

/* Deliver one event of the step to its request. */
static void deliver_locked(lms__sched *s, const lms_batch_event *be)
{
    uint32_t k = 0;
    while (k < s->p.n_slots && !(s->run[k] && s->run[k]->id == be->id)) k++;
    if (k == s->p.n_slots)
        return; /* cannot happen: only running requests are stepped */
    lms__sreq *r = s->run[k];
    r->cached = be->cached_tokens;
    if (be->stop_reason == LMS_STOP_EOS) { /* an EOS or stop id: not shown */
        end_running_locked(s, k, LMS__SCHED_STOP_EOS, 0);
        return;
    }
    if (be->token >= 0) {
        lms__sched_event ev;
        memset(&ev, 0, sizeof ev);
        ev.kind = LMS__SEV_TOKEN;
        ev.token = be->token;
        ev.logprob = be->logprob;
        ev.n_top = LMS_MIN(be->n_top, (uint32_t)LMS__SCHED_MAX_TOP);
        memcpy(ev.top_ids, be->top_ids, ev.n_top * sizeof *ev.top_ids);
        memcpy(ev.top_lp, be->top_logprobs, ev.n_top * sizeof *ev.top_lp);
        ev.prompt_tokens = (uint32_t)r->n_prompt;
        ev.cached_tokens = r->cached;
        ev.t = lms__now();
        int rc = push_event_locked(r, &ev);
        if (rc) {
            lms_batch_cancel(s->b, r->id);
            end_running_locked(s, k, LMS__SCHED_STOP_ERROR, rc);
            return;
        }
    }
    if (be->stop_reason == LMS_STOP_MAX_TOKENS)
        end_running_locked(s, k, LMS__SCHED_STOP_LENGTH, 0);
    else if (be->stop_reason == LMS_STOP_CTX)
        end_running_locked(s, k, LMS__SCHED_STOP_CTX, 0);
}

static void *sched_main(void *arg)
{
    lms__sched *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        for (uint32_t k = 0; k < s->p.n_slots; k++)
            if (s->run[k] && (s->run[k]->cancel || s->stopping)) {
                lms_batch_cancel(s->b, s->run[k]->id);
                end_running_locked(s, k, LMS__SCHED_STOP_CANCELLED, 0);
            }
        if (!s->stopping)
            admit_locked(s);
        if (!s->n_running) {
            if (s->stopping)
                break;
            pthread_cond_wait(&s->work, &s->mu);
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        size_t n = 0;
        int rc = lms_batch_step(s->b, s->evs, s->p.n_slots, &n);
        lms_batch_stats bs;
        lms_batch_get_stats(s->b, &bs);
        pthread_mutex_lock(&s->mu);
        s->bs = bs;
        if (rc) { /* no event delivered; every running request ends with the error */
            lms__warn("serve: a batch step failed: %s", lms_last_error());
            for (uint32_t k = 0; k < s->p.n_slots; k++)
                if (s->run[k]) {
                    snprintf(s->run[k]->errmsg, sizeof s->run[k]->errmsg, "%s", lms_last_error());
                    lms_batch_cancel(s->b, s->run[k]->id);
                    end_running_locked(s, k, LMS__SCHED_STOP_ERROR, rc);
                }
            continue;
        }
        for (size_t i = 0; i < n; i++) deliver_locked(s, &s->evs[i]);
    }
    /* shutting down: whatever is queued ends too */
    while (s->qhead) {
        lms__sreq *r = s->qhead;
        s->qhead = r->next;
        s->n_queued--;
        post_end_locked(r, LMS__SCHED_STOP_CANCELLED, 0);
        req_unref_locked(r);
    }
    s->qtail = NULL;
    pthread_mutex_unlock(&s->mu);
    return NULL;
}

/* ---- the interface ------------------------------------------------------------------- */

int lms__sched_create(lms_model *model, const lms__sched_params *p, lms__sched **out)
{
    int rc = 0;
    *out = NULL;
    lms__sched *s = lms__calloc(1, sizeof *s);
    if (!s)
        return LMS_ENOMEM;
    s->p = *p;
    if (!s->p.n_slots)
        s->p.n_slots = 1;
    pthread_mutex_init(&s->mu, NULL);
    pthread_cond_init(&s->work, NULL);
    if (!(s->run = lms__calloc(s->p.n_slots, sizeof *s->run)) ||
        !(s->evs = lms__calloc(s->p.n_slots, sizeof *s->evs))) {
        rc = LMS_ENOMEM;
        goto out_free;
    }
    lms_batch_params bp = lms_batch_default_params();
    bp.max_seqs = s->p.n_slots;
    bp.step_tokens = s->p.prefill_chunk ? LMS_MAX(s->p.prefill_chunk, s->p.n_slots) : 0;
    bp.prefix_store = s->p.prefix_store;
    bp.prefix_disk_budget = s->p.prefix_disk_budget;
    if (s->p.prefix_min_tokens)
        bp.prefix_min_tokens = s->p.prefix_min_tokens;
    if ((rc = lms_batch_create(model, &s->p.ep, &bp, &s->b)))
        goto out_free;
    lms_batch_get_info(s->b, &s->info);
    s->tok = lms_batch_tokenizer(s->b);
    lms_batch_get_stats(s->b, &s->bs);
    if ((rc = pthread_create(&s->thread, NULL, sched_main, s))) {
        rc = lms__err_errno(LMS_EIO, rc, "serve: starting the scheduler thread");
        goto out_free;
    }
    s->started = true;
    *out = s;
    return 0;
out_free:
    lms__sched_free(s);
    return rc;
}

void lms__sched_free(lms__sched *s)
{
    if (!s)
        return;
    if (s->started) {
        pthread_mutex_lock(&s->mu);
        s->stopping = true;
        pthread_cond_broadcast(&s->work);
        pthread_mutex_unlock(&s->mu);
        pthread_join(s->thread, NULL);
    }
    lms_batch_free(s->b);
    lms__free(s->run);
    lms__free(s->evs);
    pthread_cond_destroy(&s->work);
    pthread_mutex_destroy(&s->mu);
    lms__free(s);
}

lms_tokenizer *lms__sched_tokenizer(const lms__sched *s) { return s->tok; }

const lms_engine_info *lms__sched_info(const lms__sched *s) { return &s->info; }

int lms__sched_default_gen_params(const lms__sched *s, lms_gen_params *out)
{
    return lms_batch_default_gen_params(s->b, out);
}

void lms__sched_get_stats(lms__sched *s, lms__sched_stats *o)
{
    memset(o, 0, sizeof *o);
    pthread_mutex_lock(&s->mu);
    o->n_slots = s->p.n_slots;
    o->running = s->n_running;
    o->queued = s->n_queued;
    o->kv_pages_used = s->bs.kv_pages_used;
    o->kv_pages_total = s->bs.kv_pages_total;
    o->prefix_hits_ram = s->bs.prefix_hits_ram;
    o->prefix_hits_store = s->bs.prefix_hits_store;
    o->n_ctx = s->info.n_ctx;
    pthread_mutex_unlock(&s->mu);
}

int lms__sched_submit(lms__sched *s, const int32_t *prompt, size_t n, const lms__sreq_params *p,
                      lms__sreq **out)
{
    *out = NULL;
    if (n == 0)
        return lms__err(LMS_EINVAL, "the prompt is empty (0 tokens)");
    for (size_t i = 0; i < n; i++)
        if (prompt[i] < 0 || (uint32_t)prompt[i] >= s->info.n_vocab)
            return lms__err(LMS_EINVAL, "prompt token id %d (at %zu) is outside the vocabulary of %u",
                            (int)prompt[i], i, s->info.n_vocab);
    if (n >= s->info.n_ctx)
        return lms__err(LMS_ENOSPACE, "the prompt (%zu tokens) does not fit the context of %u tokens", n,
                        s->info.n_ctx);
    if (p->gp.max_tokens && n + p->gp.max_tokens > s->info.n_ctx)
        return lms__err(LMS_ENOSPACE,
                        "the context is %u tokens, but %zu were asked for (%zu of prompt, %u to generate)",
                        s->info.n_ctx, n + p->gp.max_tokens, n, p->gp.max_tokens);
    if (p->top_logprobs > LMS__SCHED_MAX_TOP)
        return lms__err(LMS_EINVAL, "top_logprobs %u is more than %d", p->top_logprobs, LMS__SCHED_MAX_TOP);
    lms__sampler *probe = NULL; /* settings out of range fail here, not in the slot */
    int rc = lms__sampler_create(&p->gp, 1, &probe);
    lms__sampler_free(probe);
    if (rc)
        return rc;
    lms__sreq *r = lms__calloc(1, sizeof *r);
    if (!r)
        return LMS_ENOMEM;
    r->s = s;
    r->p = *p;
    r->p.gp.stop = NULL;
    r->p.gp.n_stop = 0;
    r->refs = 2; /* the caller's and the scheduler's */
    pthread_cond_init(&r->cv, NULL);
    if (!(r->prompt = lms__malloc(n * sizeof *prompt)) ||
        (p->n_stop_ids && !(r->stop_ids = lms__malloc(p->n_stop_ids * sizeof *r->stop_ids)))) {
        r->refs = 1;
        pthread_mutex_lock(&s->mu);
        req_unref_locked(r);
        pthread_mutex_unlock(&s->mu);
        return LMS_ENOMEM;
    }
    memcpy(r->prompt, prompt, n * sizeof *prompt);
    r->n_prompt = n;
    if (p->n_stop_ids)
        memcpy(r->stop_ids, p->stop_ids, p->n_stop_ids * sizeof *r->stop_ids);
    r->p.stop_ids = r->stop_ids;
    pthread_mutex_lock(&s->mu);
    if (s->stopping)
        rc = lms__err(LMS_ECANCELED, "the server is shutting down");
    else if (s->n_running + s->n_queued >= s->p.n_slots + s->p.max_queue)
        rc = lms__err(LMS_EBUSY, "all %u slots are busy and %u requests are waiting", s->p.n_slots,
                      s->n_queued);
    if (rc) {
        r->refs = 1;
        req_unref_locked(r);
        pthread_mutex_unlock(&s->mu);
        return rc;
    }
    r->state = RQ_QUEUED;
    if (s->qtail)
        s->qtail->next = r;
    else
        s->qhead = r;
    s->qtail = r;
    s->n_queued++;
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
    *out = r;
    return 0;
}

int lms__sched_next(lms__sreq *r, lms__sched_event *ev, int timeout_ms)
{
    lms__sched *s = r->s;
    struct timespec dl;
    if (timeout_ms >= 0) {
        clock_gettime(CLOCK_REALTIME, &dl);
        dl.tv_sec += timeout_ms / 1000;
        dl.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
        if (dl.tv_nsec >= 1000000000L) {
            dl.tv_sec++;
            dl.tv_nsec -= 1000000000L;
        }
    }
    int got = 0;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if (r->rd < r->n_ev) {
            *ev = r->ev[r->rd++];
            got = 1;
            break;
        }
        if (r->ended) {
            *ev = r->end;
            got = 1;
            break;
        }
        if (timeout_ms < 0)
            pthread_cond_wait(&r->cv, &s->mu);
        else if (pthread_cond_timedwait(&r->cv, &s->mu, &dl) == ETIMEDOUT)
            break;
    }
    pthread_mutex_unlock(&s->mu);
    return got;
}

/* Take a queued request out of the queue; true when it was there. */
static bool unqueue_locked(lms__sched *s, lms__sreq *r)
{
    lms__sreq **pp = &s->qhead, *prev = NULL;
    while (*pp && *pp != r) {
        prev = *pp;
        pp = &(*pp)->next;
    }
    if (!*pp)
        return false;
    *pp = r->next;
    if (s->qtail == r)
        s->qtail = prev;
    r->next = NULL;
    s->n_queued--;
    return true;
}

void lms__sched_cancel(lms__sreq *r)
{
    lms__sched *s = r->s;
    pthread_mutex_lock(&s->mu);
    r->cancel = true;
    if (r->state == RQ_QUEUED && unqueue_locked(s, r)) {
        post_end_locked(r, LMS__SCHED_STOP_CANCELLED, 0);
        req_unref_locked(r); /* the scheduler's reference: it never ran */
    }
    pthread_cond_signal(&s->work);
    pthread_mutex_unlock(&s->mu);
}

void lms__sched_release(lms__sreq *r)
{
    if (!r)
        return;
    lms__sched_cancel(r);
    lms__sched *s = r->s;
    pthread_mutex_lock(&s->mu);
    req_unref_locked(r);
    pthread_mutex_unlock(&s->mu);
}
