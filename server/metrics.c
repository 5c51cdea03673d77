/*
 * server/metrics.c - Prometheus counters and histograms of `lmstore serve`
 * (see metrics.h). Metric names follow Prometheus' conventions (base units,
 * _total for counters) and the prefix lmstore_.
 */
#include "server/metrics.h"

#include <pthread.h>
#include <stdio.h>
#include <string.h>

#include "common/common.h"
#include "server/sbuf.h"

static const double ttft_le[LMS__METRICS_BUCKETS] = {0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5,
                                                     1,     2.5,  5,     10,   30,  60,  120};
static const double tpot_le[LMS__METRICS_BUCKETS] = {0.001, 0.0025, 0.005, 0.0075, 0.01, 0.025, 0.05,
                                                     0.075, 0.1,    0.25,  0.5,    1,    2.5,   5};

typedef struct series {
    char endpoint[48];
    int status;
    uint64_t n;
} series;

struct lms__metrics {
    pthread_mutex_t mu;
    series req[LMS__METRICS_MAX_SERIES];
    size_t n_req;
    uint64_t prompt_tokens, cached_tokens, gen_tokens, generations, disconnects;
    lms__histogram ttft, tpot;
};

int lms__metrics_create(lms__metrics **out)
{
    lms__metrics *m = lms__calloc(1, sizeof *m);
    if (!m)
        return LMS_ENOMEM;
    pthread_mutex_init(&m->mu, NULL);
    m->ttft.le = ttft_le;
    m->tpot.le = tpot_le;
    *out = m;
    return 0;
}

void lms__metrics_free(lms__metrics *m)
{
    if (!m)
        return;
    pthread_mutex_destroy(&m->mu);
    lms__free(m);
}

void lms__metrics_request(lms__metrics *m, const char *endpoint, int status)
{
    pthread_mutex_lock(&m->mu);
    size_t i;
    for (i = 0; i < m->n_req; i++)
        if (m->req[i].status == status && !strcmp(m->req[i].endpoint, endpoint))
            break;
    if (i == m->n_req) {
        if (m->n_req == LMS__METRICS_MAX_SERIES) { /* fold into the last series */
            i = m->n_req - 1;
            snprintf(m->req[i].endpoint, sizeof m->req[i].endpoint, "other");
        } else {
            m->n_req++;
            snprintf(m->req[i].endpoint, sizeof m->req[i].endpoint, "%s", endpoint);
            m->req[i].status = status;
        }
    }
    m->req[i].n++;
    pthread_mutex_unlock(&m->mu);
}

static void observe(lms__histogram *h, double v)
{
    for (int i = 0; i < LMS__METRICS_BUCKETS; i++)
        if (v <= h->le[i]) {
            h->count[i]++;
            break;
        }
    h->n++;
    h->sum += v;
}

void lms__metrics_generation(lms__metrics *m, uint32_t prompt, uint32_t cached, uint32_t generated,
                             double ttft, double per_token)
{
    pthread_mutex_lock(&m->mu);
    m->generations++;
    m->prompt_tokens += prompt;
    m->cached_tokens += cached;
    m->gen_tokens += generated;
    if (ttft >= 0)
        observe(&m->ttft, ttft);
    if (per_token >= 0)
        observe(&m->tpot, per_token);
    pthread_mutex_unlock(&m->mu);
}

void lms__metrics_disconnect(lms__metrics *m)
{
    pthread_mutex_lock(&m->mu);
    m->disconnects++;
    pthread_mutex_unlock(&m->mu);
}

#define put lms__sbuf_put

static void put_histogram(lms__sbuf *b, const char *name, const char *help, const lms__histogram *h)
{
    put(b, "# HELP %s %s\n# TYPE %s histogram\n", name, help, name);
    uint64_t cum = 0;
    for (int i = 0; i < LMS__METRICS_BUCKETS; i++) {
        cum += h->count[i];
        put(b, "%s_bucket{le=\"%g\"} %llu\n", name, h->le[i], (unsigned long long)cum);
    }
    put(b, "%s_bucket{le=\"+Inf\"} %llu\n%s_sum %.6f\n%s_count %llu\n", name, (unsigned long long)h->n, name,
        h->sum, name, (unsigned long long)h->n);
}

static void put_counter(lms__sbuf *b, const char *name, const char *help, uint64_t v)
{
    put(b, "# HELP %s %s\n# TYPE %s counter\n%s %llu\n", name, help, name, name, (unsigned long long)v);
}

char *lms__metrics_render(lms__metrics *m, const char *const *names, const lms__sched_stats *st, size_t n)
{
    lms__sbuf b = {0};
    pthread_mutex_lock(&m->mu);
    put(&b, "# HELP lmstore_requests_total HTTP requests answered, by endpoint and status code\n"
            "# TYPE lmstore_requests_total counter\n");
    for (size_t i = 0; i < m->n_req; i++)
        put(&b, "lmstore_requests_total{endpoint=\"%s\",status=\"%d\"} %llu\n", m->req[i].endpoint,
            m->req[i].status, (unsigned long long)m->req[i].n);
    put_counter(&b, "lmstore_generations_total", "generations finished (streamed or not)", m->generations);
    put_counter(&b, "lmstore_prompt_tokens_total", "prompt tokens of finished generations", m->prompt_tokens);
    put_counter(&b, "lmstore_prompt_cached_tokens_total",
                "prompt tokens whose K/V came from the cache instead of being computed", m->cached_tokens);
    put_counter(&b, "lmstore_generation_tokens_total", "tokens generated", m->gen_tokens);
    put_counter(&b, "lmstore_client_disconnects_total", "generations stopped because the client went away",
                m->disconnects);
    put_histogram(&b, "lmstore_time_to_first_token_seconds", "time from a request's arrival to its first token",
                  &m->ttft);
    put_histogram(&b, "lmstore_time_per_output_token_seconds",
                  "mean time between output tokens after the first, per generation", &m->tpot);
    pthread_mutex_unlock(&m->mu);
    static const struct {
        const char *name, *type, *help;
        size_t off;
    } g[] = {
        {"lmstore_slots", "gauge", "requests the model computes at once (--parallel)",
         offsetof(lms__sched_stats, n_slots)},
        {"lmstore_requests_running", "gauge", "requests being computed", offsetof(lms__sched_stats, running)},
        {"lmstore_requests_queued", "gauge", "requests waiting for a slot", offsetof(lms__sched_stats, queued)},
        {"lmstore_kv_pages_used", "gauge", "KV cache pages held by sequences",
         offsetof(lms__sched_stats, kv_pages_used)},
        {"lmstore_kv_pages_total", "gauge", "KV cache pages in all", offsetof(lms__sched_stats, kv_pages_total)},
    };
    for (size_t j = 0; j < LMS_ARRAY_LEN(g); j++) {
        put(&b, "# HELP %s %s\n# TYPE %s %s\n", g[j].name, g[j].help, g[j].name, g[j].type);
        for (size_t i = 0; i < n; i++)
            put(&b, "%s{model=\"%s\"} %u\n", g[j].name, names[i],
                *(const uint32_t *)((const char *)&st[i] + g[j].off));
    }
    put(&b, "# HELP lmstore_prefix_cache_hits_total requests that reused cached prompt K/V, by where it was\n"
            "# TYPE lmstore_prefix_cache_hits_total counter\n");
    for (size_t i = 0; i < n; i++)
        put(&b,
            "lmstore_prefix_cache_hits_total{model=\"%s\",source=\"ram\"} %llu\n"
            "lmstore_prefix_cache_hits_total{model=\"%s\",source=\"store\"} %llu\n",
            names[i], (unsigned long long)st[i].prefix_hits_ram, names[i],
            (unsigned long long)st[i].prefix_hits_store);
    if (b.oom) {
        lms__free(b.p);
        return NULL;
    }
    return b.p;
}
