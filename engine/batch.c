/*
 * engine/batch.c - lms_batch (include/lmstore/batch.h, experimental): many
 * sequences decoded together over one engine's weights and KV arena.
 *
 * ---- Design notes ---------------------------------------------------------
 *
 * A batch owns an engine (lms__engine_create_model with room for max_seqs
 * more KV sequences and forward passes of step_tokens rows) and a table of
 * max_seqs slots. A slot's sequence knows every token of its request,
 * toks[0, n_toks): the prompt, then each sampled token. Its KV sequence
 * holds K/V for toks[0, n_done). The work of a sequence is always the same:
 * run toks[n_done, n_toks) through the model; when a step runs the last of
 * them, that row's logits give the next token. A prompt (prefill) and a
 * decode token differ only in how many rows are left.
 *
 *   slot states:   FREE --add--> RUN --(stop: EOS, max_tokens, ctx)--> FREE
 *                                 RUN --cancel--> FREE
 *                                 RUN --preempt (no page left)--> WAIT
 *                                 WAIT --readmit (pages again)--> RUN
 *                                 WAIT --cancel--> FREE
 *
 * A step (lms_batch_step):
 *   1. save_one: at most one queued prompt prefix is saved into the prefix
 *      store (between steps: the caller has the last step's events already);
 *   2. readmit: waiting sequences, oldest first, get a KV sequence again
 *      (attaching what the prefix cache still holds of their tokens);
 *   3. plan: every running sequence with one row left (decode) gets it, then
 *      prefills get chunks of what is left of step_tokens, in admission
 *      order; each planned sequence reserves its positions (append); when
 *      the arena has no page left, the most recently admitted sequence is
 *      preempted (its KV sequence freed, its full pages staying in the
 *      prefix cache) until the append succeeds or the sequence is alone;
 *   4. one forward pass over all planned rows (segments, engine/backend.h;
 *      the CPU and CUDA backends); on a backend without segments, one pass
 *      per sequence;
 *   5. commit, then sample each sequence that ran its last known token and
 *      report an event; finished sequences free their slot.
 *
 * Invariants:
 *   (1) For a RUN slot, lms_kv_seq_len(kv) == lms_kv_seq_committed(kv) ==
 *       n_done < n_toks <= n_ctx between calls; a WAIT slot has no kv.
 *   (2) A request's sampler sees exactly what lms_generate's would: the
 *       prompt's last repeat_window ids, then each sampled id once, in order,
 *       whatever preemptions happen (preemption keeps the sampler), so
 *       greedy and seeded outputs do not depend on the batch around them
 *       (up to float rounding of batched matrix products).
 *   (3) Prefix sessions in the store are named "prefix-<16 hex of the model
 *       id>-<32 hex of XXH3-128(model id, K/V dtype, page tokens, token
 *       ids)>" and hold whole pages only; the index (pfx) mirrors the
 *       store's such sessions of this model and layout with their page
 *       keys, read at create and kept by this batch's saves, resumes and
 *       removals. A prompt matches a session on the leading pages whose
 *       chained keys (lms__kv_page_key) are equal, so a stored system
 *       prompt serves prompts that go on differently after it.
 *
 * Nothing on the token path allocates but the prefix store's saves and
 * resumes (I/O buffers).
 */
#include <assert.h>
#include <math.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "engine/backend.h"
#include "engine/engine_priv.h"
#include "engine/sampler.h"
#include "kvcache/kv_internal.h" /* lms__kv_page_key: the chained page keys a prompt would have */
#include "lmstore/batch.h"
#include "lmstore/loader.h"

enum { SLOT_FREE = 0, SLOT_RUN, SLOT_WAIT };

typedef struct bseq {
    int state;
    uint64_t id;
    uint64_t order;        /* admission order (preemption takes the highest) */
    lms_kv_seq *kv;        /* RUN: K/V of toks[0, n_done) */
    lms__kvview view;      /* geometry of the engine's view, this sequence's tables */
    int32_t *toks;         /* [n_ctx + 1] prompt then sampled ids */
    uint32_t n_prompt, n_toks, n_done, n_gen, cached;
    lms_gen_params gp;     /* stop strings dropped */
    lms__sampler *smp;
    int32_t *stop_ids;     /* [n_stop_ids] ids that end it as EOS does (owned) */
    size_t n_stop_ids;
    uint32_t n_top;        /* alternatives reported per token */
    bool logprob;          /* report the sampled token's log-probability */
} bseq;

/* A prefix session of the store (invariant 3). */
typedef struct pfx {
    char hex[33];          /* the hash's hex digits, as in the name */
    uint32_t n_tokens;
    uint64_t bytes, last_used;
    lms_hash128 *keys;     /* [n_tokens / P] its pages' content keys (chained: key i stands for
                              tokens [0, (i + 1) P)), or NULL when they could not be read */
} pfx;

/* A prompt prefix to save: its tokens (owned). */
typedef struct save_job {
    int32_t *toks;
    uint32_t n;
    char hex[33];
} save_job;

#define SAVE_QUEUE 16

struct lms_batch {
    lms_engine *e;
    lms_batch_params p;
    uint32_t n_ctx, P, V;
    bseq *seqs;            /* [max_seqs] */
    uint64_t next_id, next_order;
    /* one step's plan: row tokens, segments (one per planned sequence), rows wanting logits */
    int32_t *rows;         /* [step_tokens] */
    lms__seg *segs;        /* [max_seqs] */
    uint32_t *seg_seq;     /* [max_seqs] the slot of each segment */
    uint32_t *out_rows;    /* [max_seqs] */
    uint32_t *out_seq;     /* [max_seqs] the slot of each logits row */
    float *logits;         /* [max_seqs][n_vocab] */
    /* the prefix store */
    char model_hex[17];
    pfx *pfx;
    size_t n_pfx, cap_pfx;
    save_job saves[SAVE_QUEUE];
    uint32_t n_saves;
    lms_hasher *hasher;
    lms_batch_stats st;
};

lms_batch_params lms_batch_default_params(void)
{
    lms_batch_params p;
    memset(&p, 0, sizeof p);
    p.max_seqs = 16;
    p.prefix_min_tokens = 256;
    return p;
}

/* ---- the prefix store's index ------------------------------------------------------------------ */

static void pfx_name(const lms_batch *b, const char *hex, char *out, size_t n)
{
    snprintf(out, n, "prefix-%s-%s", b->model_hex, hex);
}

/* Start the hash of a prefix: model id, K/V dtype, page tokens (invariant 3). */
static void pfx_hash_begin(const lms_batch *b, lms_hasher *hs)
{
    uint32_t lay[2] = {(uint32_t)b->e->p.kv_dtype, b->P};
    lms__hasher_reset(hs);
    lms__hasher_update(hs, lms_kv_model_id(b->e->kv), LMS_MODEL_ID_LEN);
    lms__hasher_update(hs, lay, sizeof lay);
}

static pfx *pfx_find(lms_batch *b, const char *hex)
{
    for (size_t i = 0; i < b->n_pfx; i++)
        if (!strcmp(b->pfx[i].hex, hex))
            return &b->pfx[i];
    return NULL;
}

static int pfx_add(lms_batch *b, const char *hex, uint32_t n_tokens, uint64_t bytes, uint64_t last_used)
{
    if (b->n_pfx == b->cap_pfx) {
        size_t cap = b->cap_pfx ? 2 * b->cap_pfx : 64;
        pfx *np = lms__realloc(b->pfx, cap * sizeof *np);
        if (!np)
            return LMS_ENOMEM;
        b->pfx = np;
        b->cap_pfx = cap;
    }
    pfx *x = &b->pfx[b->n_pfx++];
    snprintf(x->hex, sizeof x->hex, "%s", hex);
    x->n_tokens = n_tokens;
    x->bytes = bytes;
    x->last_used = last_used;
    x->keys = NULL;
    return 0;
}

static void pfx_remove(lms_batch *b, pfx *x)
{
    lms__free(x->keys);
    *x = b->pfx[--b->n_pfx];
}

typedef struct keys_ctx {
    pfx *x;
    uint32_t n;
} keys_ctx;

/* The group-0 page keys of a prefix session (lms_kv_session page callback). */
static int keys_cb(void *ctx, const lms_kv_page_info *pi)
{
    keys_ctx *k = ctx;
    if (!pi->window && pi->index < k->n && pi->present)
        k->x->keys[pi->index] = lms__hash128_get(pi->key);
    return 0;
}

static int bytes_cb(void *ctx, const lms_kv_session_info *si)
{
    ((keys_ctx *)ctx)->x->bytes = si->stored_bytes;
    return 0;
}

/* Read x's page keys (and stored bytes) from the store; without them the
 * session is never matched (a failure is only logged). */
static void pfx_read_keys(lms_batch *b, pfx *x)
{
    char name[128];
    keys_ctx k = {x, x->n_tokens / b->P};
    pfx_name(b, x->hex, name, sizeof name);
    lms__free(x->keys);
    if (!(x->keys = lms__calloc(k.n ? k.n : 1, sizeof *x->keys)) ||
        lms_kv_session(b->p.prefix_store, name, bytes_cb, keys_cb, &k)) {
        lms__debug("batch: prefix session '%s': page keys not read: %s", name, lms_last_error());
        lms_clear_error();
        lms__free(x->keys);
        x->keys = NULL;
    }
}


/* The store's prefix sessions of this model and K/V layout (lms_kv_sessions callback). */
static int pfx_scan_cb(void *ctx, const lms_kv_session_info *si)
{
    lms_batch *b = ctx;
    char want[32];
    snprintf(want, sizeof want, "prefix-%s-", b->model_hex);
    size_t wl = strlen(want);
    if (strncmp(si->name, want, wl) || strlen(si->name) != wl + 32 || !si->n_tokens)
        return 0;
    if (memcmp(si->model_id, lms_kv_model_id(b->e->kv), LMS_MODEL_ID_LEN) || si->layout.dtype != b->e->p.kv_dtype ||
        si->layout.page_tokens != b->P)
        return 0;
    return pfx_add(b, si->name + wl, si->n_tokens, si->stored_bytes, si->last_used);
}

/* Remove least recently used prefix sessions until the budget holds (the
 * newest one, `keep`, stays even alone over the budget). */
static void pfx_enforce_budget(lms_batch *b, const char *keep)
{
    if (!b->p.prefix_disk_budget)
        return;
    for (;;) {
        uint64_t total = 0;
        pfx *old = NULL;
        for (size_t i = 0; i < b->n_pfx; i++) {
            total += b->pfx[i].bytes;
            if (strcmp(b->pfx[i].hex, keep) && (!old || b->pfx[i].last_used < old->last_used))
                old = &b->pfx[i];
        }
        if (total <= b->p.prefix_disk_budget || !old)
            return;
        char name[128];
        pfx_name(b, old->hex, name, sizeof name);
        int rc = lms_kv_session_rm(b->p.prefix_store, name);
        if (rc && rc != LMS_ENOENT) {
            lms__warn("batch: prefix session '%s' could not be removed: %s", name, lms_last_error());
            return;
        }
        lms__debug("batch: prefix session '%s' removed (disk budget %llu bytes)", name,
                   (unsigned long long)b->p.prefix_disk_budget);
        pfx_remove(b, old);
    }
}

static uint64_t now_s(void) { return (uint64_t)time(NULL); }

/* Queue the whole-page prefix of a computed prompt for saving, if it is long
 * enough and not stored yet. */
static void queue_save(lms_batch *b, const bseq *s)
{
    uint32_t n = s->n_prompt / b->P * b->P;
    if (!b->p.prefix_store || n < b->p.prefix_min_tokens || n == 0 || b->n_saves == SAVE_QUEUE)
        return;
    pfx_hash_begin(b, b->hasher);
    lms__hasher_update(b->hasher, s->toks, (size_t)n * sizeof(int32_t));
    char hex[33];
    lms__hash128_hex(lms__hasher_digest(b->hasher), hex);
    if (pfx_find(b, hex))
        return;
    for (uint32_t i = 0; i < b->n_saves; i++)
        if (!strcmp(b->saves[i].hex, hex))
            return;
    int32_t *t = lms__malloc((size_t)n * sizeof *t);
    if (!t) {
        lms_clear_error();
        return;
    }
    memcpy(t, s->toks, (size_t)n * sizeof *t);
    save_job *j = &b->saves[b->n_saves++];
    j->toks = t;
    j->n = n;
    memcpy(j->hex, hex, sizeof hex);
}

/* Save the oldest queued prefix: its pages, still in the arena's prefix
 * cache, are attached to a temporary sequence that is saved and freed. A
 * failure is logged and the prefix dropped. */
static void save_one(lms_batch *b)
{
    if (!b->n_saves)
        return;
    save_job j = b->saves[0];
    memmove(b->saves, b->saves + 1, (b->n_saves - 1) * sizeof *b->saves);
    b->n_saves--;
    lms_kv *kv = b->e->kv;
    lms_kv_seq *s = NULL;
    uint32_t nr = 0;
    char name[128];
    pfx_name(b, j.hex, name, sizeof name);
    if (lms_kv_lookup(kv, j.toks, j.n, &s, &nr) || nr != j.n) {
        lms__debug("batch: prefix of %u tokens no longer in the KV cache (%u found): not saved", j.n, nr);
        lms_clear_error();
        goto out;
    }
    double t0 = lms__now();
    lms_kv_save_params sp = lms_kv_default_save_params();
    sp.threads = b->e->p.threads; /* the engine's CPU threads (a GPU engine's pool has one) */
    if (lms_kv_save_ex(kv, s, b->p.prefix_store, name, &sp, NULL)) {
        lms__warn("batch: saving prefix session '%s' failed: %s", name, lms_last_error());
        goto out;
    }
    if (pfx_add(b, j.hex, j.n, 0, now_s()) == 0) {
        pfx *x = &b->pfx[b->n_pfx - 1];
        pfx_read_keys(b, x);
        b->st.prefix_saves++;
        lms__debug("batch: prefix session '%s' (%u tokens, %llu bytes) saved in %.1f ms", name, j.n,
                   (unsigned long long)x->bytes, (lms__now() - t0) * 1e3);
        pfx_enforce_budget(b, j.hex);
    }
out:
    lms_kv_seq_free(kv, s);
    lms__free(j.toks);
}

/* The longest run of whole pages of toks[0, n) that a prefix session holds
 * (its page keys match the prompt's chained keys: the prompt may go on
 * differently after it), as a new KV sequence resumed from the store and cut
 * to that run; NULL and *n_reused 0 when none beats `have` tokens or resuming
 * fails. */
static lms_kv_seq *store_lookup(lms_batch *b, const int32_t *toks, uint32_t n, uint32_t have, uint32_t *n_reused)
{
    lms_kv *kv = b->e->kv;
    uint32_t np = n / b->P, best_m = 0;
    *n_reused = 0;
    if (!b->p.prefix_store || !b->n_pfx || np * b->P <= have)
        return NULL;
    lms_hash128 *keys = lms__malloc((size_t)np * sizeof *keys), parent = {0, 0};
    if (!keys) {
        lms_clear_error();
        return NULL;
    }
    for (uint32_t i = 0; i < np; i++) keys[i] = parent = lms__kv_page_key(kv, parent, toks + (size_t)i * b->P, b->P);
    pfx *best = NULL;
    for (size_t j = 0; j < b->n_pfx; j++) {
        pfx *x = &b->pfx[j];
        uint32_t m = 0, xn = x->n_tokens / b->P;
        while (x->keys && m < np && m < xn && lms__hash128_eq(x->keys[m], keys[m])) m++;
        if (m > best_m || (m == best_m && m && x->n_tokens < best->n_tokens)) /* the least to read */
            best = x, best_m = m;
    }
    lms__free(keys);
    if (!best || best_m * b->P <= have || best_m * b->P < b->p.prefix_min_tokens)
        return NULL;
    char name[128];
    lms_kv_seq *s = NULL;
    pfx_name(b, best->hex, name, sizeof name);
    lms_kv_resume_params rp = lms_kv_default_resume_params();
    rp.threads = b->e->p.threads;
    int rc = lms_kv_resume_ex(kv, b->p.prefix_store, name, &rp, &s, NULL);
    if (rc) {
        lms__debug("batch: prefix session '%s' not resumed: %s", name, lms_last_error());
        if (rc == LMS_ENOENT || rc == LMS_ECORRUPT || rc == LMS_EMISMATCH || rc == LMS_EFORMAT || rc == LMS_EVERSION)
            pfx_remove(b, best); /* gone or unusable: not tried again */
        lms_clear_error();
        return NULL;
    }
    /* cut to the matching run (sliding-window pages permitting), and check the tokens themselves */
    uint32_t m = lms_kv_seq_keepable(kv, s, best_m * b->P);
    bool same = m > have && lms_kv_seq_truncate(kv, s, m) == 0;
    for (uint32_t i = 0; same && i < m; i++) same = lms_kv_seq_token(kv, s, i) == toks[i];
    if (!same) {
        lms_kv_seq_free(kv, s);
        lms_clear_error();
        return NULL;
    }
    best->last_used = now_s();
    *n_reused = m;
    return s;
}

/* ---- creation ------------------------------------------------------------------------------------- */

int lms_batch_create(lms_model *model, const lms_engine_params *ep_in, const lms_batch_params *bp,
                     lms_batch **out)
{
    int rc;
    if (!out)
        return lms__err(LMS_EINVAL, "lms_batch_create: out is NULL");
    *out = NULL;
    if (!model)
        return lms__err(LMS_EINVAL, "lms_batch_create: model is NULL");
    lms_batch *b = lms__calloc(1, sizeof *b);
    if (!b)
        return LMS_ENOMEM;
    b->p = bp ? *bp : lms_batch_default_params();
    if (!b->p.max_seqs)
        b->p.max_seqs = 16;
    if (!b->p.prefix_min_tokens)
        b->p.prefix_min_tokens = 256;
    if (!b->p.step_tokens)
        b->p.step_tokens = LMS_MAX(b->p.max_seqs, 64u);
    if (b->p.max_seqs > 4096 || b->p.step_tokens < b->p.max_seqs || b->p.step_tokens > 8192) {
        rc = lms__err(LMS_EINVAL, "batch: max_seqs %u and step_tokens %u: need 1..4096 sequences and "
                                  "max_seqs <= step_tokens <= 8192",
                      b->p.max_seqs, b->p.step_tokens);
        goto fail;
    }
    lms_engine_params ep = ep_in ? *ep_in : lms_engine_default_params();
    /* the arena: max_seqs sequences of min(n_ctx, 1024) tokens, or two of n_ctx */
    uint32_t n_ctx = ep.n_ctx, P = ep.kv_page_tokens ? ep.kv_page_tokens : LMS_KV_PAGE_TOKENS_DEFAULT;
    if (!n_ctx)
        n_ctx = 4096; /* the engine's default is at most this */
    uint64_t per = (LMS_MIN(n_ctx, 1024u) + P - 1) / P + 1, whole = (n_ctx + P - 1) / P + 1;
    lms__engine_opts eo = {b->p.max_seqs, LMS_MAX(b->p.max_seqs * per, 2 * whole), b->p.step_tokens};
    if ((rc = lms__engine_create_model(model, &ep, &eo, &b->e)))
        goto fail;
    lms_engine *e = b->e;
    b->n_ctx = e->p.n_ctx;
    b->P = e->p.kv_page_tokens;
    b->V = e->hp.n_vocab;
    uint32_t S = b->p.max_seqs;
    if (!(b->seqs = lms__calloc(S, sizeof *b->seqs)) || !(b->rows = lms__malloc(b->p.step_tokens * sizeof(int32_t))) ||
        !(b->segs = lms__calloc(S, sizeof *b->segs)) || !(b->seg_seq = lms__calloc(S, sizeof(uint32_t))) ||
        !(b->out_rows = lms__calloc(S, sizeof(uint32_t))) || !(b->out_seq = lms__calloc(S, sizeof(uint32_t))) ||
        !(b->logits = lms__aligned_alloc(64, (size_t)S * b->V * sizeof(float))) ||
        !(b->hasher = lms__hasher_new())) {
        rc = LMS_ENOMEM;
        goto fail;
    }
    memset(b->logits, 0, (size_t)S * b->V * sizeof(float)); /* touched now: RSS flat while tokens flow */
    for (uint32_t i = 0; i < S; i++) {
        if (!(b->seqs[i].toks = lms__calloc((size_t)b->n_ctx + 1, sizeof(int32_t)))) {
            rc = LMS_ENOMEM;
            goto fail;
        }
        b->seqs[i].view = e->kvv;
    }
    const uint8_t *mid = lms_kv_model_id(e->kv);
    for (int i = 0; i < 8; i++) snprintf(b->model_hex + 2 * i, 3, "%02x", mid[i]);
    if (b->p.prefix_store) {
        if ((rc = lms_kv_sessions(b->p.prefix_store, pfx_scan_cb, b)))
            goto fail;
        for (size_t i = 0; i < b->n_pfx; i++) pfx_read_keys(b, &b->pfx[i]);
        /* a device arena's page-locked I/O ring now, not in the first prefix hit's time to first
         * token; without it saves and resumes still work (they make their own) */
        if (lms__kv_io_reserve(e->kv, e->p.threads)) {
            lms__debug("batch: the KV I/O ring was not reserved: %s", lms_last_error());
            lms_clear_error();
        }
    }
    b->next_id = 1;
    b->st.kv_pages_total = lms_kv_n_pages(e->kv);
    lms__debug("batch: %u sequences, %u rows per step, %u KV pages of %u tokens, %zu stored prefixes%s", S,
               b->p.step_tokens, b->st.kv_pages_total, b->P, b->n_pfx,
               lms__fwd_has_segments(e->fwd) ? "" : " (one forward pass per sequence on this backend)");
    *out = b;
    return 0;
fail:
    lms_batch_free(b);
    return rc;
}

static void seq_release(lms_batch *b, bseq *s)
{
    lms_kv_seq_free(b->e->kv, s->kv);
    s->kv = NULL;
    lms__sampler_free(s->smp);
    s->smp = NULL;
    lms__free(s->stop_ids);
    s->stop_ids = NULL;
    s->n_stop_ids = 0;
    s->state = SLOT_FREE;
}

void lms_batch_free(lms_batch *b)
{
    if (!b)
        return;
    if (b->seqs) {
        for (uint32_t i = 0; i < b->p.max_seqs; i++) {
            if (b->seqs[i].state != SLOT_FREE)
                seq_release(b, &b->seqs[i]);
            lms__free(b->seqs[i].toks);
        }
    }
    for (uint32_t i = 0; i < b->n_saves; i++) lms__free(b->saves[i].toks);
    lms_engine_free(b->e);
    lms__free(b->seqs);
    lms__free(b->rows);
    lms__free(b->segs);
    lms__free(b->seg_seq);
    lms__free(b->out_rows);
    lms__free(b->out_seq);
    lms__free(b->logits);
    for (size_t i = 0; i < b->n_pfx; i++) lms__free(b->pfx[i].keys);
    lms__free(b->pfx);
    lms__hasher_free(b->hasher);
    lms__free(b);
}

lms_tokenizer *lms_batch_tokenizer(lms_batch *b) { return b ? lms_engine_tokenizer(b->e) : NULL; }

void lms_batch_get_info(const lms_batch *b, lms_engine_info *out) { lms_engine_get_info(b->e, out); }

int lms_batch_default_gen_params(const lms_batch *b, lms_gen_params *out)
{
    return lms_engine_default_gen_params(b->e, out);
}

/* ---- admission ---------------------------------------------------------------------------------- */

static uint32_t pages_for(const lms_batch *b, uint32_t from, uint32_t to)
{
    /* pages a sequence of `from` tokens needs more to hold `to` */
    uint32_t have = (from + b->P - 1) / b->P, need = (to + b->P - 1) / b->P;
    return need > have ? need - have : 0;
}

static uint32_t pages_available(const lms_batch *b)
{
    lms_kv_stats ks;
    lms_kv_get_stats(b->e->kv, &ks);
    return ks.free_pages + ks.cached_pages;
}

static uint32_t n_running(const lms_batch *b, int state)
{
    uint32_t n = 0;
    for (uint32_t i = 0; i < b->p.max_seqs; i++) n += b->seqs[i].state == state;
    return n;
}

/* A KV sequence for s: the longest prefix of its tokens (all but the last,
 * whose logits are needed) in the RAM prefix cache or the prefix store;
 * *from_store says where it came from. LMS_ENOSPACE when the arena cannot
 * hold the rest now (nothing attached then stays attached). */
static int seq_attach(lms_batch *b, bseq *s, bool reuse, bool *from_store)
{
    lms_kv *kv = b->e->kv;
    lms_kv_seq *q = NULL;
    uint32_t nr = 0, n = s->n_toks - 1;
    int rc;
    *from_store = false;
    if (!reuse || n < b->P) {
        if ((rc = lms_kv_seq_new(kv, &q)))
            return rc;
    } else {
        if ((rc = lms_kv_lookup(kv, s->toks, n, &q, &nr)))
            return rc;
        if (nr + b->P <= n && n >= b->p.prefix_min_tokens) {
            uint32_t ns = 0;
            lms_kv_seq *qs = store_lookup(b, s->toks, n, nr, &ns);
            if (qs && ns > nr) {
                lms_kv_seq_free(kv, q);
                q = qs;
                nr = ns;
                *from_store = true;
            } else {
                lms_kv_seq_free(kv, qs);
            }
        }
    }
    /* the rest of the tokens, and a page for each running sequence to grow into */
    uint32_t need = pages_for(b, nr, s->n_toks) + 1 + n_running(b, SLOT_RUN);
    if (pages_available(b) < need) {
        lms_kv_seq_free(kv, q);
        return lms__err(LMS_ENOSPACE, "batch: not enough free KV pages now (%u needed, %u free or cached)", need,
                        pages_available(b));
    }
    s->kv = q;
    s->n_done = nr;
    return 0;
}

static int check_gen_params(const lms_gen_params *gp)
{
    if (gp->temperature < 0 || gp->temperature != gp->temperature)
        return lms__err(LMS_EINVAL, "batch: temperature %g is negative", (double)gp->temperature);
    return 0;
}

int lms_batch_add(lms_batch *b, const int32_t *prompt, size_t n, const lms_gen_params *gp, uint64_t *id)
{
    lms_batch_req rq = {gp, NULL, 0, 0, false};
    return lms_batch_add_ex(b, prompt, n, &rq, id);
}

int lms_batch_add_ex(lms_batch *b, const int32_t *prompt, size_t n, const lms_batch_req *rq, uint64_t *id)
{
    int rc;
    const lms_gen_params *gp_in = rq ? rq->gp : NULL;
    if (rq && rq->top_logprobs > LMS_BATCH_MAX_TOP)
        return lms__err(LMS_EINVAL, "batch: top_logprobs %u is more than %d", rq->top_logprobs, LMS_BATCH_MAX_TOP);
    if (rq && rq->n_stop_ids && !rq->stop_ids)
        return lms__err(LMS_EINVAL, "lms_batch_add_ex: n_stop_ids without stop_ids");
    if (!b || !id || (!prompt && n))
        return lms__err(LMS_EINVAL, "lms_batch_add: bad arguments");
    if (n == 0)
        return lms__err(LMS_EINVAL, "batch: empty prompt");
    for (size_t i = 0; i < n; i++)
        if (prompt[i] < 0 || (uint32_t)prompt[i] >= b->V)
            return lms__err(LMS_EINVAL, "batch: prompt token id %d (at %zu) is outside the vocabulary of %u",
                            (int)prompt[i], i, b->V);
    if (n >= b->n_ctx)
        return lms__err(LMS_ERANGE, "batch: the prompt (%zu tokens) does not fit the context of %u tokens", n,
                        b->n_ctx);
    if (pages_for(b, 0, (uint32_t)n + 1) > b->st.kv_pages_total)
        return lms__err(LMS_ERANGE, "batch: the prompt (%zu tokens) does not fit the KV arena (%u pages of %u)", n,
                        b->st.kv_pages_total, b->P);
    lms_gen_params gp = gp_in ? *gp_in : lms_gen_default_params();
    gp.stop = NULL;
    gp.n_stop = 0;
    if ((rc = check_gen_params(&gp)))
        return rc;
    if (n_running(b, SLOT_WAIT))
        return lms__err(LMS_ENOSPACE, "batch: preempted sequences wait for KV pages first");
    bseq *s = NULL;
    for (uint32_t i = 0; i < b->p.max_seqs && !s; i++)
        if (b->seqs[i].state == SLOT_FREE)
            s = &b->seqs[i];
    if (!s)
        return lms__err(LMS_ENOSPACE, "batch: all %u sequence slots are busy", b->p.max_seqs);
    lms__sampler *smp = NULL;
    if ((rc = lms__sampler_create(&gp, b->V, &smp)))
        return rc;
    int32_t *stop_ids = NULL;
    size_t n_stop = rq ? rq->n_stop_ids : 0;
    if (n_stop && !(stop_ids = lms__malloc(n_stop * sizeof *stop_ids))) {
        lms__sampler_free(smp);
        return LMS_ENOMEM;
    }
    if (n_stop)
        memcpy(stop_ids, rq->stop_ids, n_stop * sizeof *stop_ids);
    memcpy(s->toks, prompt, n * sizeof *prompt);
    s->n_prompt = s->n_toks = (uint32_t)n;
    s->n_gen = 0;
    bool from_store = false;
    if ((rc = seq_attach(b, s, !gp.no_prefix_reuse, &from_store))) {
        lms__sampler_free(smp);
        lms__free(stop_ids);
        return rc;
    }
    s->stop_ids = stop_ids;
    s->n_stop_ids = n_stop;
    s->n_top = rq ? rq->top_logprobs : 0;
    s->logprob = !rq || !rq->no_logprob;
    uint32_t win = gp.repeat_window ? gp.repeat_window : 64;
    for (size_t i = n > win ? n - win : 0; i < n; i++) lms__sampler_accept(smp, prompt[i]);
    s->smp = smp;
    s->gp = gp;
    s->cached = s->n_done;
    s->id = b->next_id++;
    s->order = b->next_order++;
    s->state = SLOT_RUN;
    if (s->cached)
        from_store ? b->st.prefix_hits_store++ : b->st.prefix_hits_ram++;
    *id = s->id;
    return 0;
}

int lms_batch_cancel(lms_batch *b, uint64_t id)
{
    for (uint32_t i = 0; b && i < b->p.max_seqs; i++)
        if (b->seqs[i].state != SLOT_FREE && b->seqs[i].id == id) {
            seq_release(b, &b->seqs[i]);
            return 0;
        }
    return lms__err(LMS_ENOENT, "batch: request %llu is not running", (unsigned long long)id);
}

void lms_batch_get_stats(const lms_batch *b, lms_batch_stats *out)
{
    lms_kv_stats ks;
    *out = b->st;
    lms_kv_get_stats(b->e->kv, &ks);
    out->running = n_running(b, SLOT_RUN) + n_running(b, SLOT_WAIT);
    out->waiting_pages = n_running(b, SLOT_WAIT);
    out->kv_pages_used = ks.used_pages;
    out->kv_pages_total = ks.n_pages;
}

/* ---- a step ---------------------------------------------------------------------------------------- */

static void preempt(lms_batch *b, bseq *s)
{
    lms__debug("batch: request %llu preempted at %u tokens (KV arena full)", (unsigned long long)s->id, s->n_toks);
    lms_kv_seq_free(b->e->kv, s->kv);
    s->kv = NULL;
    s->n_done = 0;
    s->state = SLOT_WAIT;
    b->st.preemptions++;
}

/* The running sequence admitted last, other than `not` (NULL if none). */
static bseq *victim(lms_batch *b, const bseq *not)
{
    bseq *v = NULL;
    for (uint32_t i = 0; i < b->p.max_seqs; i++) {
        bseq *s = &b->seqs[i];
        if (s->state == SLOT_RUN && s != not && (!v || s->order > v->order))
            v = s;
    }
    return v;
}

/* Waiting sequences, oldest first, while the arena has room for them. One
 * that finds no room with nothing else running never will: it ends (ctx). */
static void readmit(lms_batch *b, lms_batch_event *ev, size_t *n_ev)
{
    for (;;) {
        bseq *w = NULL;
        for (uint32_t i = 0; i < b->p.max_seqs; i++) {
            bseq *s = &b->seqs[i];
            if (s->state == SLOT_WAIT && (!w || s->order < w->order))
                w = s;
        }
        bool from_store;
        if (!w)
            return;
        if (seq_attach(b, w, !w->gp.no_prefix_reuse, &from_store)) {
            lms_clear_error();
            if (n_running(b, SLOT_RUN))
                return;
            ev[(*n_ev)++] = (lms_batch_event){.id = w->id, .token = -1, .stop_reason = LMS_STOP_CTX, .prompt_tokens = w->n_prompt, .cached_tokens = w->cached};
            seq_release(b, w);
            continue;
        }
        w->state = SLOT_RUN;
    }
}

static bool is_eos(const lms_batch *b, const bseq *s, int32_t id)
{
    for (int i = 0; i < b->e->hp.n_eos; i++)
        if (b->e->hp.eos_ids[i] == id)
            return true;
    for (size_t i = 0; i < s->n_stop_ids; i++)
        if (s->stop_ids[i] == id)
            return true;
    return false;
}

/* The log-probability of ev->token under logits lg, and the n_top most
 * probable ids with theirs (insertion into a short sorted list). */
static void logprobs(const float *lg, uint32_t V, uint32_t n_top, lms_batch_event *ev)
{
    float mx = -INFINITY;
    for (uint32_t i = 0; i < V; i++) mx = lg[i] > mx ? lg[i] : mx;
    double sum = 0;
    for (uint32_t i = 0; i < V; i++) sum += exp((double)lg[i] - mx);
    double lse = mx + log(sum);
    ev->logprob = (float)((double)lg[ev->token] - lse);
    ev->n_top = 0;
    for (uint32_t i = 0; i < V && n_top; i++) {
        float v = lg[i];
        uint32_t k = ev->n_top;
        if (k == n_top && !(v > ev->top_logprobs[k - 1]))
            continue;
        if (k < n_top)
            ev->n_top++;
        else
            k--;
        for (; k > 0 && v > ev->top_logprobs[k - 1]; k--) {
            ev->top_logprobs[k] = ev->top_logprobs[k - 1];
            ev->top_ids[k] = ev->top_ids[k - 1];
        }
        ev->top_logprobs[k] = v;
        ev->top_ids[k] = (int32_t)i;
    }
    for (uint32_t k = 0; k < ev->n_top; k++) ev->top_logprobs[k] = (float)(ev->top_logprobs[k] - lse);
}

/* Run the plan's segments: one pass over all rows, or one per segment. */
static int forward(lms_batch *b, uint32_t nrows, uint32_t nseg, uint32_t nout)
{
    lms_engine *e = b->e;
    if (lms__fwd_has_segments(e->fwd))
        return lms__fwd_segments(e->fwd, b->rows, nrows, b->segs, nseg, b->out_rows, nout, b->logits);
    for (uint32_t i = 0, o = 0; i < nseg; i++) {
        const lms__seg *g = &b->segs[i];
        bool want = o < nout && b->out_rows[o] == g->row0 + g->nb - 1;
        int rc = lms__fwd_block(e->fwd, b->rows + g->row0, g->nb, g->pos0, g->kv,
                                want ? b->logits + (size_t)o * b->V : NULL, false);
        if (rc)
            return rc;
        o += want;
    }
    return 0;
}

static void view_tables(lms_batch *b, bseq *s)
{
    uint32_t np;
    s->view.pages = lms_kv_seq_pages(s->kv, &np);
    s->view.n_pages = np;
    if (s->view.window)
        s->view.wpages = lms_kv_seq_window_pages(s->kv, &s->view.wfirst, &np);
}

/* Sample the next token of s from its logits row and report it. Returns
 * true when the request ends with this event. */
static bool sample(lms_batch *b, bseq *s, const float *lg, lms_batch_event *ev)
{
    int32_t id = lms__sampler_sample(s->smp, lg);
    lms__sampler_accept(s->smp, id);
    memset(ev, 0, sizeof *ev);
    ev->id = s->id, ev->token = id, ev->stop_reason = LMS_STOP_NONE;
    ev->prompt_tokens = s->n_prompt, ev->cached_tokens = s->cached;
    if (s->logprob || s->n_top)
        logprobs(lg, b->V, s->n_top, ev);
    /* the order of lms_generate's checks, so that the ids and stops are the same */
    bool room = s->n_done < b->n_ctx;
    if (!s->gp.ignore_eos && is_eos(b, s, id)) {
        ev->stop_reason = LMS_STOP_EOS;
        return true;
    }
    if (!room) {
        ev->token = -1;
        ev->logprob = 0;
        ev->n_top = 0;
        ev->stop_reason = LMS_STOP_CTX;
        return true;
    }
    s->toks[s->n_toks++] = id;
    s->n_gen++;
    if (s->gp.max_tokens && s->n_gen >= s->gp.max_tokens)
        ev->stop_reason = LMS_STOP_MAX_TOKENS;
    else if (s->n_toks >= b->n_ctx)
        ev->stop_reason = LMS_STOP_CTX;
    return ev->stop_reason != LMS_STOP_NONE;
}

int lms_batch_step(lms_batch *b, lms_batch_event *ev, size_t cap, size_t *n_ev)
{
    int rc = 0;
    if (!b || !n_ev || (!ev && cap))
        return lms__err(LMS_EINVAL, "lms_batch_step: bad arguments");
    *n_ev = 0;
    if (cap < b->p.max_seqs)
        return lms__err(LMS_EINVAL, "lms_batch_step: room for %zu events, %u needed", cap, b->p.max_seqs);
    lms_kv *kv = b->e->kv;
    save_one(b);
    readmit(b, ev, n_ev);

    /* plan: decode rows first, then prefill chunks, in admission order */
    uint32_t S = b->p.max_seqs, nseg = 0, budget = b->p.step_tokens;
    bseq *order[4096];
    uint32_t nord = 0;
    for (int pass = 0; pass < 2; pass++) {
        /* pass 0: one row left; pass 1: more; each by admission order (selection) */
        uint64_t last = 0;
        bool first = true;
        for (;;) {
            bseq *nx = NULL;
            for (uint32_t i = 0; i < S; i++) {
                bseq *s = &b->seqs[i];
                if (s->state != SLOT_RUN || (s->n_toks - s->n_done == 1) != (pass == 0))
                    continue;
                if ((first || s->order > last) && (!nx || s->order < nx->order))
                    nx = s;
            }
            if (!nx)
                break;
            order[nord++] = nx;
            last = nx->order;
            first = false;
        }
    }
    for (uint32_t k = 0; k < nord && budget; k++) {
        bseq *s = order[k];
        if (s->state != SLOT_RUN)
            continue; /* preempted meanwhile */
        uint32_t nb = LMS_MIN(s->n_toks - s->n_done, budget);
        while ((rc = lms_kv_seq_append(kv, s->kv, s->toks + s->n_done, nb)) == LMS_ENOSPACE) {
            bseq *v = victim(b, s);
            if (!v || v->order < s->order) {
                /* s is the newest itself: it waits */
                v = s;
            }
            for (uint32_t g = 0; g < nseg; g++)
                if (b->seg_seq[g] == (uint32_t)(v - b->seqs)) { /* planned already: out of the plan */
                    lms_kv_seq_truncate(kv, v->kv, v->n_done);
                    budget += b->segs[g].nb;
                    memmove(b->segs + g, b->segs + g + 1, (nseg - g - 1) * sizeof *b->segs);
                    memmove(b->seg_seq + g, b->seg_seq + g + 1, (nseg - g - 1) * sizeof *b->seg_seq);
                    nseg--;
                    break;
                }
            if (v == s && n_running(b, SLOT_RUN) == 1 && nseg == 0) {
                /* alone and still no room: the arena cannot hold this request */
                ev[*n_ev] = (lms_batch_event){.id = s->id, .token = -1, .stop_reason = LMS_STOP_CTX, .prompt_tokens = s->n_prompt, .cached_tokens = s->cached};
                (*n_ev)++;
                seq_release(b, s);
                lms_clear_error();
                break;
            }
            preempt(b, v);
            lms_clear_error();
            if (v == s)
                break;
        }
        if (rc && rc != LMS_ENOSPACE)
            goto fail;
        if (s->state != SLOT_RUN)
            continue;
        b->seg_seq[nseg] = (uint32_t)(s - b->seqs);
        b->segs[nseg++] = (lms__seg){0, nb, s->n_done, &s->view};
        budget -= nb;
    }
    rc = 0;
    if (!nseg)
        return 0;
    /* rows in segment order; logits rows where a sequence runs its last known token */
    uint32_t nrows = 0, nout = 0;
    for (uint32_t g = 0; g < nseg; g++) {
        bseq *s = &b->seqs[b->seg_seq[g]];
        lms__seg *sg = &b->segs[g];
        sg->row0 = nrows;
        memcpy(b->rows + nrows, s->toks + sg->pos0, sg->nb * sizeof(int32_t));
        nrows += sg->nb;
        view_tables(b, s);
        if (sg->pos0 + sg->nb == s->n_toks) {
            b->out_rows[nout] = nrows - 1;
            b->out_seq[nout++] = b->seg_seq[g];
        }
    }
    if ((rc = forward(b, nrows, nseg, nout))) {
        for (uint32_t g = 0; g < nseg; g++) {
            bseq *s = &b->seqs[b->seg_seq[g]];
            lms_kv_seq_truncate(kv, s->kv, s->n_done);
        }
        goto fail;
    }
    b->st.steps++;
    for (uint32_t g = 0; g < nseg; g++) {
        bseq *s = &b->seqs[b->seg_seq[g]];
        s->n_done += b->segs[g].nb;
        if ((rc = lms_kv_seq_commit(kv, s->kv, s->n_done)))
            goto fail; /* cannot happen: positions were reserved and written */
    }
    for (uint32_t o = 0; o < nout; o++) {
        bseq *s = &b->seqs[b->out_seq[o]];
        bool first = s->n_toks == s->n_prompt;
        if (first)
            queue_save(b, s);
        if (sample(b, s, b->logits + (size_t)o * b->V, &ev[*n_ev]))
            seq_release(b, s);
        (*n_ev)++;
    }
    return 0;
fail:
    return rc;
}
