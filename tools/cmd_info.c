/*
 * tools/cmd_info.c - `lmstore info MODEL [--json]`: a summary of the model
 * (architecture, parameters, layers, heads, context, dtype, bytes; from its
 * record and its config.json), then its tensors (dtype, shape, layer,
 * segment, offset, bytes, blob hash) in storage order and its stored side
 * files.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lmstore/store.h"
#include "tools/cli.h"

const char lms_cmd_info_help[] = "show a model's summary, tensors and files: info MODEL [--json]";

typedef struct info_ctx {
    bool json;
    lms_store *st;
    cJSON *root, *tensors, *files;
} info_ctx;

/* A whole-number field of config.json (or of its text_config), else -1. */
static double cfg_num(const cJSON *cfg, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    if (!v) {
        const cJSON *tc = cJSON_GetObjectItemCaseSensitive(cfg, "text_config");
        v = tc ? cJSON_GetObjectItemCaseSensitive(tc, key) : NULL;
    }
    return cJSON_IsNumber(v) && v->valuedouble >= 0 ? v->valuedouble : -1;
}

static const char *cfg_str(const cJSON *cfg, const char *key)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(cfg, key);
    return cJSON_IsString(v) ? v->valuestring : NULL;
}

typedef struct vision_count {
    uint64_t tensors, bytes;
} vision_count;

static int count_vision(void *vctx, const lms_tensor_record *t)
{
    vision_count *v = vctx;
    if (lms_cli_vision_tensor(t->name)) {
        v->tensors++;
        v->bytes += t->nbytes;
    }
    return 0;
}

/* The summary: from the model record and config.json (when stored). */
static void summary(info_ctx *c, const lms_model_info *m)
{
    vision_count vis = {0, 0};
    if (lms_store_tensors(c->st, m->name, count_vision, &vis))
        lms_clear_error(); /* the tensor listing that follows reports it */
    void *text = NULL;
    size_t len = 0;
    cJSON *cfg = NULL;
    if (lms_store_file(c->st, m->name, "config.json", &text, &len) == 0)
        cfg = cJSON_ParseWithLength(text, len);
    lms_free(text);
    lms_clear_error();
    double layers = cfg_num(cfg, "num_hidden_layers"), heads = cfg_num(cfg, "num_attention_heads"),
           kv = cfg_num(cfg, "num_key_value_heads"), hidden = cfg_num(cfg, "hidden_size"),
           ff = cfg_num(cfg, "intermediate_size"), ctx = cfg_num(cfg, "max_position_embeddings"),
           vocab = cfg_num(cfg, "vocab_size"), hd = cfg_num(cfg, "head_dim");
    if (kv < 0)
        kv = heads;
    if (hd < 0 && heads > 0 && hidden > 0)
        hd = hidden / heads;
    const char *mtype = cfg_str(cfg, "model_type");
    const char *cdt = cfg_str(cfg, "torch_dtype") ? cfg_str(cfg, "torch_dtype") : cfg_str(cfg, "dtype");
    char dt[128] = "";
    size_t o = 0;
    for (int t = 0; t < LMS_DTYPE_COUNT_; t++)
        if (m->dtype_mask & (1u << t))
            o += (size_t)snprintf(dt + o, o < sizeof dt ? sizeof dt - o : 0, "%s%s", o ? "," : "",
                                  lms_dtype_name((lms_dtype)t));
    if (c->json) {
        cJSON *s = cJSON_AddObjectToObject(c->root, "summary");
        cJSON_AddStringToObject(s, "architecture", m->architecture);
        if (mtype)
            cJSON_AddStringToObject(s, "model_type", mtype);
        cJSON_AddNumberToObject(s, "params", (double)m->n_params);
        struct { const char *k; double v; } nums[] = {{"layers", layers}, {"heads", heads}, {"kv_heads", kv},
                                                      {"head_dim", hd}, {"hidden_size", hidden},
                                                      {"intermediate_size", ff}, {"vocab_size", vocab},
                                                      {"context", ctx}};
        for (size_t i = 0; i < sizeof nums / sizeof nums[0]; i++)
            if (cfg && nums[i].v >= 0)
                cJSON_AddNumberToObject(s, nums[i].k, nums[i].v);
        cJSON_AddStringToObject(s, "dtype", dt);
        cJSON_AddNumberToObject(s, "bytes", (double)m->tensor_bytes);
        cJSON_AddNumberToObject(s, "tensors", (double)m->n_tensors);
        cJSON_AddBoolToObject(s, "has_config", cfg != NULL);
        if (vis.tensors) {
            cJSON *v = cJSON_AddObjectToObject(s, "vision_tower");
            cJSON_AddNumberToObject(v, "tensors", (double)vis.tensors);
            cJSON_AddNumberToObject(v, "bytes", (double)vis.bytes);
            cJSON_AddBoolToObject(v, "run", false);
        }
        cJSON_Delete(cfg);
        return;
    }
    char ps[32], by[32];
    lms_cli_human_count(m->n_params, ps, sizeof ps);
    lms_cli_human_bytes((double)m->tensor_bytes, by, sizeof by);
    printf("model:         %s\n", m->name);
    printf("architecture:  %s%s%s%s\n", *m->architecture ? m->architecture : "-", mtype ? " (" : "",
           mtype ? mtype : "", mtype ? ")" : "");
    printf("parameters:    %s (%llu)\n", ps, (unsigned long long)m->n_params);
    if (cfg) {
        if (layers >= 0)
            printf("layers:        %.0f\n", layers);
        if (heads >= 0)
            printf("heads:         %.0f attention, %.0f key/value, head dim %.0f\n", heads, kv, hd);
        if (hidden >= 0)
            printf("hidden:        %.0f (MLP %.0f)\n", hidden, ff);
        if (vocab >= 0)
            printf("vocabulary:    %.0f\n", vocab);
        if (ctx >= 0)
            printf("context:       %.0f tokens (max_position_embeddings)\n", ctx);
    } else {
        printf("config:        none stored (lmstore run needs config.json)\n");
    }
    printf("dtype:         %s%s%s%s\n", dt, cdt ? " (config: " : "", cdt ? cdt : "", cdt ? ")" : "");
    printf("bytes:         %s in %llu tensors (%llu bytes)\n", by, (unsigned long long)m->n_tensors,
           (unsigned long long)m->tensor_bytes);
    if (vis.tensors) {
        char vb[32];
        lms_cli_human_bytes((double)vis.bytes, vb, sizeof vb);
        printf("vision tower:  stored, not run (%llu tensors, %s): lmstore runs the text model\n",
               (unsigned long long)vis.tensors, vb);
    }
    cJSON_Delete(cfg);
}

static void hex(const uint8_t *b, size_t n, char *out)
{
    for (size_t i = 0; i < n; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
}

static int on_model(void *vctx, const lms_model_info *m)
{
    info_ctx *c = vctx;
    char id[33];
    hex(m->id, 16, id);
    summary(c, m);
    if (!c->json) {
        printf("id:            %s\nsource:        %s\n", id, m->source);
        if (*m->st_metadata)
            printf("metadata:      %s\n", m->st_metadata);
        return 0;
    }
    cJSON_AddStringToObject(c->root, "name", m->name);
    cJSON_AddStringToObject(c->root, "architecture", m->architecture);
    cJSON_AddStringToObject(c->root, "id", id);
    cJSON_AddNumberToObject(c->root, "params", (double)m->n_params);
    cJSON_AddNumberToObject(c->root, "bytes", (double)m->tensor_bytes);
    cJSON_AddStringToObject(c->root, "source", m->source);
    cJSON *meta = *m->st_metadata ? cJSON_Parse(m->st_metadata) : NULL;
    cJSON_AddItemToObject(c->root, "safetensors_metadata", meta ? meta : cJSON_CreateNull());
    return 0;
}

static int on_tensor(void *vctx, const lms_tensor_record *t)
{
    info_ctx *c = vctx;
    char shape[256] = "", h[33];
    size_t o = 0;
    for (uint32_t i = 0; i < t->ndim; i++)
        o += (size_t)snprintf(shape + o, o < sizeof shape ? sizeof shape - o : 0, "%s%llu", i ? "," : "",
                              (unsigned long long)t->shape[i]);
    hex(t->hash, 16, h);
    if (!c->json) {
        char layer[16];
        if (t->layer < 0)
            snprintf(layer, sizeof layer, "pre");
        else if (t->layer == 2147483647)
            snprintf(layer, sizeof layer, "post");
        else
            snprintf(layer, sizeof layer, "%d", t->layer);
        char dt[32]; /* MLX_AFFINE with its bits and group size: MLX4/g64 */
        if (t->dtype == LMS_DTYPE_MLX_AFFINE)
            snprintf(dt, sizeof dt, "MLX%u/g%u", t->bits, t->group_size);
        else
            snprintf(dt, sizeof dt, "%s", lms_dtype_name(t->dtype));
        printf("  %-56s %-7s [%s] layer %s seg %u off %llu bytes %llu\n", t->name, dt, shape, layer, t->segment,
               (unsigned long long)t->offset, (unsigned long long)t->nbytes);
        return 0;
    }
    cJSON *o2 = cJSON_CreateObject();
    cJSON_AddStringToObject(o2, "name", t->name);
    cJSON_AddStringToObject(o2, "dtype", lms_dtype_name(t->dtype));
    if (t->bits) {
        cJSON_AddNumberToObject(o2, "bits", t->bits);
        cJSON_AddNumberToObject(o2, "group_size", t->group_size);
    }
    cJSON *sh = cJSON_AddArrayToObject(o2, "shape");
    for (uint32_t i = 0; i < t->ndim; i++)
        cJSON_AddItemToArray(sh, cJSON_CreateNumber((double)t->shape[i]));
    cJSON_AddNumberToObject(o2, "nbytes", (double)t->nbytes);
    cJSON_AddNumberToObject(o2, "layer", t->layer);
    cJSON_AddNumberToObject(o2, "segment", t->segment);
    cJSON_AddNumberToObject(o2, "offset", (double)t->offset);
    cJSON_AddStringToObject(o2, "hash", h);
    cJSON_AddItemToArray(c->tensors, o2);
    return 0;
}

static int on_file(void *vctx, const char *name, uint64_t size)
{
    info_ctx *c = vctx;
    if (!c->json) {
        printf("  %-40s %llu bytes\n", name, (unsigned long long)size);
        return 0;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", name);
    cJSON_AddNumberToObject(o, "size", (double)size);
    cJSON_AddItemToArray(c->files, o);
    return 0;
}

int lms_cmd_info(int argc, char **argv)
{
    const char *store_opt = NULL, *model = NULL;
    info_ctx c = {0};
    for (int i = 1; i < argc;) {
        if (lms_cli_end_of_options(argv, &i))
            continue;
        if (lms_cli_opt(argc, argv, &i, "--store", &store_opt))
            continue;
        if (lms_cli_flag(argv, i, "--json"))
            c.json = true;
        else if (lms_cli_flag(argv, i, "--help") || lms_cli_flag(argv, i, "-h")) {
            printf("usage: lmstore info MODEL [--store DIR] [--json]\n");
            return LMS_EXIT_OK;
        } else if (lms_cli_is_option(argv[i]))
            return lms_cli_usage("info", "unknown option %s", argv[i]);
        else if (model)
            return lms_cli_usage("info", "more than one MODEL given");
        else
            model = argv[i];
        i++;
    }
    if (!model)
        return lms_cli_usage("info", "missing MODEL");
    lms_store *st;
    int rc = lms_store_open(lms_cli_store_path(store_opt), LMS_STORE_RDONLY, NULL, &st);
    if (rc)
        return lms_cli_fail("info", rc, "opening the store");
    c.st = st;
    if (c.json) {
        c.root = cJSON_CreateObject();
        cJSON_AddNumberToObject(c.root, "alignment", lms_store_alignment(st));
        c.tensors = cJSON_CreateArray();
        c.files = cJSON_CreateArray();
    }
    rc = lms_store_model(st, model, on_model, &c);
    if (!rc && !c.json)
        printf("tensors (storage order):\n");
    if (!rc)
        rc = lms_store_tensors(st, model, on_tensor, &c);
    if (!rc && !c.json)
        printf("files:\n");
    if (!rc)
        rc = lms_store_files(st, model, on_file, &c);
    lms_store_close(st);
    if (rc) {
        cJSON_Delete(c.root);
        cJSON_Delete(c.tensors);
        cJSON_Delete(c.files);
        return lms_cli_fail("info", rc, NULL);
    }
    if (c.json) {
        cJSON_AddItemToObject(c.root, "tensors", c.tensors);
        cJSON_AddItemToObject(c.root, "files", c.files);
        char *s = cJSON_Print(c.root);
        printf("%s\n", s);
        cJSON_free(s);
        cJSON_Delete(c.root);
    }
    return LMS_EXIT_OK;
}
