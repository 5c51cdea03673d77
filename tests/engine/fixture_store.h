/*
 * tests/engine/fixture_store.h - for the engine's tests: a new store in a
 * scratch folder holding the engine fixture tests/fixtures/engine/FAMILY
 * (imported under the name FAMILY). The caller removes and frees the path.
 */
#ifndef LMS_TESTS_ENGINE_FIXTURE_STORE_H
#define LMS_TESTS_ENGINE_FIXTURE_STORE_H

#include <stdio.h>

#include "lmstore/store.h"
#include "testutil.h"

static inline char *lms_test_fixture_store(const char *tag, const char *family)
{
    char dir[1024];
    char *sd = lms_test_tmpdir(tag);
    lms_store *st;
    snprintf(dir, sizeof dir, "%s/tests/fixtures/engine/%s", lms_test_src(), family);
    assert_int_equal(lms_store_open(sd, LMS_STORE_CREATE, NULL, &st), 0);
    lms_import_params ip = lms_import_default_params();
    ip.name = family;
    ip.threads = 1;
    if (lms_import(st, dir, &ip, NULL))
        fail_msg("import %s: %s", dir, lms_last_error());
    assert_int_equal(lms_store_close(st), 0);
    return sd;
}

#endif
