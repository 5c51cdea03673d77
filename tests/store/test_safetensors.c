/*
 * tests/store/test_safetensors.c - the pure header and index parsers
 * (lms__st_parse_header, lms__st_parse_index): what they accept, what they
 * keep, and the rejections the CLI tests do not reach (NUL bytes, unknown or
 * repeated fields, too many dimensions, numbers beyond 2^53, bad metadata).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "store/safetensors.h"
#include "testutil.h"

static int parse(const char *json, uint64_t data_size, lms__st_file *f)
{
    return lms__st_parse_header("x.safetensors", json, strlen(json), data_size, f);
}

static void reject(const char *json, uint64_t data_size, const char *fragment)
{
    lms__st_file f;
    int rc = parse(json, data_size, &f);
    if (rc != LMS_EFORMAT)
        fail_msg("accepted (rc %d): %s", rc, json);
    if (!strstr(lms_last_error(), fragment))
        fail_msg("message '%s' lacks '%s'", lms_last_error(), fragment);
    if (!strstr(lms_last_error(), "x.safetensors"))
        fail_msg("message '%s' does not name the file", lms_last_error());
}

static void accepts_padded_header_and_keeps_metadata(void **state)
{
    (void)state;
    lms__st_file f;
    const char *h = "{\"__metadata__\":{\"format\":\"pt\"},"
                    "\"b\":{\"dtype\":\"BF16\",\"shape\":[2,3],\"data_offsets\":[8,20]},"
                    "\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}      ";
    assert_int_equal(parse(h, 20, &f), 0);
    assert_int_equal(f.n_tensors, 2);
    assert_string_equal(f.tensors[0].name, "a"); /* sorted by offset */
    assert_string_equal(f.tensors[1].name, "b");
    assert_int_equal(f.tensors[1].dtype, LMS_DTYPE_BF16);
    assert_int_equal(f.tensors[1].ndim, 2);
    assert_int_equal(f.tensors[1].nelem, 6);
    assert_int_equal(f.tensors[1].nbytes, 12);
    assert_non_null(f.metadata);
    assert_string_equal(f.metadata, "{\"format\":\"pt\"}");
    lms__st_file_clear(&f);
}

static void accepts_every_safetensors_dtype_name_and_no_quantized_one(void **state)
{
    (void)state;
    for (int t = 0; t < LMS_DTYPE_COUNT_; t++) {
        char h[256];
        size_t sz = lms_dtype_size((lms_dtype)t);
        if (lms_dtype_is_quantized((lms_dtype)t)) { /* GGUF / MLX encodings are not safetensors dtypes */
            snprintf(h, sizeof h, "{\"t\":{\"dtype\":\"%s\",\"shape\":[32],\"data_offsets\":[0,%u]}}",
                     lms_dtype_name((lms_dtype)t), lms_dtype_block_bytes((lms_dtype)t, 4));
            reject(h, lms_dtype_block_bytes((lms_dtype)t, 4), "unknown dtype");
            continue;
        }
        snprintf(h, sizeof h, "{\"t\":{\"dtype\":\"%s\",\"shape\":[3],\"data_offsets\":[0,%zu]}}",
                 lms_dtype_name((lms_dtype)t), 3 * sz);
        lms__st_file f;
        assert_int_equal(parse(h, 3 * sz, &f), 0);
        assert_int_equal(f.tensors[0].dtype, t);
        lms__st_file_clear(&f);
    }
}

static void rejects_what_the_cli_tests_do_not_reach(void **state)
{
    (void)state;
    reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}} x", 4, "after its JSON");
    reject("{\"a\\u0000b\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "escaped NUL");
    reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4],\"extra\":1}}", 4, "unknown field 'extra'");
    reject("{\"a\":{\"dtype\":\"F32\",\"dtype\":\"F32\",\"shape\":[1],\"data_offsets\":[0,4]}}", 4, "appears twice");
    reject("{\"a\":{\"dtype\":\"F32\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,4]}}", 4, "9 dimensions");
    reject("{\"a\":{\"dtype\":\"U8\",\"shape\":[1e300],\"data_offsets\":[0,4]}}", 4, "too large");
    reject("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0]}}", 4, "not an array of 2");
    reject("{\"a\":{\"shape\":[4],\"data_offsets\":[0,4]}}", 4, "\"dtype\" is missing");
    reject("{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,4]}}", 4, "\"shape\" is missing");
    reject("{\"__metadata__\":{\"k\":1}}", 0, "not a string");
    reject("{\"__metadata__\":[]}", 0, "not a JSON object");
    reject("{\"\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 4, "tensor name of 0 bytes");
    reject("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}", 0, "past the end");
    lms__st_file f;
    const char with_nul[] = "{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]}}\0 ";
    assert_int_equal(lms__st_parse_header("x.safetensors", with_nul, sizeof with_nul - 1, 4, &f), LMS_EFORMAT);
    assert_non_null(strstr(lms_last_error(), "NUL byte"));
}

static void zero_size_tensors_may_share_an_offset(void **state)
{
    (void)state;
    lms__st_file f;
    assert_int_equal(parse("{\"e\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
                           "\"f\":{\"dtype\":\"F32\",\"shape\":[4,0],\"data_offsets\":[0,0]},"
                           "\"g\":{\"dtype\":\"U8\",\"shape\":[],\"data_offsets\":[0,1]}}",
                           1, &f),
                     0);
    assert_int_equal(f.n_tensors, 3);
    lms__st_file_clear(&f);
    /* but a zero-size tensor inside another one overlaps it */
    reject("{\"a\":{\"dtype\":\"U8\",\"shape\":[4],\"data_offsets\":[0,4]},"
           "\"z\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[2,2]}}",
           4, "overlaps");
}

static void index_parser_sorts_and_rejects(void **state)
{
    (void)state;
    char **names, **shards;
    size_t n;
    const char *ok = "{\"metadata\":{\"total_size\":8},\"weight_map\":{\"b\":\"s2.safetensors\",\"a\":\"s1.safetensors\"}}";
    assert_int_equal(lms__st_parse_index("i.json", ok, strlen(ok), &names, &shards, &n), 0);
    assert_int_equal(n, 2);
    assert_string_equal(names[0], "a");
    assert_string_equal(shards[0], "s1.safetensors");
    assert_string_equal(names[1], "b");
    for (size_t i = 0; i < n; i++) {
        lms__free(names[i]);
        lms__free(shards[i]);
    }
    lms__free(names);
    lms__free(shards);
    const char *bad[] = {
        "[]",
        "{\"metadata\":{}}",
        "{\"weight_map\":[]}",
        "{\"weight_map\":{\"a\":3}}",
        "{\"weight_map\":{\"a\":\"../../etc/passwd\"}}",
        "{\"weight_map\":{\"a\":\"s1\",\"a\":\"s2\"}}",
        "{\"weight_map\":{\"a\":\"\"}}",
        "{\"weight_map\":",
    };
    for (size_t i = 0; i < LMS_ARRAY_LEN(bad); i++) {
        if (lms__st_parse_index("i.json", bad[i], strlen(bad[i]), &names, &shards, &n) != LMS_EFORMAT)
            fail_msg("index accepted: %s", bad[i]);
        assert_non_null(strstr(lms_last_error(), "i.json"));
    }
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(accepts_padded_header_and_keeps_metadata),
        cmocka_unit_test(accepts_every_safetensors_dtype_name_and_no_quantized_one),
        cmocka_unit_test(rejects_what_the_cli_tests_do_not_reach),
        cmocka_unit_test(zero_size_tensors_may_share_an_offset),
        cmocka_unit_test(index_parser_sorts_and_rejects),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
