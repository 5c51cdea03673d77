/*
 * engine/weights.c - binds the tensors a forward pass reads from a weight
 * source (the loader's lms_model, or a safetensors folder), checking that
 * each is present with a supported dtype and the shape the config implies.
 * Matrices are used in place (pointers into the mapping) in BF16, F16, F32,
 * a GGUF block type (Q4_0 .. Q6_K: whole blocks a row, the byte size
 * checked) or MLX_AFFINE (X.weight's codes with X.scales and X.biases
 * beside it, bits and group size derived from the sizes and checked); only
 * the small vectors (norm weights, biases) are widened to f32 copies and
 * must be plain floats (norms stored as w for (1 + w), Gemma's, get their 1
 * added then, so every norm the backends apply is a plain RMSNorm). Tensors
 * the forward pass does not read (a GGUF import's rope_freqs.weight, whose
 * content config.json carries) are left alone.
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
#include "quant/quant.h"

typedef struct binder {
    const lms__wsrc *src;
    float *vec_next, *vec_end;
    bool plus_one;   /* norms are stored as w and applied as 1 + w */
    lms__weights *w; /* mlx_store: allocated at the first MLX matrix */
    size_t mlx_cap;  /* matrices the model has */
} binder;

size_t lms__wt_row_bytes(const lms__wt *w)
{
    uint32_t bits = w->mlx ? w->mlx->bits : 0;
    uint32_t be = lms_dtype_block_elems(w->dt, bits);
    return be ? (size_t)w->cols / be * lms_dtype_block_bytes(w->dt, bits) : 0;
}

static bool plain(lms_dtype dt) { return dt == LMS_DTYPE_BF16 || dt == LMS_DTYPE_F16 || dt == LMS_DTYPE_F32; }

/* GGUF block types the CPU kernels compute with (Q8_K is an activation type). */
static bool gguf_matrix(lms_dtype dt) { return lms_dtype_is_quantized(dt) && dt != LMS_DTYPE_MLX_AFFINE && dt != LMS_DTYPE_Q8_K; }

static int shape_err(binder *b, const char *name, uint32_t ndim, const uint64_t *shape, uint32_t rows, uint32_t cols)
{
    char want[64], got[96];
    if (cols)
        snprintf(want, sizeof want, "[%u, %u]", rows, cols);
    else
        snprintf(want, sizeof want, "[%u]", rows);
    int n = snprintf(got, sizeof got, "[");
    for (uint32_t i = 0; i < ndim && i < 4 && n < (int)sizeof got - 24; i++)
        n += snprintf(got + n, sizeof got - n, "%s%llu", i ? ", " : "", (unsigned long long)shape[i]);
    snprintf(got + n, sizeof got - n, "]");
    return lms__err(LMS_EFORMAT, "%s: tensor '%s' has shape %s, the config implies %s", b->src->name, name, got,
                    want);
}

/* X.scales or X.biases of MLX matrix `name` (X.weight): [rows][cols / group]
 * of one float dtype; *group from its width. */
static int mlx_side(binder *b, const char *name, const char *suffix, uint32_t rows, uint32_t cols, lms_dtype *sdt,
                    uint32_t *group, const void **host, const void **dev)
{
    char side[192];
    size_t stem = strlen(name) - strlen(".weight");
    snprintf(side, sizeof side, "%.*s.%s", (int)stem, name, suffix);
    lms_dtype dt;
    uint32_t ndim;
    uint64_t shape[LMS_MAX_DIMS] = {0}, nbytes;
    int rc = b->src->tensor(b->src->ctx, side, &dt, &ndim, shape, host, dev, &nbytes);
    if (rc == LMS_ENOENT)
        return lms__err(LMS_ENOENT, "%s: tensor '%s' is MLX-quantized but '%s' is missing", b->src->name, name,
                        side);
    if (rc)
        return rc;
    if (!plain(dt))
        return lms__err(LMS_EFORMAT, "%s: tensor '%s' has dtype %s (MLX scales and biases are F32, F16 or BF16)",
                        b->src->name, side, lms_dtype_name(dt) ? lms_dtype_name(dt) : "?");
    if (ndim != 2 || shape[0] != rows || shape[1] == 0 || cols % shape[1] || !lms__mlx_group_ok(cols / (uint32_t)shape[1]))
        return lms__err(LMS_EFORMAT, "%s: tensor '%s' has shape [%llu, %llu], not [%u, %u / group] for a group of "
                        "32, 64 or 128", b->src->name, side, (unsigned long long)shape[0],
                        (unsigned long long)shape[1], rows, cols);
    if (nbytes != shape[0] * shape[1] * lms_dtype_size(dt) || !*host)
        return lms__err(LMS_EFORMAT, "%s: tensor '%s' holds %llu bytes, not %llu", b->src->name, side,
                        (unsigned long long)nbytes, (unsigned long long)(shape[0] * shape[1] * lms_dtype_size(dt)));
    if (*group && (*sdt != dt || *group != cols / shape[1]))
        return lms__err(LMS_EFORMAT, "%s: tensors '%.*s.scales' and '%s' differ in dtype or shape", b->src->name,
                        (int)stem, name, side);
    *sdt = dt;
    *group = cols / (uint32_t)shape[1];
    return 0;
}

/* An MLX_AFFINE matrix's descriptor: bits from the codes' size, group and the
 * scales' dtype from X.scales and X.biases. */
static int bind_mlx(binder *b, const char *name, uint32_t rows, uint32_t cols, uint64_t nbytes, lms__wt *out)
{
    lms__weights *w = b->w;
    uint64_t elems = (uint64_t)rows * cols;
    uint32_t bits = elems && nbytes * 8 % elems == 0 ? (uint32_t)(nbytes * 8 / elems) : 0;
    if (!lms__mlx_bits_ok(bits) || (uint64_t)cols * bits % 32)
        return lms__err(LMS_EFORMAT, "%s: MLX tensor '%s' [%u, %u] holds %llu bytes: not whole 32-bit words of "
                        "2, 3, 4, 5, 6 or 8-bit codes", b->src->name, name, rows, cols, (unsigned long long)nbytes);
    /* one descriptor per matrix at most, allocated once (the matrices point into it) */
    if (!w->mlx_store && !(w->mlx_store = lms__calloc(b->mlx_cap, sizeof *w->mlx_store)))
        return LMS_ENOMEM;
    assert(w->n_mlx < b->mlx_cap);
    lms__mlx_q *q = &w->mlx_store[w->n_mlx];
    memset(q, 0, sizeof *q);
    q->bits = bits;
    int rc;
    if ((rc = mlx_side(b, name, "scales", rows, cols, &q->sdt, &q->group, &q->scales, &q->dscales)) ||
        (rc = mlx_side(b, name, "biases", rows, cols, &q->sdt, &q->group, &q->biases, &q->dbiases)))
        return rc;
    w->n_mlx++;
    out->mlx = q;
    return 0;
}

static int find(binder *b, const char *name, bool optional, uint32_t rows, uint32_t cols, lms__wt *out)
{
    lms_dtype dt;
    uint32_t ndim;
    uint64_t shape[LMS_MAX_DIMS] = {0}, nbytes;
    const void *data, *dev = NULL;
    memset(out, 0, sizeof *out);
    int rc = b->src->tensor(b->src->ctx, name, &dt, &ndim, shape, &data, &dev, &nbytes);
    if (rc == LMS_ENOENT) {
        if (optional)
            return 0;
        return lms__err(LMS_ENOENT, "%s: tensor '%s' is missing", b->src->name, name);
    }
    if (rc)
        return rc;
    bool quant = cols && (gguf_matrix(dt) || dt == LMS_DTYPE_MLX_AFFINE);
    if (!plain(dt) && !quant)
        return lms__err(LMS_EUNSUPPORTED, "%s: tensor '%s' has dtype %s (%s)", b->src->name, name,
                        lms_dtype_name(dt) ? lms_dtype_name(dt) : "?",
                        cols ? "BF16, F16, F32, GGUF block types Q4_0 to Q6_K and MLX affine are supported"
                             : "vectors must be BF16, F16 or F32");
    bool ok = cols ? (ndim == 2 && shape[0] == rows && shape[1] == cols) : (ndim == 1 && shape[0] == rows);
    if (!ok)
        return shape_err(b, name, ndim, shape, rows, cols);
    if (dt == LMS_DTYPE_MLX_AFFINE) {
        if ((rc = bind_mlx(b, name, rows, cols, nbytes, out)))
            return rc;
    } else {
        uint32_t be = lms_dtype_block_elems(dt, 0);
        uint64_t want = (uint64_t)rows * (cols ? cols : 1) / be * lms_dtype_block_bytes(dt, 0);
        if ((cols ? cols : 1) % be)
            return lms__err(LMS_EFORMAT, "%s: tensor '%s' is %s with rows of %u elements, not whole blocks of %u",
                            b->src->name, name, lms_dtype_name(dt), cols, be);
        if (nbytes != want)
            return lms__err(LMS_EFORMAT, "%s: tensor '%s' (%s [%u, %u]) holds %llu bytes, not %llu", b->src->name,
                            name, lms_dtype_name(dt), rows, cols, (unsigned long long)nbytes,
                            (unsigned long long)want);
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
    binder b = {src, NULL, NULL, hp->norm_plus_one, w, 7 * (size_t)hp->n_layers + 2};
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
    lms__free(w->mlx_store);
    memset(w, 0, sizeof *w);
}

/* A matrix's bytes, with an MLX matrix's scales and biases. */
static uint64_t wt_bytes(const lms__wt *w)
{
    uint64_t n = (uint64_t)w->rows * lms__wt_row_bytes(w);
    if (w->mlx)
        n += 2 * (uint64_t)w->rows * (w->cols / w->mlx->group) * lms_dtype_size(w->mlx->sdt);
    return n;
}

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

const lms__wt *lms__weights_find(const lms__weights *w, const lms__hparams *hp, bool (*pred)(const lms__wt *),
                                char *what, size_t n)
{
    static const char *const names[7] = {"self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                                         "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj"};
    const lms__wt *found = NULL;
    if (pred(&w->embed)) {
        found = &w->embed;
        if (what)
            snprintf(what, n, "model.embed_tokens.weight");
    }
    for (uint32_t l = 0; !found && l < hp->n_layers; l++) {
        const lms__layer_w *L = &w->layers[l];
        const lms__wt *m[7] = {&L->wq, &L->wk, &L->wv, &L->wo, &L->w_gate, &L->w_up, &L->w_down};
        for (int i = 0; i < 7 && !found; i++)
            if (pred(m[i])) {
                found = m[i];
                if (what)
                    snprintf(what, n, "model.layers.%u.%s.weight", l, names[i]);
            }
    }
    if (!found && pred(&w->lm_head)) {
        found = &w->lm_head;
        if (what)
            snprintf(what, n, "lm_head.weight");
    }
    return found;
}

static bool is_quantized(const lms__wt *m) { return lms_dtype_is_quantized(m->dt); }

const lms__wt *lms__weights_quantized(const lms__weights *w, const lms__hparams *hp, char *what, size_t n)
{
    return lms__weights_find(w, hp, is_quantized, what, n);
}

static bool off_device(const lms__wt *m)
{
    return !m->dp || (m->mlx && (!m->mlx->dscales || !m->mlx->dbiases));
}

bool lms__weights_on_device(const lms__weights *w, const lms__hparams *hp)
{
    return !lms__weights_find(w, hp, off_device, NULL, 0);
}
