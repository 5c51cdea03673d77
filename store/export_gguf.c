/*
 * store/export_gguf.c - lms_model_export_gguf: a stored model (Llama,
 * Qwen2, Qwen3) as one GGUF v3 file that llama.cpp and gguf-py read.
 *
 * Metadata comes from the stored config.json (hyperparameters, RoPE
 * scaling), tokenizer.json (byte-level BPE: tokens by id, token types,
 * merges, and the pre-tokenizer named after its regexes) and
 * tokenizer_config.json (special tokens, add_bos_token, chat template):
 * the inverse of gguf_model.c, so a model imported from GGUF goes back
 * with the same tensors and the metadata that matters. Matrices keep their
 * encoding and bytes (F32, F16, BF16, the GGUF block types) under their GGUF
 * names; llama's q_proj / k_proj rows go back into llama.cpp's rotary order
 * (whole rows: byte-exact). Vectors (norms, biases) stored as BF16 or F16
 * are widened to F32, as llama.cpp's converter writes them (its CPU backend
 * multiplies activations by F32 vectors only); F32 ones go out unchanged. MLX_AFFINE tensors have no GGUF encoding and
 * are refused. Llama 3 RoPE scaling without a stored rope_freqs.weight gets
 * one computed from config.json, as llama.cpp's converter does.
 *
 * The file is written as PATH.tmp and renamed at the end; a failure
 * removes it. Every tensor is hash-checked on its way out.
 */
#include <cjson/cJSON.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "quant/quant.h"
#include "store/admin_internal.h"
#include "store/gguf.h"

#define ALIGN 32

/* ---- a growing byte buffer ------------------------------------------------------------------- */

typedef struct buf {
    uint8_t *p;
    size_t n, cap;
    int err;
} buf;

static void put(buf *b, const void *d, size_t n)
{
    if (b->err)
        return;
    if (b->n + n > b->cap) {
        size_t cap = b->cap ? b->cap : 1 << 16;
        while (cap < b->n + n)
            cap *= 2;
        uint8_t *np = lms__realloc(b->p, cap);
        if (!np) {
            b->err = LMS_ENOMEM;
            return;
        }
        b->p = np;
        b->cap = cap;
    }
    memcpy(b->p + b->n, d, n);
    b->n += n;
}

static void put_u32(buf *b, uint32_t v)
{
    uint8_t x[4];
    lms__put_u32(x, v);
    put(b, x, 4);
}

static void put_u64(buf *b, uint64_t v)
{
    uint8_t x[8];
    lms__put_u64(x, v);
    put(b, x, 8);
}

static void put_str(buf *b, const char *s, size_t n)
{
    put_u64(b, n);
    put(b, s, n);
}

typedef struct kvs {
    buf b;
    uint64_t n;
} kvs;

static void key(kvs *k, const char *name, uint32_t type)
{
    put_str(&k->b, name, strlen(name));
    put_u32(&k->b, type);
    k->n++;
}

static void kv_str(kvs *k, const char *name, const char *v)
{
    key(k, name, LMS__GGUF_STRING);
    put_str(&k->b, v, strlen(v));
}

static void kv_u32(kvs *k, const char *name, uint32_t v)
{
    key(k, name, LMS__GGUF_U32);
    put_u32(&k->b, v);
}

static void kv_f32(kvs *k, const char *name, double v)
{
    float f = (float)v;
    uint32_t u;
    memcpy(&u, &f, 4);
    key(k, name, LMS__GGUF_F32);
    put_u32(&k->b, u);
}

static void kv_bool(kvs *k, const char *name, bool v)
{
    key(k, name, LMS__GGUF_BOOL);
    uint8_t x = v;
    put(&k->b, &x, 1);
}

/* ---- config.json ------------------------------------------------------------------------------ */

static const cJSON *jget(const cJSON *o, const char *k) { return cJSON_GetObjectItemCaseSensitive(o, k); }

static int jnum(const cJSON *o, const char *k, double def, double *out, const char *model)
{
    const cJSON *v = jget(o, k);
    if (!v || cJSON_IsNull(v)) {
        if (isnan(def))
            return lms__err(LMS_EFORMAT, "model '%s': config.json lacks '%s'", model, k);
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble) || v->valuedouble < 0)
        return lms__err(LMS_EFORMAT, "model '%s': config.json '%s' is not a non-negative number", model, k);
    *out = v->valuedouble;
    return 0;
}

typedef struct hp {
    const char *arch; /* GGUF name */
    double layers, embd, ff, heads, kv, head_dim, ctx, eps, theta;
    const cJSON *scaling;
} hp;

static int read_config(const char *model, const cJSON *c, hp *h)
{
    static const char *const map[][2] = {{"LlamaForCausalLM", "llama"}, {"Qwen2ForCausalLM", "qwen2"},
                                         {"Qwen3ForCausalLM", "qwen3"}};
    const cJSON *a = jget(c, "architectures");
    const char *arch = cJSON_IsArray(a) && cJSON_IsString(a->child) ? a->child->valuestring : "";
    h->arch = NULL;
    for (size_t i = 0; i < LMS_ARRAY_LEN(map); i++)
        if (!strcmp(arch, map[i][0]))
            h->arch = map[i][1];
    if (!h->arch)
        return lms__err(LMS_EUNSUPPORTED, "model '%s': architecture '%s' has no GGUF export (Llama, Qwen2, Qwen3 do)",
                        model, arch);
    int rc;
    if ((rc = jnum(c, "num_hidden_layers", NAN, &h->layers, model)) ||
        (rc = jnum(c, "hidden_size", NAN, &h->embd, model)) ||
        (rc = jnum(c, "intermediate_size", NAN, &h->ff, model)) ||
        (rc = jnum(c, "num_attention_heads", NAN, &h->heads, model)) ||
        (rc = jnum(c, "num_key_value_heads", h->heads, &h->kv, model)) ||
        (rc = jnum(c, "max_position_embeddings", 4096, &h->ctx, model)) ||
        (rc = jnum(c, "rms_norm_eps", 1e-6, &h->eps, model)) || (rc = jnum(c, "rope_theta", 10000, &h->theta, model)))
        return rc;
    if (!h->heads || !h->kv)
        return lms__err(LMS_EFORMAT, "model '%s': config.json has no attention heads", model);
    if ((rc = jnum(c, "head_dim", floor(h->embd / h->heads), &h->head_dim, model)))
        return rc;
    const cJSON *rp = jget(c, "rope_parameters");
    if (cJSON_IsObject(rp) && (rc = jnum(rp, "rope_theta", h->theta, &h->theta, model)))
        return rc;
    h->scaling = jget(c, "rope_scaling");
    if (!cJSON_IsObject(h->scaling))
        h->scaling = cJSON_IsObject(rp) ? rp : NULL;
    return 0;
}

static const char *rope_type(const cJSON *s)
{
    const cJSON *t = s ? jget(s, "rope_type") : NULL;
    if (!cJSON_IsString(t))
        t = s ? jget(s, "type") : NULL;
    return cJSON_IsString(t) ? t->valuestring : "default";
}

/* Llama 3's per-frequency factors (HF's _compute_llama3_parameters, written
 * into rope_freqs.weight by llama.cpp's converter). */
static int llama3_factors(const char *model, const hp *h, float *f, size_t n)
{
    double factor, low, high, orig;
    int rc;
    if ((rc = jnum(h->scaling, "factor", NAN, &factor, model)) ||
        (rc = jnum(h->scaling, "low_freq_factor", NAN, &low, model)) ||
        (rc = jnum(h->scaling, "high_freq_factor", NAN, &high, model)) ||
        (rc = jnum(h->scaling, "original_max_position_embeddings", NAN, &orig, model)))
        return rc;
    if (high <= low || factor <= 0)
        return lms__err(LMS_EFORMAT, "model '%s': llama3 rope scaling needs high_freq_factor > low_freq_factor", model);
    for (size_t i = 0; i < n; i++) {
        double freq = 1.0 / pow(h->theta, (double)(2 * i) / (double)(2 * n)), wavelen = 2 * M_PI / freq;
        if (wavelen < orig / high)
            f[i] = 1.f;
        else if (wavelen > orig / low)
            f[i] = (float)factor;
        else {
            double smooth = (orig / wavelen - low) / (high - low);
            f[i] = (float)(1 / ((1 - smooth) / factor + smooth));
        }
    }
    return 0;
}

/* ---- tokenizer ---------------------------------------------------------------------------------- */

/* The tokenizer.ggml.pre name of a tokenizer.json pre_tokenizer, or NULL. */
static const char *pre_name(const cJSON *pt, bool *nfc_needed)
{
    const char *re[4];
    int n = 0;
    bool bytelevel_regex = false;
    const cJSON *list = cJSON_IsObject(pt) && cJSON_IsString(jget(pt, "type")) &&
                                !strcmp(jget(pt, "type")->valuestring, "Sequence")
                            ? jget(pt, "pretokenizers")
                            : NULL;
    const cJSON *it;
    if (cJSON_IsObject(pt) && !list) {
        const char *ty = cJSON_IsString(jget(pt, "type")) ? jget(pt, "type")->valuestring : "";
        if (!strcmp(ty, "ByteLevel") && !cJSON_IsFalse(jget(pt, "use_regex")))
            return "gpt2";
        return NULL;
    }
    cJSON_ArrayForEach(it, list)
    {
        const char *ty = cJSON_IsString(jget(it, "type")) ? jget(it, "type")->valuestring : "";
        if (!strcmp(ty, "Split")) {
            const cJSON *pat = jget(jget(it, "pattern"), "Regex");
            if (!cJSON_IsString(pat) || n == 4)
                return NULL;
            re[n++] = pat->valuestring;
        } else if (!strcmp(ty, "ByteLevel")) {
            bytelevel_regex = !cJSON_IsFalse(jget(it, "use_regex"));
        } else if (!strcmp(ty, "Digits") && cJSON_IsTrue(jget(it, "individual_digits")) && n < 4) {
            re[n++] = "\\p{N}";
        } else {
            return NULL;
        }
    }
    if (bytelevel_regex && n < 4)
        re[n++] = LMS__RE_GPT2;
    *nfc_needed = false;
    if (n == 1 && !strcmp(re[0], LMS__RE_GPT2))
        return "gpt2";
    if (n == 2 && !strcmp(re[0], "\\p{N}") && !strcmp(re[1], LMS__RE_GPT2))
        return "smollm";
    if (n == 1 && !strcmp(re[0], LMS__RE_LLAMA3))
        return "llama-bpe";
    if (n == 1 && !strcmp(re[0], LMS__RE_QWEN2)) {
        *nfc_needed = true;
        return "qwen2";
    }
    return NULL;
}

static const char *tok_field(const cJSON *cfg, const char *k)
{
    const cJSON *v = cfg ? jget(cfg, k) : NULL;
    if (cJSON_IsString(v))
        return v->valuestring;
    v = v ? jget(v, "content") : NULL;
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

static int64_t find_token(char **tokens, size_t n, const char *s)
{
    if (!s)
        return -1;
    for (size_t i = 0; i < n; i++)
        if (tokens[i] && !strcmp(tokens[i], s))
            return (int64_t)i;
    return -1;
}

static int put_tokenizer(kvs *k, const char *model, const cJSON *tj, const cJSON *tc, const cJSON *cfg,
                         uint64_t n_vocab)
{
    const cJSON *m = jget(tj, "model"), *vocab = jget(m, "vocab"), *merges = jget(m, "merges");
    const cJSON *ty = jget(m, "type");
    if (!cJSON_IsString(ty) || strcmp(ty->valuestring, "BPE") || !cJSON_IsObject(vocab) || !cJSON_IsArray(merges) ||
        cJSON_IsTrue(jget(m, "byte_fallback")))
        return lms__err(LMS_EUNSUPPORTED, "model '%s': tokenizer.json is not a byte-level BPE tokenizer, the kind GGUF "
                        "export writes", model);
    bool nfc = false;
    const char *pre = pre_name(jget(tj, "pre_tokenizer"), &nfc);
    const cJSON *norm = jget(tj, "normalizer");
    bool has_nfc = cJSON_IsObject(norm) && cJSON_IsString(jget(norm, "type")) &&
                   !strcmp(jget(norm, "type")->valuestring, "NFC");
    if (!pre || (has_nfc != nfc && !cJSON_IsNull(norm) && norm))
        return lms__err(LMS_EUNSUPPORTED, "model '%s': tokenizer.json's pre-tokenizer matches none llama.cpp names "
                        "(gpt2, smollm, llama-bpe, qwen2)", model);
    size_t n = (size_t)n_vocab;
    char **tokens = lms__calloc(n ? n : 1, sizeof *tokens);
    int32_t *types = lms__calloc(n ? n : 1, sizeof *types);
    int rc = tokens && types ? 0 : LMS_ENOMEM;
    const cJSON *it;
    cJSON_ArrayForEach(it, vocab)
    {
        if (rc)
            break;
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble >= (double)n)
            rc = lms__err(LMS_EFORMAT, "model '%s': tokenizer.json token '%s' has an id outside the vocabulary of %zu",
                          model, it->string, n);
        else {
            tokens[(size_t)it->valuedouble] = it->string;
            types[(size_t)it->valuedouble] = 1; /* normal */
        }
    }
    cJSON_ArrayForEach(it, jget(tj, "added_tokens"))
    {
        const cJSON *id = jget(it, "id"), *c = jget(it, "content");
        if (rc || !cJSON_IsNumber(id) || !cJSON_IsString(c) || id->valuedouble < 0 || id->valuedouble >= (double)n)
            continue;
        tokens[(size_t)id->valuedouble] = c->valuestring;
        types[(size_t)id->valuedouble] = cJSON_IsTrue(jget(it, "special")) ? 3 : 4; /* control, user-defined */
    }
    char **pads = lms__calloc(n ? n : 1, sizeof *pads);
    if (!rc && !pads)
        rc = LMS_ENOMEM;
    for (size_t i = 0; !rc && i < n; i++)
        if (!tokens[i]) { /* the converter's padding of a vocabulary smaller than the embedding */
            if (!(pads[i] = lms__asprintf("[PAD%zu]", i)))
                rc = LMS_ENOMEM;
            tokens[i] = pads[i];
            types[i] = 5; /* unused */
        }
    if (!rc) {
        kv_str(k, "tokenizer.ggml.model", "gpt2");
        kv_str(k, "tokenizer.ggml.pre", pre);
        key(k, "tokenizer.ggml.tokens", LMS__GGUF_ARRAY);
        put_u32(&k->b, LMS__GGUF_STRING);
        put_u64(&k->b, n);
        for (size_t i = 0; i < n; i++)
            put_str(&k->b, tokens[i], strlen(tokens[i]));
        key(k, "tokenizer.ggml.token_type", LMS__GGUF_ARRAY);
        put_u32(&k->b, LMS__GGUF_I32);
        put_u64(&k->b, n);
        for (size_t i = 0; i < n; i++)
            put_u32(&k->b, (uint32_t)types[i]);
        key(k, "tokenizer.ggml.merges", LMS__GGUF_ARRAY);
        put_u32(&k->b, LMS__GGUF_STRING);
        put_u64(&k->b, (uint64_t)cJSON_GetArraySize(merges));
        cJSON_ArrayForEach(it, merges)
        {
            char tmp[2048];
            if (cJSON_IsString(it)) {
                put_str(&k->b, it->valuestring, strlen(it->valuestring));
            } else if (cJSON_IsArray(it) && cJSON_GetArraySize(it) == 2 && cJSON_IsString(it->child) &&
                       cJSON_IsString(it->child->next)) {
                int l = snprintf(tmp, sizeof tmp, "%s %s", it->child->valuestring, it->child->next->valuestring);
                put_str(&k->b, tmp, (size_t)LMS_MIN(l, (int)sizeof tmp - 1));
            } else {
                rc = lms__err(LMS_EFORMAT, "model '%s': tokenizer.json has a malformed merge", model);
                break;
            }
        }
    }
    if (!rc) {
        static const char *const which[][3] = {{"bos", "bos_token", "bos_token_id"},
                                               {"eos", "eos_token", "eos_token_id"},
                                               {"unknown", "unk_token", "unk_token_id"},
                                               {"padding", "pad_token", "pad_token_id"}};
        for (size_t w = 0; w < LMS_ARRAY_LEN(which); w++) {
            int64_t id = find_token(tokens, n, tok_field(tc, which[w][1]));
            const cJSON *cid = jget(cfg, which[w][2]);
            if (id < 0 && cJSON_IsNumber(cid) && cid->valuedouble >= 0 && cid->valuedouble < (double)n)
                id = (int64_t)cid->valuedouble;
            if (id >= 0) {
                char kname[64];
                snprintf(kname, sizeof kname, "tokenizer.ggml.%s_token_id", which[w][0]);
                kv_u32(k, kname, (uint32_t)id);
            }
        }
        const cJSON *pp = jget(tj, "post_processor");
        bool add_bos = cJSON_IsTrue(jget(tc, "add_bos_token")) ||
                       (cJSON_IsObject(pp) && cJSON_IsString(jget(pp, "type")) &&
                        !strcmp(jget(pp, "type")->valuestring, "TemplateProcessing"));
        kv_bool(k, "tokenizer.ggml.add_bos_token", add_bos);
        const cJSON *ct = jget(tc, "chat_template");
        if (cJSON_IsString(ct))
            kv_str(k, "tokenizer.chat_template", ct->valuestring);
    }
    for (size_t i = 0; pads && i < n; i++)
        lms__free(pads[i]);
    lms__free(pads);
    lms__free(tokens);
    lms__free(types);
    return rc;
}

/* ---- tensors --------------------------------------------------------------------------------------- */

typedef struct gt {
    char name[160];
    const lms__etensor *t;   /* NULL for a computed tensor */
    const void *mem;         /* computed tensor bytes */
    uint32_t ggml;
    uint32_t ndim;
    uint64_t ne[4];
    uint64_t nbytes, offset;
    uint32_t perm_heads;     /* llama q/k: rows back into rotary order */
    bool widen;              /* a BF16/F16 vector written as F32 */
} gt;

/* HF row of GGUF row g of a tensor in heads of d rows (inverse of the import's). */
static uint64_t hf_row(uint64_t g, uint64_t d)
{
    uint64_t h = g / d, w = g % d;
    return h * d + (w % 2) * (d / 2) + w / 2;
}

static int load_json(lms_store *s, const char *model, const char *file, bool required, cJSON **out)
{
    void *data = NULL;
    size_t len;
    *out = NULL;
    int rc = lms_store_file(s, model, file, &data, &len);
    if (rc == LMS_ENOENT && !required)
        return 0;
    if (rc)
        return rc;
    *out = cJSON_ParseWithLength(data, len);
    lms_free(data);
    if (!*out)
        return lms__err(LMS_EFORMAT, "model '%s': %s is not valid JSON", model, file);
    return 0;
}

int lms_model_export_gguf(lms_store *s, const char *model, const char *path, const lms_export_params *params,
                          lms_export_stats *stats)
{
    lms_export_stats st0;
    if (!stats)
        stats = &st0;
    memset(stats, 0, sizeof *stats);
    if (!s || !model || !path)
        return lms__err(LMS_EINVAL, "export: no store, model or path");
    double t0 = lms__now();
    lms__emodel e;
    memset(&e, 0, sizeof e);
    cJSON *cfg = NULL, *tj = NULL, *tc = NULL;
    kvs k = {0};
    buf hdr = {0};
    gt *g = NULL;
    float freqs[2048];
    char *tmp = NULL;
    int fd = -1, rc;
    lms_progress *prog = NULL;
    lms_hasher *h = NULL;
    if (lms__path_exists(path)) {
        rc = lms__err(LMS_EEXIST, "%s: exists; export writes a new file", path);
        goto out;
    }
    if ((rc = lms__emodel_load(s, model, &e)) || (rc = load_json(s, model, "config.json", true, &cfg)) ||
        (rc = load_json(s, model, "tokenizer.json", false, &tj)) ||
        (rc = load_json(s, model, "tokenizer_config.json", false, &tc)))
        goto out;
    hp hpm;
    if ((rc = read_config(model, cfg, &hpm)))
        goto out;
    const char *rt = rope_type(hpm.scaling);
    bool llama3 = !strcmp(rt, "llama3"), have_freqs = false;
    if (strcmp(rt, "default") && strcmp(rt, "linear") && !llama3) {
        rc = lms__err(LMS_EUNSUPPORTED, "model '%s': rope type '%s' has no GGUF export here", model, rt);
        goto out;
    }
    /* tensors */
    if (!(g = lms__calloc(e.n + 1, sizeof *g))) {
        rc = LMS_ENOMEM;
        goto out;
    }
    size_t ng = 0;
    uint64_t n_vocab = 0;
    for (size_t i = 0; i < e.n; i++)
        if (e.t[i].tr.dtype == LMS_DTYPE_MLX_AFFINE) {
            rc = lms__err(LMS_EUNSUPPORTED, "model '%s' is MLX-quantized (tensor '%s'), which GGUF cannot hold: "
                          "export it as a folder", model, e.t[i].name);
            goto out;
        }
    for (size_t i = 0; i < e.n; i++) {
        const lms__etensor *t = &e.t[i];
        gt *o = &g[ng++];
        if (lms__gguf_name_from_hf(t->name, o->name, sizeof o->name)) {
            rc = lms__err(LMS_EUNSUPPORTED, "model '%s' tensor '%s' has no GGUF name", model, t->name);
            goto out;
        }
        if (!lms__dtype_to_ggml(t->tr.dtype, &o->ggml) || t->tr.ndim == 0 || t->tr.ndim > 4) {
            rc = lms__err(LMS_EUNSUPPORTED, "model '%s' tensor '%s' is %s%s, which GGUF cannot hold", model, t->name,
                          lms_dtype_name(t->tr.dtype), t->tr.dtype == LMS_DTYPE_MLX_AFFINE ? " (MLX)" : "");
            goto out;
        }
        o->t = t;
        o->ndim = t->tr.ndim;
        for (uint32_t d = 0; d < o->ndim; d++)
            o->ne[d] = t->tr.shape[o->ndim - 1 - d];
        o->nbytes = t->tr.nbytes;
        /* vectors (norms, biases) go out as F32, as llama.cpp's converter writes
         * them: its CPU backend multiplies activations only by F32 vectors */
        if (o->ndim == 1 && (t->tr.dtype == LMS_DTYPE_BF16 || t->tr.dtype == LMS_DTYPE_F16)) {
            o->widen = true;
            o->ggml = LMS__GGML_F32;
            o->nbytes = o->ne[0] * 4;
        }
        have_freqs |= !strcmp(o->name, "rope_freqs.weight");
        if (!strcmp(o->name, "token_embd.weight"))
            n_vocab = t->tr.shape[0];
        bool q = strstr(o->name, ".attn_q.") != NULL, kk = strstr(o->name, ".attn_k.") != NULL;
        if (!strcmp(hpm.arch, "llama") && (q || kk)) {
            o->perm_heads = (uint32_t)(q ? hpm.heads : hpm.kv);
            if (!o->perm_heads || t->tr.shape[0] % (2 * o->perm_heads)) {
                rc = lms__err(LMS_EFORMAT, "model '%s' tensor '%s': %llu rows do not split into %u heads of even size",
                              model, t->name, (unsigned long long)t->tr.shape[0], o->perm_heads);
                goto out;
            }
        }
    }
    if (llama3 && !have_freqs) {
        size_t nf = (size_t)hpm.head_dim / 2;
        if (nf == 0 || nf > LMS_ARRAY_LEN(freqs) || (rc = llama3_factors(model, &hpm, freqs, nf))) {
            if (!rc)
                rc = lms__err(LMS_EFORMAT, "model '%s': head_dim out of range", model);
            goto out;
        }
        gt *o = &g[ng++];
        snprintf(o->name, sizeof o->name, "rope_freqs.weight");
        o->mem = freqs;
        o->ggml = LMS__GGML_F32;
        o->ndim = 1;
        o->ne[0] = nf;
        o->nbytes = nf * 4;
    }
    if (!n_vocab) {
        rc = lms__err(LMS_EFORMAT, "model '%s' has no model.embed_tokens.weight", model);
        goto out;
    }
    /* metadata */
    char kname[128];
    kv_str(&k, "general.architecture", hpm.arch);
    kv_str(&k, "general.name", model);
    kv_u32(&k, "general.quantization_version", 2);
    kv_u32(&k, "general.alignment", ALIGN);
#define ARCH_KEY(suffix) (snprintf(kname, sizeof kname, "%s.%s", hpm.arch, suffix), kname)
    kv_u32(&k, ARCH_KEY("block_count"), (uint32_t)hpm.layers);
    kv_u32(&k, ARCH_KEY("context_length"), (uint32_t)hpm.ctx);
    kv_u32(&k, ARCH_KEY("embedding_length"), (uint32_t)hpm.embd);
    kv_u32(&k, ARCH_KEY("feed_forward_length"), (uint32_t)hpm.ff);
    kv_u32(&k, ARCH_KEY("attention.head_count"), (uint32_t)hpm.heads);
    kv_u32(&k, ARCH_KEY("attention.head_count_kv"), (uint32_t)hpm.kv);
    kv_u32(&k, ARCH_KEY("attention.key_length"), (uint32_t)hpm.head_dim);
    kv_u32(&k, ARCH_KEY("attention.value_length"), (uint32_t)hpm.head_dim);
    kv_u32(&k, ARCH_KEY("rope.dimension_count"), (uint32_t)hpm.head_dim);
    kv_f32(&k, ARCH_KEY("rope.freq_base"), hpm.theta);
    kv_f32(&k, ARCH_KEY("attention.layer_norm_rms_epsilon"), hpm.eps);
    kv_u32(&k, ARCH_KEY("vocab_size"), (uint32_t)n_vocab);
    if (!strcmp(rt, "linear")) {
        double f;
        if ((rc = jnum(hpm.scaling, "factor", NAN, &f, model)))
            goto out;
        kv_str(&k, ARCH_KEY("rope.scaling.type"), "linear");
        kv_f32(&k, ARCH_KEY("rope.scaling.factor"), f);
    }
#undef ARCH_KEY
    if (tj && (rc = put_tokenizer(&k, model, tj, tc, cfg, n_vocab)))
        goto out;
    if (k.b.err) {
        rc = k.b.err;
        goto out;
    }
    /* header: magic, version, counts, metadata, tensor infos, padding */
    uint64_t off = 0;
    for (size_t i = 0; i < ng; i++) {
        g[i].offset = off;
        off = lms__align_up(off + g[i].nbytes, ALIGN);
    }
    put(&hdr, "GGUF", 4);
    put_u32(&hdr, 3);
    put_u64(&hdr, ng);
    put_u64(&hdr, k.n);
    put(&hdr, k.b.p, k.b.n);
    for (size_t i = 0; i < ng; i++) {
        put_str(&hdr, g[i].name, strlen(g[i].name));
        put_u32(&hdr, g[i].ndim);
        for (uint32_t d = 0; d < g[i].ndim; d++)
            put_u64(&hdr, g[i].ne[d]);
        put_u32(&hdr, g[i].ggml);
        put_u64(&hdr, g[i].offset);
    }
    static const uint8_t zeros[ALIGN];
    put(&hdr, zeros, (size_t)(lms__align_up(hdr.n, ALIGN) - hdr.n));
    if ((rc = hdr.err))
        goto out;
    /* data */
    if (!(tmp = lms__asprintf("%s.tmp", path)) || !(h = lms__hasher_new())) {
        rc = LMS_ENOMEM;
        goto out;
    }
    if ((fd = lms__open(tmp, O_WRONLY | O_CREAT | O_EXCL, 0644)) < 0) {
        rc = fd;
        goto out;
    }
    if ((rc = lms__pwrite_all(fd, hdr.p, hdr.n, 0, tmp)))
        goto out;
    if (params && params->progress)
        prog = lms__progress_start("export", off, "B");
    for (size_t i = 0; i < ng; i++) {
        const gt *o = &g[i];
        uint64_t base = hdr.n + o->offset;
        if (!o->t) {
            rc = lms__pwrite_all(fd, o->mem, (size_t)o->nbytes, base, tmp);
        } else {
            const uint8_t *p = o->t->bytes;
            lms__hasher_reset(h);
            lms__hasher_update(h, p, (size_t)o->t->tr.nbytes);
            if (!lms__hash128_eq(lms__hasher_digest(h), lms__hash128_get(o->t->tr.hash))) {
                rc = lms__err(LMS_ECORRUPT, "model '%s' tensor '%s': stored bytes fail their XXH3-128; run `lmstore "
                              "verify`", model, o->t->name);
                break;
            }
            if (o->widen) {
                float *f = lms__malloc((size_t)o->nbytes);
                rc = !f ? LMS_ENOMEM : lms__dequant_row(o->t->tr.dtype, p, f, (size_t)o->ne[0]);
                if (!rc)
                    rc = lms__pwrite_all(fd, f, (size_t)o->nbytes, base, tmp);
                lms__free(f);
            } else if (!o->perm_heads) {
                rc = lms__pwrite_all(fd, p, (size_t)o->nbytes, base, tmp);
            } else {
                uint64_t rows = o->t->tr.shape[0], rb = o->nbytes / rows, d = rows / o->perm_heads;
                for (uint64_t r = 0; !rc && r < rows; r++)
                    rc = lms__pwrite_all(fd, p + hf_row(r, d) * rb, (size_t)rb, base + r * rb, tmp);
            }
        }
        if (rc)
            break;
        lms__progress_add(prog, o->nbytes);
        stats->bytes += o->nbytes;
    }
    if (!rc && off > (ng ? g[ng - 1].offset + g[ng - 1].nbytes : 0))
        rc = lms__ftruncate(fd, hdr.n + off, tmp); /* the last tensor's padding, as gguf-py writes it */
    if (!rc)
        rc = lms__fsync(fd, tmp);
    if (!rc && rename(tmp, path))
        rc = lms__err_errno(LMS_EIO, errno, "%s", path);
    if (!rc) {
        stats->tensors = ng;
        stats->shards = 1;
    }
out:
    lms__progress_done(prog);
    if (fd >= 0)
        close(fd);
    if (rc && tmp)
        (void)unlink(tmp);
    if (rc)
        rc = lms__err_prefix(rc, "export '%s' to %s: ", model, path);
    lms__free(tmp);
    lms__hasher_free(h);
    lms__free(g);
    lms__free(k.b.p);
    lms__free(hdr.p);
    cJSON_Delete(cfg);
    cJSON_Delete(tj);
    cJSON_Delete(tc);
    lms__emodel_free(&e);
    stats->seconds = lms__now() - t0;
    return rc;
}
