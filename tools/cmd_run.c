/*
 * tools/cmd_run.c - `lmstore run MODEL [PROMPT]`: generate from a prompt with
 * a model of the store, streaming the text to stdout and ending with a
 * metrics line on stderr (or one JSON object with --json). The prompt is
 * -p TEXT, the words after MODEL, -f FILE, --prompt-ids, or stdin when it is
 * not a terminal. Sessions: the sequence (prompt + reply) can be saved into
 * the store and resumed later, by this or another process, without
 * computing it again. Ctrl-C stops the generation cleanly (metrics printed,
 * session saved, exit status 130); a second Ctrl-C exits at once.
 */
#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "tools/cli.h"
#include "tools/cli_gen.h"

const char lms_cmd_run_help[] = "generate text from a prompt (streaming; sessions; --json)";

static void usage(FILE *f)
{
    fprintf(f,
            "usage: lmstore run MODEL [PROMPT...] [options]\n"
            "       lmstore run MODEL (-p TEXT | -f FILE | --prompt-ids 1,2,3) [options]\n"
            "       echo TEXT | lmstore run MODEL [options]\n"
            "\n"
            "Generates after the prompt and streams the text to stdout; a metrics line\n"
            "(load, prompt and generation speed, reused tokens, peak RSS) goes to stderr.\n"
            "The prompt is the words after MODEL, -p, -f or --prompt-ids; with none of\n"
            "them it is read from stdin when stdin is not a terminal. Sampling follows the\n"
            "model's generation_config.json (greedy without one) unless options say\n"
            "otherwise. Ctrl-C stops the reply (metrics printed, --save-session saved,\n"
            "exit status 130); a second Ctrl-C exits at once.\n"
            "\n"
            "  PROMPT...              the prompt (words joined by spaces); after --, words\n"
            "                         that begin with '-' are prompt too (and MODEL, when\n"
            "                         -- comes before it)\n"
            "  -p, --prompt TEXT      the prompt (tokenized with the model's tokenizer)\n"
            "  -f, --prompt-file F    the prompt is the text of file F\n"
            "  --prompt-ids LIST      the prompt as token ids, comma separated\n"
            "  --chat                 wrap the prompt as a user turn in the model's chat format\n"
            "  --save-session NAME    save the sequence (prompt + reply) into the store\n"
            "  --resume NAME          continue a saved session: the prompt is appended to it\n"
            "                         (with --chat, as the next user turn)\n"
            "  --json                 print one JSON object: prompt_ids, ids, text, metrics\n"
            "%s",
            lms_cli_gen_opts_help);
}

/* Append word to the positional prompt (words joined by spaces). */
static int add_word(char **prompt, const char *word)
{
    size_t a = *prompt ? strlen(*prompt) : 0, b = strlen(word);
    char *p = realloc(*prompt, a + b + 2);
    if (!p)
        return LMS_ENOMEM;
    if (a)
        p[a++] = ' ';
    memcpy(p + a, word, b + 1);
    *prompt = p;
    return 0;
}

static int append_ids(int32_t **dst, size_t *n, const int32_t *src, size_t k)
{
    int32_t *p = realloc(*dst, (*n + k + 1) * sizeof *p);
    if (!p)
        return LMS_ENOMEM;
    memcpy(p + *n, src, k * sizeof *p);
    *dst = p;
    *n += k;
    return 0;
}

int lms_cmd_run(int argc, char **argv)
{
    const char *cmd = "run";
    lms_cli_gen_opts o;
    lms_cli_gen_opts_init(&o);
    const char *text = NULL, *ids_arg = NULL, *save = NULL, *resume = NULL, *prompt_file = NULL;
    char *words = NULL; /* PROMPT... */
    bool chat = false, json = false;

    for (int i = 1; i < argc;) {
        const char *v;
        if (lms_cli_end_of_options(argv, &i))
            continue;
        if (o.model && !lms_cli_is_option(argv[i])) { /* words after MODEL (all of them after --) */
            if (add_word(&words, argv[i++])) {
                free(words);
                return lms_cli_fail(cmd, LMS_ENOMEM, NULL);
            }
        } else if (lms_cli_flag(argv, i, "-h") || lms_cli_flag(argv, i, "--help")) {
            usage(stdout);
            return LMS_EXIT_OK;
        } else if (lms_cli_opt(argc, argv, &i, "-p", &v) || lms_cli_opt(argc, argv, &i, "--prompt", &v)) {
            text = v;
        } else if (lms_cli_opt(argc, argv, &i, "-f", &v) || lms_cli_opt(argc, argv, &i, "--prompt-file", &v)) {
            prompt_file = v;
        } else if (lms_cli_opt(argc, argv, &i, "--prompt-ids", &v)) {
            ids_arg = v;
        } else if (lms_cli_opt(argc, argv, &i, "--save-session", &v)) {
            save = v;
        } else if (lms_cli_opt(argc, argv, &i, "--resume", &v)) {
            resume = v;
        } else if (lms_cli_flag(argv, i, "--chat")) {
            chat = true;
            i++;
        } else if (lms_cli_flag(argv, i, "--json")) {
            json = true;
            i++;
        } else {
            int r = lms_cli_gen_positional(cmd, argc, argv, &i, &o, 0);
            if (r) {
                free(words);
                return r;
            }
        }
    }
    int usage_rc = 0;
    if (!o.model)
        usage_rc = lms_cli_usage(cmd, "which model? (lmstore run MODEL PROMPT)");
    else if ((text != NULL) + (ids_arg != NULL) + (prompt_file != NULL) + (words != NULL) > 1)
        usage_rc = lms_cli_usage(cmd, "give one prompt: words after MODEL, -p, --prompt-file or --prompt-ids");
    else if (chat && ids_arg)
        usage_rc = lms_cli_usage(cmd, "--chat needs a text prompt, not --prompt-ids");
    else if (save && !lms_cli_session_name_ok(cmd, save))
        usage_rc = LMS_EXIT_USAGE;
    if (usage_rc) {
        free(words);
        return usage_rc;
    }
    if (words)
        text = words;
    int32_t *given = NULL;
    size_t n_given = 0;
    if (ids_arg && !lms_cli_parse_ids(ids_arg, &given, &n_given))
        return lms_cli_usage(cmd, "--prompt-ids: '%s' is not a comma-separated list of ids", ids_arg);
    char *file_text = NULL;
    if (prompt_file || (!text && !ids_arg && !isatty(STDIN_FILENO))) {
        /* -f FILE, or the prompt on stdin (`echo hi | lmstore run MODEL`) */
        const char *from = prompt_file ? prompt_file : "/dev/stdin";
        size_t len;
        if (!(file_text = lms_cli_read_file(from, &len))) {
            fprintf(stderr, "lmstore run: error: %s: %s\n", prompt_file ? prompt_file : "stdin", strerror(errno));
            free(words);
            return LMS_EXIT_FAIL;
        }
        if (strlen(file_text) != len) {
            free(file_text);
            free(words);
            fprintf(stderr, "lmstore run: error: %s: the prompt contains a NUL byte\n",
                    prompt_file ? prompt_file : "stdin");
            return LMS_EXIT_FAIL;
        }
        if (!prompt_file && len == 0) { /* empty stdin: no prompt */
            free(file_text);
            file_text = NULL;
        } else {
            text = file_text;
        }
    }
    if (!text && !ids_arg && !resume) {
        free(words);
        return lms_cli_usage(cmd, "no prompt: give it after MODEL, with -p TEXT, --prompt-file F, "
                                  "--prompt-ids LIST or on stdin");
    }

    /* One request, so a context of the tokens it can reach, not the default
     * 4096: the KV cache committed at start-up is then what the request needs
     * (bench/RESULTS.md, cold start). A text never encodes to more than 4
     * tokens per byte (byte fallback after a normalizer) plus the specials
     * the tokenizer adds; a chat template's text and a resumed session are
     * not known yet, so those keep the default, and so do contexts the model
     * may not cover (every supported model covers 2048 positions). */
    if (!o.ctx && !chat && !resume && o.gp.max_tokens > 0) {
        uint64_t need = (given ? n_given : 4 * (uint64_t)strlen(text)) + 64 + (uint64_t)o.gp.max_tokens;
        if (need <= 2048)
            o.ctx_need = (uint32_t)need;
    }

    int status = LMS_EXIT_FAIL, rc;
    int32_t *prompt = NULL, *enc = NULL;
    size_t n_prompt = 0, n_enc = 0;
    lms_cli_gen_result res = {0};
    lms_cli_model cm;
    int store_mode = save ? LMS_CLI_STORE_WRITE : resume ? LMS_CLI_STORE_TRY_WRITE : LMS_CLI_STORE_READ;
    if (lms_cli_model_open(cmd, &o, store_mode, &cm) != LMS_EXIT_OK) {
        free(given);
        free(file_text);
        free(words);
        return LMS_EXIT_FAIL;
    }
    lms_cli_gen_sampling(cmd, &cm, &o);
    if (chat && (status = lms_cli_model_chat_init(cmd, &o, &cm)) != LMS_EXIT_OK)
        goto out;
    status = LMS_EXIT_FAIL;

    if (resume) {
        if ((rc = lms_engine_session_load(cm.eng, cm.st, resume))) {
            lms_cli_fail(cmd, rc, resume);
            goto out;
        }
        size_t n;
        const int32_t *seq = lms_engine_tokens(cm.eng, &n);
        if ((rc = append_ids(&prompt, &n_prompt, seq, n)))
            goto out_rc;
    }
    if (given) {
        rc = append_ids(&prompt, &n_prompt, given, n_given);
    } else if (text && chat) {
        if (!(rc = lms_cli_chat_turn_ids(&cm, &o, text, &enc, &n_enc)))
            rc = append_ids(&prompt, &n_prompt, enc, n_enc);
    } else if (text) {
        /* A fresh prompt gets what the tokenizer adds by default (BOS); a
         * continuation of a session does not. */
        if (!(rc = lms_cli_encode(&cm, text, !resume, &enc, &n_enc)))
            rc = append_ids(&prompt, &n_prompt, enc, n_enc);
    } else {
        rc = 0;
    }
    if (rc)
        goto out_rc;
    if (n_prompt == 0) {
        fprintf(stderr, "lmstore run: error: the prompt is empty (0 tokens)\n");
        goto out;
    }

    lms_cli_sigint_catch();
    rc = lms_cli_generate(&cm, &o, chat, prompt, n_prompt, json ? NULL : stdout, &res);
    if (rc) {
        if (!json)
            fputc('\n', stdout);
        lms_cli_fail(cmd, rc, NULL); /* engine messages name the model */
        goto out;
    }
    if (save) {
        if ((rc = lms_engine_session_save(cm.eng, cm.st, save))) {
            if (!json)
                fputc('\n', stdout);
            lms_cli_fail(cmd, rc, save);
            goto out;
        }
    }
    if (json) {
        fputs("{\"prompt_ids\": ", stdout);
        lms_cli_json_ids(stdout, prompt, n_prompt);
        fputs(", \"ids\": ", stdout);
        lms_cli_json_ids(stdout, res.ids, res.n_ids);
        fputs(", \"text\": ", stdout);
        lms_cli_json_str(stdout, res.text, res.len);
        fputs(", \"metrics\": ", stdout);
        lms_cli_json_metrics(stdout, &res.metrics);
        fputs(", \"sampling\": ", stdout);
        lms_cli_json_sampling(stdout, &o);
        if (save) {
            fputs(", \"session\": ", stdout);
            lms_cli_json_str(stdout, save, strlen(save));
        }
        fputs("}\n", stdout);
    } else {
        fputc('\n', stdout);
        fflush(stdout);
        lms_cli_print_metrics(stderr, &res.metrics);
        if (save) {
            size_t n;
            (void)lms_engine_tokens(cm.eng, &n);
            fprintf(stderr, "saved session '%s' (%zu tokens)\n", save, n);
        }
    }
    /* stopped by Ctrl-C: done cleanly, but say so to the shell */
    status = res.metrics.stop_reason == LMS_STOP_CALLBACK && lms_cli_interrupted ? 128 + SIGINT : LMS_EXIT_OK;
    goto out;
out_rc:
    lms_cli_fail(cmd, rc, o.model);
out:
    lms_cli_sigint_restore();
    lms_cli_gen_result_free(&res);
    lms_tokenizer_buf_free(enc);
    free(prompt);
    free(given);
    free(file_text);
    free(words);
    lms_cli_model_close(&cm);
    return status;
}
