/*
 * tools/cmd_detokenize.c - `lmstore detokenize`: token ids -> text with a
 * model's tokenizer (from the store) or a tokenizer.json file. --stream runs
 * the ids through the streaming detokenizer instead of one decode call (the
 * output must be the same); --jsonl decodes one JSON array of ids per input
 * line into one JSON string per output line.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lmstore/tokenizer.h"
#include "tools/cli.h"

const char lms_cmd_detokenize_help[] = "token ids -> text: detokenize (MODEL | --tokenizer FILE) --ids 1,2,3";

int lms_cli_tokenizer_open(const char *cmd, const char *model, const char *tok_file, const char *cfg_file,
                           const char *store_opt, lms_tokenizer **out);

/* Parse "1,2,3", "1 2 3" or "[1, 2, 3]" into a new array. */
static int parse_ids(const char *s, size_t n, int32_t **ids, size_t *count)
{
    size_t cap = 16, k = 0;
    int32_t *a = malloc(cap * sizeof *a);
    const char *p = s, *end = s + n;
    if (!a)
        return -1;
    while (p < end) {
        while (p < end && (*p == ',' || *p == ' ' || *p == '\t' || *p == '[' || *p == ']' || *p == '\r'))
            p++;
        if (p >= end)
            break;
        char *e;
        errno = 0;
        long v = strtol(p, &e, 10);
        if (e == p || errno || v < INT32_MIN || v > INT32_MAX || e > end) {
            free(a);
            return -1;
        }
        if (k == cap) {
            int32_t *na = realloc(a, (cap *= 2) * sizeof *a);
            if (!na) {
                free(a);
                return -1;
            }
            a = na;
        }
        a[k++] = (int32_t)v;
        p = e;
    }
    *ids = a;
    *count = k;
    return 0;
}

static void print_json_string(FILE *o, const char *s, size_t n)
{
    fputc('"', o);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"' || c == '\\')
            fprintf(o, "\\%c", c);
        else if (c == '\n')
            fputs("\\n", o);
        else if (c == '\r')
            fputs("\\r", o);
        else if (c == '\t')
            fputs("\\t", o);
        else if (c < 0x20 || c == 0x7F)
            fprintf(o, "\\u%04x", c);
        else
            fputc(c, o);
    }
    fputc('"', o);
}

/* Decode with one call, or through the streaming detokenizer. */
static int decode(const lms_tokenizer *tok, const int32_t *ids, size_t n, bool skip, bool stream, char **text,
                  size_t *len)
{
    if (!stream)
        return lms_tokenizer_decode(tok, ids, n, skip, text, len);
    lms_detokenizer *d;
    int rc = lms_detokenizer_create(tok, skip, &d);
    if (rc)
        return rc;
    size_t cap = 256, k = 0;
    char *buf = malloc(cap);
    for (size_t i = 0; i <= n && buf && !rc; i++) {
        const char *piece;
        size_t pn;
        rc = i < n ? lms_detokenizer_push(d, ids[i], &piece, &pn) : lms_detokenizer_flush(d, &piece, &pn);
        if (rc)
            break;
        while (k + pn + 1 > cap) {
            char *nb = realloc(buf, cap *= 2);
            if (!nb) {
                free(buf);
                buf = NULL;
                break;
            }
            buf = nb;
        }
        if (buf) {
            memcpy(buf + k, piece, pn);
            k += pn;
        }
    }
    lms_detokenizer_free(d);
    if (!buf)
        return LMS_ENOMEM;
    if (rc) {
        free(buf);
        return rc;
    }
    buf[k] = '\0';
    *text = buf;
    *len = k;
    return 0;
}

/* Every id must name a token: the library skips unknown ids as HF's decode
 * does, but an id a user typed that names nothing is a mistake to report.
 * line: 0 for --ids, else the --jsonl line. */
static bool ids_known(const lms_tokenizer *tok, const char *what, const int32_t *ids, size_t n, size_t line)
{
    for (size_t i = 0; i < n; i++) {
        if (lms_tokenizer_id_to_token(tok, ids[i]))
            continue;
        char where[64] = "";
        if (line)
            snprintf(where, sizeof where, " on line %zu", line);
        fprintf(stderr,
                "lmstore detokenize: error: id %d (at %zu%s) is outside the vocabulary of %s (%zu ids: 0 to %zu)\n",
                (int)ids[i], i, where, what, lms_tokenizer_vocab_size(tok), lms_tokenizer_vocab_size(tok) - 1);
        return false;
    }
    return true;
}

int lms_cmd_detokenize(int argc, char **argv)
{
    const char *store_opt = NULL, *tok_file = NULL, *cfg_file = NULL, *ids_opt = NULL, *file = NULL, *model = NULL;
    bool skip = false, json = false, jsonl = false, stream = false;
    for (int i = 1; i < argc;) {
        if (lms_cli_end_of_options(argv, &i))
            continue;
        if (lms_cli_opt(argc, argv, &i, "--store", &store_opt) || lms_cli_opt(argc, argv, &i, "--tokenizer", &tok_file) ||
            lms_cli_opt(argc, argv, &i, "--config", &cfg_file) || lms_cli_opt(argc, argv, &i, "--ids", &ids_opt) ||
            lms_cli_opt(argc, argv, &i, "--file", &file))
            continue;
        if (lms_cli_flag(argv, i, "--help") || lms_cli_flag(argv, i, "-h")) {
            printf("usage: lmstore detokenize (MODEL | --tokenizer FILE [--config FILE]) (--ids 1,2,3 | --jsonl [--file F])\n"
                   "                          [--skip-special] [--stream] [--json] [--store DIR]\n"
                   "  --skip-special  leave out special tokens\n"
                   "  --stream        decode through the streaming detokenizer, one id at a time\n"
                   "  --json          print {\"text\": \"...\"}\n"
                   "  --jsonl         input: one JSON array of ids per line; output: one JSON string per line\n");
            return LMS_EXIT_OK;
        }
        if (lms_cli_flag(argv, i, "--skip-special")) skip = true;
        else if (lms_cli_flag(argv, i, "--json")) json = true;
        else if (lms_cli_flag(argv, i, "--jsonl")) jsonl = true;
        else if (lms_cli_flag(argv, i, "--stream")) stream = true;
        else if (lms_cli_is_option(argv[i]))
            return lms_cli_usage("detokenize", "unknown option %s", argv[i]);
        else if (model)
            return lms_cli_usage("detokenize", "too many arguments");
        else
            model = argv[i];
        i++;
    }
    if (!model == !tok_file)
        return lms_cli_usage("detokenize", "wants a MODEL or --tokenizer FILE (one of them)");
    if (!ids_opt == !jsonl)
        return lms_cli_usage("detokenize", "wants --ids LIST or --jsonl");

    lms_tokenizer *tok;
    int status = lms_cli_tokenizer_open("detokenize", model, tok_file, cfg_file, store_opt, &tok);
    if (status)
        return status;
    char *buf = NULL;
    if (ids_opt) {
        int32_t *ids;
        size_t n, len;
        char *text;
        if (parse_ids(ids_opt, strlen(ids_opt), &ids, &n)) {
            status = lms_cli_usage("detokenize", "--ids wants integers separated by commas");
            goto out;
        }
        if (!ids_known(tok, model ? model : tok_file, ids, n, 0)) {
            free(ids);
            status = LMS_EXIT_FAIL;
            goto out;
        }
        int rc = decode(tok, ids, n, skip, stream, &text, &len);
        free(ids);
        if (rc) {
            status = lms_cli_fail("detokenize", rc, "decoding");
            goto out;
        }
        if (json) {
            fputs("{\"text\": ", stdout);
            print_json_string(stdout, text, len);
            fputs("}\n", stdout);
        } else {
            fwrite(text, 1, len, stdout);
            fputc('\n', stdout);
        }
        if (stream)
            free(text);
        else
            lms_tokenizer_buf_free(text);
    } else {
        FILE *f = file ? fopen(file, "rb") : stdin;
        if (!f) {
            fprintf(stderr, "lmstore detokenize: error: %s: %s\n", file, strerror(errno));
            status = LMS_EXIT_FAIL;
            goto out;
        }
        size_t cap = 1 << 16, len = 0;
        buf = malloc(cap);
        for (size_t r; buf && (r = fread(buf + len, 1, cap - len - 1, f)) > 0;) {
            len += r;
            if (cap - len < 2) {
                char *nb = realloc(buf, cap *= 2);
                if (!nb) {
                    free(buf);
                    buf = NULL;
                }
                buf = nb;
            }
        }
        if (file)
            fclose(f);
        if (!buf) {
            status = lms_cli_fail("detokenize", -2, "reading the input");
            goto out;
        }
        size_t lineno = 0;
        for (char *p = buf, *end = buf + len; p < end; lineno++) {
            char *nl = memchr(p, '\n', (size_t)(end - p));
            size_t ln = nl ? (size_t)(nl - p) : (size_t)(end - p), n, tl;
            int32_t *ids;
            char *text;
            if (parse_ids(p, ln, &ids, &n)) {
                fprintf(stderr, "lmstore detokenize: error: line %zu is not a list of ids\n", lineno + 1);
                status = LMS_EXIT_FAIL;
                goto out;
            }
            if (!ids_known(tok, model ? model : tok_file, ids, n, lineno + 1)) {
                free(ids);
                status = LMS_EXIT_FAIL;
                goto out;
            }
            int rc = decode(tok, ids, n, skip, stream, &text, &tl);
            free(ids);
            if (rc) {
                status = lms_cli_fail("detokenize", rc, "decoding");
                goto out;
            }
            print_json_string(stdout, text, tl);
            fputc('\n', stdout);
            if (stream)
                free(text);
            else
                lms_tokenizer_buf_free(text);
            p = nl ? nl + 1 : end;
        }
    }
    /* a failed write to stdout is reported as every command's (tools/main.c) */
out:
    free(buf);
    lms_tokenizer_free(tok);
    return status;
}
