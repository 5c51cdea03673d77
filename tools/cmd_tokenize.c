/*
 * tools/cmd_tokenize.c - `lmstore tokenize`: text -> token ids with a model's
 * tokenizer (from the store) or a tokenizer.json file. --jsonl encodes many
 * strings in one process (one JSON string per input line, one JSON array of
 * ids per output line), which is how the tests compare against HF
 * tokenizers on thousands of strings.
 *
 * Also defines lms_cli_tokenizer_open, shared with cmd_detokenize.c.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lmstore/store.h"
#include "lmstore/tokenizer.h"
#include "tools/cli.h"

const char lms_cmd_tokenize_help[] = "text -> token ids: tokenize (MODEL | --tokenizer FILE) [--text T | --file F]";

int lms_cli_tokenizer_open(const char *cmd, const char *model, const char *tok_file, const char *cfg_file,
                           const char *store_opt, lms_tokenizer **out);

/* Load from --tokenizer FILE [--config FILE], or MODEL's tokenizer from the
 * store (its compiled image, else tokenizer.json + tokenizer_config.json +
 * chat_template.jinja: lms_store_tokenizer). Returns an exit status (0 = ok)
 * after printing the error. */
int lms_cli_tokenizer_open(const char *cmd, const char *model, const char *tok_file, const char *cfg_file,
                           const char *store_opt, lms_tokenizer **out)
{
    int rc;
    *out = NULL;
    if (tok_file) {
        rc = lms_tokenizer_load_file(tok_file, cfg_file, out);
        return rc ? lms_cli_fail(cmd, rc, NULL) : 0;
    }
    lms_store *st;
    rc = lms_store_open(lms_cli_store_path(store_opt), LMS_STORE_RDONLY, NULL, &st);
    if (rc)
        return lms_cli_fail(cmd, rc, "opening the store");
    rc = lms_store_tokenizer(st, model, out);
    lms_store_close(st);
    return rc ? lms_cli_fail(cmd, rc, NULL) : 0;
}

/* ---- JSON strings (cJSON stops at "\u0000"; tokenizer input may hold NULs) ---- */

static int hex4(const char *p, unsigned *v)
{
    *v = 0;
    for (int i = 0; i < 4; i++) {
        char c = p[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0)
            return -1;
        *v = *v << 4 | (unsigned)d;
    }
    return 0;
}

static size_t put_utf8(char *o, unsigned cp)
{
    if (cp < 0x80) { o[0] = (char)cp; return 1; }
    if (cp < 0x800) { o[0] = (char)(0xC0 | cp >> 6); o[1] = (char)(0x80 | (cp & 0x3F)); return 2; }
    if (cp < 0x10000) {
        o[0] = (char)(0xE0 | cp >> 12); o[1] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    o[0] = (char)(0xF0 | cp >> 18); o[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    o[2] = (char)(0x80 | ((cp >> 6) & 0x3F)); o[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

/* Decode the JSON string literal in line (surrounding whitespace allowed)
 * into out (in place is fine: the output is never longer). */
static int json_string(const char *line, size_t n, char *out, size_t *out_n)
{
    size_t i = 0, o = 0;
    while (i < n && (line[i] == ' ' || line[i] == '\t' || line[i] == '\r'))
        i++;
    if (i >= n || line[i++] != '"')
        return -1;
    while (i < n && line[i] != '"') {
        char c = line[i++];
        if (c != '\\') {
            out[o++] = c;
            continue;
        }
        if (i >= n)
            return -1;
        c = line[i++];
        unsigned cp, lo;
        switch (c) {
        case '"': case '\\': case '/': out[o++] = c; break;
        case 'b': out[o++] = '\b'; break;
        case 'f': out[o++] = '\f'; break;
        case 'n': out[o++] = '\n'; break;
        case 'r': out[o++] = '\r'; break;
        case 't': out[o++] = '\t'; break;
        case 'u':
            if (i + 4 > n || hex4(line + i, &cp))
                return -1;
            i += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF) {
                if (i + 6 > n || line[i] != '\\' || line[i + 1] != 'u' || hex4(line + i + 2, &lo) || lo < 0xDC00 ||
                    lo > 0xDFFF)
                    return -1;
                i += 6;
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
            } else if (cp >= 0xDC00 && cp <= 0xDFFF)
                return -1;
            o += put_utf8(out + o, cp);
            break;
        default: return -1;
        }
    }
    if (i >= n)
        return -1;
    *out_n = o;
    return 0;
}

static char *read_all(FILE *f, size_t *len)
{
    size_t cap = 1 << 16, n = 0;
    char *buf = malloc(cap);
    while (buf) {
        size_t r = fread(buf + n, 1, cap - n - 1, f);
        n += r;
        if (r == 0)
            break;
        if (cap - n < 2) {
            char *nb = realloc(buf, cap * 2);
            if (!nb) {
                free(buf);
                return NULL;
            }
            buf = nb;
            cap *= 2;
        }
    }
    if (buf)
        buf[n] = '\0';
    *len = n;
    return buf;
}

static void print_ids(FILE *o, const int32_t *ids, size_t n, bool json_obj, bool json_arr)
{
    if (json_obj)
        fputs("{\"ids\": [", o);
    else if (json_arr)
        fputc('[', o);
    for (size_t i = 0; i < n; i++)
        fprintf(o, i ? (json_obj || json_arr ? ", %d" : " %d") : "%d", ids[i]);
    fputs(json_obj ? "]}\n" : json_arr ? "]\n" : "\n", o);
}

int lms_cmd_tokenize(int argc, char **argv)
{
    const char *store_opt = NULL, *tok_file = NULL, *cfg_file = NULL, *text = NULL, *file = NULL, *model = NULL;
    bool special = false, add_special = true, json = false, jsonl = false;
    for (int i = 1; i < argc;) {
        if (lms_cli_end_of_options(argv, &i))
            continue;
        if (lms_cli_opt(argc, argv, &i, "--store", &store_opt) || lms_cli_opt(argc, argv, &i, "--tokenizer", &tok_file) ||
            lms_cli_opt(argc, argv, &i, "--config", &cfg_file) || lms_cli_opt(argc, argv, &i, "--text", &text) ||
            lms_cli_opt(argc, argv, &i, "--file", &file))
            continue;
        if (lms_cli_flag(argv, i, "--help") || lms_cli_flag(argv, i, "-h")) {
            printf("usage: lmstore tokenize (MODEL | --tokenizer FILE [--config FILE]) [--text T | --file F]\n"
                   "                        [--special] [--no-add-special] [--json | --jsonl] [--store DIR]\n"
                   "  Text from --text, --file or stdin. Prints the ids separated by spaces.\n"
                   "  --special         recognise special tokens written in the text (<|im_start|>)\n"
                   "  --no-add-special  do not add what the tokenizer adds (e.g. <bos>)\n"
                   "  --json            print {\"ids\": [...]}\n"
                   "  --jsonl           input: one JSON string per line; output: one [ids] array per line\n");
            return LMS_EXIT_OK;
        }
        if (lms_cli_flag(argv, i, "--special")) special = true;
        else if (lms_cli_flag(argv, i, "--no-add-special")) add_special = false;
        else if (lms_cli_flag(argv, i, "--json")) json = true;
        else if (lms_cli_flag(argv, i, "--jsonl")) jsonl = true;
        else if (lms_cli_is_option(argv[i]))
            return lms_cli_usage("tokenize", "unknown option %s", argv[i]);
        else if (model)
            return lms_cli_usage("tokenize", "too many arguments");
        else
            model = argv[i];
        i++;
    }
    if (!model == !tok_file)
        return lms_cli_usage("tokenize", "wants a MODEL or --tokenizer FILE (one of them)");
    if (text && file)
        return lms_cli_usage("tokenize", "--text and --file exclude each other");
    if (jsonl && text)
        return lms_cli_usage("tokenize", "--jsonl reads --file or stdin");

    lms_tokenizer *tok;
    int st = lms_cli_tokenizer_open("tokenize", model, tok_file, cfg_file, store_opt, &tok);
    if (st)
        return st;
    char *buf = NULL;
    size_t len = 0;
    int status = LMS_EXIT_OK;
    if (text) {
        len = strlen(text);
    } else {
        FILE *f = file ? fopen(file, "rb") : stdin;
        if (!f) {
            fprintf(stderr, "lmstore tokenize: error: %s: %s\n", file, strerror(errno));
            status = LMS_EXIT_FAIL;
            goto out;
        }
        buf = read_all(f, &len);
        if (file)
            fclose(f);
        if (!buf) {
            fprintf(stderr, "lmstore tokenize: error: out of memory reading the input\n");
            status = LMS_EXIT_FAIL;
            goto out;
        }
        text = buf;
    }
    unsigned flags = (special ? LMS_TOK_PARSE_SPECIAL : 0) | (add_special ? LMS_TOK_ADD_SPECIAL : 0);
    if (!jsonl) {
        int32_t *ids;
        size_t n;
        int rc = lms_tokenizer_encode(tok, text, len, flags, &ids, &n);
        if (rc) {
            status = lms_cli_fail("tokenize", rc, "encoding");
            goto out;
        }
        print_ids(stdout, ids, n, json, false);
        lms_tokenizer_buf_free(ids);
    } else {
        size_t lineno = 0;
        for (char *p = buf, *end = buf + len; p < end; lineno++) {
            char *nl = memchr(p, '\n', (size_t)(end - p));
            size_t ln = nl ? (size_t)(nl - p) : (size_t)(end - p), sn;
            if (json_string(p, ln, p, &sn)) {
                fprintf(stderr, "lmstore tokenize: error: line %zu is not a JSON string\n", lineno + 1);
                status = LMS_EXIT_FAIL;
                goto out;
            }
            int32_t *ids;
            size_t n;
            int rc = lms_tokenizer_encode(tok, p, sn, flags, &ids, &n);
            if (rc) {
                char what[64];
                snprintf(what, sizeof what, "line %zu", lineno + 1);
                status = lms_cli_fail("tokenize", rc, what);
                goto out;
            }
            print_ids(stdout, ids, n, false, true);
            lms_tokenizer_buf_free(ids);
            p = nl ? nl + 1 : end;
        }
    }
    /* a failed write to stdout is reported as every command's (tools/main.c) */
out:
    free(buf);
    lms_tokenizer_free(tok);
    return status;
}
