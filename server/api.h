/*
 * server/api.h - the OpenAI and llama-server request and response shapes of
 * `lmstore serve`, apart from HTTP: parse a request body into prompt ids and
 * settings (or an error with its HTTP status), and turn scheduler events into
 * response JSON or server-sent events. Internal to server/.
 *
 * Request bodies are untrusted: every field is type-checked, and any mistake
 * becomes an lms__api_error naming the field (OpenAI's error body:
 * {"error": {"message", "type", "param", "code"}}).
 */
#ifndef LMS_SERVER_API_H
#define LMS_SERVER_API_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "server/sbuf.h"
#include "server/sched.h"
#include "server/server.h"

#define LMS__API_MAX_STOPS 16

typedef struct lms__api_error {
    int status;           /* HTTP status */
    const char *type;     /* "invalid_request_error", "authentication_error", "server_error", ... */
    const char *code;     /* NULL or a machine-readable code ("model_not_found") */
    const char *param;    /* NULL or the request field at fault */
    char message[512];
} lms__api_error;

/* Fill *e; returns false, so that parsers can `return lms__api_fail(...)`. */
bool lms__api_fail(lms__api_error *e, int status, const char *type, const char *code, const char *param,
                   const char *fmt, ...) LMS_PRINTF(6, 7);
/* The error body (JSON text, lms__free), or NULL when out of memory. */
char *lms__api_error_body(const lms__api_error *e);

/* A generation request (chat or text completion), parsed. */
typedef struct lms__gen_req {
    const lms__server_model *m;
    bool chat;
    bool stream, include_usage;
    bool logprobs;            /* report token log probabilities */
    uint32_t top_logprobs;    /* alternatives per token */
    int32_t *prompt;          /* [n_prompt] (lms__free) */
    size_t n_prompt;
    lms__sreq_params sp;      /* for lms__sched_submit */
    char *stops[LMS__API_MAX_STOPS]; /* stop strings (lms__free each) */
    size_t n_stop;
} lms__gen_req;

/*
 * Parse a POST /v1/chat/completions (chat) or /v1/completions body: the
 * model (404 when unknown), the prompt rendered with the model's chat
 * template and tokenized, the settings. false with *e on a bad request.
 */
bool lms__api_parse_gen(const lms__server_params *sp, const char *body, size_t len, bool chat, lms__gen_req *out,
                        lms__api_error *e);
void lms__api_gen_req_free(lms__gen_req *g);

/* Turns one request's scheduler events into its response. */
typedef struct lms__gen_out {
    const lms__gen_req *rq;
    lms_tokenizer *tok;
    lms_detokenizer *dt;
    lms_stop_matcher *sm;
    char id[48];
    int64_t created;
    lms__sbuf text;          /* the whole text (not streamed) */
    void *lp;                /* cJSON logprobs being collected (not streamed) */
    size_t text_offset;      /* completions' logprobs.text_offset */
    uint32_t n_gen, prompt_tokens, cached_tokens;
    const char *finish;      /* "stop" or "length" once ended without error */
    bool ended, head_sent;
    lms__api_error err;      /* err.status != 0: the generation failed */
    double t_first, t_last;  /* lms__now() of the first and last token */
} lms__gen_out;

int lms__gen_out_init(lms__gen_out *o, const lms__gen_req *rq);
void lms__gen_out_free(lms__gen_out *o);
/*
 * Take one event. With rq->stream, the server-sent events it makes are
 * appended to sse (the last one "data: [DONE]"). *cancel is set when a stop
 * string ended the output (the scheduler should stop generating). Returns
 * true when the output is complete.
 */
bool lms__gen_out_event(lms__gen_out *o, const lms__sched_event *ev, lms__sbuf *sse, bool *cancel);
/* The whole response of a request that was not streamed (lms__free), after
 * completion without error; NULL when out of memory. */
char *lms__gen_out_body(lms__gen_out *o);

/* GET /v1/models (one == NULL) or /v1/models/ONE: the body, or NULL with *e. */
char *lms__api_models(const lms__server_params *sp, const char *one, lms__api_error *e);
/* POST /tokenize and /detokenize (llama-server's shapes): the body, or NULL with *e. */
char *lms__api_tokenize(const lms__server_params *sp, const char *body, size_t len, lms__api_error *e);
char *lms__api_detokenize(const lms__server_params *sp, const char *body, size_t len, lms__api_error *e);

#endif
