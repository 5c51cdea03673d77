/*
 * engine/weights.c - binds the tensors a forward pass reads from a weight
 * source (the loader's lms_model, or a safetensors folder), checking that
 * each is present with a supported dtype (BF16, F16, F32) and the shape the
 * config implies. Matrices are used in place (pointers into the mapping);
 * only the small vectors (norm weights, biases) are widened to f32 copies
 * (norms stored as w for (1 + w), Gemma's, get their 1 added then, so every
 * norm the backends apply is a plain RMSNorm).
 *
 * A text model's tensors are found under "model." (...ForCausalLM), or under
 * the language model of a multimodal checkpoint: "language_model.model." as
 * checkpoints are published, "model.language_model." as transformers 5 saves
 * them (the LM head: "lm_head.weight" or "language_model.lm_head.weight").
 */
#include <assert.h>
#include <stdio.h>
#include <string.h>

#include "engine/internal.h"

typedef struct binder {
    const lms__wsrc *src;
    float *vec_next, *vec_end;
    bool plus_one; /* norms are stored as w and applied as 1 + w */
} binder;

static int find(binder *b, const char *name, bool optional, uint32_t rows, uint32_t cols, lms__wt *out)
{
    lms_dtype dt;
    uint32_t ndim;
    uint64_t shape[LMS_MAX_DIMS] = {0}, nbytes;
    const void *data, *dev = NULL;
    int rc = b->src->tensor(b->src->ctx, name, &dt, &ndim, shape, &data, &dev, &nbytes);
    if (rc == LMS_ENOENT) {
        if (optional) {
            memset(out, 0, sizeof *out);
            return 0;
        }
        return lms__err(LMS_ENOENT, "%s: tensor '%s' is missing", b->src->name, name);
    }
    if (rc)
        return rc;
    if (dt != LMS_DTYPE_BF16 && dt != LMS_DTYPE_F16 && dt != LMS_DTYPE_F32)
        return lms__err(LMS_EUNSUPPORTED, "%s: tensor '%s' has dtype %s (BF16, F16, F32 are supported)",
                        b->src->name, name, lms_dtype_name(dt) ? lms_dtype_name(dt) : "?");
    bool ok = cols ? (ndim == 2 && shape[0] == rows && shape[1] == cols) : (ndim == 1 && shape[0] == rows);
    size_t esz = dt == LMS_DTYPE_F32 ? 4 : 2;
    if (!ok || nbytes != (uint64_t)rows * (cols ? cols : 1) * esz) {
        char want[64], got[96];
        if (cols)
            snprintf(want, sizeof want, "[%u, %u]", rows, cols);
        else
            snprintf(want, sizeof want, "[%u]", rows);
        int n = snprintf(got, sizeof got, "[");
        for (uint32_t i = 0; i < ndim && i < 4 && n < (int)sizeof got - 24; i++)
            n += snprintf(got + n, sizeof got - n, "%s%llu", i ? ", " : "", (unsigned long long)shape[i]);
        snprintf(got + n, sizeof got - n, "]");
        return lms__err(LMS_EFORMAT, "%s: tensor '%s' has shape %s, the config implies %s", b->src->name, name,
                        got, want);
    }
    if (!data)
        return lms__err(LMS_EINVAL, "%s: tensor '%s' has no host view", b->src->name, name);
    out->p = data;
    out->dp = dev;
    out->dt = dt;
    out->rows = rows;
    out->cols = cols;
    return 0;
}

/* A vector widened to f32 into the bump store; *out NULL when optional and absent. */
static int vec(binder *b, const char *name, bool optional, uint32_t n, float **out)
{
    lms__wt w;
    int rc = find(b, name, optional, n, 0, &w);
    *out = NULL;
    if (rc || !w.p)
        return rc;
    assert(b->vec_next + n <= b->vec_end);
    w.cols = n; /* view as one row */
    lms__row_to_f32(&w, 0, b->vec_next);
    *out = b->vec_next;
    b->vec_next += n;
    return 0;
}

/* A norm's weight: vec(), with 1 added when the family stores w for (1 + w), in f32
 * as transformers computes (1.0 + weight.float()). */
static int norm(binder *b, const char *name, uint32_t n, float **out)
{
    int rc = vec(b, name, false, n, out);
    if (!rc && b->plus_one)
        for (uint32_t i = 0; i < n; i++) (*out)[i] += 1.0f;
    return rc;
}

/* The prefix of the text model's tensors (see the opening comment). */
static const char *text_prefix(const lms__wsrc *src)
{
    static const char *const prefixes[] = {"model.", "language_model.model.", "model.language_model."};
    char name[64];
    for (size_t i = 0; i < LMS_ARRAY_LEN(prefixes); i++) {
        lms_dtype dt;
        uint32_t nd;
        uint64_t shape[LMS_MAX_DIMS], nb;
        const void *d, *dv;
        snprintf(name, sizeof name, "%sembed_tokens.weight", prefixes[i]);
        if (src->tensor(src->ctx, name, &dt, &nd, shape, &d, &dv, &nb) == 0)
            return prefixes[i];
    }
    return prefixes[0]; /* its absence is reported by the binder, named */
}

int lms__weights_bind(const lms__wsrc *src, const lms__hparams *hp, lms__weights *w)
{
    int rc;
    char name[200];
    binder b = {src, NULL, NULL, hp->norm_plus_one};
    uint32_t E = hp->n_embd, hd = hp->head_dim, qd = hp->n_heads * hd, kvd = hp->n_kv_heads * hd;
    const char *pre = text_prefix(src);
    memset(w, 0, sizeof *w);
    size_t per_layer = 4 * (size_t)E + qd + 2 * (size_t)kvd + E + 2 * (size_t)hd;
    size_t total = per_layer * hp->n_layers + E;
    w->vec_store = lms__malloc(total * sizeof(float));
    w->layers = lms__calloc(hp->n_layers, sizeof *w->layers);
    if (!w->vec_store || !w->layers) {
        rc = LMS_ENOMEM;
        goto fail;
    }
    b.vec_next = w->vec_store;
    b.vec_end = w->vec_store + total;
    w->vec_len = total;

    const char *head = strcmp(pre, "language_model.model.") ? "lm_head.weight" : "language_model.lm_head.weight";
    snprintf(name, sizeof name, "%sembed_tokens.weight", pre);
    if ((rc = find(&b, name, false, hp->n_vocab, E, &w->embed)))
        goto fail;
    if ((rc = find(&b, head, true, hp->n_vocab, E, &w->lm_head)))
        goto fail;
    if (hp->tie_embeddings || !w->lm_head.p) {
        if (!hp->tie_embeddings && !w->lm_head.p) {
            rc = lms__err(LMS_ENOENT, "%s: tensor '%s' is missing (and tie_word_embeddings is false)", src->name,
                          head);
            goto fail;
        }
        w->lm_head = w->embed;
    }
    snprintf(name, sizeof name, "%snorm.weight", pre);
    if ((rc = norm(&b, name, E, &w->final_norm)))
        goto fail;
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        lms__layer_w *L = &w->layers[l];
#define NM(s) (snprintf(name, sizeof name, "%slayers.%u.%s", pre, l, s), name)
        if ((rc = norm(&b, NM("input_layernorm.weight"), E, &L->attn_norm)))
            goto fail;
        if (hp->post_norms) { /* Gemma: post_attention_layernorm is the attention output's norm */
            if ((rc = norm(&b, NM("post_attention_layernorm.weight"), E, &L->post_attn_norm)) ||
                (rc = norm(&b, NM("pre_feedforward_layernorm.weight"), E, &L->ffn_norm)) ||
                (rc = norm(&b, NM("post_feedforward_layernorm.weight"), E, &L->post_ffn_norm)))
                goto fail;
        } else if ((rc = norm(&b, NM("post_attention_layernorm.weight"), E, &L->ffn_norm))) {
            goto fail;
        }
        if ((rc = find(&b, NM("self_attn.q_proj.weight"), false, qd, E, &L->wq)) ||
            (rc = find(&b, NM("self_attn.k_proj.weight"), false, kvd, E, &L->wk)) ||
            (rc = find(&b, NM("self_attn.v_proj.weight"), false, kvd, E, &L->wv)) ||
            (rc = find(&b, NM("self_attn.o_proj.weight"), false, E, qd, &L->wo)) ||
            (rc = find(&b, NM("mlp.gate_proj.weight"), false, hp->n_ff, E, &L->w_gate)) ||
            (rc = find(&b, NM("mlp.up_proj.weight"), false, hp->n_ff, E, &L->w_up)) ||
            (rc = find(&b, NM("mlp.down_proj.weight"), false, E, hp->n_ff, &L->w_down)))
            goto fail;
        if (hp->qkv_bias &&
            ((rc = vec(&b, NM("self_attn.q_proj.bias"), false, qd, &L->bq)) ||
             (rc = vec(&b, NM("self_attn.k_proj.bias"), false, kvd, &L->bk)) ||
             (rc = vec(&b, NM("self_attn.v_proj.bias"), false, kvd, &L->bv))))
            goto fail;
        if (hp->o_bias && (rc = vec(&b, NM("self_attn.o_proj.bias"), false, E, &L->bo)))
            goto fail;
        if (hp->qk_norm && ((rc = norm(&b, NM("self_attn.q_norm.weight"), hd, &L->q_norm)) ||
                            (rc = norm(&b, NM("self_attn.k_norm.weight"), hd, &L->k_norm))))
            goto fail;
#undef NM
    }
    return 0;
fail:
    lms__weights_release(w);
    return rc;
}

void lms__weights_release(lms__weights *w)
{
    if (!w)
        return;
    lms__free(w->vec_store);
    lms__free(w->layers);
    memset(w, 0, sizeof *w);
}

static uint64_t wt_bytes(const lms__wt *w) { return (uint64_t)w->rows * w->cols * (w->dt == LMS_DTYPE_F32 ? 4 : 2); }

uint64_t lms__weights_bytes(const lms__weights *w, const lms__hparams *hp)
{
    uint64_t n = wt_bytes(&w->lm_head);
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        const lms__layer_w *L = &w->layers[l];
        n += wt_bytes(&L->wq) + wt_bytes(&L->wk) + wt_bytes(&L->wv) + wt_bytes(&L->wo) + wt_bytes(&L->w_gate) +
             wt_bytes(&L->w_up) + wt_bytes(&L->w_down);
    }
    return n;
}

bool lms__weights_on_device(const lms__weights *w, const lms__hparams *hp)
{
    if (!w->embed.dp || !w->lm_head.dp)
        return false;
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        const lms__layer_w *L = &w->layers[l];
        if (!L->wq.dp || !L->wk.dp || !L->wv.dp || !L->wo.dp || !L->w_gate.dp || !L->w_up.dp || !L->w_down.dp)
            return false;
    }
    return true;
}
