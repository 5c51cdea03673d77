/*
 * tests/engine/test_gen_config.c - lms_engine_default_gen_params reads the
 * sampling defaults of generation_config.json as transformers'
 * GenerationConfig does: do_sample true takes temperature/top_k/top_p/min_p
 * (with transformers' defaults 1.0/50/1.0/off for the ones not written),
 * no do_sample (or no file) is greedy, repetition_penalty applies to both,
 * and a malformed value fails naming the model and the field.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lmstore/engine.h"
#include "lmstore/loader.h"
#include "lmstore/store.h"
#include "testutil.h"

static char *store_dir, *src_dir;

/* Import the tiny model under `name` with generation_config.json = `gen`
 * (NULL: no such file), then read the defaults its engine gives. */
static int defaults_for(const char *name, const char *gen, lms_gen_params *gp)
{
    char path[1200];
    snprintf(path, sizeof path, "%s/generation_config.json", src_dir);
    if (gen) {
        FILE *f = fopen(path, "w");
        assert_non_null(f);
        fputs(gen, f);
        fclose(f);
    } else {
        remove(path);
    }
    lms_store *st;
    assert_int_equal(lms_store_open(store_dir, LMS_STORE_CREATE, NULL, &st), 0);
    lms_import_params ip = lms_import_default_params();
    ip.name = name;
    ip.threads = 1;
    if (lms_import(st, src_dir, &ip, NULL))
        fail_msg("import %s: %s", name, lms_last_error());
    lms_model *m;
    lms_engine *e;
    assert_int_equal(lms_model_open(st, name, NULL, &m), 0);
    if (lms_engine_create(m, NULL, &e))
        fail_msg("engine %s: %s", name, lms_last_error());
    int rc = lms_engine_default_gen_params(e, gp);
    lms_engine_free(e);
    lms_model_close(m);
    assert_int_equal(lms_store_close(st), 0);
    return rc;
}

static int setup(void **s)
{
    (void)s;
    store_dir = lms_test_tmpdir("store");
    char *d = lms_test_tmpdir("src");
    src_dir = malloc(strlen(d) + 8);
    sprintf(src_dir, "%s/m", d);
    free(d);
    if (lms_test_sh(NULL, "python3 '%s/tests/gen_model.py' '%s' --arch llama --hidden 32 --layers 1", lms_test_src(),
                    src_dir))
        return -1;
    return 0;
}

static int teardown(void **s)
{
    (void)s;
    free(store_dir);
    free(src_dir);
    return 0;
}

static void no_file_means_greedy(void **s)
{
    lms_gen_params gp;
    assert_int_equal(defaults_for("nofile", NULL, &gp), 0);
    assert_true(gp.temperature == 0.0f);
    assert_true(gp.repeat_penalty == 1.0f);
    lms_gen_params d = lms_gen_default_params();
    assert_int_equal(gp.max_tokens, d.max_tokens);
}

static void file_without_do_sample_is_greedy_but_keeps_repetition_penalty(void **s)
{
    lms_gen_params gp;
    assert_int_equal(defaults_for("nosample", "{\"eos_token_id\": 2, \"temperature\": 0.7, \"top_p\": 0.8, "
                                              "\"repetition_penalty\": 1.3}", &gp),
                     0);
    assert_true(gp.temperature == 0.0f); /* transformers: do_sample defaults to false */
    assert_true(fabsf(gp.repeat_penalty - 1.3f) < 1e-6f);
}

static void do_sample_takes_the_values_written(void **s)
{
    lms_gen_params gp;
    /* Qwen3's published generation_config.json */
    assert_int_equal(defaults_for("qwen3like", "{\"bos_token_id\": 1, \"do_sample\": true, \"eos_token_id\": [2, 3], "
                                               "\"pad_token_id\": 2, \"temperature\": 0.6, \"top_k\": 20, "
                                               "\"top_p\": 0.95, \"transformers_version\": \"4.51.0\"}", &gp),
                     0);
    assert_true(fabsf(gp.temperature - 0.6f) < 1e-6f);
    assert_int_equal(gp.top_k, 20);
    assert_true(fabsf(gp.top_p - 0.95f) < 1e-6f);
    assert_true(gp.min_p == 0.0f);
    assert_true(gp.repeat_penalty == 1.0f);
}

static void do_sample_fills_what_is_missing_with_transformers_defaults(void **s)
{
    lms_gen_params gp;
    assert_int_equal(defaults_for("sampledefaults", "{\"do_sample\": true, \"min_p\": 0.05}", &gp), 0);
    assert_true(gp.temperature == 1.0f);
    assert_int_equal(gp.top_k, 50);
    assert_true(gp.top_p == 1.0f);
    assert_true(fabsf(gp.min_p - 0.05f) < 1e-6f);
}

static void malformed_value_fails_naming_model_and_field(void **s)
{
    lms_gen_params gp;
    assert_int_equal(defaults_for("badtemp", "{\"do_sample\": true, \"temperature\": \"hot\"}", &gp), LMS_EFORMAT);
    assert_non_null(strstr(lms_last_error(), "badtemp"));
    assert_non_null(strstr(lms_last_error(), "\"temperature\""));
    assert_true(gp.temperature == 0.0f); /* left at the greedy defaults */
    assert_int_equal(defaults_for("badtopp", "{\"do_sample\": true, \"top_p\": 1.5}", &gp), LMS_EFORMAT);
    assert_non_null(strstr(lms_last_error(), "\"top_p\""));
    assert_int_equal(defaults_for("baddo", "{\"do_sample\": \"yes\"}", &gp), LMS_EFORMAT);
    assert_non_null(strstr(lms_last_error(), "\"do_sample\""));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(no_file_means_greedy),
        cmocka_unit_test(file_without_do_sample_is_greedy_but_keeps_repetition_penalty),
        cmocka_unit_test(do_sample_takes_the_values_written),
        cmocka_unit_test(do_sample_fills_what_is_missing_with_transformers_defaults),
        cmocka_unit_test(malformed_value_fails_naming_model_and_field),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
