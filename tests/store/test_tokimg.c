/*
 * tests/store/test_tokimg.c - lms_store_tokenizer on the records an import
 * leaves (docs/FORMAT.md 3.8): a model with a compiled image gets a tokenizer
 * over the mapped image; one without a reference (as imports before images
 * existed left it) or with a reference compiled from another tokenizer.json
 * gets tokenizer.json parsed; all give the same ids; the tokenizer outlives
 * the store handle. (End to end through the CLI, gc and verify:
 * test_tokenizer_image.py.)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "lmstore/store.h"
#include "lmstore/tokenizer.h"
#include "store/store_internal.h"
#include "store/tokimg.h"
#include "testutil.h"
#include "tokenizer/tok_internal.h"

static char *g_dir, g_store[1024], g_src[1024];

static const char *const TEXTS[] = {"Hello world!", "  spaces\tand\nnewlines ", "don't 123456",
                                    "caf\xC3\xA9 \xE6\x97\xA5\xE6\x9C\xAC", "<|im_start|>user\nhi<|im_end|>"};

static int setup(void **state)
{
    (void)state;
    g_dir = lms_test_tmpdir("tokimg");
    snprintf(g_store, sizeof g_store, "%s/store", g_dir);
    snprintf(g_src, sizeof g_src, "%s/src", g_dir);
    if (lms_test_sh(NULL, "python3 %s/tests/gen_model.py %s --arch qwen3 --hidden 32 --layers 1 --tokenizer "
                          "%s/tests/fixtures/tokenizers/qwen3 --force >/dev/null 2>&1",
                    lms_test_src(), g_src, lms_test_src()) != 0)
        return -1;
    lms_store *s;
    lms_import_params ip = lms_import_default_params();
    ip.progress = false;
    ip.name = "m";
    if (lms_store_open(g_store, LMS_STORE_CREATE, NULL, &s) || lms_import(s, g_src, &ip, NULL))
        return -1;
    return lms_store_close(s);
}

static int teardown(void **state)
{
    (void)state;
    lms_test_rmrf(g_dir);
    free(g_dir);
    return 0;
}

/* The ids of TEXTS, hashed. */
static uint64_t ids_digest(const lms_tokenizer *t)
{
    uint64_t h = 0;
    for (size_t i = 0; i < LMS_ARRAY_LEN(TEXTS); i++) {
        int32_t *ids;
        size_t n;
        assert_int_equal(lms_tokenizer_encode(t, TEXTS[i], strlen(TEXTS[i]), LMS_TOK_PARSE_SPECIAL, &ids, &n), 0);
        assert_true(n > 0 || !TEXTS[i][0]);
        h = h * 1000003 + lms__hash64(ids, n * sizeof *ids, i);
        lms_tokenizer_buf_free(ids);
    }
    return h;
}

static uint64_t json_digest(void)
{
    char tj[1100];
    snprintf(tj, sizeof tj, "%s/tokenizer.json", g_src);
    lms_tokenizer *t;
    assert_int_equal(lms_tokenizer_load_file(tj, NULL, &t), 0);
    uint64_t h = ids_digest(t);
    lms_tokenizer_free(t);
    return h;
}

static void store_tokenizer_opens_the_image_in_place_and_outlives_the_store(void **state)
{
    (void)state;
    lms_store *s;
    lms_tokenizer *t;
    assert_int_equal(lms_store_open(g_store, LMS_STORE_RDONLY, NULL, &s), 0);
    assert_int_equal(lms_store_tokenizer(s, "m", &t), 0);
    assert_int_equal(lms_store_close(s), 0);
    assert_non_null(t->image); /* mapped, not parsed */
    assert_true(ids_digest(t) == json_digest());
    assert_non_null(lms_tokenizer_chat_template(t));
    lms_tokenizer_free(t);
    assert_int_equal(lms_store_open(g_store, LMS_STORE_RDONLY, NULL, &s), 0);
    assert_int_equal(lms_store_tokenizer(s, "nope", &t), LMS_ENOENT);
    assert_null(t);
    assert_non_null(strstr(lms_last_error(), "nope"));
    assert_int_equal(lms_store_close(s), 0);
}

typedef struct put_ctx {
    const char *file;
    const void *raw; /* NULL: delete the record */
    size_t len;
} put_ctx;

static int put_file(lms_store *s, MDB_txn *txn, void *vctx)
{
    put_ctx *c = vctx;
    char key[512];
    size_t kl = lms__key_item(key, sizeof key, "m", c->file);
    if (!c->raw)
        return lms__db_del(s, txn, LMS__DB_FILES, key, kl);
    uint8_t *rec;
    size_t rl;
    int rc = lms__file_rec_encode(c->raw, c->len, 1, &rec, &rl);
    if (!rc)
        rc = lms__db_put(s, txn, LMS__DB_FILES, key, kl, rec, rl, 0);
    lms__free(rec);
    return rc;
}

static void edit_file(const char *file, const void *raw, size_t len)
{
    lms_store *s;
    put_ctx c = {file, raw, len};
    assert_int_equal(lms_store_open(g_store, 0, NULL, &s), 0);
    assert_int_equal(lms__txn_write(s, put_file, &c), 0);
    assert_int_equal(lms_store_close(s), 0);
}

static lms_tokenizer *open_m(void)
{
    lms_store *s;
    lms_tokenizer *t;
    assert_int_equal(lms_store_open(g_store, LMS_STORE_RDONLY, NULL, &s), 0);
    assert_int_equal(lms_store_tokenizer(s, "m", &t), 0);
    assert_int_equal(lms_store_close(s), 0);
    return t;
}

/* The tokenizer.json record replaced by other bytes (a hand-edited store): the
 * reference no longer names its source, so the new JSON is what counts. */
static void a_reference_compiled_from_another_tokenizer_json_is_not_used(void **state)
{
    (void)state;
    char path[1100];
    snprintf(path, sizeof path, "%s/tests/fuzz/corpus/fuzz_tokenizer_load/bytelevel-regex.json", lms_test_src());
    size_t len;
    char *other = lms_test_slurp(path, &len);
    assert_non_null(other);
    void *orig;
    size_t olen;
    lms_store *s;
    assert_int_equal(lms_store_open(g_store, LMS_STORE_RDONLY, NULL, &s), 0);
    assert_int_equal(lms_store_file(s, "m", "tokenizer.json", &orig, &olen), 0);
    assert_int_equal(lms_store_close(s), 0);
    edit_file("tokenizer.json", other, len);
    lms_tokenizer *t = open_m();
    assert_null(t->image);
    assert_true(lms_tokenizer_vocab_size(t) < 1000); /* the small one */
    lms_tokenizer_free(t);
    edit_file("tokenizer.json", orig, olen); /* back: the image is used again */
    t = open_m();
    assert_non_null(t->image);
    lms_tokenizer_free(t);
    lms_free(orig);
    free(other);
}

/* As an import made before compiled tokenizers existed: no reference. */
static void a_model_without_a_reference_reads_tokenizer_json_with_the_same_ids(void **state)
{
    (void)state;
    edit_file(LMS__TOKREF_NAME, NULL, 0);
    lms_tokenizer *t = open_m();
    assert_null(t->image);
    assert_true(ids_digest(t) == json_digest());
    assert_non_null(lms_tokenizer_chat_template(t));
    lms_tokenizer_free(t);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(store_tokenizer_opens_the_image_in_place_and_outlives_the_store),
        cmocka_unit_test(a_reference_compiled_from_another_tokenizer_json_is_not_used),
        cmocka_unit_test(a_model_without_a_reference_reads_tokenizer_json_with_the_same_ids),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
