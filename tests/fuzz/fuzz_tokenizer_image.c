/*
 * tests/fuzz/fuzz_tokenizer_image.c - libFuzzer target for the compiled
 * tokenizer loader (tokenizer/tok_compiled.c): images are stored files, and
 * every stored file is untrusted.
 *
 * Input: an image (seeds: the images of the fuzz_tokenizer_load seeds).
 * Opening may fail, never crash; a tokenizer that opens must encode texts
 * to ids inside its vocabulary, decode any ids to valid UTF-8, answer
 * lookups (fuzz_tokenizer_exercise.h), and compile to an image, which is
 * opened and exercised in turn.
 */
#include <assert.h>
#include <stdlib.h>

#include "fuzz_tokenizer_exercise.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    void *img = malloc(size ? size : 1); /* 16-byte aligned, as the loader requires */
    if (!img)
        return 0;
    if (size)
        memcpy(img, data, size);
    lms_tokenizer *t = NULL;
    if (lms_tokenizer_open_image(img, size, &t) != 0) {
        assert(t == NULL);
        free(img);
        return 0;
    }
    fuzz_exercise_tokenizer(t);
    void *again;
    size_t n;
    if (lms_tokenizer_compile(t, &again, &n) == 0) {
        lms_tokenizer *u = NULL;
        if (lms_tokenizer_open_image(again, n, &u) == 0) {
            fuzz_exercise_tokenizer(u);
            lms_tokenizer_free(u);
        }
        lms_tokenizer_buf_free(again);
    }
    lms_tokenizer_free(t);
    free(img);
    return 0;
}
