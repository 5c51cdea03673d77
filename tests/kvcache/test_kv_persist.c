/*
 * tests/kvcache/test_kv_persist.c - saving KV sequences into the store and
 * resuming them: exact bytes for every codec (and in a fresh process), each
 * resume failure with its own error and the cache left exactly as it was,
 * shared prefixes stored once, prefix-cache reuse on resume, and the session
 * listing functions behind `lmstore kv`.
 *
 * The binary re-executes itself (`--child-save STORE NAME SEED N`) to save
 * from another process.
 */
#include <fcntl.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "kv_testlib.h"
#include "store/kv_index.h"

static char self_exe[4096];

static lms_store *open_store(const char *dir)
{
    lms_store *st;
    lms_store_params sp = lms_store_default_params();
    sp.alignment = 64;
    assert_int_equal(lms_store_open(dir, LMS_STORE_CREATE, &sp, &st), 0);
    return st;
}

/* Save N tokens of seed `seed` as `name` (shared prefix of `shared` tokens). */
static void save_seq(lms_store *st, const char *name, uint32_t seed, uint32_t n, uint32_t shared, lms_kv_codec codec,
                     lms_kv_io_stats *stats)
{
    lms_kv *kv = kvt_make(NULL, 64, 0);
    lms_kv_seq *s;
    assert_int_equal(lms_kv_seq_new(kv, &s), 0);
    kvt_fill(kv, s, seed, n, shared);
    lms_kv_save_params sp = lms_kv_default_save_params();
    sp.codec = codec;
    sp.threads = 2;
    int rc = lms_kv_save_ex(kv, s, st, name, &sp, stats);
    if (rc)
        fail_msg("save: %s", lms_last_error());
    lms_kv_seq_free(kv, s);
    assert_int_equal(lms_kv_destroy(kv), 0);
}

static void save_then_resume_restores_every_byte_for_each_codec(void **st_)
{
    (void)st_;
    char *dir = lms_test_tmpdir("kv-codecs");
    lms_store *st = open_store(dir);
    const lms_kv_codec codecs[] = {LMS_KV_CODEC_RAW, LMS_KV_CODEC_ZSTD, LMS_KV_CODEC_SHUFFLE_ZSTD};
    for (int c = 0; c < 3; c++) {
        char name[32];
        snprintf(name, sizeof name, "s-%s", lms_kv_codec_name(codecs[c]));
        lms_kv_io_stats ss, rs;
        save_seq(st, name, 10 + c, 23, 0, codecs[c], &ss); /* 5 full pages + 3 tokens */
        assert_int_equal(ss.tokens, 23);
        assert_int_equal(ss.pages, 6);
        assert_int_equal(ss.pages_written, 6);
        if (codecs[c] == LMS_KV_CODEC_RAW)
            assert_int_equal(ss.stored_bytes, ss.raw_bytes);
        else
            assert_true(ss.stored_bytes < ss.raw_bytes);
        lms_kv *kv = kvt_make(NULL, 32, 0);
        lms_kv_seq *s;
        lms_kv_resume_params rp = lms_kv_default_resume_params();
        rp.threads = 2;
        int rc = lms_kv_resume_ex(kv, st, name, &rp, &s, &rs);
        if (rc)
            fail_msg("resume: %s", lms_last_error());
        assert_int_equal(rs.pages_written, 6);
        assert_int_equal(kvt_diff(kv, s, 10 + c, 23, 0), 0);
        assert_int_equal(lms__kv_check(kv), 0);
        /* resumed full pages are keyed: lookup finds them */
        int32_t toks[23];
        for (uint32_t i = 0; i < 23; i++)
            toks[i] = kvt_token(10 + c, i, 0);
        lms_kv_seq *t;
        uint32_t reused;
        assert_int_equal(lms_kv_lookup(kv, toks, 23, &t, &reused), 0);
        assert_int_equal(reused, 20);
        lms_kv_seq_free(kv, t);
        /* a resumed sequence grows like any other: the partial page is its own */
        kvt_fill(kv, s, 10 + c, 5, 0);
        lms_kv_seq_free(kv, s);
        assert_int_equal(lms_kv_destroy(kv), 0);
    }
    assert_int_equal(kvt_check_store(st), 3);
    assert_int_equal(lms_store_close(st), 0);
    lms_test_rmrf(dir);
    free(dir);
}

/* Overwrite the K/V of positions [0, n) of s: a few repeated values (mode
 * 0), values whose high byte holds 6 random bits and low byte 8 (1: about
 * 1.15x smaller by shuffle-zstd), random bits (2). */
static void overwrite_kv(lms_kv *kv, const lms_kv_seq *s, uint32_t n, int mode)
{
    lms_kv_layout L;
    lms_kv_get_layout(kv, &L);
    uint64_t x = 88172645463325252ull;
    for (uint32_t pos = 0; pos < n; pos++)
        for (uint32_t l = 0; l < L.n_layers; l++)
            for (uint32_t c = 0; c < 2; c++) {
                uint32_t page = kvt_page(kv, s, l, pos, L.page_tokens), slot = pos % L.page_tokens;
                uint16_t *blk = c ? lms_kv_page_v(kv, l, page) : lms_kv_page_k(kv, l, page);
                for (uint32_t h = 0; h < L.n_kv_heads; h++)
                    for (uint32_t d = 0; d < L.head_dim; d++) {
                        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
                        blk[((size_t)h * L.page_tokens + slot) * L.head_dim + d] =
                            mode == 2   ? (uint16_t)x
                            : mode == 1 ? (uint16_t)(0x4000 | (x & 0x3fff))
                                        : (uint16_t)(0x3c00 + ((h + d) & 3));
                    }
            }
}

/* Digest of the K/V of positions [0, n) of s, position by position. */
static uint64_t kv_digest(lms_kv *kv, const lms_kv_seq *s, uint32_t n)
{
    lms_kv_layout L;
    lms_kv_get_layout(kv, &L);
    uint64_t h = 0;
    for (uint32_t pos = 0; pos < n; pos++)
        for (uint32_t l = 0; l < L.n_layers; l++)
            for (uint32_t c = 0; c < 2; c++) {
                uint32_t page = kvt_page(kv, s, l, pos, L.page_tokens), slot = pos % L.page_tokens;
                const uint16_t *blk = c ? lms_kv_page_v(kv, l, page) : lms_kv_page_k(kv, l, page);
                for (uint32_t hd = 0; hd < L.n_kv_heads; hd++)
                    h = lms__hash64(blk + ((size_t)hd * L.page_tokens + slot) * L.head_dim, L.head_dim * 2, h);
            }
    return h;
}

static int count_codecs(void *ctx, const lms_kv_page_info *p)
{
    uint32_t *n = ctx;
    if (p->present && p->codec <= LMS_KV_CODEC_SHUFFLE_ZSTD)
        n[p->codec]++;
    return 0;
}

/* The default codec (auto) stores a session shuffle-zstd when its pages
 * compress at least 1.25x and raw when they do not (also when shuffle-zstd
 * would make them a little smaller); every one resumes exactly. */
static void auto_codec_compresses_only_sessions_that_pay(void **st_)
{
    (void)st_;
    char *dir = lms_test_tmpdir("kv-auto");
    lms_store *st = open_store(dir);
    assert_int_equal(lms_kv_default_save_params().codec, LMS_KV_CODEC_AUTO);
    assert_string_equal(lms_kv_codec_name(LMS_KV_CODEC_AUTO), "auto");
    for (int mode = 0; mode < 3; mode++) {
        const char *name = mode == 2 ? "noise" : mode ? "slight" : "pattern";
        lms_kv *kv = kvt_make(NULL, 64, 0);
        lms_kv_seq *s;
        assert_int_equal(lms_kv_seq_new(kv, &s), 0);
        kvt_fill(kv, s, 40 + mode, 37, 0); /* 9 full pages + 1 partial */
        overwrite_kv(kv, s, 37, mode);
        uint64_t want = kv_digest(kv, s, 37);
        lms_kv_io_stats ss;
        assert_int_equal(lms_kv_save_ex(kv, s, st, name, NULL, &ss), 0);
        if (mode)
            assert_int_equal(ss.stored_bytes, ss.raw_bytes);
        else
            assert_true(ss.stored_bytes * 4 < ss.raw_bytes);
        uint32_t n[3] = {0, 0, 0};
        assert_int_equal(lms_kv_session(st, name, NULL, count_codecs, n), 0);
        assert_int_equal(n[mode ? LMS_KV_CODEC_RAW : LMS_KV_CODEC_SHUFFLE_ZSTD], ss.pages);
        if (mode == 1) {
            /* shuffle-zstd asked for: a little smaller (other tokens, so other page keys) */
            lms_kv_seq *o;
            assert_int_equal(lms_kv_seq_new(kv, &o), 0);
            kvt_fill(kv, o, 50, 37, 0);
            overwrite_kv(kv, o, 37, mode);
            lms_kv_save_params sp = lms_kv_default_save_params();
            sp.codec = LMS_KV_CODEC_SHUFFLE_ZSTD;
            lms_kv_io_stats so;
            assert_int_equal(lms_kv_save_ex(kv, o, st, "slight-asked", &sp, &so), 0);
            assert_true(so.stored_bytes < so.raw_bytes && 5 * so.stored_bytes > 4 * so.raw_bytes);
            lms_kv_seq_free(kv, o);
        }
        lms_kv_seq_free(kv, s);
        assert_int_equal(lms_kv_destroy(kv), 0);
        kv = kvt_make(NULL, 64, 0);
        assert_int_equal(lms_kv_resume(kv, st, name, &s), 0);
        assert_true(kv_digest(kv, s, 37) == want);
        lms_kv_seq_free(kv, s);
        assert_int_equal(lms_kv_destroy(kv), 0);
    }
    assert_int_equal(lms_store_close(st), 0);
    lms_test_rmrf(dir);
    free(dir);
}

static void save_in_one_process_resume_in_another_restores_bytes_exactly(void **st_)
{
    (void)st_;
    char *dir = lms_test_tmpdir("kv-fresh");
    /* create the store here, save in a child process */
    lms_store *st = open_store(dir);
    assert_int_equal(lms_store_close(st), 0);
    int status = lms_test_sh(NULL, "'%s' --child-save '%s' chat 77 37", self_exe, dir);
    assert_int_equal(status, 0);
    st = open_store(dir);
    lms_kv *kv = kvt_make(NULL, 32, 0);
    lms_kv_seq *s;
    int rc = lms_kv_resume(kv, st, "chat", &s);
    if (rc)
        fail_msg("resume: %s", lms_last_error());
    assert_int_equal(kvt_diff(kv, s, 77, 37, 0), 0);
    lms_kv_seq_free(kv, s);
    assert_int_equal(lms_kv_destroy(kv), 0);
    assert_int_equal(lms_store_close(st), 0);
    lms_test_rmrf(dir);
    free(dir);
}

/* A cache with live sequences, cached pages and few free pages, so a resume
 * would have to evict: the state the failure tests check is kept. */
static lms_kv *busy_cache(const lms_kv_layout *L, int model, lms_kv_seq **live)
{
    lms_kv *kv = kvt_make(L, 14, model);
    lms_kv_seq *gone;
    assert_int_equal(lms_kv_seq_new(kv, live), 0);
    kvt_fill(kv, *live, 501, 10, 0); /* 3 pages used */
    assert_int_equal(lms_kv_seq_new(kv, &gone), 0);
    kvt_fill(kv, gone, 502, 36, 0); /* 9 pages */
    lms_kv_seq_free(kv, gone);       /* -> 9 cached, 2 free */
    return kv;
}

static void expect_resume_failure(lms_store *st, const char *name, const lms_kv_layout *L, int model, int code,
                                  const char *words)
{
    lms_kv_seq *live, *s = (lms_kv_seq *)1;
    lms_kv *kv = busy_cache(L, model, &live);
    kvt_snap before = kvt_snapshot(kv);
    int rc = lms_kv_resume(kv, st, name, &s);
    if (rc != code)
        fail_msg("resume '%s': expected %s, got %d: %s", name, lms_strerror(code), rc, lms_last_error());
    assert_null(s);
    if (!strstr(lms_last_error(), words))
        fail_msg("detail '%s' lacks '%s'", lms_last_error(), words);
    assert_non_null(strstr(lms_last_error(), name));
    kvt_snap after = kvt_snapshot(kv);
    kvt_assert_same(&before, &after);
    assert_int_equal(lms__kv_check(kv), 0);
    free(before.buf);
    free(after.buf);
    lms_kv_seq_free(kv, live);
    assert_int_equal(lms_kv_destroy(kv), 0);
}

/* Segment and offset of page `index` of a session. */
typedef struct {
    uint32_t want;
    lms_kv_page_info got;
} page_find;

static int find_page(void *ctx, const lms_kv_page_info *p)
{
    page_find *f = ctx;
    if (p->index == f->want)
        f->got = *p;
    return 0;
}

static void corrupt_file(const char *store_dir, uint32_t segment, uint64_t offset, bool truncate)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/segments/%08u.seg", store_dir, segment);
    int fd = open(path, O_RDWR);
    assert_true(fd >= 0);
    if (truncate) {
        assert_int_equal(ftruncate(fd, (off_t)offset), 0);
    } else {
        uint8_t b;
        assert_int_equal(pread(fd, &b, 1, (off_t)offset), 1);
        b ^= 0x10;
        assert_int_equal(pwrite(fd, &b, 1, (off_t)offset), 1);
    }
    close(fd);
}

static void set_session_version(lms_store *st, const char *name, uint16_t version);
static void set_page_version(lms_store *st, const char *name, uint32_t index, uint16_t version);

static void each_resume_failure_has_its_own_error_and_leaves_the_cache_unchanged(void **st_)
{
    (void)st_;
    char *dir = lms_test_tmpdir("kv-fail");
    lms_store *st = open_store(dir);
    for (int i = 0; i < 5; i++) {
        char name[16];
        snprintf(name, sizeof name, "s%d", i);
        save_seq(st, name, 900 + i, 30, 0, i == 4 ? LMS_KV_CODEC_RAW : LMS_KV_CODEC_SHUFFLE_ZSTD, NULL);
    }
    /* sanity: s0 resumes into the busy cache (it evicts) */
    {
        lms_kv_seq *live, *s;
        lms_kv *kv = busy_cache(NULL, 0, &live);
        assert_int_equal(lms_kv_resume(kv, st, "s0", &s), 0);
        assert_int_equal(kvt_diff(kv, s, 900, 30, 0), 0);
        assert_int_equal(kvt_diff(kv, live, 501, 10, 0), 0);
        lms_kv_seq_free(kv, s);
        lms_kv_seq_free(kv, live);
        assert_int_equal(lms_kv_destroy(kv), 0);
    }
    /* unknown session */
    expect_resume_failure(st, "nope", NULL, 0, LMS_ENOENT, "not found");
    /* other model */
    expect_resume_failure(st, "s0", NULL, 1, LMS_EMISMATCH, "other model");
    /* other layout */
    lms_kv_layout L2 = KVT_LAYOUT;
    L2.head_dim = 16;
    expect_resume_failure(st, "s0", &L2, 0, LMS_EMISMATCH, "other layout");
    L2 = KVT_LAYOUT;
    L2.dtype = LMS_DTYPE_F16;
    expect_resume_failure(st, "s0", &L2, 0, LMS_EMISMATCH, "other layout");
    /* a flipped bit in page 2 of s1 (compressed) and page 5 of s4 (raw) */
    page_find f = {.want = 2};
    assert_int_equal(lms_kv_session(st, "s1", NULL, find_page, &f), 0);
    assert_true(f.got.present);
    corrupt_file(dir, f.got.segment, f.got.offset + f.got.stored_size / 2, false);
    expect_resume_failure(st, "s1", NULL, 0, LMS_ECORRUPT, "corrupt page 2");
    f.want = 5;
    assert_int_equal(lms_kv_session(st, "s4", NULL, find_page, &f), 0);
    corrupt_file(dir, f.got.segment, f.got.offset + 7, false);
    expect_resume_failure(st, "s4", NULL, 0, LMS_ECORRUPT, "corrupt page 5");
    /* a session record from a future version */
    set_session_version(st, "s2", 3);
    expect_resume_failure(st, "s2", NULL, 0, LMS_EVERSION, "version 3");
    /* a page record from a future version */
    set_page_version(st, "s3", 3, 2);
    expect_resume_failure(st, "s3", NULL, 0, LMS_EVERSION, "kvpage record: version 2");
    /* a truncated KV segment: s4 was saved last, so its last page ends the file */
    f.want = 7;
    assert_int_equal(lms_kv_session(st, "s4", NULL, find_page, &f), 0);
    corrupt_file(dir, f.got.segment, f.got.offset + f.got.stored_size - 1, true);
    expect_resume_failure(st, "s4", NULL, 0, LMS_EFORMAT, "truncated");
    assert_int_equal(lms_store_close(st), 0);
    lms_test_rmrf(dir);
    free(dir);
}

typedef struct {
    const char *name;
    uint16_t version;
} version_ctx;

static int version_txn(lms_store *s, MDB_txn *txn, void *arg)
{
    version_ctx *c = arg;
    MDB_val v;
    int rc = lms__db_get(s, txn, LMS__DB_SESSIONS, c->name, strlen(c->name), &v);
    if (rc)
        return rc;
    uint8_t *copy = malloc(v.mv_size);
    memcpy(copy, v.mv_data, v.mv_size);
    lms__put_u16(copy, c->version);
    rc = lms__db_put(s, txn, LMS__DB_SESSIONS, c->name, strlen(c->name), copy, v.mv_size, 0);
    free(copy);
    return rc;
}

static void set_session_version(lms_store *st, const char *name, uint16_t version)
{
    version_ctx c = {name, version};
    assert_int_equal(lms__txn_write(st, version_txn, &c), 0);
}

typedef struct {
    uint8_t key[16];
    uint16_t version;
} page_version_ctx;

static int page_version_txn(lms_store *s, MDB_txn *txn, void *arg)
{
    page_version_ctx *c = arg;
    MDB_val v;
    int rc = lms__db_get(s, txn, LMS__DB_KVPAGES, c->key, 16, &v);
    if (rc)
        return rc;
    uint8_t rec[LMS__KVPAGE_REC_SIZE];
    assert_int_equal(v.mv_size, sizeof rec);
    memcpy(rec, v.mv_data, sizeof rec);
    lms__put_u16(rec, c->version);
    return lms__db_put(s, txn, LMS__DB_KVPAGES, c->key, 16, rec, sizeof rec, 0);
}

/* Rewrite the version of the page record of page `index` of a session. */
static void set_page_version(lms_store *st, const char *name, uint32_t index, uint16_t version)
{
    page_find f = {.want = index};
    assert_int_equal(lms_kv_session(st, name, NULL, find_page, &f), 0);
    page_version_ctx c;
    memcpy(c.key, f.got.key, 16);
    c.version = version;
    assert_int_equal(lms__txn_write(st, page_version_txn, &c), 0);
}

static void two_sessions_sharing_a_prefix_store_the_shared_pages_once(void **st_)
{
    (void)st_;
    char *dir = lms_test_tmpdir("kv-share");
    lms_store *st = open_store(dir);
    lms_kv_io_stats a, b;
    uint64_t s0 = kvt_segment_bytes(dir);
    save_seq(st, "doc-a", 1, 40, 32, LMS_KV_CODEC_SHUFFLE_ZSTD, &a); /* 8 shared pages + 2 own */
    uint64_t s1 = kvt_segment_bytes(dir);
    save_seq(st, "doc-b", 2, 40, 32, LMS_KV_CODEC_SHUFFLE_ZSTD, &b);
    uint64_t s2 = kvt_segment_bytes(dir);
    assert_int_equal(a.pages_written, 10);
    assert_int_equal(b.pages_written, 2);
    assert_int_equal(b.pages_reused, 8);
    /* growth by the unshared part only: b's own pages (plus alignment) */
    assert_true(s2 - s1 <= b.stored_bytes + 2 * 64);
    assert_true(s2 - s1 < (s1 - s0) / 3);
    /* saving the same sequence again writes nothing */
    save_seq(st, "doc-b-again", 2, 40, 32, LMS_KV_CODEC_SHUFFLE_ZSTD, &b);
    assert_int_equal(b.pages_written, 0);
    assert_int_equal(kvt_segment_bytes(dir), s2);
    /* both resume exactly */
    lms_kv *kv = kvt_make(NULL, 32, 0);
    lms_kv_seq *x, *y;
    lms_kv_io_stats r;
    assert_int_equal(lms_kv_resume_ex(kv, st, "doc-a", NULL, &x, &r), 0);
    assert_int_equal(r.pages_reused, 0);
    /* the second finds the shared prefix in the cache and reads only its own pages */
    assert_int_equal(lms_kv_resume_ex(kv, st, "doc-b", NULL, &y, &r), 0);
    assert_int_equal(r.pages_reused, 8);
    assert_int_equal(r.pages_written, 2);
    assert_int_equal(kvt_diff(kv, x, 1, 40, 32), 0);
    assert_int_equal(kvt_diff(kv, y, 2, 40, 32), 0);
    uint32_t n1, n2;
    assert_int_equal(lms_kv_seq_pages(x, &n1)[0], lms_kv_seq_pages(y, &n2)[0]);
    lms_kv_seq_free(kv, x);
    lms_kv_seq_free(kv, y);
    assert_int_equal(lms__kv_check(kv), 0);
    assert_int_equal(lms_kv_destroy(kv), 0);
    assert_int_equal(kvt_check_store(st), 3);
    assert_int_equal(lms_store_close(st), 0);
    lms_test_rmrf(dir);
    free(dir);
}

typedef struct {
    int n;
    char names[8][32];
    uint32_t tokens[8];
} list_ctx;

static int list_cb(void *ctx, const lms_kv_session_info *info)
{
    list_ctx *l = ctx;
    snprintf(l->names[l->n], 32, "%s", info->name);
    l->tokens[l->n++] = info->n_tokens;
    return 0;
}

static void sessions_are_listed_described_replaced_and_removed(void **st_)
{
    (void)st_;
    char *dir = lms_test_tmpdir("kv-ls");
    lms_store *st = open_store(dir);
    save_seq(st, "beta", 3, 9, 0, LMS_KV_CODEC_ZSTD, NULL);
    save_seq(st, "alpha", 4, 17, 0, LMS_KV_CODEC_ZSTD, NULL);
    list_ctx l = {0};
    assert_int_equal(lms_kv_sessions(st, list_cb, &l), 0);
    assert_int_equal(l.n, 2);
    assert_string_equal(l.names[0], "alpha");
    assert_int_equal(l.tokens[0], 17);
    assert_string_equal(l.names[1], "beta");
    /* replace by default; no_replace refuses */
    save_seq(st, "beta", 5, 12, 0, LMS_KV_CODEC_ZSTD, NULL);
    lms_kv *kv = kvt_make(NULL, 16, 0);
    lms_kv_seq *s;
    assert_int_equal(lms_kv_seq_new(kv, &s), 0);
    kvt_fill(kv, s, 6, 5, 0);
    lms_kv_save_params sp = lms_kv_default_save_params();
    sp.no_replace = true;
    assert_int_equal(lms_kv_save_ex(kv, s, st, "beta", &sp, NULL), LMS_EEXIST);
    assert_int_equal(lms_kv_save(kv, s, st, ""), LMS_EINVAL);
    assert_int_equal(lms_kv_save(kv, s, st, "-x"), LMS_EINVAL); /* store/names.h */
    lms_kv_seq_free(kv, s);
    assert_int_equal(lms_kv_resume(kv, st, "beta", &s), 0);
    assert_int_equal(kvt_diff(kv, s, 5, 12, 0), 0);
    lms_kv_seq_free(kv, s);
    assert_int_equal(lms_kv_destroy(kv), 0);
    page_find f = {.want = 2};
    assert_int_equal(lms_kv_session(st, "beta", NULL, find_page, &f), 0);
    assert_int_equal(f.got.n_tokens, 4);
    assert_int_equal(f.got.codec, LMS_KV_CODEC_ZSTD);
    assert_int_equal(lms_kv_session_rm(st, "beta"), 0);
    assert_int_equal(lms_kv_session_rm(st, "beta"), LMS_ENOENT);
    assert_int_equal(lms_kv_session(st, "beta", NULL, NULL, NULL), LMS_ENOENT);
    l.n = 0;
    assert_int_equal(lms_kv_sessions(st, list_cb, &l), 0);
    assert_int_equal(l.n, 1);
    assert_int_equal(lms_store_close(st), 0);
    lms_test_rmrf(dir);
    free(dir);
}

static int last_used_cb(void *ctx, const lms_kv_session_info *info)
{
    *(uint64_t *)ctx = info->last_used;
    return 0;
}

static uint64_t last_used_of(lms_store *st, const char *name)
{
    uint64_t t = 0;
    assert_int_equal(lms_kv_session(st, name, last_used_cb, NULL, &t), 0);
    return t;
}

/* A resume hands its last-use record to the store's own thread: resumes in
 * quick succession (one of the sessions removed among them) are all
 * recorded by the time lms_store_close returns, in another handle's view. */
static void resumes_record_their_last_use_by_the_time_the_store_closes(void **st_)
{
    (void)st_;
    char *dir = lms_test_tmpdir("kv-used");
    lms_store *st = open_store(dir);
    save_seq(st, "a", 3, 9, 0, LMS_KV_CODEC_RAW, NULL);
    save_seq(st, "b", 4, 17, 0, LMS_KV_CODEC_RAW, NULL);
    uint64_t saved = last_used_of(st, "a");
    struct timespec ts = {1, 100000000}; /* the record holds seconds */
    nanosleep(&ts, NULL);
    lms_kv *kv = kvt_make(NULL, 64, 0);
    for (int i = 0; i < 40; i++) {
        lms_kv_seq *s;
        const char *name = i % 2 ? "b" : "a";
        if (i > 30 && i % 2) {
            assert_int_equal(lms_kv_resume(kv, st, "b", &s), LMS_ENOENT);
            continue;
        }
        if (lms_kv_resume(kv, st, name, &s))
            fail_msg("resume %d of '%s': %s", i, name, lms_last_error());
        lms_kv_seq_free(kv, s);
        if (i == 30)
            assert_int_equal(lms_kv_session_rm(st, "b"), 0); /* "b"'s queued records find it gone */
    }
    assert_int_equal(lms_kv_destroy(kv), 0);
    assert_int_equal(lms_store_close(st), 0);
    st = open_store(dir);
    assert_true(last_used_of(st, "a") > saved);
    assert_int_equal(lms_kv_session(st, "b", NULL, NULL, NULL), LMS_ENOENT);
    assert_int_equal(lms_store_close(st), 0);
    lms_test_rmrf(dir);
    free(dir);
}

/* Resume `name` into kv with the nth fault of `kind` armed: it either gives
 * exactly the n_tokens of kvt_fill's seed (freed again; returns true) or fails
 * leaving kv exactly as it was (returns false). */
static bool resume_under_fault(lms_kv *kv, lms_store *st, const char *name, int kind, long n, uint32_t seed,
                               uint32_t n_tokens)
{
    lms_kv_seq *s = NULL;
    kvt_snap before = kvt_snapshot(kv);
    lms__kv_touch_wait(st); /* the last resume's record written: no armed fault is its */
    lms__fault_arm(kind, n, false);
    int rc = lms_kv_resume(kv, st, name, &s);
    lms__fault_disarm_all();
    if (rc == 0) {
        assert_int_equal(kvt_diff(kv, s, seed, n_tokens, 0), 0);
        lms_kv_seq_free(kv, s);
    } else {
        assert_null(s);
        kvt_snap after = kvt_snapshot(kv);
        kvt_assert_same(&before, &after);
        free(after.buf);
    }
    free(before.buf);
    assert_int_equal(lms__kv_check(kv), 0);
    return rc == 0;
}

/* Fail the Nth allocation / read of a resume for every N: each run either
 * succeeds exactly or fails leaving the cache unchanged; and fail the Nth
 * allocation / write / fsync of a save: it fails cleanly and no session of
 * that name appears (an older one stays as it was). */
static void injected_faults_leave_cache_and_store_consistent(void **st_)
{
    (void)st_;
    char *dir = lms_test_tmpdir("kv-faults");
    lms_store *st = open_store(dir);
    save_seq(st, "s", 31, 26, 0, LMS_KV_CODEC_SHUFFLE_ZSTD, NULL);
    const int kinds[] = {LMS_FAULT_ALLOC, LMS_FAULT_READ, LMS_FAULT_OPEN};
    for (int k = 0; k < 3; k++) {
        int ok = 0, failed = 0;
        for (long n = 1; n < 400 && ok == 0; n++) {
            lms_kv_seq *live;
            lms_kv *kv = busy_cache(NULL, 0, &live);
            if (resume_under_fault(kv, st, "s", kinds[k], n, 31, 26))
                ok++;
            else
                failed++;
            lms_kv_seq_free(kv, live);
            assert_int_equal(lms_kv_destroy(kv), 0);
        }
        assert_int_equal(ok, 1);
        if (kinds[k] != LMS_FAULT_OPEN)
            assert_true(failed > 0);
    }
    const int skinds[] = {LMS_FAULT_ALLOC, LMS_FAULT_WRITE, LMS_FAULT_FSYNC};
    for (int k = 0; k < 3; k++) {
        int ok = 0, failed = 0;
        for (long n = 1; n < 400 && ok == 0; n++) {
            lms_kv *kv = kvt_make(NULL, 32, 0);
            lms_kv_seq *s;
            assert_int_equal(lms_kv_seq_new(kv, &s), 0);
            kvt_fill(kv, s, 40 + k, 30, 0);
            lms__fault_arm(skinds[k], n, false);
            int rc = lms_kv_save(kv, s, st, "s");
            lms__fault_disarm_all();
            lms_kv_seq_free(kv, s);
            lms_kv_seq *r;
            assert_int_equal(lms_kv_resume(kv, st, "s", &r), 0);
            lms__kv_touch_wait(st); /* before the next save's fault is armed */
            if (rc == 0) {
                assert_int_equal(kvt_diff(kv, r, 40 + k, 30, 0), 0);
                ok++;
            } else {
                /* the session is still the previous one, whole */
                uint32_t seed = k == 0 ? 31 : 40 + k - 1, len = k == 0 ? 26 : 30;
                assert_int_equal(kvt_diff(kv, r, seed, len, 0), 0);
                failed++;
            }
            lms_kv_seq_free(kv, r);
            assert_int_equal(lms_kv_destroy(kv), 0);
        }
        assert_int_equal(ok, 1);
        assert_true(failed > 0);
    }
    kvt_check_store(st);
    assert_int_equal(lms_store_close(st), 0);
    lms_test_rmrf(dir);
    free(dir);
}

/* A device that is not the CPU as far as the cache can tell (kind CUDA)
 * but whose memory is host memory and whose copies are memcpy: it drives
 * the paths of device arenas (page images copied to and from the host,
 * staging on resume) in a machine without a GPU. */
static lms_device_ops fake_ops;
static lms_device fake_dev;

static lms_device *fake_device(void)
{
    lms_device *cpu = kvt_cpu();
    fake_ops = *cpu->ops;
    fake_ops.name = "fake-device";
    fake_dev = *cpu;
    fake_dev.ops = &fake_ops;
    fake_dev.kind = LMS_DEVICE_CUDA;
    return &fake_dev;
}

static lms_kv *fake_kv(uint32_t pages)
{
    lms_kv_params p = lms_kv_default_params();
    p.budget_pages = pages;
    p.max_seqs = 8;
    kvt_model_id(p.model_id, 0);
    lms_kv *kv;
    assert_int_equal(lms_kv_create(fake_device(), &KVT_LAYOUT, &p, &kv), 0);
    return kv;
}

static void device_arenas_save_and_resume_through_host_copies(void **st_)
{
    (void)st_;
    char *dir = lms_test_tmpdir("kv-device");
    lms_store *st = open_store(dir);
    const lms_kv_codec codecs[] = {LMS_KV_CODEC_RAW, LMS_KV_CODEC_SHUFFLE_ZSTD};
    for (int k = 0; k < 2; k++) {
        char name[16];
        snprintf(name, sizeof name, "dev%d", k);
        lms_kv *kv = fake_kv(32);
        lms_kv_seq *s;
        assert_int_equal(lms_kv_seq_new(kv, &s), 0);
        kvt_fill(kv, s, 70 + k, 43, 0); /* 10 full pages + 3 tokens: several pages per worker */
        lms_kv_save_params sp = lms_kv_default_save_params();
        sp.codec = codecs[k];
        sp.threads = 2;
        assert_int_equal(lms_kv_save_ex(kv, s, st, name, &sp, NULL), 0);
        lms_kv_seq_free(kv, s);
        assert_int_equal(lms_kv_destroy(kv), 0);

        /* resume into a busy device cache: free pages and evicted ones */
        kv = fake_kv(16);
        lms_kv_seq *live, *gone, *r;
        assert_int_equal(lms_kv_seq_new(kv, &live), 0);
        kvt_fill(kv, live, 501, 8, 0);
        assert_int_equal(lms_kv_seq_new(kv, &gone), 0);
        kvt_fill(kv, gone, 502, 24, 0);
        lms_kv_seq_free(kv, gone); /* 2 used, 6 cached, 8 free */
        lms_kv_io_stats rs;
        lms_kv_resume_params rp = lms_kv_default_resume_params();
        rp.threads = 2;
        assert_int_equal(lms_kv_resume_ex(kv, st, name, &rp, &r, &rs), 0);
        assert_int_equal(rs.pages_written, 11);
        assert_int_equal(kvt_diff(kv, r, 70 + k, 43, 0), 0);
        assert_int_equal(kvt_diff(kv, live, 501, 8, 0), 0);
        assert_int_equal(lms__kv_check(kv), 0);
        lms_kv_seq_free(kv, r);
        lms_kv_seq_free(kv, live);
        assert_int_equal(lms_kv_destroy(kv), 0);
    }
    /* a corrupt page fails on a device arena too, leaving it unchanged */
    page_find f = {.want = 4};
    assert_int_equal(lms_kv_session(st, "dev1", NULL, find_page, &f), 0);
    corrupt_file(dir, f.got.segment, f.got.offset + f.got.stored_size / 3, false);
    lms_kv *kv = fake_kv(16);
    lms_kv_seq *live, *gone, *r = NULL;
    assert_int_equal(lms_kv_seq_new(kv, &live), 0);
    kvt_fill(kv, live, 501, 8, 0);
    assert_int_equal(lms_kv_seq_new(kv, &gone), 0);
    kvt_fill(kv, gone, 502, 24, 0);
    lms_kv_seq_free(kv, gone);
    kvt_snap before = kvt_snapshot(kv);
    assert_int_equal(lms_kv_resume(kv, st, "dev1", &r), LMS_ECORRUPT);
    assert_non_null(strstr(lms_last_error(), "corrupt page 4"));
    kvt_snap after = kvt_snapshot(kv);
    kvt_assert_same(&before, &after);
    free(before.buf);
    free(after.buf);
    lms_kv_seq_free(kv, live);
    assert_int_equal(lms_kv_destroy(kv), 0);
    assert_int_equal(lms_store_close(st), 0);
    lms_test_rmrf(dir);
    free(dir);
}


/* ---- sliding-window layers ------------------------------------------------------------ */

static const uint8_t WIN_SLIDING[3] = {1, 0, 1};

static lms_kv *win_kv_on(lms_device *dev, uint32_t window, const uint8_t *sliding, uint32_t pages,
                         uint32_t window_pages)
{
    lms_kv_layout L = KVT_LAYOUT;
    L.window = window;
    L.sliding = sliding;
    lms_kv_params p = lms_kv_default_params();
    p.budget_pages = pages;
    p.window_pages = window_pages;
    p.max_seqs = 8;
    kvt_model_id(p.model_id, 0);
    lms_kv *kv;
    assert_int_equal(lms_kv_create(dev, &L, &p, &kv), 0);
    return kv;
}

static lms_kv *win_kv(uint32_t window, const uint8_t *sliding, uint32_t pages, uint32_t window_pages)
{
    return win_kv_on(kvt_cpu(), window, sliding, pages, window_pages);
}

/* Fill n tokens of seed into s in blocks of 5 (the window group is small). */
static void win_fill(lms_kv *kv, lms_kv_seq *s, uint32_t seed, uint32_t n)
{
    for (uint32_t done = lms_kv_seq_len(s); done < n; done = lms_kv_seq_len(s))
        kvt_fill(kv, s, seed, LMS_MIN(5u, n - done), 0);
}

typedef struct win_desc {
    lms_kv_session_info info;
    uint32_t pages[2]; /* pages listed: group 0, window */
} win_desc;

static int count_window_pages(void *ctx, const lms_kv_page_info *p)
{
    uint32_t *n = ((win_desc *)ctx)->pages;
    n[p->window]++;
    if (p->window)
        assert_true(p->index >= (37 - 6) / 4); /* the last window's pages */
    return 0;
}

static int window_info(void *ctx, const lms_kv_session_info *s)
{
    lms_kv_session_info *out = &((win_desc *)ctx)->info;
    *out = *s;
    assert_int_equal(s->layout.window, 6);
    assert_memory_equal(s->layout.sliding, WIN_SLIDING, 3);
    out->layout.sliding = NULL; /* valid during the callback only */
    return 0;
}

static void window_sessions_save_the_last_window_and_refuse_other_layouts(void **st_)
{
    (void)st_;
    char *dir = lms_test_tmpdir("kv-window");
    lms_store *st = open_store(dir);
    /* 37 tokens, window 6, 4 tokens a page: 10 pages, of which the sliding layers
     * keep the pages of positions 31..36: pages 7..9 */
    lms_kv *kv = win_kv(6, WIN_SLIDING, 32, 8);
    lms_kv_seq *s, *r;
    assert_int_equal(lms_kv_seq_new(kv, &s), 0);
    win_fill(kv, s, 5, 37);
    lms_kv_io_stats ss, rs;
    lms_kv_save_params sp = lms_kv_default_save_params();
    sp.threads = 2;
    assert_int_equal(lms_kv_save_ex(kv, s, st, "w", &sp, &ss), 0);
    assert_int_equal(ss.tokens, 37);
    assert_int_equal(ss.pages, 10 + 3);
    /* raw bytes: every position of the one full-context layer, 6..12 positions of the two sliding ones */
    size_t per_layer_pos = 2 * 2 * 8 * 2;
    assert_int_equal(ss.raw_bytes, per_layer_pos * (37 + 2 * (3 * 4 - 3)));
    win_desc d = {0};
    assert_int_equal(lms_kv_session(st, "w", window_info, count_window_pages, &d), 0);
    assert_int_equal(d.info.n_pages, 10);
    assert_int_equal(d.info.n_window_pages, 3);
    assert_int_equal(d.info.version, 2);
    assert_int_equal(d.pages[0], 10);
    assert_int_equal(d.pages[1], 3);
    assert_int_equal(kvt_check_store(st), 1);

    /* resume into a fresh cache of the same layout: exact bytes, the window held from page 7 */
    lms_kv *k2 = win_kv(6, WIN_SLIDING, 32, 8);
    assert_int_equal(lms_kv_resume_ex(k2, st, "w", NULL, &r, &rs), 0);
    assert_int_equal(rs.pages_written, 13);
    assert_int_equal(kvt_diff(k2, r, 5, 37, 0), 0);
    uint32_t first, np;
    lms_kv_seq_window_pages(r, &first, &np);
    assert_int_equal(first, 7);
    assert_int_equal(np, 10);
    assert_int_equal(lms__kv_check(k2), 0);
    /* and it grows on as the uninterrupted one does */
    win_fill(k2, r, 5, 50);
    win_fill(kv, s, 5, 50);
    assert_int_equal(kvt_diff(k2, r, 5, 50, 0), 0);
    lms_kv_seq_free(k2, r);
    assert_int_equal(lms_kv_destroy(k2), 0);

    /* resumed where its pages are cached: attached, not read */
    assert_int_equal(lms_kv_resume_ex(kv, st, "w", NULL, &r, &rs), 0);
    assert_int_equal(rs.pages_reused, 9 + 2); /* the full pages of both groups (the partial last ones are read) */
    assert_int_equal(kvt_diff(kv, r, 5, 37, 0), 0);
    assert_int_equal(lms__kv_check(kv), 0);
    lms_kv_seq_free(kv, r);

    /* another window, other sliding layers, no window: other layouts, refused unchanged */
    const uint8_t other[3] = {0, 1, 1};
    lms_kv *bad[3] = {win_kv(8, WIN_SLIDING, 32, 8), win_kv(6, other, 32, 8), kvt_make(NULL, 32, 0)};
    for (int i = 0; i < 3; i++) {
        kvt_snap before = kvt_snapshot(bad[i]);
        r = (lms_kv_seq *)1;
        assert_int_equal(lms_kv_resume(bad[i], st, "w", &r), LMS_EMISMATCH);
        assert_null(r);
        assert_non_null(strstr(lms_last_error(), "other layout"));
        assert_non_null(strstr(lms_last_error(), "window 6"));
        kvt_snap after = kvt_snapshot(bad[i]);
        kvt_assert_same(&before, &after);
        free(before.buf);
        free(after.buf);
        assert_int_equal(lms_kv_destroy(bad[i]), 0);
    }
    /* a device arena (page images through the host) that is busy: free targets in both
     * groups, then evicted cached ones (staged until every page checked out) */
    lms_kv *dk = win_kv_on(fake_device(), 6, WIN_SLIDING, 14, 6);
    lms_kv_seq *live, *gone;
    assert_int_equal(lms_kv_seq_new(dk, &live), 0);
    win_fill(dk, live, 801, 6);
    assert_int_equal(lms_kv_seq_new(dk, &gone), 0);
    win_fill(dk, gone, 802, 24);
    lms_kv_seq_free(dk, gone); /* cached in both groups */
    assert_int_equal(lms_kv_resume_ex(dk, st, "w", NULL, &r, &rs), 0);
    assert_int_equal(rs.pages_written, 13);
    assert_int_equal(kvt_diff(dk, r, 5, 37, 0), 0);
    assert_int_equal(kvt_diff(dk, live, 801, 6, 0), 0);
    lms_kv_stats dst;
    lms_kv_get_stats(dk, &dst);
    assert_true(dst.evictions > 0); /* group 0 had to evict */
    assert_int_equal(lms__kv_check(dk), 0);
    lms_kv_seq_free(dk, r);
    /* failures injected into a windowed resume leave the cache unchanged */
    int ok = 0, failed = 0;
    for (long n = 1; n < 300 && !ok; n++) {
        if (resume_under_fault(dk, st, "w", LMS_FAULT_ALLOC, n, 5, 37))
            ok++;
        else
            failed++;
    }
    assert_int_equal(ok, 1);
    assert_true(failed > 0);
    lms_kv_seq_free(dk, live);
    assert_int_equal(lms_kv_destroy(dk), 0);

    /* gc keeps the window pages a session names */
    lms_gc_params gp = lms_gc_default_params();
    assert_int_equal(lms_store_gc(st, &gp, NULL, NULL, NULL), 0);
    assert_int_equal(kvt_check_store(st), 1);
    k2 = win_kv(6, WIN_SLIDING, 32, 8);
    assert_int_equal(lms_kv_resume(k2, st, "w", &r), 0);
    assert_int_equal(kvt_diff(k2, r, 5, 37, 0), 0);
    lms_kv_seq_free(k2, r);
    assert_int_equal(lms_kv_destroy(k2), 0);

    lms_kv_seq_free(kv, s);
    assert_int_equal(lms_kv_destroy(kv), 0);
    assert_int_equal(lms_store_close(st), 0);
    lms_test_rmrf(dir);
    free(dir);
}

/* ---- randomized: sequences with shared prefixes, saved and resumed at random ---- */

/* K/V value of position pos for a sequence whose tokens are toks: a function
 * of the whole prefix, as in a real model, so equal prefixes have equal K/V. */
static uint64_t prefix_hash(const int32_t *toks, uint32_t n)
{
    uint64_t h = 0x1234;
    for (uint32_t i = 0; i < n; i++)
        h = lms__hash64(&toks[i], 4, h);
    return h;
}

static void rnd_write(lms_kv *kv, lms_kv_seq *s, const int32_t *toks, uint32_t from, uint32_t to)
{
    lms_kv_layout L;
    lms_kv_get_layout(kv, &L);
    for (uint32_t pos = from; pos < to; pos++) {
        uint64_t ph = prefix_hash(toks, pos + 1);
        uint32_t page, slot;
        assert_int_equal(lms_kv_seq_slot(kv, s, pos, &page, &slot), 0);
        for (uint32_t l = 0; l < L.n_layers; l++)
            for (uint32_t c = 0; c < 2; c++) {
                uint16_t *blk = c ? lms_kv_page_v(kv, l, page) : lms_kv_page_k(kv, l, page);
                for (uint32_t h = 0; h < L.n_kv_heads; h++)
                    for (uint32_t d = 0; d < L.head_dim; d++)
                        blk[((size_t)h * L.page_tokens + slot) * L.head_dim + d] = kvt_val((uint32_t)ph, (uint32_t)(ph >> 32), l, c, h, d);
            }
    }
}

static bool rnd_check(lms_kv *kv, const lms_kv_seq *s, const int32_t *toks, uint32_t n)
{
    lms_kv_layout L;
    lms_kv_get_layout(kv, &L);
    if (lms_kv_seq_len(s) != n)
        return false;
    for (uint32_t pos = 0; pos < n; pos++) {
        if (lms_kv_seq_token(kv, s, pos) != toks[pos])
            return false;
        uint64_t ph = prefix_hash(toks, pos + 1);
        uint32_t page, slot;
        lms_kv_seq_slot(kv, s, pos, &page, &slot);
        for (uint32_t l = 0; l < L.n_layers; l++)
            for (uint32_t c = 0; c < 2; c++) {
                const uint16_t *blk = c ? lms_kv_page_v(kv, l, page) : lms_kv_page_k(kv, l, page);
                for (uint32_t h = 0; h < L.n_kv_heads; h++)
                    for (uint32_t d = 0; d < L.head_dim; d++)
                        if (blk[((size_t)h * L.page_tokens + slot) * L.head_dim + d] !=
                            kvt_val((uint32_t)ph, (uint32_t)(ph >> 32), l, c, h, d))
                            return false;
            }
    }
    return true;
}

#define RS_SEQS 3
#define RS_MAX 30
typedef struct {
    lms_kv_seq *s;
    int32_t toks[RS_MAX];
    uint32_t n;
} rs_seq;

static uint64_t rs_rng;
static uint32_t rs_rnd(uint32_t n)
{
    rs_rng = rs_rng * 6364136223846793005ull + 1442695040888963407ull;
    return (uint32_t)((rs_rng >> 33) % n);
}

static void random_saves_and_resumes_restore_exact_prefix_shared_sequences(void **st_)
{
    (void)st_;
    char *dir = lms_test_tmpdir("kv-random");
    lms_store *st = open_store(dir);
    int saves = 0, resumes = 0, reused = 0, full = 0, nospace = 0;
    for (uint64_t seed = 1; seed <= 10; seed++) {
        rs_rng = seed;
        lms_kv *a = kvt_make(NULL, 40, 0), *b = kvt_make(NULL, 9 + rs_rnd(6), 0);
        rs_seq sa[RS_SEQS] = {0}, sb[RS_SEQS] = {0};
        struct {
            bool saved;
            int32_t toks[RS_MAX];
            uint32_t n;
        } sessions[3] = {0};
        for (int step = 0; step < 60; step++) {
            int i = (int)rs_rnd(RS_SEQS);
            uint32_t op = rs_rnd(8);
            rs_seq *q = &sa[i];
            if (!q->s) { /* new: tokens from a tiny alphabet, so prefixes repeat */
                if (lms_kv_seq_new(a, &q->s))
                    continue;
                q->n = 0;
                op = 0;
            }
            if (op < 3 && q->n < RS_MAX) { /* append, write, commit */
                uint32_t k = 1 + rs_rnd(LMS_MIN(9u, RS_MAX - q->n));
                for (uint32_t j = 0; j < k; j++)
                    q->toks[q->n + j] = (int32_t)rs_rnd(2);
                if (lms_kv_seq_append(a, q->s, q->toks + q->n, k) == 0) {
                    rnd_write(a, q->s, q->toks, q->n, q->n + k);
                    assert_int_equal(lms_kv_seq_commit(a, q->s, q->n + k), 0);
                    q->n += k;
                }
            } else if (op < 4) { /* truncate */
                q->n = q->n ? rs_rnd(q->n + 1) : 0;
                assert_int_equal(lms_kv_seq_truncate(a, q->s, q->n), 0);
            } else if (op < 5) { /* fork into another slot */
                int j = (int)rs_rnd(RS_SEQS);
                if (!sa[j].s && lms_kv_seq_fork(a, q->s, &sa[j].s) == 0) {
                    memcpy(sa[j].toks, q->toks, sizeof q->toks);
                    sa[j].n = q->n;
                }
            } else if (op < 6 && q->n) { /* save */
                int k = (int)rs_rnd(3);
                char name[24];
                snprintf(name, sizeof name, "r%d-%llu", k, (unsigned long long)seed);
                lms_kv_save_params sp = lms_kv_default_save_params();
                sp.codec = (lms_kv_codec)rs_rnd(3);
                int rc = lms_kv_save_ex(a, q->s, st, name, &sp, NULL);
                if (rc)
                    fail_msg("save: %s", lms_last_error());
                sessions[k].saved = true;
                memcpy(sessions[k].toks, q->toks, sizeof q->toks);
                sessions[k].n = q->n;
                saves++;
            } else if (op < 7) { /* resume a session into b, busy with its own sequences */
                int k = (int)rs_rnd(3), j = (int)rs_rnd(RS_SEQS);
                char name[24];
                snprintf(name, sizeof name, "r%d-%llu", k, (unsigned long long)seed);
                if (sb[j].s) {
                    lms_kv_seq_free(b, sb[j].s);
                    sb[j].s = NULL;
                }
                kvt_snap before = kvt_snapshot(b);
                lms_kv_io_stats rs;
                int rc = lms_kv_resume_ex(b, st, name, NULL, &sb[j].s, &rs);
                if (!sessions[k].saved) {
                    assert_int_equal(rc, LMS_ENOENT);
                } else if (rc == LMS_ENOSPACE) {
                    nospace++;
                    kvt_snap after = kvt_snapshot(b);
                    kvt_assert_same(&before, &after);
                    free(after.buf);
                } else {
                    if (rc)
                        fail_msg("resume: %s", lms_last_error());
                    memcpy(sb[j].toks, sessions[k].toks, sizeof sb[j].toks);
                    sb[j].n = sessions[k].n;
                    resumes++;
                    reused += rs.pages_reused > 0;
                }
                free(before.buf);
            } else if (rs_rnd(2)) { /* free */
                lms_kv_seq_free(a, q->s);
                q->s = NULL;
            } else { /* b: a sequence of its own, then freed: its pages become cached in b */
                lms_kv_seq *t;
                int32_t toks[RS_MAX];
                uint32_t k = 4 + rs_rnd(RS_MAX - 4);
                for (uint32_t j = 0; j < k; j++)
                    toks[j] = (int32_t)(5 + rs_rnd(1000));
                if (lms_kv_seq_new(b, &t) == 0) {
                    if (lms_kv_seq_append(b, t, toks, k) == 0) {
                        rnd_write(b, t, toks, 0, k);
                        assert_int_equal(lms_kv_seq_commit(b, t, k), 0);
                    }
                    lms_kv_seq_free(b, t);
                }
            }
            /* every live sequence of both caches holds exactly its K/V */
            for (int j = 0; j < RS_SEQS; j++) {
                if (sa[j].s && !rnd_check(a, sa[j].s, sa[j].toks, sa[j].n))
                    fail_msg("seed %llu step %d: cache a, sequence %d differs", (unsigned long long)seed, step, j);
                if (sb[j].s && !rnd_check(b, sb[j].s, sb[j].toks, sb[j].n))
                    fail_msg("seed %llu step %d: cache b, sequence %d differs", (unsigned long long)seed, step, j);
            }
            assert_int_equal(lms__kv_check(a), 0);
            assert_int_equal(lms__kv_check(b), 0);
        }
        lms_kv_stats stb;
        lms_kv_get_stats(b, &stb);
        full += stb.evictions > 0;
        for (int j = 0; j < RS_SEQS; j++) {
            lms_kv_seq_free(a, sa[j].s);
            lms_kv_seq_free(b, sb[j].s);
        }
        assert_int_equal(lms_kv_destroy(a), 0);
        assert_int_equal(lms_kv_destroy(b), 0);
    }
    print_message("%d saves, %d resumes (%d reusing cached pages, %d out of space), %d runs evicting\n", saves, resumes,
                  reused, nospace, full);
    assert_true(saves > 20 && resumes > 20 && reused > 0 && full > 0);
    kvt_check_store(st);
    assert_int_equal(lms_store_close(st), 0);
    lms_test_rmrf(dir);
    free(dir);
}

static int child_save(int argc, char **argv)
{
    if (argc != 6)
        return 2;
    lms_store *st;
    if (lms_store_open(argv[2], LMS_STORE_CREATE, NULL, &st))
        return 3;
    lms_kv *kv;
    lms_kv_params p = lms_kv_default_params();
    p.budget_pages = 64;
    kvt_model_id(p.model_id, 0);
    lms_device *dev;
    if (lms_device_open(LMS_DEVICE_CPU, 0, &dev) || lms_kv_create(dev, &KVT_LAYOUT, &p, &kv))
        return 4;
    lms_kv_seq *s;
    if (lms_kv_seq_new(kv, &s))
        return 5;
    kvt_fill(kv, s, (uint32_t)atoi(argv[4]), (uint32_t)atoi(argv[5]), 0);
    int rc = lms_kv_save(kv, s, st, argv[3]);
    if (rc) {
        fprintf(stderr, "child save: %s\n", lms_last_error());
        return 6;
    }
    lms_kv_seq_free(kv, s);
    lms_kv_destroy(kv);
    lms_device_close(dev);
    lms_store_close(st);
    return 0;
}

int main(int argc, char **argv)
{
    ssize_t n = readlink("/proc/self/exe", self_exe, sizeof self_exe - 1);
    if (n > 0)
        self_exe[n] = '\0';
    if (argc > 1 && !strcmp(argv[1], "--child-save"))
        return child_save(argc, argv);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(save_then_resume_restores_every_byte_for_each_codec),
        cmocka_unit_test(save_in_one_process_resume_in_another_restores_bytes_exactly),
        cmocka_unit_test(auto_codec_compresses_only_sessions_that_pay),
        cmocka_unit_test(each_resume_failure_has_its_own_error_and_leaves_the_cache_unchanged),
        cmocka_unit_test(two_sessions_sharing_a_prefix_store_the_shared_pages_once),
        cmocka_unit_test(sessions_are_listed_described_replaced_and_removed),
        cmocka_unit_test(resumes_record_their_last_use_by_the_time_the_store_closes),
        cmocka_unit_test(injected_faults_leave_cache_and_store_consistent),
        cmocka_unit_test(device_arenas_save_and_resume_through_host_copies),
        cmocka_unit_test(window_sessions_save_the_last_window_and_refuse_other_layouts),
        cmocka_unit_test(random_saves_and_resumes_restore_exact_prefix_shared_sequences),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
