/*
 * server/sched.h - the scheduler of `lmstore serve`: one thread per model
 * owns that model's compute; connection handlers submit requests to it and
 * it streams their tokens back as events.
 *
 * The HTTP side (server/http.c) never touches an engine: it submits prompt
 * ids with sampling settings, waits for events (one per generated token,
 * then one END), and cancels when its client goes away or a stop string
 * appears in the text. Everything about how sequences are computed is inside
 * sched.c (the batched engine, lmstore/batch.h: one forward pass over all
 * running requests), so that the engine under it can change without the
 * HTTP side noticing.
 *
 * Request life (each arrow names the function that makes it):
 *
 *   lms__sched_submit -> QUEUED --(a slot frees, sched thread)--> RUNNING
 *        RUNNING --(stop, max tokens, context, error, cancel)--> ENDED (END event)
 *        QUEUED --(lms__sched_cancel)--> ENDED (END event, stop_reason CANCELLED)
 *   lms__sched_release: the caller lets go (cancelling when not ENDED); the
 *   request is freed when the scheduler has let go too.
 *
 * Invariants:
 *  1. Only the scheduler thread calls into the batch.
 *  2. At most n_slots requests are RUNNING and at most max_queue QUEUED;
 *     submit beyond that fails at once with LMS_EBUSY (nothing queued).
 *  3. Every submitted request gets exactly one END event, last.
 *  4. A cancelled request stops within one scheduler step (one decode token
 *     or one prompt chunk of every running request), and its slot and KV
 *     pages are free for the next.
 *
 * Thread safety: every function may be called from any thread, except that
 * one request handle is used by one thread at a time.
 */
#ifndef LMS_SERVER_SCHED_H
#define LMS_SERVER_SCHED_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lmstore/engine.h"
#include "lmstore/loader.h"
#include "lmstore/tokenizer.h"

#define LMS__SCHED_MAX_TOP 20 /* alternatives per token (OpenAI's top_logprobs bound) */

typedef struct lms__sched lms__sched;
typedef struct lms__sreq lms__sreq;

typedef struct lms__sched_params {
    uint32_t n_slots;       /* requests computed at once; 0 = 1 */
    uint32_t max_queue;     /* requests waiting for a slot beyond those; 0 = none wait */
    uint32_t prefill_chunk; /* rows of one forward step (decode tokens and prompt chunks); 0 = the
                               batch's default */
    lms_engine_params ep;   /* the engine's settings; ep.n_ctx is one request's context */
    lms_store *prefix_store;     /* NULL: no persistent prefix cache (lms_batch_params) */
    uint32_t prefix_min_tokens;  /* 0 = the batch's default */
    uint64_t prefix_disk_budget; /* 0 = unlimited */
} lms__sched_params;

typedef struct lms__sreq_params {
    lms_gen_params gp;       /* max_tokens (0 = to the context end), sampling, seed, ignore_eos;
                                stop strings are the caller's business (text side) */
    const int32_t *stop_ids; /* more ids that end the request like EOS (chat end of turn); copied */
    size_t n_stop_ids;
    uint32_t top_logprobs;   /* alternatives reported per token, <= LMS__SCHED_MAX_TOP */
    bool logprobs;           /* report the sampled token's log probability */
} lms__sreq_params;

enum lms__sched_stop {
    LMS__SCHED_STOP_EOS = 1,      /* an EOS or stop id was sampled (not reported as a token) */
    LMS__SCHED_STOP_LENGTH,       /* max_tokens reached */
    LMS__SCHED_STOP_CTX,          /* the context is full */
    LMS__SCHED_STOP_CANCELLED,    /* lms__sched_cancel or shutdown */
    LMS__SCHED_STOP_ERROR,        /* the engine failed: error, message */
};

enum lms__sched_kind { LMS__SEV_TOKEN = 1, LMS__SEV_END = 2 };

typedef struct lms__sched_event {
    int kind;                /* lms__sched_kind */
    int32_t token;           /* TOKEN: the id */
    float logprob;           /* TOKEN with logprobs: log softmax of the raw logits at token */
    uint32_t n_top;          /* TOKEN: alternatives in top_ids/top_lp, most probable first */
    int32_t top_ids[LMS__SCHED_MAX_TOP];
    float top_lp[LMS__SCHED_MAX_TOP];
    int stop;                /* END: lms__sched_stop */
    int error;               /* END with STOP_ERROR: the LMS_E* code */
    uint32_t prompt_tokens;  /* the prompt's length */
    uint32_t cached_tokens;  /* prompt tokens whose K/V were reused instead of computed */
    double t;                /* lms__now() when the event was made */
    const char *message;     /* END with STOP_ERROR: the detail (valid until lms__sched_release) */
} lms__sched_event;

typedef struct lms__sched_stats {
    uint32_t n_slots, running, queued;
    uint32_t kv_pages_used, kv_pages_total; /* the batch's one arena */
    uint64_t prefix_hits_ram;               /* requests that reused cached prompt K/V */
    uint64_t prefix_hits_store;             /* ... resumed from the prefix store */
    uint32_t n_ctx;                         /* one request's context */
} lms__sched_stats;

/*
 * Create the slots' engines over `model` (borrowed; it must outlive the
 * scheduler) and start the scheduler thread. Errors of lms_engine_create
 * (the detail names the model), LMS_ENOMEM, LMS_EIO (thread). On failure
 * *out is NULL.
 */
int lms__sched_create(lms_model *model, const lms__sched_params *p, lms__sched **out);
/* Cancel every request, stop the thread, free the engines. NULL ok. Requests
 * not yet released stay valid (they get their END) until released. */
void lms__sched_free(lms__sched *s);

/* The model's tokenizer (NULL without one) and engine info; valid while s lives. */
lms_tokenizer *lms__sched_tokenizer(const lms__sched *s);
const lms_engine_info *lms__sched_info(const lms__sched *s);
void lms__sched_get_stats(lms__sched *s, lms__sched_stats *out);
/* The model's sampling defaults (lms_engine_default_gen_params; errors as there). */
int lms__sched_default_gen_params(const lms__sched *s, lms_gen_params *out);

/*
 * Submit prompt[0..n) (copied). Errors: LMS_EINVAL (empty prompt, id
 * outside the vocabulary, bad sampling setting: named), LMS_ENOSPACE (the
 * prompt, or the prompt plus max_tokens, does not fit the context: the
 * detail gives the numbers), LMS_EBUSY (every slot busy and the queue full),
 * LMS_ECANCELED (the scheduler is shutting down). On failure *out is NULL.
 */
int lms__sched_submit(lms__sched *s, const int32_t *prompt, size_t n, const lms__sreq_params *p,
                      lms__sreq **out);
/*
 * Wait up to timeout_ms (< 0: forever) for the request's next event. Returns
 * 1 with *ev filled, 0 on timeout. After the END event it returns the END
 * event again.
 */
int lms__sched_next(lms__sreq *r, lms__sched_event *ev, int timeout_ms);
/* Ask the request to stop (idempotent; any thread). */
void lms__sched_cancel(lms__sreq *r);
/* The caller is done with r (cancels it when not ended). NULL ok. */
void lms__sched_release(lms__sreq *r);

#endif
