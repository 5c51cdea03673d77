/*
 * server/server.h - `lmstore serve`: an OpenAI-compatible HTTP server over
 * the schedulers of one or more models (docs/SERVER.md is the user's
 * reference: endpoints, errors, metrics).
 *
 * The CLI (tools/cmd_serve.c) opens the store and the models, makes one
 * scheduler per model (server/sched.h) and describes each model here; the
 * server answers HTTP on libmicrohttpd with one thread per connection, so a
 * handler may wait for its request's tokens. Handlers never compute: they
 * parse, tokenize, submit to the model's scheduler and turn its events into
 * OpenAI's JSON or server-sent events.
 *
 * Life: lms__server_start -> serving -> lms__server_drain (stop accepting,
 * answer 503 to new requests on open connections; the caller waits until
 * lms__server_in_flight is 0) -> lms__server_stop (waiting handlers give
 * up, their generations are cancelled).
 */
#ifndef LMS_SERVER_SERVER_H
#define LMS_SERVER_SERVER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lmstore/engine.h"
#include "lmstore/tokenizer.h"
#include "server/sched.h"

typedef struct lms__server lms__server;

typedef struct lms__server_model {
    const char *name;           /* what clients send as "model" */
    lms__sched *sched;          /* borrowed */
    lms_chat_format fmt;        /* chat format; LMS_CHAT_UNKNOWN: chat requests get 400 */
    const char *default_system; /* system message when a chat has none (the template's own), or NULL */
    const int32_t *chat_stop_ids; /* end-of-turn ids of the chat format */
    size_t n_chat_stop_ids;
    lms_gen_params defaults;    /* sampling when a request does not say (the model's generation_config) */
    int64_t created;            /* unix seconds, for /v1/models */
} lms__server_model;

typedef struct lms__server_params {
    const char *host;           /* address to bind; NULL = 127.0.0.1 */
    uint16_t port;              /* 0 = any free port (lms__server_port says which) */
    const char *api_key;        /* bearer token every request but /health needs; NULL = none */
    size_t max_body;            /* request body limit in bytes; 0 = 8 MiB */
    unsigned idle_timeout_s;    /* close a connection idle this long (a stalled client); 0 = 300 */
    unsigned max_connections;   /* 0 = 1024 */
    const lms__server_model *models; /* [n_models], borrowed; models[0] answers requests without "model" */
    size_t n_models;
} lms__server_params;

/* Whether this build has the HTTP server (libmicrohttpd was found). */
bool lms__server_available(void);

/*
 * Bind and start answering. Errors: LMS_EINVAL (host does not resolve:
 * named), LMS_EIO (the address is taken or cannot be bound: named),
 * LMS_ENOMEM, LMS_EUNSUPPORTED (built without libmicrohttpd). On failure
 * *out is NULL.
 */
int lms__server_start(const lms__server_params *p, lms__server **out);
uint16_t lms__server_port(const lms__server *s);
/*
 * Stop accepting connections; requests that arrive on connections already
 * open get 503. Running requests go on (lms__server_in_flight counts the
 * requests not yet answered to the end).
 */
void lms__server_drain(lms__server *s);
int lms__server_in_flight(lms__server *s);
/* Close every connection and free the server. NULL ok. */
void lms__server_stop(lms__server *s);

#endif
