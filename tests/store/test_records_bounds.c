/*
 * tests/store/test_records_bounds.c - a damaged side-file record is
 * LMS_ECORRUPT naming the model and file, never an allocation of the size
 * it claims: lms__file_rec_inflate checks the claimed size against the limit
 * of stored files and against the zstd frame header (or the raw payload)
 * before it allocates. Allocation is made to fail during each check, so a
 * check that came after the allocation would show as LMS_ENOMEM.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "store/store_internal.h"
#include "testutil.h"

/* A zstd frame header (no blocks) declaring `content` bytes: magic, a
 * descriptor with an 8-byte content size field and single segment, then the
 * size. ZSTD_getFrameContentSize reads only this. */
static size_t frame_header(uint8_t *p, uint64_t content)
{
    lms__put_u32(p, 0xFD2FB528u);
    p[4] = 0xE0;
    lms__put_u64(p + 5, content);
    return 13;
}

/* inflate with every allocation failing: returns its code */
static int inflate_no_alloc(const lms__file_rec *r, const char *what)
{
    char *out = (char *)1;
    size_t len = 7;
    lms__fault_arm(LMS_FAULT_ALLOC, 1, true);
    int rc = lms__file_rec_inflate(r, what, &out, &len);
    lms__fault_disarm_all();
    assert_null(out);
    return rc;
}

static void claimed_size_over_the_limit_is_corrupt_before_allocating(void **state)
{
    (void)state;
    const char text[] = "{\"model_type\": \"llama\"}";
    uint8_t *rec;
    size_t rl;
    assert_int_equal(lms__file_rec_encode(text, sizeof text - 1, 3, &rec, &rl), 0);
    lms__put_u64(rec + 8, 1ull << 39); /* the record's raw size, damaged */
    lms__file_rec r;
    assert_int_equal(lms__file_rec_decode(rec, rl, &r), 0);
    assert_int_equal(inflate_no_alloc(&r, "model 'm' file 'config.json'"), LMS_ECORRUPT);
    assert_non_null(strstr(lms_last_error(), "model 'm' file 'config.json'"));
    assert_non_null(strstr(lms_last_error(), "549755813888 bytes"));

    /* just over the limit, too */
    lms__put_u64(rec + 8, (uint64_t)LMS__FILE_RAW_MAX + 1);
    assert_int_equal(lms__file_rec_decode(rec, rl, &r), 0);
    assert_int_equal(inflate_no_alloc(&r, "f"), LMS_ECORRUPT);
    lms__free(rec);
}

static void frame_claiming_more_than_the_record_is_corrupt_before_allocating(void **state)
{
    (void)state;
    uint8_t frame[13];
    size_t fl = frame_header(frame, 1ull << 33);
    /* the record agrees with the frame: over the limit */
    lms__file_rec r = {.codec = LMS__CODEC_ZSTD, .raw_size = 1ull << 33, .payload = frame, .payload_len = fl};
    assert_int_equal(inflate_no_alloc(&r, "model 'm' file 'tokenizer.json'"), LMS_ECORRUPT);
    assert_non_null(strstr(lms_last_error(), "model 'm' file 'tokenizer.json'"));
    /* the record claims little, the frame a lot */
    r.raw_size = 5;
    assert_int_equal(inflate_no_alloc(&r, "model 'm' file 'tokenizer.json'"), LMS_ECORRUPT);
    assert_non_null(strstr(lms_last_error(), "8589934592"));
    /* the record claims a lot (within the limit), the frame little */
    fl = frame_header(frame, 5);
    r.raw_size = LMS__FILE_RAW_MAX;
    assert_int_equal(inflate_no_alloc(&r, "f"), LMS_ECORRUPT);
    /* a frame header cut short, and one without a content size */
    r.payload_len = 3;
    assert_int_equal(inflate_no_alloc(&r, "f"), LMS_ECORRUPT);
    const uint8_t unknown[] = {0x28, 0xB5, 0x2F, 0xFD, 0x00, 0x00};
    r.payload = unknown;
    r.payload_len = sizeof unknown;
    r.raw_size = 5;
    assert_int_equal(inflate_no_alloc(&r, "f"), LMS_ECORRUPT);
    assert_non_null(strstr(lms_last_error(), "no content size"));
}

static void raw_record_longer_than_its_payload_is_corrupt_before_allocating(void **state)
{
    (void)state;
    const uint8_t bytes[5] = "hello";
    lms__file_rec r = {.codec = LMS__CODEC_RAW, .raw_size = 1u << 20, .payload = bytes, .payload_len = 5};
    assert_int_equal(inflate_no_alloc(&r, "model 'm' file 'a.txt'"), LMS_ECORRUPT);
    assert_non_null(strstr(lms_last_error(), "model 'm' file 'a.txt'"));
    r.codec = 7;
    r.raw_size = 5;
    assert_int_equal(inflate_no_alloc(&r, "f"), LMS_ECORRUPT);
}

/* Through the public API: a model whose stored config.json record claims
 * 512 GiB. */
static int put_damaged(lms_store *s, MDB_txn *txn, void *ctx)
{
    (void)ctx;
    lms__model_rec mr = {.n_files = 1, .arch = "", .source = "/src", .source_len = 4, .st_meta = ""};
    uint8_t *rec;
    size_t rl;
    int rc = lms__model_rec_encode(&mr, &rec, &rl);
    if (rc)
        return rc;
    rc = lms__db_put(s, txn, LMS__DB_MODELS, "m", 1, rec, rl, 0);
    lms__free(rec);
    if (rc)
        return rc;
    const char text[] = "{}";
    if ((rc = lms__file_rec_encode(text, 2, 3, &rec, &rl)))
        return rc;
    lms__put_u64(rec + 8, 1ull << 39);
    char key[64];
    size_t kl = lms__key_item(key, sizeof key, "m", "config.json");
    rc = lms__db_put(s, txn, LMS__DB_FILES, key, kl, rec, rl, 0);
    lms__free(rec);
    return rc;
}

static void store_file_with_damaged_record_is_corrupt_naming_model_and_file(void **state)
{
    (void)state;
    char *dir = lms_test_tmpdir("records-bounds");
    char path[1024];
    snprintf(path, sizeof path, "%s/st", dir);
    lms_store *s = NULL;
    assert_int_equal(lms_store_open(path, LMS_STORE_CREATE, NULL, &s), 0);
    assert_int_equal(lms__txn_write(s, put_damaged, NULL), 0);
    void *data = (void *)1;
    size_t len = 0;
    lms__fault_arm(LMS_FAULT_ALLOC, 1, true);
    int rc = lms_store_file(s, "m", "config.json", &data, &len);
    lms__fault_disarm_all();
    assert_int_equal(rc, LMS_ECORRUPT);
    assert_null(data);
    assert_non_null(strstr(lms_last_error(), "model 'm' file 'config.json'"));
    lms_store_close(s);
    lms_test_rmrf(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(claimed_size_over_the_limit_is_corrupt_before_allocating),
        cmocka_unit_test(frame_claiming_more_than_the_record_is_corrupt_before_allocating),
        cmocka_unit_test(raw_record_longer_than_its_payload_is_corrupt_before_allocating),
        cmocka_unit_test(store_file_with_damaged_record_is_corrupt_naming_model_and_file),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
