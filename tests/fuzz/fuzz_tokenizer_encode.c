/*
 * tests/fuzz/fuzz_tokenizer_encode.c - libFuzzer target for encode, decode
 * and the streaming detokenizer (tokenizer/): prompts are untrusted
 * text, and generated ids reach the detokenizer unchecked.
 *
 * Tokenizers: the real Qwen3, Llama 3 and Gemma 3 files from
 * $LMS_SRC_DIR/tests/fixtures/tokenizers (gzip, unpacked with gzip -dc; the source
 * tree is found from this file's path when LMS_SRC_DIR is unset) and a small
 * built-in one that uses the components the real ones do not (Metaspace,
 * Split behaviors, Replace/Prepend normalizers, Strip decoder, unk).
 *
 * Input: byte 0 picks the tokenizer (bits 0-1) and the flags (bits 2-3);
 * the rest is the text. Valid UTF-8 must encode to ids inside the
 * vocabulary, decode in one call and streamed to the same text, and for
 * Llama 3 (no normalizer) decode back to the input exactly. Invalid UTF-8
 * must be refused with LMS_EINVAL. The second half of the input, read as
 * int32 ids, is also decoded (any ids, in range or not).
 */
#include <assert.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "lmstore/tokenizer.h"

static lms_tokenizer *toks[4];

static const char SMALL[] =
    "{\"model\": {\"type\": \"BPE\", \"unk_token\": \"<unk>\", \"fuse_unk\": true,"
    " \"vocab\": {\"<unk>\": 0, \"a\": 1, \"b\": 2, \"ab\": 3, \"\xe2\x96\x81\": 4, \"\xe2\x96\x81" "ab\": 5, \"c\": 6, \" \": 7},"
    " \"merges\": [[\"a\", \"b\"], [\"\xe2\x96\x81\", \"ab\"]]},"
    " \"normalizer\": {\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFKC\"}, {\"type\": \"Replace\", \"pattern\": {\"Regex\": \"c+\"}, \"content\": \"c\"}]},"
    " \"pre_tokenizer\": {\"type\": \"Sequence\", \"pretokenizers\": ["
    "   {\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\s+|\\\\p{P}\"}, \"behavior\": \"MergedWithNext\", \"invert\": false},"
    "   {\"type\": \"Metaspace\", \"replacement\": \"\xe2\x96\x81\", \"prepend_scheme\": \"first\", \"split\": true}]},"
    " \"post_processor\": {\"type\": \"TemplateProcessing\", \"single\": [{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}, {\"SpecialToken\": {\"id\": \"</s>\", \"type_id\": 0}}],"
    "   \"special_tokens\": {\"</s>\": {\"id\": \"</s>\", \"ids\": [8], \"tokens\": [\"</s>\"]}}},"
    " \"decoder\": {\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Metaspace\", \"replacement\": \"\xe2\x96\x81\", \"prepend_scheme\": \"first\"},"
    "   {\"type\": \"Strip\", \"content\": \" \", \"start\": 1, \"stop\": 1}]},"
    " \"added_tokens\": [{\"id\": 8, \"content\": \"</s>\", \"special\": true},"
    "   {\"id\": 9, \"content\": \"[x]\", \"special\": false, \"lstrip\": true, \"rstrip\": true, \"normalized\": true},"
    "   {\"id\": 10, \"content\": \"ab\", \"special\": false, \"single_word\": true, \"normalized\": false}]}";

static lms_tokenizer *load_gz(const char *dir, const char *name)
{
    char *cmd = lms__asprintf("gzip -dc '%s/%s.tokenizer.json.gz'", dir, name);
    FILE *p = cmd ? popen(cmd, "r") : NULL;
    lms__free(cmd);
    if (!p)
        return NULL;
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap);
    for (size_t r; buf && (r = fread(buf + n, 1, cap - n, p)) > 0;) {
        n += r;
        if (n == cap)
            buf = realloc(buf, cap *= 2);
    }
    pclose(p);
    lms_tokenizer *t = NULL;
    if (buf && n && lms_tokenizer_load(buf, n, NULL, &t) != 0)
        t = NULL;
    free(buf);
    return t;
}

int LLVMFuzzerInitialize(int *argc, char ***argv)
{
    (void)argc;
    (void)argv;
    char dir[4096];
    const char *src = getenv("LMS_SRC_DIR");
    if (src)
        snprintf(dir, sizeof dir, "%s/tests/fixtures/tokenizers", src);
    else {
        snprintf(dir, sizeof dir, "%s", __FILE__); /* .../tests/fuzz/fuzz_tokenizer_encode.c */
        for (int up = 0; up < 3; up++) {
            char *slash = strrchr(dir, '/');
            if (slash)
                *slash = '\0';
        }
        strncat(dir, "/tests/fixtures/tokenizers", sizeof dir - strlen(dir) - 1);
    }
    static const char *const names[] = {"qwen3", "llama3", "gemma3"};
    for (int i = 0; i < 3; i++)
        toks[i] = load_gz(dir, names[i]);
    if (lms_tokenizer_load(SMALL, sizeof SMALL - 1, NULL, &toks[3]) != 0) {
        fprintf(stderr, "fuzz_tokenizer_encode: built-in tokenizer: %s\n", lms_last_error());
        abort();
    }
    return 0;
}

static void decode_both_ways(const lms_tokenizer *t, const int32_t *ids, size_t n, bool skip)
{
    char *text;
    size_t len;
    if (lms_tokenizer_decode(t, ids, n, skip, &text, &len) != 0)
        return; /* allocation failure only */
    assert(strlen(text) <= len && text[len] == '\0');
    assert(lms__utf8_valid(text, len));
    lms_detokenizer *d;
    if (lms_detokenizer_create(t, skip, &d) == 0) {
        char *acc = malloc(len + 64 * (n + 1) + 1);
        size_t k = 0;
        for (size_t i = 0; i <= n; i++) {
            const char *p;
            size_t pn;
            int rc = i < n ? lms_detokenizer_push(d, ids[i], &p, &pn) : lms_detokenizer_flush(d, &p, &pn);
            assert(rc == 0);
            assert(lms__utf8_valid(p, pn));
            if (acc && k + pn <= len + 64 * (n + 1)) {
                memcpy(acc + k, p, pn);
                k += pn;
            }
        }
        /* equal whenever the one-call text holds no replacement character */
        if (acc && !memmem(text, len, "\xEF\xBF\xBD", 3))
            assert(k == len && !memcmp(acc, text, len));
        free(acc);
        lms_detokenizer_free(d);
    }
    lms_tokenizer_buf_free(text);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    lms_tokenizer *t = toks[data[0] & 3];
    if (!t)
        return 0;
    unsigned flags = (data[0] >> 2) & 3;
    const char *text = (const char *)data + 1;
    size_t len = size - 1;
    int32_t *ids;
    size_t n;
    int rc = lms_tokenizer_encode(t, text, len, flags, &ids, &n);
    if (!lms__utf8_valid(text, len)) {
        assert(rc == LMS_EINVAL);
        assert(ids == NULL && n == 0);
    } else {
        assert(rc == 0);
        size_t vs = lms_tokenizer_vocab_size(t);
        for (size_t i = 0; i < n; i++)
            assert(ids[i] >= 0 && (size_t)ids[i] < vs && lms_tokenizer_id_to_token(t, ids[i]));
        if (t == toks[1] && !(flags & LMS_TOK_PARSE_SPECIAL)) { /* Llama 3: lossless */
            char *back;
            size_t blen;
            assert(lms_tokenizer_decode(t, ids, n, true, &back, &blen) == 0);
            assert(blen == len && !memcmp(back, text, len));
            lms_tokenizer_buf_free(back);
        }
        decode_both_ways(t, ids, n, data[0] & 16);
        lms_tokenizer_buf_free(ids);
    }
    /* arbitrary ids */
    size_t half = len / 2 / sizeof(int32_t);
    if (half) {
        int32_t *any = malloc(half * sizeof *any);
        memcpy(any, text + len - half * sizeof *any, half * sizeof *any);
        for (size_t i = 0; i < half; i++)
            if (data[0] & 32)
                any[i] = (int32_t)((uint32_t)any[i] % (uint32_t)(lms_tokenizer_vocab_size(t) + 2)) - 1;
        decode_both_ways(t, any, half, data[0] & 64);
        free(any);
    }
    return 0;
}
