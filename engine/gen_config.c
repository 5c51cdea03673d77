/*
 * engine/gen_config.c - sampling defaults from the model's
 * generation_config.json (lms_engine_default_gen_params), read as
 * transformers' GenerationConfig reads it: sampling only when "do_sample" is
 * true, then "temperature" (default 1.0), "top_k" (default 50), "top_p"
 * (default 1.0) and "min_p" (default off); "repetition_penalty" applies to
 * greedy decoding as well. Without the file, or without do_sample, decoding
 * is greedy, as in transformers (and ollama, which takes the same file's
 * values when it imports a model).
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <string.h>

#include "engine/engine_priv.h"

/* A number field: absent leaves *v (the default); present must be a finite
 * number within [lo, hi]. */
static int num(const cJSON *root, const char *key, double lo, double hi, const char *model, double *v)
{
    const cJSON *it = cJSON_GetObjectItemCaseSensitive(root, key);
    if (!it || cJSON_IsNull(it))
        return 0;
    if (!cJSON_IsNumber(it) || !isfinite(it->valuedouble) || it->valuedouble < lo || it->valuedouble > hi)
        return lms__err(LMS_EFORMAT, "%s: generation_config.json: \"%s\" must be a number from %g to %g", model,
                        key, lo, hi);
    *v = it->valuedouble;
    return 0;
}

int lms_engine_default_gen_params(const lms_engine *eng, lms_gen_params *out)
{
    if (!out)
        return lms__err(LMS_EINVAL, "lms_engine_default_gen_params: no output");
    *out = lms_gen_default_params();
    if (!eng)
        return lms__err(LMS_EINVAL, "lms_engine_default_gen_params: no engine");
    const lms__wsrc *src = &eng->src;
    char *text = NULL;
    size_t len = 0;
    int rc = src->file(src->ctx, "generation_config.json", &text, &len);
    if (rc == LMS_ENOENT) {
        lms_clear_error();
        return 0; /* greedy */
    }
    if (rc)
        return rc;
    cJSON *root = cJSON_ParseWithLength(text, len);
    src->free_file(text);
    if (!root || !cJSON_IsObject(root)) {
        cJSON_Delete(root);
        return lms__err(LMS_EFORMAT, "%s: generation_config.json is not a JSON object", eng->name);
    }
    const cJSON *ds = cJSON_GetObjectItemCaseSensitive(root, "do_sample");
    double temp = 1.0, top_k = 50, top_p = 1.0, min_p = 0, rep = 1.0;
    if (ds && !cJSON_IsBool(ds) && !cJSON_IsNull(ds)) {
        rc = lms__err(LMS_EFORMAT, "%s: generation_config.json: \"do_sample\" must be true or false", eng->name);
        goto out;
    }
    if ((rc = num(root, "repetition_penalty", 1e-6, 1e6, eng->name, &rep)) ||
        (rc = num(root, "temperature", 0, 1e6, eng->name, &temp)) ||
        (rc = num(root, "top_k", 0, INT32_MAX, eng->name, &top_k)) ||
        (rc = num(root, "top_p", 0, 1, eng->name, &top_p)) ||
        (rc = num(root, "min_p", 0, 1, eng->name, &min_p)))
        goto out;
    out->repeat_penalty = (float)rep;
    if (cJSON_IsTrue(ds)) {
        out->temperature = (float)temp;
        out->top_k = (int32_t)top_k;
        out->top_p = (float)top_p;
        out->min_p = (float)min_p;
    }
out:
    cJSON_Delete(root);
    if (rc)
        *out = lms_gen_default_params();
    return rc;
}
