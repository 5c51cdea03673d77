/*
 * bench/bench_tokenizer_open.c - what opening a stored model's tokenizer
 * costs: lms_store_tokenizer (the compiled image, mapped and opened in
 * place) against parsing the stored tokenizer.json (+ tokenizer_config.json)
 * as models imported before images existed are read, each followed by one
 * short encode (its lookups fault the image's pages they touch).
 *
 *   bench_tokenizer_open STORE MODEL [--reps R]
 *
 * The store's files are read once before timing (page cache warm). Prints
 * one JSON object: medians with min and max, in milliseconds.
 * bench/bench_tokenizer_open.sh makes the model (the Gemma 3 tokenizer) and
 * runs this.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "lmstore/store.h"
#include "lmstore/tokenizer.h"

static const char TEXT[] = "The capital of France is Paris. Quelle heure est-il ? 日本語 123456";

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

/* One open and one encode: ms of each. */
static int once(lms_store *st, const char *model, bool image, double *open_ms, double *enc_ms, size_t *vocab)
{
    lms_tokenizer *t = NULL;
    double t0 = lms__now();
    int rc;
    if (image) {
        rc = lms_store_tokenizer(st, model, &t);
    } else {
        void *j = NULL, *c = NULL;
        size_t jn, cn;
        rc = lms_store_file(st, model, "tokenizer.json", &j, &jn);
        if (!rc && lms_store_file(st, model, "tokenizer_config.json", &c, &cn))
            c = NULL;
        if (!rc)
            rc = lms_tokenizer_load(j, jn, c, &t);
        lms_free(j);
        lms_free(c);
    }
    double t1 = lms__now();
    if (rc)
        return rc;
    int32_t *ids;
    size_t n;
    rc = lms_tokenizer_encode(t, TEXT, sizeof TEXT - 1, LMS_TOK_ADD_SPECIAL, &ids, &n);
    double t2 = lms__now();
    lms_tokenizer_buf_free(ids);
    *vocab = lms_tokenizer_vocab_size(t);
    lms_tokenizer_free(t);
    *open_ms = (t1 - t0) * 1e3;
    *enc_ms = (t2 - t1) * 1e3;
    return rc;
}

int main(int argc, char **argv)
{
    int reps = 20;
    if (argc < 3) {
        fprintf(stderr, "usage: bench_tokenizer_open STORE MODEL [--reps R]\n");
        return 2;
    }
    if (argc == 5 && !strcmp(argv[3], "--reps"))
        reps = atoi(argv[4]) > 0 ? atoi(argv[4]) : reps;
    lms_store *st;
    if (lms_store_open(argv[1], LMS_STORE_RDONLY, NULL, &st)) {
        fprintf(stderr, "%s\n", lms_last_error());
        return 1;
    }
    printf("{\"model\": \"%s\", \"reps\": %d", argv[2], reps);
    for (int image = 1; image >= 0; image--) {
        int r = image ? reps : LMS_MAX(3, reps / 5); /* parsing takes a second */
        double *o = calloc((size_t)r, sizeof *o), *e = calloc((size_t)r, sizeof *e), warm, warm_e;
        size_t vocab = 0;
        if (once(st, argv[2], image, &warm, &warm_e, &vocab)) { /* page cache warm */
            fprintf(stderr, "%s\n", lms_last_error());
            return 1;
        }
        for (int i = 0; i < r; i++)
            if (once(st, argv[2], image, &o[i], &e[i], &vocab)) {
                fprintf(stderr, "%s\n", lms_last_error());
                return 1;
            }
        qsort(o, (size_t)r, sizeof *o, cmp_d);
        qsort(e, (size_t)r, sizeof *e, cmp_d);
        printf(", \"%s\": {\"vocab\": %zu, \"reps\": %d, \"open_ms_median\": %.3f, \"open_ms_min\": %.3f, "
               "\"open_ms_max\": %.3f, \"first_encode_ms_median\": %.3f}",
               image ? "image" : "json", vocab, r, o[r / 2], o[0], o[r - 1], e[r / 2]);
        free(o);
        free(e);
    }
    printf("}\n");
    lms_store_close(st);
    return 0;
}
