/*
 * tests/store/test_crash_import_rollback.c - a failed import killed while it
 * rolls back: an import into a store holding one model is made to fail (a
 * failed fsync, or a failed write of segment data), and the process is
 * SIGKILLed at the crash point just before, or just after, the rollback that
 * truncates and unlinks what it appended (import:before-rollback,
 * import:after-rollback in store/import.c). Afterwards verify finds no
 * problem, only the first model is there, and gc brings the segments to the
 * size of a store that never saw the import.
 *
 * The crash points read their environment once per process, at the first
 * point passed, so each case runs whole (creating its store included) in a
 * child forked before this process passes any crash point.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"
#include "lmstore/store.h"
#include "testutil.h"

static char *g_dir, g_base[1024], g_other[1024];

static int setup(void **state)
{
    (void)state;
    g_dir = lms_test_tmpdir("crash-rollback");
    snprintf(g_base, sizeof g_base, "%s/base", g_dir);
    snprintf(g_other, sizeof g_other, "%s/other", g_dir);
    if (lms_test_sh(NULL, "python3 %s/tests/gen_model.py %s --arch llama --seed 1 --shard-size 16K --force >/dev/null 2>&1",
                    lms_test_src(), g_base) != 0)
        return -1;
    if (lms_test_sh(NULL, "python3 %s/tests/gen_model.py %s --arch qwen3 --seed 2 --shard-size 16K --force >/dev/null 2>&1",
                    lms_test_src(), g_other) != 0)
        return -1;
    return 0;
}

static int teardown(void **state)
{
    (void)state;
    lms_test_rmrf(g_dir);
    free(g_dir);
    return 0;
}

/* A store holding "base", in small segments (an import both appends to the
 * current segment and creates new ones). Returns 0 or an error code. */
static int make_store(const char *path)
{
    lms_store *s;
    lms_store_params p = lms_store_default_params();
    p.segment_max = 64 * 1024;
    int rc = lms_store_open(path, LMS_STORE_CREATE, &p, &s);
    if (rc)
        return rc;
    lms_import_params ip = lms_import_default_params();
    ip.name = "base";
    rc = lms_import(s, g_base, &ip, NULL);
    int crc = lms_store_close(s);
    return rc ? rc : crc;
}

typedef struct kcase {
    const char *point;  /* crash point to die at */
    int fault;          /* what fails */
    long nth;           /* which call of that kind fails (counted from the import of "other") */
    char store[1100];
    int status;         /* wait status of the child */
} kcase;

/* In a child: make the store, fail the import of "other", die at the point.
 * Exit codes: 2 store not made, 3 the import did not fail, 4 it failed but
 * the crash point was not reached. */
static void run_child(kcase *c)
{
    setenv("LMS_CRASH_MATCH", c->point, 1);
    setenv("LMS_CRASH_AT", "1", 1);
    if (make_store(c->store))
        _exit(2);
    lms_store *s;
    if (lms_store_open(c->store, 0, NULL, &s))
        _exit(2);
    lms_import_params ip = lms_import_default_params();
    ip.name = "other";
    ip.threads = 2;
    lms__fault_reset_counts();
    lms__fault_arm(c->fault, c->nth, true);
    int rc = lms_import(s, g_other, &ip, NULL);
    lms__fault_disarm_all();
    _exit(rc == 0 ? 3 : 4);
}

static uint64_t gc_bytes(lms_store *s)
{
    lms_gc_params gp = lms_gc_default_params();
    gp.grace_seconds = 1;
    lms_gc_report rep;
    assert_int_equal(lms_store_gc(s, &gp, NULL, NULL, &rep), 0);
    assert_int_equal(rep.segments_busy, 0);
    uint64_t bytes;
    assert_int_equal(lms_store_segment_bytes(s, &bytes, NULL), 0);
    return bytes;
}

static int model_cb(void *ctx, const lms_model_info *m)
{
    (void)m;
    (*(int *)ctx)++;
    return 0;
}

static void killed_during_rollback_leaves_store_that_gc_restores(void **state)
{
    (void)state;
    kcase cases[] = {
        {"import:before-rollback", LMS_FAULT_FSYNC, 1, "", 0}, /* the first fsync: a new segment's header */
        {"import:after-rollback", LMS_FAULT_FSYNC, 1, "", 0},
        {"import:before-rollback", LMS_FAULT_WRITE, 6, "", 0}, /* mid-copy: some blobs written */
        {"import:after-rollback", LMS_FAULT_WRITE, 6, "", 0},
    };
    size_t n = sizeof cases / sizeof cases[0];
    /* every child first: this process must not pass a crash point before forking */
    for (size_t i = 0; i < n; i++) {
        kcase *c = &cases[i];
        snprintf(c->store, sizeof c->store, "%s/store-%zu", g_dir, i);
        fflush(NULL);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0)
            run_child(c);
        assert_int_equal(waitpid(pid, &c->status, 0), pid);
    }
    char ref[1100];
    snprintf(ref, sizeof ref, "%s/store-ref", g_dir);
    assert_int_equal(make_store(ref), 0);
    lms_store *s;
    assert_int_equal(lms_store_open(ref, 0, NULL, &s), 0);
    uint64_t want = gc_bytes(s);
    assert_int_equal(lms_store_close(s), 0);

    int left_garbage = 0; /* kills before the rollback that left appended bytes for gc */
    for (size_t i = 0; i < n; i++) {
        kcase *c = &cases[i];
        if (!WIFSIGNALED(c->status) || WTERMSIG(c->status) != SIGKILL)
            fail_msg("case %zu (%s, fault %d at %ld): child exited with %d, not killed at the crash point", i,
                     c->point, c->fault, c->nth, WIFEXITED(c->status) ? WEXITSTATUS(c->status) : -1);
        assert_int_equal(lms_store_open(c->store, 0, NULL, &s), 0);
        lms_verify_report vr;
        assert_int_equal(lms_store_verify(s, NULL, NULL, NULL, &vr), 0);
        if (vr.problems)
            fail_msg("case %zu (%s): verify found %llu problems", i, c->point, (unsigned long long)vr.problems);
        int models = 0;
        assert_int_equal(lms_store_models(s, model_cb, &models), 0);
        assert_int_equal(models, 1);
        assert_int_equal(lms_store_model(s, "other", model_cb, &models), LMS_ENOENT);
        uint64_t before;
        assert_int_equal(lms_store_segment_bytes(s, &before, NULL), 0);
        if (!strcmp(c->point, "import:before-rollback") && before > want)
            left_garbage++;
        uint64_t got = gc_bytes(s);
        if (got != want)
            fail_msg("case %zu (%s, fault %d at %ld): %llu segment bytes after gc, want %llu", i, c->point, c->fault,
                     c->nth, (unsigned long long)got, (unsigned long long)want);
        assert_int_equal(lms_store_close(s), 0);
    }
    assert_true(left_garbage > 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(killed_during_rollback_leaves_store_that_gc_restores),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
