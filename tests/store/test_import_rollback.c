/*
 * tests/store/test_import_rollback.c - a failed import leaves the store
 * exactly as it was: the Nth write, fsync, read, open or allocation of an import
 * into a store that already holds a model is made to fail (for every N until
 * the import gets through), and after each failure the segments, the
 * compiled tokenizers and the LMDB data file are byte-identical to before
 * and the model is absent. Then a clean import of the same model must still
 * succeed. (The imported model has a small tokenizer.json, so its compiled
 * image is written, and unwritten, too.)
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

#include "common/common.h"
#include "lmstore/store.h"
#include "testutil.h"

static char *g_dir, g_store[1024], g_base[1024], g_other[1024];

/* Store content: every segment, the LMDB data file and the lock file; not
 * index/lock.mdb (LMDB's reader table, rewritten by any reader). */
static uint64_t store_digest(void)
{
    char p[1200];
    snprintf(p, sizeof p, "%s/segments", g_store);
    uint64_t h = lms_test_tree_digest(p);
    snprintf(p, sizeof p, "%s/tokenizers", g_store);
    h ^= lms__path_exists(p) ? 0x7E ^ lms_test_tree_digest(p) * 3 : 0;
    size_t len = 0;
    snprintf(p, sizeof p, "%s/index/data.mdb", g_store);
    char *data = lms_test_slurp(p, &len);
    assert_non_null(data);
    h ^= XXH3_64bits_withSeed(data, len, 1);
    free(data);
    snprintf(p, sizeof p, "%s/lock", g_store);
    h ^= lms__path_exists(p) ? 0x51 : 0;
    return h;
}

static int count_cb(void *ctx, const lms_model_info *m)
{
    (void)m;
    (*(int *)ctx)++;
    return 0;
}

static int n_models(lms_store *s)
{
    int n = 0;
    assert_int_equal(lms_store_models(s, count_cb, &n), 0);
    return n;
}

static int setup(void **state)
{
    (void)state;
    g_dir = lms_test_tmpdir("rollback");
    snprintf(g_store, sizeof g_store, "%s/store", g_dir);
    snprintf(g_base, sizeof g_base, "%s/base", g_dir);
    snprintf(g_other, sizeof g_other, "%s/other", g_dir);
    const char *py = "python3";
    if (lms_test_sh(NULL, "%s %s/tests/gen_model.py %s --arch llama --seed 1 --shard-size 16K --force >/dev/null 2>&1",
                    py, lms_test_src(), g_base) != 0)
        return -1;
    if (lms_test_sh(NULL,
                    "%s %s/tests/gen_model.py %s --arch qwen3 --seed 2 --shard-size 16K --chat-template --force "
                    ">/dev/null 2>&1 && cp %s/tests/fuzz/corpus/fuzz_tokenizer_load/bytelevel-regex.json %s/tokenizer.json",
                    py, lms_test_src(), g_other, lms_test_src(), g_other) != 0)
        return -1;
    return 0;
}

/* A store holding one model, "base", in small segments (so that an import
 * both appends to the current segment and creates new ones). */
static void fresh_store(void)
{
    lms_test_rmrf(g_store);
    lms_store *s;
    lms_store_params p = lms_store_default_params();
    p.segment_max = 64 * 1024;
    assert_int_equal(lms_store_open(g_store, LMS_STORE_CREATE, &p, &s), 0);
    lms_import_params ip = lms_import_default_params();
    ip.progress = false;
    assert_int_equal(lms_import(s, g_base, &ip, NULL), 0);
    assert_int_equal(lms_store_close(s), 0);
}

static int teardown(void **state)
{
    (void)state;
    lms_test_rmrf(g_dir);
    free(g_dir);
    return 0;
}

static void fail_every_nth(int kind, long max_n, long stride)
{
    lms_store *s;
    fresh_store();
    assert_int_equal(lms_store_open(g_store, 0, NULL, &s), 0);
    uint64_t before = store_digest();
    lms_import_params ip = lms_import_default_params();
    ip.progress = false;
    ip.threads = 2;
    ip.name = "other";
    long n;
    int failures = 0;
    for (n = 1; n <= max_n; n += stride) {
        lms__fault_reset_counts();
        lms__fault_arm(kind, n, true);
        int rc = lms_import(s, g_other, &ip, NULL);
        lms__fault_disarm_all();
        if (rc == 0)
            break;
        failures++;
        if (store_digest() != before)
            fail_msg("fault kind %d at call %ld: import failed (%s) but the store changed", kind, n,
                     lms_last_error());
        assert_int_equal(n_models(s), 1);
    }
    print_message("fault kind %d: %d injected failures, import got through at call %ld\n", kind, failures, n);
    assert_true(failures > 0);
    if (n > max_n) { /* every injected point failed: the clean import must work */
        assert_int_equal(lms_import(s, g_other, &ip, NULL), 0);
    }
    assert_int_equal(n_models(s), 2);
    assert_int_equal(lms_store_close(s), 0);
}

static void failed_write_leaves_store_unchanged(void **state)
{
    (void)state;
    setenv("LMSTORE_IMPORT_BATCH_BYTES", "8192", 1); /* failures land mid-pipeline, between batches */
    fail_every_nth(LMS_FAULT_WRITE, 400, 1);
    unsetenv("LMSTORE_IMPORT_BATCH_BYTES");
}

static void failed_fsync_leaves_store_unchanged(void **state)
{
    (void)state;
    fail_every_nth(LMS_FAULT_FSYNC, 50, 1);
}

static void failed_read_leaves_store_unchanged(void **state)
{
    (void)state;
    setenv("LMSTORE_IMPORT_BATCH_BYTES", "8192", 1); /* read errors in hashing workers mid-pipeline */
    fail_every_nth(LMS_FAULT_READ, 400, 1);
    unsetenv("LMSTORE_IMPORT_BATCH_BYTES");
}

static void failed_open_leaves_store_unchanged(void **state)
{
    (void)state;
    fail_every_nth(LMS_FAULT_OPEN, 100, 1);
}

static void failed_allocation_leaves_store_unchanged(void **state)
{
    (void)state;
    fail_every_nth(LMS_FAULT_ALLOC, 4000, 7);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(failed_write_leaves_store_unchanged),
        cmocka_unit_test(failed_fsync_leaves_store_unchanged),
        cmocka_unit_test(failed_read_leaves_store_unchanged),
        cmocka_unit_test(failed_open_leaves_store_unchanged),
        cmocka_unit_test(failed_allocation_leaves_store_unchanged),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
