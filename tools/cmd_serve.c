/*
 * tools/cmd_serve.c - `lmstore serve [MODEL...]`: an OpenAI-compatible HTTP
 * server over models of the store (docs/SERVER.md). This file opens the
 * store and the models, makes one scheduler per model (server/sched.h), starts
 * the HTTP side (server/server.h) and waits for SIGTERM or SIGINT: the first
 * drains (no new requests; running ones finish, up to --drain-timeout), a
 * second stops at once. Exit status 0 after a drain.
 */
#include <errno.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"
#include "server/server.h"
#include "tools/cli.h"
#include "tools/cli_gen.h"

const char lms_cmd_serve_help[] = "serve models over HTTP (OpenAI-compatible API, metrics)";

#define MAX_MODELS 16

static void usage(FILE *f)
{
    fprintf(f,
            "usage: lmstore serve [MODEL...] [options]\n"
            "\n"
            "Answers OpenAI's API (/v1/chat/completions, /v1/completions, /v1/models, streamed\n"
            "with server-sent events or not), llama-server's /tokenize and /detokenize,\n"
            "/health and Prometheus /metrics. Without MODEL, the store's only model. The first\n"
            "MODEL answers requests that name none. SIGTERM or Ctrl-C: no new requests, the\n"
            "running ones finish, then exit 0; a second signal stops at once.\n"
            "\n"
            "  --store DIR            the store (default $LMSTORE_HOME or ~/.local/share/lmstore)\n"
            "  --host ADDR            address to listen on (default 127.0.0.1: this machine only)\n"
            "  --port N               port (default 8080; 0 = any free port, printed at start)\n"
            "  --api-key KEY          require 'Authorization: Bearer KEY' (default $LMSTORE_API_KEY;\n"
            "                         /health is open)\n"
            "  --parallel N           requests computed at once per model (default 4)\n"
            "  --max-queue N          requests waiting for a slot beyond those; more get 503\n"
            "                         (default 4 x --parallel)\n"
            "  --ctx N                context of one request in tokens (default min(model max, 4096))\n"
            "  --threads N            worker threads (default: online CPUs)\n"
            "  --device D             cpu (default), cuda or cuda:N\n"
            "  --chat-format NAME     chatml, llama3 or gemma instead of the model's template\n"
            "  --max-body BYTES       largest request body (default 8M); larger gets 413\n"
            "  --timeout S            close a connection idle for S seconds (default 300)\n"
            "  --drain-timeout S      on SIGTERM, wait at most S seconds for running requests\n"
            "                         (default 60)\n"
            "  --kv-disk-budget BYTES disk budget of the persistent prefix cache: prompts' prefixes\n"
            "                         of 256 tokens or more are saved into the store as KV sessions\n"
            "                         (prefix-*) and resumed by later requests, also after a restart;\n"
            "                         the least recently used go first (default: unlimited; 0 too)\n"
            "  --no-prefix-store      keep prefixes in memory only (the store is opened read-only)\n");
}

typedef struct serve_opts {
    const char *models[MAX_MODELS];
    size_t n_models;
    const char *store, *host, *api_key, *device, *chat_format;
    uint16_t port;
    uint32_t parallel, max_queue, ctx;
    bool max_queue_set, no_prefix_store;
    int threads;
    uint64_t max_body, kv_disk_budget;
    unsigned timeout_s;
    double drain_s;
} serve_opts;

static int bad(const char *opt, const char *v) { return lms_cli_usage("serve", "%s: '%s' is not a valid value", opt, v); }

static int parse(int argc, char **argv, serve_opts *o)
{
    memset(o, 0, sizeof *o);
    o->port = 8080;
    o->parallel = 4;
    o->drain_s = 60;
    o->api_key = getenv("LMSTORE_API_KEY");
    if (o->api_key && !*o->api_key)
        o->api_key = NULL;
    for (int i = 1; i < argc;) {
        const char *v;
        int64_t n;
        double d;
        if (lms_cli_end_of_options(argv, &i))
            continue;
        if (lms_cli_flag(argv, i, "-h") || lms_cli_flag(argv, i, "--help")) {
            usage(stdout);
            return -1;
        } else if (lms_cli_opt(argc, argv, &i, "--store", &v)) {
            o->store = v;
        } else if (lms_cli_opt(argc, argv, &i, "--host", &v)) {
            o->host = v;
        } else if (lms_cli_opt(argc, argv, &i, "--port", &v)) {
            if (!lms_cli_parse_i64(v, &n) || n < 0 || n > 65535)
                return bad("--port", v);
            o->port = (uint16_t)n;
        } else if (lms_cli_opt(argc, argv, &i, "--api-key", &v)) {
            o->api_key = *v ? v : NULL;
        } else if (lms_cli_opt(argc, argv, &i, "--parallel", &v) || lms_cli_opt(argc, argv, &i, "-np", &v)) {
            if (!lms_cli_parse_i64(v, &n) || n < 1 || n > 1024)
                return bad("--parallel", v);
            o->parallel = (uint32_t)n;
        } else if (lms_cli_opt(argc, argv, &i, "--max-queue", &v)) {
            if (!lms_cli_parse_i64(v, &n) || n < 0 || n > 1000000)
                return bad("--max-queue", v);
            o->max_queue = (uint32_t)n;
            o->max_queue_set = true;
        } else if (lms_cli_opt(argc, argv, &i, "--ctx", &v)) {
            if (!lms_cli_parse_i64(v, &n) || n < 0 || n > INT32_MAX)
                return bad("--ctx", v);
            o->ctx = (uint32_t)n;
        } else if (lms_cli_opt(argc, argv, &i, "--threads", &v)) {
            if (!lms_cli_parse_i64(v, &n) || n < 0 || n > 1024)
                return bad("--threads", v);
            o->threads = (int)n;
        } else if (lms_cli_opt(argc, argv, &i, "--device", &v)) {
            o->device = v;
        } else if (lms_cli_opt(argc, argv, &i, "--chat-format", &v)) {
            o->chat_format = v;
        } else if (lms_cli_opt(argc, argv, &i, "--max-body", &v)) {
            if (!lms_cli_parse_size(v, &o->max_body) || o->max_body == 0)
                return bad("--max-body", v);
        } else if (lms_cli_flag(argv, i, "--no-prefix-store")) {
            o->no_prefix_store = true;
            i++;
        } else if (lms_cli_opt(argc, argv, &i, "--kv-disk-budget", &v)) {
            if (!lms_cli_parse_size(v, &o->kv_disk_budget))
                return bad("--kv-disk-budget", v);
        } else if (lms_cli_opt(argc, argv, &i, "--timeout", &v)) {
            if (!lms_cli_parse_i64(v, &n) || n < 1 || n > 86400)
                return bad("--timeout", v);
            o->timeout_s = (unsigned)n;
        } else if (lms_cli_opt(argc, argv, &i, "--drain-timeout", &v)) {
            if (!lms_cli_parse_f64(v, &d) || !(d >= 0) || d > 86400)
                return bad("--drain-timeout", v);
            o->drain_s = d;
        } else if (lms_cli_is_option(argv[i])) {
            return lms_cli_usage("serve", "unknown option '%s'", argv[i]);
        } else {
            if (o->n_models == MAX_MODELS)
                return lms_cli_usage("serve", "at most %d models", MAX_MODELS);
            for (size_t k = 0; k < o->n_models; k++)
                if (!strcmp(o->models[k], argv[i]))
                    return lms_cli_usage("serve", "model '%s' is named twice", argv[i]);
            o->models[o->n_models++] = argv[i++];
        }
    }
    if (!o->max_queue_set)
        o->max_queue = 4 * o->parallel;
    return 0;
}

/* Without MODEL: the store's only model. */
typedef struct only_ctx {
    size_t n;
    char *buf;
    size_t cap;
} only_ctx;

static int count_model(void *ctx, const lms_model_info *info)
{
    only_ctx *c = ctx;
    if (c->n++ == 0)
        snprintf(c->buf, c->cap, "%s", info->name);
    return 0;
}

static int only_model(lms_store *st, const char **name, char *buf, size_t cap)
{
    only_ctx c = {0, buf, cap};
    int rc = lms_store_models(st, count_model, &c);
    if (rc)
        return lms_cli_fail("serve", rc, "listing the store's models");
    if (c.n != 1) {
        fprintf(stderr, "lmstore serve: error: %s; name the models to serve (lmstore ls lists them)\n",
                c.n ? "the store holds several models" : "the store holds no model");
        return LMS_EXIT_USAGE;
    }
    *name = buf;
    return LMS_EXIT_OK;
}

typedef struct served {
    lms_model *m;
    lms__sched *sched;
    lms_cli_model cm; /* for the chat format: tok borrowed from the scheduler */
} served;

int lms_cmd_serve(int argc, char **argv)
{
    const char *cmd = "serve";
    serve_opts o;
    int prc = parse(argc, argv, &o);
    if (prc)
        return prc < 0 ? LMS_EXIT_OK : prc;
    if (!lms__server_available()) {
        fprintf(stderr, "lmstore serve: error: this lmstore was built without libmicrohttpd "
                        "(Debian: libmicrohttpd-dev); rebuild with it to serve\n");
        return LMS_EXIT_FAIL;
    }
    /* the signals are taken by sigwait below: block them before any thread starts */
    sigset_t sigs;
    sigemptyset(&sigs);
    sigaddset(&sigs, SIGTERM);
    sigaddset(&sigs, SIGINT);
    pthread_sigmask(SIG_BLOCK, &sigs, NULL);
    signal(SIGPIPE, SIG_IGN);

    int status = LMS_EXIT_FAIL, rc;
    lms_store *st = NULL;
    lms_device *dev = NULL;
    lms__server *srv = NULL;
    served sv[MAX_MODELS];
    lms__server_model sm[MAX_MODELS];
    memset(sv, 0, sizeof sv);
    memset(sm, 0, sizeof sm);
    char only[512];
    const char *path = lms_cli_store_path(o.store);
    /* writable for the persistent prefix cache where the user may write the store;
     * else read-only, prefixes in memory only */
    bool prefix_store = !o.no_prefix_store;
    if (!prefix_store || (rc = lms_store_open(path, 0, NULL, &st))) {
        if (prefix_store) {
            fprintf(stderr, "lmstore serve: %s: opened read-only, prefixes are kept in memory only (%s)\n", path,
                    lms_last_error());
            prefix_store = false;
        }
        if ((rc = lms_store_open(path, LMS_STORE_RDONLY, NULL, &st))) {
            lms_cli_fail(cmd, rc, path);
            goto out;
        }
    }
    if (!o.n_models) {
        if ((status = only_model(st, &o.models[0], only, sizeof only)) != LMS_EXIT_OK)
            goto out;
        status = LMS_EXIT_FAIL;
        o.n_models = 1;
    }
    lms_model_params mp = lms_model_default_params();
    if (o.device && strcmp(o.device, "cpu")) {
        if ((rc = lms_device_open_name(o.device, &dev))) {
            lms_cli_fail(cmd, rc, NULL);
            goto out;
        }
        mp.device = dev;
    }
    lms_cli_gen_opts go;
    lms_cli_gen_opts_init(&go);
    go.chat_format = o.chat_format;
    for (size_t i = 0; i < o.n_models; i++) {
        served *s = &sv[i];
        if ((rc = lms_model_open(st, o.models[i], &mp, &s->m))) {
            lms_cli_fail(cmd, rc, o.models[i]);
            goto out;
        }
        lms__sched_params sp = {0};
        sp.n_slots = o.parallel;
        sp.max_queue = o.max_queue;
        sp.ep = lms_engine_default_params();
        sp.ep.threads = o.threads;
        sp.ep.n_ctx = o.ctx;
        sp.ep.device = dev;
        sp.prefix_store = prefix_store ? st : NULL;
        sp.prefix_disk_budget = o.kv_disk_budget;
        if ((rc = lms__sched_create(s->m, &sp, &s->sched))) {
            lms_cli_fail(cmd, rc, o.models[i]);
            goto out;
        }
        lms__server_model *m = &sm[i];
        m->name = o.models[i];
        m->sched = s->sched;
        m->created = (int64_t)time(NULL);
        if ((rc = lms__sched_default_gen_params(s->sched, &m->defaults))) {
            fprintf(stderr, "lmstore serve: warning: %s; sampling defaults to greedy\n", lms_last_error());
            m->defaults = lms_gen_default_params();
        }
        /* the chat format, its end-of-turn ids and the template's own system message */
        s->cm.tok = lms__sched_tokenizer(s->sched);
        s->cm.info = *lms__sched_info(s->sched);
        go.model = o.models[i];
        if (s->cm.tok && lms_cli_model_chat_init(cmd, &go, &s->cm) == LMS_EXIT_OK) {
            m->fmt = s->cm.fmt;
            m->default_system = s->cm.default_system;
            m->chat_stop_ids = s->cm.chat_stop_ids;
            m->n_chat_stop_ids = s->cm.n_chat_stop_ids;
        } else {
            if (o.chat_format)
                goto out; /* a wrong --chat-format is the user's mistake: said above */
            fprintf(stderr, "lmstore serve: warning: model '%s': chat requests will get 400 (no chat format)\n",
                    o.models[i]);
        }
    }
    lms__server_params hp = {0};
    hp.host = o.host;
    hp.port = o.port;
    hp.api_key = o.api_key;
    hp.max_body = (size_t)o.max_body;
    hp.idle_timeout_s = o.timeout_s;
    hp.models = sm;
    hp.n_models = o.n_models;
    if ((rc = lms__server_start(&hp, &srv))) {
        lms_cli_fail(cmd, rc, NULL);
        goto out;
    }
    const char *host = o.host ? o.host : "127.0.0.1";
    bool v6 = strchr(host, ':') != NULL;
    fprintf(stderr, "lmstore serve: listening on http://%s%s%s:%u (", v6 ? "[" : "", host, v6 ? "]" : "",
            (unsigned)lms__server_port(srv));
    for (size_t i = 0; i < o.n_models; i++)
        fprintf(stderr, "%s%s", i ? ", " : "", o.models[i]);
    fprintf(stderr, "; %u slots of %u tokens, %s%s)\n", o.parallel, lms__sched_info(sv[0].sched)->n_ctx,
            lms__sched_info(sv[0].sched)->device, o.api_key ? ", API key required" : "");
    fflush(stderr);

    int sig = 0;
    while (sigwait(&sigs, &sig) != 0) {
    }
    lms__server_drain(srv); /* the listening socket is closed before the line below says so */
    fprintf(stderr, "lmstore serve: %s: finishing %d running request(s), no new ones\n", strsignal(sig),
            lms__server_in_flight(srv));
    double end = lms__now() + o.drain_s;
    struct timespec tick = {0, 50 * 1000 * 1000};
    bool forced = false;
    while (lms__server_in_flight(srv) > 0) {
        if (lms__now() >= end) {
            fprintf(stderr, "lmstore serve: --drain-timeout passed: cancelling %d request(s)\n",
                    lms__server_in_flight(srv));
            break;
        }
        if (sigtimedwait(&sigs, NULL, &tick) > 0) { /* a second signal: stop now */
            forced = true;
            fprintf(stderr, "lmstore serve: stopping now\n");
            break;
        }
    }
    (void)forced;
    status = LMS_EXIT_OK;
out:
    lms__server_stop(srv);
    for (size_t i = 0; i < MAX_MODELS; i++) {
        lms__sched_free(sv[i].sched);
        free(sv[i].cm.default_system);
        lms_model_close(sv[i].m);
    }
    lms_device_close(dev);
    lms_store_close(st);
    return status;
}
