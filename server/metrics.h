/*
 * server/metrics.h - the counters and histograms of `lmstore serve`, written
 * as Prometheus text (exposition format 0.0.4) for GET /metrics.
 *
 * Counters only grow; histograms are cumulative buckets (le="...") plus _sum
 * and _count, as Prometheus clients write them. All functions may be called
 * from any thread (one mutex; every update is a few additions).
 */
#ifndef LMS_SERVER_METRICS_H
#define LMS_SERVER_METRICS_H

#include <stddef.h>
#include <stdint.h>

#include "server/sched.h"

#define LMS__METRICS_MAX_SERIES 96 /* (endpoint, status) pairs; more fold into endpoint "other" */
#define LMS__METRICS_BUCKETS 14

typedef struct lms__histogram {
    const double *le;                      /* [LMS__METRICS_BUCKETS] upper bounds, seconds */
    uint64_t count[LMS__METRICS_BUCKETS];  /* observations <= le[i] (not cumulative here) */
    uint64_t n;
    double sum;
} lms__histogram;

typedef struct lms__metrics lms__metrics;

int lms__metrics_create(lms__metrics **out);
void lms__metrics_free(lms__metrics *m); /* NULL ok */

/* One finished HTTP request: endpoint (a path such as "/v1/completions") and status. */
void lms__metrics_request(lms__metrics *m, const char *endpoint, int status);
/* One finished generation: its token counts, time to first token and the
 * mean time per output token after the first (seconds; < 0: none). */
void lms__metrics_generation(lms__metrics *m, uint32_t prompt, uint32_t cached, uint32_t generated,
                             double ttft, double per_token);
/* Requests cancelled because the client went away. */
void lms__metrics_disconnect(lms__metrics *m);

/* The text for GET /metrics; stats of each model's scheduler (names[i]).
 * Returns a new NUL-terminated string (lms__free) or NULL (out of memory). */
char *lms__metrics_render(lms__metrics *m, const char *const *names, const lms__sched_stats *stats, size_t n);

#endif
