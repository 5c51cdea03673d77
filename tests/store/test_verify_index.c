/*
 * tests/store/test_verify_index.c - lms_store_verify's index checks: each
 * kind of damage is written into a freshly imported store with the store's
 * own record codecs, and verify must report it with the right kind, naming
 * the model and tensor, while an undamaged store reports nothing.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "lmstore/store.h"
#include "store/admin_internal.h"
#include "store/store_internal.h"
#include "testutil.h"

static char *g_dir, *g_src;

static int setup(void **state)
{
    (void)state;
    g_dir = lms_test_tmpdir("verifyidx");
    if (asprintf(&g_src, "%s/src", g_dir) < 0)
        return -1;
    return lms_test_sh(NULL, "python3 '%s/tests/gen_model.py' '%s' --force --arch llama --hidden 32 --layers 2 "
                       "--vocab 128 --seed 4", lms_test_src(), g_src) == 0 ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    lms_test_rmrf(g_dir);
    free(g_dir);
    free(g_src);
    return 0;
}

typedef struct found {
    int n;
    char kinds[512];
    char text[8192];
} found;

static void collect(void *ctx, const lms_verify_problem *p)
{
    found *f = ctx;
    f->n++;
    size_t l = strlen(f->kinds);
    snprintf(f->kinds + l, sizeof f->kinds - l, "%s;", p->kind);
    l = strlen(f->text);
    snprintf(f->text + l, sizeof f->text - l, "%s|%s|%s: %s\n", p->kind, p->model ? p->model : "-",
             p->item ? p->item : "-", p->detail);
}

static lms_store *fresh(const char *tag)
{
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", g_dir, tag);
    lms_store *s = NULL;
    assert_int_equal(lms_store_open(path, LMS_STORE_CREATE, NULL, &s), 0);
    lms_import_params ip = lms_import_default_params();
    ip.name = "m";
    ip.threads = 1;
    assert_int_equal(lms_import(s, g_src, &ip, NULL), 0);
    found f = {0};
    lms_verify_report r;
    assert_int_equal(lms_store_verify(s, NULL, collect, &f, &r), 0);
    assert_int_equal(f.n, 0);
    return s;
}

typedef struct edit {
    int what;
    const char *tensor;
} edit;

enum { DEL_BLOB, REFS_UP, BLOB_PAST_END, BLOB_OVERLAP, BAD_TENSOR_REC, ORPHAN_TENSOR, BAD_FILE_REC, BAD_MODEL_TOTALS };

static int edit_txn(lms_store *s, MDB_txn *txn, void *vctx)
{
    edit *e = vctx;
    lms__tensor_rec tr;
    MDB_val v;
    char key[512];
    size_t kl = lms__key_item(key, sizeof key, "m", e->tensor);
    int rc = lms__db_get(s, txn, LMS__DB_TENSORS, key, kl, &v);
    if (rc)
        return rc;
    if ((rc = lms__tensor_rec_decode(v.mv_data, v.mv_size, &tr)))
        return rc;
    lms__blob_rec br;
    if ((rc = lms__blob_get(s, txn, tr.hash, &br)))
        return rc;
    switch (e->what) {
    case DEL_BLOB:
        return lms__db_del(s, txn, LMS__DB_BLOBS, tr.hash, 16);
    case REFS_UP:
        return lms__blob_ref(s, txn, tr.hash, +2, NULL);
    case BLOB_PAST_END:
        br.offset += 1ull << 30;
        return lms__blob_put(s, txn, tr.hash, &br);
    case BLOB_OVERLAP: {
        /* a second blob record claiming the same bytes */
        uint8_t h2[16];
        memcpy(h2, tr.hash, 16);
        h2[0] ^= 0xff;
        br.refs = 0;
        return lms__blob_put(s, txn, h2, &br);
    }
    case BAD_TENSOR_REC: {
        uint8_t junk[5] = {1, 0, 99, 0, 0};
        return lms__db_put(s, txn, LMS__DB_TENSORS, key, kl, junk, sizeof junk, 0);
    }
    case ORPHAN_TENSOR: {
        char k2[512];
        size_t k2l = lms__key_item(k2, sizeof k2, "ghost", e->tensor);
        if ((rc = lms__db_put(s, txn, LMS__DB_TENSORS, k2, k2l, v.mv_data, v.mv_size, 0)))
            return rc;
        return lms__blob_ref(s, txn, tr.hash, +1, NULL);
    }
    case BAD_FILE_REC: {
        char k3[512];
        size_t k3l = lms__key_item(k3, sizeof k3, "m", "config.json");
        uint8_t *rec;
        size_t len;
        if ((rc = lms__file_rec_encode("{\"a\":1}", 7, 1, &rec, &len)))
            return rc;
        rec[16] ^= 1; /* the checksum of the raw bytes */
        rc = lms__db_put(s, txn, LMS__DB_FILES, k3, k3l, rec, len, 0);
        lms__free(rec);
        return rc;
    }
    case BAD_MODEL_TOTALS: {
        if ((rc = lms__db_get(s, txn, LMS__DB_MODELS, "m", 1, &v)))
            return rc;
        lms__model_rec mr;
        if ((rc = lms__model_rec_decode(v.mv_data, v.mv_size, &mr)))
            return rc;
        mr.n_tensors += 1;
        uint8_t *rec;
        size_t len;
        if ((rc = lms__model_rec_encode(&mr, &rec, &len)))
            return rc;
        rc = lms__db_put(s, txn, LMS__DB_MODELS, "m", 1, rec, len, 0);
        lms__free(rec);
        return rc;
    }
    }
    return LMS_EINVAL;
}

static found damage(const char *tag, int what, const char *tensor)
{
    lms_store *s = fresh(tag);
    edit e = {what, tensor};
    lms__lock lock; /* the edits add references and write blob records: the append lock's */
    assert_int_equal(lms__lock_take(s, &lock), 0);
    assert_int_equal(lms__txn_write(s, edit_txn, &e), 0);
    lms__lock_release(s, &lock);
    found f = {0};
    lms_verify_report r;
    lms_verify_params vp = lms_verify_default_params();
    assert_int_equal(lms_store_verify(s, &vp, collect, &f, &r), 0);
    assert_int_equal(r.problems, (uint64_t)f.n);
    assert_int_equal(lms_store_close(s), 0);
    return f;
}

#define T "model.layers.1.mlp.up_proj.weight"

static void verify_reports_a_missing_blob_naming_the_tensor(void **state)
{
    (void)state;
    found f = damage("del", DEL_BLOB, T);
    assert_non_null(strstr(f.text, "missing-blob|m|" T));
}

static void verify_reports_a_wrong_reference_count(void **state)
{
    (void)state;
    found f = damage("refs", REFS_UP, T);
    assert_int_equal(f.n, 1);
    assert_non_null(strstr(f.text, "refcount|"));
    assert_non_null(strstr(f.text, "records 3 references but 1 records reference it"));
}

static void verify_reports_a_blob_outside_its_segment(void **state)
{
    (void)state;
    found f = damage("past", BLOB_PAST_END, T);
    assert_int_equal(f.n, 1);
    assert_non_null(strstr(f.kinds, "blob-range;"));
}

static void verify_reports_overlapping_blobs(void **state)
{
    (void)state;
    found f = damage("overlap", BLOB_OVERLAP, T);
    assert_non_null(strstr(f.kinds, "blob-overlap;"));
}

static void verify_reports_an_undecodable_tensor_record(void **state)
{
    (void)state;
    found f = damage("badrec", BAD_TENSOR_REC, T);
    assert_non_null(strstr(f.text, "record|m|" T));
}

static void verify_reports_a_tensor_without_a_model(void **state)
{
    (void)state;
    found f = damage("orphan", ORPHAN_TENSOR, T);
    assert_int_equal(f.n, 1);
    assert_non_null(strstr(f.text, "record|ghost|" T));
}

static void verify_reports_a_side_file_that_fails_its_checksum(void **state)
{
    (void)state;
    found f = damage("file", BAD_FILE_REC, T);
    assert_int_equal(f.n, 1);
    assert_non_null(strstr(f.text, "file|m|config.json"));
}

static void verify_reports_model_totals_that_disagree_with_its_tensors(void **state)
{
    (void)state;
    found f = damage("totals", BAD_MODEL_TOTALS, T);
    assert_int_equal(f.n, 1);
    assert_non_null(strstr(f.text, "model|m|"));
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(verify_reports_a_missing_blob_naming_the_tensor),
        cmocka_unit_test(verify_reports_a_wrong_reference_count),
        cmocka_unit_test(verify_reports_a_blob_outside_its_segment),
        cmocka_unit_test(verify_reports_overlapping_blobs),
        cmocka_unit_test(verify_reports_an_undecodable_tensor_record),
        cmocka_unit_test(verify_reports_a_tensor_without_a_model),
        cmocka_unit_test(verify_reports_a_side_file_that_fails_its_checksum),
        cmocka_unit_test(verify_reports_model_totals_that_disagree_with_its_tensors),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
