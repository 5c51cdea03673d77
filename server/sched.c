/*
 * server/sched.c - the scheduler of `lmstore serve` (see sched.h): N slots,
 * each an lms_engine over the one mapped model (the weights are shared; each
 * engine has its own paged KV cache), driven by one thread.
 *
 * Design notes.
 *
 * The thread takes the running slots in turn and does one unit of work for
 * the slot it is at: one prefill chunk (prefill_chunk prompt tokens) or one
 * decode token. Units are short (a token, or a chunk of a few hundred tokens),
 * so a long prompt delays the others by a chunk at a time, and a cancel is
 * seen within one unit (sched.h invariant 4). The lock is not held while an
 * engine computes: submit, cancel, next and stats never wait for a forward
 * pass.
 *
 * A request admitted to a slot goes to the free slot whose engine's sequence
 * shares the longest prefix with its prompt (a conversation's next turn lands
 * where its earlier turns are), and then reuses, as lms_generate does, the
 * common prefix of the sequence and the prompt, or a longer one from the
 * slot's prefix cache (its KV pages of earlier requests, LRU): those prompt
 * tokens are reported as cached_tokens.
 *
 * Decoding follows lms_generate (engine/generate.c) step for step, with the
 * engine's own sampler, so that a request computes the ids `lmstore run`
 * computes for the same prompt and settings: sample, check EOS, report, run
 * the token for the next logits. The last token reported is never run (as
 * lms_generate leaves it pending): the slot's sequence is the prompt plus
 * all generated tokens but the last.
 *
 * Invariants (beyond sched.h's):
 *  1. slot->r != NULL exactly when a request is RUNNING in it; such a request
 *     holds one reference for the scheduler (dropped by end_locked).
 *  2. Events are appended only by the scheduler thread, under s->mu; the END
 *     event is r->end, set once (r->ended), after which nothing is appended.
 *  3. Stats of a slot's KV cache are read only by the scheduler thread,
 *     after a unit of that slot, and published under s->mu.
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
#include "engine/engine_priv.h"
#include "engine/sampler.h"

enum { RQ_QUEUED, RQ_RUNNING, RQ_ENDED };

struct lms__sreq {
    lms__sched *s;
    int32_t *prompt;        /* [n_prompt] */
    size_t n_prompt;
    lms__sreq_params p;
    int32_t *stop_ids;      /* [p.n_stop_ids], copied */
    lms__sreq *next;        /* queue link */
    /* the scheduler thread's, while RUNNING */
    lms__sampler *smp;
    size_t done;            /* prompt tokens with K/V */
    bool set_up, prefilled, hit_counted;
    uint32_t n_gen;         /* tokens reported */
    int32_t last;           /* the last token reported (not yet run) */
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

typedef struct slot {
    lms_engine *e;
    float *logits;          /* [n_vocab] */
    lms__sreq *r;           /* RUNNING here, or NULL */
    uint32_t kv_used, kv_total; /* published stats (invariant 3) */
} slot;

struct lms__sched {
    lms__sched_params p;
    slot *slots;            /* [p.n_slots] */
    lms_tokenizer *tok;     /* slot 0's */
    lms_engine_info info;   /* slot 0's */
    pthread_t thread;
    bool started;
    pthread_mutex_t mu;
    pthread_cond_t work;    /* a request was queued or cancelled, or stop */
    bool stopping;
    lms__sreq *qhead, *qtail;
    uint32_t n_queued, n_running, rr;
    uint64_t prefix_hits;
};

/* ---- requests ------------------------------------------------------------------ */

static void req_unref_locked(lms__sreq *r)
{
    assert(r->refs > 0);
    if (--r->refs)
        return;
    pthread_cond_destroy(&r->cv);
    lms__sampler_free(r->smp);
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

/* End the request running in slot k (invariant 1). */
static void end_slot_locked(lms__sched *s, uint32_t k, int stop, int error)
{
    lms__sreq *r = s->slots[k].r;
    post_end_locked(r, stop, error);
    s->slots[k].r = NULL;
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

/* ---- the work of one slot --------------------------------------------------------- */

static bool is_end_id(const lms__sched *s, const lms__sreq *r, int32_t id)
{
    for (size_t i = 0; i < s->info.n_eos; i++)
        if (s->info.eos_ids[i] == id)
            return true;
    for (size_t i = 0; i < r->p.n_stop_ids; i++)
        if (r->stop_ids[i] == id)
            return true;
    return false;
}

/* Log probabilities from raw logits: the sampled id's and the top n. */
static void fill_logprobs(const float *logits, uint32_t n_vocab, lms__sched_event *ev, uint32_t n_top)
{
    float mx = -INFINITY;
    for (uint32_t i = 0; i < n_vocab; i++)
        if (logits[i] > mx)
            mx = logits[i];
    double sum = 0;
    for (uint32_t i = 0; i < n_vocab; i++)
        sum += exp((double)logits[i] - mx);
    double lse = mx + log(sum);
    ev->logprob = (float)(logits[ev->token] - lse);
    /* the n_top largest, by insertion into a short sorted list (n_top <= 20) */
    ev->n_top = 0;
    for (uint32_t i = 0; i < n_vocab && n_top; i++) {
        float v = logits[i];
        uint32_t k = ev->n_top;
        if (k == n_top && !(v > ev->top_lp[k - 1]))
            continue;
        if (k < n_top)
            ev->n_top++;
        else
            k--;
        while (k > 0 && v > ev->top_lp[k - 1]) {
            ev->top_lp[k] = ev->top_lp[k - 1];
            ev->top_ids[k] = ev->top_ids[k - 1];
            k--;
        }
        ev->top_lp[k] = v;
        ev->top_ids[k] = (int32_t)i;
    }
    for (uint32_t k = 0; k < ev->n_top; k++)
        ev->top_lp[k] = (float)(ev->top_lp[k] - lse);
}

/* Reuse what the slot holds of the prompt (see the design notes). */
static int set_up(lms__sched *s, slot *sl, lms__sreq *r)
{
    size_t ncur;
    const int32_t *cur = lms_engine_tokens(sl->e, &ncur);
    size_t c = 0;
    if (!r->p.gp.no_prefix_reuse)
        while (c < ncur && c < r->n_prompt && cur[c] == r->prompt[c]) c++;
    if (c >= r->n_prompt)
        c = r->n_prompt - 1; /* the last prompt token is always run, for its logits */
    c = lms__engine_keepable(sl->e, c);
    int rc = lms_engine_truncate(sl->e, c);
    if (rc)
        return rc;
    if (!r->p.gp.no_prefix_reuse && c + 1 < r->n_prompt)
        c = lms__engine_lookup(sl->e, r->prompt, (uint32_t)(r->n_prompt - 1), (uint32_t)c);
    r->done = c;
    r->cached = (uint32_t)c;
    r->set_up = true;
    if ((rc = lms__sampler_create(&r->p.gp, s->info.n_vocab, &r->smp)))
        return rc;
    uint32_t win = r->p.gp.repeat_window ? r->p.gp.repeat_window : 64;
    for (size_t i = r->n_prompt > win ? r->n_prompt - win : 0; i < r->n_prompt; i++)
        lms__sampler_accept(r->smp, r->prompt[i]);
    return 0;
}

/*
 * One unit of work for the request in slot sl (the lock not held). Sets
 * *have_ev when *ev is a token to report, *stop when the request ends.
 */
static int unit(lms__sched *s, slot *sl, lms__sreq *r, lms__sched_event *ev, bool *have_ev, int *stop)
{
    int rc;
    *have_ev = false;
    *stop = 0;
    if (!r->prefilled) {
        if (!r->set_up && (rc = set_up(s, sl, r)))
            return rc;
        size_t chunk = s->p.prefill_chunk ? s->p.prefill_chunk : 256;
        size_t k = LMS_MIN(r->n_prompt - r->done, chunk);
        bool last = r->done + k == r->n_prompt;
        if ((rc = lms_engine_eval(sl->e, r->prompt + r->done, k, last ? sl->logits : NULL, LMS_EVAL_LAST)))
            return rc;
        r->done += k;
        if (!last)
            return 0;
        r->prefilled = true;
    } else {
        if ((rc = lms_engine_eval(sl->e, &r->last, 1, sl->logits, LMS_EVAL_LAST)))
            return rc;
    }
    int32_t id = lms__sampler_sample(r->smp, sl->logits);
    lms__sampler_accept(r->smp, id);
    if (!r->p.gp.ignore_eos && is_end_id(s, r, id)) {
        *stop = LMS__SCHED_STOP_EOS;
        return 0;
    }
    memset(ev, 0, sizeof *ev);
    ev->kind = LMS__SEV_TOKEN;
    ev->token = id;
    if (r->p.logprobs || r->p.top_logprobs)
        fill_logprobs(sl->logits, s->info.n_vocab, ev, LMS_MIN(r->p.top_logprobs, LMS__SCHED_MAX_TOP));
    ev->prompt_tokens = (uint32_t)r->n_prompt;
    ev->cached_tokens = r->cached;
    ev->t = lms__now();
    *have_ev = true;
    r->last = id;
    r->n_gen++;
    if (r->p.gp.max_tokens && r->n_gen >= r->p.gp.max_tokens)
        *stop = LMS__SCHED_STOP_LENGTH;
    else if (r->n_prompt + r->n_gen >= s->info.n_ctx)
        *stop = LMS__SCHED_STOP_CTX;
    return 0;
}

/* ---- the thread --------------------------------------------------------------------- */

static size_t common_prefix(lms_engine *e, const lms__sreq *r)
{
    size_t n;
    const int32_t *cur = lms_engine_tokens(e, &n);
    size_t c = 0;
    while (c < n && c < r->n_prompt && cur[c] == r->prompt[c]) c++;
    return c;
}

/* Move queued requests into free slots (the best-matching free slot first). */
static void admit_locked(lms__sched *s)
{
    while (s->qhead && s->n_running < s->p.n_slots) {
        lms__sreq *r = s->qhead;
        s->qhead = r->next;
        if (!s->qhead)
            s->qtail = NULL;
        s->n_queued--;
        r->next = NULL;
        uint32_t best = UINT32_MAX;
        size_t best_c = 0;
        for (uint32_t k = 0; k < s->p.n_slots; k++) {
            if (s->slots[k].r)
                continue;
            /* reading a free slot's tokens: only this thread touches engines */
            size_t c = common_prefix(s->slots[k].e, r);
            if (best == UINT32_MAX || c > best_c) {
                best = k;
                best_c = c;
            }
        }
        assert(best != UINT32_MAX);
        s->slots[best].r = r;
        r->state = RQ_RUNNING;
        s->n_running++;
    }
}

static void publish_kv_locked(slot *sl)
{
    lms_kv_stats ks;
    lms_kv_get_stats(sl->e->kv, &ks);
    sl->kv_used = ks.used_pages + ks.window_used_pages;
    sl->kv_total = ks.n_pages + ks.window_pages;
}

static void *sched_main(void *arg)
{
    lms__sched *s = arg;
    pthread_mutex_lock(&s->mu);
    for (;;) {
        if (!s->stopping)
            admit_locked(s);
        uint32_t k = UINT32_MAX;
        for (uint32_t i = 0; i < s->p.n_slots; i++) {
            uint32_t j = (s->rr + i) % s->p.n_slots;
            if (s->slots[j].r) {
                k = j;
                break;
            }
        }
        if (k == UINT32_MAX) {
            if (s->stopping)
                break;
            pthread_cond_wait(&s->work, &s->mu);
            continue;
        }
        s->rr = k + 1;
        slot *sl = &s->slots[k];
        lms__sreq *r = sl->r;
        if (r->cancel || s->stopping) {
            end_slot_locked(s, k, LMS__SCHED_STOP_CANCELLED, 0);
            continue;
        }
        pthread_mutex_unlock(&s->mu);
        lms__sched_event ev;
        bool have_ev = false;
        int stop = 0;
        int rc = unit(s, sl, r, &ev, &have_ev, &stop);
        pthread_mutex_lock(&s->mu);
        if (rc) {
            snprintf(r->errmsg, sizeof r->errmsg, "%s", lms_last_error());
            lms__warn("serve: a request failed in slot %u: %s", k, r->errmsg);
        }
        publish_kv_locked(sl);
        if (!rc && have_ev)
            rc = push_event_locked(r, &ev);
        if (r->set_up && !r->hit_counted) {
            r->hit_counted = true;
            if (r->cached)
                s->prefix_hits++;
        }
        if (rc)
            end_slot_locked(s, k, LMS__SCHED_STOP_ERROR, rc); /* r may be freed here */
        else if (stop)
            end_slot_locked(s, k, stop, 0);
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
    if (!(s->slots = lms__calloc(s->p.n_slots, sizeof *s->slots))) {
        rc = LMS_ENOMEM;
        goto out_free;
    }
    for (uint32_t k = 0; k < s->p.n_slots; k++) {
        lms_engine_params ep = s->p.ep;
        ep.no_tokenizer = k > 0 || ep.no_tokenizer; /* one tokenizer serves all: it is immutable */
        if ((rc = lms_engine_create(model, &ep, &s->slots[k].e)))
            goto out_free;
        if (k == 0) {
            lms_engine_get_info(s->slots[0].e, &s->info);
            s->tok = lms_engine_tokenizer(s->slots[0].e);
        }
        if (!(s->slots[k].logits = lms__malloc((size_t)s->info.n_vocab * sizeof(float)))) {
            rc = LMS_ENOMEM;
            goto out_free;
        }
        publish_kv_locked(&s->slots[k]);
    }
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
    for (uint32_t k = 0; s->slots && k < s->p.n_slots; k++) {
        lms_engine_free(s->slots[k].e);
        lms__free(s->slots[k].logits);
    }
    lms__free(s->slots);
    pthread_cond_destroy(&s->work);
    pthread_mutex_destroy(&s->mu);
    lms__free(s);
}

lms_tokenizer *lms__sched_tokenizer(const lms__sched *s) { return s->tok; }

const lms_engine_info *lms__sched_info(const lms__sched *s) { return &s->info; }

int lms__sched_default_gen_params(const lms__sched *s, lms_gen_params *out)
{
    return lms_engine_default_gen_params(s->slots[0].e, out);
}

void lms__sched_get_stats(lms__sched *s, lms__sched_stats *o)
{
    memset(o, 0, sizeof *o);
    pthread_mutex_lock(&s->mu);
    o->n_slots = s->p.n_slots;
    o->running = s->n_running;
    o->queued = s->n_queued;
    for (uint32_t k = 0; k < s->p.n_slots; k++) {
        o->kv_pages_used += s->slots[k].kv_used;
        o->kv_pages_total += s->slots[k].kv_total;
    }
    o->prefix_hits_ram = s->prefix_hits;
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
    r->last = -1;
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
