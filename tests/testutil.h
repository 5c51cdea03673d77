/*
 * tests/testutil.h - helpers shared by the cmocka tests: scratch folders,
 * running the CLI as a real process, reading files, comparing trees.
 */
#ifndef LMS_TESTUTIL_H
#define LMS_TESTUTIL_H

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

/* A fresh empty folder under $LMS_TMP (or /tmp), unique per call; caller frees. */
char *lms_test_tmpdir(const char *tag);
/* Path of the source tree ($LMS_SRC_DIR), of the CLI ($LMS_BIN). */
const char *lms_test_src(void);
const char *lms_test_bin(void);
/* Run a shell command; returns its exit status (or -1). Output captured into
 * *out (caller frees) when out is not NULL (stdout and stderr together). */
int lms_test_sh(char **out, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Read a whole file (caller frees); NULL if it cannot be read. */
char *lms_test_slurp(const char *path, size_t *len);
/* XXH3-64 over every regular file under dir (sorted by relative path),
 * names included: equal digests mean byte-identical trees. */
uint64_t lms_test_tree_digest(const char *dir);
/* Remove a tree (rm -rf). */
void lms_test_rmrf(const char *path);
/* Exit status 77 tells ctest the test was skipped (SKIP_RETURN_CODE). */
#define LMS_TEST_SKIP 77

#endif
