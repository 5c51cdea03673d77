/*
 * engine/layers.c - the forward pass shared by every family, written once
 * against the backend table (engine/backend.h): for a block of tokens,
 * embedding -> per layer [RMSNorm + q/k/v projections (+ biases), per-head
 * q/k RMSNorm (qwen3, gemma3), RoPE, K/V written into the paged cache, causal
 * attention over the cache's pages read in place (a sliding-window layer:
 * the last `window` positions, with its own RoPE table), o projection +
 * residual, RMSNorm + gated MLP + residual] -> final RMSNorm -> LM head.
 * With post_norms (Gemma 3) the attention and MLP outputs are RMSNorm'd
 * before their residual adds.
 *
 * The backend fuses what it can (an input's RMSNorm or gated activation into
 * the matrix product that reads it, biases and residual adds into its
 * epilogue); this file only says what is computed, in which order.
 */
#include <assert.h>
#include <math.h>
#include <string.h>

#include "engine/backend.h"
#include "lmstore/loader.h"

struct lms__fwd {
    const lms__fwd_ops *ops;
    lms__bk *bk;
    const lms__hparams *hp;
    const lms__weights *w;
    uint32_t B, n_ctx;
    /* The gate (lms__fwd_gate): set while the weights are still arriving; NULL once
     * a wait for every layer returned 0. rows: the gated step's embedding rows. */
    lms__fwd_wait_fn wait;
    void *wait_ctx;
    float *rows;
    uint32_t behind;  /* layers whose wait blocked (their weights were still arriving) */
    double waited_s;
};

/* Rows of logits computed per head() call when every position's are asked
 * (a device backend's logits scratch holds this many rows). */
#define LOGIT_ROWS 32

uint32_t lms__buf_width(const lms__hparams *hp, lms__buf b)
{
    switch (b) {
    case LMS__B_X:
    case LMS__B_T:
        return hp->n_embd;
    case LMS__B_Q:
    case LMS__B_ATT:
        return hp->n_heads * hp->head_dim;
    case LMS__B_K:
    case LMS__B_V:
        return hp->n_kv_heads * hp->head_dim;
    case LMS__B_G:
    case LMS__B_U:
        return hp->n_ff;
    default:
        assert(!"no such buffer");
        return 0;
    }
}

void lms__rope_freqs(const lms__hparams *hp, int which, float *inv_freq)
{
    uint32_t hd = hp->head_dim;
    /* the local (sliding-window) layers' table: their own base, never scaled
     * (Gemma 3's rope_local_base_freq); without one, the global table */
    bool local = which == LMS__ROPE_LOCAL && hp->rope_local_theta > 0;
    for (uint32_t i = 0; i < hd / 2; i++) {
        double f = 1.0 / pow(local ? hp->rope_local_theta : hp->rope_theta, (double)(2 * i) / hd);
        if (local) {
            /* unscaled */
        } else if (hp->rope_kind == LMS__ROPE_LINEAR) {
            f /= hp->rope_factor;
        } else if (hp->rope_kind == LMS__ROPE_LLAMA3) {
            double old = hp->rope_orig_max_pos, lf = hp->rope_low_freq, hf = hp->rope_high_freq;
            double low_wl = old / lf, high_wl = old / hf, wl = 2 * M_PI / f;
            if (wl > low_wl) {
                f = f / hp->rope_factor;
            } else if (!(wl < high_wl)) { /* medium band: interpolate */
                double smooth = (old / wl - lf) / (hf - lf);
                f = (1 - smooth) * f / hp->rope_factor + smooth * f;
            }
        }
        inv_freq[i] = (float)f;
    }
}

int lms__fwd_create(const lms__fwd_ops *ops, const lms__hparams *hp, const lms__weights *w, lms_device *dev,
                    const lms__kernels *k, lms_pool *pool, uint32_t max_block, uint32_t max_segs, uint32_t n_ctx,
                    const lms__kvview *kv, lms__fwd **out)
{
    lms__fwd *f = lms__calloc(1, sizeof *f);
    *out = NULL;
    if (!f)
        return LMS_ENOMEM;
    f->ops = ops;
    f->hp = hp;
    f->w = w;
    f->B = max_block;
    f->n_ctx = n_ctx;
    lms__fwd_cfg cfg = {hp, w, dev, k, pool, max_block, n_ctx, kv, max_segs};
    int rc = ops->create(&cfg, &f->bk);
    if (rc) {
        lms__free(f);
        return rc;
    }
    *out = f;
    return 0;
}

void lms__fwd_free(lms__fwd *f)
{
    if (!f)
        return;
    f->ops->destroy(f->bk);
    lms__free(f->rows);
    lms__free(f);
}

/* ---- the gate: steps behind a resident load ----------------------------------------------------
 *
 * A resident load copies the blocks first (layer 0, 1, ...) and the tensors
 * outside them (embedding, final norm, LM head) last (lms_load_order). A
 * gated step therefore looks its tokens' embedding rows up in the
 * embedding's host view, writes them into X, and waits for each layer's
 * weights just before issuing that layer's operations: layer l computes
 * while layer l + 1 is copied. Before the head it waits for every weight,
 * which also ends the gate.
 *
 * Invariants:
 *   1. No operation reading a layer's weights is issued before wait(layer)
 *      returned 0 in this step or an earlier one.
 *   2. A step of one row (which a backend may record into a graph and replay:
 *      no host wait may sit inside it) is never gated: it waits for every
 *      weight first.
 *   3. A failed wait still ends the step (end()), so the backend is ready for
 *      the next; the wait's error is returned and the gate stays.
 */

int lms__fwd_gate(lms__fwd *f, lms__fwd_wait_fn wait, void *ctx)
{
    assert(wait && !f->wait);
    if (!f->rows && !(f->rows = lms__malloc((size_t)f->B * f->hp->n_embd * sizeof(float))))
        return LMS_ENOMEM;
    f->wait = wait;
    f->wait_ctx = ctx;
    return 0;
}

bool lms__fwd_gated(const lms__fwd *f) { return f->wait != NULL; }

/* Wait for layer `layer`, counting the waits that blocked. */
static int gate_wait(lms__fwd *f, int32_t layer)
{
    double t = lms__now();
    int rc = f->wait(f->wait_ctx, layer);
    double dt = lms__now() - t;
    if (dt > 1e-4) {
        f->behind += layer != LMS_LAYER_ALL;
        f->waited_s += dt;
    }
    return rc;
}

/* Wait for every weight; then the gate is gone. */
static int ungate(lms__fwd *f)
{
    int rc = gate_wait(f, LMS_LAYER_ALL);
    if (rc)
        return rc;
    lms__debug("forward pass: %u of %u layers ran as their weights arrived; %.1f ms waited for weights",
               f->behind, f->hp->n_layers, f->waited_s * 1e3);
    f->wait = NULL;
    lms__free(f->rows);
    f->rows = NULL;
    return 0;
}

/* The step's embedding from the host view (the CPU backend's lookup, the
 * same values a device's embedding kernel writes), into X. */
static int embed_host(lms__fwd *f, const int32_t *tokens, uint32_t nb)
{
    uint32_t E = f->hp->n_embd;
    for (uint32_t t = 0; t < nb; t++)
        lms__embed_row(&f->w->embed, (uint32_t)tokens[t], f->hp->embed_scale, f->rows + (size_t)t * E);
    return f->ops->write(f->bk, LMS__B_X, nb, f->rows);
}

const char *lms__fwd_describe(const lms__fwd *f) { return f->ops->describe(f->bk); }

bool lms__fwd_has_argmax(const lms__fwd *f) { return f->ops->head_argmax != NULL; }

double lms__fwd_membw(lms__fwd *f, size_t bytes) { return f->ops->membw ? f->ops->membw(f->bk, bytes) : 0; }

/* ---- one layer ------------------------------------------------------------------------------ */

/* The attention's or the MLP's output product into the residual X: added in the
 * product's epilogue, or with post-norms into T and then normalized into X (one
 * operation where the backend fuses them). */
static void product_out(lms__fwd *f, const lms__mm *job, const float *post_norm)
{
    const lms__fwd_ops *o = f->ops;
    if (!f->hp->post_norms)
        o->matmul(f->bk, job, 1);
    else if (o->matmul_norm_add)
        o->matmul_norm_add(f->bk, job, LMS__B_X, post_norm);
    else {
        o->matmul(f->bk, job, 1);
        o->norm_add(f->bk, LMS__B_X, LMS__B_T, post_norm);
    }
}

static void layer(lms__fwd *f, uint32_t l)
{
    const lms__fwd_ops *o = f->ops;
    const lms__hparams *hp = f->hp;
    const lms__layer_w *L = &f->w->layers[l];
    lms__bk *b = f->bk;
    bool local = hp->window && hp->sliding[l];
    /* without post-norms the attention and MLP outputs add to X in the matrix
     * product's epilogue; with them they go to T, normalized into X after */
    lms__buf out = hp->post_norms ? LMS__B_T : LMS__B_X;

    lms__mm qkv[3] = {
        {&L->wq, LMS__B_X, L->attn_norm, LMS__ACT_NONE, 0, LMS__B_Q, L->bq, false},
        {&L->wk, LMS__B_X, L->attn_norm, LMS__ACT_NONE, 0, LMS__B_K, L->bk, false},
        {&L->wv, LMS__B_X, L->attn_norm, LMS__ACT_NONE, 0, LMS__B_V, L->bv, false},
    };
    o->matmul(b, qkv, 3);
    o->qk_rope(b, l, L->q_norm, L->k_norm, local ? LMS__ROPE_LOCAL : LMS__ROPE_GLOBAL);
    o->attention(b, l, local ? hp->window : 0, hp->attn_scale, hp->attn_softcap);
    lms__mm wo = {&L->wo, LMS__B_ATT, NULL, LMS__ACT_NONE, 0, out, L->bo, !hp->post_norms};
    product_out(f, &wo, L->post_attn_norm);

    lms__mm gu[2] = {
        {&L->w_gate, LMS__B_X, L->ffn_norm, LMS__ACT_NONE, 0, LMS__B_G, NULL, false},
        {&L->w_up, LMS__B_X, L->ffn_norm, LMS__ACT_NONE, 0, LMS__B_U, NULL, false},
    };
    o->matmul(b, gu, 2);
    lms__mm down = {&L->w_down, LMS__B_G, NULL, hp->act, LMS__B_U, out, NULL, !hp->post_norms};
    product_out(f, &down, L->post_ffn_norm);
}

/* ---- a block ---------------------------------------------------------------------------------- */

static int block(lms__fwd *f, const int32_t *tokens, uint32_t nb, uint32_t pos0, const lms__kvview *kv,
                 lms__out ok, float *logits, int32_t *id)
{
    const lms__fwd_ops *o = f->ops;
    const lms__hparams *hp = f->hp;
    lms__bk *b = f->bk;
    assert(nb >= 1 && nb <= f->B && pos0 + nb <= f->n_ctx);
    for (uint32_t i = 0; i < nb; i++)
        assert(tokens[i] >= 0 && (uint32_t)tokens[i] < hp->n_vocab);
    assert((pos0 + nb + kv->page_tokens - 1) / kv->page_tokens <= kv->n_pages);

    lms__step st = {.tokens = tokens, .nb = nb, .pos0 = pos0, .kv = kv, .out = ok, .logits = logits, .argmax = id};
    int rc = 0;
    if (f->wait && nb == 1 && (rc = ungate(f))) /* invariant 2 */
        return rc;
    bool replayed = false, gated = f->wait != NULL;
    if ((rc = o->begin(b, &st, &replayed)))
        return rc;
    if (!replayed) {
        if (gated)
            rc = embed_host(f, tokens, nb);
        else
            o->embed(b, hp->embed_scale);
        for (uint32_t l = 0; l < hp->n_layers && !rc; l++)
            if (!gated || !(rc = gate_wait(f, (int32_t)l)))
                layer(f, l);
        if (gated && !rc)
            rc = ungate(f); /* the final norm and the LM head (or the tied embedding) */
        if (rc) {
            int erc = o->end(b); /* invariant 3 */
            (void)erc;
            return rc;
        }
        lms__mm head = {&f->w->lm_head, LMS__B_X, f->w->final_norm, LMS__ACT_NONE, 0, 0, NULL, false};
        if (ok == LMS__OUT_LAST)
            o->head(b, &head, nb - 1, 1, hp->final_softcap, logits);
        else if (ok == LMS__OUT_ARGMAX)
            o->head_argmax(b, &head, hp->final_softcap, id);
        else if (ok == LMS__OUT_ALL)
            for (uint32_t r = 0; r < nb; r += LOGIT_ROWS)
                o->head(b, &head, r, LMS_MIN(LOGIT_ROWS, nb - r), hp->final_softcap,
                        logits + (size_t)r * hp->n_vocab);
    }
    return o->end(b);
}

int lms__fwd_block(lms__fwd *f, const int32_t *tokens, uint32_t nb, uint32_t pos0, const lms__kvview *kv,
                   float *logits, bool all)
{
    return block(f, tokens, nb, pos0, kv, !logits ? LMS__OUT_NONE : all ? LMS__OUT_ALL : LMS__OUT_LAST, logits, NULL);
}

bool lms__fwd_has_segments(const lms__fwd *f) { return f->ops->segments; }

int lms__fwd_segments(lms__fwd *f, const int32_t *tokens, uint32_t nb, const lms__seg *segs, uint32_t n_segs,
                      const uint32_t *out_rows, uint32_t n_out, float *logits)
{
    const lms__fwd_ops *o = f->ops;
    const lms__hparams *hp = f->hp;
    lms__bk *b = f->bk;
    assert(o->segments && o->gather && n_segs >= 1 && nb >= 1 && nb <= f->B);
    for (uint32_t i = 0; i < nb; i++)
        assert(tokens[i] >= 0 && (uint32_t)tokens[i] < hp->n_vocab);
    for (uint32_t i = 0; i < n_segs; i++)
        assert((segs[i].pos0 + segs[i].nb + segs[i].kv->page_tokens - 1) / segs[i].kv->page_tokens <=
               segs[i].kv->n_pages);
    lms__step st = {tokens, nb, segs[0].pos0, segs[0].kv, n_out ? LMS__OUT_ROWS : LMS__OUT_NONE, logits, NULL,
                    segs, n_segs, out_rows, n_out};
    int rc = 0;
    if (f->wait && (rc = ungate(f))) /* the batched engine's steps are not gated */
        return rc;
    bool replayed = false;
    rc = o->begin(b, &st, &replayed);
    if (rc)
        return rc;
    assert(!replayed);
    o->embed(b, hp->embed_scale);
    for (uint32_t l = 0; l < hp->n_layers; l++) layer(f, l);
    if (n_out) {
        lms__mm head = {&f->w->lm_head, LMS__B_X, f->w->final_norm, LMS__ACT_NONE, 0, 0, NULL, false};
        o->gather(b, LMS__B_X, out_rows, n_out);
        o->head(b, &head, 0, n_out, hp->final_softcap, logits);
    }
    return o->end(b);
}

int lms__fwd_block_argmax(lms__fwd *f, const int32_t *tokens, uint32_t nb, uint32_t pos0, const lms__kvview *kv,
                          int32_t *id)
{
    if (!f->ops->head_argmax)
        return lms__err(LMS_EUNSUPPORTED, "the %s backend has no device argmax", f->ops->name);
    return block(f, tokens, nb, pos0, kv, LMS__OUT_ARGMAX, NULL, id);
}
