/*
 * tests/fuzz/fuzz_tokenizer_load.c - libFuzzer target for the tokenizer.json
 * loader (tokenizer/tok_load.c): tokenizer files come with downloaded
 * models and are untrusted.
 *
 * Input: a tokenizer.json text. Loading may fail, never crash; a tokenizer
 * that loads must encode a few texts to ids inside its vocabulary and decode
 * any ids to valid UTF-8.
 */
#include <assert.h>
#include <string.h>

#include "common/common.h"
#include "lmstore/tokenizer.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    lms_tokenizer *t = NULL;
    if (lms_tokenizer_load((const char *)data, size, NULL, &t) != 0) {
        assert(t == NULL);
        return 0;
    }
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
    lms_tokenizer_free(t);
    return 0;
}
