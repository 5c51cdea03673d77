/*
 * tests/store/test_gc_kv.c - gc and verify over saved KV caches: KV pages
 * are blobs (kind KVPAGE) referenced by kvpages records, which sessions
 * name. gc must delete the pages no session names (and their bytes), keep
 * the others, and verify must hash KV page blobs and check their counts.
 * The records are written here with the store's own encoders, the way
 * kvcache persistence writes them (store/kv_records.h).
 */
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "lmstore/store.h"
#include "store/admin_internal.h"
#include "store/kv_records.h"
#include "store/store_internal.h"
#include "testutil.h"

#define N_PAGES 4
#define PAGE_BYTES 10000

typedef struct kvfix {
    uint8_t key[N_PAGES][16];   /* kvpages keys */
    uint8_t blob[N_PAGES][16];  /* blob hashes */
    uint32_t seg[N_PAGES];
    uint64_t off[N_PAGES];
    uint8_t *bytes[N_PAGES];
} kvfix;

typedef struct put_ctx {
    kvfix *f;
    const uint32_t *session_pages; /* indexes into f, or NULL: no session */
    uint32_t n_session_pages;
    const char *session;
} put_ctx;

static int put_txn(lms_store *s, MDB_txn *txn, void *vctx)
{
    put_ctx *c = vctx;
    for (int i = 0; i < N_PAGES; i++) {
        lms__blob_rec br = {LMS__BLOB_KVPAGE, c->f->seg[i], c->f->off[i], PAGE_BYTES, 1};
        int rc = lms__blob_put(s, txn, c->f->blob[i], &br);
        if (rc)
            return rc;
        lms__kvpage_rec pr = {0};
        pr.codec = LMS__KV_CODEC_RAW;
        pr.elem_size = 2;
        pr.n_tokens = 16;
        pr.raw_size = PAGE_BYTES;
        pr.raw_hash = lms__hash64(c->f->bytes[i], PAGE_BYTES, 0);
        memcpy(pr.blob, c->f->blob[i], 16);
        pr.stored_size = PAGE_BYTES;
        uint8_t buf[LMS__KVPAGE_REC_SIZE];
        lms__kvpage_rec_encode(&pr, buf);
        if ((rc = lms__db_put(s, txn, LMS__DB_KVPAGES, c->f->key[i], 16, buf, sizeof buf, 0)))
            return rc;
    }
    if (!c->session_pages)
        return 0;
    uint32_t n_tokens = 16 * c->n_session_pages;
    uint8_t *tokens = calloc(n_tokens, 4), keys[N_PAGES * 16];
    for (uint32_t i = 0; i < n_tokens; i++)
        lms__put_u32(tokens + 4 * i, 1000 + i);
    for (uint32_t i = 0; i < c->n_session_pages; i++)
        memcpy(keys + 16 * i, c->f->key[c->session_pages[i]], 16);
    lms__session_rec sr = {0};
    sr.version = LMS__SESSION_VERSION;
    sr.n_layers = 2;
    sr.n_kv_heads = 2;
    sr.head_dim = 8;
    sr.dtype = LMS_DTYPE_BF16;
    sr.page_tokens = 16;
    sr.n_tokens = n_tokens;
    sr.n_pages = c->n_session_pages;
    sr.tokens = tokens;
    sr.page_keys = keys;
    size_t len = lms__session_rec_size(&sr);
    uint8_t *rec = malloc(len);
    lms__session_rec_encode(&sr, rec);
    int rc = lms__db_put(s, txn, LMS__DB_SESSIONS, c->session, strlen(c->session), rec, len, 0);
    free(rec);
    free(tokens);
    return rc;
}

static lms_store *make_store(kvfix *f, char **dir_out)
{
    char *dir = lms_test_tmpdir("gckv");
    char path[1024];
    snprintf(path, sizeof path, "%s/st", dir);
    lms_store *s = NULL;
    assert_int_equal(lms_store_open(path, LMS_STORE_CREATE, NULL, &s), 0);
    lms__appender *a = NULL;
    assert_int_equal(lms__append_begin(s, &a), 0);
    srand(7);
    for (int i = 0; i < N_PAGES; i++) {
        f->bytes[i] = malloc(PAGE_BYTES);
        for (int j = 0; j < PAGE_BYTES; j++)
            f->bytes[i][j] = (uint8_t)rand();
        lms__hash128_put(f->blob[i], lms__hash128(f->bytes[i], PAGE_BYTES));
        memset(f->key[i], 0x10 + i, 16);
        assert_int_equal(lms__append_reserve(a, PAGE_BYTES, &f->seg[i], &f->off[i]), 0);
        assert_int_equal(lms__append_write(a, f->seg[i], f->off[i], f->bytes[i], PAGE_BYTES), 0);
    }
    assert_int_equal(lms__append_sync(a), 0);
    /* session "chat" names pages 0 and 1; pages 2 and 3 are unreferenced */
    static const uint32_t pages[] = {0, 1};
    put_ctx c = {f, pages, 2, "chat"};
    assert_int_equal(lms__txn_write(s, put_txn, &c), 0);
    lms__append_end(a, true);
    *dir_out = dir;
    return s;
}

static void free_fix(kvfix *f)
{
    for (int i = 0; i < N_PAGES; i++)
        free(f->bytes[i]);
}

static bool has_key(lms_store *s, int db, const uint8_t key[16])
{
    MDB_txn *txn;
    MDB_val v;
    assert_int_equal(lms__txn_read(s, &txn), 0);
    int rc = lms__db_get(s, txn, db, key, 16, &v);
    lms__txn_end(s, txn);
    return rc == 0;
}

typedef struct problems {
    int n;
    char text[4096];
} problems;

static void collect(void *ctx, const lms_verify_problem *p)
{
    problems *c = ctx;
    c->n++;
    size_t l = strlen(c->text);
    snprintf(c->text + l, sizeof c->text - l, "%s: %s\n", p->kind, p->detail);
}

static void gc_deletes_kv_pages_no_session_names_and_keeps_the_rest(void **state)
{
    (void)state;
    kvfix f = {0};
    char *dir;
    lms_store *s = make_store(&f, &dir);
    problems pr = {0};
    lms_verify_report vr;
    assert_int_equal(lms_store_verify(s, NULL, collect, &pr, &vr), 0);
    assert_int_equal(pr.n, 0);
    assert_int_equal(vr.bytes_hashed, N_PAGES * PAGE_BYTES);
    uint64_t before, after;
    assert_int_equal(lms_store_segment_bytes(s, &before, NULL), 0);

    lms_gc_params gp = lms_gc_default_params();
    gp.dry_run = true;
    lms_gc_report r;
    assert_int_equal(lms_store_gc(s, &gp, NULL, NULL, &r), 0);
    assert_int_equal(r.kvpages_deleted, 2);
    assert_true(has_key(s, LMS__DB_KVPAGES, f.key[3]));

    gp.dry_run = false;
    assert_int_equal(lms_store_gc(s, &gp, NULL, NULL, &r), 0);
    assert_int_equal(r.kvpages_deleted, 2);
    assert_int_equal(r.blobs_deleted, 2);
    assert_true(has_key(s, LMS__DB_KVPAGES, f.key[0]) && has_key(s, LMS__DB_KVPAGES, f.key[1]));
    assert_false(has_key(s, LMS__DB_KVPAGES, f.key[2]) || has_key(s, LMS__DB_KVPAGES, f.key[3]));
    assert_false(has_key(s, LMS__DB_BLOBS, f.blob[2]) || has_key(s, LMS__DB_BLOBS, f.blob[3]));
    assert_int_equal(lms_store_segment_bytes(s, &after, NULL), 0);
    assert_int_equal(after, f.off[1] + PAGE_BYTES); /* pages 2 and 3 were the tail */
    assert_true(after < before);
    memset(&pr, 0, sizeof pr);
    assert_int_equal(lms_store_verify(s, NULL, collect, &pr, &vr), 0);
    assert_int_equal(pr.n, 0);

    /* the session goes: everything goes */
    MDB_txn *txn;
    assert_int_equal(mdb_txn_begin(s->env, NULL, 0, &txn), 0);
    assert_int_equal(lms__db_del(s, txn, LMS__DB_SESSIONS, "chat", 4), 0);
    assert_int_equal(mdb_txn_commit(txn), 0);
    assert_int_equal(lms_store_gc(s, NULL, NULL, NULL, &r), 0);
    assert_int_equal(r.kvpages_deleted, 2);
    assert_int_equal(lms_store_segment_bytes(s, &after, NULL), 0);
    assert_int_equal(after, 0);
    assert_int_equal(lms_store_close(s), 0);
    lms_test_rmrf(dir);
    free(dir);
    free_fix(&f);
}

static void verify_hashes_kv_pages_and_checks_their_counts(void **state)
{
    (void)state;
    kvfix f = {0};
    char *dir;
    lms_store *s = make_store(&f, &dir);
    /* flip one bit of page 1's stored bytes */
    char path[4096];
    assert_int_equal(lms__segment_path(s, f.seg[1], path, sizeof path), 0);
    int fd = open(path, O_RDWR);
    uint8_t b;
    assert_int_equal(pread(fd, &b, 1, (off_t)f.off[1] + 777), 1);
    b ^= 0x20;
    assert_int_equal(pwrite(fd, &b, 1, (off_t)f.off[1] + 777), 1);
    problems pr = {0};
    lms_verify_report vr;
    assert_int_equal(lms_store_verify(s, NULL, collect, &pr, &vr), 0);
    assert_int_equal(pr.n, 1);
    /* named by the session that uses the page, not only by its blob */
    assert_non_null(strstr(pr.text, "corrupt: KV session 'chat' page 1: bytes fail their XXH3-128"));
    b ^= 0x20;
    assert_int_equal(pwrite(fd, &b, 1, (off_t)f.off[1] + 777), 1);
    close(fd);

    /* a wrong count on a KV page blob, and a session naming a missing page
     * (under the append lock, as every writer that adds references) */
    MDB_txn *txn;
    lms__lock lock;
    assert_int_equal(lms__lock_take(s, &lock), 0);
    assert_int_equal(mdb_txn_begin(s->env, NULL, 0, &txn), 0);
    assert_int_equal(lms__blob_ref(s, txn, f.blob[0], +1, NULL), 0);
    assert_int_equal(lms__db_del(s, txn, LMS__DB_KVPAGES, f.key[1], 16), 0);
    assert_int_equal(lms__blob_ref(s, txn, f.blob[1], -1, NULL), 0);
    assert_int_equal(mdb_txn_commit(txn), 0);
    lms__lock_release(s, &lock);
    memset(&pr, 0, sizeof pr);
    assert_int_equal(lms_store_verify(s, NULL, collect, &pr, &vr), 0);
    assert_int_equal(pr.n, 2);
    assert_non_null(strstr(pr.text, "refcount: "));
    assert_non_null(strstr(pr.text, "session 'chat': page 1 ("));
    assert_int_equal(lms_store_close(s), 0);
    lms_test_rmrf(dir);
    free(dir);
    free_fix(&f);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(gc_deletes_kv_pages_no_session_names_and_keeps_the_rest),
        cmocka_unit_test(verify_hashes_kv_pages_and_checks_their_counts),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
