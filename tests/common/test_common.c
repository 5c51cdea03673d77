/*
 * tests/common/test_common.c - the common layer: error detail, fault
 * injection, hashing against known XXH3 values, the thread pool, UTF-8
 * validation, file helpers.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "testutil.h"

static void err_sets_code_and_detail(void **state)
{
    (void)state;
    lms_clear_error();
    assert_string_equal(lms_last_error(), "");
    int rc = lms__err(LMS_EFORMAT, "%s: tensor '%s' bad", "a.safetensors", "w");
    assert_int_equal(rc, LMS_EFORMAT);
    assert_int_equal(lms_last_error_code(), LMS_EFORMAT);
    assert_string_equal(lms_last_error(), "a.safetensors: tensor 'w' bad");
    lms__err_prefix(LMS_EFORMAT, "import 'm': ");
    assert_string_equal(lms_last_error(), "import 'm': a.safetensors: tensor 'w' bad");
    assert_string_equal(lms_strerror(LMS_ENOENT), "not found");
    assert_string_equal(lms_strerror(12345), "unknown error");
}

static void fault_fails_nth_alloc_only(void **state)
{
    (void)state;
    lms__fault_arm(LMS_FAULT_ALLOC, 3, false);
    void *a = lms__malloc(8), *b = lms__malloc(8), *c = lms__malloc(8), *d = lms__malloc(8);
    assert_non_null(a);
    assert_non_null(b);
    assert_null(c);
    assert_int_equal(lms_last_error_code(), LMS_ENOMEM);
    assert_non_null(d);
    lms__free(a);
    lms__free(b);
    lms__free(d);
    lms__fault_arm(LMS_FAULT_ALLOC, 1, true);
    assert_null(lms__malloc(1));
    assert_null(lms__strdup("x"));
    lms__fault_disarm_all();
    void *e = lms__malloc(1);
    assert_non_null(e);
    lms__free(e);
}

static void fault_fails_writes_and_fsync(void **state)
{
    (void)state;
    char *dir = lms_test_tmpdir("fault");
    char path[512];
    snprintf(path, sizeof path, "%s/f", dir);
    int fd = lms__open(path, O_RDWR | O_CREAT, 0644);
    assert_true(fd >= 0);
    lms__fault_arm(LMS_FAULT_WRITE, 1, false);
    assert_int_equal(lms__pwrite_all(fd, "abc", 3, 0, path), LMS_EIO);
    assert_non_null(strstr(lms_last_error(), path));
    assert_int_equal(lms__pwrite_all(fd, "abc", 3, 0, path), 0);
    lms__fault_arm(LMS_FAULT_FSYNC, 1, false);
    assert_int_equal(lms__fsync(fd, path), LMS_EIO);
    assert_int_equal(lms__fsync(fd, path), 0);
    char buf[4];
    assert_int_equal(lms__pread_all(fd, buf, 4, 0, path), LMS_EFORMAT); /* truncated */
    assert_non_null(strstr(lms_last_error(), "truncated"));
    assert_int_equal(lms__pread_all(fd, buf, 3, 0, path), 0);
    assert_memory_equal(buf, "abc", 3);
    close(fd);
    lms_test_rmrf(dir);
    free(dir);
}

static void hash_matches_xxh3_reference_values(void **state)
{
    (void)state;
    /* XXH3_64bits("") and XXH3_128bits("") from the xxHash spec. */
    assert_true(lms__hash64("", 0, 0) == 0x2D06800538D394C2ULL);
    lms_hash128 h = lms__hash128("", 0);
    assert_true(h.hi == 0x99AA06D3014798D8ULL && h.lo == 0x6001C324468D497FULL);
    /* streaming equals one-shot */
    char data[1000];
    for (int i = 0; i < 1000; i++)
        data[i] = (char)(i * 7);
    lms_hasher *s = lms__hasher_new();
    lms__hasher_update(s, data, 333);
    lms__hasher_update(s, data + 333, 667);
    assert_true(lms__hash128_eq(lms__hasher_digest(s), lms__hash128(data, 1000)));
    lms__hasher_free(s);
    uint8_t buf[16];
    lms__hash128_put(buf, h);
    assert_true(lms__hash128_eq(lms__hash128_get(buf), h));
    char hex[33];
    lms__hash128_hex(h, hex);
    assert_string_equal(hex, "99aa06d3014798d86001c324468d497f");
}

static atomic_int hits[1000];
static void mark(void *arg, size_t i, int worker)
{
    (void)arg;
    (void)worker;
    atomic_fetch_add(&hits[i], 1);
}

static void pool_runs_every_item_exactly_once(void **state)
{
    (void)state;
    lms_pool *p;
    assert_int_equal(lms__pool_create(4, &p), 0);
    assert_int_equal(lms__pool_threads(p), 4);
    for (int round = 0; round < 50; round++) {
        memset(hits, 0, sizeof hits);
        lms__pool_run(p, 1000, mark, NULL);
        for (int i = 0; i < 1000; i++)
            assert_int_equal(hits[i], 1);
    }
    lms__pool_destroy(p);
    lms__pool_destroy(NULL);
}

typedef struct short_run {
    atomic_int count[8]; /* at the same stack address every run: an item run late or twice counts twice */
} short_run;

static void mark_run(void *arg, size_t i, int worker)
{
    short_run *r = arg;
    if (i % 3 == 0) /* uneven items: some threads finish early and wait or sleep */
        for (volatile int k = 0; k < 3000 * (worker + 1); k++) {
        }
    atomic_fetch_add(&r->count[i], 1);
}

/* Thousands of runs of 2 to 8 items back to back (the engine's decode
 * pattern, with workers spinning, sleeping and waking late): each item of
 * each run exactly once, and every run complete when lms__pool_run returns. */
static void pool_short_runs_back_to_back_run_each_item_once(void **state)
{
    (void)state;
    lms_pool *p;
    assert_int_equal(lms__pool_create(3, &p), 0);
    for (int round = 0; round < 20000; round++) {
        short_run r;
        for (size_t i = 0; i < 8; i++) atomic_init(&r.count[i], 0);
        size_t n = 2 + (size_t)round % 7;
        lms__pool_run(p, n, mark_run, &r);
        for (size_t i = 0; i < 8; i++)
            assert_int_equal(atomic_load(&r.count[i]), i < n ? 1 : 0);
        if (round % 1000 == 999)
            usleep(1000); /* let the workers fall asleep */
    }
    lms__pool_destroy(p);
}

static void utf8_validation(void **state)
{
    (void)state;
    assert_true(lms__utf8_valid("abc", 3));
    assert_true(lms__utf8_valid("\xc3\xa9\xe4\xb8\xad\xf0\x9f\x98\x80", 9));
    assert_false(lms__utf8_valid("\xc3", 1));             /* truncated */
    assert_false(lms__utf8_valid("\xc0\xaf", 2));         /* overlong */
    assert_false(lms__utf8_valid("\xed\xa0\x80", 3));     /* surrogate */
    assert_false(lms__utf8_valid("\xf4\x90\x80\x80", 4)); /* > U+10FFFF */
    assert_false(lms__utf8_valid("\xff", 1));
}

static void read_file_caps_size(void **state)
{
    (void)state;
    char *dir = lms_test_tmpdir("rf");
    char path[512];
    snprintf(path, sizeof path, "%s/x", dir);
    assert_int_equal(lms__write_file_atomic(path, "hello", 5), 0);
    char *buf;
    size_t len;
    assert_int_equal(lms__read_file(path, 100, &buf, &len), 0);
    assert_int_equal(len, 5);
    assert_string_equal(buf, "hello");
    lms__free(buf);
    assert_int_equal(lms__read_file(path, 4, &buf, &len), LMS_ERANGE);
    assert_null(buf);
    snprintf(path, sizeof path, "%s/missing", dir);
    assert_int_equal(lms__read_file(path, 4, &buf, &len), LMS_ENOENT);
    lms_test_rmrf(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(err_sets_code_and_detail),
        cmocka_unit_test(fault_fails_nth_alloc_only),
        cmocka_unit_test(fault_fails_writes_and_fsync),
        cmocka_unit_test(hash_matches_xxh3_reference_values),
        cmocka_unit_test(pool_runs_every_item_exactly_once),
        cmocka_unit_test(pool_short_runs_back_to_back_run_each_item_once),
        cmocka_unit_test(utf8_validation),
        cmocka_unit_test(read_file_caps_size),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
