/*
 * tests/fuzz/fuzz_tokenizer_load.c - libFuzzer target for the tokenizer.json
 * loader (tokenizer/tok_load.c): tokenizer files come with downloaded
 * models and are untrusted.
 *
 * Input: a tokenizer.json text. Loading may fail, never crash; a tokenizer
 * that loads must encode a few texts to ids inside its vocabulary and decode
 * any ids to valid UTF-8 (fuzz_tokenizer_exercise.h).
 */
#include <assert.h>

#include "fuzz_tokenizer_exercise.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    lms_tokenizer *t = NULL;
    if (lms_tokenizer_load((const char *)data, size, NULL, &t) != 0) {
        assert(t == NULL);
        return 0;
    }
    fuzz_exercise_tokenizer(t);
    lms_tokenizer_free(t);
    return 0;
}
