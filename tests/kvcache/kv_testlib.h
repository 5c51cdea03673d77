/*
 * tests/kvcache/kv_testlib.h - helpers shared by the KV persistence tests:
 * a small bf16 cache, deterministic K/V contents, a snapshot of everything
 * the cache promises to leave unchanged after a failed call, and a
 * store-level consistency check of saved sessions.
 */
#ifndef LMS_KV_TESTLIB_H
#define LMS_KV_TESTLIB_H

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "kvcache/kv_internal.h"
#include "store/kv_records.h"
#include "store/store_internal.h"
#include "testutil.h"

static __attribute__((unused)) lms_device *kvt_cpu(void)
{
    static lms_device *dev;
    if (!dev)
        assert_int_equal(lms_device_open(LMS_DEVICE_CPU, 0, &dev), 0);
    return dev;
}

static const lms_kv_layout KVT_LAYOUT = {
    .n_layers = 3, .n_kv_heads = 2, .head_dim = 8, .dtype = LMS_DTYPE_BF16, .page_tokens = 4};

static __attribute__((unused)) void kvt_model_id(uint8_t id[16], int which)
{
    for (int i = 0; i < 16; i++)
        id[i] = (uint8_t)(0x40 + which * 16 + i);
}

static __attribute__((unused)) lms_kv *kvt_make(const lms_kv_layout *L, uint32_t pages, int model)
{
    lms_kv_params p = lms_kv_default_params();
    p.budget_pages = pages;
    p.max_seqs = 8;
    kvt_model_id(p.model_id, model);
    lms_kv *kv;
    assert_int_equal(lms_kv_create(kvt_cpu(), L ? L : &KVT_LAYOUT, &p, &kv), 0);
    return kv;
}

/* A bf16-looking value for (seed, position, layer, K/V, head, dim): smooth
 * magnitudes with a noisy mantissa, like real activations. */
static __attribute__((unused)) uint16_t kvt_val(uint32_t seed, uint32_t pos, uint32_t l, uint32_t c, uint32_t h, uint32_t d)
{
    uint64_t x = ((uint64_t)seed << 40) ^ ((uint64_t)pos << 20) ^ (l << 12) ^ (c << 11) ^ (h << 8) ^ d;
    uint64_t r = lms__hash64(&x, sizeof x, 7);
    uint16_t exp = (uint16_t)(120 + (r & 7));
    return (uint16_t)(((r >> 8) & 1) << 15 | exp << 7 | ((r >> 16) & 0x7f));
}

/* Tokens of a test sequence: `shared` first tokens common to every seed. */
static __attribute__((unused)) int32_t kvt_token(uint32_t seed, uint32_t pos, uint32_t shared)
{
    return pos < shared ? (int32_t)(1000 + pos) : (int32_t)(seed * 7919u + pos) % 50000;
}

/* The page of `layer` holding position pos of s (the block table of the layer's
 * group), or UINT32_MAX for a window page the sequence gave back. */
static __attribute__((unused)) uint32_t kvt_page(const lms_kv *kv, const lms_kv_seq *s, uint32_t layer, uint32_t pos,
                                                 uint32_t P)
{
    uint32_t first, n;
    if (lms_kv_layer_group(kv, layer, NULL) == 0)
        return lms_kv_seq_pages(s, &n)[pos / P];
    const uint32_t *w = lms_kv_seq_window_pages(s, &first, &n);
    return pos / P < first ? UINT32_MAX : w[pos / P];
}

/* Append n tokens to seq, write their K/V and commit. Values depend on
 * (seed, pos) past `shared`, on pos only before it (a shared prefix has
 * the same K/V in every sequence, as in a real model). */
static __attribute__((unused)) void kvt_fill(lms_kv *kv, lms_kv_seq *s, uint32_t seed, uint32_t n, uint32_t shared)
{
    uint32_t from = lms_kv_seq_len(s);
    int32_t *toks = malloc(n * sizeof *toks);
    for (uint32_t i = 0; i < n; i++)
        toks[i] = kvt_token(seed, from + i, shared);
    assert_int_equal(lms_kv_seq_append(kv, s, toks, n), 0);
    free(toks);
    lms_kv_layout L;
    lms_kv_get_layout(kv, &L);
    for (uint32_t pos = from; pos < from + n; pos++) {
        uint32_t page, slot, vs = pos < shared ? 0 : seed;
        assert_int_equal(lms_kv_seq_slot(kv, s, pos, &page, &slot), 0);
        for (uint32_t l = 0; l < L.n_layers; l++)
            for (uint32_t c = 0; c < 2; c++) {
                page = kvt_page(kv, s, l, pos, L.page_tokens);
                uint16_t *blk = c ? lms_kv_page_v(kv, l, page) : lms_kv_page_k(kv, l, page);
                for (uint32_t h = 0; h < L.n_kv_heads; h++)
                    for (uint32_t d = 0; d < L.head_dim; d++)
                        blk[((size_t)h * L.page_tokens + slot) * L.head_dim + d] = kvt_val(vs, pos, l, c, h, d);
            }
    }
    assert_int_equal(lms_kv_seq_commit(kv, s, from + n), 0);
}

/* Number of positions of s whose tokens and K/V differ from kvt_fill's (0 = exact;
 * sliding-window layers: at the positions whose window pages s holds). */
static __attribute__((unused)) uint32_t kvt_diff(lms_kv *kv, const lms_kv_seq *s, uint32_t seed, uint32_t n, uint32_t shared)
{
    lms_kv_layout L;
    lms_kv_get_layout(kv, &L);
    uint32_t bad = 0;
    if (lms_kv_seq_len(s) != n || lms_kv_seq_committed(s) != n)
        return UINT32_MAX;
    for (uint32_t pos = 0; pos < n; pos++) {
        uint32_t page, slot, vs = pos < shared ? 0 : seed, wrong = 0;
        assert_int_equal(lms_kv_seq_slot(kv, s, pos, &page, &slot), 0);
        if (lms_kv_seq_token(kv, s, pos) != kvt_token(seed, pos, shared))
            wrong = 1;
        for (uint32_t l = 0; l < L.n_layers; l++)
            for (uint32_t c = 0; c < 2; c++) {
                if ((page = kvt_page(kv, s, l, pos, L.page_tokens)) == UINT32_MAX)
                    continue;
                const uint16_t *blk = c ? lms_kv_page_v(kv, l, page) : lms_kv_page_k(kv, l, page);
                for (uint32_t h = 0; h < L.n_kv_heads; h++)
                    for (uint32_t d = 0; d < L.head_dim; d++)
                        if (blk[((size_t)h * L.page_tokens + slot) * L.head_dim + d] != kvt_val(vs, pos, l, c, h, d))
                            wrong = 1;
            }
        bad += wrong;
    }
    return bad;
}

/* Everything a failed call must leave as it was: bookkeeping, sequences,
 * LRU order, the index, and the bytes of every used or cached page. */
typedef struct kvt_snap {
    uint8_t *buf;
    size_t len;
} kvt_snap;

static __attribute__((unused)) void snap_put(kvt_snap *s, const void *p, size_t n)
{
    s->buf = realloc(s->buf, s->len + n);
    memcpy(s->buf + s->len, p, n);
    s->len += n;
}

static __attribute__((unused)) kvt_snap kvt_snapshot(const lms_kv *kv)
{
    kvt_snap s = {NULL, 0};
    for (uint32_t g = 0; g < kv->n_groups; g++) {
        const kv_group *G = &kv->g[g];
        uint32_t n = G->n_pages;
        snap_put(&s, G->refs, n * sizeof *G->refs);
        snap_put(&s, G->flags, n);
        for (uint32_t p = 0; p < n; p++) {
            if (G->flags[p] & KV_KEYED)
                snap_put(&s, &G->keys[p], sizeof G->keys[p]);
            if (G->refs[p] || (G->flags[p] & KV_PUBLISHED)) {
                if (g == 0)
                    snap_put(&s, kv->tokens + (size_t)p * kv->P, kv->P * sizeof(int32_t));
                snap_put(&s, lms__kv_gpage_ptr(G, p), G->page_bytes);
            }
        }
        snap_put(&s, &G->n_free, sizeof G->n_free);
        snap_put(&s, G->free_stack, G->n_free * sizeof *G->free_stack);
        for (uint32_t p = G->lru_head; p != KV_NONE; p = G->lru_next[p])
            snap_put(&s, &p, sizeof p);
        snap_put(&s, G->ht, ((size_t)G->ht_mask + 1) * sizeof *G->ht);
        snap_put(&s, &G->evictions, sizeof G->evictions);
    }
    for (uint32_t i = 0; i < kv->max_seqs; i++) {
        const lms_kv_seq *q = &kv->seqs[i];
        uint32_t np = (q->len + kv->P - 1) / kv->P;
        snap_put(&s, &q->live, sizeof q->live);
        snap_put(&s, &q->len, sizeof q->len);
        snap_put(&s, &q->committed, sizeof q->committed);
        snap_put(&s, q->table, np * sizeof *q->table);
        if (q->wtable && q->wfirst < np)
            snap_put(&s, q->wtable + q->wfirst, (np - q->wfirst) * sizeof *q->table);
    }
    snap_put(&s, &kv->n_seq_free, sizeof kv->n_seq_free);
    return s;
}

static __attribute__((unused)) void kvt_assert_same(const kvt_snap *a, const kvt_snap *b)
{
    assert_int_equal(a->len, b->len);
    assert_memory_equal(a->buf, b->buf, a->len);
}

static __attribute__((unused)) uint64_t kvt_segment_bytes(const char *store_dir)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/segments", store_dir);
    DIR *d = opendir(path);
    uint64_t total = 0;
    struct dirent *e;
    if (!d)
        return 0;
    while ((e = readdir(d))) {
        char f[8192];
        struct stat st;
        snprintf(f, sizeof f, "%s/%s", path, e->d_name);
        if (strstr(e->d_name, ".seg") && stat(f, &st) == 0)
            total += (uint64_t)st.st_size;
    }
    closedir(d);
    return total;
}

/* Store-level check of every session: its record decodes, each page record
 * and blob exist, blobs lie inside their segments and their bytes hash to
 * the blob key, blob reference counts equal the kvpages records naming
 * them. Returns the number of sessions; fails the test on a problem. */
static __attribute__((unused)) int kvt_check_store(lms_store *st)
{
    MDB_txn *txn;
    MDB_cursor *cur;
    MDB_val k, v;
    int sessions = 0, check;
    assert_int_equal(lms__txn_read(st, &txn), 0);
    assert_int_equal(mdb_cursor_open(txn, st->dbi[LMS__DB_SESSIONS], &cur), 0);
    for (int rc = lms__cursor_get(st, cur, LMS__DB_SESSIONS, &k, &v, MDB_FIRST, &check); rc == 0;
         rc = lms__cursor_get(st, cur, LMS__DB_SESSIONS, &k, &v, MDB_NEXT, &check)) {
        assert_int_equal(check, 0);
        lms__session_rec r;
        assert_int_equal(lms__session_rec_decode(v.mv_data, v.mv_size, NULL, &r), 0);
        for (uint32_t i = 0; i < lms__session_n_keys(&r); i++) {
            MDB_val pv;
            lms__kvpage_rec pr;
            lms__blob_rec b;
            assert_int_equal(lms__db_get(st, txn, LMS__DB_KVPAGES, lms__session_page_key(&r, i), 16, &pv), 0);
            assert_int_equal(lms__kvpage_rec_decode(pv.mv_data, pv.mv_size, &pr), 0);
            assert_int_equal(lms__blob_get(st, txn, pr.blob, &b), 0);
            assert_int_equal(b.kind, LMS__BLOB_KVPAGE);
            assert_int_equal(b.size, pr.stored_size);
            lms__segmap m;
            assert_int_equal(lms__segment_map(st, b.segment, &m), 0);
            assert_true(b.offset + b.size <= m.size);
            uint8_t h[16];
            lms__hash128_put(h, lms__hash128(m.base + b.offset, b.size));
            assert_memory_equal(h, pr.blob, 16);
            lms__segment_unmap(&m);
        }
        sessions++;
    }
    mdb_cursor_close(cur);
    /* blob refs of KV blobs == kvpages records naming them */
    assert_int_equal(mdb_cursor_open(txn, st->dbi[LMS__DB_BLOBS], &cur), 0);
    for (int rc = lms__cursor_get(st, cur, LMS__DB_BLOBS, &k, &v, MDB_FIRST, &check); rc == 0;
         rc = lms__cursor_get(st, cur, LMS__DB_BLOBS, &k, &v, MDB_NEXT, &check)) {
        assert_int_equal(check, 0);
        lms__blob_rec b;
        assert_int_equal(lms__blob_rec_decode(v.mv_data, v.mv_size, &b), 0);
        if (b.kind != LMS__BLOB_KVPAGE)
            continue;
        uint64_t named = 0;
        MDB_cursor *c2;
        MDB_val k2, v2;
        assert_int_equal(mdb_cursor_open(txn, st->dbi[LMS__DB_KVPAGES], &c2), 0);
        for (int r2 = lms__cursor_get(st, c2, LMS__DB_KVPAGES, &k2, &v2, MDB_FIRST, &check); r2 == 0;
             r2 = lms__cursor_get(st, c2, LMS__DB_KVPAGES, &k2, &v2, MDB_NEXT, &check)) {
            assert_int_equal(check, 0);
            lms__kvpage_rec pr;
            assert_int_equal(lms__kvpage_rec_decode(v2.mv_data, v2.mv_size, &pr), 0);
            if (k.mv_size == 16 && !memcmp(pr.blob, k.mv_data, 16))
                named++;
        }
        mdb_cursor_close(c2);
        assert_int_equal(named, b.refs);
    }
    mdb_cursor_close(cur);
    lms__txn_end(st, txn);
    return sessions;
}

#endif
