/*
 * tests/tools/consumer/consumer.c - a program outside the project that uses
 * an installed (or add_subdirectory'd) liblmstore through its public header
 * only, as the README's library example does: open a store and a model,
 * create an engine, tokenize a prompt and generate a few tokens.
 *   consumer STORE MODEL    prints the generated text, then "consumer: ok"
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <lmstore/lmstore.h>

static int put(void *user, int32_t id, const char *piece, size_t len)
{
    (void)id;
    (*(size_t *)user)++;
    fwrite(piece, 1, len, stdout);
    return 0;
}

static int fail(const char *what, int rc)
{
    fprintf(stderr, "consumer: %s: %s (%s)\n", what, lms_strerror(rc), lms_last_error());
    return 1;
}

int main(int argc, char **argv)
{
    if (argc != 3) {
        fprintf(stderr, "usage: consumer STORE MODEL\n");
        return 2;
    }
    lms_store *st = NULL;
    lms_model *m = NULL;
    lms_engine *e = NULL;
    int32_t *ids = NULL;
    size_t n = 0, pieces = 0;
    int rc, status = 1;
    const char *prompt = "The capital of France is";
    lms_gen_params gp;
    if ((rc = lms_store_open(argv[1], LMS_STORE_RDONLY, NULL, &st)))
        return fail("open store", rc);
    if ((rc = lms_model_open(st, argv[2], NULL, &m))) {
        fail("open model", rc);
        goto out;
    }
    if ((rc = lms_engine_create(m, NULL, &e))) {
        fail("create engine", rc);
        goto out;
    }
    if ((rc = lms_engine_default_gen_params(e, &gp))) { /* the model's sampling defaults */
        fail("sampling defaults", rc);
        goto out;
    }
    gp.max_tokens = 4;
    if ((rc = lms_tokenizer_encode(lms_engine_tokenizer(e), prompt, strlen(prompt), LMS_TOK_ADD_SPECIAL, &ids,
                                   &n))) {
        fail("encode", rc);
        goto out;
    }
    if ((rc = lms_generate(e, &gp, ids, n, put, &pieces, NULL))) {
        fail("generate", rc);
        goto out;
    }
    printf("\nconsumer: ok (%zu prompt tokens, %zu pieces)\n", n, pieces);
    status = 0;
out:
    lms_tokenizer_buf_free(ids);
    lms_engine_free(e);
    lms_model_close(m);
    lms_store_close(st);
    return status;
}
