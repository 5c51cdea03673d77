/*
 * tests/loader/test_shared_pages.c - two processes that open the same model
 * share its pages: in each, the segment mappings are resident, file-backed
 * and shared (smaps Shared_Clean covers the weights), with no anonymous or
 * private dirty pages, i.e. nobody holds a private copy of the weights.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "testutil.h"

#include "loader_smaps.h"
#include "loader_testmodel.h"

/* Open the model with every page populated and sum a checksum over it (a
 * reader that really uses the bytes). */
static lms_model *open_and_touch(lms_store *st, uint64_t *total, uint64_t *sum)
{
    lms_model_params p = lms_model_default_params();
    p.prefetch = LMS_PREFETCH_POPULATE;
    lms_model *m = NULL;
    if (lms_model_open(st, "shared", &p, &m))
        return NULL;
    *total = 0;
    *sum = 0;
    for (size_t i = 0; i < lms_model_tensor_count(m); i++) {
        const lms_tensor *t = lms_model_tensor_at(m, i);
        const uint8_t *b = t->host;
        for (uint64_t k = 0; k < t->nbytes; k += 512)
            *sum += b[k];
        *total += t->nbytes;
    }
    return m;
}

static void two_processes_share_the_weights_pages(void **state)
{
    (void)state;
    char *dir = lms_test_tmpdir("shared");
    char store[1200], src[1200];
    snprintf(store, sizeof store, "%s/store", dir);
    snprintf(src, sizeof src, "%s/src", dir);
    assert_int_equal(mkdir(src, 0755), 0);
    static tm_model tm;
    tm_llama(&tm, 4, 4096, 512, 1536); /* ~26 MB */
    assert_int_equal(tm_import(&tm, src, store, "shared", false), 0);

    int up[2], down[2];
    assert_int_equal(pipe(up), 0);
    assert_int_equal(pipe(down), 0);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        lms_store *st = NULL;
        uint64_t total, sum;
        char c = 'x';
        if (lms_store_open(store, LMS_STORE_RDONLY, NULL, &st) == 0) {
            lms_model *m = open_and_touch(st, &total, &sum);
            if (m)
                c = 'r';
            (void)!write(up[1], &c, 1);
            (void)!read(down[0], &c, 1); /* hold the model until the parent looked */
            lms_model_close(m);
            lms_store_close(st);
        } else {
            (void)!write(up[1], &c, 1);
        }
        _exit(0);
    }
    char c = 0;
    assert_int_equal(read(up[0], &c, 1), 1);
    assert_int_equal(c, 'r');

    lms_store *st = NULL;
    assert_int_equal(lms_store_open(store, LMS_STORE_RDONLY, NULL, &st), 0);
    uint64_t total = 0, sum = 0;
    lms_model *m = open_and_touch(st, &total, &sum);
    assert_non_null(m);
    assert_true(total > 20000000);

    seg_usage me, kid;
    assert_int_equal(seg_usage_read(getpid(), store, &me), 0);
    assert_int_equal(seg_usage_read(child, store, &kid), 0);
    print_message("parent: rss %llu shared_clean %llu anon %llu; child: rss %llu shared_clean %llu anon %llu; "
                  "weights %llu bytes\n",
                  me.rss, me.shared_clean, me.anonymous, kid.rss, kid.shared_clean, kid.anonymous,
                  (unsigned long long)total);
    const seg_usage *u[2] = {&me, &kid};
    for (int k = 0; k < 2; k++) {
        assert_true(u[k]->mappings >= 1);
        assert_true(u[k]->rss >= total);          /* the weights are resident in both */
        assert_true(u[k]->shared_clean >= total); /* ...as pages both processes map */
        assert_int_equal(u[k]->anonymous, 0);     /* no private copies */
        assert_int_equal(u[k]->private_dirty, 0);
        assert_int_equal(u[k]->shared_dirty, 0);
    }

    assert_int_equal(write(down[1], "q", 1), 1);
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status) && WEXITSTATUS(status) == 0);
    lms_model_close(m);
    assert_int_equal(lms_store_close(st), 0);
    close(up[0]);
    close(up[1]);
    close(down[0]);
    close(down[1]);
    lms_test_rmrf(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(two_processes_share_the_weights_pages),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
