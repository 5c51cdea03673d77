/*
 * tests/store/test_lock_split.c - one writer at a time, even when STORE/lock
 * is deleted under a writer (temp cleaners do that): a second writer that
 * creates the file anew and locks it must still wait for the first, and
 * never append at the offsets the first one reserved.
 *
 * This process holds the append lock (an append session, as an import
 * between its lookup and its commit), deletes STORE/lock, and starts
 * `lmstore import` of another model: the import must not finish while the
 * session is open; once it ends, the import goes through and the store
 * verifies. The same with the lock file replaced by another file.
 */
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "common/common.h"
#include "lmstore/store.h"
#include "store/store_internal.h"
#include "testutil.h"

static char *g_dir, *g_src;

static int setup(void **state)
{
    (void)state;
    g_dir = lms_test_tmpdir("locksplit");
    if (asprintf(&g_src, "%s/src", g_dir) < 0)
        return -1;
    return lms_test_sh(NULL, "python3 '%s/tests/gen_model.py' '%s' --force --arch llama --hidden 32 --layers 2 "
                       "--vocab 128 --seed 5",
                       lms_test_src(), g_src) == 0
               ? 0
               : -1;
}

static int teardown(void **state)
{
    (void)state;
    lms_test_rmrf(g_dir);
    free(g_dir);
    free(g_src);
    return 0;
}

/* Start `lmstore import SRC --store STORE --name NAME`; *out_fd reads its
 * end (EOF when it exits). */
static pid_t start_import(const char *store, const char *name, int *out_fd)
{
    int p[2];
    assert_int_equal(pipe(p), 0);
    pid_t pid = fork();
    assert_true(pid >= 0);
    if (pid == 0) {
        close(p[0]);
        dup2(p[1], 1);
        dup2(p[1], 2);
        execl(lms_test_bin(), lms_test_bin(), "import", g_src, "--store", store, "--name", name, "--quiet",
              (char *)NULL);
        _exit(127);
    }
    close(p[1]);
    *out_fd = p[0];
    return pid;
}

/* Whether the child ended within `ms`. */
static bool ended_within(int fd, int ms)
{
    struct pollfd pf = {fd, POLLIN, 0};
    char buf[4096];
    for (;;) {
        int r = poll(&pf, 1, ms);
        if (r <= 0)
            return false;
        ssize_t n = read(fd, buf, sizeof buf);
        if (n == 0)
            return true; /* EOF: it exited */
        if (n > 0)
            fwrite(buf, 1, (size_t)n, stderr);
    }
}

static void second_writer_waits(const char *tag, bool replace)
{
    char store[1024], lock[1100];
    snprintf(store, sizeof store, "%s/%s", g_dir, tag);
    snprintf(lock, sizeof lock, "%s/lock", store);
    lms_store *s = NULL;
    assert_int_equal(lms_store_open(store, LMS_STORE_CREATE, NULL, &s), 0);
    lms_import_params ip = lms_import_default_params();
    ip.name = "first";
    ip.threads = 1;
    ip.progress = false;
    assert_int_equal(lms_import(s, g_src, &ip, NULL), 0);

    /* a writer mid-import: it holds the append lock and has reserved bytes */
    lms__appender *a = NULL;
    assert_int_equal(lms__append_begin(s, &a), 0);
    uint32_t seg;
    uint64_t off;
    assert_int_equal(lms__append_reserve(a, 65536, &seg, &off), 0);
    assert_int_equal(unlink(lock), 0);
    if (replace) { /* a new file in its place, as an unpacking tool would leave */
        int fd = open(lock, O_RDWR | O_CREAT, 0644);
        assert_true(fd >= 0);
        close(fd);
    }

    int out;
    pid_t pid = start_import(store, "second", &out);
    if (ended_within(out, 1500))
        fail_msg("a second writer ran while the first held the append lock (STORE/lock %s)",
                 replace ? "replaced" : "deleted");
    lms__append_end(a, false); /* the first writer rolls back and lets go */
    assert_true(ended_within(out, 60000));
    int st;
    assert_int_equal(waitpid(pid, &st, 0), pid);
    assert_true(WIFEXITED(st) && WEXITSTATUS(st) == 0);
    close(out);

    lms_verify_report vr;
    assert_int_equal(lms_store_verify(s, NULL, NULL, NULL, &vr), 0);
    assert_int_equal(vr.problems, 0);
    assert_int_equal(vr.models, 2);
    assert_int_equal(lms_store_close(s), 0);
}

static void a_writer_waits_when_the_lock_file_was_deleted(void **state)
{
    (void)state;
    second_writer_waits("deleted", false);
}

static void a_writer_waits_when_the_lock_file_was_replaced(void **state)
{
    (void)state;
    second_writer_waits("replaced", true);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(a_writer_waits_when_the_lock_file_was_deleted),
        cmocka_unit_test(a_writer_waits_when_the_lock_file_was_replaced),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
