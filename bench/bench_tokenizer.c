/*
 * bench/bench_tokenizer.c - encode throughput of lmstore's tokenizer on one
 * thread, the lmstore half of bench/bench_tokenizer.py (which runs HF
 * tokenizers on the same documents in the same run and compares).
 *
 *   bench_tokenizer TOKENIZER_JSON DOCS_JSONL [--repeat R] [--ids OUT]
 *
 * DOCS_JSONL: one JSON string per line (a document). Each document is
 * encoded with one lms_tokenizer_encode call (no special tokens added or
 * parsed); the loop is timed (wall and CPU time of the process) after the
 * tokenizer is loaded, best of R passes. Prints one JSON object. --ids
 * writes per document the count and sum((i + 1) * id[i]) of its ids, so the
 * driver can check that both tokenizers produced the same ids.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "common/common.h"
#include "lmstore/tokenizer.h"

static double cpu_now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

/* Decode one JSON string literal (the subset json.dumps writes) in place. */
static size_t json_unescape(char *s, size_t n)
{
    size_t o = 0, i = 1; /* skip the opening quote */
    while (i < n && s[i] != '"') {
        char c = s[i++];
        if (c != '\\') {
            s[o++] = c;
            continue;
        }
        c = s[i++];
        switch (c) {
        case 'n': s[o++] = '\n'; break;
        case 't': s[o++] = '\t'; break;
        case 'r': s[o++] = '\r'; break;
        case 'b': s[o++] = '\b'; break;
        case 'f': s[o++] = '\f'; break;
        case 'u': {
            unsigned cp = (unsigned)strtoul((char[5]){s[i], s[i + 1], s[i + 2], s[i + 3], 0}, NULL, 16);
            i += 4;
            if (cp >= 0xD800 && cp <= 0xDBFF && s[i] == '\\' && s[i + 1] == 'u') {
                unsigned lo = (unsigned)strtoul((char[5]){s[i + 2], s[i + 3], s[i + 4], s[i + 5], 0}, NULL, 16);
                cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                i += 6;
            }
            if (cp < 0x80) s[o++] = (char)cp;
            else if (cp < 0x800) { s[o++] = (char)(0xC0 | cp >> 6); s[o++] = (char)(0x80 | (cp & 0x3F)); }
            else if (cp < 0x10000) {
                s[o++] = (char)(0xE0 | cp >> 12); s[o++] = (char)(0x80 | ((cp >> 6) & 0x3F));
                s[o++] = (char)(0x80 | (cp & 0x3F));
            } else {
                s[o++] = (char)(0xF0 | cp >> 18); s[o++] = (char)(0x80 | ((cp >> 12) & 0x3F));
                s[o++] = (char)(0x80 | ((cp >> 6) & 0x3F)); s[o++] = (char)(0x80 | (cp & 0x3F));
            }
            break;
        }
        default: s[o++] = c; break;
        }
    }
    return o;
}

int main(int argc, char **argv)
{
    if (argc < 3) {
        fprintf(stderr, "usage: bench_tokenizer TOKENIZER_JSON DOCS_JSONL [--repeat R] [--ids OUT]\n");
        return 2;
    }
    int repeat = 3;
    const char *ids_out = NULL;
    for (int i = 3; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--repeat"))
            repeat = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--ids"))
            ids_out = argv[i + 1];
    }
    char *text;
    size_t len;
    if (lms__read_file(argv[2], (size_t)1 << 31, &text, &len)) {
        fprintf(stderr, "%s\n", lms_last_error());
        return 1;
    }
    size_t ndocs = 0, cap = 1024, bytes = 0;
    char **doc = malloc(cap * sizeof *doc);
    size_t *dlen = malloc(cap * sizeof *dlen);
    for (char *p = text, *end = text + len; p < end;) {
        char *nl = memchr(p, '\n', (size_t)(end - p));
        size_t ln = nl ? (size_t)(nl - p) : (size_t)(end - p);
        if (ndocs == cap) {
            cap *= 2;
            doc = realloc(doc, cap * sizeof *doc);
            dlen = realloc(dlen, cap * sizeof *dlen);
        }
        doc[ndocs] = p;
        dlen[ndocs] = json_unescape(p, ln);
        bytes += dlen[ndocs++];
        p = nl ? nl + 1 : end;
    }
    double t0 = lms__now();
    lms_tokenizer *tok;
    if (lms_tokenizer_load_file(argv[1], NULL, &tok)) {
        fprintf(stderr, "%s\n", lms_last_error());
        return 1;
    }
    double load_s = lms__now() - t0, best_wall = 1e30, best_cpu = 1e30;
    size_t tokens = 0;
    FILE *idf = ids_out ? fopen(ids_out, "w") : NULL;
    for (int r = 0; r < repeat; r++) {
        tokens = 0;
        double w0 = lms__now(), c0 = cpu_now();
        for (size_t d = 0; d < ndocs; d++) {
            int32_t *ids;
            size_t n;
            if (lms_tokenizer_encode(tok, doc[d], dlen[d], 0, &ids, &n)) {
                fprintf(stderr, "document %zu: %s\n", d, lms_last_error());
                return 1;
            }
            tokens += n;
            if (idf && r == 0) {
                uint64_t h = 0; /* sum of (i + 1) * id: easy to recompute in Python */
                for (size_t i = 0; i < n; i++)
                    h += (uint64_t)(i + 1) * (uint64_t)ids[i];
                fprintf(idf, "%zu %llu\n", n, (unsigned long long)h);
            }
            lms_tokenizer_buf_free(ids);
        }
        double wall = lms__now() - w0, cpu = cpu_now() - c0;
        best_wall = wall < best_wall ? wall : best_wall;
        best_cpu = cpu < best_cpu ? cpu : best_cpu;
        if (idf && r == 0) {
            fclose(idf);
            idf = NULL;
        }
    }
    printf("{\"docs\": %zu, \"bytes\": %zu, \"tokens\": %zu, \"load_s\": %.4f, \"wall_s\": %.4f, \"cpu_s\": %.4f}\n",
           ndocs, bytes, tokens, load_s, best_wall, best_cpu);
    lms_tokenizer_free(tok);
    free(doc);
    free(dlen);
    lms__free(text);
    return 0;
}
