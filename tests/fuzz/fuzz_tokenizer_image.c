/*
 * tests/fuzz/fuzz_tokenizer_image.c - libFuzzer target for the compiled
 * tokenizer loader (tokenizer/tok_compiled.c): images are stored files, and
 * every stored file is untrusted.
 *
 * Input: an image (seeds: the images of the fuzz_tokenizer_load seeds).
 * Opening may fail, never crash; a tokenizer that opens must encode texts
 * to ids inside its vocabulary, decode any ids to valid UTF-8, answer
 * lookups, and compile to an image that opens again.
 */
#include <assert.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "lmstore/tokenizer.h"

static void exercise(const lms_tokenizer *t)
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
                continue;
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
    exercise(t);
    void *again;
    size_t n;
    if (lms_tokenizer_compile(t, &again, &n) == 0) {
        lms_tokenizer *u = NULL;
        if (lms_tokenizer_open_image(again, n, &u) == 0) {
            exercise(u);
            lms_tokenizer_free(u);
        }
        lms_tokenizer_buf_free(again);
    }
    lms_tokenizer_free(t);
    free(img);
    return 0;
}
