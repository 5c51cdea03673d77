/*
 * engine/model_gemma3.c - the Gemma 3 family, text only: Gemma3ForCausalLM
 * (model_type gemma3_text, e.g. gemma-3-1b) and the language model of
 * Gemma3ForConditionalGeneration (gemma-3-4b and larger: config.c reads its
 * text_config, weights.c finds its tensors under the language model's
 * prefix; the vision tower is stored with the model but not run).
 *
 * What differs from Llama, as transformers computes it:
 *  - embeddings multiplied by sqrt(hidden_size), in the weights' dtype;
 *  - RMSNorm weights stored as w and applied as (1 + w) in f32 (weights.c
 *    adds the 1 once, at bind time), four norms per layer (input,
 *    post-attention, pre-feedforward, post-feedforward: hp->post_norms) and
 *    per-head q/k norms;
 *  - attention scores scaled by query_pre_attn_scalar^-0.5; logits
 *    soft-capped by final_logit_softcapping when set (attn_logit_softcapping
 *    is not applied: transformers' Gemma 3 attention does not pass it on, as
 *    Gemma 2's did, so the models were made without it);
 *  - a GELU-tanh gated MLP;
 *  - local (sliding-window) and global layers, from layer_types or every
 *    sliding_window_pattern-th layer global; local layers attend to the last
 *    sliding_window positions with RoPE of base rope_local_base_freq (never
 *    scaled), global ones to every position with RoPE of rope_theta and its
 *    scaling (linear, factor 8, on the larger models). RoPE settings come in
 *    either form transformers writes: rope_theta + rope_local_base_freq +
 *    rope_scaling, or rope_parameters {full_attention, sliding_attention}.
 * Settings that would change the computation and are not run fail here,
 * named.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

#include "engine/internal.h"

/* Gemma3TextConfig's defaults (transformers), for keys a config leaves out:
 * gemma-3-4b's text_config, for one, lists only what differs from them. */
static const char defaults[] =
    "{\"vocab_size\":262208,\"hidden_size\":2304,\"intermediate_size\":9216,\"num_hidden_layers\":26,"
    "\"num_attention_heads\":8,\"num_key_value_heads\":4,\"head_dim\":256,"
    "\"hidden_activation\":\"gelu_pytorch_tanh\",\"max_position_embeddings\":131072,\"rms_norm_eps\":1e-6,"
    "\"eos_token_id\":1,\"bos_token_id\":2,\"tie_word_embeddings\":true,\"rope_theta\":1000000.0,"
    "\"rope_local_base_freq\":10000.0,\"attention_bias\":false,\"query_pre_attn_scalar\":256,"
    "\"sliding_window\":4096,\"sliding_window_pattern\":6}";

static const cJSON *get(const cJSON *o, const char *k)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(o, k);
    return (v && !cJSON_IsNull(v)) ? v : NULL;
}

/* A positive number field (absent: *out unchanged). */
static int positive(const cJSON *o, const char *k, const char *src, double *out)
{
    const cJSON *v = get(o, k);
    if (!v)
        return 0;
    if (!cJSON_IsNumber(v) || !(v->valuedouble > 0) || v->valuedouble > 1e12)
        return lms__err(LMS_EFORMAT, "%s: config.json: '%s' must be a positive number", src, k);
    *out = v->valuedouble;
    return 0;
}

/* Which layers are local (sliding-window): layer_types, else every layer but
 * each sliding_window_pattern-th. */
static int layer_kinds(lms__hparams *hp, const cJSON *root, const char *src, uint32_t *n_local)
{
    const cJSON *lt = get(root, "layer_types");
    *n_local = 0;
    if (lt) {
        if (!cJSON_IsArray(lt) || cJSON_GetArraySize(lt) != (int)hp->n_layers)
            return lms__err(LMS_EFORMAT, "%s: config.json: 'layer_types' must list the %u layers", src, hp->n_layers);
        uint32_t l = 0;
        const cJSON *it;
        cJSON_ArrayForEach(it, lt)
        {
            const char *t = cJSON_IsString(it) ? it->valuestring : "?";
            if (!strcmp(t, "sliding_attention"))
                hp->sliding[l] = 1;
            else if (strcmp(t, "full_attention"))
                return lms__err(LMS_EUNSUPPORTED,
                                "%s: config.json: layer type '%s' (layer %u) is not supported (sliding_attention, "
                                "full_attention are)",
                                src, t, l);
            *n_local += hp->sliding[l++];
        }
        return 0;
    }
    const cJSON *pat = get(root, "sliding_window_pattern");
    if (!pat || !cJSON_IsNumber(pat) || pat->valuedouble < 1 || pat->valuedouble > 1e6 ||
        pat->valuedouble != floor(pat->valuedouble))
        return lms__err(LMS_EFORMAT, "%s: config.json: 'sliding_window_pattern' must be a positive integer", src);
    uint32_t p = (uint32_t)pat->valuedouble;
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        hp->sliding[l] = (l + 1) % p != 0;
        *n_local += hp->sliding[l];
    }
    return 0;
}

/* RoPE of global and local layers (see the opening comment). config.c has read
 * rope_theta and rope_scaling (the older form) already. */
static int rope(lms__hparams *hp, const cJSON *root, const char *src)
{
    int rc;
    const cJSON *rp = get(root, "rope_parameters");
    const cJSON *full = rp ? get(rp, "full_attention") : NULL, *slide = rp ? get(rp, "sliding_attention") : NULL;
    hp->rope_local_theta = 10000.0;
    if (!full && !slide) /* the older form */
        return positive(root, "rope_local_base_freq", src, &hp->rope_local_theta);
    if ((full && !cJSON_IsObject(full)) || (slide && !cJSON_IsObject(slide)))
        return lms__err(LMS_EFORMAT, "%s: config.json: rope_parameters' full_attention and sliding_attention must be "
                                     "objects", src);
    hp->rope_theta = 1000000.0;
    if ((rc = positive(full, "rope_theta", src, &hp->rope_theta)) || (rc = lms__config_rope(hp, full, src)) ||
        (rc = positive(slide, "rope_theta", src, &hp->rope_local_theta)))
        return rc;
    const cJSON *ty = slide ? get(slide, "rope_type") : NULL;
    if (!ty && slide)
        ty = get(slide, "type");
    if (ty && (!cJSON_IsString(ty) || strcmp(ty->valuestring, "default")))
        return lms__err(LMS_EUNSUPPORTED, "%s: config.json: sliding_attention rope type '%s' is not supported (default is)",
                        src, cJSON_IsString(ty) ? ty->valuestring : "?");
    return 0;
}

static int configure(lms__hparams *hp, const void *root_, const char *src)
{
    const cJSON *root = root_;
    int rc;
    const cJSON *bi = get(root, "use_bidirectional_attention");
    if (bi && cJSON_IsTrue(bi))
        return lms__err(LMS_EUNSUPPORTED, "%s: config.json: use_bidirectional_attention=true is not supported", src);
    const cJSON *ab = get(root, "attention_bias");
    hp->qkv_bias = hp->o_bias = ab && cJSON_IsTrue(ab);
    hp->qk_norm = true;
    hp->norm_plus_one = true;
    hp->post_norms = true;
    hp->embed_scale = (float)sqrt((double)hp->n_embd);

    double qpas = 256, cap = 0;
    if ((rc = positive(root, "query_pre_attn_scalar", src, &qpas)))
        return rc;
    hp->attn_scale = (float)(1.0 / sqrt(qpas));
    if ((rc = positive(root, "attn_logit_softcapping", src, &cap))) /* checked, not applied (see above) */
        return rc;
    hp->attn_softcap = 0;
    cap = 0;
    if ((rc = positive(root, "final_logit_softcapping", src, &cap)))
        return rc;
    hp->final_softcap = (float)cap;

    uint32_t n_local;
    if ((rc = layer_kinds(hp, root, src, &n_local)))
        return rc;
    if (n_local == hp->n_layers)
        return lms__err(LMS_EUNSUPPORTED, "%s: config.json: every layer is a sliding-window layer (at least one "
                                          "full_attention layer is needed)", src);
    if (n_local) {
        const cJSON *sw = get(root, "sliding_window");
        if (!sw || !cJSON_IsNumber(sw) || sw->valuedouble < 1 || sw->valuedouble > (1 << 24) ||
            sw->valuedouble != floor(sw->valuedouble))
            return lms__err(LMS_EFORMAT, "%s: config.json: 'sliding_window' must be an integer in [1, %d]", src, 1 << 24);
        hp->window = (uint32_t)sw->valuedouble;
    } else {
        hp->window = 0;
    }
    return rope(hp, root, src);
}

static const char *const archs[] = {"Gemma3ForCausalLM", NULL};
static const char *const mm_archs[] = {"Gemma3ForConditionalGeneration", NULL};
const lms__family lms__family_gemma3 = {"gemma3", archs, "gemma3_text", configure, mm_archs, "gemma3", defaults};
