/*
 * tools/cmd_kv.c - `lmstore kv ls|info|rm`: the saved KV sessions of a store
 * (sessions are written by `lmstore run --save-session`, `chat`'s /save and
 * lms_kv_save; their pages are reclaimed by `lmstore gc` once no session
 * names them).
 */
#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "lmstore/kvcache.h"
#include "lmstore/store.h"
#include "tools/cli.h"

const char lms_cmd_kv_help[] = "saved KV sessions: kv ls [--json] | kv info NAME [--json] | kv rm NAME";

static void usage(void)
{
    printf("usage: lmstore kv ls [--store DIR] [--json]\n"
           "       lmstore kv info NAME [--store DIR] [--json]\n"
           "       lmstore kv rm NAME [--store DIR]\n");
}

static void hex16(const uint8_t *b, char out[33])
{
    for (int i = 0; i < 16; i++)
        snprintf(out + 2 * i, 3, "%02x", b[i]);
}

static void when(uint64_t t, char *out, size_t n)
{
    time_t tt = (time_t)t;
    struct tm tm;
    if (!t || !gmtime_r(&tt, &tm) || !strftime(out, n, "%Y-%m-%d %H:%M:%SZ", &tm))
        snprintf(out, n, "-");
}

static void layout_str(const lms_kv_layout *L, char *out, size_t n)
{
    const char *dt = lms_dtype_name(L->dtype);
    int o = snprintf(out, n, "%ux%ux%u %s p%u", L->n_layers, L->n_kv_heads, L->head_dim, dt ? dt : "?",
                     L->page_tokens);
    if (L->window && o > 0 && (size_t)o < n)
        snprintf(out + o, n - (size_t)o, " w%u", L->window);
}

/* Layers with a sliding window (layout.window > 0). */
static uint32_t n_sliding(const lms_kv_layout *L)
{
    uint32_t k = 0;
    for (uint32_t l = 0; L->window && l < L->n_layers; l++) k += L->sliding[l] != 0;
    return k;
}

static cJSON *info_json(const lms_kv_session_info *s)
{
    char id[33];
    cJSON *o = cJSON_CreateObject();
    cJSON_AddStringToObject(o, "name", s->name);
    cJSON_AddNumberToObject(o, "version", s->version);
    if (s->n_tokens == 0) {
        cJSON_AddStringToObject(o, "error", "record not readable by this build");
        return o;
    }
    hex16(s->model_id, id);
    cJSON_AddStringToObject(o, "model_id", id);
    cJSON *l = cJSON_AddObjectToObject(o, "layout");
    cJSON_AddNumberToObject(l, "n_layers", s->layout.n_layers);
    cJSON_AddNumberToObject(l, "n_kv_heads", s->layout.n_kv_heads);
    cJSON_AddNumberToObject(l, "head_dim", s->layout.head_dim);
    const char *dt = lms_dtype_name(s->layout.dtype);
    cJSON_AddStringToObject(l, "dtype", dt ? dt : "?");
    cJSON_AddNumberToObject(l, "page_tokens", s->layout.page_tokens);
    if (s->layout.window) {
        cJSON_AddNumberToObject(l, "window", s->layout.window);
        cJSON *sl = cJSON_AddArrayToObject(l, "sliding_layers");
        for (uint32_t i = 0; i < s->layout.n_layers; i++)
            if (s->layout.sliding[i])
                cJSON_AddItemToArray(sl, cJSON_CreateNumber(i));
    }
    cJSON_AddNumberToObject(o, "tokens", s->n_tokens);
    cJSON_AddNumberToObject(o, "pages", s->n_pages);
    if (s->layout.window)
        cJSON_AddNumberToObject(o, "window_pages", s->n_window_pages);
    cJSON_AddNumberToObject(o, "raw_bytes", (double)s->raw_bytes);
    cJSON_AddNumberToObject(o, "stored_bytes", (double)s->stored_bytes);
    cJSON_AddNumberToObject(o, "missing_pages", s->missing_pages);
    cJSON_AddNumberToObject(o, "created", (double)s->created);
    cJSON_AddNumberToObject(o, "last_used", (double)s->last_used);
    return o;
}

/* ---- ls ------------------------------------------------------------------------------ */

typedef struct ls_ctx {
    bool json;
    cJSON *arr;
    int n;
} ls_ctx;

static int ls_one(void *ctx, const lms_kv_session_info *s)
{
    ls_ctx *c = ctx;
    c->n++;
    if (c->json) {
        cJSON_AddItemToArray(c->arr, info_json(s));
        return 0;
    }
    if (s->n_tokens == 0) {
        printf("%-28s (record version %u: not readable by this build)\n", s->name, s->version);
        return 0;
    }
    char id[33], lay[64], used[32];
    hex16(s->model_id, id);
    layout_str(&s->layout, lay, sizeof lay);
    when(s->last_used, used, sizeof used);
    printf("%-28s %8u %10.2f %10.2f  %-24s %.12s  %s%s\n", s->name, s->n_tokens, (double)s->raw_bytes / 1e6,
           (double)s->stored_bytes / 1e6, lay, id, used, s->missing_pages ? "  (pages missing!)" : "");
    return 0;
}

/* ---- info ----------------------------------------------------------------------------- */

typedef struct info_ctx {
    bool json;
    cJSON *pages;
    uint32_t by_codec[3];
    uint64_t stored_by_codec[3], raw_by_codec[3];
} info_ctx;

static int info_page(void *ctx, const lms_kv_page_info *p)
{
    info_ctx *c = ctx;
    if (p->present && p->codec <= LMS_KV_CODEC_SHUFFLE_ZSTD) {
        c->by_codec[p->codec]++;
        c->stored_by_codec[p->codec] += p->stored_size;
        c->raw_by_codec[p->codec] += p->raw_size;
    }
    if (c->json) {
        char key[33];
        hex16(p->key, key);
        cJSON *o = cJSON_CreateObject();
        cJSON_AddNumberToObject(o, "index", p->index);
        if (p->window)
            cJSON_AddBoolToObject(o, "window", true);
        cJSON_AddStringToObject(o, "key", key);
        cJSON_AddBoolToObject(o, "present", p->present);
        cJSON_AddNumberToObject(o, "tokens", p->n_tokens);
        if (p->present) {
            cJSON_AddStringToObject(o, "codec", lms_kv_codec_name(p->codec) ? lms_kv_codec_name(p->codec) : "?");
            cJSON_AddNumberToObject(o, "segment", p->segment);
            cJSON_AddNumberToObject(o, "offset", (double)p->offset);
            cJSON_AddNumberToObject(o, "stored_size", (double)p->stored_size);
            cJSON_AddNumberToObject(o, "raw_size", (double)p->raw_size);
        }
        cJSON_AddItemToArray(c->pages, o);
    }
    return 0;
}

static int info_one(void *ctx, const lms_kv_session_info *s)
{
    info_ctx *c = ctx;
    if (c->json) {
        cJSON *o = info_json(s);
        cJSON_AddItemToObject(o, "page_list", c->pages);
        c->pages = NULL;
        char *txt = cJSON_Print(o);
        printf("%s\n", txt);
        cJSON_free(txt);
        cJSON_Delete(o);
        return 0;
    }
    char id[33], lay[64], created[32], used[32];
    hex16(s->model_id, id);
    layout_str(&s->layout, lay, sizeof lay);
    when(s->created, created, sizeof created);
    when(s->last_used, used, sizeof used);
    const char *dt = lms_dtype_name(s->layout.dtype);
    printf("session      %s\n", s->name);
    printf("model id     %s\n", id);
    printf("layout       %u layers, %u KV heads, head dim %u, %s, %u tokens per page (%s)\n", s->layout.n_layers,
           s->layout.n_kv_heads, s->layout.head_dim, dt ? dt : "?", s->layout.page_tokens, lay);
    if (s->layout.window)
        printf("window       %u positions on %u of %u layers: the last window's %u pages of those layers saved\n",
               s->layout.window, n_sliding(&s->layout), s->layout.n_layers, s->n_window_pages);
    printf("tokens       %u in %u pages\n", s->n_tokens, s->n_pages);
    printf("K/V bytes    %llu raw, %llu stored (%.2fx)\n", (unsigned long long)s->raw_bytes,
           (unsigned long long)s->stored_bytes, s->stored_bytes ? (double)s->raw_bytes / (double)s->stored_bytes : 0.0);
    for (int k = 0; k < 3; k++)
        if (c->by_codec[k])
            printf("  %-12s %u pages, %llu -> %llu bytes\n", lms_kv_codec_name((lms_kv_codec)k), c->by_codec[k],
                   (unsigned long long)c->raw_by_codec[k], (unsigned long long)c->stored_by_codec[k]);
    printf("created      %s\n", created);
    printf("last used    %s\n", used);
    printf("record       version %u\n", s->version);
    if (s->missing_pages)
        printf("WARNING      %u page records are missing: this session cannot be resumed\n", s->missing_pages);
    return 0;
}

int lms_cmd_kv(int argc, char **argv)
{
    const char *store_opt = NULL, *sub = NULL, *name = NULL;
    bool json = false;
    for (int i = 1; i < argc;) {
        if (lms_cli_end_of_options(argv, &i))
            continue;
        if (lms_cli_opt(argc, argv, &i, "--store", &store_opt))
            continue;
        if (lms_cli_flag(argv, i, "--json"))
            json = true;
        else if (lms_cli_flag(argv, i, "--help") || lms_cli_flag(argv, i, "-h")) {
            usage();
            return LMS_EXIT_OK;
        } else if (lms_cli_is_option(argv[i]))
            return lms_cli_usage("kv", "unknown option %s", argv[i]);
        else if (!sub)
            sub = argv[i];
        else if (!name)
            name = argv[i];
        else
            return lms_cli_usage("kv", "unexpected argument %s", argv[i]);
        i++;
    }
    if (!sub)
        return lms_cli_usage("kv", "missing subcommand (ls, info NAME, rm NAME)");
    bool is_ls = !strcmp(sub, "ls"), is_info = !strcmp(sub, "info"), is_rm = !strcmp(sub, "rm");
    if (!is_ls && !is_info && !is_rm)
        return lms_cli_usage("kv", "unknown subcommand '%s' (ls, info, rm)", sub);
    if (is_ls && name)
        return lms_cli_usage("kv", "kv ls takes no name");
    if (!is_ls && !name)
        return lms_cli_usage("kv", "kv %s needs a session NAME", sub);
    if (is_rm && json)
        return lms_cli_usage("kv", "kv rm has no --json");

    lms_store *st = NULL;
    int rc = 0;
    if (is_ls) {
        if (lms_cli_store_open_list("kv", store_opt, &st) != LMS_EXIT_OK)
            return LMS_EXIT_FAIL;
    } else if ((rc = lms_store_open(lms_cli_store_path(store_opt), is_rm ? 0 : LMS_STORE_RDONLY, NULL, &st))) {
        return lms_cli_fail("kv", rc, lms_cli_store_path(store_opt));
    }
    if (is_ls) {
        ls_ctx c = {.json = json};
        if (json)
            c.arr = cJSON_CreateArray();
        else
            printf("%-28s %8s %10s %10s  %-24s %-12s  %s\n", "NAME", "TOKENS", "RAW MB", "STORED MB", "LAYOUT",
                   "MODEL", "LAST USED");
        rc = st ? lms_kv_sessions(st, ls_one, &c) : 0;
        if (!rc && json) {
            char *txt = cJSON_Print(c.arr);
            printf("%s\n", txt);
            cJSON_free(txt);
        }
        cJSON_Delete(c.arr);
    } else if (is_info) {
        info_ctx c = {.json = json};
        if (json)
            c.pages = cJSON_CreateArray();
        rc = lms_kv_session(st, name, info_one, info_page, &c);
        cJSON_Delete(c.pages);
    } else {
        rc = lms_kv_session_rm(st, name);
        if (!rc)
            printf("removed session '%s' (its pages are freed by `lmstore gc` when no other session uses them)\n",
                   name);
    }
    lms_store_close(st);
    if (rc)
        return lms_cli_fail("kv", rc, NULL);
    return LMS_EXIT_OK;
}
