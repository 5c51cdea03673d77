/*
 * tests/kvcache/test_kv_crash.c - a KV save killed with SIGKILL never leaves
 * a visible partial session, and the store stays consistent (verify finds
 * no problem, gc reclaims what the killed saves left, surviving sessions
 * resume byte for byte).
 *
 * Two kinds of kill, each in a child process that re-executes this binary
 * (`--child-save STORE NAME SEED`):
 *   - at every named crash point the save passes (LMS_CRASH_AT=N, see
 *     common/crashpoint.h): deterministic coverage of each step;
 *   - at 50 seeded random times within the duration of an uninterrupted
 *     save (kill -9 from the parent).
 */
#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kv_testlib.h"
#include "lmstore/store.h"

static char self_exe[4096];

/* A larger layout than the other tests so that a save takes a few ms. */
static const lms_kv_layout CRASH_LAYOUT = {
    .n_layers = 4, .n_kv_heads = 4, .head_dim = 64, .dtype = LMS_DTYPE_BF16, .page_tokens = 16};
#define CRASH_TOKENS 200
#define CRASH_SHARED 64

static int child_save(char **argv)
{
    lms_store *st;
    lms_device *dev;
    lms_kv *kv;
    lms_kv_seq *s;
    if (lms_store_open(argv[2], LMS_STORE_CREATE, NULL, &st))
        return 3;
    lms_kv_params p = lms_kv_default_params();
    p.budget_pages = 32;
    kvt_model_id(p.model_id, 0);
    if (lms_device_open(LMS_DEVICE_CPU, 0, &dev) || lms_kv_create(dev, &CRASH_LAYOUT, &p, &kv) ||
        lms_kv_seq_new(kv, &s))
        return 4;
    kvt_fill(kv, s, (uint32_t)atoi(argv[4]), CRASH_TOKENS, CRASH_SHARED);
    lms_kv_save_params sp = lms_kv_default_save_params();
    sp.threads = 2;
    if (lms_kv_save_ex(kv, s, st, argv[3], &sp, NULL)) {
        fprintf(stderr, "child save: %s\n", lms_last_error());
        return 6;
    }
    lms_kv_seq_free(kv, s);
    lms_kv_destroy(kv);
    lms_device_close(dev);
    lms_store_close(st);
    return 0;
}

static pid_t spawn(const char *dir, const char *name, uint32_t seed, long crash_at, bool count)
{
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        char seedbuf[16], at[32];
        snprintf(seedbuf, sizeof seedbuf, "%u", seed);
        if (crash_at > 0) {
            snprintf(at, sizeof at, "%ld", crash_at);
            setenv("LMS_CRASH_AT", at, 1);
        }
        if (count)
            setenv("LMS_CRASH_COUNT", "1", 1);
        execl(self_exe, self_exe, "--child-save", dir, name, seedbuf, (char *)NULL);
        _exit(127);
    }
    return pid;
}

/* After a killed save of `name` (seed): the session is absent or complete. */
static int check_after_kill(const char *dir, const char *name, uint32_t seed)
{
    lms_store *st;
    assert_int_equal(lms_store_open(dir, 0, NULL, &st), 0);
    kvt_check_store(st);
    lms_kv_params p = lms_kv_default_params();
    p.budget_pages = 32;
    kvt_model_id(p.model_id, 0);
    lms_kv *kv;
    lms_kv_seq *s;
    assert_int_equal(lms_kv_create(kvt_cpu(), &CRASH_LAYOUT, &p, &kv), 0);
    int rc = lms_kv_resume(kv, st, name, &s);
    int present = 0;
    if (rc == 0) {
        assert_int_equal(kvt_diff(kv, s, seed, CRASH_TOKENS, CRASH_SHARED), 0);
        lms_kv_seq_free(kv, s);
        present = 1;
    } else if (rc != LMS_ENOENT) {
        fail_msg("session '%s' after a kill: %s", name, lms_last_error());
    }
    assert_int_equal(lms_kv_destroy(kv), 0);
    assert_int_equal(lms_store_close(st), 0);
    return present;
}

static void verify_finds_no_problem(const char *dir)
{
    lms_store *st;
    assert_int_equal(lms_store_open(dir, 0, NULL, &st), 0);
    lms_verify_params vp = lms_verify_default_params();
    lms_verify_report rep;
    assert_int_equal(lms_store_verify(st, &vp, NULL, NULL, &rep), 0);
    assert_int_equal(rep.problems, 0);
    assert_int_equal(lms_store_close(st), 0);
}

static void killed_saves_never_leave_a_partial_session(void **state)
{
    (void)state;
    char *dir = lms_test_tmpdir("kv-crash");
    int status;
    /* a baseline session that shares a prefix with every later one */
    pid_t pid = spawn(dir, "base", 1, 0, false);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);

    /* how long an uninterrupted save takes (process start included) and how
     * many crash points it passes */
    double t0 = lms__now();
    pid = spawn(dir, "timing", 2, 0, false);
    assert_int_equal(waitpid(pid, &status, 0), pid);
    double full = lms__now() - t0;
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    char *out = NULL;
    status = lms_test_sh(&out, "LMS_CRASH_COUNT=1 '%s' --child-save '%s' counted 3 2>&1", self_exe, dir);
    assert_int_equal(status, 0);
    char *cnt = strstr(out, "lms-crashpoints: ");
    assert_non_null(cnt);
    long points = strtol(cnt + strlen("lms-crashpoints: "), NULL, 10);
    free(out);
    assert_true(points >= 4); /* at least the save's own: write, sync, commit, after */

    int present = 0, absent = 0;
    /* every crash point */
    for (long n = 1; n <= points; n++) {
        char name[32];
        snprintf(name, sizeof name, "cp%ld", n);
        pid = spawn(dir, name, (uint32_t)(100 + n), n, false);
        assert_int_equal(waitpid(pid, &status, 0), pid);
        assert_true(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
        if (check_after_kill(dir, name, (uint32_t)(100 + n)))
            present++;
        else
            absent++;
    }
    /* the kill at the last point (after the commit) leaves the session, the
     * one before the commit does not */
    assert_true(present >= 1 && absent >= 1);

    /* 50 seeded random times */
    uint64_t seed = 20261122;
    int rp = 0, ra = 0;
    for (int i = 0; i < 50; i++) {
        seed = seed * 6364136223846793005ull + 1442695040888963407ull;
        double frac = (double)(seed >> 11) / (double)(1ull << 53);
        char name[32];
        snprintf(name, sizeof name, "rnd%d", i);
        pid = spawn(dir, name, (uint32_t)(1000 + i), 0, false);
        struct timespec ts = {0, (long)(frac * full * 1e9)};
        nanosleep(&ts, NULL);
        kill(pid, SIGKILL);
        assert_int_equal(waitpid(pid, &status, 0), pid);
        if (check_after_kill(dir, name, (uint32_t)(1000 + i)))
            rp++;
        else
            ra++;
    }
    print_message("crash points: %ld (%d sessions complete, %d absent); random kills: %d complete, %d absent\n",
                  points, present, absent, rp, ra);

    /* the store: verify is clean, gc reclaims the killed saves' bytes and
     * leaves every complete session intact */
    verify_finds_no_problem(dir);
    lms_store *st;
    assert_int_equal(lms_store_open(dir, 0, NULL, &st), 0);
    int sessions = kvt_check_store(st);
    lms_gc_params gp = lms_gc_default_params();
    lms_gc_report grep_;
    assert_int_equal(lms_store_gc(st, &gp, NULL, NULL, &grep_), 0);
    assert_int_equal(kvt_check_store(st), sessions);
    lms_kv_params p = lms_kv_default_params();
    p.budget_pages = 32;
    kvt_model_id(p.model_id, 0);
    lms_kv *kv;
    lms_kv_seq *s;
    assert_int_equal(lms_kv_create(kvt_cpu(), &CRASH_LAYOUT, &p, &kv), 0);
    assert_int_equal(lms_kv_resume(kv, st, "base", &s), 0);
    assert_int_equal(kvt_diff(kv, s, 1, CRASH_TOKENS, CRASH_SHARED), 0);
    lms_kv_seq_free(kv, s);
    assert_int_equal(lms_kv_destroy(kv), 0);
    assert_int_equal(lms_store_close(st), 0);
    verify_finds_no_problem(dir);
    lms_test_rmrf(dir);
    free(dir);
}

int main(int argc, char **argv)
{
    ssize_t n = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);
    if (n > 0)
        self_exe[n] = '\0';
    if (argc == 5 && !strcmp(argv[1], "--child-save"))
        return child_save(argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(killed_saves_never_leave_a_partial_session),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
