/*
 * store/gguf_model.c - a GGUF model as an import source: tensor names
 * mapped to the HuggingFace names the engine binds, shapes checked against
 * the hyperparameters, and config.json, tokenizer.json,
 * tokenizer_config.json and generation_config.json rebuilt from the
 * metadata (what tools/gguf_to_hf.py writes for the same file; tests
 * compare the two).
 *
 * Tensors keep their GGUF encoding and bytes. GGUF lists dimensions
 * innermost first; the HF shape is the reverse (a weight [out][in] has
 * ne = {in, out}).
 *
 * Rotary permutation (llama architecture only). llama.cpp's converter
 * reorders the rows of each head of q_proj and k_proj (weights and biases)
 * from HF's "rotate half" layout into interleaved pairs, because ggml's
 * RoPE rotates adjacent elements: per head of D rows, gguf row 2i + j holds
 * HF row j*D/2 + i (i < D/2, j in {0, 1}); k_proj uses the KV head count.
 * The import writes the rows back in HF order (st_tensor.perm_heads). A
 * row of a block-quantized tensor is a whole number of blocks, so this
 * moves whole rows and keeps every byte. Qwen2 and Qwen3 files are not
 * permuted (llama.cpp runs them with NeoX RoPE).
 *
 * Llama 3 RoPE scaling is stored in GGUF as the tensor rope_freqs.weight
 * (one factor per rotary frequency) rather than as metadata. The tensor is
 * kept under its GGUF name, and config.json gets the `rope_scaling`
 * {rope_type llama3, factor, low/high_freq_factor,
 * original_max_position_embeddings} that reproduces every factor (to 1e-4
 * relative), searched over Meta's values first, then over every power of
 * two for the original context. Several settings can give the same factors
 * (then the first found is written: the same RoPE, not necessarily the same
 * numbers); a file no setting reproduces is refused.
 */
#include <cjson/cJSON.h>
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "quant/quant.h"
#include "store/gguf.h"

enum { ARCH_LLAMA, ARCH_QWEN2, ARCH_QWEN3 };

static const struct {
    const char *gguf, *hf_arch, *model_type;
} archs[] = {
    [ARCH_LLAMA] = {"llama", "LlamaForCausalLM", "llama"},
    [ARCH_QWEN2] = {"qwen2", "Qwen2ForCausalLM", "qwen2"},
    [ARCH_QWEN3] = {"qwen3", "Qwen3ForCausalLM", "qwen3"},
};

/* Per-block tensors: GGUF name, HF name. */
enum { L_ATTN_NORM, L_FFN_NORM, L_Q, L_K, L_V, L_O, L_QN, L_KN, L_GATE, L_UP, L_DOWN, L_COUNT };
static const char *const layer_gguf[L_COUNT] = {
    "attn_norm", "ffn_norm", "attn_q", "attn_k", "attn_v", "attn_output", "attn_q_norm", "attn_k_norm",
    "ffn_gate", "ffn_up", "ffn_down",
};
static const char *const layer_hf[L_COUNT] = {
    "input_layernorm", "post_attention_layernorm", "self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj",
    "self_attn.o_proj", "self_attn.q_norm", "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj", "mlp.down_proj",
};

typedef struct hparams {
    int arch;
    uint64_t n_layers, n_embd, n_ff, n_heads, n_kv, head_dim, rope_dim, ctx, n_vocab;
    double eps, rope_theta;
    bool tied, q_bias;
} hparams;

/* GGUF token types (llama.cpp's llama_token_type). */
enum { TOK_NORMAL = 1, TOK_UNKNOWN = 2, TOK_CONTROL = 3, TOK_USER_DEFINED = 4, TOK_UNUSED = 5, TOK_BYTE = 6 };

/* ---- hyperparameters ------------------------------------------------------------------------ */

static int arch_u64(const lms__gguf *g, const char *arch, const char *key, bool required, uint64_t max,
                    uint64_t *out)
{
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    return lms__gguf_get_u64(g, k, required, max, out);
}

static int arch_f64(const lms__gguf *g, const char *arch, const char *key, bool required, double *out)
{
    char k[128];
    snprintf(k, sizeof k, "%s.%s", arch, key);
    return lms__gguf_get_f64(g, k, required, out);
}

/* An optional value: LMS_ENOENT means "keep the default". */
static int opt(int rc) { return rc == LMS_ENOENT ? 0 : rc; }

/* float32 metadata printed as the shortest decimal that reads back as the same float32 */
static double short_f32(double v)
{
    char buf[32];
    for (int prec = 6; prec <= 9; prec++) {
        snprintf(buf, sizeof buf, "%.*g", prec, v);
        if ((float)strtod(buf, NULL) == (float)v)
            return strtod(buf, NULL);
    }
    return v;
}

static int read_hparams(const lms__gguf *g, hparams *hp)
{
    lms__gguf_str a;
    int rc = lms__gguf_get_str(g, "general.architecture", true, &a);
    if (rc)
        return rc;
    hp->arch = -1;
    for (int i = 0; i < (int)LMS_ARRAY_LEN(archs); i++)
        if (a.n == strlen(archs[i].gguf) && !memcmp(a.p, archs[i].gguf, a.n))
            hp->arch = i;
    if (hp->arch < 0)
        return lms__err(LMS_EUNSUPPORTED, "%s: architecture '%.*s' is not supported (llama, qwen2, qwen3 are)", g->path,
                        (int)LMS_MIN(a.n, 64), a.p);
    const char *an = archs[hp->arch].gguf;
    const uint64_t MAXD = 1u << 20;
    if ((rc = arch_u64(g, an, "block_count", true, 4096, &hp->n_layers)) ||
        (rc = arch_u64(g, an, "embedding_length", true, MAXD, &hp->n_embd)) ||
        (rc = arch_u64(g, an, "feed_forward_length", true, 4 * MAXD, &hp->n_ff)) ||
        (rc = arch_u64(g, an, "attention.head_count", true, 4096, &hp->n_heads)))
        return rc;
    if (!hp->n_layers || !hp->n_embd || !hp->n_ff || !hp->n_heads)
        return lms__err(LMS_EFORMAT, "%s: block_count, embedding_length, feed_forward_length and head_count must not "
                        "be 0", g->path);
    hp->n_kv = hp->n_heads;
    hp->head_dim = hp->n_embd / hp->n_heads;
    hp->ctx = 4096;
    hp->eps = 1e-6;
    hp->rope_theta = 10000.0;
    if ((rc = opt(arch_u64(g, an, "attention.head_count_kv", false, 4096, &hp->n_kv))) ||
        (rc = opt(arch_u64(g, an, "attention.key_length", false, 4096, &hp->head_dim))) ||
        (rc = opt(arch_u64(g, an, "context_length", false, 1u << 24, &hp->ctx))) ||
        (rc = opt(arch_f64(g, an, "attention.layer_norm_rms_epsilon", false, &hp->eps))) ||
        (rc = opt(arch_f64(g, an, "rope.freq_base", false, &hp->rope_theta))))
        return rc;
    hp->rope_dim = hp->head_dim;
    if ((rc = opt(arch_u64(g, an, "rope.dimension_count", false, 4096, &hp->rope_dim))))
        return rc;
    uint64_t vk;
    if (!hp->n_kv || !hp->head_dim || hp->n_heads % hp->n_kv)
        return lms__err(LMS_EFORMAT, "%s: head_count %llu is not a multiple of head_count_kv %llu (or a count is 0)",
                        g->path, (unsigned long long)hp->n_heads, (unsigned long long)hp->n_kv);
    if ((rc = arch_u64(g, an, "attention.value_length", false, 4096, &vk)) != LMS_ENOENT) {
        if (rc)
            return rc;
        if (vk != hp->head_dim)
            return lms__err(LMS_EUNSUPPORTED, "%s: attention.value_length %llu differs from key_length %llu",
                            g->path, (unsigned long long)vk, (unsigned long long)hp->head_dim);
    }
    if (hp->rope_dim != hp->head_dim)
        return lms__err(LMS_EUNSUPPORTED, "%s: partial rotary (rope.dimension_count %llu, head size %llu) is not "
                        "supported", g->path, (unsigned long long)hp->rope_dim, (unsigned long long)hp->head_dim);
    if (!(hp->eps > 0 && hp->eps < 1) || !(hp->rope_theta >= 1 && hp->rope_theta <= 1e12))
        return lms__err(LMS_EFORMAT, "%s: layer_norm_rms_epsilon or rope.freq_base out of range", g->path);
    hp->eps = short_f32(hp->eps);
    hp->rope_theta = short_f32(hp->rope_theta);
    if (!hp->ctx)
        hp->ctx = 4096;
    return 0;
}

/* ---- tensors ------------------------------------------------------------------------------------ */

/* n decimal digits (1..9) as a number; leading zeros only when allowed. */
static bool digits(const char *s, size_t n, bool zeros, uint64_t *out)
{
    if (n == 0 || n > 9 || (!zeros && n > 1 && s[0] == '0'))
        return false;
    uint64_t v = 0;
    for (size_t i = 0; i < n; i++) {
        if (s[i] < '0' || s[i] > '9')
            return false;
        v = v * 10 + (uint64_t)(s[i] - '0');
    }
    *out = v;
    return true;
}

/* Map one GGUF tensor name. *layer = -1 outside the blocks, *kind = the
 * L_* of a block tensor (or -1), *top = 0 embd, 1 norm, 2 head, 3 rope_freqs. */
static int map_name(const lms__gguf *g, const hparams *hp, const char *name, char *out, size_t cap, int64_t *layer,
                    int *kind, int *top, bool *bias)
{
    *layer = -1;
    *kind = -1;
    *top = -1;
    *bias = false;
    size_t n = strlen(name);
    const char *suf = NULL;
    if (n > 7 && !strcmp(name + n - 7, ".weight"))
        suf = ".weight";
    else if (n > 5 && !strcmp(name + n - 5, ".bias"))
        suf = ".bias", *bias = true;
    if (suf) {
        size_t base = n - strlen(suf);
        static const char *const tops[] = {"token_embd", "output_norm", "output", "rope_freqs"};
        static const char *const tops_hf[] = {"model.embed_tokens", "model.norm", "lm_head", "rope_freqs"};
        for (int i = 0; i < 4; i++)
            if (base == strlen(tops[i]) && !memcmp(name, tops[i], base) && !*bias) {
                *top = i;
                snprintf(out, cap, "%s%s", tops_hf[i], suf);
                return 0;
            }
        if (base > 4 && !memcmp(name, "blk.", 4)) {
            const char *d = name + 4, *dot = memchr(d, '.', base - 4);
            uint64_t li;
            if (dot && digits(d, (size_t)(dot - d), false, &li)) {
                size_t kl = (size_t)(name + base - dot - 1);
                for (int k = 0; k < L_COUNT; k++)
                    if (kl == strlen(layer_gguf[k]) && !memcmp(dot + 1, layer_gguf[k], kl)) {
                        if (li >= hp->n_layers)
                            return lms__err(LMS_EFORMAT, "%s: tensor '%s' names block %llu but block_count is %llu",
                                            g->path, name, (unsigned long long)li, (unsigned long long)hp->n_layers);
                        *layer = (int64_t)li;
                        *kind = k;
                        snprintf(out, cap, "model.layers.%llu.%s%s", (unsigned long long)li, layer_hf[k], suf);
                        return 0;
                    }
            }
        }
    }
    return lms__err(LMS_EUNSUPPORTED, "%s: tensor '%s' has no counterpart in a %s model that lmstore knows", g->path,
                    name, archs[hp->arch].gguf);
}

int lms__gguf_name_from_hf(const char *hf, char *out, size_t cap)
{
    static const char *const tops[][2] = {{"model.embed_tokens.weight", "token_embd.weight"},
                                          {"model.norm.weight", "output_norm.weight"},
                                          {"lm_head.weight", "output.weight"},
                                          {"rope_freqs.weight", "rope_freqs.weight"}};
    for (size_t i = 0; i < LMS_ARRAY_LEN(tops); i++)
        if (!strcmp(hf, tops[i][0])) {
            snprintf(out, cap, "%s", tops[i][1]);
            return 0;
        }
    const char *p = hf + strlen("model.layers."), *dot;
    uint64_t li;
    if (strncmp(hf, "model.layers.", 13) || !(dot = strchr(p, '.')) || !digits(p, (size_t)(dot - p), false, &li))
        return LMS_ENOENT;
    const char *rest = dot + 1, *suf = strrchr(rest, '.');
    if (!suf || (strcmp(suf, ".weight") && strcmp(suf, ".bias")))
        return LMS_ENOENT;
    for (int k = 0; k < L_COUNT; k++)
        if ((size_t)(suf - rest) == strlen(layer_hf[k]) && !memcmp(rest, layer_hf[k], (size_t)(suf - rest))) {
            snprintf(out, cap, "blk.%llu.%s%s", (unsigned long long)li, layer_gguf[k], suf);
            return 0;
        }
    return LMS_ENOENT;
}

/* The HF shape a tensor must have; ndim 0 = no rule. */
static void expected_shape(const hparams *hp, int kind, int top, bool bias, uint64_t *shape, uint32_t *ndim)
{
    uint64_t q = hp->n_heads * hp->head_dim, kv = hp->n_kv * hp->head_dim, r = 0, c = 0;
    *ndim = 0;
    if (top == 0 || top == 2) {
        r = hp->n_vocab, c = hp->n_embd;
    } else if (top == 1) {
        r = hp->n_embd;
    } else if (top == 3) {
        r = hp->head_dim / 2;
    } else {
        switch (kind) {
        case L_ATTN_NORM: case L_FFN_NORM: r = hp->n_embd; break;
        case L_Q: r = q, c = hp->n_embd; break;
        case L_K: case L_V: r = kv, c = hp->n_embd; break;
        case L_O: r = hp->n_embd, c = q; break;
        case L_QN: case L_KN: r = hp->head_dim; break;
        case L_GATE: case L_UP: r = hp->n_ff, c = hp->n_embd; break;
        case L_DOWN: r = hp->n_embd, c = hp->n_ff; break;
        default: return;
        }
    }
    if (bias)
        c = 0;
    shape[0] = r;
    shape[1] = c;
    *ndim = c ? 2 : 1;
}

static void shape_str(const uint64_t *s, uint32_t n, char *out, size_t cap)
{
    size_t o = 0;
    out[0] = '\0';
    for (uint32_t i = 0; i < n && o < cap; i++)
        o += (size_t)snprintf(out + o, cap - o, "%s%llu", i ? ", " : "", (unsigned long long)s[i]);
}

/* ---- the tokenizer --------------------------------------------------------------------------------- */

/* Open-addressing map of token strings -> ids. */
typedef struct tokmap {
    const lms__gguf_str *tok;
    uint32_t *slot; /* id + 1, 0 = empty */
    size_t cap;
} tokmap;

static uint64_t hash_bytes(const char *p, size_t n) { return lms__hash64(p, n, 0); }

static int tokmap_build(tokmap *m, const lms__gguf_str *tok, size_t n, const char *path)
{
    m->tok = tok;
    m->cap = 16;
    while (m->cap < 2 * n)
        m->cap *= 2;
    if (!(m->slot = lms__calloc(m->cap, sizeof *m->slot)))
        return LMS_ENOMEM;
    for (size_t i = 0; i < n; i++) {
        size_t h = (size_t)hash_bytes(tok[i].p, (size_t)tok[i].n) & (m->cap - 1);
        while (m->slot[h]) {
            const lms__gguf_str *o = &tok[m->slot[h] - 1];
            if (o->n == tok[i].n && !memcmp(o->p, tok[i].p, (size_t)o->n))
                return lms__err(LMS_EFORMAT, "%s: tokenizer.ggml.tokens: token %zu ('%.*s') repeats token %u", path, i,
                                (int)LMS_MIN(tok[i].n, 40), tok[i].p, m->slot[h] - 1);
            h = (h + 1) & (m->cap - 1);
        }
        m->slot[h] = (uint32_t)i + 1;
    }
    return 0;
}

static int64_t tokmap_get(const tokmap *m, const char *p, size_t n)
{
    size_t h = (size_t)hash_bytes(p, n) & (m->cap - 1);
    while (m->slot[h]) {
        const lms__gguf_str *o = &m->tok[m->slot[h] - 1];
        if (o->n == n && !memcmp(o->p, p, n))
            return m->slot[h] - 1;
        h = (h + 1) & (m->cap - 1);
    }
    return -1;
}

/* Pre-tokenizer regexes: gguf.h */

enum { PRE_GPT2, PRE_DIGITS_GPT2, PRE_LLAMA3, PRE_QWEN2 };

static const struct {
    const char *name;
    int kind;
} pres[] = {
    {"default", PRE_GPT2},        {"gpt2", PRE_GPT2},        {"gpt-2", PRE_GPT2},
    {"smollm", PRE_DIGITS_GPT2},  {"starcoder", PRE_DIGITS_GPT2}, {"refact", PRE_DIGITS_GPT2},
    {"codeshell", PRE_DIGITS_GPT2}, {"llama-bpe", PRE_LLAMA3}, {"llama3", PRE_LLAMA3},
    {"smaug-bpe", PRE_LLAMA3},    {"qwen2", PRE_QWEN2},      {"qwen35", PRE_QWEN2},
};

static cJSON *split_step(const char *re)
{
    cJSON *s = cJSON_CreateObject(), *pat = cJSON_CreateObject();
    cJSON_AddStringToObject(s, "type", "Split");
    cJSON_AddStringToObject(pat, "Regex", re);
    cJSON_AddItemToObject(s, "pattern", pat);
    cJSON_AddStringToObject(s, "behavior", "Isolated");
    cJSON_AddBoolToObject(s, "invert", false);
    return s;
}

static cJSON *byte_level(bool add_prefix_space, bool trim_offsets, bool use_regex)
{
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "type", "ByteLevel");
    cJSON_AddBoolToObject(o, "add_prefix_space", add_prefix_space);
    cJSON_AddBoolToObject(o, "trim_offsets", trim_offsets);
    cJSON_AddBoolToObject(o, "use_regex", use_regex);
    return o;
}

static cJSON *str_n(const lms__gguf_str *s)
{
    char *t = lms__strndup(s->p, (size_t)s->n);
    if (!t)
        return NULL;
    cJSON *o = cJSON_CreateString(t);
    lms__free(t);
    return o;
}

typedef struct tok_out {
    char *tokenizer, *tok_config, *gen_config;
    int64_t bos, eos, eot, pad, unk;
    bool add_bos;
} tok_out;

/* A special token id from metadata: -1 when absent; must be < n. */
static int special_id(const lms__gguf *g, const char *which, size_t n, int64_t *out)
{
    char key[96];
    uint64_t v;
    snprintf(key, sizeof key, "tokenizer.ggml.%s_token_id", which);
    *out = -1;
    int rc = lms__gguf_get_u64(g, key, false, UINT32_MAX, &v);
    if (rc == LMS_ENOENT)
        return 0;
    if (rc)
        return rc;
    if (v >= n)
        return lms__err(LMS_EFORMAT, "%s: metadata '%s' = %llu is not a token id (vocabulary of %zu)", g->path, key,
                        (unsigned long long)v, n);
    *out = (int64_t)v;
    return 0;
}

static int build_tokenizer(const lms__gguf *g, uint64_t n_rows, tok_out *o)
{
    lms__gguf_str model, pre = {"default", 7};
    int rc = lms__gguf_get_str(g, "tokenizer.ggml.model", true, &model);
    cJSON *root = NULL, *cfg = NULL, *gen = NULL;
    tokmap map = {0};
    if (rc)
        return rc;
    if (!(model.n == 4 && !memcmp(model.p, "gpt2", 4)))
        return lms__err(LMS_EUNSUPPORTED, "%s: tokenizer.ggml.model '%.*s' is not supported (byte-level BPE 'gpt2' is)",
                        g->path, (int)LMS_MIN(model.n, 40), model.p);
    if ((rc = opt(lms__gguf_get_str(g, "tokenizer.ggml.pre", false, &pre))))
        return rc;
    int pk = -1;
    for (size_t i = 0; i < LMS_ARRAY_LEN(pres); i++)
        if (pre.n == strlen(pres[i].name) && !memcmp(pre.p, pres[i].name, pre.n))
            pk = pres[i].kind;
    if (pk < 0)
        return lms__err(LMS_EUNSUPPORTED,
                        "%s: pre-tokenizer '%.*s' (tokenizer.ggml.pre) is not supported (default, gpt2, smollm, "
                        "starcoder, llama-bpe, qwen2 are)",
                        g->path, (int)LMS_MIN(pre.n, 40), pre.p);
    const lms__gguf_kv *toks = lms__gguf_find(g, "tokenizer.ggml.tokens");
    const lms__gguf_kv *types = lms__gguf_find(g, "tokenizer.ggml.token_type");
    const lms__gguf_kv *merges = lms__gguf_find(g, "tokenizer.ggml.merges");
    if (!toks || toks->type != LMS__GGUF_ARRAY || toks->arr_type != LMS__GGUF_STRING || toks->arr_n == 0)
        return lms__err(LMS_EFORMAT, "%s: tokenizer.ggml.tokens is missing or not a non-empty array of strings",
                        g->path);
    size_t n = (size_t)toks->arr_n;
    if (n > n_rows || n > (1u << 24))
        return lms__err(LMS_EFORMAT, "%s: %zu tokens but the token embedding has %llu rows", g->path, n,
                        (unsigned long long)n_rows);
    if (types && (types->type != LMS__GGUF_ARRAY || !lms__gguf_type_numeric(types->arr_type) || types->arr_n != n))
        return lms__err(LMS_EFORMAT, "%s: tokenizer.ggml.token_type is not an array of %zu integers", g->path, n);
    if (!merges || merges->type != LMS__GGUF_ARRAY || merges->arr_type != LMS__GGUF_STRING)
        return lms__err(LMS_EFORMAT, "%s: tokenizer.ggml.merges is missing or not an array of strings", g->path);
    for (size_t i = 0; i < n; i++)
        if (memchr(toks->arr_str[i].p, '\0', (size_t)toks->arr_str[i].n) ||
            !lms__utf8_valid(toks->arr_str[i].p, (size_t)toks->arr_str[i].n))
            return lms__err(LMS_EFORMAT, "%s: tokenizer.ggml.tokens: token %zu is not valid UTF-8 text", g->path, i);
    if ((rc = tokmap_build(&map, toks->arr_str, n, g->path)))
        goto out;
    if ((rc = special_id(g, "bos", n, &o->bos)) || (rc = special_id(g, "eos", n, &o->eos)) ||
        (rc = special_id(g, "eot", n, &o->eot)) || (rc = special_id(g, "padding", n, &o->pad)) ||
        (rc = special_id(g, "unknown", n, &o->unk)))
        goto out;
    o->add_bos = false;
    if ((rc = opt(lms__gguf_get_bool(g, "tokenizer.ggml.add_bos_token", false, &o->add_bos))))
        goto out;
    if (o->add_bos && o->bos < 0) {
        rc = lms__err(LMS_EFORMAT, "%s: tokenizer.ggml.add_bos_token is set but there is no bos_token_id", g->path);
        goto out;
    }

    root = cJSON_CreateObject();
    cJSON *added = cJSON_CreateArray(), *vocab = cJSON_CreateObject(), *mlist = cJSON_CreateArray();
    cJSON *bpe = cJSON_CreateObject(), *ptok = cJSON_CreateObject(), *plist = cJSON_CreateArray();
    if (!root || !added || !vocab || !mlist || !bpe || !ptok || !plist) {
        cJSON_Delete(added), cJSON_Delete(vocab), cJSON_Delete(mlist), cJSON_Delete(bpe), cJSON_Delete(ptok);
        cJSON_Delete(plist);
        rc = LMS_ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < n; i++) {
        int64_t ty = types ? lms__gguf_arr_i64(types, i) : TOK_NORMAL;
        cJSON *s = str_n(&toks->arr_str[i]);
        if (!s) {
            rc = LMS_ENOMEM;
            break;
        }
        char *t = s->valuestring;
        cJSON_AddItemToObject(vocab, t, cJSON_CreateNumber((double)i));
        if (ty == TOK_CONTROL || ty == TOK_USER_DEFINED) {
            cJSON *a = cJSON_CreateObject();
            cJSON_AddNumberToObject(a, "id", (double)i);
            cJSON_AddStringToObject(a, "content", t);
            cJSON_AddBoolToObject(a, "single_word", false);
            cJSON_AddBoolToObject(a, "lstrip", false);
            cJSON_AddBoolToObject(a, "rstrip", false);
            cJSON_AddBoolToObject(a, "normalized", ty != TOK_CONTROL);
            cJSON_AddBoolToObject(a, "special", ty == TOK_CONTROL);
            cJSON_AddItemToArray(added, a);
        }
        cJSON_Delete(s);
    }
    for (uint64_t i = 0; !rc && i < merges->arr_n; i++) {
        const lms__gguf_str *m = &merges->arr_str[i];
        const char *sp = memchr(m->p, ' ', (size_t)m->n);
        size_t la = sp ? (size_t)(sp - m->p) : 0, lb = sp ? (size_t)m->n - la - 1 : 0;
        char joined[1024];
        bool ok = sp && la && lb && !memchr(sp + 1, ' ', lb) && la + lb < sizeof joined &&
                  tokmap_get(&map, m->p, la) >= 0 && tokmap_get(&map, sp + 1, lb) >= 0;
        if (ok) {
            memcpy(joined, m->p, la);
            memcpy(joined + la, sp + 1, lb);
            ok = tokmap_get(&map, joined, la + lb) >= 0;
        }
        if (!ok) {
            rc = lms__err(LMS_EFORMAT, "%s: tokenizer.ggml.merges: merge %llu ('%.*s') does not join two tokens of the "
                          "vocabulary into a third",
                          g->path, (unsigned long long)i, (int)LMS_MIN(m->n, 60), m->p);
            break;
        }
        lms__gguf_str a = {m->p, la}, b = {sp + 1, lb};
        cJSON *pair = cJSON_CreateArray();
        cJSON_AddItemToArray(pair, str_n(&a));
        cJSON_AddItemToArray(pair, str_n(&b));
        cJSON_AddItemToArray(mlist, pair);
    }
    /* pre-tokenizer: Split steps, then ByteLevel without its own regex */
    cJSON_AddStringToObject(ptok, "type", "Sequence");
    if (pk == PRE_DIGITS_GPT2)
        cJSON_AddItemToArray(plist, split_step("\\p{N}"));
    cJSON_AddItemToArray(plist, split_step(pk == PRE_LLAMA3 ? LMS__RE_LLAMA3 : pk == PRE_QWEN2 ? LMS__RE_QWEN2 : LMS__RE_GPT2));
    cJSON_AddItemToArray(plist, byte_level(false, pk != PRE_QWEN2, false));
    cJSON_AddItemToObject(ptok, "pretokenizers", plist);

    cJSON_AddStringToObject(root, "version", "1.0");
    cJSON_AddNullToObject(root, "truncation");
    cJSON_AddNullToObject(root, "padding");
    cJSON_AddItemToObject(root, "added_tokens", added);
    if (pk == PRE_QWEN2) {
        cJSON *nf = cJSON_CreateObject();
        cJSON_AddStringToObject(nf, "type", "NFC");
        cJSON_AddItemToObject(root, "normalizer", nf);
    } else {
        cJSON_AddNullToObject(root, "normalizer");
    }
    cJSON_AddItemToObject(root, "pre_tokenizer", ptok);
    if (o->add_bos) {
        /* HF's Llama 3 post-processor: the BOS token before each sequence */
        char *bos = lms__strndup(toks->arr_str[o->bos].p, (size_t)toks->arr_str[o->bos].n);
        if (!bos) {
            rc = LMS_ENOMEM;
            goto out;
        }
        cJSON *tp = cJSON_CreateObject(), *single = cJSON_CreateArray(), *pair = cJSON_CreateArray();
        cJSON *sp = cJSON_CreateObject(), *st = cJSON_CreateObject(), *ids = cJSON_CreateArray();
        cJSON_AddStringToObject(tp, "type", "TemplateProcessing");
        for (int k = 0; k < 2; k++) {
            cJSON *arr = k ? pair : single;
            for (int seq = 0; seq <= k; seq++) {
                cJSON *tokobj = cJSON_CreateObject(), *inner = cJSON_CreateObject();
                cJSON_AddStringToObject(inner, "id", bos);
                cJSON_AddNumberToObject(inner, "type_id", seq);
                cJSON_AddItemToObject(tokobj, "SpecialToken", inner);
                cJSON_AddItemToArray(arr, tokobj);
                cJSON *seqobj = cJSON_CreateObject(), *si = cJSON_CreateObject();
                cJSON_AddStringToObject(si, "id", seq ? "B" : "A");
                cJSON_AddNumberToObject(si, "type_id", seq);
                cJSON_AddItemToObject(seqobj, "Sequence", si);
                cJSON_AddItemToArray(arr, seqobj);
            }
        }
        cJSON_AddItemToObject(tp, "single", single);
        cJSON_AddItemToObject(tp, "pair", pair);
        cJSON_AddStringToObject(st, "id", bos);
        cJSON_AddItemToArray(ids, cJSON_CreateNumber((double)o->bos));
        cJSON_AddItemToObject(st, "ids", ids);
        cJSON *toklist = cJSON_CreateArray();
        cJSON_AddItemToArray(toklist, cJSON_CreateString(bos));
        cJSON_AddItemToObject(st, "tokens", toklist);
        cJSON_AddItemToObject(sp, bos, st);
        cJSON_AddItemToObject(tp, "special_tokens", sp);
        cJSON_AddItemToObject(root, "post_processor", tp);
        lms__free(bos);
    } else {
        cJSON_AddItemToObject(root, "post_processor", byte_level(true, false, true));
    }
    cJSON_AddItemToObject(root, "decoder", byte_level(true, true, true));
    cJSON_AddStringToObject(bpe, "type", "BPE");
    cJSON_AddNullToObject(bpe, "dropout");
    cJSON_AddNullToObject(bpe, "unk_token");
    cJSON_AddNullToObject(bpe, "continuing_subword_prefix");
    cJSON_AddNullToObject(bpe, "end_of_word_suffix");
    cJSON_AddBoolToObject(bpe, "fuse_unk", false);
    cJSON_AddBoolToObject(bpe, "byte_fallback", false);
    cJSON_AddBoolToObject(bpe, "ignore_merges", pk == PRE_LLAMA3);
    cJSON_AddItemToObject(bpe, "vocab", vocab);
    cJSON_AddItemToObject(bpe, "merges", mlist);
    cJSON_AddItemToObject(root, "model", bpe);
    if (rc)
        goto out;

    /* tokenizer_config.json */
    cfg = cJSON_CreateObject();
    cJSON_AddBoolToObject(cfg, "add_bos_token", o->add_bos);
    cJSON_AddBoolToObject(cfg, "add_prefix_space", false);
    cJSON *dec = cJSON_CreateObject();
    const cJSON *a;
    cJSON *specials = cJSON_CreateArray();
    cJSON_ArrayForEach(a, added)
    {
        char idb[24];
        snprintf(idb, sizeof idb, "%d", (int)cJSON_GetObjectItem(a, "id")->valuedouble);
        cJSON *e = cJSON_CreateObject();
        static const char *const keys[] = {"content", "lstrip", "normalized", "rstrip", "single_word", "special"};
        for (size_t k = 0; k < LMS_ARRAY_LEN(keys); k++)
            cJSON_AddItemToObject(e, keys[k], cJSON_Duplicate(cJSON_GetObjectItem(a, keys[k]), false));
        cJSON_AddItemToObject(dec, idb, e);
        if (cJSON_IsTrue(cJSON_GetObjectItem(a, "special")))
            cJSON_AddItemToArray(specials,
                                 cJSON_CreateString(cJSON_GetObjectItem(a, "content")->valuestring));
    }
    cJSON_AddItemToObject(cfg, "added_tokens_decoder", dec);
    int64_t pad = o->pad >= 0 ? o->pad : o->eos;
    const struct { const char *k; int64_t id; } named[] = {
        {"bos_token", o->bos}, {"eos_token", o->eos}, {"pad_token", pad}, {"unk_token", o->unk}};
    for (size_t k = 0; k < LMS_ARRAY_LEN(named); k++) {
        if (named[k].id >= 0)
            cJSON_AddItemToObject(cfg, named[k].k, str_n(&toks->arr_str[named[k].id]));
        else
            cJSON_AddNullToObject(cfg, named[k].k);
    }
    cJSON_AddBoolToObject(cfg, "clean_up_tokenization_spaces", false);
    cJSON_AddStringToObject(cfg, "tokenizer_class", "PreTrainedTokenizerFast");
    cJSON_AddItemToObject(cfg, "additional_special_tokens", specials);
    lms__gguf_str tmpl;
    if ((rc = lms__gguf_get_str(g, "tokenizer.chat_template", false, &tmpl)) == 0)
        cJSON_AddItemToObject(cfg, "chat_template", str_n(&tmpl));
    else if (rc != LMS_ENOENT)
        goto out;
    rc = 0;

    /* generation_config.json */
    gen = cJSON_CreateObject();
    if (o->bos >= 0)
        cJSON_AddNumberToObject(gen, "bos_token_id", (double)o->bos);
    if (o->eos >= 0 && o->eot >= 0 && o->eot != o->eos) {
        cJSON *e = cJSON_CreateArray();
        cJSON_AddItemToArray(e, cJSON_CreateNumber((double)o->eos));
        cJSON_AddItemToArray(e, cJSON_CreateNumber((double)o->eot));
        cJSON_AddItemToObject(gen, "eos_token_id", e);
    } else if (o->eos >= 0) {
        cJSON_AddNumberToObject(gen, "eos_token_id", (double)o->eos);
    }
    if (pad >= 0)
        cJSON_AddNumberToObject(gen, "pad_token_id", (double)pad);

    o->tokenizer = cJSON_PrintUnformatted(root);
    o->tok_config = cJSON_Print(cfg);
    o->gen_config = cJSON_Print(gen);
    if (!o->tokenizer || !o->tok_config || !o->gen_config)
        rc = LMS_ENOMEM;
out:
    lms__free(map.slot);
    cJSON_Delete(root);
    cJSON_Delete(cfg);
    cJSON_Delete(gen);
    return rc;
}

/* ---- config.json --------------------------------------------------------------------------------- */

static char *build_config(const hparams *hp, const tok_out *t, const cJSON *rope_scaling)
{
    cJSON *c = cJSON_CreateObject(), *a = cJSON_CreateArray();
    cJSON_AddItemToArray(a, cJSON_CreateString(archs[hp->arch].hf_arch));
    cJSON_AddItemToObject(c, "architectures", a);
    cJSON_AddStringToObject(c, "model_type", archs[hp->arch].model_type);
    cJSON_AddNumberToObject(c, "hidden_size", (double)hp->n_embd);
    cJSON_AddNumberToObject(c, "intermediate_size", (double)hp->n_ff);
    cJSON_AddNumberToObject(c, "num_hidden_layers", (double)hp->n_layers);
    cJSON_AddNumberToObject(c, "num_attention_heads", (double)hp->n_heads);
    cJSON_AddNumberToObject(c, "num_key_value_heads", (double)hp->n_kv);
    cJSON_AddNumberToObject(c, "head_dim", (double)hp->head_dim);
    cJSON_AddStringToObject(c, "hidden_act", "silu");
    cJSON_AddNumberToObject(c, "max_position_embeddings", (double)hp->ctx);
    cJSON_AddNumberToObject(c, "rms_norm_eps", hp->eps);
    cJSON_AddNumberToObject(c, "rope_theta", hp->rope_theta);
    if (rope_scaling)
        cJSON_AddItemToObject(c, "rope_scaling", cJSON_Duplicate(rope_scaling, true));
    else
        cJSON_AddNullToObject(c, "rope_scaling");
    if (hp->arch != ARCH_QWEN2)
        cJSON_AddBoolToObject(c, "attention_bias", hp->q_bias);
    cJSON_AddNumberToObject(c, "attention_dropout", 0);
    if (hp->arch == ARCH_LLAMA)
        cJSON_AddBoolToObject(c, "mlp_bias", false);
    if (hp->arch != ARCH_LLAMA) {
        cJSON_AddBoolToObject(c, "use_sliding_window", false);
        cJSON_AddNumberToObject(c, "max_window_layers", (double)hp->n_layers);
    }
    cJSON_AddBoolToObject(c, "tie_word_embeddings", hp->tied);
    cJSON_AddNumberToObject(c, "vocab_size", (double)hp->n_vocab);
    if (t && t->bos >= 0)
        cJSON_AddNumberToObject(c, "bos_token_id", (double)t->bos);
    if (t && t->eos >= 0)
        cJSON_AddNumberToObject(c, "eos_token_id", (double)t->eos);
    if (t && (t->pad >= 0 || t->eos >= 0))
        cJSON_AddNumberToObject(c, "pad_token_id", (double)(t->pad >= 0 ? t->pad : t->eos));
    cJSON_AddBoolToObject(c, "use_cache", true);
    char *s = cJSON_Print(c);
    cJSON_Delete(c);
    return s;
}

/* ---- the conversion ---------------------------------------------------------------------------------- */

static int add_gen(lms__st_source *s, const char *name, char *data)
{
    if (!data)
        return LMS_ENOMEM;
    lms__gen_file *nv = lms__realloc(s->gen_files, (s->n_gen_files + 1) * sizeof *nv);
    char *nm = lms__strdup(name);
    if (!nv || !nm) {
        if (nv)
            s->gen_files = nv;
        lms__free(nm);
        cJSON_free(data);
        return LMS_ENOMEM;
    }
    s->gen_files = nv;
    /* the import frees with lms__free: copy out of cJSON's allocator */
    size_t len = strlen(data);
    char *copy = lms__malloc(len + 1);
    if (!copy) {
        lms__free(nm);
        cJSON_free(data);
        return LMS_ENOMEM;
    }
    memcpy(copy, data, len + 1);
    cJSON_free(data);
    s->gen_files[s->n_gen_files++] = (lms__gen_file){nm, copy, len};
    return 0;
}

static int convert(lms__gguf *const *gs, size_t n_files, lms__st_source *s, const cJSON *rope_scaling)
{
    const lms__gguf *g0 = gs[0];
    hparams hp;
    memset(&hp, 0, sizeof hp);
    tok_out tok = {.bos = -1, .eos = -1, .eot = -1, .pad = -1, .unk = -1};
    uint8_t *seen = NULL; /* [n_layers][L_COUNT] */
    int rc = read_hparams(g0, &hp);
    if (rc)
        return rc;
    bool have_embd = false, have_head = false;
    for (size_t f = 0; f < n_files; f++)
        for (size_t i = 0; i < gs[f]->n_t; i++) {
            const lms__gguf_tensor *t = &gs[f]->t[i];
            if (!strcmp(t->name, "token_embd.weight")) {
                if (t->n_dims != 2 || t->ne[0] != hp.n_embd)
                    return lms__err(LMS_EFORMAT, "%s: token_embd.weight is not [vocab, %llu]", gs[f]->path,
                                    (unsigned long long)hp.n_embd);
                hp.n_vocab = t->ne[1];
                have_embd = true;
            }
            have_head |= !strcmp(t->name, "output.weight");
            hp.q_bias |= !strcmp(t->name, "blk.0.attn_q.bias");
        }
    if (!have_embd)
        return lms__err(LMS_EFORMAT, "%s: the model has no token_embd.weight", g0->path);
    hp.tied = !have_head;
    uint64_t vs;
    if ((rc = arch_u64(g0, archs[hp.arch].gguf, "vocab_size", false, UINT32_MAX, &vs)) != LMS_ENOENT) {
        if (rc)
            return rc;
        if (vs != hp.n_vocab)
            return lms__err(LMS_EFORMAT, "%s: %s.vocab_size is %llu but token_embd.weight has %llu rows", g0->path,
                            archs[hp.arch].gguf, (unsigned long long)vs, (unsigned long long)hp.n_vocab);
    }
    if (!(seen = lms__calloc((size_t)hp.n_layers * L_COUNT, 1)))
        return LMS_ENOMEM;
    for (size_t f = 0; f < n_files; f++) {
        lms__st_file *sf = s->shards[f];
        sf->tensors = lms__calloc(gs[f]->n_t ? gs[f]->n_t : 1, sizeof *sf->tensors);
        if (!sf->tensors) {
            rc = LMS_ENOMEM;
            goto out;
        }
        for (size_t i = 0; i < gs[f]->n_t; i++) {
            const lms__gguf_tensor *t = &gs[f]->t[i];
            lms__st_tensor *st = &sf->tensors[i];
            char hf[160];
            int64_t layer;
            int kind, top;
            bool bias;
            if ((rc = map_name(gs[f], &hp, t->name, hf, sizeof hf, &layer, &kind, &top, &bias)))
                goto out;
            if (!(st->name = lms__strdup(hf))) {
                rc = LMS_ENOMEM;
                goto out;
            }
            sf->n_tensors++;
            st->dtype = t->dtype;
            st->ndim = t->n_dims;
            st->nelem = 1;
            for (uint32_t d = 0; d < t->n_dims; d++) {
                st->shape[d] = t->ne[t->n_dims - 1 - d];
                st->nelem *= t->ne[d];
            }
            st->nbytes = t->nbytes;
            st->begin = t->offset;
            st->end = t->offset + t->nbytes;
            uint64_t want[2];
            uint32_t wnd;
            expected_shape(&hp, kind, top, bias, want, &wnd);
            if (wnd && (st->ndim != wnd || st->shape[0] != want[0] || (wnd == 2 && st->shape[1] != want[1]))) {
                char got[96], exp[64];
                shape_str(st->shape, st->ndim, got, sizeof got);
                shape_str(want, wnd, exp, sizeof exp);
                rc = lms__err(LMS_EFORMAT, "%s: tensor '%s' is [%s] but the metadata gives [%s]", gs[f]->path, t->name,
                              got, exp);
                goto out;
            }
            if (top == 3 && t->dtype != LMS_DTYPE_F32) {
                rc = lms__err(LMS_EFORMAT, "%s: rope_freqs.weight is %s, not F32", gs[f]->path,
                              lms_dtype_name(t->dtype));
                goto out;
            }
            if (layer >= 0 && !bias) {
                uint8_t *sn = &seen[(size_t)layer * L_COUNT + (size_t)kind];
                *sn = 1;
            }
            if (hp.arch == ARCH_LLAMA && (kind == L_Q || kind == L_K)) {
                uint64_t heads = kind == L_Q ? hp.n_heads : hp.n_kv;
                if (hp.head_dim % 2) {
                    rc = lms__err(LMS_EFORMAT, "%s: tensor '%s': head size %llu is odd, so its rotary rows cannot be "
                                  "un-permuted", gs[f]->path, t->name, (unsigned long long)hp.head_dim);
                    goto out;
                }
                st->perm_heads = (uint32_t)heads;
            }
        }
    }
    /* every block complete */
    for (uint64_t l = 0; l < hp.n_layers; l++)
        for (int k = 0; k < L_COUNT; k++) {
            bool need = k != L_QN && k != L_KN;
            if (hp.arch == ARCH_QWEN3)
                need = true;
            if (need && !seen[l * L_COUNT + (size_t)k]) {
                rc = lms__err(LMS_EFORMAT, "%s: block %llu lacks blk.%llu.%s.weight (block_count is %llu)", g0->path,
                              (unsigned long long)l, (unsigned long long)l, layer_gguf[k],
                              (unsigned long long)hp.n_layers);
                goto out;
            }
        }
    /* side files */
    bool have_tok = lms__gguf_find(g0, "tokenizer.ggml.model") != NULL;
    if (have_tok && (rc = build_tokenizer(g0, hp.n_vocab, &tok)))
        goto out;
    if (!have_tok)
        lms__warn("%s: no tokenizer in the metadata: the model is stored without tokenizer files", g0->path);
    if ((rc = add_gen(s, "config.json", build_config(&hp, have_tok ? &tok : NULL, rope_scaling))))
        goto out;
    if (have_tok) {
        rc = add_gen(s, "tokenizer.json", tok.tokenizer);
        tok.tokenizer = NULL;
        if (!rc)
            rc = add_gen(s, "tokenizer_config.json", tok.tok_config);
        tok.tok_config = NULL;
        if (!rc)
            rc = add_gen(s, "generation_config.json", tok.gen_config);
        tok.gen_config = NULL;
    }
out:
    cJSON_free(tok.tokenizer);
    cJSON_free(tok.tok_config);
    cJSON_free(tok.gen_config);
    lms__free(seen);
    return rc;
}

int lms__gguf_convert(lms__gguf *const *gs, size_t n_files, lms__st_source *s)
{
    return convert(gs, n_files, s, NULL);
}

/* ---- Llama 3 RoPE scaling from rope_freqs.weight -------------------------------------------------- */

/* The rope_scaling object whose factors (computed as HF's
 * _compute_llama3_parameters and llama.cpp's converter do) equal f[0..n). */
static cJSON *llama3_scaling(const float *f, size_t n, double theta)
{
    static const double lows[] = {1, 2, 4}, highs[] = {4, 2, 8, 16};
    double origs[24] = {8192, 4096, 2048, 16384, 32768, 65536, 131072};
    for (int i = 7, p = 4; i < 24; i++, p++)
        origs[i] = (double)(1u << p); /* then every power of two from 16 */
    double factor = f[n - 1];
    if (!(factor >= 1))
        return NULL;
    for (size_t a = 0; a < LMS_ARRAY_LEN(lows); a++)
        for (size_t b = 0; b < LMS_ARRAY_LEN(highs); b++)
            for (size_t c = 0; c < LMS_ARRAY_LEN(origs); c++) {
                double low = lows[a], high = highs[b], orig = origs[c];
                if (high <= low)
                    continue;
                bool ok = true;
                for (size_t i = 0; i < n && ok; i++) {
                    double freq = 1.0 / pow(theta, (double)(2 * i) / (double)(2 * n));
                    double wavelen = 2 * M_PI / freq, want;
                    if (wavelen < orig / high)
                        want = 1;
                    else if (wavelen > orig / low)
                        want = factor;
                    else {
                        double smooth = (orig / wavelen - low) / (high - low);
                        want = 1 / ((1 - smooth) / factor + smooth);
                    }
                    ok = fabs(want - f[i]) <= 1e-4 * fabs(want);
                }
                if (ok) {
                    cJSON *o = cJSON_CreateObject();
                    cJSON_AddStringToObject(o, "rope_type", "llama3");
                    cJSON_AddNumberToObject(o, "factor", short_f32(factor));
                    cJSON_AddNumberToObject(o, "low_freq_factor", low);
                    cJSON_AddNumberToObject(o, "high_freq_factor", high);
                    cJSON_AddNumberToObject(o, "original_max_position_embeddings", orig);
                    return o;
                }
            }
    return NULL;
}

/* ---- opening files --------------------------------------------------------------------------------- */

static bool has_suffix(const char *s, const char *suf)
{
    size_t a = strlen(s), b = strlen(suf);
    return a >= b && !strcmp(s + a - b, suf);
}

static int cmp_strp(const void *a, const void *b) { return strcmp(*(char *const *)a, *(char *const *)b); }

/* "NAME-00001-of-00003.gguf": true with the prefix length, K and N. */
static bool split_name(const char *base, size_t *prefix, unsigned *k, unsigned *n)
{
    size_t l = strlen(base);
    if (l < 20 || !has_suffix(base, ".gguf"))
        return false;
    const char *p = base + l - 5 - 15; /* "-00001-of-00003" */
    uint64_t a, b;
    if (p[0] != '-' || memcmp(p + 6, "-of-", 4) || !digits(p + 1, 5, true, &a) || !digits(p + 10, 5, true, &b))
        return false;
    *prefix = (size_t)(p - base);
    *k = (unsigned)a;
    *n = (unsigned)b;
    return *k >= 1 && *k <= *n;
}

/* The GGUF files of the model at src: a folder's *.gguf files, a split
 * set's files given its first, or the one file. */
static int list_files(const char *src, char ***out, size_t *n_out)
{
    *out = NULL;
    *n_out = 0;
    char **v = NULL, *dir = NULL;
    size_t n = 0, cap = 0;
    int rc = 0;
    const char *want_prefix = NULL;
    size_t want_len = 0;
    unsigned k, total = 0;
    if (lms__is_dir(src)) {
        dir = lms__strdup(src);
    } else {
        const char *sl = strrchr(src, '/');
        const char *base = sl ? sl + 1 : src;
        size_t pl;
        if (split_name(base, &pl, &k, &total)) {
            if (k != 1)
                return lms__err(LMS_EINVAL, "%s: give the first file of the split set (-00001-of-%05u.gguf)", src,
                                total);
            dir = sl ? lms__strndup(src, (size_t)(sl - src)) : lms__strdup(".");
            want_prefix = base;
            want_len = pl;
        } else {
            v = lms__malloc(sizeof *v);
            if (!v || !(v[0] = lms__strdup(src))) {
                lms__free(v);
                return LMS_ENOMEM;
            }
            *out = v;
            *n_out = 1;
            return 0;
        }
    }
    if (!dir)
        return LMS_ENOMEM;
    DIR *d = opendir(dir);
    if (!d) {
        rc = lms__err_errno(errno == ENOENT ? LMS_ENOENT : LMS_EIO, errno, "%s", dir);
        lms__free(dir);
        return rc;
    }
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t pl;
        unsigned kk, tt;
        if (e->d_name[0] == '.' || !has_suffix(e->d_name, ".gguf"))
            continue;
        if (want_prefix && !(split_name(e->d_name, &pl, &kk, &tt) && pl == want_len &&
                             !memcmp(e->d_name, want_prefix, pl) && tt == total))
            continue;
        if (n == cap) {
            cap = cap ? cap * 2 : 8;
            char **nv = lms__realloc(v, cap * sizeof *v);
            if (!nv) {
                rc = LMS_ENOMEM;
                break;
            }
            v = nv;
        }
        if (!(v[n] = lms__asprintf("%s/%s", dir, e->d_name))) {
            rc = LMS_ENOMEM;
            break;
        }
        n++;
    }
    closedir(d);
    if (!rc && n == 0)
        rc = lms__err(LMS_ENOENT, "%s: no .gguf files", src);
    if (rc) {
        for (size_t i = 0; i < n; i++)
            lms__free(v[i]);
        lms__free(v);
        lms__free(dir);
        return rc;
    }
    qsort(v, n, sizeof *v, cmp_strp);
    lms__free(dir);
    *out = v;
    *n_out = n;
    return 0;
}

/* Split metadata of file i of n: split.no == i, split.count == n (absent in a single file). */
static int check_split(const lms__gguf *g, size_t i, size_t n, uint64_t *tensors_total)
{
    uint64_t no, count, total;
    int rc = lms__gguf_get_u64(g, "split.count", false, 65535, &count);
    if (rc == LMS_ENOENT) {
        if (n > 1)
            return lms__err(LMS_EFORMAT, "%s: one of %zu GGUF files but it has no split.count (a folder may hold only "
                            "one model: its file, or the files of one split set)", g->path, n);
        return 0;
    }
    if (rc || (rc = lms__gguf_get_u64(g, "split.no", true, 65535, &no)))
        return rc;
    if (count != n || no != i)
        return lms__err(LMS_EFORMAT, "%s: split %llu of %llu, but it is file %zu of the %zu found", g->path,
                        (unsigned long long)no + 1, (unsigned long long)count, i + 1, n);
    if (i == 0) {
        if ((rc = lms__gguf_get_u64(g, "split.tensors.count", true, UINT32_MAX, &total)))
            return rc;
        *tensors_total = total;
    }
    return 0;
}

int lms__gguf_source_open(const char *src, lms__st_source **out)
{
    *out = NULL;
    char **files = NULL;
    size_t n_files = 0;
    lms__gguf *gv = NULL, **gp = NULL;
    cJSON *scaling = NULL;
    uint64_t total = 0, have = 0;
    lms__st_source *s = lms__calloc(1, sizeof *s);
    int rc = 0;
    if (!s || !(s->src = lms__strdup(src))) {
        rc = LMS_ENOMEM;
        goto out;
    }
    s->is_dir = lms__is_dir(src);
    s->kind = "GGUF";
    if ((rc = list_files(src, &files, &n_files)))
        goto out;
    gv = lms__calloc(n_files, sizeof *gv);
    gp = lms__calloc(n_files, sizeof *gp);
    s->shards = lms__calloc(n_files, sizeof *s->shards);
    if (!gv || !gp || !s->shards) {
        rc = LMS_ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < n_files; i++) {
        gp[i] = &gv[i];
        if ((rc = lms__gguf_open(files[i], &gv[i])) || (rc = check_split(&gv[i], i, n_files, &total)))
            goto out;
        lms__st_file *f = lms__calloc(1, sizeof *f);
        if (!f || !(f->path = lms__strdup(files[i]))) {
            lms__free(f);
            rc = LMS_ENOMEM;
            goto out;
        }
        f->file_size = gv[i].file_size;
        f->header_len = gv[i].buf_len;
        f->data_off = gv[i].data_off;
        f->data_size = gv[i].file_size - gv[i].data_off;
        s->shards[s->n_shards++] = f;
        have += gv[i].n_t;
    }
    if (n_files > 1 && have != total) {
        rc = lms__err(LMS_EFORMAT, "%s: split.tensors.count is %llu but the %zu files hold %llu tensors", files[0],
                      (unsigned long long)total, n_files, (unsigned long long)have);
        goto out;
    }
    /* Llama 3 RoPE scaling: read the factors */
    for (size_t f = 0; f < n_files; f++)
        for (size_t i = 0; i < gv[f].n_t; i++) {
            const lms__gguf_tensor *t = &gv[f].t[i];
            if (strcmp(t->name, "rope_freqs.weight") || t->dtype != LMS_DTYPE_F32 || t->n_dims != 1 ||
                t->ne[0] == 0 || t->ne[0] > 4096)
                continue;
            float fr[4096];
            int fd = lms__open_regular(files[f]);
            if (fd < 0) {
                rc = fd;
                goto out;
            }
            uint8_t raw[4 * 4096];
            rc = lms__pread_all(fd, raw, (size_t)t->nbytes, gv[f].data_off + t->offset, files[f]);
            close(fd);
            if (rc)
                goto out;
            for (size_t k = 0; k < t->ne[0]; k++) {
                uint32_t u = lms__get_u32(raw + 4 * k);
                memcpy(&fr[k], &u, 4);
            }
            hparams hp;
            memset(&hp, 0, sizeof hp);
            if ((rc = read_hparams(&gv[0], &hp)))
                goto out;
            if (!(scaling = llama3_scaling(fr, (size_t)t->ne[0], hp.rope_theta))) {
                rc = lms__err(LMS_EUNSUPPORTED,
                              "%s: rope_freqs.weight matches no Llama 3 RoPE scaling (factor, low/high frequency "
                              "factors, original context) that lmstore can write into config.json",
                              files[f]);
                goto out;
            }
        }
    if ((rc = convert(gp, n_files, s, scaling)))
        goto out;
    *out = s;
    s = NULL;
out:
    cJSON_Delete(scaling);
    for (size_t i = 0; i < n_files; i++) {
        if (gv)
            lms__gguf_clear(&gv[i]);
        lms__free(files[i]);
    }
    lms__free(files);
    lms__free(gv);
    lms__free(gp);
    lms__st_source_free(s);
    return rc;
}
