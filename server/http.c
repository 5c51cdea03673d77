/*
 * server/http.c - the HTTP side of `lmstore serve` on libmicrohttpd (see
 * server.h): routing, bearer auth, body limits, streaming with server-sent
 * events, client disconnects, drain.
 *
 * Design notes.
 *
 * libmicrohttpd runs one thread per connection, so a handler may block: a
 * request that is not streamed waits in its handler for the scheduler's END
 * event; a streamed one returns a response whose content reader waits for
 * the next event and writes it as it comes. While either waits it wakes every
 * POLL_MS to look at its socket: a peer that closed the connection (recv
 * with MSG_PEEK sees end of file or an error) cancels the generation, which
 * frees its slot within one scheduler step. A client that stops reading a
 * stream fills its socket buffer; libmicrohttpd then times the connection
 * out (idle_timeout_s), which destroys the response and cancels it too.
 *
 * Invariants:
 *  1. Every request that reached the access handler is counted in in_flight
 *     from its first call until libmicrohttpd reports it completed
 *     (request_completed); drain waits for in_flight == 0.
 *  2. A scheduler request is released exactly once: by the handler (not
 *     streamed) or by the response's free callback (streamed).
 *  3. Every answered request is counted once in the metrics, with its status,
 *     when it completes (request_completed).
 */
#include "server/server.h"

#include <errno.h>
#include <netdb.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/socket.h>
#include <unistd.h>

#include <microhttpd.h>

#include "common/common.h"
#include "server/api.h"
#include "server/metrics.h"

#define POLL_MS 100

struct lms__server {
    lms__server_params p;
    struct MHD_Daemon *d;
    lms__metrics *metrics;
    uint16_t port;
    pthread_mutex_t mu;
    int in_flight;
    volatile int draining;     /* new requests get 503 */
    volatile int stopping;     /* waiting handlers give up */
};

typedef struct conn_req {
    lms__server *srv;
    const char *endpoint;      /* metrics label */
    int status;                /* the status queued; 0 until then */
    lms__sbuf body;
    bool too_big;
} conn_req;

/* A streamed generation: the content reader's state (owned by the response). */
typedef struct stream {
    lms__server *srv;
    lms__gen_req rq;
    lms__gen_out out;
    lms__sreq *r;
    lms__sbuf buf;             /* SSE bytes not yet handed to libmicrohttpd */
    size_t off;
    bool complete;             /* the last event is in buf */
    int fd;
    double t0;
} stream;

/* ---- helpers ----------------------------------------------------------------------------- */

static bool peer_gone(int fd)
{
    if (fd < 0)
        return false;
    char c;
    ssize_t n = recv(fd, &c, 1, MSG_PEEK | MSG_DONTWAIT);
    if (n == 0)
        return true;
    return n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR;
}

static int conn_fd(struct MHD_Connection *c)
{
    const union MHD_ConnectionInfo *ci = MHD_get_connection_info(c, MHD_CONNECTION_INFO_CONNECTION_FD);
    return ci ? ci->connect_fd : -1;
}

static enum MHD_Result respond(struct MHD_Connection *c, conn_req *q, int status, const char *ctype,
                               const char *body, size_t len, const lms__api_error *e)
{
    struct MHD_Response *r = MHD_create_response_from_buffer(len, (void *)body, MHD_RESPMEM_MUST_COPY);
    if (!r)
        return MHD_NO;
    MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, ctype);
    if (status == 401)
        MHD_add_response_header(r, MHD_HTTP_HEADER_WWW_AUTHENTICATE, "Bearer");
    if (status == 503 && e && e->code && !strcmp(e->code, "server_busy"))
        MHD_add_response_header(r, MHD_HTTP_HEADER_RETRY_AFTER, "1");
    if (status == 413 || q->srv->draining)
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONNECTION, "close");
    enum MHD_Result ret = MHD_queue_response(c, (unsigned)status, r);
    MHD_destroy_response(r);
    if (ret == MHD_YES)
        q->status = status;
    return ret;
}

static enum MHD_Result respond_json(struct MHD_Connection *c, conn_req *q, int status, char *body)
{
    if (!body)
        return MHD_NO;
    enum MHD_Result ret = respond(c, q, status, "application/json", body, strlen(body), NULL);
    lms__free(body);
    return ret;
}

static enum MHD_Result respond_error(struct MHD_Connection *c, conn_req *q, const lms__api_error *e)
{
    char *body = lms__api_error_body(e);
    if (!body)
        return MHD_NO;
    enum MHD_Result ret = respond(c, q, e->status, "application/json", body, strlen(body), e);
    lms__free(body);
    return ret;
}

static void record_generation(lms__server *s, const lms__gen_out *o, double t0)
{
    double ttft = o->t_first ? o->t_first - t0 : -1;
    double tpot = o->n_gen > 1 ? (o->t_last - o->t_first) / (o->n_gen - 1) : -1;
    lms__metrics_generation(s->metrics, o->prompt_tokens, o->cached_tokens, o->n_gen, ttft, tpot);
}

/* Submit errors as HTTP errors. */
static void submit_error(int rc, bool chat, lms__api_error *e)
{
    const char *msg = lms_last_error();
    switch (rc) {
    case LMS_EBUSY:
        lms__api_fail(e, 503, "server_error", "server_busy", NULL, "the server is busy: %s; retry later", msg);
        break;
    case LMS_ENOSPACE:
        lms__api_fail(e, 400, "invalid_request_error", "context_length_exceeded",
                      strstr(msg, "to generate") ? "max_tokens" : (chat ? "messages" : "prompt"), "%s", msg);
        break;
    case LMS_ECANCELED:
        lms__api_fail(e, 503, "server_error", "shutting_down", NULL, "%s", msg);
        break;
    case LMS_EINVAL:
        lms__api_fail(e, 400, "invalid_request_error", NULL, NULL, "%s", msg);
        break;
    default:
        lms__api_fail(e, 500, "server_error", NULL, NULL, "%s", *msg ? msg : lms_strerror(rc));
    }
}

/* ---- streamed responses ------------------------------------------------------------------ */

static ssize_t stream_read(void *cls, uint64_t pos, char *buf, size_t max)
{
    (void)pos;
    stream *st = cls;
    while (st->off == st->buf.len) {
        if (st->complete)
            return MHD_CONTENT_READER_END_OF_STREAM;
        lms__sbuf_clear(&st->buf);
        st->off = 0;
        lms__sched_event ev;
        if (!lms__sched_next(st->r, &ev, POLL_MS)) {
            if (st->srv->stopping || peer_gone(st->fd))
                return MHD_CONTENT_READER_END_WITH_ERROR;
            continue;
        }
        bool cancel = false;
        st->complete = lms__gen_out_event(&st->out, &ev, &st->buf, &cancel);
        if (cancel)
            lms__sched_cancel(st->r);
        if (st->buf.oom)
            return MHD_CONTENT_READER_END_WITH_ERROR;
    }
    size_t n = LMS_MIN(max, st->buf.len - st->off);
    memcpy(buf, st->buf.p + st->off, n);
    st->off += n;
    return (ssize_t)n;
}

static void stream_free(void *cls)
{
    stream *st = cls;
    if (!st->complete)
        lms__metrics_disconnect(st->srv->metrics);
    record_generation(st->srv, &st->out, st->t0);
    lms__sched_release(st->r);
    lms__gen_out_free(&st->out);
    lms__api_gen_req_free(&st->rq);
    lms__sbuf_free(&st->buf);
    lms__free(st);
}

/* ---- generation requests ------------------------------------------------------------------- */

static enum MHD_Result handle_generate(struct MHD_Connection *c, conn_req *q, bool chat)
{
    lms__server *s = q->srv;
    lms__api_error e = {0};
    double t0 = lms__now();
    stream *st = lms__calloc(1, sizeof *st);
    if (!st)
        return MHD_NO;
    st->srv = s;
    st->t0 = t0;
    st->fd = conn_fd(c);
    if (!lms__api_parse_gen(&s->p, q->body.p ? q->body.p : "", q->body.len, chat, &st->rq, &e)) {
        lms__free(st);
        return respond_error(c, q, &e);
    }
    int rc = lms__gen_out_init(&st->out, &st->rq);
    if (!rc)
        rc = lms__sched_submit(st->rq.m->sched, st->rq.prompt, st->rq.n_prompt, &st->rq.sp, &st->r);
    if (rc) {
        submit_error(rc, chat, &e);
        lms__gen_out_free(&st->out);
        lms__api_gen_req_free(&st->rq);
        lms__free(st);
        return respond_error(c, q, &e);
    }
    if (st->rq.stream) {
        struct MHD_Response *r = MHD_create_response_from_callback(MHD_SIZE_UNKNOWN, 16384, stream_read, st,
                                                                   stream_free);
        if (!r) {
            stream_free(st);
            return MHD_NO;
        }
        MHD_add_response_header(r, MHD_HTTP_HEADER_CONTENT_TYPE, "text/event-stream");
        MHD_add_response_header(r, MHD_HTTP_HEADER_CACHE_CONTROL, "no-cache");
        enum MHD_Result ret = MHD_queue_response(c, MHD_HTTP_OK, r);
        MHD_destroy_response(r); /* st lives until the response is done with (stream_free) */
        if (ret == MHD_YES)
            q->status = 200;
        return ret;
    }
    /* not streamed: wait here for the whole output */
    enum MHD_Result ret = MHD_NO;
    bool complete = false;
    double checked = lms__now();
    while (!complete) {
        lms__sched_event ev;
        /* the client is looked at every POLL_MS, also while tokens keep coming */
        bool got = lms__sched_next(st->r, &ev, POLL_MS);
        if (!got || lms__now() - checked >= POLL_MS * 1e-3) {
            checked = lms__now();
            if (s->stopping || peer_gone(st->fd)) {
                lms__metrics_disconnect(s->metrics);
                goto out; /* MHD_NO closes the connection */
            }
        }
        if (!got)
            continue;
        bool cancel = false;
        complete = lms__gen_out_event(&st->out, &ev, NULL, &cancel);
        if (cancel)
            lms__sched_cancel(st->r);
    }
    if (st->out.err.status) {
        ret = respond_error(c, q, &st->out.err);
    } else {
        char *body = lms__gen_out_body(&st->out);
        ret = respond_json(c, q, 200, body);
    }
out:
    record_generation(s, &st->out, t0);
    lms__sched_release(st->r);
    lms__gen_out_free(&st->out);
    lms__api_gen_req_free(&st->rq);
    lms__free(st);
    return ret;
}

/* ---- routing ---------------------------------------------------------------------------- */

enum route { R_NONE, R_HEALTH, R_METRICS, R_MODELS, R_MODEL, R_CHAT, R_COMPLETIONS, R_TOKENIZE, R_DETOKENIZE };

static const struct {
    const char *path;
    int route;
    bool post;
    const char *label;
} routes[] = {
    {"/health", R_HEALTH, false, "/health"},
    {"/v1/health", R_HEALTH, false, "/health"},
    {"/metrics", R_METRICS, false, "/metrics"},
    {"/v1/models", R_MODELS, false, "/v1/models"},
    {"/models", R_MODELS, false, "/v1/models"},
    {"/v1/chat/completions", R_CHAT, true, "/v1/chat/completions"},
    {"/chat/completions", R_CHAT, true, "/v1/chat/completions"},
    {"/v1/completions", R_COMPLETIONS, true, "/v1/completions"},
    {"/completions", R_COMPLETIONS, true, "/v1/completions"},
    {"/tokenize", R_TOKENIZE, true, "/tokenize"},
    {"/detokenize", R_DETOKENIZE, true, "/detokenize"},
};

static int find_route(const char *url, bool *post, const char **label)
{
    for (size_t i = 0; i < LMS_ARRAY_LEN(routes); i++)
        if (!strcmp(url, routes[i].path)) {
            *post = routes[i].post;
            *label = routes[i].label;
            return routes[i].route;
        }
    if (!strncmp(url, "/v1/models/", 11) && url[11]) {
        *post = false;
        *label = "/v1/models";
        return R_MODEL;
    }
    *label = "other";
    return R_NONE;
}

static bool authorized(const lms__server *s, struct MHD_Connection *c)
{
    if (!s->p.api_key)
        return true;
    const char *h = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_AUTHORIZATION);
    if (!h || strncasecmp(h, "Bearer ", 7))
        return false;
    h += 7;
    while (*h == ' ')
        h++;
    /* compare in time independent of where the first difference is */
    size_t n = strlen(s->p.api_key), m = strlen(h);
    unsigned char diff = (unsigned char)(n != m);
    for (size_t i = 0; i < n; i++)
        diff |= (unsigned char)(s->p.api_key[i] ^ (i < m ? h[i] : 0));
    return diff == 0;
}

static enum MHD_Result handle(lms__server *s, struct MHD_Connection *c, conn_req *q, const char *url,
                              const char *method)
{
    lms__api_error e = {0};
    bool post = false;
    int route = find_route(url, &post, &q->endpoint);
    if (route == R_NONE) {
        lms__api_fail(&e, 404, "invalid_request_error", "not_found", NULL, "no such endpoint: %s %.200s", method,
                      url);
        return respond_error(c, q, &e);
    }
    if (strcmp(method, post ? "POST" : "GET")) {
        lms__api_fail(&e, 405, "invalid_request_error", "method_not_allowed", NULL, "%.200s takes %s, not %s",
                      url, post ? "POST" : "GET", method);
        return respond_error(c, q, &e);
    }
    if (route != R_HEALTH && !authorized(s, c)) {
        lms__api_fail(&e, 401, "authentication_error", "invalid_api_key", NULL,
                      "a valid API key is needed: send the header 'Authorization: Bearer KEY'");
        return respond_error(c, q, &e);
    }
    if (q->too_big) {
        lms__api_fail(&e, 413, "invalid_request_error", "request_too_large", NULL,
                      "the request body is larger than the limit of %zu bytes", s->p.max_body);
        return respond_error(c, q, &e);
    }
    if (s->draining) {
        if (route == R_HEALTH)
            return respond(c, q, 503, "application/json", "{\"status\":\"shutting down\"}", 26, NULL);
        lms__api_fail(&e, 503, "server_error", "shutting_down", NULL, "the server is shutting down");
        return respond_error(c, q, &e);
    }
    const char *body = q->body.p ? q->body.p : "";
    char *out = NULL;
    switch (route) {
    case R_HEALTH:
        return respond(c, q, 200, "application/json", "{\"status\":\"ok\"}", 15, NULL);
    case R_METRICS: {
        lms__sched_stats st[16];
        const char *names[16];
        size_t n = LMS_MIN(s->p.n_models, LMS_ARRAY_LEN(st));
        for (size_t i = 0; i < n; i++) {
            lms__sched_get_stats(s->p.models[i].sched, &st[i]);
            names[i] = s->p.models[i].name;
        }
        if (!(out = lms__metrics_render(s->metrics, names, st, n)))
            return MHD_NO;
        enum MHD_Result ret = respond(c, q, 200, "text/plain; version=0.0.4; charset=utf-8", out, strlen(out), NULL);
        lms__free(out);
        return ret;
    }
    case R_MODELS:
    case R_MODEL:
        out = lms__api_models(&s->p, route == R_MODEL ? url + 11 : NULL, &e);
        break;
    case R_TOKENIZE:
        out = lms__api_tokenize(&s->p, body, q->body.len, &e);
        break;
    case R_DETOKENIZE:
        out = lms__api_detokenize(&s->p, body, q->body.len, &e);
        break;
    case R_CHAT:
    case R_COMPLETIONS:
        return handle_generate(c, q, route == R_CHAT);
    }
    return out ? respond_json(c, q, 200, out) : respond_error(c, q, &e);
}

static enum MHD_Result on_request(void *cls, struct MHD_Connection *c, const char *url, const char *method,
                                  const char *version, const char *upload_data, size_t *upload_data_size,
                                  void **con_cls)
{
    (void)version;
    lms__server *s = cls;
    conn_req *q = *con_cls;
    if (!q) { /* the headers: set up, and refuse a body announced too large before it comes */
        if (!(q = lms__calloc(1, sizeof *q)))
            return MHD_NO;
        q->srv = s;
        q->endpoint = "other";
        *con_cls = q;
        pthread_mutex_lock(&s->mu);
        s->in_flight++;
        pthread_mutex_unlock(&s->mu);
        const char *cl = MHD_lookup_connection_value(c, MHD_HEADER_KIND, MHD_HTTP_HEADER_CONTENT_LENGTH);
        if (cl && strtoull(cl, NULL, 10) > s->p.max_body) {
            /* answer now rather than read it all; the connection closes after */
            q->too_big = true;
            bool post = false;
            find_route(url, &post, &q->endpoint);
            lms__api_error e = {0};
            lms__api_fail(&e, 413, "invalid_request_error", "request_too_large", NULL,
                          "the request body (%s bytes) is larger than the limit of %zu bytes", cl, s->p.max_body);
            return respond_error(c, q, &e);
        }
        return MHD_YES;
    }
    if (*upload_data_size) {
        if (!q->too_big && q->body.len + *upload_data_size > s->p.max_body)
            q->too_big = true;
        if (q->too_big) {
            lms__sbuf_free(&q->body); /* the rest is read and dropped */
        } else {
            lms__sbuf_add(&q->body, upload_data, *upload_data_size);
            if (q->body.oom)
                return MHD_NO;
        }
        *upload_data_size = 0;
        return MHD_YES;
    }
    if (q->status) /* answered already */
        return MHD_YES;
    return handle(s, c, q, url, method);
}

static void request_completed(void *cls, struct MHD_Connection *c, void **con_cls,
                              enum MHD_RequestTerminationCode toe)
{
    (void)c;
    (void)toe;
    lms__server *s = cls;
    conn_req *q = *con_cls;
    if (!q)
        return;
    *con_cls = NULL;
    if (q->status)
        lms__metrics_request(s->metrics, q->endpoint, q->status);
    lms__sbuf_free(&q->body);
    lms__free(q);
    pthread_mutex_lock(&s->mu);
    s->in_flight--;
    pthread_mutex_unlock(&s->mu);
}

/* ---- life ---------------------------------------------------------------------------------- */

bool lms__server_available(void) { return true; }

int lms__server_start(const lms__server_params *p, lms__server **out)
{
    *out = NULL;
    if (!p->n_models)
        return lms__err(LMS_EINVAL, "serve: no model to serve");
    lms__server *s = lms__calloc(1, sizeof *s);
    if (!s)
        return LMS_ENOMEM;
    s->p = *p;
    if (!s->p.host)
        s->p.host = "127.0.0.1";
    if (!s->p.max_body)
        s->p.max_body = 8u << 20;
    if (!s->p.idle_timeout_s)
        s->p.idle_timeout_s = 300;
    if (!s->p.max_connections)
        s->p.max_connections = 1024;
    pthread_mutex_init(&s->mu, NULL);
    int rc = lms__metrics_create(&s->metrics);
    if (rc)
        goto fail;
    struct addrinfo hints, *ai = NULL;
    memset(&hints, 0, sizeof hints);
    hints.ai_family = AF_UNSPEC;
    hints.ai_socktype = SOCK_STREAM;
    hints.ai_flags = AI_PASSIVE;
    char port[16];
    snprintf(port, sizeof port, "%u", (unsigned)s->p.port);
    int gai = getaddrinfo(s->p.host, port, &hints, &ai);
    if (gai || !ai) {
        rc = lms__err(LMS_EINVAL, "serve: --host '%s': %s", s->p.host, gai ? gai_strerror(gai) : "no address");
        goto fail;
    }
    unsigned flags = MHD_USE_THREAD_PER_CONNECTION | MHD_USE_INTERNAL_POLLING_THREAD | MHD_USE_POLL | MHD_USE_ITC;
    if (ai->ai_family == AF_INET6)
        flags |= MHD_USE_IPv6;
    s->d = MHD_start_daemon(flags, 0, NULL, NULL, on_request, s, MHD_OPTION_SOCK_ADDR, ai->ai_addr,
                            MHD_OPTION_NOTIFY_COMPLETED, request_completed, s, MHD_OPTION_CONNECTION_TIMEOUT,
                            (unsigned int)s->p.idle_timeout_s, MHD_OPTION_CONNECTION_LIMIT,
                            (unsigned int)s->p.max_connections, MHD_OPTION_LISTENING_ADDRESS_REUSE,
                            (unsigned int)1, MHD_OPTION_END);
    int err = errno;
    freeaddrinfo(ai);
    if (!s->d) {
        rc = lms__err(LMS_EIO, "serve: cannot listen on %s port %u%s%s", s->p.host, (unsigned)s->p.port,
                      err ? ": " : "", err ? strerror(err) : "");
        goto fail;
    }
    const union MHD_DaemonInfo *di = MHD_get_daemon_info(s->d, MHD_DAEMON_INFO_BIND_PORT);
    s->port = di ? di->port : s->p.port;
    *out = s;
    return 0;
fail:
    lms__server_stop(s);
    return rc;
}

uint16_t lms__server_port(const lms__server *s) { return s->port; }

void lms__server_drain(lms__server *s)
{
    if (s->draining)
        return;
    s->draining = 1;
    MHD_socket fd = MHD_quiesce_daemon(s->d);
    if (fd != MHD_INVALID_SOCKET) {
        /* shutdown first: the daemon's thread may still be inside poll() on the socket, which
         * keeps it listening after close() until that poll returns, and a connection made
         * meanwhile would be accepted into its backlog; shutdown stops the listening now */
        shutdown(fd, SHUT_RDWR);
        close(fd);
    }
}

int lms__server_in_flight(lms__server *s)
{
    pthread_mutex_lock(&s->mu);
    int n = s->in_flight;
    pthread_mutex_unlock(&s->mu);
    return n;
}

void lms__server_stop(lms__server *s)
{
    if (!s)
        return;
    s->stopping = 1;
    if (s->d)
        MHD_stop_daemon(s->d);
    lms__metrics_free(s->metrics);
    pthread_mutex_destroy(&s->mu);
    lms__free(s);
}
