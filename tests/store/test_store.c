/*
 * tests/store/test_store.c - the store's internal machinery: creating and
 * reopening a store, record round trips and rejections, segment headers, the
 * appender (aligned reservations, rollover past segment_max, rollback that
 * restores the tree byte for byte) and map growth on MDB_MAP_FULL.
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "store/admin_internal.h"
#include "store/store_internal.h"
#include "testutil.h"

static void open_creates_store_and_reopen_keeps_settings(void **state)
{
    (void)state;
    char *dir = lms_test_tmpdir("open");
    char path[1024];
    snprintf(path, sizeof path, "%s/st", dir);
    lms_store *s = NULL;
    assert_int_equal(lms_store_open(path, 0, NULL, &s), LMS_ENOENT);
    assert_null(s);
    lms_store_params p = lms_store_default_params();
    p.alignment = 65536;
    assert_int_equal(lms_store_open(path, LMS_STORE_CREATE, &p, &s), 0);
    assert_int_equal(lms_store_alignment(s), 65536);
    uint8_t uuid[16];
    memcpy(uuid, s->uuid, 16);
    assert_int_equal(lms_store_close(s), 0);
    p.alignment = 4096; /* ignored for an existing store */
    assert_int_equal(lms_store_open(path, LMS_STORE_RDONLY, &p, &s), 0);
    assert_int_equal(lms_store_alignment(s), 65536);
    assert_memory_equal(uuid, s->uuid, 16);
    lms__store_ref(s);
    assert_int_equal(lms_store_close(s), LMS_EBUSY);
    lms__store_unref(s);
    assert_int_equal(lms_store_close(s), 0);
    assert_int_equal(lms_store_close(NULL), 0);
    lms_test_rmrf(dir);
    free(dir);
}

static void bad_alignment_is_rejected(void **state)
{
    (void)state;
    lms_store *s = NULL;
    lms_store_params p = lms_store_default_params();
    p.alignment = 3000;
    assert_int_equal(lms_store_open("/nonexistent/x", LMS_STORE_CREATE, &p, &s), LMS_EINVAL);
    assert_non_null(strstr(lms_last_error(), "power of two"));
}

static void records_round_trip_and_reject_garbage(void **state)
{
    (void)state;
    lms__blob_rec b = {.kind = 0, .segment = 7, .offset = 8192, .size = 123, .refs = 2}, b2;
    uint8_t buf[LMS__BLOB_REC_SIZE];
    lms__blob_rec_encode(&b, buf);
    assert_int_equal(lms__blob_rec_decode(buf, sizeof buf, &b2), 0);
    assert_int_equal(b2.segment, 7);
    assert_int_equal(b2.offset, 8192);
    assert_int_equal(b2.refs, 2);
    assert_int_equal(lms__blob_rec_decode(buf, 31, &b2), LMS_ECORRUPT);
    buf[0] = 9;
    assert_int_equal(lms__blob_rec_decode(buf, sizeof buf, &b2), LMS_EVERSION);

    lms__tensor_rec t = {.dtype = LMS_DTYPE_BF16, .ndim = 2, .shape = {3, 5}, .nbytes = 30, .layer = 4,
                         .order = 9},
                    t2;
    memset(t.hash, 0xab, 16);
    uint8_t tb[LMS__TENSOR_REC_FIXED + 64];
    size_t n = lms__tensor_rec_encode(&t, tb);
    assert_int_equal(n, lms__tensor_rec_size(2));
    assert_int_equal(lms__tensor_rec_decode(tb, n, &t2), 0);
    assert_int_equal(t2.shape[1], 5);
    assert_int_equal(t2.layer, 4);
    assert_int_equal(t2.order, 9);
    assert_memory_equal(t2.hash, t.hash, 16);
    lms__put_u64(tb + 16, 31); /* nbytes no longer matches the shape */
    assert_int_equal(lms__tensor_rec_decode(tb, n, &t2), LMS_ECORRUPT);
    assert_int_equal(lms__tensor_rec_decode(tb, n - 1, &t2), LMS_ECORRUPT);

    lms__model_rec m = {.n_tensors = 3, .arch = "LlamaForCausalLM", .arch_len = 16, .source = "/x", .source_len = 2,
                        .st_meta = "{}", .st_meta_len = 2},
                   m2;
    uint8_t *mb;
    size_t ml;
    assert_int_equal(lms__model_rec_encode(&m, &mb, &ml), 0);
    assert_int_equal(lms__model_rec_decode(mb, ml, &m2), 0);
    assert_int_equal(m2.arch_len, 16);
    assert_memory_equal(m2.arch, "LlamaForCausalLM", 16);
    assert_int_equal(lms__model_rec_decode(mb, ml - 1, &m2), LMS_ECORRUPT);
    lms__free(mb);

    const char text[] = "{\"architectures\": [\"X\"]}";
    uint8_t *fb;
    size_t fl;
    char *out;
    size_t outl;
    lms__file_rec fr;
    assert_int_equal(lms__file_rec_encode(text, sizeof text - 1, 3, &fb, &fl), 0);
    assert_int_equal(lms__file_rec_decode(fb, fl, &fr), 0);
    assert_int_equal(lms__file_rec_inflate(&fr, "f", &out, &outl), 0);
    assert_int_equal(outl, sizeof text - 1);
    assert_string_equal(out, text);
    lms__free(out);
    fb[fl - 1] ^= 0x55; /* corrupt the frame */
    assert_int_equal(lms__file_rec_decode(fb, fl, &fr), 0);
    assert_int_not_equal(lms__file_rec_inflate(&fr, "f", &out, &outl), 0);
    assert_null(out);
    lms__free(fb);
}

static void segment_header_detects_damage(void **state)
{
    (void)state;
    uint8_t uuid[16] = {1, 2, 3}, other[16] = {9};
    uint8_t h[LMS__SEG_HEADER_SIZE];
    lms__segment_header_encode(h, 5, uuid, 4096, 1000);
    assert_int_equal(lms__segment_header_check(h, sizeof h, uuid, 5, "s"), 0);
    assert_int_equal(lms__segment_header_check(h, sizeof h, other, 5, "s"), LMS_ECORRUPT);
    assert_int_equal(lms__segment_header_check(h, sizeof h, uuid, 6, "s"), LMS_ECORRUPT);
    assert_int_equal(lms__segment_header_check(h, 100, uuid, 5, "s"), LMS_ECORRUPT);
    uint8_t be[LMS__SEG_HEADER_SIZE];
    memcpy(be, h, sizeof be);
    be[8] = 0x0A, be[9] = 0x0B, be[10] = 0x0C, be[11] = 0x0D; /* byte-swapped mark */
    assert_int_equal(lms__segment_header_check(be, sizeof be, uuid, 5, "s"), LMS_ECORRUPT);
    assert_non_null(strstr(lms_last_error(), "big-endian"));
    for (size_t i = 0; i < sizeof h; i += 97) {
        memcpy(be, h, sizeof be);
        be[i] ^= 0x10;
        assert_int_not_equal(lms__segment_header_check(be, sizeof be, uuid, 5, "s"), 0);
    }
}

static void appender_aligns_rolls_over_and_rolls_back(void **state)
{
    (void)state;
    char *dir = lms_test_tmpdir("append");
    lms_store *s;
    lms_store_params p = {.alignment = 4096, .segment_max = 64 * 1024};
    assert_int_equal(lms_store_open(dir, LMS_STORE_CREATE, &p, &s), 0);

    lms__appender *a;
    uint32_t seg, seg2;
    uint64_t off, off2;
    char buf[5000];
    memset(buf, 'x', sizeof buf);
    assert_int_equal(lms__append_begin(s, &a), 0);
    assert_int_equal(lms__append_reserve(a, 5000, &seg, &off), 0);
    assert_int_equal(seg, 1);
    assert_int_equal(off, 4096);
    assert_int_equal(lms__append_write(a, seg, off, buf, 5000), 0);
    assert_int_equal(lms__append_reserve(a, 10, &seg2, &off2), 0);
    assert_int_equal(off2, 12288);
    assert_int_equal(lms__append_write(a, seg2, off2, buf, 10), 0);
    assert_int_equal(lms__append_sync(a), 0);
    lms__append_end(a, true);

    uint64_t before = lms_test_tree_digest(dir);
    char segpath[4096];
    assert_int_equal(lms__append_begin(s, &a), 0);
    assert_int_equal(lms__append_reserve(a, 100, &seg, &off), 0);
    assert_int_equal(seg, 1);
    assert_int_equal(off, 16384);
    assert_int_equal(lms__append_write(a, seg, off, buf, 100), 0);
    assert_int_equal(lms__append_reserve(a, 60000, &seg, &off), 0); /* past 64 KiB: next segment */
    assert_int_equal(seg, 2);
    assert_int_equal(off, 4096);
    assert_int_equal(lms__append_write(a, seg, off, buf, 100), 0);
    assert_int_equal(lms__append_sync(a), 0);
    lms__segment_path(s, 2, segpath, sizeof segpath);
    assert_true(access(segpath, F_OK) == 0);
    lms__append_end(a, false);
    assert_true(access(segpath, F_OK) != 0);
    assert_true(lms_test_tree_digest(dir) == before);

    lms__segmap m;
    assert_int_equal(lms__segment_map(s, 1, &m), 0);
    assert_int_equal(m.size, 12288 + 10);
    assert_memory_equal(m.base + 4096, buf, 5000);
    lms__segment_unmap(&m);
    assert_int_equal(lms__segment_map(s, 9, &m), LMS_ENOENT);
    lms__segment_unmap(&m);
    assert_int_equal(lms_store_close(s), 0);
    lms_test_rmrf(dir);
    free(dir);
}

typedef struct fill_ctx {
    int n;
    size_t vlen;
} fill_ctx;

static int fill(lms_store *s, MDB_txn *txn, void *vctx)
{
    fill_ctx *c = vctx;
    char *v = calloc(1, c->vlen);
    int rc = 0;
    for (int i = 0; i < c->n && !rc; i++) {
        char k[32];
        int kl = snprintf(k, sizeof k, "k%06d", i);
        v[0] = (char)i;
        rc = lms__db_put(s, txn, LMS__DB_KVPAGES, k, (size_t)kl, v, c->vlen, 0);
    }
    free(v);
    return rc;
}

static void write_txn_grows_map_when_full(void **state)
{
    (void)state;
    char *dir = lms_test_tmpdir("grow");
    lms_store *s;
    setenv("LMSTORE_INITIAL_MAP_SIZE", "262144", 1);
    assert_int_equal(lms_store_open(dir, LMS_STORE_CREATE, NULL, &s), 0);
    unsetenv("LMSTORE_INITIAL_MAP_SIZE");
    fill_ctx c = {.n = 400, .vlen = 8192}; /* ~3.3 MB: several doublings */
    assert_int_equal(lms__txn_write(s, fill, &c), 0);
    MDB_txn *txn;
    MDB_val v;
    assert_int_equal(lms__txn_read(s, &txn), 0);
    assert_int_equal(lms__db_get(s, txn, LMS__DB_KVPAGES, "k000399", 7, &v), 0);
    assert_int_equal(v.mv_size, 8192);
    lms__txn_end(s, txn);
    assert_int_equal(lms_store_close(s), 0);
    lms_test_rmrf(dir);
    free(dir);
}

/* lms__append_locked (what the invariant-3 assertions read) is true exactly
 * while an append session or an admin lock of this handle holds STORE/lock. */
static void append_lock_is_tracked_while_held(void **state)
{
    (void)state;
    char *dir = lms_test_tmpdir("lockflag");
    lms_store *s;
    assert_int_equal(lms_store_open(dir, LMS_STORE_CREATE, NULL, &s), 0);
    assert_false(lms__append_locked(s));
    lms__appender *a;
    assert_int_equal(lms__append_begin(s, &a), 0);
    assert_true(lms__append_locked(s));
    lms__append_end(a, false);
    assert_false(lms__append_locked(s));
    lms__lock lk;
    assert_int_equal(lms__lock_take(s, &lk), 0);
    assert_true(lms__append_locked(s));
    lms__lock_release(s, &lk);
    assert_false(lms__append_locked(s));
    lms__lock_release(s, &lk); /* not held: nothing to release */
    assert_false(lms__append_locked(s));
    assert_int_equal(lms_store_close(s), 0);
    lms_test_rmrf(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(open_creates_store_and_reopen_keeps_settings),
        cmocka_unit_test(bad_alignment_is_rejected),
        cmocka_unit_test(records_round_trip_and_reject_garbage),
        cmocka_unit_test(segment_header_detects_damage),
        cmocka_unit_test(appender_aligns_rolls_over_and_rolls_back),
        cmocka_unit_test(write_txn_grows_map_when_full),
        cmocka_unit_test(append_lock_is_tracked_while_held),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
