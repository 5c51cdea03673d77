/*
 * server/api.c - OpenAI's chat and text completion shapes, llama-server's
 * /tokenize and /detokenize, and /v1/models (see api.h). JSON with cJSON.
 */
#include "server/api.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include <cjson/cJSON.h>

#include "common/common.h"

#define BAD(e, param, ...) lms__api_fail(e, 400, "invalid_request_error", NULL, param, __VA_ARGS__)

bool lms__api_fail(lms__api_error *e, int status, const char *type, const char *code, const char *param,
                   const char *fmt, ...)
{
    e->status = status;
    e->type = type;
    e->code = code;
    e->param = param;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return false;
}

/* cJSON's text as our allocation (cJSON allocates with its own hooks). */
static char *print_json(cJSON *j)
{
    char *t = j ? cJSON_PrintUnformatted(j) : NULL;
    char *r = t ? lms__strdup(t) : NULL;
    cJSON_free(t);
    return r;
}

static cJSON *error_json(const lms__api_error *e)
{
    cJSON *root = cJSON_CreateObject(), *o = cJSON_AddObjectToObject(root, "error");
    if (!o)
        goto fail;
    cJSON_AddStringToObject(o, "message", e->message);
    cJSON_AddStringToObject(o, "type", e->type ? e->type : "server_error");
    if (e->param)
        cJSON_AddStringToObject(o, "param", e->param);
    else
        cJSON_AddNullToObject(o, "param");
    if (e->code)
        cJSON_AddStringToObject(o, "code", e->code);
    else
        cJSON_AddNullToObject(o, "code");
    return root;
fail:
    cJSON_Delete(root);
    return NULL;
}

char *lms__api_error_body(const lms__api_error *e)
{
    cJSON *j = error_json(e);
    char *s = print_json(j);
    cJSON_Delete(j);
    return s;
}

/* ---- request fields ------------------------------------------------------------------- */

/* absent or JSON null */
static bool absent(const cJSON *v) { return !v || cJSON_IsNull(v); }

static bool get_bool(const cJSON *root, const char *name, bool *out, lms__api_error *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    if (absent(v))
        return true;
    if (!cJSON_IsBool(v))
        return BAD(e, name, "'%s' must be a boolean", name);
    *out = cJSON_IsTrue(v);
    return true;
}

/* A number in [lo, hi]; *set tells whether the field was there. */
static bool get_num(const cJSON *root, const char *name, double lo, double hi, double *out, bool *set,
                    lms__api_error *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, name);
    if (set)
        *set = false;
    if (absent(v))
        return true;
    if (!cJSON_IsNumber(v) || !isfinite(v->valuedouble))
        return BAD(e, name, "'%s' must be a number", name);
    if (!(v->valuedouble >= lo && v->valuedouble <= hi))
        return BAD(e, name, "'%s' is %g, outside [%g, %g]", name, v->valuedouble, lo, hi);
    *out = v->valuedouble;
    if (set)
        *set = true;
    return true;
}

static bool get_int(const cJSON *root, const char *name, double lo, double hi, int64_t *out, bool *set,
                    lms__api_error *e)
{
    double d = 0;
    bool was = false;
    if (!get_num(root, name, lo, hi, &d, &was, e))
        return false;
    if (was && d != floor(d))
        return BAD(e, name, "'%s' must be an integer", name);
    if (was)
        *out = (int64_t)d;
    if (set)
        *set = was;
    return true;
}

static const lms__server_model *find_model(const lms__server_params *sp, const cJSON *root, lms__api_error *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "model");
    if (absent(v))
        return &sp->models[0];
    if (!cJSON_IsString(v))
        return BAD(e, "model", "'model' must be a string"), NULL;
    for (size_t i = 0; i < sp->n_models; i++)
        if (!strcmp(sp->models[i].name, v->valuestring))
            return &sp->models[i];
    lms__api_fail(e, 404, "invalid_request_error", "model_not_found", "model",
                  "The model '%.200s' does not exist (this server has '%.200s'%s)", v->valuestring,
                  sp->models[0].name, sp->n_models > 1 ? " and others: GET /v1/models" : "");
    return NULL;
}

static cJSON *parse_object(const char *body, size_t len, lms__api_error *e)
{
    cJSON *root = cJSON_ParseWithLength(body, len);
    if (!root) {
        BAD(e, NULL, "the request body is not valid JSON (near byte %zu)",
            cJSON_GetErrorPtr() ? (size_t)(cJSON_GetErrorPtr() - body) : (size_t)0);
        return NULL;
    }
    if (!cJSON_IsObject(root)) {
        cJSON_Delete(root);
        BAD(e, NULL, "the request body must be a JSON object");
        return NULL;
    }
    return root;
}

static bool need_tokenizer(const lms__server_model *m, lms__api_error *e)
{
    if (lms__sched_tokenizer(m->sched))
        return true;
    return lms__api_fail(e, 400, "invalid_request_error", NULL, NULL,
                         "model '%s' has no tokenizer.json: only token ids can be sent", m->name);
}

/* "stop": a string or an array of strings (OpenAI: up to 4; here LMS__API_MAX_STOPS). */
static bool get_stops(const cJSON *root, lms__gen_req *g, lms__api_error *e)
{
    const cJSON *v = cJSON_GetObjectItemCaseSensitive(root, "stop");
    if (absent(v))
        return true;
    if (cJSON_IsString(v)) {
        if (*v->valuestring && !(g->stops[g->n_stop++] = lms__strdup(v->valuestring)))
            return lms__api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        return true;
    }
    if (!cJSON_IsArray(v))
        return BAD(e, "stop", "'stop' must be a string or an array of strings");
    if (cJSON_GetArraySize(v) > LMS__API_MAX_STOPS)
        return BAD(e, "stop", "'stop' has %d strings; at most %d", cJSON_GetArraySize(v), LMS__API_MAX_STOPS);
    const cJSON *it;
    cJSON_ArrayForEach(it, v)
    {
        if (!cJSON_IsString(it))
            return BAD(e, "stop", "'stop' must be a string or an array of strings");
        if (*it->valuestring && !(g->stops[g->n_stop++] = lms__strdup(it->valuestring)))
            return lms__api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    }
    return true;
}

/* The text of a message's content: a string, null, or an array of {"type": "text", "text": ...}. */
static bool content_text(const cJSON *c, size_t idx, lms__sbuf *out, lms__api_error *e)
{
    if (absent(c))
        return true;
    if (cJSON_IsString(c)) {
        lms__sbuf_add(out, c->valuestring, strlen(c->valuestring));
        return true;
    }
    if (!cJSON_IsArray(c))
        return BAD(e, "messages", "messages[%zu].content must be a string or an array of text parts", idx);
    const cJSON *part;
    cJSON_ArrayForEach(part, c)
    {
        const cJSON *t = cJSON_GetObjectItemCaseSensitive(part, "type");
        const cJSON *x = cJSON_GetObjectItemCaseSensitive(part, "text");
        if (!cJSON_IsObject(part) || !cJSON_IsString(t))
            return BAD(e, "messages", "messages[%zu].content: each part must be an object with a 'type'", idx);
        if (strcmp(t->valuestring, "text"))
            return BAD(e, "messages", "messages[%zu].content: parts of type '%.40s' are not supported (text only)",
                       idx, t->valuestring);
        if (!cJSON_IsString(x))
            return BAD(e, "messages", "messages[%zu].content: a text part needs a string 'text'", idx);
        lms__sbuf_add(out, x->valuestring, strlen(x->valuestring));
    }
    return true;
}

/* messages -> the chat template's text -> ids. */
static bool chat_prompt(const cJSON *root, lms__gen_req *g, lms__api_error *e)
{
    const lms__server_model *m = g->m;
    const cJSON *msgs = cJSON_GetObjectItemCaseSensitive(root, "messages");
    if (!cJSON_IsArray(msgs) || cJSON_GetArraySize(msgs) == 0)
        return BAD(e, "messages", "'messages' must be a non-empty array");
    if (m->fmt == LMS_CHAT_UNKNOWN)
        return BAD(e, "messages", "model '%s' has no chat template this server knows: use /v1/completions", m->name);
    size_t n = (size_t)cJSON_GetArraySize(msgs) + 1, k = 0;
    lms_chat_message *cm = lms__calloc(n, sizeof *cm);
    lms__sbuf *texts = lms__calloc(n, sizeof *texts);
    char *rendered = NULL;
    bool ok = false;
    if (!cm || !texts) {
        lms__api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
        goto out;
    }
    bool has_system = false;
    const cJSON *it;
    cJSON_ArrayForEach(it, msgs)
    {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
        if (cJSON_IsString(role) && !strcmp(role->valuestring, "system"))
            has_system = true;
    }
    if (!has_system && m->default_system && *m->default_system)
        cm[k++] = (lms_chat_message){"system", m->default_system};
    size_t idx = 0;
    cJSON_ArrayForEach(it, msgs)
    {
        const cJSON *role = cJSON_GetObjectItemCaseSensitive(it, "role");
        if (!cJSON_IsObject(it) || !cJSON_IsString(role)) {
            BAD(e, "messages", "messages[%zu] must be an object with a string 'role'", idx);
            goto out;
        }
        const char *r = role->valuestring;
        if (!strcmp(r, "developer")) /* OpenAI's newer name for the system role */
            r = "system";
        if (!content_text(cJSON_GetObjectItemCaseSensitive(it, "content"), idx, &texts[k], e))
            goto out;
        lms__sbuf_add(&texts[k], "", 0);
        if (texts[k].oom) {
            lms__api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
            goto out;
        }
        cm[k].role = r;
        cm[k].content = texts[k].p;
        k++;
        idx++;
    }
    bool think = true;
    const cJSON *kw = cJSON_GetObjectItemCaseSensitive(root, "chat_template_kwargs");
    if (cJSON_IsObject(kw) && !get_bool(kw, "enable_thinking", &think, e))
        goto out;
    unsigned flags = LMS_CHAT_ADD_GENERATION_PROMPT | (think ? 0 : LMS_CHAT_NO_THINKING);
    int rc = lms_chat_apply(m->fmt, cm, k, flags, &rendered);
    if (rc) {
        BAD(e, "messages", "%s", lms_last_error());
        goto out;
    }
    size_t n_ids = 0;
    rc = lms_tokenizer_encode(lms__sched_tokenizer(m->sched), rendered, strlen(rendered), LMS_TOK_PARSE_SPECIAL,
                              &g->prompt, &n_ids);
    if (rc) {
        BAD(e, "messages", "%s", lms_last_error());
        goto out;
    }
    g->n_prompt = n_ids;
    ok = true;
out:
    for (size_t i = 0; texts && i < n; i++)
        lms__sbuf_free(&texts[i]);
    lms__free(texts);
    lms__free(cm);
    lms_tokenizer_buf_free(rendered);
    return ok;
}

/* An array of token ids (each an integer in the vocabulary's range is checked by the scheduler). */
static bool ids_from_array(const cJSON *a, const char *param, int32_t **out, size_t *n, lms__api_error *e)
{
    size_t k = (size_t)cJSON_GetArraySize(a), i = 0;
    int32_t *ids = lms__malloc((k ? k : 1) * sizeof *ids);
    if (!ids)
        return lms__api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    const cJSON *it;
    cJSON_ArrayForEach(it, a)
    {
        if (!cJSON_IsNumber(it) || it->valuedouble != floor(it->valuedouble) || it->valuedouble < 0 ||
            it->valuedouble > INT32_MAX) {
            lms__free(ids);
            return BAD(e, param, "'%s'[%zu] is not a token id", param, i);
        }
        ids[i++] = (int32_t)it->valuedouble;
    }
    *out = ids;
    *n = k;
    return true;
}

/* "prompt": a string, one string in an array, token ids, or one array of token ids. */
static bool text_prompt(const cJSON *root, lms__gen_req *g, lms__api_error *e)
{
    const cJSON *p = cJSON_GetObjectItemCaseSensitive(root, "prompt");
    if (cJSON_IsArray(p) && cJSON_GetArraySize(p) == 1 &&
        (cJSON_IsString(p->child) || cJSON_IsArray(p->child)))
        p = p->child;
    else if (cJSON_IsArray(p) && cJSON_GetArraySize(p) > 0 && !cJSON_IsNumber(p->child))
        return BAD(e, "prompt", "one prompt per request ('prompt' holds %d)", cJSON_GetArraySize(p));
    if (cJSON_IsArray(p))
        return ids_from_array(p, "prompt", &g->prompt, &g->n_prompt, e);
    if (!cJSON_IsString(p))
        return BAD(e, "prompt", "'prompt' must be a string or an array of token ids");
    if (!need_tokenizer(g->m, e))
        return false;
    int rc = lms_tokenizer_encode(lms__sched_tokenizer(g->m->sched), p->valuestring, strlen(p->valuestring),
                                  LMS_TOK_ADD_SPECIAL, &g->prompt, &g->n_prompt);
    if (rc)
        return BAD(e, "prompt", "%s", lms_last_error());
    return true;
}

static uint64_t request_seed(void)
{
    static uint64_t counter;
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ((uint64_t)ts.tv_sec * 1000000007ull) ^ (uint64_t)ts.tv_nsec ^
           (__atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED) * 0x9E3779B97F4A7C15ull);
}

bool lms__api_parse_gen(const lms__server_params *sp, const char *body, size_t len, bool chat, lms__gen_req *g,
                        lms__api_error *e)
{
    memset(g, 0, sizeof *g);
    g->chat = chat;
    cJSON *root = parse_object(body, len, e);
    if (!root)
        return false;
    bool ok = false;
    if (!(g->m = find_model(sp, root, e)))
        goto out;
    lms_gen_params gp = g->m->defaults;
    gp.stop = NULL;
    gp.n_stop = 0;
    gp.max_tokens = 0;
    gp.seed = request_seed();
    int64_t iv = 1;
    double d = 0;
    bool set = false;
    if (!get_int(root, "n", 1, 1e9, &iv, NULL, e))
        goto out;
    if (iv != 1) {
        BAD(e, "n", "'n' must be 1: this server makes one choice per request");
        goto out;
    }
    if (!get_bool(root, "stream", &g->stream, e))
        goto out;
    const cJSON *so = cJSON_GetObjectItemCaseSensitive(root, "stream_options");
    if (!absent(so) && !cJSON_IsObject(so)) {
        BAD(e, "stream_options", "'stream_options' must be an object");
        goto out;
    }
    if (cJSON_IsObject(so) && !get_bool(so, "include_usage", &g->include_usage, e))
        goto out;
    /* max_completion_tokens is the newer name; either may come */
    const char *mt = "max_tokens";
    if (!absent(cJSON_GetObjectItemCaseSensitive(root, "max_completion_tokens")))
        mt = "max_completion_tokens";
    iv = 0;
    if (!get_int(root, mt, 1, INT32_MAX, &iv, &set, e))
        goto out;
    if (set)
        gp.max_tokens = (uint32_t)iv;
    if (!get_num(root, "temperature", 0, 2, &d, &set, e))
        goto out;
    if (set)
        gp.temperature = (float)d;
    if (!get_num(root, "top_p", 0, 1, &d, &set, e))
        goto out;
    if (set)
        gp.top_p = (float)d;
    if (!get_num(root, "min_p", 0, 1, &d, &set, e))
        goto out;
    if (set)
        gp.min_p = (float)d;
    if (!get_int(root, "top_k", 0, INT32_MAX, &iv, &set, e))
        goto out;
    if (set)
        gp.top_k = (int32_t)iv;
    if (!get_num(root, "repetition_penalty", 0, 1e6, &d, &set, e))
        goto out;
    if (set)
        gp.repeat_penalty = (float)d;
    /* accepted for compatibility; this server does not apply them */
    if (!get_num(root, "presence_penalty", -2, 2, &d, NULL, e) ||
        !get_num(root, "frequency_penalty", -2, 2, &d, NULL, e))
        goto out;
    const cJSON *seed = cJSON_GetObjectItemCaseSensitive(root, "seed");
    if (!absent(seed)) {
        if (!cJSON_IsNumber(seed) || seed->valuedouble != floor(seed->valuedouble) || !isfinite(seed->valuedouble)) {
            BAD(e, "seed", "'seed' must be an integer");
            goto out;
        }
        gp.seed = (uint64_t)(int64_t)seed->valuedouble;
    }
    if (!get_bool(root, "ignore_eos", &gp.ignore_eos, e) || !get_stops(root, g, e))
        goto out;
    if (chat) {
        if (!get_bool(root, "logprobs", &g->logprobs, e))
            goto out;
        iv = 0;
        if (!get_int(root, "top_logprobs", 0, LMS__SCHED_MAX_TOP, &iv, &set, e))
            goto out;
        if (set && iv > 0 && !g->logprobs) {
            BAD(e, "top_logprobs", "'top_logprobs' needs 'logprobs': true");
            goto out;
        }
        g->top_logprobs = (uint32_t)iv;
        const cJSON *tools = cJSON_GetObjectItemCaseSensitive(root, "tools");
        if (cJSON_IsArray(tools) && cJSON_GetArraySize(tools) > 0) {
            BAD(e, "tools", "tools are not supported by this server");
            goto out;
        }
        if (!need_tokenizer(g->m, e) || !chat_prompt(root, g, e))
            goto out;
    } else {
        iv = 0;
        if (!get_int(root, "logprobs", 0, 5, &iv, &set, e))
            goto out;
        g->logprobs = set;
        g->top_logprobs = (uint32_t)iv;
        bool echo = false;
        if (!get_bool(root, "echo", &echo, e))
            goto out;
        if (echo) {
            BAD(e, "echo", "'echo' is not supported by this server");
            goto out;
        }
        const cJSON *suffix = cJSON_GetObjectItemCaseSensitive(root, "suffix");
        if (!absent(suffix)) {
            BAD(e, "suffix", "'suffix' is not supported by this server");
            goto out;
        }
        if (!text_prompt(root, g, e))
            goto out;
    }
    if (g->n_stop && !lms__sched_tokenizer(g->m->sched)) {
        BAD(e, "stop", "model '%s' has no tokenizer.json: stop strings need one", g->m->name);
        goto out;
    }
    g->sp.gp = gp;
    g->sp.logprobs = g->logprobs;
    g->sp.top_logprobs = g->top_logprobs;
    if (chat) {
        g->sp.stop_ids = g->m->chat_stop_ids;
        g->sp.n_stop_ids = g->m->n_chat_stop_ids;
    }
    ok = true;
out:
    cJSON_Delete(root);
    if (!ok)
        lms__api_gen_req_free(g);
    return ok;
}

void lms__api_gen_req_free(lms__gen_req *g)
{
    if (g->prompt)
        lms_tokenizer_buf_free(g->prompt); /* encode's array, or ours: the same allocator */
    for (size_t i = 0; i < g->n_stop; i++)
        lms__free(g->stops[i]);
    memset(g, 0, sizeof *g);
}

/* ---- responses ---------------------------------------------------------------------- */

int lms__gen_out_init(lms__gen_out *o, const lms__gen_req *rq)
{
    memset(o, 0, sizeof *o);
    o->rq = rq;
    o->tok = lms__sched_tokenizer(rq->m->sched);
    o->created = (int64_t)time(NULL);
    static uint64_t counter;
    snprintf(o->id, sizeof o->id, "%s-%llx%04llx", rq->chat ? "chatcmpl" : "cmpl", (unsigned long long)o->created,
             (unsigned long long)(__atomic_add_fetch(&counter, 1, __ATOMIC_RELAXED) & 0xffff));
    int rc = 0;
    if (o->tok && ((rc = lms_detokenizer_create(o->tok, true, &o->dt)) ||
                   (rc = lms_stop_matcher_create((const char *const *)rq->stops, rq->n_stop, &o->sm))))
        return rc;
    return 0;
}

void lms__gen_out_free(lms__gen_out *o)
{
    lms_detokenizer_free(o->dt);
    lms_stop_matcher_free(o->sm);
    lms__sbuf_free(&o->text);
    cJSON_Delete(o->lp);
    memset(o, 0, sizeof *o);
}

/* A token's own text (special tokens included), for logprobs. */
static cJSON *token_string(lms_tokenizer *tok, int32_t id, cJSON **bytes)
{
    char *t = NULL;
    size_t n = 0;
    if (!tok || lms_tokenizer_decode(tok, &id, 1, false, &t, &n)) {
        lms_clear_error();
        t = NULL;
        n = 0;
    }
    cJSON *s = cJSON_CreateString(t ? t : "");
    if (bytes) {
        *bytes = cJSON_CreateArray();
        for (size_t i = 0; *bytes && i < n; i++)
            cJSON_AddItemToArray(*bytes, cJSON_CreateNumber((unsigned char)t[i]));
    }
    lms_tokenizer_buf_free(t);
    return s;
}

/* Chat: {"token", "logprob", "bytes", "top_logprobs": [{"token", "logprob", "bytes"}]} */
static cJSON *chat_lp_entry(const lms__gen_out *o, const lms__sched_event *ev)
{
    cJSON *e = cJSON_CreateObject(), *b = NULL;
    cJSON_AddItemToObject(e, "token", token_string(o->tok, ev->token, &b));
    cJSON_AddNumberToObject(e, "logprob", ev->logprob);
    cJSON_AddItemToObject(e, "bytes", b);
    cJSON *top = cJSON_AddArrayToObject(e, "top_logprobs");
    for (uint32_t i = 0; top && i < ev->n_top; i++) {
        cJSON *t = cJSON_CreateObject(), *tb = NULL;
        cJSON_AddItemToObject(t, "token", token_string(o->tok, ev->top_ids[i], &tb));
        cJSON_AddNumberToObject(t, "logprob", ev->top_lp[i]);
        cJSON_AddItemToObject(t, "bytes", tb);
        cJSON_AddItemToArray(top, t);
    }
    return e;
}

/* Completions: {"tokens": [], "token_logprobs": [], "top_logprobs": [{tok: lp}], "text_offset": []} */
static cJSON *text_lp_new(void)
{
    cJSON *lp = cJSON_CreateObject();
    cJSON_AddArrayToObject(lp, "tokens");
    cJSON_AddArrayToObject(lp, "token_logprobs");
    cJSON_AddArrayToObject(lp, "top_logprobs");
    cJSON_AddArrayToObject(lp, "text_offset");
    return lp;
}

static void text_lp_add(const lms__gen_out *o, cJSON *lp, const lms__sched_event *ev, size_t offset)
{
    cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "tokens"), token_string(o->tok, ev->token, NULL));
    cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "token_logprobs"), cJSON_CreateNumber(ev->logprob));
    cJSON *top = cJSON_CreateObject();
    for (uint32_t i = 0; i < ev->n_top; i++) {
        cJSON *k = token_string(o->tok, ev->top_ids[i], NULL);
        if (k && !cJSON_GetObjectItemCaseSensitive(top, k->valuestring))
            cJSON_AddNumberToObject(top, k->valuestring, ev->top_lp[i]);
        cJSON_Delete(k);
    }
    cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "top_logprobs"), top);
    cJSON_AddItemToArray(cJSON_GetObjectItem(lp, "text_offset"), cJSON_CreateNumber((double)offset));
}

static cJSON *usage_json(const lms__gen_out *o)
{
    cJSON *u = cJSON_CreateObject();
    cJSON_AddNumberToObject(u, "prompt_tokens", o->prompt_tokens);
    cJSON_AddNumberToObject(u, "completion_tokens", o->n_gen);
    cJSON_AddNumberToObject(u, "total_tokens", (double)o->prompt_tokens + o->n_gen);
    cJSON *d = cJSON_AddObjectToObject(u, "prompt_tokens_details");
    cJSON_AddNumberToObject(d, "cached_tokens", o->cached_tokens);
    return u;
}

/* The envelope shared by every response and chunk. */
static cJSON *envelope(const lms__gen_out *o, bool chunk)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", o->id);
    cJSON_AddStringToObject(j, "object", o->rq->chat ? (chunk ? "chat.completion.chunk" : "chat.completion")
                                                     : "text_completion");
    cJSON_AddNumberToObject(j, "created", (double)o->created);
    cJSON_AddStringToObject(j, "model", o->rq->m->name);
    cJSON_AddNullToObject(j, "system_fingerprint");
    return j;
}

static void sse(lms__sbuf *out, cJSON *j)
{
    char *t = j ? cJSON_PrintUnformatted(j) : NULL;
    if (!t) {
        out->oom = true;
    } else {
        lms__sbuf_put(out, "data: %s\n\n", t);
        cJSON_free(t);
    }
    cJSON_Delete(j);
}

/* One streamed chunk: text (may be empty), a logprobs entry (or NULL), a finish reason (or NULL). */
static void chunk(lms__gen_out *o, lms__sbuf *out, const char *text, size_t len, cJSON *lp, const char *finish)
{
    cJSON *j = envelope(o, true);
    cJSON *choices = cJSON_AddArrayToObject(j, "choices"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", 0);
    char *t = lms__strndup(text ? text : "", len);
    if (o->rq->chat) {
        cJSON *delta = cJSON_AddObjectToObject(c, "delta");
        if (!o->head_sent)
            cJSON_AddStringToObject(delta, "role", "assistant");
        if (len || !o->head_sent)
            cJSON_AddStringToObject(delta, "content", t ? t : "");
        if (lp) {
            cJSON *l = cJSON_AddObjectToObject(c, "logprobs");
            cJSON *content = cJSON_AddArrayToObject(l, "content");
            cJSON_AddItemToArray(content, lp);
        } else {
            cJSON_AddNullToObject(c, "logprobs");
        }
    } else {
        cJSON_AddStringToObject(c, "text", t ? t : "");
        if (lp)
            cJSON_AddItemToObject(c, "logprobs", lp);
        else
            cJSON_AddNullToObject(c, "logprobs");
    }
    lms__free(t);
    o->head_sent = true;
    if (finish)
        cJSON_AddStringToObject(c, "finish_reason", finish);
    else
        cJSON_AddNullToObject(c, "finish_reason");
    if (o->rq->include_usage)
        cJSON_AddNullToObject(j, "usage");
    sse(out, j);
}

/* The end of a stream: the finish chunk, the usage chunk, [DONE]. */
static void stream_end(lms__gen_out *o, lms__sbuf *out)
{
    if (o->err.status) {
        cJSON *j = error_json(&o->err);
        sse(out, j);
    } else {
        chunk(o, out, NULL, 0, NULL, o->finish);
        if (o->rq->include_usage) {
            cJSON *j = envelope(o, true);
            cJSON_AddArrayToObject(j, "choices");
            cJSON_AddItemToObject(j, "usage", usage_json(o));
            sse(out, j);
        }
    }
    lms__sbuf_put(out, "data: [DONE]\n\n");
}

/* Text that is final now: streamed, or kept for the whole response. */
static void emit(lms__gen_out *o, lms__sbuf *out, const char *text, size_t len, cJSON *lp)
{
    if (o->rq->stream) {
        if (len || lp)
            chunk(o, out, text, len, lp, NULL);
        return;
    }
    if (lp) {
        if (!o->lp)
            o->lp = cJSON_CreateArray();
        cJSON_AddItemToArray(o->lp, lp);
    }
    lms__sbuf_add(&o->text, text ? text : "", len);
}

bool lms__gen_out_event(lms__gen_out *o, const lms__sched_event *ev, lms__sbuf *out, bool *cancel)
{
    *cancel = false;
    if (o->ended)
        return true;
    o->prompt_tokens = ev->prompt_tokens;
    o->cached_tokens = ev->cached_tokens;
    if (ev->kind == LMS__SEV_TOKEN) {
        o->n_gen++;
        if (!o->t_first)
            o->t_first = ev->t;
        o->t_last = ev->t;
        const char *txt = NULL, *vis = NULL;
        size_t tl = 0, vl = 0;
        bool stopped = false;
        if (o->dt && (lms_detokenizer_push(o->dt, ev->token, &txt, &tl) ||
                      lms_stop_matcher_push(o->sm, txt, tl, &vis, &vl, &stopped, NULL))) {
            lms__api_fail(&o->err, 500, "server_error", NULL, NULL, "%s", lms_last_error());
            goto end;
        }
        cJSON *lp = NULL;
        if (o->rq->logprobs) {
            if (o->rq->chat) {
                lp = chat_lp_entry(o, ev);
            } else {
                lp = o->rq->stream ? text_lp_new() : NULL;
                if (!o->rq->stream && !o->lp)
                    o->lp = text_lp_new();
                text_lp_add(o, lp ? lp : o->lp, ev, o->text_offset);
            }
        }
        o->text_offset += vl;
        emit(o, out, vis, vl, lp);
        if (stopped) {
            o->finish = "stop";
            *cancel = true;
            goto end;
        }
        return false;
    }
    switch (ev->stop) {
    case LMS__SCHED_STOP_EOS: o->finish = "stop"; break;
    case LMS__SCHED_STOP_LENGTH:
    case LMS__SCHED_STOP_CTX: o->finish = "length"; break;
    case LMS__SCHED_STOP_ERROR:
        lms__api_fail(&o->err, 500, "server_error", NULL, NULL, "generation failed: %s",
                      ev->message && *ev->message ? ev->message : lms_strerror(ev->error));
        goto end;
    default:
        lms__api_fail(&o->err, 503, "server_error", "cancelled", NULL, "the request was cancelled: the server is "
                      "shutting down");
        goto end;
    }
    if (o->dt) { /* text held back: incomplete UTF-8, a partial stop string that never completed */
        const char *txt = NULL, *vis = NULL;
        size_t tl = 0, vl = 0;
        bool stopped = false;
        if (lms_detokenizer_flush(o->dt, &txt, &tl) ||
            lms_stop_matcher_push(o->sm, txt, tl, &vis, &vl, &stopped, NULL)) {
            lms__api_fail(&o->err, 500, "server_error", NULL, NULL, "%s", lms_last_error());
            goto end;
        }
        emit(o, out, vis, vl, NULL);
        if (stopped) {
            o->finish = "stop";
        } else {
            if (lms_stop_matcher_flush(o->sm, &vis, &vl)) {
                lms__api_fail(&o->err, 500, "server_error", NULL, NULL, "%s", lms_last_error());
                goto end;
            }
            emit(o, out, vis, vl, NULL);
        }
    }
end:
    o->ended = true;
    if (o->rq->stream)
        stream_end(o, out);
    return true;
}

char *lms__gen_out_body(lms__gen_out *o)
{
    if (o->text.oom)
        return NULL;
    cJSON *j = envelope(o, false);
    cJSON *choices = cJSON_AddArrayToObject(j, "choices"), *c = cJSON_CreateObject();
    cJSON_AddItemToArray(choices, c);
    cJSON_AddNumberToObject(c, "index", 0);
    const char *text = o->text.p ? o->text.p : "";
    if (o->rq->chat) {
        cJSON *msg = cJSON_AddObjectToObject(c, "message");
        cJSON_AddStringToObject(msg, "role", "assistant");
        cJSON_AddStringToObject(msg, "content", text);
        cJSON_AddNullToObject(msg, "refusal");
    } else {
        cJSON_AddStringToObject(c, "text", text);
    }
    if (o->rq->logprobs) {
        cJSON *lp = o->lp;
        o->lp = NULL;
        if (o->rq->chat) {
            cJSON *l = cJSON_AddObjectToObject(c, "logprobs");
            cJSON_AddItemToObject(l, "content", lp ? lp : cJSON_CreateArray());
        } else {
            cJSON_AddItemToObject(c, "logprobs", lp ? lp : text_lp_new());
        }
    } else {
        cJSON_AddNullToObject(c, "logprobs");
    }
    cJSON_AddStringToObject(c, "finish_reason", o->finish ? o->finish : "stop");
    cJSON_AddItemToObject(j, "usage", usage_json(o));
    char *s = print_json(j);
    cJSON_Delete(j);
    return s;
}

/* ---- models, tokenize, detokenize -------------------------------------------------------- */

static cJSON *model_json(const lms__server_model *m)
{
    cJSON *j = cJSON_CreateObject();
    cJSON_AddStringToObject(j, "id", m->name);
    cJSON_AddStringToObject(j, "object", "model");
    cJSON_AddNumberToObject(j, "created", (double)m->created);
    cJSON_AddStringToObject(j, "owned_by", "lmstore");
    const lms_engine_info *in = lms__sched_info(m->sched);
    cJSON *meta = cJSON_AddObjectToObject(j, "meta");
    cJSON_AddStringToObject(meta, "arch", in->arch ? in->arch : "");
    cJSON_AddNumberToObject(meta, "n_ctx", in->n_ctx);
    cJSON_AddNumberToObject(meta, "n_vocab", in->n_vocab);
    cJSON_AddStringToObject(meta, "chat_format", m->fmt ? lms_chat_format_name(m->fmt) : "none");
    return j;
}

char *lms__api_models(const lms__server_params *sp, const char *one, lms__api_error *e)
{
    cJSON *j;
    if (one) {
        j = NULL;
        for (size_t i = 0; i < sp->n_models; i++)
            if (!strcmp(sp->models[i].name, one))
                j = model_json(&sp->models[i]);
        if (!j) {
            lms__api_fail(e, 404, "invalid_request_error", "model_not_found", "model",
                          "The model '%.200s' does not exist", one);
            return NULL;
        }
    } else {
        j = cJSON_CreateObject();
        cJSON_AddStringToObject(j, "object", "list");
        cJSON *data = cJSON_AddArrayToObject(j, "data");
        for (size_t i = 0; i < sp->n_models; i++)
            cJSON_AddItemToArray(data, model_json(&sp->models[i]));
    }
    char *s = print_json(j);
    cJSON_Delete(j);
    if (!s)
        lms__api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
    return s;
}

char *lms__api_tokenize(const lms__server_params *sp, const char *body, size_t len, lms__api_error *e)
{
    cJSON *root = parse_object(body, len, e), *out = NULL;
    char *s = NULL;
    int32_t *ids = NULL;
    size_t n = 0;
    if (!root)
        return NULL;
    const lms__server_model *m = find_model(sp, root, e);
    bool add_special = false, pieces = false;
    if (!m || !get_bool(root, "add_special", &add_special, e) || !get_bool(root, "with_pieces", &pieces, e) ||
        !need_tokenizer(m, e))
        goto out;
    const cJSON *c = cJSON_GetObjectItemCaseSensitive(root, "content");
    if (!cJSON_IsString(c)) {
        BAD(e, "content", "'content' must be a string");
        goto out;
    }
    lms_tokenizer *tok = lms__sched_tokenizer(m->sched);
    if (lms_tokenizer_encode(tok, c->valuestring, strlen(c->valuestring),
                             LMS_TOK_PARSE_SPECIAL | (add_special ? LMS_TOK_ADD_SPECIAL : 0), &ids, &n)) {
        BAD(e, "content", "%s", lms_last_error());
        goto out;
    }
    out = cJSON_CreateObject();
    cJSON *arr = cJSON_AddArrayToObject(out, "tokens");
    for (size_t i = 0; i < n; i++) {
        if (pieces) {
            cJSON *p = cJSON_CreateObject();
            cJSON_AddNumberToObject(p, "id", ids[i]);
            cJSON_AddItemToObject(p, "piece", token_string(tok, ids[i], NULL));
            cJSON_AddItemToArray(arr, p);
        } else {
            cJSON_AddItemToArray(arr, cJSON_CreateNumber(ids[i]));
        }
    }
    if (!(s = print_json(out)))
        lms__api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
out:
    lms_tokenizer_buf_free(ids);
    cJSON_Delete(out);
    cJSON_Delete(root);
    return s;
}

char *lms__api_detokenize(const lms__server_params *sp, const char *body, size_t len, lms__api_error *e)
{
    cJSON *root = parse_object(body, len, e), *out = NULL;
    char *s = NULL, *text = NULL;
    int32_t *ids = NULL;
    size_t n = 0, tl = 0;
    if (!root)
        return NULL;
    const lms__server_model *m = find_model(sp, root, e);
    if (!m || !need_tokenizer(m, e))
        goto out;
    const cJSON *t = cJSON_GetObjectItemCaseSensitive(root, "tokens");
    if (!cJSON_IsArray(t)) {
        BAD(e, "tokens", "'tokens' must be an array of token ids");
        goto out;
    }
    if (!ids_from_array(t, "tokens", &ids, &n, e))
        goto out;
    if (lms_tokenizer_decode(lms__sched_tokenizer(m->sched), ids, n, false, &text, &tl)) {
        BAD(e, "tokens", "%s", lms_last_error());
        goto out;
    }
    out = cJSON_CreateObject();
    cJSON_AddStringToObject(out, "content", text);
    if (!(s = print_json(out)))
        lms__api_fail(e, 500, "server_error", NULL, NULL, "out of memory");
out:
    lms__free(ids);
    lms_tokenizer_buf_free(text);
    cJSON_Delete(out);
    cJSON_Delete(root);
    return s;
}
