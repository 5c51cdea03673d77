/*
 * tests/tools/test_public_headers.c - the umbrella header compiles on its
 * own (no internal header leaks into the public API) and the library it
 * declares links: a store is created, listed and closed through it alone.
 */
#include <stdio.h>
#include <stdlib.h>

#include "lmstore/lmstore.h"
#include "testutil.h"

static int count_model(void *ctx, const lms_model_info *info)
{
    (void)info;
    (*(int *)ctx)++;
    return 0;
}

static void umbrella_header_declares_a_working_api(void **state)
{
    (void)state;
    char *dir = lms_test_tmpdir("hdr");
    lms_store *st = NULL;
    assert_int_equal(lms_store_open(dir, LMS_STORE_CREATE, NULL, &st), 0);
    int n = 0;
    assert_int_equal(lms_store_models(st, count_model, &n), 0);
    assert_int_equal(n, 0);
    assert_int_equal(lms_store_close(st), 0);
    /* a missing store without LMS_STORE_CREATE is LMS_ENOENT, with a detail */
    char missing[1024];
    snprintf(missing, sizeof missing, "%s/none", dir);
    assert_int_equal(lms_store_open(missing, LMS_STORE_RDONLY, NULL, &st), LMS_ENOENT);
    assert_null(st);
    assert_true(lms_last_error()[0] != '\0');
    lms_test_rmrf(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(umbrella_header_declares_a_working_api),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
