/*
 * engine/config.c - config.json (and generation_config.json) -> the
 * hyper-parameters the forward pass needs. Accepts both forms of RoPE
 * settings HuggingFace has written: top-level rope_theta + rope_scaling
 * {type|rope_type, factor, ...}, and the newer rope_parameters {rope_type,
 * rope_theta, ...}. Anything the engine does not run (an unknown
 * architecture, activation, RoPE type, sliding window ...) fails here, at
 * load, with a message naming it.
 *
 * A multimodal checkpoint (a family's mm_archs, e.g.
 * Gemma3ForConditionalGeneration) is read for its language model: the
 * fields come from its text_config (eos/bos and tied embeddings from the top
 * level when text_config lacks them). A family's defaults (the values its
 * transformers config class uses for absent keys; configs written by
 * transformers often leave defaults out) fill what neither has.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "engine/internal.h"

static const lms__family *const families[] = {&lms__family_llama, &lms__family_qwen2, &lms__family_qwen3,
                                               &lms__family_gemma3};

static const cJSON *get(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return (v && !cJSON_IsNull(v)) ? v : NULL;
}

/* An integer field in [lo, hi]; absent -> def (def < 0: required). */
static int get_u32(const cJSON *o, const char *k, long long def, long long lo, long long hi, const char *src,
                   uint32_t *out)
{
    const cJSON *v = get(o, k);
    if (!v) {
        if (def < 0)
            return lms__err(LMS_EFORMAT, "%s: config.json: missing '%s'", src, k);
        *out = (uint32_t)def;
        return 0;
    }
    if (!cJSON_IsNumber(v) || v->valuedouble != floor(v->valuedouble) || v->valuedouble < (double)lo ||
        v->valuedouble > (double)hi)
        return lms__err(LMS_EFORMAT, "%s: config.json: '%s' must be an integer in [%lld, %lld]", src, k, lo, hi);
    *out = (uint32_t)v->valuedouble;
    return 0;
}

static int get_f64(const cJSON *o, const char *k, double def, double lo, double hi, const char *src, double *out)
{
    const cJSON *v = get(o, k);
    if (!v) {
        if (isnan(def))
            return lms__err(LMS_EFORMAT, "%s: config.json: missing '%s'", src, k);
        *out = def;
        return 0;
    }
    if (!cJSON_IsNumber(v) || !(v->valuedouble >= lo && v->valuedouble <= hi))
        return lms__err(LMS_EFORMAT, "%s: config.json: '%s' must be a number in [%g, %g]", src, k, lo, hi);
    *out = v->valuedouble;
    return 0;
}

static int get_bool(const cJSON *o, const char *k, bool def, const char *src, bool *out)
{
    const cJSON *v = get(o, k);
    if (!v) {
        *out = def;
        return 0;
    }
    if (!cJSON_IsBool(v))
        return lms__err(LMS_EFORMAT, "%s: config.json: '%s' must be true or false", src, k);
    *out = cJSON_IsTrue(v);
    return 0;
}

/* eos_token_id: an integer or a list of integers; appends to hp->eos_ids. */
static int add_eos(lms__hparams *hp, const cJSON *v, const char *file, const char *src)
{
    if (!v)
        return 0;
    const cJSON *it;
    if (cJSON_IsNumber(v)) {
        it = v;
        goto one;
    }
    if (!cJSON_IsArray(v))
        return lms__err(LMS_EFORMAT, "%s: %s: 'eos_token_id' must be an integer or a list", src, file);
    cJSON_ArrayForEach(it, v)
    {
    one:
        if (!cJSON_IsNumber(it) || it->valuedouble < 0 || it->valuedouble > INT32_MAX)
            return lms__err(LMS_EFORMAT, "%s: %s: bad 'eos_token_id' entry", src, file);
        int32_t id = (int32_t)it->valuedouble;
        bool dup = false;
        for (int i = 0; i < hp->n_eos; i++) dup |= hp->eos_ids[i] == id;
        if (!dup && hp->n_eos < LMS__MAX_EOS)
            hp->eos_ids[hp->n_eos++] = id;
        if (it == v)
            break;
    }
    return 0;
}

int lms__config_rope(lms__hparams *hp, const void *params_, const char *src)
{
    int rc;
    const cJSON *params = params_;
    hp->rope_kind = LMS__ROPE_DEFAULT;
    if (!params)
        return 0;
    const cJSON *ty = get(params, "rope_type");
    if (!ty)
        ty = get(params, "type");
    const char *t = ty && cJSON_IsString(ty) ? ty->valuestring : "default";
    if (!strcmp(t, "default"))
        return 0;
    if (!strcmp(t, "linear")) {
        hp->rope_kind = LMS__ROPE_LINEAR;
        return get_f64(params, "factor", NAN, 1e-6, 1e6, src, &hp->rope_factor);
    }
    if (!strcmp(t, "llama3")) {
        double omp = 0;
        hp->rope_kind = LMS__ROPE_LLAMA3;
        if ((rc = get_f64(params, "factor", NAN, 1e-6, 1e6, src, &hp->rope_factor)) ||
            (rc = get_f64(params, "low_freq_factor", NAN, 1e-6, 1e6, src, &hp->rope_low_freq)) ||
            (rc = get_f64(params, "high_freq_factor", NAN, 1e-6, 1e6, src, &hp->rope_high_freq)) ||
            (rc = get_f64(params, "original_max_position_embeddings", NAN, 1, 1e9, src, &omp)))
            return lms__err_prefix(rc, "rope llama3: ");
        if (hp->rope_high_freq <= hp->rope_low_freq)
            return lms__err(LMS_EFORMAT, "%s: config.json: rope llama3 needs high_freq_factor > low_freq_factor", src);
        hp->rope_orig_max_pos = (uint32_t)omp;
        return 0;
    }
    return lms__err(LMS_EUNSUPPORTED, "%s: config.json: rope type '%s' is not supported (default, linear, llama3 are)",
                    src, t);
}

static int parse_rope(lms__hparams *hp, const cJSON *root, const char *src)
{
    int rc;
    const cJSON *rp = get(root, "rope_parameters");
    const cJSON *rs = get(root, "rope_scaling");
    if (rp && !cJSON_IsObject(rp))
        return lms__err(LMS_EFORMAT, "%s: config.json: 'rope_parameters' must be an object", src);
    if (rs && !cJSON_IsObject(rs))
        return lms__err(LMS_EFORMAT, "%s: config.json: 'rope_scaling' must be an object or null", src);
    /* theta: rope_parameters.rope_theta, else top-level rope_theta, else 10000 */
    if ((rc = get_f64(root, "rope_theta", 10000.0, 1.0, 1e12, src, &hp->rope_theta)))
        return rc;
    if (rp && (rc = get_f64(rp, "rope_theta", hp->rope_theta, 1.0, 1e12, src, &hp->rope_theta)))
        return rc;
    return lms__config_rope(hp, rs ? rs : rp, src);
}

static bool in_list(const char *const *list, const char *s)
{
    for (; list && *list && s; list++)
        if (!strcmp(*list, s))
            return true;
    return false;
}

/* The object the hyper-parameters are read from (see the file's opening
 * comment): a copy of the config, or of its text_config; the caller frees it. */
static int text_part(const lms__family *f, const cJSON *root, const char *arch, const char *mtype, const char *src,
                     cJSON **out)
{
    cJSON *t;
    *out = NULL;
    if (in_list(f->mm_archs, arch) || (!arch && f->mm_model_type && mtype && !strcmp(mtype, f->mm_model_type))) {
        const cJSON *tc = get(root, "text_config");
        if (!tc || !cJSON_IsObject(tc))
            return lms__err(LMS_EFORMAT, "%s: config.json: %s needs a 'text_config' object (its language model)", src,
                            arch ? arch : mtype);
        if (!(t = cJSON_Duplicate(tc, 1)))
            return LMS_ENOMEM;
        static const char *const from_top[] = {"eos_token_id", "bos_token_id", "tie_word_embeddings"};
        for (size_t i = 0; i < LMS_ARRAY_LEN(from_top); i++) {
            const cJSON *v = get(root, from_top[i]);
            if (v && !get(t, from_top[i]))
                cJSON_AddItemToObject(t, from_top[i], cJSON_Duplicate(v, 1));
        }
    } else if (!(t = cJSON_Duplicate(root, 1))) {
        return LMS_ENOMEM;
    }
    if (f->defaults) {
        cJSON *d = cJSON_Parse(f->defaults), *it;
        if (!d) {
            cJSON_Delete(t);
            return LMS_ENOMEM; /* the family's own JSON: only memory can fail it */
        }
        cJSON_ArrayForEach(it, d)
        {
            cJSON *v = get(t, it->string) ? NULL : cJSON_Duplicate(it, 1);
            if (v)
                cJSON_AddItemToObject(t, it->string, v);
        }
        cJSON_Delete(d);
    }
    *out = t;
    return 0;
}

int lms__config_parse(const char *config, const char *gen_config, const char *src, lms__hparams *hp)
{
    int rc = 0;
    cJSON *top = NULL, *root = NULL, *gen = NULL;
    memset(hp, 0, sizeof *hp);
    hp->bos_id = -1;
    top = cJSON_Parse(config);
    if (!top || !cJSON_IsObject(top)) {
        rc = lms__err(LMS_EFORMAT, "%s: config.json is not a JSON object", src);
        goto out;
    }
    /* family from architectures[0], else model_type */
    const cJSON *archs = get(top, "architectures"), *mt = get(top, "model_type");
    const char *arch = NULL;
    if (archs && cJSON_IsArray(archs) && cJSON_GetArraySize(archs) > 0 &&
        cJSON_IsString(cJSON_GetArrayItem(archs, 0)))
        arch = cJSON_GetArrayItem(archs, 0)->valuestring;
    const char *mtype = mt && cJSON_IsString(mt) ? mt->valuestring : NULL;
    for (size_t i = 0; i < LMS_ARRAY_LEN(families) && !hp->family; i++) {
        const lms__family *f = families[i];
        if (arch) {
            if (in_list(f->archs, arch) || in_list(f->mm_archs, arch))
                hp->family = f;
        } else if (mtype && (!strcmp(mtype, f->model_type) || (f->mm_model_type && !strcmp(mtype, f->mm_model_type)))) {
            hp->family = f;
        }
    }
    if (!hp->family) {
        rc = lms__err(LMS_EUNSUPPORTED,
                      "%s: architecture '%s' is not supported (LlamaForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM, "
                      "Gemma3ForCausalLM, Gemma3ForConditionalGeneration are)",
                      src, arch ? arch : mtype ? mtype : "(none in config.json)");
        goto out;
    }
    snprintf(hp->arch_name, sizeof hp->arch_name, "%s", arch ? arch : mtype);
    if ((rc = text_part(hp->family, top, arch, mtype, src, &root)))
        goto out;

    const long long MAXD = 1 << 20;
    if ((rc = get_u32(root, "vocab_size", -1, 1, 1 << 24, src, &hp->n_vocab)) ||
        (rc = get_u32(root, "hidden_size", -1, 1, MAXD, src, &hp->n_embd)) ||
        (rc = get_u32(root, "num_hidden_layers", -1, 1, 4096, src, &hp->n_layers)) ||
        (rc = get_u32(root, "num_attention_heads", -1, 1, 4096, src, &hp->n_heads)) ||
        (rc = get_u32(root, "num_key_value_heads", hp->n_heads, 1, 4096, src, &hp->n_kv_heads)) ||
        (rc = get_u32(root, "intermediate_size", -1, 1, MAXD * 4, src, &hp->n_ff)) ||
        (rc = get_u32(root, "max_position_embeddings", 4096, 1, 1 << 24, src, &hp->max_pos)))
        goto out;
    if ((rc = get_u32(root, "head_dim", hp->n_embd / hp->n_heads, 1, 4096, src, &hp->head_dim)))
        goto out;
    if (hp->head_dim == 0 || hp->head_dim > 4096 || hp->head_dim % 2) { /* also the default, hidden / heads */
        rc = lms__err(LMS_EFORMAT, "%s: config.json: head_dim %u (from %s) is not an even size in [2, 4096]", src,
                      hp->head_dim, get(root, "head_dim") ? "head_dim" : "hidden_size / num_attention_heads");
        goto out;
    }
    if ((uint64_t)hp->n_heads * hp->head_dim > (1u << 20)) {
        rc = lms__err(LMS_EFORMAT, "%s: config.json: %u heads of %u dimensions are too many", src, hp->n_heads,
                      hp->head_dim);
        goto out;
    }
    if (hp->n_heads % hp->n_kv_heads) {
        rc = lms__err(LMS_EFORMAT, "%s: config.json: num_attention_heads %u is not a multiple of num_key_value_heads %u",
                      src, hp->n_heads, hp->n_kv_heads);
        goto out;
    }
    double eps;
    if ((rc = get_f64(root, "rms_norm_eps", 1e-6, 0, 1, src, &eps)))
        goto out;
    hp->eps = (float)eps;
    const cJSON *act = get(root, "hidden_act");
    if (!act)
        act = get(root, "hidden_activation");
    hp->act = LMS__ACT_SILU;
    if (act && cJSON_IsString(act) && !strcmp(act->valuestring, "gelu_pytorch_tanh"))
        hp->act = LMS__ACT_GELU_TANH;
    else if (act && (!cJSON_IsString(act) || strcmp(act->valuestring, "silu"))) {
        rc = lms__err(LMS_EUNSUPPORTED, "%s: config.json: hidden_act '%s' is not supported (silu, gelu_pytorch_tanh are)",
                      src, cJSON_IsString(act) ? act->valuestring : "?");
        goto out;
    }
    hp->embed_scale = 1.0f;
    hp->attn_scale = 1.0f / sqrtf((float)hp->head_dim);
    if ((rc = get_bool(root, "tie_word_embeddings", false, src, &hp->tie_embeddings)))
        goto out;
    if ((rc = parse_rope(hp, root, src)))
        goto out;
    bool sw = false;
    if ((rc = get_bool(root, "use_sliding_window", false, src, &sw)))
        goto out;
    if (sw) {
        rc = lms__err(LMS_EUNSUPPORTED, "%s: config.json: use_sliding_window=true is not supported", src);
        goto out;
    }
    const cJSON *bos = get(root, "bos_token_id");
    if (bos && cJSON_IsNumber(bos) && bos->valuedouble >= 0 && bos->valuedouble < hp->n_vocab)
        hp->bos_id = (int32_t)bos->valuedouble;
    if ((rc = add_eos(hp, get(root, "eos_token_id"), "config.json", src)))
        goto out;
    if (gen_config) {
        gen = cJSON_Parse(gen_config);
        if (!gen || !cJSON_IsObject(gen)) {
            rc = lms__err(LMS_EFORMAT, "%s: generation_config.json is not a JSON object", src);
            goto out;
        }
        if ((rc = add_eos(hp, get(gen, "eos_token_id"), "generation_config.json", src)))
            goto out;
    }
    rc = hp->family->configure(hp, root, src);
out:
    cJSON_Delete(top);
    cJSON_Delete(root);
    cJSON_Delete(gen);
    return rc;
}
