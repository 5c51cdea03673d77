/*
 * tools/cli_gen.h - pieces shared by the CLI commands that run a model
 * (run, chat, perplexity, logits): the generation options, opening store +
 * model + engine in one step, token id lists, chat turns as token deltas,
 * JSON output and the metrics line.
 */
#ifndef LMS_CLI_GEN_H
#define LMS_CLI_GEN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <signal.h>
#include <stdio.h>

#include "lmstore/engine.h"
#include "lmstore/loader.h"
#include "lmstore/store.h"
#include "lmstore/tokenizer.h"

#define LMS_CLI_MAX_STOPS 32

/* Options common to the model-running commands. */
typedef struct lms_cli_gen_opts {
    const char *store;        /* --store DIR */
    const char *model;        /* MODEL (positional) */
    int threads;              /* --threads N; 0 = engine default */
    const char *device;       /* --device cpu|cuda|cuda:N; NULL = cpu */
    uint32_t ctx;             /* --ctx N; 0 = engine default */
    uint32_t ctx_need;        /* without --ctx: the most tokens this request can reach, when known
                                 (0 = unknown); a context of that size instead of the default */
    lms_gen_params gp;        /* --max-tokens --temp --top-k --top-p --min-p
                                 --repeat-penalty --repeat-window --seed --ignore-eos */
    const char *stops[LMS_CLI_MAX_STOPS]; /* --stop STR (repeatable) */
    size_t n_stop;
    const char *system;       /* --system TEXT */
    const char *chat_format;  /* --chat-format NAME; NULL = from the model's template */
    bool no_think;            /* --no-think (Qwen3 templates) */
    unsigned sampling_set;    /* LMS_CLI_SET_* of the sampling options given on the command line */
    bool sampling_from_model; /* lms_cli_gen_sampling took defaults from generation_config.json */
} lms_cli_gen_opts;

enum {
    LMS_CLI_SET_TEMP = 1, LMS_CLI_SET_TOP_K = 2, LMS_CLI_SET_TOP_P = 4, LMS_CLI_SET_MIN_P = 8,
    LMS_CLI_SET_REPEAT_PENALTY = 16,
};

/* Defaults: engine defaults with max_tokens 256. */
void lms_cli_gen_opts_init(lms_cli_gen_opts *o);

/*
 * Try to consume one generation option at argv[*i]. Returns 1 when consumed
 * (*i advanced), 0 when argv[*i] is not one of them, or LMS_EXIT_USAGE after
 * printing the problem (bad number).
 */
int lms_cli_gen_opt(const char *cmd, int argc, char **argv, int *i, lms_cli_gen_opts *o);

/* Subsets of the generation options for lms_cli_gen_positional (0 = all). */
enum { LMS_CLI_GEN_STORE = 1, LMS_CLI_GEN_THREADS = 2, LMS_CLI_GEN_CTX = 4, LMS_CLI_GEN_DEVICE = 8 };

/*
 * The end of a command's option loop, for an argv[*i] the command did not
 * take itself: one of the generation options (all of them when `only` is 0,
 * else those named in it), else the positional MODEL (into o->model). An
 * unknown option or a second positional argument is a usage error. Returns 0
 * with *i advanced, or LMS_EXIT_USAGE after printing the problem.
 */
int lms_cli_gen_positional(const char *cmd, int argc, char **argv, int *i, lms_cli_gen_opts *o, unsigned only);

/* Help text for those options (for the commands' --help). */
extern const char lms_cli_gen_opts_help[];

/* An open store + model + engine. */
typedef struct lms_cli_model {
    lms_store *st;
    lms_device *dev;            /* --device, NULL for the CPU */
    lms_model *m;
    lms_engine *eng;
    lms_tokenizer *tok;         /* borrowed from eng; NULL when the model has none */
    lms_engine_info info;
    lms_chat_format fmt;        /* LMS_CHAT_UNKNOWN until lms_cli_model_chat_init */
    int32_t chat_stop_ids[16];  /* end-of-turn ids of the chat format */
    size_t n_chat_stop_ids;
    char *default_system;       /* system message the template writes when none is given, or NULL */
} lms_cli_model;

/* How lms_cli_model_open opens the store. */
enum {
    LMS_CLI_STORE_READ = 0,      /* read-only */
    LMS_CLI_STORE_WRITE = 1,     /* read-write (saving sessions) */
    LMS_CLI_STORE_TRY_WRITE = 2, /* read-write where this user may write it, else read-only (a resume
                                  * records the session's last-used time when it can) */
};
/* Open everything; on failure prints the error and returns LMS_EXIT_FAIL
 * (with *cm closed). */
int lms_cli_model_open(const char *cmd, const lms_cli_gen_opts *o, int store_mode, lms_cli_model *cm);
void lms_cli_model_close(lms_cli_model *cm);

/*
 * The sampling settings in effect: the model's defaults
 * (lms_engine_default_gen_params: its generation_config.json, greedy without
 * one), each overridden by the option the user gave (--temp, --top-k,
 * --top-p, --min-p, --repeat-penalty). A malformed generation_config.json is
 * a warning (greedy then). Call after lms_cli_model_open.
 */
void lms_cli_gen_sampling(const char *cmd, lms_cli_model *cm, lms_cli_gen_opts *o);
/* The settings in effect as a JSON object (for --json output). */
void lms_cli_json_sampling(FILE *f, const lms_cli_gen_opts *o);

/*
 * A session name given on the command line (--save-session, /save): checked
 * before any work, so that a name the store would refuse does not cost a
 * generation. Prints the problem and returns false.
 */
bool lms_cli_session_name_ok(const char *cmd, const char *name);

/*
 * Ctrl-C while a reply is generated: the first stops the generation after
 * the current token (lms_cli_generate returns normally with stop reason
 * "interrupted", so metrics are printed and sessions saved); a second exits
 * at once with status 130. lms_cli_sigint_restore puts the previous handler
 * back.
 */
void lms_cli_sigint_catch(void);
void lms_cli_sigint_restore(void);

/* Pick the chat format (from --chat-format or the model's template) and its
 * stop ids. Prints the error and returns LMS_EXIT_FAIL when unknown. */
int lms_cli_model_chat_init(const char *cmd, const lms_cli_gen_opts *o, lms_cli_model *cm);

/*
 * The token ids that start a new user turn, given the engine's current
 * sequence: for an empty sequence, the whole rendered conversation (system
 * prompt if any, the user message, the assistant header); otherwise only
 * what closes the previous assistant reply plus the new user turn and the
 * assistant header, so nothing already in the KV cache is computed again.
 * *ids is freed with lms_tokenizer_buf_free. 0 or an LMS_E* code.
 */
int lms_cli_chat_turn_ids(lms_cli_model *cm, const lms_cli_gen_opts *o, const char *user,
                          int32_t **ids, size_t *n);

/* Encode plain text (add_special as HF's default add_special_tokens). */
int lms_cli_encode(lms_cli_model *cm, const char *text, bool add_special, int32_t **ids, size_t *n);

/* Read a whole file, NUL-terminated (free()); NULL with errno set. */
char *lms_cli_read_file(const char *path, size_t *len);

/* Parse "1,2,3" into a new array (free()). false on junk, empty or overflow. */
bool lms_cli_parse_ids(const char *s, int32_t **ids, size_t *n);

/* Result of one generation, filled by lms_cli_generate. */
typedef struct lms_cli_gen_result {
    int32_t *ids;           /* generated ids (end-of-turn ids excluded); free() */
    size_t n_ids, cap_ids;
    char *text;             /* streamed text; free() */
    size_t len, cap;
    lms_gen_metrics metrics;
} lms_cli_gen_result;

/*
 * Run lms_generate over prompt ids, streaming text to `out` (NULL: quiet).
 * Stops on the engine's EOS ids, on the chat format's end-of-turn ids when
 * chat is set, and on the stop strings; an end-of-turn id that ended the
 * reply is removed from the engine's sequence so that the next turn's
 * closing tokens follow the reply text. Returns 0 or an LMS_E* code.
 */
int lms_cli_generate(lms_cli_model *cm, const lms_cli_gen_opts *o, bool chat, const int32_t *prompt,
                     size_t n_prompt, FILE *out, lms_cli_gen_result *res);
void lms_cli_gen_result_free(lms_cli_gen_result *res);

/* Set (e.g. by a SIGINT handler) to stop the generation in progress after
 * the current token; lms_cli_generate clears it when it starts. */
extern volatile sig_atomic_t lms_cli_interrupted;

/* The metrics line (one line, to f). */
void lms_cli_print_metrics(FILE *f, const lms_gen_metrics *mt);
/* JSON writers. */
void lms_cli_json_str(FILE *f, const char *s, size_t len);
void lms_cli_json_ids(FILE *f, const int32_t *ids, size_t n);
void lms_cli_json_metrics(FILE *f, const lms_gen_metrics *mt);
const char *lms_cli_stop_name(int reason);

#endif
