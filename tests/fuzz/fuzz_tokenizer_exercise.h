/*
 * tests/fuzz/fuzz_tokenizer_exercise.h - what the tokenizer fuzz targets do
 * with a tokenizer that loaded (fuzz_tokenizer_load.c from tokenizer.json,
 * fuzz_tokenizer_image.c from a compiled image): encode a few texts in every
 * mode to ids inside its vocabulary, decode them and arbitrary ids to valid
 * UTF-8, and answer lookups. Included by each target.
 */
#ifndef LMS_FUZZ_TOKENIZER_EXERCISE_H
#define LMS_FUZZ_TOKENIZER_EXERCISE_H

#include <assert.h>
#include <string.h>

#include "common/common.h"
#include "lmstore/tokenizer.h"

static void fuzz_exercise_tokenizer(const lms_tokenizer *t)
{
    static const char *const texts[] = {"", "hello world", "  a\tb\n\nc  ", "don't 123456 \xC3\xA9\xE2\x96\x81x",
                                        "<s>[x] ab ab</s>", "\xF0\x9F\x98\x80\xE6\x97\xA5\x00z"};
    size_t vs = lms_tokenizer_vocab_size(t);
    for (size_t k = 0; k < sizeof texts / sizeof texts[0]; k++) {
        for (unsigned flags = 0; flags < 4; flags++) {
            int32_t *ids;
            size_t n;
            size_t len = k == 5 ? 9 : strlen(texts[k]);
            if (lms_tokenizer_encode(t, texts[k], len, flags, &ids, &n) != 0)
                continue; /* e.g. a regex over its match limit */
            for (size_t i = 0; i < n; i++)
                assert(ids[i] >= 0 && (size_t)ids[i] < vs);
            char *text;
            size_t tl;
            if (lms_tokenizer_decode(t, ids, n, flags & 1, &text, &tl) == 0) {
                assert(lms__utf8_valid(text, tl));
                lms_tokenizer_buf_free(text);
            }
            lms_tokenizer_buf_free(ids);
        }
    }
    int32_t any[] = {0, 1, 2, -1, 7, 100000, 3, 5};
    char *text;
    size_t tl;
    if (lms_tokenizer_decode(t, any, 8, false, &text, &tl) == 0) {
        assert(lms__utf8_valid(text, tl));
        lms_tokenizer_buf_free(text);
    }
    for (size_t i = 0; i < 8; i++) {
        const char *s = lms_tokenizer_id_to_token(t, any[i]);
        if (s)
            (void)strlen(s);
        (void)lms_tokenizer_is_special(t, any[i]);
    }
    (void)lms_tokenizer_token_to_id(t, "ab");
    (void)lms_tokenizer_token_to_id(t, "<s>");
}

#endif
