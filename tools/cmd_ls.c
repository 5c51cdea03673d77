/*
 * tools/cmd_ls.c - `lmstore ls [--json]`: the models in the store with their
 * architecture, parameter count, dtypes and tensor bytes.
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lmstore/store.h"
#include "tools/cli.h"

const char lms_cmd_ls_help[] = "list the stored models: ls [--json]";

static void dtypes_str(uint32_t mask, char *out, size_t n)
{
    size_t o = 0;
    out[0] = '\0';
    for (int t = 0; t < LMS_DTYPE_COUNT_; t++)
        if (mask & (1u << t))
            o += (size_t)snprintf(out + o, o < n ? n - o : 0, "%s%s", o ? "," : "", lms_dtype_name((lms_dtype)t));
}

static void params_str(uint64_t p, char *out, size_t n)
{
    if (p >= 1000000000ull)
        snprintf(out, n, "%.2fB", (double)p / 1e9);
    else if (p >= 1000000ull)
        snprintf(out, n, "%.1fM", (double)p / 1e6);
    else if (p >= 1000ull)
        snprintf(out, n, "%.1fK", (double)p / 1e3);
    else
        snprintf(out, n, "%llu", (unsigned long long)p);
}

typedef struct ls_ctx {
    bool json;
    cJSON *arr;
    lms_store *st;
} ls_ctx;

/* Bytes the model's distinct blobs occupy in segments (identical tensors
 * count once; blobs shared with other models count in each). */
typedef struct disk_ctx {
    struct blob { uint8_t h[16]; uint64_t n; } *v;
    size_t n, cap;
} disk_ctx;

static int on_tensor(void *vctx, const lms_tensor_record *t)
{
    disk_ctx *d = vctx;
    if (d->n == d->cap) {
        size_t cap = d->cap ? d->cap * 2 : 256;
        void *nv = realloc(d->v, cap * sizeof *d->v);
        if (!nv)
            return -2;
        d->v = nv;
        d->cap = cap;
    }
    memcpy(d->v[d->n].h, t->hash, 16);
    d->v[d->n++].n = t->nbytes;
    return 0;
}

static int cmp_blob(const void *a, const void *b) { return memcmp(a, b, 16); }

static int disk_bytes(lms_store *st, const char *model, uint64_t *out)
{
    disk_ctx d = {0};
    int rc = lms_store_tensors(st, model, on_tensor, &d);
    *out = 0;
    if (!rc && d.n) {
        qsort(d.v, d.n, sizeof *d.v, cmp_blob);
        for (size_t i = 0; i < d.n; i++)
            if (i == 0 || memcmp(d.v[i].h, d.v[i - 1].h, 16))
                *out += d.v[i].n;
    }
    free(d.v);
    return rc;
}

static int one(void *vctx, const lms_model_info *m)
{
    ls_ctx *c = vctx;
    char dt[128], ps[32], id[33];
    dtypes_str(m->dtype_mask, dt, sizeof dt);
    for (int i = 0; i < LMS_MODEL_ID_LEN; i++)
        snprintf(id + 2 * i, 3, "%02x", m->id[i]);
    uint64_t disk;
    int rc = disk_bytes(c->st, m->name, &disk);
    if (rc)
        return rc;
    if (!c->json) {
        params_str(m->n_params, ps, sizeof ps);
        printf("%-32s %-20s %8s %-10s %10.2f MB %10.2f MB  %s\n", m->name, *m->architecture ? m->architecture : "-",
               ps, dt, (double)m->tensor_bytes / 1e6, (double)disk / 1e6, id);
        return 0;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", m->name);
    cJSON_AddStringToObject(o, "architecture", m->architecture);
    cJSON_AddStringToObject(o, "id", id);
    cJSON_AddNumberToObject(o, "params", (double)m->n_params);
    cJSON_AddNumberToObject(o, "tensors", (double)m->n_tensors);
    cJSON *d = cJSON_AddArrayToObject(o, "dtypes");
    for (int t = 0; t < LMS_DTYPE_COUNT_; t++)
        if (m->dtype_mask & (1u << t))
            cJSON_AddItemToArray(d, cJSON_CreateString(lms_dtype_name((lms_dtype)t)));
    cJSON_AddNumberToObject(o, "bytes", (double)m->tensor_bytes);
    cJSON_AddNumberToObject(o, "disk_bytes", (double)disk);
    cJSON_AddNumberToObject(o, "created", (double)m->created);
    cJSON_AddStringToObject(o, "source", m->source);
    cJSON_AddItemToArray(c->arr, o);
    return 0;
}

int lms_cmd_ls(int argc, char **argv)
{
    const char *store_opt = NULL;
    ls_ctx c = {0};
    for (int i = 1; i < argc;) {
        if (lms_cli_opt(argc, argv, &i, "--store", &store_opt))
            continue;
        if (lms_cli_flag(argv, i, "--json"))
            c.json = true;
        else if (lms_cli_flag(argv, i, "--help") || lms_cli_flag(argv, i, "-h")) {
            printf("usage: lmstore ls [--store DIR] [--json]\n");
            return LMS_EXIT_OK;
        } else
            return lms_cli_usage("ls", "unexpected argument %s", argv[i]);
        i++;
    }
    lms_store *st;
    int rc = lms_store_open(lms_cli_store_path(store_opt), LMS_STORE_RDONLY, NULL, &st);
    if (rc)
        return lms_cli_fail("ls", rc, "opening the store");
    if (c.json)
        c.arr = cJSON_CreateArray();
    else
        printf("%-32s %-20s %8s %-10s %13s %13s  %s\n", "NAME", "ARCHITECTURE", "PARAMS", "DTYPES", "TENSORS",
               "ON DISK", "ID");
    c.st = st;
    rc = lms_store_models(st, one, &c);
    lms_store_close(st);
    if (rc) {
        cJSON_Delete(c.arr);
        return lms_cli_fail("ls", rc, NULL);
    }
    if (c.json) {
        char *s = cJSON_Print(c.arr);
        printf("%s\n", s);
        cJSON_free(s);
        cJSON_Delete(c.arr);
    }
    return LMS_EXIT_OK;
}
