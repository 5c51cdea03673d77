/*
 * tools/cmd_ls.c - `lmstore ls [--json]`: the models in the store with their
 * architecture, parameter count, dtypes and sizes: the tensor bytes of the
 * model, the bytes on disk only it uses, and the bytes on disk it shares
 * with other models (blobs are deduplicated across models, so the OWN
 * column of all models plus each shared blob once is what the store holds).
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

/* One model, copied out of the callback (its strings live only there). */
typedef struct model_row {
    char *name, *arch, *source;
    uint8_t id[LMS_MODEL_ID_LEN];
    uint64_t n_params, n_tensors, tensor_bytes, created;
    uint32_t dtype_mask;
    uint64_t own, shared; /* distinct blob bytes used by this model only / also by another model */
    uint64_t vision_tensors, vision_bytes; /* a vision tower, stored but not run */
} model_row;

/* One tensor's blob: which model references it. */
typedef struct blob_ref {
    uint8_t hash[16];
    uint64_t nbytes;
    size_t model;
} blob_ref;

typedef struct ls_ctx {
    model_row *m;
    size_t n, cap;
    blob_ref *b;
    size_t nb, capb;
    size_t cur; /* model whose tensors are being read */
} ls_ctx;

/* Room for one more element in *v (n used of *cap, `size` bytes each). */
static int room(void **v, size_t n, size_t *cap, size_t size)
{
    if (n < *cap)
        return 0;
    size_t nc = *cap ? 2 * *cap : 64;
    void *nv = realloc(*v, nc * size);
    if (!nv)
        return LMS_ENOMEM;
    *v = nv;
    *cap = nc;
    return 0;
}

static int on_model(void *vctx, const lms_model_info *mi)
{
    ls_ctx *c = vctx;
    if (room((void **)&c->m, c->n, &c->cap, sizeof *c->m))
        return LMS_ENOMEM;
    model_row *r = &c->m[c->n];
    memset(r, 0, sizeof *r);
    r->name = strdup(mi->name);
    r->arch = strdup(mi->architecture);
    r->source = strdup(mi->source);
    if (!r->name || !r->arch || !r->source) {
        free(r->name);
        free(r->arch);
        free(r->source);
        return LMS_ENOMEM;
    }
    memcpy(r->id, mi->id, sizeof r->id);
    r->n_params = mi->n_params;
    r->n_tensors = mi->n_tensors;
    r->tensor_bytes = mi->tensor_bytes;
    r->created = mi->created;
    r->dtype_mask = mi->dtype_mask;
    c->n++;
    return 0;
}

static int on_tensor(void *vctx, const lms_tensor_record *t)
{
    ls_ctx *c = vctx;
    if (room((void **)&c->b, c->nb, &c->capb, sizeof *c->b))
        return LMS_ENOMEM;
    blob_ref *b = &c->b[c->nb++];
    if (lms_cli_vision_tensor(t->name)) {
        c->m[c->cur].vision_tensors++;
        c->m[c->cur].vision_bytes += t->nbytes;
    }
    memcpy(b->hash, t->hash, 16);
    b->nbytes = t->nbytes;
    b->model = c->cur;
    return 0;
}

static int cmp_ref(const void *a, const void *b)
{
    const blob_ref *x = a, *y = b;
    int r = memcmp(x->hash, y->hash, 16);
    return r ? r : (x->model > y->model) - (x->model < y->model);
}

/* Each distinct blob counts once per model that uses it: as own bytes when
 * no other model does, else as shared bytes of each of them. */
static void account(ls_ctx *c)
{
    if (c->nb)
        qsort(c->b, c->nb, sizeof *c->b, cmp_ref);
    for (size_t i = 0; i < c->nb;) {
        size_t j = i + 1, models = 1;
        for (; j < c->nb && !memcmp(c->b[j].hash, c->b[i].hash, 16); j++)
            models += c->b[j].model != c->b[j - 1].model;
        for (size_t k = i; k < j; k++) {
            if (k > i && c->b[k].model == c->b[k - 1].model)
                continue; /* the same blob twice in one model is stored once */
            model_row *r = &c->m[c->b[k].model];
            if (models == 1)
                r->own += c->b[k].nbytes;
            else
                r->shared += c->b[k].nbytes;
        }
        i = j;
    }
}

static void print_text(const ls_ctx *c)
{
    printf("%-32s %-24s %8s %-10s %10s %10s %10s  %s\n", "NAME", "ARCHITECTURE", "PARAMS", "DTYPES", "SIZE", "OWN",
           "SHARED", "ID");
    for (size_t i = 0; i < c->n; i++) {
        const model_row *r = &c->m[i];
        char dt[128], ps[32], id[33], sz[32], own[32], sh[32];
        dtypes_str(r->dtype_mask, dt, sizeof dt);
        lms_cli_human_count(r->n_params, ps, sizeof ps);
        for (int k = 0; k < LMS_MODEL_ID_LEN; k++)
            snprintf(id + 2 * k, 3, "%02x", r->id[k]);
        lms_cli_human_bytes((double)r->tensor_bytes, sz, sizeof sz);
        lms_cli_human_bytes((double)r->own, own, sizeof own);
        lms_cli_human_bytes((double)r->shared, sh, sizeof sh);
        printf("%-32s %-24s %8s %-10s %10s %10s %10s  %s%s\n", r->name, *r->arch ? r->arch : "-", ps, dt, sz, own, sh,
               id, r->vision_tensors ? "  (vision tower stored, not run: text only)" : "");
    }
}

static void print_json(const ls_ctx *c)
{
    cJSON *arr = cJSON_CreateArray();
    for (size_t i = 0; i < c->n; i++) {
        const model_row *r = &c->m[i];
        char id[33];
        for (int k = 0; k < LMS_MODEL_ID_LEN; k++)
            snprintf(id + 2 * k, 3, "%02x", r->id[k]);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddStringToObject(o, "name", r->name);
        cJSON_AddStringToObject(o, "architecture", r->arch);
        cJSON_AddStringToObject(o, "id", id);
        cJSON_AddNumberToObject(o, "params", (double)r->n_params);
        cJSON_AddNumberToObject(o, "tensors", (double)r->n_tensors);
        cJSON *d = cJSON_AddArrayToObject(o, "dtypes");
        for (int t = 0; t < LMS_DTYPE_COUNT_; t++)
            if (r->dtype_mask & (1u << t))
                cJSON_AddItemToArray(d, cJSON_CreateString(lms_dtype_name((lms_dtype)t)));
        cJSON_AddNumberToObject(o, "bytes", (double)r->tensor_bytes);
        cJSON_AddNumberToObject(o, "disk_bytes", (double)(r->own + r->shared));
        cJSON_AddNumberToObject(o, "own_bytes", (double)r->own);
        cJSON_AddNumberToObject(o, "shared_bytes", (double)r->shared);
        cJSON_AddNumberToObject(o, "created", (double)r->created);
        cJSON_AddStringToObject(o, "source", r->source);
        if (r->vision_tensors) {
            cJSON *v = cJSON_AddObjectToObject(o, "vision_tower");
            cJSON_AddNumberToObject(v, "tensors", (double)r->vision_tensors);
            cJSON_AddNumberToObject(v, "bytes", (double)r->vision_bytes);
            cJSON_AddBoolToObject(v, "run", false);
        }
        cJSON_AddItemToArray(arr, o);
    }
    char *s = cJSON_Print(arr);
    printf("%s\n", s);
    cJSON_free(s);
    cJSON_Delete(arr);
}

int lms_cmd_ls(int argc, char **argv)
{
    const char *store_opt = NULL;
    bool json = false;
    for (int i = 1; i < argc;) {
        if (lms_cli_end_of_options(argv, &i))
            continue;
        if (lms_cli_opt(argc, argv, &i, "--store", &store_opt))
            continue;
        if (lms_cli_flag(argv, i, "--json"))
            json = true;
        else if (lms_cli_flag(argv, i, "--help") || lms_cli_flag(argv, i, "-h")) {
            printf("usage: lmstore ls [--store DIR] [--json]\n\n"
                   "SIZE is the model's tensor bytes; OWN the bytes on disk no other model uses;\n"
                   "SHARED the bytes on disk it shares with other models (stored once).\n");
            return LMS_EXIT_OK;
        } else
            return lms_cli_usage("ls", "unexpected argument %s", argv[i]);
        i++;
    }
    lms_store *st;
    if (lms_cli_store_open_list("ls", store_opt, &st) != LMS_EXIT_OK)
        return LMS_EXIT_FAIL;
    ls_ctx c = {0};
    int rc = st ? lms_store_models(st, on_model, &c) : 0;
    for (c.cur = 0; !rc && c.cur < c.n; c.cur++)
        if ((rc = lms_store_tensors(st, c.m[c.cur].name, on_tensor, &c)) == LMS_ENOENT)
            rc = 0; /* removed since the listing began */
    lms_store_close(st);
    if (!rc) {
        account(&c);
        if (json)
            print_json(&c);
        else
            print_text(&c);
    }
    for (size_t i = 0; i < c.n; i++) {
        free(c.m[i].name);
        free(c.m[i].arch);
        free(c.m[i].source);
    }
    free(c.m);
    free(c.b);
    return rc ? lms_cli_fail("ls", rc, NULL) : LMS_EXIT_OK;
}
