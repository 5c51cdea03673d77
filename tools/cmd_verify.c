/*
 * tools/cmd_verify.c - `lmstore verify [MODEL] [--json]`: check the index and
 * recompute every blob's hash; exit status 1 on any problem.
 */
#include <stdio.h>
#include <string.h>

#include <cjson/cJSON.h>

#include "lmstore/store.h"
#include "tools/cli.h"

const char lms_cmd_verify_help[] = "check the store: index consistency and every blob's hash: verify [MODEL] [--json]";

typedef struct vctx {
    bool json;
    cJSON *problems;
} vctx;

static void on_problem(void *vc, const lms_verify_problem *p)
{
    vctx *c = vc;
    if (!c->json) {
        printf("%s: %s\n", p->kind, p->detail);
        return;
    }
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "kind", p->kind);
    if (p->model)
        cJSON_AddStringToObject(o, "model", p->model);
    if (p->item)
        cJSON_AddStringToObject(o, "item", p->item);
    if (p->segment != UINT32_MAX) {
        cJSON_AddNumberToObject(o, "segment", p->segment);
        cJSON_AddNumberToObject(o, "offset", (double)p->offset);
    }
    cJSON_AddStringToObject(o, "detail", p->detail);
    cJSON_AddItemToArray(c->problems, o);
}

int lms_cmd_verify(int argc, char **argv)
{
    const char *store_opt = NULL, *model = NULL, *threads = NULL;
    bool json = false, quick = false, quiet = false;
    for (int i = 1; i < argc;) {
        if (lms_cli_end_of_options(argv, &i))
            continue;
        if (lms_cli_opt(argc, argv, &i, "--store", &store_opt) || lms_cli_opt(argc, argv, &i, "--threads", &threads))
            continue;
        if (lms_cli_flag(argv, i, "--json")) {
            json = true;
        } else if (lms_cli_flag(argv, i, "--index-only")) {
            quick = true;
        } else if (lms_cli_flag(argv, i, "--quiet") || lms_cli_flag(argv, i, "-q")) {
            quiet = true;
        } else if (lms_cli_flag(argv, i, "--help") || lms_cli_flag(argv, i, "-h")) {
            printf("usage: lmstore verify [MODEL] [--store DIR] [--json] [--threads N] [--index-only] [--quiet]\n\n"
                   "Checks that every tensor's blob exists, reference counts equal the records\n"
                   "that hold them, blobs lie inside valid segments, side files and KV sessions\n"
                   "decode, and recomputes the XXH3-128 of every blob (of MODEL's blobs when\n"
                   "given). Each problem names the model and tensor. Exit status 1 on any problem.\n"
                   "--index-only  skip hashing the bytes\n");
            return LMS_EXIT_OK;
        } else if (lms_cli_is_option(argv[i])) {
            return lms_cli_usage("verify", "unknown option %s", argv[i]);
        } else if (!model) {
            model = argv[i];
        } else {
            return lms_cli_usage("verify", "more than one MODEL given");
        }
        i++;
    }
    lms_verify_params vp = lms_verify_default_params();
    vp.model = model;
    vp.hash = !quick;
    vp.progress = !quiet && !json;
    if (threads) {
        int64_t v;
        if (!lms_cli_parse_i64(threads, &v) || v < 0 || v > 1024)
            return lms_cli_usage("verify", "--threads wants a number from 0 to 1024");
        vp.threads = (int)v;
    }
    lms_store *s = NULL;
    int rc = lms_store_open(lms_cli_store_path(store_opt), LMS_STORE_RDONLY, NULL, &s);
    if (rc)
        return lms_cli_fail("verify", rc, "open store");
    vctx c = {json, json ? cJSON_CreateArray() : NULL};
    lms_verify_report rep;
    uint32_t format = lms_store_format(s);
    rc = lms_store_verify(s, &vp, on_problem, &c, &rep);
    if (rc) {
        cJSON_Delete(c.problems);
        int st = lms_cli_fail("verify", rc, model ? model : "verify");
        lms_store_close(s);
        return st;
    }
    lms_store_close(s);
    double gbs = rep.seconds > 0 ? (double)rep.bytes_hashed / rep.seconds / 1e9 : 0;
    if (json) {
        cJSON *o = cJSON_CreateObject();
        cJSON_AddBoolToObject(o, "ok", rep.problems == 0);
        cJSON_AddNumberToObject(o, "format", format);
        if (model)
            cJSON_AddStringToObject(o, "model", model);
        cJSON_AddNumberToObject(o, "models", (double)rep.models);
        cJSON_AddNumberToObject(o, "tensors", (double)rep.tensors);
        cJSON_AddNumberToObject(o, "blobs", (double)rep.blobs);
        cJSON_AddNumberToObject(o, "segments", (double)rep.segments);
        cJSON_AddNumberToObject(o, "bytes_hashed", (double)rep.bytes_hashed);
        cJSON_AddNumberToObject(o, "garbage_bytes", (double)rep.garbage_bytes);
        cJSON_AddNumberToObject(o, "seconds", rep.seconds);
        cJSON_AddItemToObject(o, "problems", c.problems);
        char *txt = cJSON_Print(o);
        if (txt)
            puts(txt);
        cJSON_free(txt);
        cJSON_Delete(o);
    } else {
        printf("%s: %llu models, %llu tensors, %llu blobs (%.2f GB hashed in %.2f s, %.2f GB/s), %llu segments; "
               "%llu problem%s",
               rep.problems ? "FAILED" : "ok", (unsigned long long)rep.models, (unsigned long long)rep.tensors,
               (unsigned long long)rep.blobs, (double)rep.bytes_hashed / 1e9, rep.seconds, gbs,
               (unsigned long long)rep.segments, (unsigned long long)rep.problems, rep.problems == 1 ? "" : "s");
        if (rep.garbage_bytes)
            printf("; %.2f MB reclaimable by `lmstore gc`", (double)rep.garbage_bytes / 1e6);
        printf("\n");
    }
    return rep.problems ? LMS_EXIT_FAIL : LMS_EXIT_OK;
}
