/*
 * tools/cmd_info.c - `lmstore info MODEL [--json]`: one model's tensors
 * (dtype, shape, layer, segment, offset, bytes, blob hash) in storage order
 * and its stored side files.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

#include "lmstore/store.h"
#include "tools/cli.h"

const char lms_cmd_info_help[] = "show a model's tensors and files: info MODEL [--json]";

typedef struct info_ctx {
    bool json;
    cJSON *root, *tensors, *files;
} info_ctx;

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
    if (!c->json) {
        printf("model:        %s\narchitecture: %s\nid:           %s\nparameters:   %llu\ntensors:      %llu\n"
               "tensor bytes: %llu\nsource:       %s\n",
               m->name, *m->architecture ? m->architecture : "-", id, (unsigned long long)m->n_params,
               (unsigned long long)m->n_tensors, (unsigned long long)m->tensor_bytes, m->source);
        if (*m->st_metadata)
            printf("metadata:     %s\n", m->st_metadata);
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
        if (lms_cli_opt(argc, argv, &i, "--store", &store_opt))
            continue;
        if (lms_cli_flag(argv, i, "--json"))
            c.json = true;
        else if (lms_cli_flag(argv, i, "--help") || lms_cli_flag(argv, i, "-h")) {
            printf("usage: lmstore info MODEL [--store DIR] [--json]\n");
            return LMS_EXIT_OK;
        } else if (argv[i][0] == '-' && argv[i][1])
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
