/*
 * tools/cli_gen.c - shared pieces of the model-running commands (see
 * cli_gen.h): option parsing, opening store + model + engine, chat turns as
 * token deltas, streaming generation with end-of-turn handling, JSON and
 * the metrics line.
 */
#include "tools/cli_gen.h"

#include <errno.h>
#include <limits.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "store/names.h"
#include "tools/cli.h"

const char lms_cli_gen_opts_help[] =
    "  --store DIR            the store (default $LMSTORE_HOME or ~/.local/share/lmstore)\n"
    "  --threads N            worker threads (default: online CPUs)\n"
    "  --device D             cpu (default), cuda or cuda:N: where the model runs\n"
    "  --ctx N                context length in tokens (default min(model max, 4096); run without\n"
    "                         --chat or --resume: what the prompt and --max-tokens can reach, when less)\n"
    "  --max-tokens N         tokens to generate (default 256; 0 = until a stop or the context is full)\n"
    "  --temp T               temperature (default: the model's generation_config.json, else 0:\n"
    "                         greedy, the arg max; the other sampling options default the same way)\n"
    "  --top-k K              keep the K most probable tokens (0 = off)\n"
    "  --top-p P              nucleus sampling: keep the most probable tokens up to mass P (1 = off)\n"
    "  --min-p P              drop tokens less probable than P x the most probable (0 = off)\n"
    "  --repeat-penalty R     penalize tokens seen in the last --repeat-window tokens (1 = off)\n"
    "  --repeat-window N      tokens the penalty looks back over (default 64)\n"
    "  --seed S               sampling seed (default 0)\n"
    "  --stop STR             stop when STR appears in the output (repeatable)\n"
    "  --ignore-eos           do not stop on the model's end-of-sequence tokens\n"
    "  --system TEXT          system prompt (chat; default: the template's own, if any; \"\" for none)\n"
    "  --chat-format NAME     chatml, llama3 or gemma instead of the model's template\n"
    "  --no-think             Qwen3: render turns with thinking disabled\n";

void lms_cli_gen_opts_init(lms_cli_gen_opts *o)
{
    memset(o, 0, sizeof *o);
    o->gp = lms_gen_default_params();
    o->gp.max_tokens = 256;
}

static int bad_number(const char *cmd, const char *opt, const char *v)
{
    return lms_cli_usage(cmd, "%s: '%s' is not a valid value", opt, v);
}

int lms_cli_gen_opt(const char *cmd, int argc, char **argv, int *i, lms_cli_gen_opts *o)
{
    const char *v;
    int64_t n;
    double d;
    if (lms_cli_opt(argc, argv, i, "--store", &v)) {
        o->store = v;
    } else if (lms_cli_opt(argc, argv, i, "--device", &v)) {
        o->device = v;
    } else if (lms_cli_opt(argc, argv, i, "--threads", &v)) {
        if (!lms_cli_parse_i64(v, &n) || n < 0 || n > 1024)
            return bad_number(cmd, "--threads", v);
        o->threads = (int)n;
    } else if (lms_cli_opt(argc, argv, i, "--ctx", &v)) {
        if (!lms_cli_parse_i64(v, &n) || n < 0 || n > INT32_MAX)
            return bad_number(cmd, "--ctx", v);
        o->ctx = (uint32_t)n;
    } else if (lms_cli_opt(argc, argv, i, "--max-tokens", &v) || lms_cli_opt(argc, argv, i, "-n", &v)) {
        if (!lms_cli_parse_i64(v, &n) || n < 0 || n > INT32_MAX)
            return bad_number(cmd, "--max-tokens", v);
        o->gp.max_tokens = (uint32_t)n;
    } else if (lms_cli_opt(argc, argv, i, "--temp", &v)) {
        if (!lms_cli_parse_f64(v, &d) || !(d >= 0) || d > 1e6)
            return bad_number(cmd, "--temp", v);
        o->gp.temperature = (float)d;
        o->sampling_set |= LMS_CLI_SET_TEMP;
    } else if (lms_cli_opt(argc, argv, i, "--top-k", &v)) {
        if (!lms_cli_parse_i64(v, &n) || n < 0 || n > INT32_MAX)
            return bad_number(cmd, "--top-k", v);
        o->gp.top_k = (int32_t)n;
        o->sampling_set |= LMS_CLI_SET_TOP_K;
    } else if (lms_cli_opt(argc, argv, i, "--top-p", &v)) {
        if (!lms_cli_parse_f64(v, &d) || !(d >= 0 && d <= 1))
            return bad_number(cmd, "--top-p", v);
        o->gp.top_p = (float)d;
        o->sampling_set |= LMS_CLI_SET_TOP_P;
    } else if (lms_cli_opt(argc, argv, i, "--min-p", &v)) {
        if (!lms_cli_parse_f64(v, &d) || !(d >= 0 && d <= 1))
            return bad_number(cmd, "--min-p", v);
        o->gp.min_p = (float)d;
        o->sampling_set |= LMS_CLI_SET_MIN_P;
    } else if (lms_cli_opt(argc, argv, i, "--repeat-penalty", &v)) {
        if (!lms_cli_parse_f64(v, &d) || !(d >= 0) || d > 1e6)
            return bad_number(cmd, "--repeat-penalty", v);
        o->gp.repeat_penalty = (float)d;
        o->sampling_set |= LMS_CLI_SET_REPEAT_PENALTY;
    } else if (lms_cli_opt(argc, argv, i, "--repeat-window", &v)) {
        if (!lms_cli_parse_i64(v, &n) || n < 0 || n > INT32_MAX)
            return bad_number(cmd, "--repeat-window", v);
        o->gp.repeat_window = (uint32_t)n;
    } else if (lms_cli_opt(argc, argv, i, "--seed", &v)) {
        char *end;
        errno = 0;
        unsigned long long s = strtoull(v, &end, 0);
        if (!*v || *end || errno || *v == '-')
            return bad_number(cmd, "--seed", v);
        o->gp.seed = s;
    } else if (lms_cli_opt(argc, argv, i, "--stop", &v)) {
        if (o->n_stop == LMS_CLI_MAX_STOPS)
            return lms_cli_usage(cmd, "at most %d --stop strings", LMS_CLI_MAX_STOPS);
        o->stops[o->n_stop++] = v;
    } else if (lms_cli_opt(argc, argv, i, "--system", &v)) {
        o->system = v;
    } else if (lms_cli_opt(argc, argv, i, "--chat-format", &v)) {
        o->chat_format = v;
    } else if (lms_cli_flag(argv, *i, "--ignore-eos")) {
        o->gp.ignore_eos = true;
        (*i)++;
    } else if (lms_cli_flag(argv, *i, "--no-think")) {
        o->no_think = true;
        (*i)++;
    } else {
        return 0;
    }
    return 1;
}

/* arg is "--name" or "--name=VALUE". */
static bool names_opt(const char *arg, const char *name)
{
    size_t n = strlen(name);
    return strncmp(arg, name, n) == 0 && (arg[n] == '\0' || arg[n] == '=');
}

int lms_cli_gen_positional(const char *cmd, int argc, char **argv, int *i, lms_cli_gen_opts *o, unsigned only)
{
    const char *a = argv[*i];
    if (!only || ((only & LMS_CLI_GEN_STORE) && names_opt(a, "--store")) ||
        ((only & LMS_CLI_GEN_THREADS) && names_opt(a, "--threads")) ||
        ((only & LMS_CLI_GEN_CTX) && names_opt(a, "--ctx")) ||
        ((only & LMS_CLI_GEN_DEVICE) && names_opt(a, "--device"))) {
        int r = lms_cli_gen_opt(cmd, argc, argv, i, o);
        if (r == 1)
            return LMS_EXIT_OK;
        if (r != 0)
            return r;
    }
    if (lms_cli_is_option(a))
        return lms_cli_usage(cmd, "unknown option '%s'", a);
    if (o->model)
        return lms_cli_usage(cmd, "unexpected argument '%s'", a);
    o->model = a;
    (*i)++;
    return LMS_EXIT_OK;
}

/* ---- model ------------------------------------------------------------------------ */

int lms_cli_model_open(const char *cmd, const lms_cli_gen_opts *o, int store_mode, lms_cli_model *cm)
{
    memset(cm, 0, sizeof *cm);
    const char *path = lms_cli_store_path(o->store);
    int rc = lms_store_open(path, store_mode == LMS_CLI_STORE_READ ? LMS_STORE_RDONLY : 0, NULL, &cm->st);
    if (rc && store_mode == LMS_CLI_STORE_TRY_WRITE)
        rc = lms_store_open(path, LMS_STORE_RDONLY, NULL, &cm->st);
    if (rc) {
        lms_cli_fail(cmd, rc, path);
        goto out_fail;
    }
    lms_model_params mp = lms_model_default_params();
    if (o->device && strcmp(o->device, "cpu")) {
        if ((rc = lms_device_open_name(o->device, &cm->dev))) {
            lms_cli_fail(cmd, rc, NULL); /* the detail names the device */
            goto out_fail;
        }
        mp.device = cm->dev;
    }
    rc = lms_model_open(cm->st, o->model, &mp, &cm->m);
    if (rc) {
        lms_cli_fail(cmd, rc, o->model);
        goto out_fail;
    }
    lms_engine_params ep = lms_engine_default_params();
    ep.device = cm->dev;
    ep.threads = o->threads;
    ep.n_ctx = o->ctx ? o->ctx : o->ctx_need;
    rc = lms_engine_create(cm->m, &ep, &cm->eng);
    if (rc) {
        lms_cli_fail(cmd, rc, o->model);
        goto out_fail;
    }
    lms_engine_get_info(cm->eng, &cm->info);
    cm->tok = lms_engine_tokenizer(cm->eng);
    if (o->ctx && cm->info.max_pos && o->ctx > cm->info.max_pos)
        fprintf(stderr,
                "lmstore %s: warning: --ctx %u is more than model '%s' was trained for (max_position_embeddings "
                "%u in its config.json): positions past %u are extrapolated and its output may degrade\n",
                cmd, o->ctx, o->model, cm->info.max_pos, cm->info.max_pos);
    return LMS_EXIT_OK;
out_fail:
    lms_cli_model_close(cm);
    return LMS_EXIT_FAIL;
}

void lms_cli_model_close(lms_cli_model *cm)
{
    free(cm->default_system);
    lms_engine_free(cm->eng);
    lms_model_close(cm->m);
    lms_device_close(cm->dev);
    lms_store_close(cm->st);
    memset(cm, 0, sizeof *cm);
}

void lms_cli_gen_sampling(const char *cmd, lms_cli_model *cm, lms_cli_gen_opts *o)
{
    lms_gen_params d;
    int rc = lms_engine_default_gen_params(cm->eng, &d);
    if (rc)
        fprintf(stderr, "lmstore %s: warning: %s; sampling defaults to greedy\n", cmd, lms_last_error());
    unsigned set = o->sampling_set;
    if (!(set & LMS_CLI_SET_TEMP))
        o->gp.temperature = d.temperature;
    if (!(set & LMS_CLI_SET_TOP_K))
        o->gp.top_k = d.top_k;
    if (!(set & LMS_CLI_SET_TOP_P))
        o->gp.top_p = d.top_p;
    if (!(set & LMS_CLI_SET_MIN_P))
        o->gp.min_p = d.min_p;
    if (!(set & LMS_CLI_SET_REPEAT_PENALTY))
        o->gp.repeat_penalty = d.repeat_penalty;
    lms_gen_params g = lms_gen_default_params();
    o->sampling_from_model = !rc && (d.temperature != g.temperature || d.top_k != g.top_k || d.top_p != g.top_p ||
                                     d.min_p != g.min_p || d.repeat_penalty != g.repeat_penalty);
}

void lms_cli_json_sampling(FILE *f, const lms_cli_gen_opts *o)
{
    fprintf(f, "{\"temperature\": %.6g, \"top_k\": %d, \"top_p\": %.6g, \"min_p\": %.6g, \"repeat_penalty\": %.6g, "
               "\"seed\": %llu, \"from_model\": %s}",
            o->gp.temperature, (int)o->gp.top_k, o->gp.top_p, o->gp.min_p, o->gp.repeat_penalty,
            (unsigned long long)o->gp.seed, o->sampling_from_model ? "true" : "false");
}

bool lms_cli_session_name_ok(const char *cmd, const char *name)
{
    /* the one check the store applies when it saves (store/names.c) */
    if (lms__name_check(LMS__NAME_SESSION, name) == 0)
        return true;
    fprintf(stderr, "lmstore %s: error: %s; nothing was generated or saved\n", cmd, lms_last_error());
    return false;
}

static struct sigaction sigint_old;
static volatile sig_atomic_t sigint_caught;

static void on_sigint(int sig)
{
    (void)sig;
    if (lms_cli_interrupted) /* the second Ctrl-C: leave now */
        _exit(128 + SIGINT);
    lms_cli_interrupted = 1;
}

void lms_cli_sigint_catch(void)
{
    struct sigaction sa;
    memset(&sa, 0, sizeof sa);
    sa.sa_handler = on_sigint;
    sigemptyset(&sa.sa_mask);
    if (!sigint_caught)
        sigaction(SIGINT, &sa, &sigint_old);
    sigint_caught = 1;
}

void lms_cli_sigint_restore(void)
{
    if (sigint_caught)
        sigaction(SIGINT, &sigint_old, NULL);
    sigint_caught = 0;
}

/*
 * ChatML templates that write a system message of their own when the
 * conversation has none (SmolLM2: "You are a helpful AI assistant named
 * SmolLM, ...", Qwen 2.5: "You are Qwen, ..."): the text of the first
 * literal '<|im_start|>system\n TEXT <|im_end|>' in the template. Only plain
 * literals count (no quotes, braces or backslashes inside), so templates that
 * merely open a system turn for other content (Qwen3's tools) give none.
 */
static char *template_default_system(const char *tmpl)
{
    static const char open[] = "<|im_start|>system";
    for (const char *p = tmpl ? strstr(tmpl, open) : NULL; p; p = strstr(p + 1, open)) {
        const char *q = p + sizeof open - 1;
        if (*q == '\n')
            q++;
        else if (q[0] == '\\' && q[1] == 'n')
            q += 2;
        else
            continue;
        const char *end = strstr(q, "<|im_end|>");
        if (!end || end == q)
            continue;
        size_t n = (size_t)(end - q);
        if (strcspn(q, "'\"{}\\\n") < n)
            continue;
        char *s = malloc(n + 1);
        if (s) {
            memcpy(s, q, n);
            s[n] = '\0';
        }
        return s;
    }
    return NULL;
}

int lms_cli_model_chat_init(const char *cmd, const lms_cli_gen_opts *o, lms_cli_model *cm)
{
    int rc;
    if (!cm->tok) {
        fprintf(stderr, "lmstore %s: error: model '%s' has no tokenizer.json: chat needs one\n", cmd,
                o->model);
        return LMS_EXIT_FAIL;
    }
    if (o->chat_format)
        rc = lms_chat_format_from_name(o->chat_format, &cm->fmt);
    else
        rc = lms_tokenizer_chat_format(cm->tok, &cm->fmt);
    if (rc) {
        lms_cli_fail(cmd, rc, o->chat_format ? "--chat-format" : "chat template (try --chat-format)");
        return rc == LMS_EINVAL ? LMS_EXIT_USAGE : LMS_EXIT_FAIL;
    }
    int n = lms_chat_stop_ids(cm->tok, cm->fmt, cm->chat_stop_ids,
                              sizeof cm->chat_stop_ids / sizeof cm->chat_stop_ids[0]);
    if (n < 0)
        return lms_cli_fail(cmd, n, "chat stop tokens");
    cm->n_chat_stop_ids = (size_t)n;
    if (cm->fmt == LMS_CHAT_CHATML)
        cm->default_system = template_default_system(lms_tokenizer_chat_template(cm->tok));
    return LMS_EXIT_OK;
}

char *lms_cli_read_file(const char *path, size_t *len)
{
    FILE *f = fopen(path, "rb");
    if (!f)
        return NULL;
    struct stat st;
    if (fstat(fileno(f), &st) == 0 && S_ISDIR(st.st_mode)) { /* named as a folder, not "Input/output error" */
        fclose(f);
        errno = EISDIR;
        return NULL;
    }
    size_t cap = 1 << 16, n = 0;
    int read_errno = 0;
    char *buf = malloc(cap);
    while (buf) {
        if (n + 1 >= cap) {
            char *p = realloc(buf, cap * 2);
            if (!p) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = p;
            cap *= 2;
        }
        errno = 0;
        size_t r = fread(buf + n, 1, cap - 1 - n, f);
        n += r;
        if (r == 0) {
            read_errno = errno;
            break;
        }
    }
    int err = ferror(f);
    fclose(f);
    if (!buf || err) {
        free(buf);
        errno = err ? (read_errno ? read_errno : EIO) : ENOMEM;
        return NULL;
    }
    buf[n] = '\0';
    *len = n;
    return buf;
}

/* ---- ids and text ---------------------------------------------------------------------- */

bool lms_cli_parse_ids(const char *s, int32_t **ids, size_t *n)
{
    *ids = NULL;
    *n = 0;
    size_t cap = 1;
    for (const char *p = s; *p; p++)
        cap += *p == ',';
    int32_t *a = malloc(cap * sizeof *a);
    if (!a)
        return false;
    size_t k = 0;
    const char *p = s;
    for (;;) {
        while (*p == ' ')
            p++;
        char *end;
        errno = 0;
        long v = strtol(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX)
            goto bad;
        a[k++] = (int32_t)v;
        p = end;
        while (*p == ' ')
            p++;
        if (*p == '\0')
            break;
        if (*p != ',')
            goto bad;
        p++;
    }
    *ids = a;
    *n = k;
    return true;
bad:
    free(a);
    return false;
}

int lms_cli_encode(lms_cli_model *cm, const char *text, bool add_special, int32_t **ids, size_t *n)
{
    if (!cm->tok)
        return lms__err(LMS_EUNSUPPORTED, "the model has no tokenizer.json: give --prompt-ids");
    return lms_tokenizer_encode(cm->tok, text, strlen(text), add_special ? LMS_TOK_ADD_SPECIAL : 0, ids, n);
}

static unsigned chat_flags(const lms_cli_gen_opts *o, bool gen)
{
    return (gen ? LMS_CHAT_ADD_GENERATION_PROMPT : 0) | (o->no_think ? LMS_CHAT_NO_THINKING : 0);
}

static bool starts_with(const char *s, const char *prefix)
{
    return strncmp(s, prefix, strlen(prefix)) == 0;
}

int lms_cli_chat_turn_ids(lms_cli_model *cm, const lms_cli_gen_opts *o, const char *user,
                          int32_t **ids, size_t *n)
{
    size_t seq_len = 0;
    (void)lms_engine_tokens(cm->eng, &seq_len);
    char *text = NULL, *a = NULL, *c = NULL;
    int rc;
    if (seq_len == 0) {
        lms_chat_message msgs[2];
        size_t k = 0;
        const char *system = o->system ? o->system : cm->default_system;
        if (system && *system)
            msgs[k++] = (lms_chat_message){"system", system};
        msgs[k++] = (lms_chat_message){"user", user};
        rc = lms_chat_apply(cm->fmt, msgs, k, chat_flags(o, true), &text);
        if (rc)
            return rc;
    } else {
        /* What the format writes after an assistant reply and before the
         * next assistant header, found by rendering a stand-in exchange:
         *   A = [user X] + assistant header (as the first turn ended),
         *   C = [user X, assistant Y, user U] + assistant header;
         * C = A + "Y" + closing + new turn. A is rendered without the
         * no-thinking flag: that flag only changes the final header (an empty
         * think block), never the history. */
        const lms_chat_message m3[3] = {{"user", "X"}, {"assistant", "Y"}, {"user", user}};
        if ((rc = lms_chat_apply(cm->fmt, m3, 1, LMS_CHAT_ADD_GENERATION_PROMPT, &a)) ||
            (rc = lms_chat_apply(cm->fmt, m3, 3, chat_flags(o, true), &c)))
            goto out;
        size_t la = strlen(a);
        if (!starts_with(c, a) || c[la] != 'Y') {
            rc = lms__err(LMS_EUNSUPPORTED, "chat format '%s': a turn cannot be appended to the "
                              "conversation (the template rewrites earlier turns)",
                              lms_chat_format_name(cm->fmt));
            goto out;
        }
        text = malloc(strlen(c + la + 1) + 1);
        if (!text) {
            rc = LMS_ENOMEM;
            goto out;
        }
        strcpy(text, c + la + 1);
    }
    rc = lms_tokenizer_encode(cm->tok, text, strlen(text), LMS_TOK_PARSE_SPECIAL, ids, n);
out:
    if (text && seq_len == 0)
        lms_tokenizer_buf_free(text);
    else
        free(text);
    lms_tokenizer_buf_free(a);
    lms_tokenizer_buf_free(c);
    return rc;
}

/* ---- generation ------------------------------------------------------------------------ */

typedef struct gen_ctx {
    lms_cli_model *cm;
    bool chat;
    bool end_of_turn;
    FILE *out;
    lms_cli_gen_result *res;
    bool oom;
    int write_errno; /* writing the streamed text failed (stdout on a full disk) */
} gen_ctx;

static bool is_chat_stop(const lms_cli_model *cm, int32_t id)
{
    for (size_t i = 0; i < cm->n_chat_stop_ids; i++)
        if (cm->chat_stop_ids[i] == id)
            return true;
    return false;
}

static bool is_eos(const lms_cli_model *cm, int32_t id)
{
    for (size_t i = 0; i < cm->info.n_eos; i++)
        if (cm->info.eos_ids[i] == id)
            return true;
    return false;
}

volatile sig_atomic_t lms_cli_interrupted;

static int on_token(void *user, int32_t id, const char *piece, size_t len)
{
    gen_ctx *g = user;
    lms_cli_gen_result *r = g->res;
    if (id >= 0 && g->chat && is_chat_stop(g->cm, id)) {
        g->end_of_turn = true;
        return 1;
    }
    if (id >= 0 && r->n_ids == r->cap_ids) {
        size_t cap = r->cap_ids ? 2 * r->cap_ids : 256;
        int32_t *p = realloc(r->ids, cap * sizeof *p);
        if (!p) {
            g->oom = true;
            return 1;
        }
        r->ids = p;
        r->cap_ids = cap;
    }
    if (id >= 0) /* id -1: text held back until the end of the stream */
        r->ids[r->n_ids++] = id;
    if (piece && len) {
        if (r->len + len + 1 > r->cap) {
            size_t cap = r->cap ? r->cap : 1024;
            while (cap < r->len + len + 1)
                cap *= 2;
            char *p = realloc(r->text, cap);
            if (!p) {
                g->oom = true;
                return 1;
            }
            r->text = p;
            r->cap = cap;
        }
        memcpy(r->text + r->len, piece, len);
        r->len += len;
        r->text[r->len] = '\0';
        if (g->out && (fwrite(piece, 1, len, g->out) != len || fflush(g->out) != 0)) {
            g->write_errno = errno ? errno : EIO; /* nobody reads the rest: stop */
            return 1;
        }
    }
    /* The token is in the sequence already: keep it in the output too. */
    return lms_cli_interrupted ? 1 : 0;
}

int lms_cli_generate(lms_cli_model *cm, const lms_cli_gen_opts *o, bool chat, const int32_t *prompt,
                     size_t n_prompt, FILE *out, lms_cli_gen_result *res)
{
    memset(res, 0, sizeof *res);
    res->text = calloc(1, 1);
    if (!res->text)
        return LMS_ENOMEM;
    res->cap = 1;
    lms_gen_params gp = o->gp;
    gp.stop = o->n_stop ? o->stops : NULL;
    gp.n_stop = o->n_stop;
    gen_ctx g = {.cm = cm, .chat = chat, .out = out, .res = res};
    lms_cli_interrupted = 0;
    int rc = lms_generate(cm->eng, &gp, prompt, n_prompt, on_token, &g, &res->metrics);
    if (rc)
        return rc;
    if (g.oom)
        return lms__err(LMS_ENOMEM, "out of memory collecting the output");
    if (g.write_errno)
        return lms__err(LMS_EIO, "writing to standard output: %s", strerror(g.write_errno));
    if (g.end_of_turn) { /* the end-of-turn id reached the callback: not a generated token */
        res->metrics.stop_reason = LMS_STOP_EOS;
        if (res->metrics.gen_tokens)
            res->metrics.gen_tokens--;
    }
    if (res->metrics.stop_reason == LMS_STOP_EOS) {
        /* Keep the sequence ending at the reply text: the next chat turn
         * (or a resumed session) writes the closing tokens itself. */
        size_t n = 0;
        const int32_t *seq = lms_engine_tokens(cm->eng, &n);
        if (n > n_prompt && (is_eos(cm, seq[n - 1]) || is_chat_stop(cm, seq[n - 1])))
            if ((rc = lms_engine_truncate(cm->eng, n - 1)))
                return rc;
    }
    return 0;
}

void lms_cli_gen_result_free(lms_cli_gen_result *res)
{
    free(res->ids);
    free(res->text);
    memset(res, 0, sizeof *res);
}

/* ---- output -------------------------------------------------------------------------------- */

const char *lms_cli_stop_name(int reason)
{
    switch (reason) {
    case LMS_STOP_EOS: return "eos";
    case LMS_STOP_STRING: return "stop_string";
    case LMS_STOP_MAX_TOKENS: return "max_tokens";
    case LMS_STOP_CTX: return "context_full";
    case LMS_STOP_CALLBACK: return "interrupted";
    default: return "none";
    }
}

void lms_cli_print_metrics(FILE *f, const lms_gen_metrics *mt)
{
    fprintf(f,
            "load %.1f ms | prompt %u tok (%u reused) %.1f tok/s | first token %.1f ms | "
            "generated %u tok %.1f tok/s | peak RSS %.1f MiB | KV %.1f MiB written of %.1f reserved | "
            "stop: %s | %s\n",
            mt->load_ms, mt->prompt_tokens, mt->reused_tokens, mt->prompt_tps, mt->ttft_ms,
            mt->gen_tokens, mt->gen_tps, (double)mt->peak_rss / (1024.0 * 1024.0),
            (double)mt->kv_touched_bytes / (1024.0 * 1024.0), (double)mt->kv_bytes / (1024.0 * 1024.0),
            lms_cli_stop_name(mt->stop_reason), mt->device ? mt->device : "cpu");
}

void lms_cli_json_str(FILE *f, const char *s, size_t len)
{
    fputc('"', f);
    for (size_t i = 0; i < len; i++) {
        unsigned char c = (unsigned char)s[i];
        switch (c) {
        case '"': fputs("\\\"", f); break;
        case '\\': fputs("\\\\", f); break;
        case '\n': fputs("\\n", f); break;
        case '\r': fputs("\\r", f); break;
        case '\t': fputs("\\t", f); break;
        default:
            if (c < 0x20)
                fprintf(f, "\\u%04x", c);
            else
                fputc(c, f);
        }
    }
    fputc('"', f);
}

void lms_cli_json_ids(FILE *f, const int32_t *ids, size_t n)
{
    fputc('[', f);
    for (size_t i = 0; i < n; i++)
        fprintf(f, i ? ", %d" : "%d", (int)ids[i]);
    fputc(']', f);
}

static void json_num(FILE *f, double v)
{
    if (isfinite(v))
        fprintf(f, "%.6g", v);
    else
        fputs("null", f);
}

void lms_cli_json_metrics(FILE *f, const lms_gen_metrics *mt)
{
    fputs("{\"load_ms\": ", f);
    json_num(f, mt->load_ms);
    fputs(", \"ttft_ms\": ", f);
    json_num(f, mt->ttft_ms);
    fprintf(f, ", \"prompt_tokens\": %u, \"reused_tokens\": %u, \"prompt_ms\": ", mt->prompt_tokens,
            mt->reused_tokens);
    json_num(f, mt->prompt_ms);
    fputs(", \"prompt_tps\": ", f);
    json_num(f, mt->prompt_tps);
    fprintf(f, ", \"gen_tokens\": %u, \"gen_ms\": ", mt->gen_tokens);
    json_num(f, mt->gen_ms);
    fputs(", \"gen_tps\": ", f);
    json_num(f, mt->gen_tps);
    fprintf(f, ", \"peak_rss_bytes\": %llu, \"kv_bytes\": %llu, \"kv_touched_bytes\": %llu, \"stop\": \"%s\"}",
            (unsigned long long)mt->peak_rss, (unsigned long long)mt->kv_bytes,
            (unsigned long long)mt->kv_touched_bytes, lms_cli_stop_name(mt->stop_reason));
}
