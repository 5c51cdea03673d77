/*
 * store/mlx.c - MLX quantized safetensors: find each X.weight / X.scales /
 * X.biases triple, take bits and group size from config.json
 * ("quantization", with per-layer overrides), check the shapes agree, and
 * describe the weight as MLX_AFFINE [out, in] (mlx.h).
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "quant/quant.h"
#include "store/mlx.h"

typedef struct ref {
    const char *name;
    lms__st_tensor *t;
    const char *file;
} ref;

static int cmp_ref(const void *a, const void *b) { return strcmp(((const ref *)a)->name, ((const ref *)b)->name); }

static lms__st_tensor *find(ref *v, size_t n, const char *name)
{
    ref key = {.name = name};
    ref *r = bsearch(&key, v, n, sizeof *v, cmp_ref);
    return r ? r->t : NULL;
}

/* {"group_size": g, "bits": b} -> values; false for anything else. */
static bool qparams(const cJSON *o, uint32_t *bits, uint32_t *group)
{
    const cJSON *g = cJSON_GetObjectItemCaseSensitive(o, "group_size"), *b = cJSON_GetObjectItemCaseSensitive(o, "bits");
    if (!cJSON_IsNumber(g) || !cJSON_IsNumber(b) || g->valuedouble != floor(g->valuedouble) ||
        b->valuedouble != floor(b->valuedouble) || g->valuedouble < 0 || g->valuedouble > 1024 ||
        b->valuedouble < 0 || b->valuedouble > 64)
        return false;
    *bits = (uint32_t)b->valuedouble;
    *group = (uint32_t)g->valuedouble;
    return true;
}

int lms__mlx_bind(const char *config, size_t len, const char *path, lms__st_source *src)
{
    size_t n = 0;
    for (size_t i = 0; i < src->n_shards; i++)
        n += src->shards[i]->n_tensors;
    ref *v = lms__malloc((n ? n : 1) * sizeof *v);
    cJSON *root = config ? cJSON_ParseWithLength(config, len) : NULL;
    int rc = 0;
    if (!v) {
        rc = LMS_ENOMEM;
        goto out;
    }
    size_t k = 0;
    bool any = false;
    for (size_t i = 0; i < src->n_shards; i++)
        for (size_t j = 0; j < src->shards[i]->n_tensors; j++) {
            lms__st_tensor *t = &src->shards[i]->tensors[j];
            v[k++] = (ref){t->name, t, src->shards[i]->path};
            size_t l = strlen(t->name);
            any |= l > 7 && !strcmp(t->name + l - 7, ".scales");
        }
    if (!any)
        goto out;
    qsort(v, n, sizeof *v, cmp_ref);
    const cJSON *q = root ? cJSON_GetObjectItemCaseSensitive(root, "quantization") : NULL;
    if (!q && root)
        q = cJSON_GetObjectItemCaseSensitive(root, "quantization_config");
    uint32_t gbits = 0, ggroup = 0;
    if (!cJSON_IsObject(q) || !qparams(q, &gbits, &ggroup)) {
        rc = lms__err(LMS_EFORMAT,
                      "%s: the model has quantized tensors (*.scales) but config.json has no \"quantization\" "
                      "object with integer \"group_size\" and \"bits\"",
                      path);
        goto out;
    }
    const cJSON *mode = cJSON_GetObjectItemCaseSensitive(q, "mode");
    if (mode && (!cJSON_IsString(mode) || strcmp(mode->valuestring, "affine"))) {
        rc = lms__err(LMS_EUNSUPPORTED, "%s: quantization mode '%s' is not supported (affine is)", path,
                      cJSON_IsString(mode) ? mode->valuestring : "?");
        goto out;
    }
    for (size_t i = 0; i < n && !rc; i++) {
        size_t l = strlen(v[i].name);
        if (l <= 7 || strcmp(v[i].name + l - 7, ".scales"))
            continue;
        char prefix[400], wn[420], bn[420];
        snprintf(prefix, sizeof prefix, "%.*s", (int)(l - 7), v[i].name);
        snprintf(wn, sizeof wn, "%s.weight", prefix);
        snprintf(bn, sizeof bn, "%s.biases", prefix);
        lms__st_tensor *s = v[i].t, *w = find(v, n, wn), *b = find(v, n, bn);
        if (!w || !b) {
            rc = lms__err(LMS_EFORMAT, "%s: tensor '%s' has no %s '%s' beside it", v[i].file, v[i].name,
                          w ? "biases" : "weight", w ? bn : wn);
            break;
        }
        uint32_t bits = gbits, group = ggroup;
        const cJSON *o = cJSON_GetObjectItemCaseSensitive(q, prefix);
        if (cJSON_IsFalse(o)) {
            rc = lms__err(LMS_EFORMAT, "%s: quantization marks '%s' as not quantized (false), but it has scales", path, prefix);
            break;
        }
        if (o && !qparams(o, &bits, &group)) {
            rc = lms__err(LMS_EFORMAT, "%s: quantization override for '%s' lacks integer group_size and bits", path,
                          prefix);
            break;
        }
        if (!lms__mlx_bits_ok(bits) || !lms__mlx_group_ok(group)) {
            rc = lms__err(LMS_EUNSUPPORTED, "%s: '%s': %u bits with groups of %u (bits 2, 3, 4, 5, 6, 8 and groups "
                          "32, 64, 128 are supported)", path, prefix, bits, group);
            break;
        }
        if (w->dtype != LMS_DTYPE_U32 || w->ndim < 1 || s->ndim != w->ndim || b->ndim != w->ndim ||
            s->dtype != b->dtype ||
            (s->dtype != LMS_DTYPE_F32 && s->dtype != LMS_DTYPE_F16 && s->dtype != LMS_DTYPE_BF16)) {
            rc = lms__err(LMS_EFORMAT, "%s: '%s': the weight must be U32 and its scales and biases F32, F16 or BF16 "
                          "of the same rank (weight %s, scales %s, biases %s)", v[i].file, prefix,
                          lms_dtype_name(w->dtype), lms_dtype_name(s->dtype), lms_dtype_name(b->dtype));
            break;
        }
        uint32_t nd = w->ndim;
        bool same = true;
        for (uint32_t d = 0; d + 1 < nd; d++)
            same &= s->shape[d] == w->shape[d] && b->shape[d] == w->shape[d];
        same &= b->shape[nd - 1] == s->shape[nd - 1];
        uint64_t packed = w->shape[nd - 1], in = packed * 32 / bits;
        if (!same || packed * 32 % bits || in % group || s->shape[nd - 1] != in / group) {
            rc = lms__err(LMS_EFORMAT, "%s: '%s': a weight row of %llu words at %u bits is %llu codes, but its scales "
                          "[.., %llu] in groups of %u need %llu (or the leading shapes of weight, scales and biases "
                          "differ)",
                          v[i].file, prefix, (unsigned long long)packed, bits, (unsigned long long)in,
                          (unsigned long long)s->shape[nd - 1], group, (unsigned long long)s->shape[nd - 1] * group);
            break;
        }
        w->dtype = LMS_DTYPE_MLX_AFFINE;
        w->shape[nd - 1] = in;
        w->nelem = w->nelem / packed * in;
        w->bits = bits;
        w->group = group;
        uint64_t nb;
        if (lms_dtype_nbytes(w->dtype, bits, w->shape, nd, &nb) || nb != w->nbytes) {
            rc = lms__err(LMS_EFORMAT, "%s: '%s': byte size does not match %u-bit codes", v[i].file, prefix, bits);
            break;
        }
    }
out:
    cJSON_Delete(root);
    lms__free(v);
    return rc;
}
