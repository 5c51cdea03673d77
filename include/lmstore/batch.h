/*
 * lmstore/batch.h - [EXPERIMENTAL] the batched engine: many sequences decoded
 * together, one forward pass per step over all of them, for servers
 * (`lmstore serve`). The shape of this API may still change between
 * releases; lmstore/engine.h is the stable single-sequence engine.
 *
 * A batch owns an engine (weights read in place, tokenizer, one paged KV
 * arena shared by all its sequences). Requests are admitted with
 * lms_batch_add and advanced by lms_batch_step: each step gathers the
 * decode token of every running sequence and chunks of pending prompts
 * (prefill) into one block of at most step_tokens rows, reads every weight
 * once for the block, writes each row's K/V into its own sequence's pages,
 * and samples one token per sequence whose prompt is done.
 *
 * Prefix reuse: a prompt that starts with whole KV pages another sequence
 * computed (the KV cache's prefix index, in RAM) attaches those pages; with
 * a prefix_store, prompts' whole-page prefixes of at least
 * prefix_min_tokens are also saved into the store as KV sessions named
 * "prefix-<model id>-<hash of the token ids>" and resumed from there by a
 * later batch, also in another process, for every prompt that starts with
 * some of a stored prompt's pages. The store's disk budget for them is
 * kept by removing the least recently used ones (their pages are reclaimed
 * by `lmstore gc` like any removed session's).
 *
 * Admission and preemption: a request is admitted when a sequence slot is
 * free and the arena's free and cached pages can hold its prompt (plus one
 * page); otherwise lms_batch_add says LMS_ENOSPACE and the caller queues it.
 * When the arena runs out while sequences grow, the most recently admitted
 * sequence is preempted: its pages are released (their full pages stay in
 * the prefix cache, so little is recomputed) and it is run again from its
 * prompt plus the tokens it has generated so far, without delivering those
 * again. Its output is unchanged by the preemption for greedy decoding and
 * for seeded sampling alike (its sampler state is kept).
 *
 * Devices: on the CPU a step is one forward pass over all rows. The CUDA
 * backend takes one sequence per pass: there a step runs one pass per
 * sequence (results are the same, without the batching speed-up).
 *
 * Thread safety: one thread drives a batch (every call on it but the
 * tokenizer's use); the batch runs its own worker threads inside calls. Lifetimes: the model must stay open
 * until lms_batch_free; the prefix store must stay open until lms_batch_free.
 *
 * Errors follow lmstore/error.h: 0 or a negative LMS_E* code, detail in
 * lms_last_error().
 */
#ifndef LMSTORE_BATCH_H
#define LMSTORE_BATCH_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lmstore/engine.h"
#include "lmstore/error.h"
#include "lmstore/types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lms_batch lms_batch;

typedef struct lms_batch_params {
    uint32_t max_seqs;           /* sequences running at once (server --parallel); 0 = 16 */
    uint32_t step_tokens;        /* rows per forward step: decode tokens of all running sequences
                                    plus prefill chunks; 0 = max(max_seqs, 64); at least max_seqs */
    lms_store *prefix_store;     /* NULL: no persistent prefix cache. Borrowed: open (read-write
                                    for saving) until lms_batch_free */
    uint32_t prefix_min_tokens;  /* whole-page prompt prefixes at least this long are saved to and
                                    looked up in prefix_store; 0 = 256 */
    uint64_t prefix_disk_budget; /* bytes of persisted prefixes kept (least recently used removed
                                    first; each session's pages counted whole); 0 = unlimited */
} lms_batch_params;

LMS_API lms_batch_params lms_batch_default_params(void);

/*
 * Create a batch over `model` (borrowed: open until lms_batch_free).
 * ep: the engine's settings (NULL = lms_engine_default_params()); n_ctx is
 * per sequence, and kv_bytes 0 here means room for max_seqs sequences of
 * min(n_ctx, 1024) tokens, or two of n_ctx, whichever is more (with as many
 * pages again for the prefix cache). With a prefix_store, the prefix
 * sessions of this model found there are indexed now.
 * Errors: those of lms_engine_create, LMS_EINVAL (bad params). On failure
 * *out is NULL and nothing needs freeing.
 */
LMS_API int lms_batch_create(lms_model *model, const lms_engine_params *ep, const lms_batch_params *bp,
                             lms_batch **out);
/* Free the batch; running sequences are dropped, and so are prefixes queued
 * for saving that no step has saved yet. NULL ok. */
LMS_API void lms_batch_free(lms_batch *b);

/* The model's tokenizer (owned by the batch, valid while b lives), or NULL.
 * Immutable: other threads may encode and decode with it while the driving
 * thread steps (lmstore/tokenizer.h). */
LMS_API lms_tokenizer *lms_batch_tokenizer(lms_batch *b);
/* The engine's settings in effect (n_ctx per sequence, EOS ids, device ...);
 * pointers in *out are valid while b lives. */
LMS_API void lms_batch_get_info(const lms_batch *b, lms_engine_info *out);
/* The model's sampling defaults (lms_engine_default_gen_params). */
LMS_API int lms_batch_default_gen_params(const lms_batch *b, lms_gen_params *out);

/*
 * Admit a request: prompt ids [0, n) and its sampling settings (gp: copied;
 * NULL = greedy defaults). max_tokens, temperature, top_k, top_p, min_p,
 * repeat_penalty/window, seed, ignore_eos and no_prefix_reuse apply; stop
 * strings are the caller's (it cancels the sequence when one appears). The
 * longest prefix of the prompt found in the RAM prefix cache or the prefix
 * store is attached rather than computed. *id: the request's id (never 0,
 * never reused by this batch).
 * Errors: LMS_EINVAL (n == 0, an id outside the vocabulary, bad sampling
 * settings: named), LMS_ERANGE (the prompt can never run: it does not fit
 * n_ctx or the whole arena), LMS_ENOSPACE (not now: every slot is busy, or
 * too few free KV pages; the detail says which): the caller queues the
 * request and tries again after a step. After a failure nothing changed.
 */
LMS_API int lms_batch_add(lms_batch *b, const int32_t *prompt, size_t n, const lms_gen_params *gp, uint64_t *id);

/* More of a request than its sampling settings (lms_batch_add_ex). */
#define LMS_BATCH_MAX_TOP 20
typedef struct lms_batch_req {
    const lms_gen_params *gp;   /* sampling settings (copied; NULL = greedy defaults), as lms_batch_add */
    const int32_t *stop_ids;    /* more ids that end the request as EOS does (a chat template's end of
                                   turn); copied. NULL when n_stop_ids is 0 */
    size_t n_stop_ids;
    uint32_t top_logprobs;      /* alternatives reported with each token, 0 .. LMS_BATCH_MAX_TOP */
    bool no_logprob;            /* leave lms_batch_event.logprob 0 (with top_logprobs 0): spares the
                                   log-softmax over the vocabulary for every token */
} lms_batch_req;

/* lms_batch_add with stop ids and top log-probabilities (errors as there;
 * LMS_EINVAL for top_logprobs over LMS_BATCH_MAX_TOP). */
LMS_API int lms_batch_add_ex(lms_batch *b, const int32_t *prompt, size_t n, const lms_batch_req *rq, uint64_t *id);

typedef struct lms_batch_event {
    uint64_t id;                /* the request */
    int32_t token;              /* the sampled token (with LMS_STOP_EOS: the EOS id, not to be shown;
                                   with LMS_STOP_CTX: -1, no token) */
    float logprob;              /* log-probability of token under the model's distribution (the
                                   log-softmax of its logits, before temperature and filters) */
    int stop_reason;            /* lms_stop_reason: LMS_STOP_NONE while running; otherwise this is the
                                   request's last event and its id is gone after the step */
    uint32_t prompt_tokens;     /* prompt length */
    uint32_t cached_tokens;     /* prompt tokens reused from the prefix cache (RAM or store) */
    uint32_t n_top;             /* the request's top_logprobs (0 for lms_batch_add): the most probable
                                   ids and their log-probabilities, most probable first */
    int32_t top_ids[LMS_BATCH_MAX_TOP];
    float top_logprobs[LMS_BATCH_MAX_TOP];
} lms_batch_event;

/*
 * One forward pass over every running sequence (prefill chunks and decode
 * tokens together); the tokens it produced, at most one per sequence, into
 * ev[0, *n_ev). cap must be at least max_seqs. Between steps at most one
 * prompt prefix is saved into the prefix store (a failed save is logged and
 * skipped, never an error of the step). With nothing running, *n_ev = 0 at
 * once. Errors: LMS_EINVAL (cap < max_seqs), LMS_EDEVICE (a device operation
 * failed), LMS_ENOMEM: no event is delivered and every sequence is as it was
 * before the step (the step may be tried again, or the requests cancelled).
 */
LMS_API int lms_batch_step(lms_batch *b, lms_batch_event *ev, size_t cap, size_t *n_ev);

/* Stop request `id` now (client gone, stop string seen): its pages are
 * released at once (full prompt pages stay in the prefix cache). LMS_ENOENT
 * for an id not running (finished, cancelled or never admitted). */
LMS_API int lms_batch_cancel(lms_batch *b, uint64_t id);

typedef struct lms_batch_stats {
    uint32_t running;           /* admitted sequences not finished (including preempted ones) */
    uint32_t waiting_pages;     /* preempted sequences waiting for KV pages to run again */
    uint32_t kv_pages_used, kv_pages_total; /* pages referenced by sequences / in the arena */
    uint64_t prefix_hits_ram;   /* admissions that reused a prefix from the RAM prefix cache */
    uint64_t prefix_hits_store; /* ... resumed from the prefix store */
    uint64_t prefix_saves;      /* prefixes saved into the prefix store */
    uint64_t preemptions;       /* sequences preempted (released and recomputed later) */
    uint64_t steps;             /* forward steps run */
} lms_batch_stats;

LMS_API void lms_batch_get_stats(const lms_batch *b, lms_batch_stats *out);

#ifdef __cplusplus
}
#endif
#endif
