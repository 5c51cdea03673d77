/*
 * tests/kvcache/test_kv_cli.c - `lmstore kv ls|info|rm` run as a real
 * process on a store holding sessions saved here: listing (text and JSON),
 * details, removal, and the exit statuses of errors.
 */
#include <cjson/cJSON.h>

#include "kv_testlib.h"

static void save(lms_store *st, const char *name, uint32_t seed, uint32_t n)
{
    lms_kv *kv = kvt_make(NULL, 32, 0);
    lms_kv_seq *s;
    assert_int_equal(lms_kv_seq_new(kv, &s), 0);
    kvt_fill(kv, s, seed, n, 0);
    assert_int_equal(lms_kv_save(kv, s, st, name), 0);
    lms_kv_seq_free(kv, s);
    assert_int_equal(lms_kv_destroy(kv), 0);
}

static void kv_commands_list_describe_and_remove_sessions(void **state)
{
    (void)state;
    char *dir = lms_test_tmpdir("kv-cli"), *out = NULL;
    lms_store *st;
    assert_int_equal(lms_store_open(dir, LMS_STORE_CREATE, NULL, &st), 0);
    save(st, "system-prompt", 1, 21);
    save(st, "chat 2", 2, 8);
    assert_int_equal(lms_store_close(st), 0);

    assert_int_equal(lms_test_sh(&out, "'%s' kv ls --store '%s'", lms_test_bin(), dir), 0);
    assert_non_null(strstr(out, "system-prompt"));
    assert_non_null(strstr(out, "chat 2"));
    assert_non_null(strstr(out, "3x2x8 BF16 p4"));
    free(out);

    assert_int_equal(lms_test_sh(&out, "'%s' kv ls --json --store '%s' 2>/dev/null", lms_test_bin(), dir), 0);
    cJSON *arr = cJSON_Parse(out);
    assert_non_null(arr);
    assert_int_equal(cJSON_GetArraySize(arr), 2);
    cJSON *first = cJSON_GetArrayItem(arr, 0); /* by name: "chat 2" < "system-prompt" */
    assert_string_equal(cJSON_GetObjectItem(first, "name")->valuestring, "chat 2");
    assert_int_equal(cJSON_GetObjectItem(first, "tokens")->valueint, 8);
    cJSON *second = cJSON_GetArrayItem(arr, 1);
    assert_int_equal(cJSON_GetObjectItem(second, "pages")->valueint, 6);
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetObjectItem(second, "layout"), "head_dim")->valueint, 8);
    assert_string_equal(cJSON_GetObjectItem(second, "model_id")->valuestring, "404142434445464748494a4b4c4d4e4f");
    cJSON_Delete(arr);
    free(out);

    assert_int_equal(lms_test_sh(&out, "'%s' kv info system-prompt --store '%s'", lms_test_bin(), dir), 0);
    assert_non_null(strstr(out, "tokens       21 in 6 pages"));
    assert_non_null(strstr(out, "shuffle-zstd"));
    free(out);
    assert_int_equal(lms_test_sh(&out, "'%s' kv info system-prompt --json --store '%s' 2>/dev/null", lms_test_bin(), dir),
                     0);
    cJSON *o = cJSON_Parse(out);
    assert_non_null(o);
    cJSON *pages = cJSON_GetObjectItem(o, "page_list");
    assert_int_equal(cJSON_GetArraySize(pages), 6);
    assert_int_equal(cJSON_GetObjectItem(cJSON_GetArrayItem(pages, 5), "tokens")->valueint, 1);
    cJSON_Delete(o);
    free(out);

    /* errors: unknown session (1), usage (2) */
    assert_int_equal(lms_test_sh(&out, "'%s' kv info nope --store '%s'", lms_test_bin(), dir), 1);
    assert_non_null(strstr(out, "'nope' not found"));
    free(out);
    assert_int_equal(lms_test_sh(NULL, "'%s' kv frob --store '%s'", lms_test_bin(), dir), 2);
    assert_int_equal(lms_test_sh(NULL, "'%s' kv rm --store '%s'", lms_test_bin(), dir), 2);

    assert_int_equal(lms_test_sh(&out, "'%s' kv rm 'chat 2' --store '%s'", lms_test_bin(), dir), 0);
    free(out);
    assert_int_equal(lms_test_sh(&out, "'%s' kv rm 'chat 2' --store '%s'", lms_test_bin(), dir), 1);
    free(out);
    assert_int_equal(lms_test_sh(&out, "'%s' kv ls --store '%s'", lms_test_bin(), dir), 0);
    assert_null(strstr(out, "chat 2"));
    assert_non_null(strstr(out, "system-prompt"));
    free(out);
    lms_test_rmrf(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(kv_commands_list_describe_and_remove_sessions),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
