/*
 * tests/store/test_fault.c - fault injection over an import and a gc: for
 * every N, the Nth allocation, write, fsync (and read, open) fails. Each run
 * must return an error (or succeed when the fault came after its last call
 * of that kind), leak nothing (LeakSanitizer checks the process at exit in
 * the ASan build), and leave the store consistent: lms_store_verify finds no
 * problem, the model is wholly there or absent, and a clean gc afterwards
 * brings the segments to the size a fault-free run reaches.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "lmstore/store.h"
#include "store/store_internal.h"
#include "testutil.h"

static char *g_dir, *g_src, *g_tmpl_import, *g_tmpl_gc;
static uint64_t g_size_with, g_size_without;

static void verify_clean(lms_store *s)
{
    lms_verify_report r;
    assert_int_equal(lms_store_verify(s, NULL, NULL, NULL, &r), 0);
    assert_int_equal(r.problems, 0);
}

/* gc's compaction threshold in these runs: every segment with dead bytes
 * (other than the last) is compacted, so gc copies, syncs and repoints. */
#define COMPACT_BELOW 0.99

static uint64_t gc_size(lms_store *s)
{
    lms_gc_params gp = lms_gc_default_params();
    gp.grace_seconds = 1;
    gp.compact_below = COMPACT_BELOW;
    assert_int_equal(lms_store_gc(s, &gp, NULL, NULL, NULL), 0);
    uint64_t b;
    assert_int_equal(lms_store_segment_bytes(s, &b, NULL), 0);
    return b;
}

static int nop_model(void *ctx, const lms_model_info *m)
{
    (void)ctx;
    (void)m;
    return 0;
}

static bool has_model(lms_store *s, const char *name)
{
    return lms_store_model(s, name, nop_model, NULL) == 0;
}

static lms_store *open_copy(const char *tmpl, const char *tag)
{
    char *dst = NULL;
    assert_true(asprintf(&dst, "%s/%s", g_dir, tag) > 0);
    assert_int_equal(lms_test_sh(NULL, "rm -rf '%s' && cp -a '%s' '%s'", dst, tmpl, dst), 0);
    lms_store *s = NULL;
    assert_int_equal(lms_store_open(dst, 0, NULL, &s), 0);
    free(dst);
    return s;
}

static int setup(void **state)
{
    (void)state;
    g_dir = lms_test_tmpdir("fault");
    assert_true(asprintf(&g_src, "%s/src", g_dir) > 0);
    assert_true(asprintf(&g_tmpl_import, "%s/t-import", g_dir) > 0);
    assert_true(asprintf(&g_tmpl_gc, "%s/t-gc", g_dir) > 0);
    if (lms_test_sh(NULL, "python3 '%s/tests/gen_model.py' '%s' --force --arch llama --hidden 32 --layers 1 "
                    "--vocab 128 --shard-size 16K --seed 5", lms_test_src(), g_src) != 0)
        return -1;
    lms_import_params ip = lms_import_default_params();
    ip.threads = 1;
    lms_store *s = NULL;
    lms_store_params sp = lms_store_default_params();
    sp.segment_max = 32 << 10; /* several segments, so gc unlinks and compacts */
    /* template for the import runs: an empty store */
    assert_int_equal(lms_store_open(g_tmpl_import, LMS_STORE_CREATE, &sp, &s), 0);
    assert_int_equal(lms_store_close(s), 0);
    /* template for the gc runs: two models, one removed */
    assert_int_equal(lms_store_open(g_tmpl_gc, LMS_STORE_CREATE, &sp, &s), 0);
    ip.name = "keep";
    assert_int_equal(lms_import(s, g_src, &ip, NULL), 0);
    ip.name = "gone";
    assert_int_equal(lms_store_close(s), 0);
    /* a second, different model: the same source under a cp would share blobs */
    char *src2 = NULL;
    assert_true(asprintf(&src2, "%s/src2", g_dir) > 0);
    if (lms_test_sh(NULL, "python3 '%s/tests/gen_model.py' '%s' --force --arch qwen3 --hidden 32 --layers 1 "
                    "--vocab 128 --seed 6", lms_test_src(), src2) != 0)
        return -1;
    assert_int_equal(lms_store_open(g_tmpl_gc, 0, NULL, &s), 0);
    assert_int_equal(lms_import(s, src2, &ip, NULL), 0);
    assert_int_equal(lms_model_remove(s, "keep"), 0);
    assert_int_equal(lms_store_close(s), 0);
    free(src2);
    /* reference sizes: an empty store, and one holding the imported model */
    s = open_copy(g_tmpl_import, "ref");
    ip.name = "m";
    assert_int_equal(lms_import(s, g_src, &ip, NULL), 0);
    g_size_with = gc_size(s);
    assert_int_equal(lms_model_remove(s, "m"), 0);
    g_size_without = gc_size(s);
    assert_int_equal(lms_store_close(s), 0);
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    lms_test_rmrf(g_dir);
    free(g_dir);
    free(g_src);
    free(g_tmpl_import);
    free(g_tmpl_gc);
    return 0;
}

static const char *kind_name(int k)
{
    static const char *n[] = {"alloc", "read", "write", "fsync", "open"};
    return n[k];
}

/* Fail call N of `kind` during an import, for N = 1, 2, ... until a run
 * makes fewer than N calls. Returns the number of runs that failed. */
static long import_faults(int kind)
{
    lms_import_params ip = lms_import_default_params();
    ip.threads = 1;
    ip.name = "m";
    long failed = 0;
    for (long n = 1;; n++) {
        lms_store *s = open_copy(g_tmpl_import, "run");
        lms__fault_reset_counts();
        lms__fault_arm(kind, n, false);
        int rc = lms_import(s, g_src, &ip, NULL);
        long calls = lms__fault_calls(kind);
        lms__fault_disarm_all();
        verify_clean(s);
        bool present = has_model(s, "m");
        if (rc) {
            failed++;
            assert_false(present);
            assert_true(lms_last_error()[0] != '\0');
        } else {
            assert_true(present);
        }
        uint64_t size = gc_size(s);
        assert_int_equal(size, present ? g_size_with : g_size_without);
        assert_int_equal(lms_store_close(s), 0);
        if (calls < n) {
            assert_int_equal(rc, 0);
            break;
        }
    }
    printf("import: %ld runs failed by an injected %s fault\n", failed, kind_name(kind));
    return failed;
}

static long gc_faults(int kind)
{
    long failed = 0;
    uint64_t want = 0;
    {
        lms_store *s = open_copy(g_tmpl_gc, "gcref");
        lms_gc_report r;
        lms_gc_params gp = lms_gc_default_params();
        gp.compact_below = COMPACT_BELOW;
        assert_int_equal(lms_store_gc(s, &gp, NULL, NULL, &r), 0);
        assert_true(r.blobs_moved > 0 && r.segments_removed > 0); /* the runs below cover compaction */
        uint64_t b;
        assert_int_equal(lms_store_segment_bytes(s, &b, NULL), 0);
        want = gc_size(s);
        assert_int_equal(want, b);
        assert_int_equal(lms_store_close(s), 0);
    }
    for (long n = 1;; n++) {
        lms_store *s = open_copy(g_tmpl_gc, "gcrun");
        lms_gc_params gp = lms_gc_default_params();
        gp.grace_seconds = 1;
        gp.compact_below = COMPACT_BELOW;
        lms__fault_reset_counts();
        lms__fault_arm(kind, n, false);
        int rc = lms_store_gc(s, &gp, NULL, NULL, NULL);
        long calls = lms__fault_calls(kind);
        lms__fault_disarm_all();
        if (rc) {
            failed++;
            assert_true(lms_last_error()[0] != '\0');
        }
        verify_clean(s);
        assert_true(has_model(s, "gone"));
        assert_int_equal(gc_size(s), want);
        verify_clean(s);
        assert_int_equal(lms_store_close(s), 0);
        if (calls < n) {
            assert_int_equal(rc, 0);
            break;
        }
    }
    printf("gc: %ld runs failed by an injected %s fault\n", failed, kind_name(kind));
    return failed;
}

static void import_fails_cleanly_at_every_allocation(void **state) { (void)state; assert_true(import_faults(LMS_FAULT_ALLOC) > 0); }
static void import_fails_cleanly_at_every_write(void **state) { (void)state; assert_true(import_faults(LMS_FAULT_WRITE) > 0); }
static void import_fails_cleanly_at_every_fsync(void **state) { (void)state; assert_true(import_faults(LMS_FAULT_FSYNC) > 0); }
static void import_fails_cleanly_at_every_read_and_open(void **state)
{
    (void)state;
    assert_true(import_faults(LMS_FAULT_READ) + import_faults(LMS_FAULT_OPEN) > 0);
}
static void gc_fails_cleanly_at_every_allocation(void **state) { (void)state; assert_true(gc_faults(LMS_FAULT_ALLOC) > 0); }
static void gc_fails_cleanly_at_every_write(void **state) { (void)state; assert_true(gc_faults(LMS_FAULT_WRITE) > 0); }
static void gc_fails_cleanly_at_every_fsync(void **state) { (void)state; assert_true(gc_faults(LMS_FAULT_FSYNC) > 0); }

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(import_fails_cleanly_at_every_allocation),
        cmocka_unit_test(import_fails_cleanly_at_every_write),
        cmocka_unit_test(import_fails_cleanly_at_every_fsync),
        cmocka_unit_test(import_fails_cleanly_at_every_read_and_open),
        cmocka_unit_test(gc_fails_cleanly_at_every_allocation),
        cmocka_unit_test(gc_fails_cleanly_at_every_write),
        cmocka_unit_test(gc_fails_cleanly_at_every_fsync),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
