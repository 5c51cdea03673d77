/*
 * tests/store/test_index_flips.c - every index record carries a checksum
 * (docs/FORMAT.md section 3, store format 2): one flipped bit anywhere in a
 * record's key or value, in every field of every record type (meta, models,
 * tensors, blobs, files, kvpages, sessions), is
 *   - refused by the read that meets it, naming the record (no damaged
 *     dtype, shape, name or count reaches a caller),
 *   - reported by `verify` (index checks only), and
 *   - for the records gc relies on (blobs, tensors, kvpages, sessions), makes
 *     gc refuse and change nothing instead of deleting a live blob.
 * A reference count flipped 2 -> 0 in a store of format 1 (no checksums yet)
 * is caught too: the upgrade keeps the damage, but gc recounts the
 * references and refuses, and verify reports the count.
 *
 * The store is the format-1 fixture (tests/fixtures/store-v1: two models
 * sharing blobs, side files, a KV session), upgraded by a writable open.
 * Bits are flipped with raw LMDB writes that keep the old checksum, as a
 * flip on disk would.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "lmstore/store.h"
#include "store/admin_internal.h"
#include "store/store_internal.h"
#include "testutil.h"

static char *g_dir;

static int setup(void **state)
{
    (void)state;
    g_dir = lms_test_tmpdir("flips");
    return g_dir ? 0 : -1;
}

static int teardown(void **state)
{
    (void)state;
    lms_test_rmrf(g_dir);
    free(g_dir);
    return 0;
}

/* A copy of the format-1 fixture at g_dir/tag. */
static char *copy_fixture(const char *tag)
{
    char *path;
    assert_true(asprintf(&path, "%s/%s", g_dir, tag) > 0);
    assert_int_equal(lms_test_sh(NULL, "rm -rf '%s' && cp -r '%s/tests/fixtures/store-v1/store' '%s'", path,
                                 lms_test_src(), path),
                     0);
    return path;
}

typedef struct found {
    int n;
    char text[16384];
} found;

static void collect(void *ctx, const lms_verify_problem *p)
{
    found *f = ctx;
    f->n++;
    size_t l = strlen(f->text);
    snprintf(f->text + l, sizeof f->text - l, "%s: %s\n", p->kind, p->detail);
}

/* One raw record. */
typedef struct rec {
    uint8_t key[512], val[16384];
    size_t klen, vlen;
} rec;

/* The smallest record of db (the one whose every byte is flipped). */
static void smallest(lms_store *s, int db, rec *out)
{
    MDB_txn *txn;
    MDB_cursor *cur;
    MDB_val k, v;
    out->klen = 0;
    out->vlen = SIZE_MAX;
    assert_int_equal(mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn), 0);
    assert_int_equal(mdb_cursor_open(txn, s->dbi[db], &cur), 0);
    for (int rc = mdb_cursor_get(cur, &k, &v, MDB_FIRST); rc == 0; rc = mdb_cursor_get(cur, &k, &v, MDB_NEXT)) {
        if (db == LMS__DB_META && k.mv_size == 6 && !memcmp(k.mv_data, "format", 6))
            continue; /* read before anything else: its damage is refused at open (below) */
        if (v.mv_size < out->vlen && v.mv_size <= sizeof out->val) {
            memcpy(out->key, k.mv_data, k.mv_size);
            memcpy(out->val, v.mv_data, v.mv_size);
            out->klen = k.mv_size;
            out->vlen = v.mv_size;
        }
    }
    mdb_cursor_close(cur);
    mdb_txn_abort(txn);
    assert_true(out->klen > 0);
}

/* Replace record `from` (key and value as stored) by `to`, raw. */
static void raw_replace(lms_store *s, int db, const rec *from, const rec *to)
{
    MDB_txn *txn;
    assert_int_equal(mdb_txn_begin(s->env, NULL, 0, &txn), 0);
    MDB_val k = {from->klen, (void *)from->key};
    assert_int_equal(mdb_del(txn, s->dbi[db], &k, NULL), 0);
    MDB_val nk = {to->klen, (void *)to->key}, nv = {to->vlen, (void *)to->val};
    assert_int_equal(mdb_put(txn, s->dbi[db], &nk, &nv, 0), 0);
    assert_int_equal(mdb_txn_commit(txn), 0);
}

static bool gc_relies_on(int db)
{
    return db == LMS__DB_BLOBS || db == LMS__DB_TENSORS || db == LMS__DB_KVPAGES || db == LMS__DB_SESSIONS;
}

static void every_bit_of_every_record_type_is_caught(void **state)
{
    (void)state;
    char *path = copy_fixture("every");
    lms_store *s = NULL;
    assert_int_equal(lms_store_open(path, 0, NULL, &s), 0); /* upgrades it */
    assert_int_equal(atomic_load(&s->format), LMS__FORMAT_VERSION);
    uint64_t seg0;
    assert_int_equal(lms_store_segment_bytes(s, &seg0, NULL), 0);
    lms_verify_params vp = lms_verify_default_params();
    vp.hash = false;
    found f = {0};
    lms_verify_report vr;
    assert_int_equal(lms_store_verify(s, &vp, collect, &f, &vr), 0);
    assert_int_equal(f.n, 0);

    int flips = 0;
    for (int db = 0; db < LMS__DB_COUNT; db++) {
        rec *orig = malloc(sizeof *orig), *bad = malloc(sizeof *bad);
        smallest(s, db, orig);
        size_t n = orig->klen + orig->vlen;
        for (size_t i = 0; i < n; i++) {
            *bad = *orig;
            uint8_t bit = (uint8_t)(1u << (i % 8));
            if (i < orig->klen)
                bad->key[i] ^= bit;
            else
                bad->val[i - orig->klen] ^= bit;
            raw_replace(s, db, orig, bad);
            flips++;
            char name[600];
            lms__rec_name(db, bad->key, bad->klen, name, sizeof name);

            /* the read that meets it refuses it, naming the record */
            MDB_txn *txn;
            MDB_val v;
            assert_int_equal(lms__txn_read(s, &txn), 0);
            int grc = lms__db_get(s, txn, db, bad->key, bad->klen, &v);
            lms__txn_end(s, txn);
            if (grc != LMS_ECORRUPT || !strstr(lms_last_error(), name) ||
                !strstr(lms_last_error(), "fails its checksum"))
                fail_msg("db %s byte %zu: read gave %d (%s), want LMS_ECORRUPT naming %s", lms__db_names[db], i, grc,
                         lms_last_error(), name);

            /* verify finds it */
            memset(&f, 0, sizeof f);
            assert_int_equal(lms_store_verify(s, &vp, collect, &f, &vr), 0);
            if (f.n == 0 || !strstr(f.text, "fails its checksum"))
                fail_msg("db %s byte %zu: verify found %d problems:\n%s", lms__db_names[db], i, f.n, f.text);

            /* gc will not delete on a count it cannot trust */
            if (gc_relies_on(db)) {
                lms_gc_report gr;
                int rc = lms_store_gc(s, NULL, NULL, NULL, &gr);
                if (rc != LMS_ECORRUPT || !strstr(lms_last_error(), "gc refuses to delete anything"))
                    fail_msg("db %s byte %zu: gc gave %d (%s)", lms__db_names[db], i, rc, lms_last_error());
                uint64_t seg;
                assert_int_equal(lms_store_segment_bytes(s, &seg, NULL), 0);
                assert_int_equal(seg, seg0);
            }
            raw_replace(s, db, bad, orig);
        }
        free(orig);
        free(bad);
    }
    printf("%d single-bit flips over the 7 record types, each caught\n", flips);
    memset(&f, 0, sizeof f);
    assert_int_equal(lms_store_verify(s, NULL, collect, &f, &vr), 0);
    assert_int_equal(f.n, 0);

    /* the format record is read first of all: a flip there fails the open */
    rec fmt;
    MDB_txn *txn;
    MDB_val k = {6, (void *)"format"}, v;
    assert_int_equal(mdb_txn_begin(s->env, NULL, MDB_RDONLY, &txn), 0);
    assert_int_equal(mdb_get(txn, s->dbi[LMS__DB_META], &k, &v), 0);
    memcpy(fmt.key, "format", 6);
    fmt.klen = 6;
    memcpy(fmt.val, v.mv_data, v.mv_size);
    fmt.vlen = v.mv_size;
    mdb_txn_abort(txn);
    for (size_t i = 0; i < fmt.vlen; i++) {
        rec bad = fmt;
        bad.val[i] ^= (uint8_t)(1u << (i % 8));
        raw_replace(s, LMS__DB_META, &fmt, &bad);
        lms_store *s2 = NULL;
        int rc = lms_store_open(path, LMS_STORE_RDONLY, NULL, &s2);
        assert_true(rc == LMS_ECORRUPT || rc == LMS_EVERSION);
        assert_null(s2);
        raw_replace(s, LMS__DB_META, &bad, &fmt);
    }
    assert_int_equal(lms_store_close(s), 0);
    free(path);
}

/* The blob record a tensor of `model` uses, raw. */
static void blob_of(lms_store *s, const char *model, const char *tensor, rec *out)
{
    MDB_txn *txn;
    MDB_val v;
    char key[512];
    size_t kl = lms__key_item(key, sizeof key, model, tensor);
    lms__tensor_rec tr;
    assert_int_equal(lms__txn_read(s, &txn), 0);
    assert_int_equal(lms__db_get(s, txn, LMS__DB_TENSORS, key, kl, &v), 0);
    assert_int_equal(lms__tensor_rec_decode(v.mv_data, v.mv_size, &tr), 0);
    MDB_val bk = {16, tr.hash};
    assert_int_equal(mdb_get(txn, s->dbi[LMS__DB_BLOBS], &bk, &v), 0);
    memcpy(out->key, tr.hash, 16);
    out->klen = 16;
    memcpy(out->val, v.mv_data, v.mv_size);
    out->vlen = v.mv_size;
    lms__txn_end(s, txn);
}

static void a_count_flipped_before_the_upgrade_makes_gc_refuse(void **state)
{
    (void)state;
    char *path = copy_fixture("v1count");
    lms_store *s = NULL;
    /* read-only: format 1, read as it is */
    assert_int_equal(lms_store_open(path, LMS_STORE_RDONLY, NULL, &s), 0);
    assert_int_equal(atomic_load(&s->format), 1);
    rec orig, bad;
    blob_of(s, "tiny", "model.embed_tokens.weight", &orig);
    assert_int_equal(orig.vlen, LMS__BLOB_REC_SIZE); /* no checksum in format 1 */
    lms__blob_rec br;
    assert_int_equal(lms__blob_rec_decode(orig.val, orig.vlen, &br), 0);
    assert_int_equal(br.refs, 2); /* tiny and tiny-copy */
    assert_int_equal(lms_store_close(s), 0);

    /* the bit that makes 2 -> 0, written raw into the format-1 index */
    bad = orig;
    bad.val[24] ^= 2;
    MDB_env *e;
    MDB_txn *txn;
    MDB_dbi dbi;
    char idx[1024];
    snprintf(idx, sizeof idx, "%s/index", path);
    assert_int_equal(mdb_env_create(&e), 0);
    mdb_env_set_maxdbs(e, 16);
    assert_int_equal(mdb_env_open(e, idx, 0, 0644), 0);
    assert_int_equal(mdb_txn_begin(e, NULL, 0, &txn), 0);
    assert_int_equal(mdb_dbi_open(txn, "blobs", 0, &dbi), 0);
    MDB_val k = {16, bad.key}, v = {bad.vlen, bad.val};
    assert_int_equal(mdb_put(txn, dbi, &k, &v, 0), 0);
    assert_int_equal(mdb_txn_commit(txn), 0);
    mdb_env_close(e);

    /* gc opens it writable (upgrading it, the damage sealed in), recounts, refuses */
    assert_int_equal(lms_store_open(path, 0, NULL, &s), 0);
    assert_int_equal(atomic_load(&s->format), LMS__FORMAT_VERSION);
    uint64_t seg0, seg;
    assert_int_equal(lms_store_segment_bytes(s, &seg0, NULL), 0);
    lms_gc_report gr;
    assert_int_equal(lms_store_gc(s, NULL, NULL, NULL, &gr), LMS_ECORRUPT);
    assert_non_null(strstr(lms_last_error(), "counts 0 references but the index holds 2"));
    assert_non_null(strstr(lms_last_error(), "tensors record 'tiny"));
    assert_int_equal(gr.blobs_deleted, 0);
    assert_int_equal(lms_store_segment_bytes(s, &seg, NULL), 0);
    assert_int_equal(seg, seg0);
    lms_gc_params dry = lms_gc_default_params();
    dry.dry_run = true;
    assert_int_equal(lms_store_gc(s, &dry, NULL, NULL, &gr), LMS_ECORRUPT);

    /* verify recounts and names it; the bytes are all there */
    found f = {0};
    lms_verify_report vr;
    assert_int_equal(lms_store_verify(s, NULL, collect, &f, &vr), 0);
    assert_int_equal(f.n, 1);
    assert_non_null(strstr(f.text, "refcount: blob"));
    assert_non_null(strstr(f.text, "records 0 references but 2 records reference it"));
    assert_int_equal(lms_store_close(s), 0);
    free(path);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(every_bit_of_every_record_type_is_caught),
        cmocka_unit_test(a_count_flipped_before_the_upgrade_makes_gc_refuse),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
