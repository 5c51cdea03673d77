/*
 * tools/cmd_chat.c - `lmstore chat MODEL`: an interactive chat. The
 * conversation lives in the engine's KV cache: each turn computes only its
 * own tokens (the closing of the previous reply, the user's message and the
 * assistant header), never the earlier turns again. /save and /load keep
 * conversations in the store as sessions. On a terminal, lines are read with
 * libedit (editing, history kept across runs in
 * $XDG_STATE_HOME/lmstore/history); piped input is read line by line.
 */
#include <editline/readline.h>
#include <errno.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "tools/cli.h"
#include "tools/cli_gen.h"

const char lms_cmd_chat_help[] = "interactive chat kept in the KV cache (/save, /load, /reset, /help)";

static const char commands_help[] = "  /save NAME   save the conversation into the store as session NAME\n"
                                    "  /load NAME   continue session NAME (replaces the current conversation)\n"
                                    "  /reset       start a new conversation\n"
                                    "  /help        this list\n"
                                    "  /quit        leave (end of input, Ctrl-D, does the same)\n"
                                    "  //TEXT       send TEXT starting with a '/'\n";

static void usage(FILE *f)
{
    fprintf(f,
            "usage: lmstore chat MODEL [options]\n"
            "\n"
            "Each line of input is one user message; the reply streams to stdout and a\n"
            "metrics line goes to stderr. On a terminal, lines can be edited and earlier\n"
            "ones recalled (arrow keys, Ctrl-R); Ctrl-C stops a reply, at the prompt it\n"
            "leaves. Commands:\n"
            "%s"
            "\n"
            "  --resume NAME          start from a saved session\n"
            "  --json                 one JSON object per turn instead of streamed text:\n"
            "                         {\"turn\", \"prompt_ids\" (this turn's new ids), \"ids\", \"text\", \"metrics\"}\n"
            "%s",
            commands_help, lms_cli_gen_opts_help);
}

/* $XDG_STATE_HOME/lmstore/history, else ~/.local/state/lmstore/history (the
 * folders made as needed); NULL when there is no home. Static buffer. */
static const char *history_path(void)
{
    static char path[PATH_MAX + 16];
    const char *st = getenv("XDG_STATE_HOME"), *home = getenv("HOME");
    char dir[PATH_MAX];
    if (st && *st)
        snprintf(dir, sizeof dir, "%s", st);
    else if (home && *home)
        snprintf(dir, sizeof dir, "%s/.local/state", home);
    else
        return NULL;
    /* mkdir -p of the last levels; an existing folder is fine */
    char *slash = dir + strlen(dir);
    snprintf(slash, sizeof dir - (size_t)(slash - dir), "/lmstore");
    for (char *p = dir + 1; *p; p++)
        if (*p == '/') {
            *p = '\0';
            (void)mkdir(dir, 0700);
            *p = '/';
        }
    if (mkdir(dir, 0700) && errno != EEXIST)
        return NULL;
    snprintf(path, sizeof path, "%s/history", dir);
    return path;
}

/* One line of input without its newline (free()), or NULL at the end. */
static char *read_line(bool tty, const char *hist)
{
    if (tty) {
        char *l = readline("> ");
        if (l && *l && hist) {
            add_history(l);
            (void)write_history(hist);
        }
        return l;
    }
    char *line = NULL;
    size_t cap = 0;
    ssize_t n = getline(&line, &cap, stdin);
    if (n < 0) {
        free(line);
        return NULL;
    }
    while (n && (line[n - 1] == '\n' || line[n - 1] == '\r'))
        line[--n] = '\0';
    return line;
}

static const char *arg_of(const char *line, const char *cmd)
{
    size_t n = strlen(cmd);
    if (strncmp(line, cmd, n) != 0 || (line[n] != ' ' && line[n] != '\0'))
        return NULL;
    line += n;
    while (*line == ' ')
        line++;
    return line;
}

int lms_cmd_chat(int argc, char **argv)
{
    const char *cmd = "chat";
    lms_cli_gen_opts o;
    lms_cli_gen_opts_init(&o);
    const char *resume = NULL;
    bool json = false;
    for (int i = 1; i < argc;) {
        if (lms_cli_end_of_options(argv, &i))
            continue;
        const char *v;
        if (lms_cli_flag(argv, i, "-h") || lms_cli_flag(argv, i, "--help")) {
            usage(stdout);
            return LMS_EXIT_OK;
        } else if (lms_cli_opt(argc, argv, &i, "--resume", &v)) {
            resume = v;
        } else if (lms_cli_flag(argv, i, "--json")) {
            json = true;
            i++;
        } else {
            int r = lms_cli_gen_positional(cmd, argc, argv, &i, &o, 0);
            if (r)
                return r;
        }
    }
    if (!o.model)
        return lms_cli_usage(cmd, "which model? (lmstore chat MODEL)");

    lms_cli_model cm;
    if (lms_cli_model_open(cmd, &o, LMS_CLI_STORE_WRITE, &cm) != LMS_EXIT_OK)
        return LMS_EXIT_FAIL;
    int status = lms_cli_model_chat_init(cmd, &o, &cm);
    if (status != LMS_EXIT_OK)
        goto out;
    int rc;
    if (resume && (rc = lms_engine_session_load(cm.eng, cm.st, resume))) {
        status = lms_cli_fail(cmd, rc, resume);
        goto out;
    }
    const bool tty = isatty(STDIN_FILENO);
    const char *hist = NULL;
    lms_cli_gen_sampling(cmd, &cm, &o);
    if (tty) {
        fprintf(stderr, "chat with %s (%s format); /help for commands, Ctrl-D to leave\n", o.model,
                lms_chat_format_name(cm.fmt));
        rl_readline_name = "lmstore";
        using_history();
        stifle_history(1000);
        if ((hist = history_path()))
            (void)read_history(hist);
    }

    char *line = NULL;
    int turn = 0;
    status = LMS_EXIT_OK;
    for (;;) {
        free(line);
        if (!(line = read_line(tty, hist)))
            break;
        const char *a;
        size_t n;
        if (line[0] == '\0')
            continue;
        if (!strcmp(line, "/quit") || !strcmp(line, "/exit") || !strcmp(line, "/bye"))
            break;
        if (!strcmp(line, "/help") || !strcmp(line, "/?")) {
            fputs(commands_help, stderr);
            continue;
        }
        if (!strcmp(line, "/reset")) {
            lms_engine_reset(cm.eng);
            fprintf(stderr, "conversation reset\n");
            continue;
        }
        if ((a = arg_of(line, "/save"))) {
            if (!*a) {
                fprintf(stderr, "usage: /save NAME\n");
            } else if (!lms_cli_session_name_ok(cmd, a)) {
                status = LMS_EXIT_FAIL;
            } else if ((rc = lms_engine_session_save(cm.eng, cm.st, a))) {
                lms_cli_fail(cmd, rc, a);
                status = LMS_EXIT_FAIL;
            } else {
                (void)lms_engine_tokens(cm.eng, &n);
                fprintf(stderr, "saved session '%s' (%zu tokens)\n", a, n);
            }
            continue;
        }
        if ((a = arg_of(line, "/load"))) {
            if (!*a) {
                fprintf(stderr, "usage: /load NAME\n");
            } else if ((rc = lms_engine_session_load(cm.eng, cm.st, a))) {
                lms_cli_fail(cmd, rc, a);
                status = LMS_EXIT_FAIL;
            } else {
                (void)lms_engine_tokens(cm.eng, &n);
                fprintf(stderr, "loaded session '%s' (%zu tokens)\n", a, n);
            }
            continue;
        }
        if (line[0] == '/' && line[1] != '/' && line[1] != ' ' && line[1]) {
            fprintf(stderr, "unknown command '%s' (/help lists them; start a message with // to send a "
                            "literal /)\n", line);
            continue;
        }
        const char *msg = line[0] == '/' && line[1] == '/' ? line + 1 : line;

        int32_t *ids = NULL, *prompt = NULL;
        size_t n_ids = 0;
        lms_cli_gen_result res = {0};
        const int32_t *seq = lms_engine_tokens(cm.eng, &n);
        if ((rc = lms_cli_chat_turn_ids(&cm, &o, msg, &ids, &n_ids)))
            goto turn_fail;
        if (!(prompt = malloc((n + n_ids + 1) * sizeof *prompt))) {
            rc = LMS_ENOMEM;
            goto turn_fail;
        }
        memcpy(prompt, seq, n * sizeof *prompt);
        memcpy(prompt + n, ids, n_ids * sizeof *prompt);
        /* Ctrl-C during a reply stops the reply (the conversation keeps what
         * was generated); at the prompt it ends the program as usual. */
        lms_cli_sigint_catch();
        rc = lms_cli_generate(&cm, &o, true, prompt, n + n_ids, json ? NULL : stdout, &res);
        lms_cli_sigint_restore();
        if (rc)
            goto turn_fail;
        turn++;
        if (json) {
            printf("{\"turn\": %d, \"prompt_ids\": ", turn);
            lms_cli_json_ids(stdout, ids, n_ids);
            fputs(", \"ids\": ", stdout);
            lms_cli_json_ids(stdout, res.ids, res.n_ids);
            fputs(", \"text\": ", stdout);
            lms_cli_json_str(stdout, res.text, res.len);
            fputs(", \"metrics\": ", stdout);
            lms_cli_json_metrics(stdout, &res.metrics);
            fputs("}\n", stdout);
        } else {
            fputc('\n', stdout);
            lms_cli_print_metrics(stderr, &res.metrics);
        }
        fflush(stdout);
        goto turn_done;
    turn_fail:
        if (!json)
            fputc('\n', stdout);
        lms_cli_fail(cmd, rc, NULL); /* engine messages name the model */
        if (rc == LMS_ENOSPACE)
            fprintf(stderr, "(/reset starts a new conversation; --ctx N sets the context length)\n");
        status = LMS_EXIT_FAIL;
    turn_done:
        lms_cli_gen_result_free(&res);
        lms_tokenizer_buf_free(ids);
        free(prompt);
    }
    free(line);
out:
    lms_cli_model_close(&cm);
    return status;
}
