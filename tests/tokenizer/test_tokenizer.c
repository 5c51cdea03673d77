/*
 * tests/tokenizer/test_tokenizer.c - lmstore's tokenizer against HuggingFace:
 * the real Qwen3, Llama 3 and Gemma 3 tokenizer.json files
 * ($LMS_SRC_DIR/tests/fixtures/tokenizers) encode the fixture corpus to exactly the
 * ids HF `tokenizers` gave (with and without special tokens, special tokens
 * parsed or not), decode to exactly HF's text (one call and streamed), and
 * render chats exactly as transformers' apply_chat_template
 * (tests/reference/make_tokenizer_fixtures.py -> tests/fixtures/tokenizer/).
 * Plus: streaming holds back split UTF-8, stop strings, load errors naming the
 * component, invalid UTF-8, allocation failures, long runs.
 */
#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "lmstore/tokenizer.h"
#include "testutil.h"

static const char *const NAMES[] = {"qwen3", "llama3", "gemma3"};
/* toks: the tokenizers the HF comparisons run on: first those loaded from
 * tokenizer.json (json_toks), then the same opened from their compiled
 * images (img_toks over images[]), which must give exactly the same ids. */
static lms_tokenizer *toks[3], *json_toks[3], *img_toks[3];
static void *images[3];
static size_t image_len[3];
static cJSON *corpus;

static char *fixture_path(const char *file)
{
    return lms__asprintf("%s/tests/fixtures/tokenizer/%s", lms_test_src(), file);
}

static cJSON *load_json(const char *file)
{
    char *p = fixture_path(file);
    size_t n;
    char *text = lms_test_slurp(p, &n);
    if (!text)
        fail_msg("cannot read %s", p);
    cJSON *j = cJSON_ParseWithLength(text, n);
    if (!j)
        fail_msg("%s: not JSON", p);
    free(text);
    lms__free(p);
    return j;
}

static char *unhex(const char *h, size_t *n)
{
    size_t len = strlen(h) / 2;
    char *s = malloc(len + 1);
    for (size_t i = 0; i < len; i++) {
        unsigned v;
        sscanf(h + 2 * i, "%2x", &v);
        s[i] = (char)v;
    }
    s[len] = '\0';
    *n = len;
    return s;
}

/* gunzip NAME's tokenizer.json and config into a scratch folder and load it */
static lms_tokenizer *load_real(const char *name)
{
    char *dir = lms_test_tmpdir(name);
    char *out = NULL;
    int st = lms_test_sh(&out, "gzip -dc '%s/tests/fixtures/tokenizers/%s.tokenizer.json.gz' > '%s/tokenizer.json' && "
                               "gzip -dc '%s/tests/fixtures/tokenizers/%s.tokenizer_config.json.gz' > '%s/tokenizer_config.json'",
                         lms_test_src(), name, dir, lms_test_src(), name, dir);
    if (st != 0)
        fail_msg("cannot unpack the %s tokenizer: %s", name, out ? out : "");
    free(out);
    char *tj = lms__asprintf("%s/tokenizer.json", dir), *tc = lms__asprintf("%s/tokenizer_config.json", dir);
    lms_tokenizer *t = NULL;
    int rc = lms_tokenizer_load_file(tj, tc, &t);
    if (rc)
        fail_msg("load %s: %s", name, lms_last_error());
    lms__free(tj);
    lms__free(tc);
    free(dir);
    return t;
}

static int setup_json(void **state)
{
    (void)state;
    memcpy(toks, json_toks, sizeof toks);
    return 0;
}

static int setup_images(void **state)
{
    (void)state;
    memcpy(toks, img_toks, sizeof toks);
    return 0;
}

static void expect_ids(const char *what, const char *text, const int32_t *ids, size_t n, const cJSON *ref)
{
    size_t rn = (size_t)cJSON_GetArraySize(ref), i = 0;
    const cJSON *it;
    bool same = rn == n;
    cJSON_ArrayForEach(it, ref)
    {
        if (!same || ids[i] != (int32_t)it->valuedouble) {
            same = false;
            break;
        }
        i++;
    }
    if (!same)
        fail_msg("%s: ids differ from HF for %.60s (got %zu ids, HF %zu; first difference at %zu)", what, text, n, rn, i);
}

static void each_tokenizer_encodes_corpus_like_hf(void **state)
{
    (void)state;
    const cJSON *texts = cJSON_GetObjectItem(corpus, "texts_hex");
    assert_true(cJSON_GetArraySize(texts) >= 200);
    static const struct {
        const char *key;
        unsigned flags;
    } modes[] = {{"ids_add", LMS_TOK_ADD_SPECIAL},
                 {"ids_special", LMS_TOK_ADD_SPECIAL | LMS_TOK_PARSE_SPECIAL},
                 {"ids_plain", 0}};
    for (int t = 0; t < 3; t++) {
        char file[64];
        snprintf(file, sizeof file, "%s.json", NAMES[t]);
        cJSON *ref = load_json(file);
        for (int m = 0; m < 3; m++) {
            const cJSON *refs = cJSON_GetObjectItem(ref, modes[m].key);
            assert_int_equal(cJSON_GetArraySize(refs), cJSON_GetArraySize(texts));
            for (int i = 0; i < cJSON_GetArraySize(texts); i++) {
                size_t len, n;
                char *s = unhex(cJSON_GetArrayItem(texts, i)->valuestring, &len);
                int32_t *ids;
                int rc = lms_tokenizer_encode(toks[t], s, len, modes[m].flags, &ids, &n);
                if (rc)
                    fail_msg("%s: encode failed: %s", NAMES[t], lms_last_error());
                char what[64];
                snprintf(what, sizeof what, "%s %s #%d", NAMES[t], modes[m].key, i);
                expect_ids(what, s, ids, n, cJSON_GetArrayItem(refs, i));
                lms_tokenizer_buf_free(ids);
                free(s);
            }
        }
        cJSON_Delete(ref);
    }
}

static char *stream_decode(const lms_tokenizer *t, const int32_t *ids, size_t n, bool skip, size_t *len)
{
    lms_detokenizer *d;
    assert_int_equal(lms_detokenizer_create(t, skip, &d), 0);
    char *out = malloc(1);
    size_t k = 0;
    for (size_t i = 0; i <= n; i++) {
        const char *p;
        size_t pn;
        assert_int_equal(i < n ? lms_detokenizer_push(d, ids[i], &p, &pn) : lms_detokenizer_flush(d, &p, &pn), 0);
        out = realloc(out, k + pn + 1);
        memcpy(out + k, p, pn);
        k += pn;
    }
    out[k] = '\0';
    lms_detokenizer_free(d);
    *len = k;
    return out;
}

static void each_tokenizer_decodes_like_hf_in_one_call_and_streamed(void **state)
{
    (void)state;
    for (int t = 0; t < 3; t++) {
        char file[64];
        snprintf(file, sizeof file, "%s.json", NAMES[t]);
        cJSON *ref = load_json(file);
        const cJSON *idss = cJSON_GetObjectItem(ref, "ids_special");
        for (int skip = 0; skip < 2; skip++) {
            const cJSON *exp = cJSON_GetObjectItem(ref, skip ? "decode_skip_hex" : "decode_hex");
            for (int i = 0; i < cJSON_GetArraySize(idss); i++) {
                const cJSON *arr = cJSON_GetArrayItem(idss, i), *it;
                size_t n = (size_t)cJSON_GetArraySize(arr), k = 0, len, elen, slen;
                int32_t *ids = malloc((n + 1) * sizeof *ids);
                cJSON_ArrayForEach(it, arr) ids[k++] = (int32_t)it->valuedouble;
                char *text, *e = unhex(cJSON_GetArrayItem(exp, i)->valuestring, &elen);
                assert_int_equal(lms_tokenizer_decode(toks[t], ids, n, skip, &text, &len), 0);
                if (len != elen || memcmp(text, e, len))
                    fail_msg("%s decode #%d (skip=%d) differs from HF: '%.60s' vs '%.60s'", NAMES[t], i, skip, text, e);
                char *st = stream_decode(toks[t], ids, n, skip, &slen);
                if (slen != elen || memcmp(st, e, slen))
                    fail_msg("%s streamed decode #%d (skip=%d) differs from HF", NAMES[t], i, skip);
                free(st);
                lms_tokenizer_buf_free(text);
                free(e);
                free(ids);
            }
        }
        cJSON_Delete(ref);
    }
}

static void chat_formats_render_like_transformers_apply_chat_template(void **state)
{
    (void)state;
    static const lms_chat_format want[] = {LMS_CHAT_CHATML, LMS_CHAT_LLAMA3, LMS_CHAT_GEMMA};
    cJSON *chat = load_json("chat.json");
    for (int t = 0; t < 3; t++) {
        lms_chat_format fmt;
        assert_int_equal(lms_tokenizer_chat_format(toks[t], &fmt), 0);
        assert_int_equal(fmt, want[t]);
        const cJSON *cases = cJSON_GetObjectItem(chat, NAMES[t]), *c;
        assert_true(cJSON_GetArraySize(cases) >= 4);
        cJSON_ArrayForEach(c, cases)
        {
            const cJSON *msgs = cJSON_GetObjectItem(c, "messages"), *m;
            lms_chat_message mm[16];
            size_t n = 0;
            cJSON_ArrayForEach(m, msgs)
            {
                mm[n].role = cJSON_GetObjectItem(m, "role")->valuestring;
                mm[n].content = cJSON_GetObjectItem(m, "content")->valuestring;
                n++;
            }
            unsigned flags = cJSON_IsTrue(cJSON_GetObjectItem(c, "add_generation_prompt")) ? LMS_CHAT_ADD_GENERATION_PROMPT : 0;
            if (cJSON_IsFalse(cJSON_GetObjectItem(c, "enable_thinking")))
                flags |= LMS_CHAT_NO_THINKING;
            char *out;
            assert_int_equal(lms_chat_apply(fmt, mm, n, flags, &out), 0);
            const char *exp = cJSON_GetObjectItem(c, "text")->valuestring;
            if (strcmp(out, exp) != 0)
                fail_msg("%s chat text differs:\n--- ours\n%s\n--- transformers\n%s", NAMES[t], out, exp);
            int32_t *ids;
            size_t nid;
            assert_int_equal(lms_tokenizer_encode(toks[t], out, strlen(out), LMS_TOK_PARSE_SPECIAL, &ids, &nid), 0);
            expect_ids("chat", out, ids, nid, cJSON_GetObjectItem(c, "ids"));
            lms_tokenizer_buf_free(ids);
            lms_tokenizer_buf_free(out);
        }
        /* the family's stop tokens are real tokens of the vocabulary */
        int32_t stops[8];
        int ns = lms_chat_stop_ids(toks[t], fmt, stops, 8);
        assert_true(ns >= 2);
        for (int i = 0; i < ns; i++)
            assert_true(lms_tokenizer_is_special(toks[t], stops[i]));
    }
    cJSON_Delete(chat);
}

static void unknown_chat_template_fails_and_names_the_override(void **state)
{
    (void)state;
    lms_chat_format f;
    assert_int_equal(lms_chat_format_detect("{% for m in messages %}### {{ m.role }}: {{ m.content }}{% endfor %}", &f),
                     LMS_EUNSUPPORTED);
    assert_non_null(strstr(lms_last_error(), "--chat-format"));
    assert_int_equal(lms_chat_format_from_name("Gemma3", &f), 0);
    assert_int_equal(f, LMS_CHAT_GEMMA);
    assert_int_equal(lms_chat_format_from_name("vicuna", &f), LMS_EINVAL);
    assert_non_null(strstr(lms_last_error(), "chatml"));
    /* Gemma's template rejects roles that do not alternate */
    lms_chat_message m[2] = {{"user", "a"}, {"user", "b"}};
    char *out;
    assert_int_equal(lms_chat_apply(LMS_CHAT_GEMMA, m, 2, 1, &out), LMS_EINVAL);
}

static void bos_eos_and_vocab_lookups_match_the_files(void **state)
{
    (void)state;
    assert_int_equal(lms_tokenizer_eos_id(toks[0]), lms_tokenizer_token_to_id(toks[0], "<|im_end|>"));
    assert_int_equal(lms_tokenizer_bos_id(toks[0]), -1);
    assert_int_equal(lms_tokenizer_bos_id(toks[1]), 128000);
    assert_int_equal(lms_tokenizer_bos_id(toks[2]), 2);
    assert_int_equal(lms_tokenizer_eos_id(toks[2]), lms_tokenizer_token_to_id(toks[2], "<end_of_turn>"));
    assert_int_equal(lms_tokenizer_vocab_size(toks[0]), 151669);
    assert_int_equal(lms_tokenizer_vocab_size(toks[1]), 128256);
    assert_int_equal(lms_tokenizer_vocab_size(toks[2]), 262145);
    assert_string_equal(lms_tokenizer_id_to_token(toks[1], 128000), "<|begin_of_text|>");
    assert_int_equal(lms_tokenizer_token_to_id(toks[0], "Ġthe"), 279);
    assert_string_equal(lms_tokenizer_id_to_token(toks[0], 279), "Ġthe");
    assert_null(lms_tokenizer_id_to_token(toks[0], 999999));
    assert_null(lms_tokenizer_id_to_token(toks[0], -5));
    assert_false(lms_tokenizer_is_special(toks[0], 279));
}

static void stream_holds_back_a_character_split_over_byte_tokens(void **state)
{
    (void)state;
    /* Qwen3 (byte-level): "é" is U+00E9 = C3 A9; single-byte tokens 'Ã' and '©' */
    const lms_tokenizer *t = toks[0];
    int32_t b1 = lms_tokenizer_token_to_id(t, "\xC3\x83"), b2 = lms_tokenizer_token_to_id(t, "\xC2\xA9");
    assert_true(b1 >= 0 && b2 >= 0);
    lms_detokenizer *d;
    const char *p;
    size_t n;
    assert_int_equal(lms_detokenizer_create(t, false, &d), 0);
    assert_int_equal(lms_detokenizer_push(d, lms_tokenizer_token_to_id(t, "a"), &p, &n), 0);
    assert_int_equal(n, 1);
    assert_memory_equal(p, "a", 1);
    assert_int_equal(lms_detokenizer_push(d, b1, &p, &n), 0);
    assert_int_equal(n, 0); /* half a character: held back */
    assert_int_equal(lms_detokenizer_push(d, b2, &p, &n), 0);
    assert_int_equal(n, 2);
    assert_memory_equal(p, "\xC3\xA9", 2);
    /* a lone lead byte at the end comes out as U+FFFD on flush */
    assert_int_equal(lms_detokenizer_push(d, b1, &p, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(lms_detokenizer_flush(d, &p, &n), 0);
    assert_int_equal(n, 3);
    assert_memory_equal(p, "\xEF\xBF\xBD", 3);
    lms_detokenizer_free(d);

    /* Gemma (byte fallback): an emoji not in the vocab as <0xF0><0x9F>... */
    const lms_tokenizer *g = toks[2];
    int32_t *ids;
    size_t nid;
    const char *emoji = "\xF0\x9F\xAB\xA8"; /* U+1FAE8, rare enough to be byte tokens */
    assert_int_equal(lms_tokenizer_encode(g, emoji, 4, 0, &ids, &nid), 0);
    assert_int_equal(lms_detokenizer_create(g, false, &d), 0);
    size_t total = 0;
    for (size_t i = 0; i < nid; i++) {
        assert_int_equal(lms_detokenizer_push(d, ids[i], &p, &n), 0);
        if (i + 1 < nid && nid == 4)
            assert_int_equal(n, 0);
        total += n;
    }
    assert_int_equal(total, 4);
    lms_detokenizer_free(d);
    lms_tokenizer_buf_free(ids);
}

static void stop_matcher_holds_back_partial_stop_strings(void **state)
{
    (void)state;
    const char *stops[] = {"<|im_end|>", "\n\nUser:"};
    lms_stop_matcher *m;
    const char *out;
    size_t n;
    bool stopped;
    int which;
    assert_int_equal(lms_stop_matcher_create(stops, 2, &m), 0);
    assert_int_equal(lms_stop_matcher_push(m, "Hello <|i", 9, &out, &n, &stopped, &which), 0);
    assert_int_equal(n, 6);
    assert_memory_equal(out, "Hello ", 6);
    assert_false(stopped);
    assert_int_equal(lms_stop_matcher_push(m, "x", 1, &out, &n, &stopped, &which), 0);
    assert_int_equal(n, 4); /* "<|ix" is no stop string after all */
    assert_memory_equal(out, "<|ix", 4);
    assert_int_equal(lms_stop_matcher_push(m, " ok\n\nUs", 7, &out, &n, &stopped, &which), 0);
    assert_int_equal(n, 3);
    assert_int_equal(lms_stop_matcher_push(m, "er: more", 8, &out, &n, &stopped, &which), 0);
    assert_true(stopped);
    assert_int_equal(which, 1);
    assert_int_equal(n, 0);
    assert_int_equal(lms_stop_matcher_push(m, "after", 5, &out, &n, &stopped, &which), 0);
    assert_true(stopped);
    assert_int_equal(n, 0);
    assert_int_equal(lms_stop_matcher_flush(m, &out, &n), 0);
    assert_int_equal(n, 0);
    lms_stop_matcher_reset(m);
    assert_int_equal(lms_stop_matcher_push(m, "tail <|im_e", 11, &out, &n, &stopped, &which), 0);
    assert_int_equal(lms_stop_matcher_flush(m, &out, &n), 0);
    assert_int_equal(n, 6); /* end of stream releases the held "<|im_e" */
    lms_stop_matcher_free(m);
}

static void encode_rejects_invalid_utf8_with_the_offset(void **state)
{
    (void)state;
    int32_t *ids = (int32_t *)1;
    size_t n = 7;
    assert_int_equal(lms_tokenizer_encode(toks[0], "ab\xC3(", 4, 0, &ids, &n), LMS_EINVAL);
    assert_null(ids);
    assert_int_equal(n, 0);
    assert_non_null(strstr(lms_last_error(), "byte 2"));
    /* empty text: gemma adds <bos> only */
    assert_int_equal(lms_tokenizer_encode(toks[2], "", 0, LMS_TOK_ADD_SPECIAL, &ids, &n), 0);
    assert_int_equal(n, 1);
    assert_int_equal(ids[0], 2);
    lms_tokenizer_buf_free(ids);
}

static void long_single_word_runs_encode_in_n_log_n(void **state)
{
    (void)state;
    /* Gemma does not pre-split: a 200k-character paragraph is one BPE word.
     * Quadratic merging would take minutes here. */
    size_t len = 200000;
    char *s = malloc(len);
    for (size_t i = 0; i < len; i++)
        s[i] = "abcdefgh "[(i * 7 + i / 13) % 9];
    double t0 = lms__now();
    for (int t = 0; t < 3; t++) {
        int32_t *ids;
        size_t n;
        assert_int_equal(lms_tokenizer_encode(toks[t], s, len, 0, &ids, &n), 0);
        assert_true(n > 1000 && n < len);
        char *back;
        size_t blen;
        assert_int_equal(lms_tokenizer_decode(toks[t], ids, n, false, &back, &blen), 0);
        assert_int_equal(blen, len);
        assert_memory_equal(back, s, len);
        lms_tokenizer_buf_free(back);
        lms_tokenizer_buf_free(ids);
    }
    assert_true(lms__now() - t0 < 60.0);
    free(s);
}

/* ---- load errors ------------------------------------------------------------------------ */

static const char *TINY =
    "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0, \"b\": 1, \"ab\": 2, \"<unk>\": 3, \"\xe2\x96\x81\": 4},"
    " \"merges\": [\"a b\"], \"unk_token\": \"<unk>\"},"
    " \"normalizer\": %s, \"pre_tokenizer\": %s, \"decoder\": %s, \"post_processor\": %s,"
    " \"added_tokens\": [{\"id\": 5, \"content\": \"<s>\", \"special\": true}]}";

static int load_tiny(const char *norm, const char *pre, const char *dec, const char *post, lms_tokenizer **t)
{
    char *j = lms__asprintf(TINY, norm, pre, dec, post);
    int rc = lms_tokenizer_load(j, strlen(j), NULL, t);
    lms__free(j);
    return rc;
}

static void unsupported_components_fail_at_load_naming_them(void **state)
{
    (void)state;
    lms_tokenizer *t = (lms_tokenizer *)1;
    assert_int_equal(load_tiny("{\"type\": \"BertNormalizer\"}", "null", "null", "null", &t), LMS_EUNSUPPORTED);
    assert_null(t);
    assert_non_null(strstr(lms_last_error(), "normalizer 'BertNormalizer'"));
    assert_int_equal(load_tiny("null", "{\"type\": \"Whitespace\"}", "null", "null", &t), LMS_EUNSUPPORTED);
    assert_non_null(strstr(lms_last_error(), "pre_tokenizer 'Whitespace'"));
    assert_int_equal(load_tiny("null", "null", "{\"type\": \"WordPiece\"}", "null", &t), LMS_EUNSUPPORTED);
    assert_non_null(strstr(lms_last_error(), "decoder 'WordPiece'"));
    assert_int_equal(load_tiny("null", "null", "null", "{\"type\": \"BertProcessing\"}", &t), LMS_EUNSUPPORTED);
    assert_non_null(strstr(lms_last_error(), "post_processor 'BertProcessing'"));
    assert_int_equal(load_tiny("null", "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"(a\"}, \"behavior\": \"Isolated\"}",
                               "null", "null", &t),
                     LMS_EFORMAT);
    assert_non_null(strstr(lms_last_error(), "regex"));
    const char *bad_merge = "{\"model\": {\"type\": \"BPE\", \"vocab\": {\"a\": 0}, \"merges\": [[\"a\", \"z\"]]}}";
    assert_int_equal(lms_tokenizer_load(bad_merge, strlen(bad_merge), NULL, &t), LMS_EFORMAT);
    assert_non_null(strstr(lms_last_error(), "'z'"));
    const char *wordpiece = "{\"model\": {\"type\": \"WordPiece\", \"vocab\": {}}}";
    assert_int_equal(lms_tokenizer_load(wordpiece, strlen(wordpiece), NULL, &t), LMS_EUNSUPPORTED);
    assert_non_null(strstr(lms_last_error(), "WordPiece"));
    assert_int_equal(lms_tokenizer_load("{\"model\": ", 10, NULL, &t), LMS_EFORMAT);
    assert_int_equal(lms_tokenizer_load_file("/nonexistent/tokenizer.json", NULL, &t), LMS_ENOENT);
    assert_non_null(strstr(lms_last_error(), "/nonexistent/tokenizer.json"));
}

static void tiny_tokenizer_applies_unk_metaspace_and_template(void **state)
{
    (void)state;
    lms_tokenizer *t;
    assert_int_equal(load_tiny("{\"type\": \"Sequence\", \"normalizers\": [{\"type\": \"NFC\"}, {\"type\": \"Prepend\", \"prepend\": \"\xe2\x96\x81\"}]}",
                               "null",
                               "{\"type\": \"Sequence\", \"decoders\": [{\"type\": \"Metaspace\", \"replacement\": \"\xe2\x96\x81\", \"prepend_scheme\": \"always\", \"split\": true}]}",
                               "{\"type\": \"TemplateProcessing\", \"single\": [{\"SpecialToken\": {\"id\": \"<s>\", \"type_id\": 0}}, "
                               "{\"Sequence\": {\"id\": \"A\", \"type_id\": 0}}], \"special_tokens\": {\"<s>\": {\"id\": \"<s>\", \"ids\": [5], \"tokens\": [\"<s>\"]}}}",
                               &t),
                     0);
    int32_t *ids;
    size_t n;
    assert_int_equal(lms_tokenizer_encode(t, "abxa", 4, LMS_TOK_ADD_SPECIAL, &ids, &n), 0);
    /* <s> ▁ ab <unk> a */
    int32_t want[] = {5, 4, 2, 3, 0};
    assert_int_equal(n, 5);
    assert_memory_equal(ids, want, sizeof want);
    char *text;
    assert_int_equal(lms_tokenizer_decode(t, ids, n, true, &text, NULL), 0);
    assert_string_equal(text, "ab<unk>a");
    lms_tokenizer_buf_free(text);
    lms_tokenizer_buf_free(ids);
    lms_tokenizer_free(t);
}

static void allocation_failures_during_load_and_encode_leak_nothing(void **state)
{
    (void)state;
    const char *pre = "{\"type\": \"Split\", \"pattern\": {\"Regex\": \"\\\\p{L}+\"}, \"behavior\": \"Isolated\"}";
    int rc = -1;
    char *json = lms__asprintf(TINY, "{\"type\": \"NFC\"}", pre, "{\"type\": \"Fuse\"}", "null");
    for (long k = 1; k < 2000 && rc != 0; k++) {
        lms_tokenizer *t = NULL;
        lms__fault_arm(LMS_FAULT_ALLOC, k, false);
        rc = lms_tokenizer_load(json, strlen(json), NULL, &t);
        lms__fault_disarm_all();
        if (rc) {
            assert_int_equal(rc, LMS_ENOMEM);
            assert_null(t);
            continue;
        }
        int erc = -1;
        for (long j = 1; j < 2000 && erc != 0; j++) {
            int32_t *ids = NULL;
            size_t n;
            lms__fault_arm(LMS_FAULT_ALLOC, j, false);
            erc = lms_tokenizer_encode(t, "ab ab ba", 8, LMS_TOK_ADD_SPECIAL, &ids, &n);
            lms__fault_disarm_all();
            if (erc)
                assert_int_equal(erc, LMS_ENOMEM);
            else
                assert_int_equal(n, 6); /* ab <unk> ab <unk> b a */
            lms_tokenizer_buf_free(ids);
        }
        assert_int_equal(erc, 0);
        lms_tokenizer_free(t);
    }
    assert_int_equal(rc, 0);
    lms__free(json);
}

/* The fuzz seeds: tokenizers with added tokens (lstrip, rstrip, single_word,
 * normalized), byte fallback, ByteLevel with a Split regex, a template. */
static void allocation_failures_loading_richer_tokenizers_leak_nothing(void **state)
{
    (void)state;
    static const char *const seeds[] = {"bytefallback.json", "bytelevel-regex.json", "tiny-metaspace.json"};
    for (size_t f = 0; f < LMS_ARRAY_LEN(seeds); f++) {
        char *path = lms__asprintf("%s/tests/fuzz/corpus/fuzz_tokenizer_load/%s", lms_test_src(), seeds[f]);
        size_t len;
        char *json = lms_test_slurp(path, &len);
        assert_non_null(json);
        int rc = -1;
        for (long k = 1; k < 20000 && rc != 0; k++) {
            lms_tokenizer *t = NULL;
            int32_t *ids = NULL;
            size_t n;
            lms__fault_arm(LMS_FAULT_ALLOC, k, false);
            rc = lms_tokenizer_load(json, len, NULL, &t);
            if (!rc)
                rc = lms_tokenizer_encode(t, "hello \xC3\xA9t\xC3\xA9 ab a", 16, LMS_TOK_ADD_SPECIAL, &ids, &n);
            lms__fault_disarm_all();
            if (rc)
                assert_int_equal(rc, LMS_ENOMEM);
            lms_tokenizer_buf_free(ids);
            lms_tokenizer_free(t);
        }
        assert_int_equal(rc, 0);
        free(json);
        lms__free(path);
    }
}

static void allocation_failures_in_decode_stream_and_chat_leak_nothing(void **state)
{
    (void)state;
    const lms_tokenizer *t = toks[2]; /* Gemma: Replace, ByteFallback, Fuse */
    const char *text = "caf\xC3\xA9 \xF0\x9F\xAB\xA8 <start_of_turn>";
    int32_t *ids;
    size_t n;
    assert_int_equal(lms_tokenizer_encode(t, text, strlen(text), LMS_TOK_PARSE_SPECIAL, &ids, &n), 0);
    lms_chat_message m[2] = {{"system", "Be brief."}, {"user", "Hi"}};
    const char *stops[] = {"<end"};
    int rc = -1;
    for (long k = 1; k < 5000 && rc != 0; k++) {
        char *out = NULL, *chat = NULL;
        lms_detokenizer *d = NULL;
        lms_stop_matcher *sm = NULL;
        lms__fault_arm(LMS_FAULT_ALLOC, k, false);
        rc = lms_tokenizer_decode(t, ids, n, false, &out, NULL);
        if (!rc)
            rc = lms_chat_apply(LMS_CHAT_GEMMA, m, 2, LMS_CHAT_ADD_GENERATION_PROMPT, &chat);
        if (!rc)
            rc = lms_detokenizer_create(t, false, &d);
        if (!rc)
            rc = lms_stop_matcher_create(stops, 1, &sm);
        for (size_t i = 0; i <= n && !rc; i++) {
            const char *p, *q;
            size_t pn, qn;
            bool stopped;
            rc = i < n ? lms_detokenizer_push(d, ids[i], &p, &pn) : lms_detokenizer_flush(d, &p, &pn);
            if (!rc)
                rc = lms_stop_matcher_push(sm, p, pn, &q, &qn, &stopped, NULL);
        }
        lms__fault_disarm_all();
        if (rc)
            assert_int_equal(rc, LMS_ENOMEM);
        else
            assert_string_equal(chat, "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\n");
        lms_tokenizer_buf_free(out);
        lms_tokenizer_buf_free(chat);
        lms_detokenizer_free(d);
        lms_stop_matcher_free(sm);
    }
    assert_int_equal(rc, 0);
    lms_tokenizer_buf_free(ids);
}

/* One tokenizer, four threads encoding the whole corpus at once: every
 * thread must get exactly the single-threaded ids (the tokenizer is
 * immutable; all scratch state is per call). */
typedef struct {
    const lms_tokenizer *t;
    const cJSON *texts;
    uint64_t digest;
    int rc;
} enc_job;

static void *encode_all(void *arg)
{
    enc_job *j = arg;
    j->digest = 0;
    for (int round = 0; round < 2; round++)
        for (int i = 0; i < cJSON_GetArraySize(j->texts); i++) {
            size_t len, n;
            char *s = unhex(cJSON_GetArrayItem(j->texts, i)->valuestring, &len);
            int32_t *ids;
            int rc = lms_tokenizer_encode(j->t, s, len, LMS_TOK_ADD_SPECIAL | LMS_TOK_PARSE_SPECIAL, &ids, &n);
            if (rc)
                j->rc = rc;
            else
                j->digest = j->digest * 31 + lms__hash64(ids, n * sizeof *ids, (uint64_t)i);
            lms_tokenizer_buf_free(ids);
            free(s);
        }
    return NULL;
}

static void concurrent_encodes_of_one_tokenizer_agree(void **state)
{
    (void)state;
    const cJSON *texts = cJSON_GetObjectItem(corpus, "texts_hex");
    for (int t = 0; t < 3; t++) {
        enc_job ref = {toks[t], texts, 0, 0}, jobs[4];
        encode_all(&ref);
        assert_int_equal(ref.rc, 0);
        pthread_t th[4];
        for (int k = 0; k < 4; k++) {
            jobs[k] = (enc_job){toks[t], texts, 0, 0};
            assert_int_equal(pthread_create(&th[k], NULL, encode_all, &jobs[k]), 0);
        }
        for (int k = 0; k < 4; k++) {
            pthread_join(th[k], NULL);
            assert_int_equal(jobs[k].rc, 0);
            assert_true(jobs[k].digest == ref.digest);
        }
    }
}

/* ---- the compiled form -------------------------------------------------------------- */

/* Images are deterministic (the store names them by their hash): compiling
 * again, from the JSON or from the image, gives the same bytes. */
static void compiling_again_gives_the_same_bytes(void **state)
{
    (void)state;
    for (int t = 0; t < 3; t++) {
        for (int from_image = 0; from_image < 2; from_image++) {
            void *again;
            size_t n;
            assert_int_equal(lms_tokenizer_compile(from_image ? img_toks[t] : json_toks[t], &again, &n), 0);
            assert_int_equal(n, image_len[t]);
            assert_memory_equal(again, images[t], n);
            lms_tokenizer_buf_free(again);
        }
    }
}

/* Opening reads a header and the small tables, not the vocabulary: the
 * 262k-token Gemma 3 image opens in well under the time of one JSON parse
 * (a loose bound for loaded and sanitizer builds; bench/RESULTS.md has the
 * figure). */
static void gemma3_image_opens_in_a_few_milliseconds(void **state)
{
    (void)state;
    double best = 1e9;
    for (int k = 0; k < 5; k++) {
        lms_tokenizer *t;
        double t0 = lms__now();
        assert_int_equal(lms_tokenizer_open_image(images[2], image_len[2], &t), 0);
        double dt = lms__now() - t0;
        best = dt < best ? dt : best;
        assert_int_equal(lms_tokenizer_vocab_size(t), 262145);
        lms_tokenizer_free(t);
    }
    if (best > 0.025)
        fail_msg("opening the Gemma 3 image took %.1f ms (bound 25 ms)", best * 1e3);
}

/* A copy of image t with fn applied; freed by the caller (8-byte aligned). */
static uint8_t *image_copy(int t)
{
    uint8_t *p = lms__aligned_alloc(64, image_len[t]);
    assert_non_null(p);
    memcpy(p, images[t], image_len[t]);
    return p;
}

static void put_u64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }
static void put_u32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }

static void image_open_rejects_damaged_headers_naming_the_fault(void **state)
{
    (void)state;
    lms_tokenizer *t = (lms_tokenizer *)1;
    uint8_t *p = image_copy(0);
    size_t n = image_len[0];
    static const struct {
        int rc;
        const char *msg;
    } want[] = {
        {LMS_EFORMAT, "no magic"},         {LMS_EFORMAT, "other byte order"}, {LMS_EVERSION, "version 2"},
        {LMS_EFORMAT, "truncated"},        {LMS_EFORMAT, "'merges'"},         {LMS_EFORMAT, "'merges'"},
        {LMS_EFORMAT, "'token offsets'"},  {LMS_EFORMAT, "'byte ids'"},       {LMS_EFORMAT, "hashed with another"},
        {LMS_EFORMAT, "pipeline"},       {LMS_EFORMAT, "added token 3"},
    };
    for (size_t k = 0; k < LMS_ARRAY_LEN(want); k++) {
        memcpy(p, images[0], n);
        size_t len = n;
        uint64_t off, size;
        switch (k) {
        case 0: p[1] ^= 1; break;
        case 1: put_u32(p + 8, 0x0D0C0B0Au); break;
        case 2: put_u32(p + 12, 2); break;
        case 3: len = n - 64; break;
        case 4: put_u64(p + 128 + 4 * 16, n - 8); break;                  /* merges start past the end */
        case 5: memcpy(&size, p + 128 + 4 * 16 + 8, 8); put_u64(p + 128 + 4 * 16 + 8, size - 16); break; /* not a power of two */
        case 6: memcpy(&size, p + 128 + 6 * 16 + 8, 8); put_u64(p + 128 + 6 * 16 + 8, size - 4); break;
        case 7: memcpy(&off, p + 128 + 9 * 16, 8); put_u32(p + off + 8, 999999999); break;
        case 8: p[32] ^= 0x55; break;
        case 9: memcpy(&off, p + 128 + 18 * 16, 8); p[off] = 200; break;  /* 200 normalizers */
        default: memcpy(&off, p + 128 + 10 * 16, 8); put_u32(p + off + 3 * 16 + 8, 0x7FFFFFFF); break;
        }
        int rc = lms_tokenizer_open_image(p, len, &t);
        if (rc != want[k].rc || !strstr(lms_last_error(), want[k].msg))
            fail_msg("damage %zu: got %d '%s', expected %d naming '%s'", k, rc, lms_last_error(), want[k].rc, want[k].msg);
        assert_null(t);
    }
    assert_int_equal(lms_tokenizer_open_image(p + 4, n - 4, &t), LMS_EINVAL); /* misaligned */
    lms__free(p);
}

/* Bytes of the large tables are not checked at open (that would read them
 * all): damage there must give wrong ids at worst, never a read outside the
 * image (the sanitizer build checks that) or a hang. */
static void damaged_image_tables_give_wrong_ids_never_a_crash(void **state)
{
    (void)state;
    const cJSON *texts = cJSON_GetObjectItem(corpus, "texts_hex");
    uint64_t rng = 0x9E3779B97F4A7C15ull;
    for (int t = 0; t < 3; t++) {
        uint8_t *p = image_copy(t);
        for (int round = 0; round < 4; round++) {
            memcpy(p, images[t], image_len[t]);
            /* scribble over the large tables (rounds 0, 1) and then every
             * section but the pipeline and the header */
            for (int sec = 0; sec < 18; sec++) {
                if (round < 2 && (sec == 9 || sec == 10 || sec == 11 || sec == 17))
                    continue; /* byte ids, added tokens, post ids: checked at open */
                uint64_t off, size;
                memcpy(&off, p + 128 + sec * 16, 8);
                memcpy(&size, p + 128 + sec * 16 + 8, 8);
                for (uint64_t k = 0; size && k < 2000 + size / 4096; k++) {
                    rng = rng * 6364136223846793005ull + 1442695040888963407ull;
                    p[off + (rng >> 17) % size] = round == 3 ? 0xFF : (uint8_t)(rng >> 56);
                }
            }
            lms_tokenizer *d;
            if (lms_tokenizer_open_image(p, image_len[t], &d) != 0)
                continue; /* a small table's check caught it */
            for (int i = 0; i < cJSON_GetArraySize(texts); i += 7) {
                size_t len, n;
                char *s = unhex(cJSON_GetArrayItem(texts, i)->valuestring, &len);
                int32_t *ids;
                if (lms_tokenizer_encode(d, s, len, LMS_TOK_ADD_SPECIAL | LMS_TOK_PARSE_SPECIAL, &ids, &n) == 0) {
                    for (size_t k = 0; k < n; k++)
                        assert_true(ids[k] >= 0 && (size_t)ids[k] < lms_tokenizer_vocab_size(d));
                    char *back;
                    if (lms_tokenizer_decode(d, ids, n, false, &back, NULL) == 0)
                        lms_tokenizer_buf_free(back);
                    lms_tokenizer_buf_free(ids);
                }
                free(s);
            }
            int32_t any[] = {0, 1, 2, 100, 5000, 70000, 128000, 151643, 262000};
            char *back;
            if (lms_tokenizer_decode(d, any, LMS_ARRAY_LEN(any), true, &back, NULL) == 0)
                lms_tokenizer_buf_free(back);
            for (size_t k = 0; k < LMS_ARRAY_LEN(any); k++)
                (void)lms_tokenizer_id_to_token(d, any[k]);
            (void)lms_tokenizer_token_to_id(d, "hello");
            lms_tokenizer_free(d);
        }
        lms__free(p);
    }
}

static void allocation_failures_opening_an_image_leak_nothing(void **state)
{
    (void)state;
    for (int t = 0; t < 3; t++) {
        int rc = -1;
        for (long k = 1; k < 200 && rc != 0; k++) {
            lms_tokenizer *d = NULL;
            lms__fault_arm(LMS_FAULT_ALLOC, k, false);
            rc = lms_tokenizer_open_image(images[t], image_len[t], &d);
            lms__fault_disarm_all();
            if (rc) {
                assert_int_equal(rc, LMS_ENOMEM);
                assert_null(d);
            }
            lms_tokenizer_free(d);
        }
        assert_int_equal(rc, 0);
    }
}

int main(void)
{
    for (int i = 0; i < 3; i++) {
        json_toks[i] = load_real(NAMES[i]);
        if (lms_tokenizer_compile(json_toks[i], &images[i], &image_len[i]) ||
            lms_tokenizer_open_image(images[i], image_len[i], &img_toks[i])) {
            fprintf(stderr, "%s: compiling and opening the image failed: %s\n", NAMES[i], lms_last_error());
            return 1;
        }
    }
    corpus = load_json("corpus.json");
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(each_tokenizer_encodes_corpus_like_hf),
        cmocka_unit_test(each_tokenizer_decodes_like_hf_in_one_call_and_streamed),
        cmocka_unit_test(chat_formats_render_like_transformers_apply_chat_template),
        cmocka_unit_test(unknown_chat_template_fails_and_names_the_override),
        cmocka_unit_test(bos_eos_and_vocab_lookups_match_the_files),
        cmocka_unit_test(stream_holds_back_a_character_split_over_byte_tokens),
        cmocka_unit_test(stop_matcher_holds_back_partial_stop_strings),
        cmocka_unit_test(encode_rejects_invalid_utf8_with_the_offset),
        cmocka_unit_test(long_single_word_runs_encode_in_n_log_n),
        cmocka_unit_test(unsupported_components_fail_at_load_naming_them),
        cmocka_unit_test(tiny_tokenizer_applies_unk_metaspace_and_template),
        cmocka_unit_test(allocation_failures_during_load_and_encode_leak_nothing),
        cmocka_unit_test(concurrent_encodes_of_one_tokenizer_agree),
        cmocka_unit_test(allocation_failures_loading_richer_tokenizers_leak_nothing),
        cmocka_unit_test(allocation_failures_in_decode_stream_and_chat_leak_nothing),
    };
    /* the same comparisons with HF on the tokenizers opened from images */
    const struct CMUnitTest image_tests[] = {
        cmocka_unit_test(each_tokenizer_encodes_corpus_like_hf),
        cmocka_unit_test(each_tokenizer_decodes_like_hf_in_one_call_and_streamed),
        cmocka_unit_test(chat_formats_render_like_transformers_apply_chat_template),
        cmocka_unit_test(bos_eos_and_vocab_lookups_match_the_files),
        cmocka_unit_test(stream_holds_back_a_character_split_over_byte_tokens),
        cmocka_unit_test(concurrent_encodes_of_one_tokenizer_agree),
        cmocka_unit_test(allocation_failures_in_decode_stream_and_chat_leak_nothing),
        cmocka_unit_test(compiling_again_gives_the_same_bytes),
        cmocka_unit_test(gemma3_image_opens_in_a_few_milliseconds),
        cmocka_unit_test(image_open_rejects_damaged_headers_naming_the_fault),
        cmocka_unit_test(damaged_image_tables_give_wrong_ids_never_a_crash),
        cmocka_unit_test(allocation_failures_opening_an_image_leak_nothing),
    };
    int failed = cmocka_run_group_tests_name("tokenizer.json", tests, setup_json, NULL);
    failed += cmocka_run_group_tests_name("compiled images", image_tests, setup_images, NULL);
    for (int i = 0; i < 3; i++) {
        lms_tokenizer_free(img_toks[i]);
        lms_tokenizer_free(json_toks[i]);
        lms_tokenizer_buf_free(images[i]);
    }
    cJSON_Delete(corpus);
    return failed;
}
