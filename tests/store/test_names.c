/*
 * tests/store/test_names.c - the one validator of model and KV session
 * names (store/names.h): every name the README, docs and tests use passes;
 * empty, too long, invalid UTF-8, control characters, a leading '-' and,
 * for models, '/' are refused with a detail naming the rule; and the
 * writers that create model names (cp, mv) go through it.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lmstore/store.h"
#include "store/names.h"
#include "testutil.h"

static void expect_refused(lms__name_kind kind, const char *name, const char *words)
{
    int rc = lms__name_check(kind, name);
    if (rc != LMS_EINVAL)
        fail_msg("name '%s' (kind %d): expected LMS_EINVAL, got %d", name ? name : "(null)", (int)kind, rc);
    if (!strstr(lms_last_error(), words))
        fail_msg("detail '%s' lacks '%s'", lms_last_error(), words);
}

static void names_in_use_are_accepted(void **state)
{
    (void)state;
    const char *models[] = {"smollm2-135m-instruct", "qwen3-0.6b", "Llama-3.2-1B-Instruct", "tiny", "m",
                            "re-model-00001-of-00002", "w0", "my model", "модель-ü", "a-", "x.y_z"};
    for (size_t i = 0; i < sizeof models / sizeof *models; i++)
        if (lms__name_check(LMS__NAME_MODEL, models[i]))
            fail_msg("model name '%s' refused: %s", models[i], lms_last_error());
    const char *sessions[] = {"system-prompt", "quickstart", "hello", "doc-a", "s-shuffle-zstd", "cp12",
                              "user-42/chat", "日本語"};
    for (size_t i = 0; i < sizeof sessions / sizeof *sessions; i++)
        if (lms__name_check(LMS__NAME_SESSION, sessions[i]))
            fail_msg("session name '%s' refused: %s", sessions[i], lms_last_error());
}

static void lengths_are_bounded_per_kind(void **state)
{
    (void)state;
    char buf[402];
    memset(buf, 'a', sizeof buf);
    buf[200] = '\0';
    assert_int_equal(lms__name_check(LMS__NAME_MODEL, buf), 0);
    buf[200] = 'a';
    buf[201] = '\0';
    expect_refused(LMS__NAME_MODEL, buf, "201 bytes, more than 200");
    assert_int_equal(lms__name_check(LMS__NAME_SESSION, buf), 0);
    buf[201] = 'a';
    buf[400] = '\0';
    assert_int_equal(lms__name_check(LMS__NAME_SESSION, buf), 0);
    buf[400] = 'a';
    buf[401] = '\0';
    expect_refused(LMS__NAME_SESSION, buf, "401 bytes, more than 400");
    expect_refused(LMS__NAME_MODEL, "", "must not be empty");
    expect_refused(LMS__NAME_MODEL, NULL, "must not be empty");
    expect_refused(LMS__NAME_SESSION, "", "KV session name must not be empty");
}

static void bad_bytes_leading_dash_and_slash_are_refused(void **state)
{
    (void)state;
    for (int k = 0; k < 2; k++) {
        lms__name_kind kind = k ? LMS__NAME_SESSION : LMS__NAME_MODEL;
        expect_refused(kind, "bad\xff" "utf8", "not valid UTF-8");
        expect_refused(kind, "\xc3", "not valid UTF-8");
        expect_refused(kind, "tab\there", "control character (byte 3)");
        expect_refused(kind, "line\n", "control character");
        expect_refused(kind, "del\x7f", "control character");
        expect_refused(kind, "-rf", "begins with '-'");
        expect_refused(kind, "--json", "begins with '-'");
    }
    expect_refused(LMS__NAME_MODEL, "Qwen/Qwen3-0.6B", "contains '/'");
    expect_refused(LMS__NAME_MODEL, "/abs", "contains '/'");
    expect_refused(LMS__NAME_MODEL, "trailing/", "model name 'trailing/' contains '/'");
}

static void copy_and_rename_refuse_invalid_names_before_touching_the_store(void **state)
{
    (void)state;
    char *dir = lms_test_tmpdir("names");
    lms_store *s;
    assert_int_equal(lms_store_open(dir, LMS_STORE_CREATE, NULL, &s), 0);
    assert_int_equal(lms_model_copy(s, "nosuch", "a/b"), LMS_EINVAL);
    assert_non_null(strstr(lms_last_error(), "contains '/'"));
    assert_int_equal(lms_model_rename(s, "nosuch", "-x"), LMS_EINVAL);
    assert_non_null(strstr(lms_last_error(), "begins with '-'"));
    /* a valid name gets as far as the missing source */
    assert_int_equal(lms_model_copy(s, "nosuch", "ok"), LMS_ENOENT);
    assert_int_equal(lms_store_close(s), 0);
    lms_test_rmrf(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(names_in_use_are_accepted),
        cmocka_unit_test(lengths_are_bounded_per_kind),
        cmocka_unit_test(bad_bytes_leading_dash_and_slash_are_refused),
        cmocka_unit_test(copy_and_rename_refuse_invalid_names_before_touching_the_store),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
