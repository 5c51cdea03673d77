/*
 * tests/kvcache/test_kv_arena.c - the paged KV arena and its sequences:
 * layout and geometry, append/slot/commit, fork with copy-on-write,
 * truncate, lookup of cached prefixes, LRU eviction order, failures that
 * leave the cache unchanged, zero allocations after creation (counted by
 * the fault layer and, outside sanitizer builds, by interposing malloc),
 * and a randomized property test against a reference model.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "kvcache/kv_internal.h"
#include "testutil.h"

/* ---- counting every malloc of the process (not under ASan, which owns malloc) ---- */
#if defined(__SANITIZE_ADDRESS__)
#define COUNT_LIBC 0
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define COUNT_LIBC 0
#endif
#endif
#ifndef COUNT_LIBC
#define COUNT_LIBC 1
#endif

#if COUNT_LIBC
extern void *__libc_malloc(size_t);
extern void *__libc_calloc(size_t, size_t);
extern void *__libc_realloc(void *, size_t);
extern void *__libc_memalign(size_t, size_t);
static long libc_allocs;
void *malloc(size_t n)
{
    libc_allocs++;
    return __libc_malloc(n);
}
void *calloc(size_t a, size_t b)
{
    libc_allocs++;
    return __libc_calloc(a, b);
}
void *realloc(void *p, size_t n)
{
    libc_allocs++;
    return __libc_realloc(p, n);
}
int posix_memalign(void **out, size_t align, size_t n)
{
    libc_allocs++;
    void *p = __libc_memalign(align, n);
    if (!p)
        return 12;
    *out = p;
    return 0;
}
#endif

/* ---- helpers -------------------------------------------------------------------- */

static lms_device *cpu(void)
{
    static lms_device *dev;
    if (!dev)
        assert_int_equal(lms_device_open(LMS_DEVICE_CPU, 0, &dev), 0);
    return dev;
}

/* Small f32 cache: 2 layers, 2 heads, head dim 4, P tokens per page; with
 * g_window > 0 layer 0 is a sliding-window layer (window g_window) and the
 * window group has g_window_pages pages (0: as many as group 0). */
static uint32_t g_window, g_window_pages;
static const uint8_t g_sliding[2] = {1, 0};

static lms_kv *make_kv(uint32_t pages, uint32_t P, uint32_t max_seqs);

/* make_kv with layer 0 sliding over `window` positions, in a window group of window_pages. */
static lms_kv *make_window_kv(uint32_t window, uint32_t window_pages, uint32_t pages, uint32_t P)
{
    g_window = window;
    g_window_pages = window_pages;
    lms_kv *kv = make_kv(pages, P, 4);
    g_window = g_window_pages = 0;
    return kv;
}

static lms_kv *make_kv(uint32_t pages, uint32_t P, uint32_t max_seqs)
{
    lms_kv_layout L = {.n_layers = 2, .n_kv_heads = 2, .head_dim = 4, .dtype = LMS_DTYPE_F32, .page_tokens = P};
    if (g_window) {
        L.window = g_window;
        L.sliding = g_sliding;
    }
    lms_kv_params p = lms_kv_default_params();
    p.budget_pages = pages;
    p.window_pages = g_window_pages;
    p.max_seqs = max_seqs;
    memset(p.model_id, 0xAB, sizeof p.model_id);
    lms_kv *kv;
    assert_int_equal(lms_kv_create(cpu(), &L, &p, &kv), 0);
    return kv;
}

/* The value a test stores for (prefix hash, layer, K/V, head, dim). */
static uint32_t val(uint64_t ph, uint32_t l, uint32_t c, uint32_t h, uint32_t d)
{
    return (uint32_t)lms__hash64(&ph, sizeof ph, ((uint64_t)l << 24) | (c << 16) | (h << 8) | d);
}

static uint64_t prefix_step(uint64_t ph, int32_t tok) { return lms__hash64(&tok, sizeof tok, ph) ^ 0x9e37; }

/* The page of `layer` that holds position pos of s (its group's block table), or
 * KV_NONE when the sequence gave that window page back. */
static uint32_t page_of(const lms_kv *kv, const lms_kv_seq *s, uint32_t layer, uint32_t pos)
{
    uint32_t first, n;
    if (lms_kv_layer_group(kv, layer, NULL) == 0)
        return lms_kv_seq_pages(s, &n)[pos / kv->P];
    const uint32_t *w = lms_kv_seq_window_pages(s, &first, &n);
    return pos / kv->P < first ? KV_NONE : w[pos / kv->P];
}

/* Write K/V of positions [from, to) of seq, whose tokens are toks. */
static void write_kv(lms_kv *kv, lms_kv_seq *s, const int32_t *toks, uint32_t from, uint32_t to)
{
    uint64_t ph = 0;
    for (uint32_t pos = 0; pos < to; pos++) {
        ph = prefix_step(ph, toks[pos]);
        if (pos < from)
            continue;
        uint32_t page, slot;
        assert_int_equal(lms_kv_seq_slot(kv, s, pos, &page, &slot), 0);
        for (uint32_t l = 0; l < 2; l++)
            for (uint32_t c = 0; c < 2; c++) {
                page = page_of(kv, s, l, pos);
                assert_int_not_equal(page, KV_NONE); /* positions being written are held */
                uint32_t *blk = c ? lms_kv_page_v(kv, l, page) : lms_kv_page_k(kv, l, page);
                for (uint32_t h = 0; h < 2; h++)
                    for (uint32_t d = 0; d < 4; d++)
                        blk[(h * kv->P + slot) * 4 + d] = val(ph, l, c, h, d);
            }
    }
}

/* Check the K/V of positions [0, n) of seq against toks (of a sliding-window
 * layer: the positions whose window pages it holds). Returns false on a mismatch. */
static bool check_kv(lms_kv *kv, const lms_kv_seq *s, const int32_t *toks, uint32_t n)
{
    uint64_t ph = 0;
    for (uint32_t pos = 0; pos < n; pos++) {
        ph = prefix_step(ph, toks[pos]);
        uint32_t page, slot;
        if (lms_kv_seq_slot(kv, s, pos, &page, &slot))
            return false;
        if (lms_kv_seq_token(kv, s, pos) != toks[pos])
            return false;
        for (uint32_t l = 0; l < 2; l++)
            for (uint32_t c = 0; c < 2; c++) {
                if ((page = page_of(kv, s, l, pos)) == KV_NONE)
                    continue;
                const uint32_t *blk = c ? lms_kv_page_v(kv, l, page) : lms_kv_page_k(kv, l, page);
                for (uint32_t h = 0; h < 2; h++)
                    for (uint32_t d = 0; d < 4; d++)
                        if (blk[(h * kv->P + slot) * 4 + d] != val(ph, l, c, h, d))
                            return false;
            }
    }
    return true;
}

static void append_written(lms_kv *kv, lms_kv_seq *s, int32_t *toks, uint32_t from, uint32_t to)
{
    assert_int_equal(lms_kv_seq_append(kv, s, toks + from, to - from), 0);
    write_kv(kv, s, toks, from, to);
    assert_int_equal(lms_kv_seq_commit(kv, s, to), 0);
}

/* ---- tests ------------------------------------------------------------------------- */

static void create_rejects_bad_layouts(void **st)
{
    (void)st;
    lms_kv *kv = (lms_kv *)1;
    lms_kv_params p = lms_kv_default_params();
    p.budget_pages = 4;
    lms_kv_layout L = {.n_layers = 2, .n_kv_heads = 2, .head_dim = 4, .dtype = LMS_DTYPE_I32};
    assert_int_equal(lms_kv_create(cpu(), &L, &p, &kv), LMS_EINVAL);
    assert_null(kv);
    L.dtype = LMS_DTYPE_BF16;
    L.head_dim = 0;
    assert_int_equal(lms_kv_create(cpu(), &L, &p, &kv), LMS_EINVAL);
    L.head_dim = 4;
    L.page_tokens = 4096;
    assert_int_equal(lms_kv_create(cpu(), &L, &p, &kv), LMS_EINVAL);
    L.page_tokens = 0;
    p.budget_pages = 0;
    p.budget_bytes = 10; /* under one page */
    assert_int_equal(lms_kv_create(cpu(), &L, &p, &kv), LMS_EINVAL);
    assert_non_null(strstr(lms_last_error(), "under one page"));
    /* bytes budget: rounded down to whole pages; page_tokens 0 = 16 */
    p.budget_bytes = 3 * (2 * 2 * 2 * 16 * 4 * 2) + 100;
    assert_int_equal(lms_kv_create(cpu(), &L, &p, &kv), 0);
    lms_kv_layout got;
    lms_kv_get_layout(kv, &got);
    assert_int_equal(got.page_tokens, 16);
    assert_int_equal(lms_kv_n_pages(kv), 3);
    assert_int_equal(lms_kv_destroy(kv), 0);
    assert_int_equal(lms_kv_destroy(NULL), 0);
}

static void geometry_matches_the_documented_page_major_layout(void **st)
{
    (void)st;
    lms_kv *kv = make_kv(5, 4, 4);
    lms_kv_geometry g;
    lms_kv_get_geometry(kv, &g);
    assert_int_equal(g.elem_size, 4);
    assert_int_equal(g.token_bytes, 4 * 4);
    assert_int_equal(g.head_bytes, 4 * 16);
    assert_int_equal(g.v_offset, 2 * 64);
    assert_int_equal(g.layer_bytes, 2 * 128);
    assert_int_equal(g.page_bytes, 2 * 256);
    uint8_t *base = g.base;
    for (uint32_t p = 0; p < 5; p++)
        for (uint32_t l = 0; l < 2; l++) {
            assert_ptr_equal(lms_kv_page_k(kv, l, p), base + p * g.page_bytes + l * g.layer_bytes);
            assert_ptr_equal(lms_kv_page_v(kv, l, p), base + p * g.page_bytes + l * g.layer_bytes + g.v_offset);
        }
    assert_null(lms_kv_page_k(kv, 2, 0));
    assert_null(lms_kv_page_v(kv, 0, 5));
    assert_int_equal(lms_kv_destroy(kv), 0);
}

static void append_reserves_slots_and_commit_keys_full_pages(void **st)
{
    (void)st;
    lms_kv *kv = make_kv(8, 4, 4);
    lms_kv_seq *s;
    int32_t toks[10] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
    assert_int_equal(lms_kv_seq_new(kv, &s), 0);
    assert_int_equal(lms_kv_seq_append(kv, s, toks, 6), 0);
    assert_int_equal(lms_kv_seq_len(s), 6);
    assert_int_equal(lms_kv_seq_committed(s), 0);
    uint32_t np;
    const uint32_t *tbl = lms_kv_seq_pages(s, &np);
    assert_int_equal(np, 2);
    uint32_t page, slot;
    assert_int_equal(lms_kv_seq_slot(kv, s, 5, &page, &slot), 0);
    assert_int_equal(page, tbl[1]);
    assert_int_equal(slot, 1);
    assert_int_equal(lms_kv_seq_slot(kv, s, 6, &page, &slot), LMS_ERANGE);
    write_kv(kv, s, toks, 0, 6);
    lms_kv_stats stats;
    lms_kv_get_stats(kv, &stats);
    assert_int_equal(stats.keyed_pages, 0); /* nothing committed yet */
    assert_int_equal(lms_kv_seq_commit(kv, s, 7), LMS_EINVAL);
    assert_int_equal(lms_kv_seq_commit(kv, s, 6), 0);
    assert_int_equal(lms_kv_seq_commit(kv, s, 5), LMS_EINVAL); /* not backwards */
    lms_kv_get_stats(kv, &stats);
    assert_int_equal(stats.keyed_pages, 1); /* the full page only */
    assert_true(check_kv(kv, s, toks, 6));
    int32_t back[10];
    assert_int_equal(lms_kv_seq_tokens(kv, s, back, 10), 6);
    assert_memory_equal(back, toks, 6 * sizeof *toks);
    assert_int_equal(lms_kv_destroy(kv), LMS_EBUSY);
    lms_kv_seq_free(kv, s);
    lms_kv_get_stats(kv, &stats);
    assert_int_equal(stats.cached_pages, 1);
    assert_int_equal(stats.free_pages, 7);
    assert_int_equal(lms__kv_check(kv), 0);
    assert_int_equal(lms_kv_destroy(kv), 0);
}

static void fork_shares_full_pages_and_copies_a_shared_partial_page_on_write(void **st)
{
    (void)st;
    lms_kv *kv = make_kv(16, 4, 4);
    int32_t a[12] = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    int32_t b[12] = {1, 2, 3, 4, 5, 6, 70, 80, 90, 100, 110, 120};
    lms_kv_seq *s, *f;
    assert_int_equal(lms_kv_seq_new(kv, &s), 0);
    append_written(kv, s, a, 0, 6);
    assert_int_equal(lms_kv_seq_fork(kv, s, &f), 0);
    uint32_t n1, n2;
    const uint32_t *t1 = lms_kv_seq_pages(s, &n1), *t2 = lms_kv_seq_pages(f, &n2);
    assert_int_equal(n1, 2);
    assert_int_equal(n2, 2);
    assert_int_equal(t1[0], t2[0]);
    assert_int_equal(t1[1], t2[1]);
    assert_int_equal(lms_kv_page_refs(kv, t1[0]), 2);
    assert_int_equal(lms_kv_page_refs(kv, t1[1]), 2);
    uint32_t shared_partial = t1[1];
    /* the fork diverges inside the shared partial page */
    append_written(kv, f, b, 6, 12);
    t1 = lms_kv_seq_pages(s, &n1);
    t2 = lms_kv_seq_pages(f, &n2);
    assert_int_equal(t1[0], t2[0]);          /* full page still shared */
    assert_int_not_equal(t1[1], t2[1]);      /* partial page copied */
    assert_int_equal(t1[1], shared_partial); /* the original kept its page */
    assert_int_equal(lms_kv_page_refs(kv, shared_partial), 1);
    lms_kv_stats stats;
    lms_kv_get_stats(kv, &stats);
    assert_int_equal(stats.cow_copies, 1);
    assert_true(check_kv(kv, f, b, 12));
    /* the original's bytes are untouched, and it can grow its own way */
    assert_true(check_kv(kv, s, a, 6));
    append_written(kv, s, a, 6, 12);
    assert_true(check_kv(kv, s, a, 12));
    assert_true(check_kv(kv, f, b, 12));
    assert_int_equal(lms__kv_check(kv), 0);
    lms_kv_seq_free(kv, s);
    lms_kv_seq_free(kv, f);
    assert_int_equal(lms__kv_check(kv), 0);
    assert_int_equal(lms_kv_destroy(kv), 0);
}

static void truncate_into_a_keyed_page_then_append_copies_it(void **st)
{
    (void)st;
    lms_kv *kv = make_kv(16, 4, 4);
    int32_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    int32_t b[8] = {1, 2, 3, 4, 5, 60, 70, 80};
    lms_kv_seq *s, *t;
    assert_int_equal(lms_kv_seq_new(kv, &s), 0);
    append_written(kv, s, a, 0, 8);
    uint32_t n;
    uint32_t page1 = lms_kv_seq_pages(s, &n)[1];
    assert_int_equal(lms_kv_seq_truncate(kv, s, 9), LMS_EINVAL);
    assert_int_equal(lms_kv_seq_truncate(kv, s, 5), 0);
    assert_int_equal(lms_kv_seq_len(s), 5);
    assert_int_equal(lms_kv_seq_committed(s), 5);
    append_written(kv, s, b, 5, 8);
    assert_int_not_equal(lms_kv_seq_pages(s, &n)[1], page1); /* copied, keyed page kept */
    assert_true(check_kv(kv, s, b, 8));
    /* the old full page [5..8] is still found by lookup of a's tokens */
    uint32_t reused;
    assert_int_equal(lms_kv_lookup(kv, a, 8, &t, &reused), 0);
    assert_int_equal(reused, 8);
    assert_int_equal(lms_kv_seq_pages(t, &n)[1], page1);
    assert_true(check_kv(kv, t, a, 8));
    assert_int_equal(lms__kv_check(kv), 0);
    lms_kv_seq_free(kv, s);
    lms_kv_seq_free(kv, t);
    assert_int_equal(lms_kv_destroy(kv), 0);
}

static void lookup_reuses_whole_committed_pages_of_the_longest_prefix(void **st)
{
    (void)st;
    lms_kv *kv = make_kv(16, 4, 4);
    int32_t a[10] = {5, 6, 7, 8, 9, 10, 11, 12, 13, 14};
    int32_t q[12] = {5, 6, 7, 8, 9, 10, 11, 12, 99, 98, 97, 96};
    lms_kv_seq *s, *t, *u;
    assert_int_equal(lms_kv_seq_new(kv, &s), 0);
    append_written(kv, s, a, 0, 10);
    lms_kv_seq_free(kv, s);
    uint32_t reused;
    assert_int_equal(lms_kv_lookup(kv, q, 12, &t, &reused), 0);
    assert_int_equal(reused, 8);
    assert_int_equal(lms_kv_seq_len(t), 8);
    assert_int_equal(lms_kv_seq_committed(t), 8);
    assert_true(check_kv(kv, t, q, 8));
    /* n - 1 rule: 8 tokens asked, 7 passed: only one page */
    assert_int_equal(lms_kv_lookup(kv, q, 7, &u, &reused), 0);
    assert_int_equal(reused, 4);
    lms_kv_seq_free(kv, u);
    /* a different first token shares nothing (keys chain over the prefix) */
    int32_t r[8] = {0, 6, 7, 8, 9, 10, 11, 12};
    assert_int_equal(lms_kv_lookup(kv, r, 8, &u, &reused), 0);
    assert_int_equal(reused, 0);
    lms_kv_seq_free(kv, u);
    /* another model id never matches */
    lms_kv_layout L;
    lms_kv_get_layout(kv, &L);
    lms_kv_params p = lms_kv_default_params();
    p.budget_pages = 4;
    lms_kv *other;
    assert_int_equal(lms_kv_create(cpu(), &L, &p, &other), 0);
    lms_hash128 k1 = lms__kv_page_key(kv, (lms_hash128){0, 0}, a, 4);
    lms_hash128 k2 = lms__kv_page_key(other, (lms_hash128){0, 0}, a, 4);
    assert_false(lms__hash128_eq(k1, k2));
    assert_int_equal(lms_kv_destroy(other), 0);
    lms_kv_seq_free(kv, t);
    assert_int_equal(lms__kv_check(kv), 0);
    assert_int_equal(lms_kv_destroy(kv), 0);
}

static void eviction_takes_the_least_recently_released_pages_tail_first(void **st)
{
    (void)st;
    lms_kv *kv = make_kv(4, 4, 4);
    int32_t a[8] = {1, 2, 3, 4, 5, 6, 7, 8}, b[8] = {11, 12, 13, 14, 15, 16, 17, 18}, c[4] = {21, 22, 23, 24};
    lms_kv_seq *s;
    assert_int_equal(lms_kv_seq_new(kv, &s), 0);
    append_written(kv, s, a, 0, 8);
    lms_kv_seq_free(kv, s); /* LRU: a1 (tail page first), a0 */
    assert_int_equal(lms_kv_seq_new(kv, &s), 0);
    append_written(kv, s, b, 0, 8);
    lms_kv_seq_free(kv, s); /* LRU: a1, a0, b1, b0 */
    lms_kv_stats stats;
    lms_kv_get_stats(kv, &stats);
    assert_int_equal(stats.cached_pages, 4);
    assert_int_equal(stats.free_pages, 0);
    assert_int_equal(lms_kv_seq_new(kv, &s), 0);
    append_written(kv, s, c, 0, 4); /* evicts a1 */
    lms_kv_seq *t;
    uint32_t reused;
    assert_int_equal(lms_kv_lookup(kv, a, 8, &t, &reused), 0);
    assert_int_equal(reused, 4); /* a0 survived, a1 was evicted */
    lms_kv_seq_free(kv, t);
    assert_int_equal(lms_kv_lookup(kv, b, 8, &t, &reused), 0);
    assert_int_equal(reused, 8);
    assert_true(check_kv(kv, t, b, 8));
    lms_kv_get_stats(kv, &stats);
    assert_int_equal(stats.evictions, 1);
    lms_kv_seq_free(kv, t);
    lms_kv_seq_free(kv, s);
    assert_int_equal(lms__kv_check(kv), 0);
    lms_kv_drop_cached(kv);
    lms_kv_get_stats(kv, &stats);
    assert_int_equal(stats.free_pages, 4);
    assert_int_equal(lms_kv_destroy(kv), 0);
}

static void exhausted_budget_fails_and_leaves_the_cache_unchanged(void **st)
{
    (void)st;
    lms_kv *kv = make_kv(4, 4, 3);
    int32_t a[16] = {0};
    for (int i = 0; i < 16; i++)
        a[i] = i + 1;
    lms_kv_seq *s, *f, *g, *o;
    assert_int_equal(lms_kv_seq_new(kv, &s), 0);
    append_written(kv, s, a, 0, 10);
    assert_int_equal(lms_kv_seq_new(kv, &o), 0);
    append_written(kv, o, a + 4, 0, 4); /* the last page */
    lms_kv_stats before, after;
    lms_kv_get_stats(kv, &before);
    uint32_t n;
    uint32_t tbl[3];
    memcpy(tbl, lms_kv_seq_pages(s, &n), sizeof tbl);
    assert_int_equal(lms_kv_seq_append(kv, s, a + 10, 6), LMS_ENOSPACE); /* needs 2 more pages, 0 left */
    assert_non_null(strstr(lms_last_error(), "pages needed"));
    lms_kv_get_stats(kv, &after);
    assert_memory_equal(&before, &after, sizeof before);
    assert_int_equal(lms_kv_seq_len(s), 10);
    assert_memory_equal(lms_kv_seq_pages(s, &n), tbl, sizeof tbl);
    /* copy-on-write needs a page too */
    assert_int_equal(lms_kv_seq_fork(kv, s, &f), 0);
    assert_int_equal(lms_kv_seq_append(kv, f, a + 10, 1), LMS_ENOSPACE);
    assert_int_equal(lms_kv_seq_fork(kv, s, &g), LMS_ENOSPACE); /* max_seqs 3 */
    assert_null(g);
    assert_true(check_kv(kv, s, a, 10));
    assert_int_equal(lms__kv_check(kv), 0);
    lms_kv_seq_free(kv, f);
    lms_kv_seq_free(kv, s);
    lms_kv_seq_free(kv, o);
    assert_int_equal(lms_kv_destroy(kv), 0);
}


/* ---- sliding-window layers ------------------------------------------------------------- */

static void create_checks_the_window_layout(void **st)
{
    (void)st;
    lms_kv *kv = (lms_kv *)1;
    lms_kv_params p = lms_kv_default_params();
    p.budget_pages = 4;
    uint8_t none[2] = {0, 0}, all[2] = {1, 1};
    lms_kv_layout L = {.n_layers = 2, .n_kv_heads = 2, .head_dim = 4, .dtype = LMS_DTYPE_F32, .window = 8};
    assert_int_equal(lms_kv_create(cpu(), &L, &p, &kv), LMS_EINVAL); /* no sliding layers named */
    L.sliding = none;
    assert_int_equal(lms_kv_create(cpu(), &L, &p, &kv), LMS_EINVAL);
    L.sliding = all;
    assert_int_equal(lms_kv_create(cpu(), &L, &p, &kv), LMS_EINVAL);
    assert_non_null(strstr(lms_last_error(), "full-context"));
    assert_null(kv);
    /* a bytes budget is split between the groups: 1 layer each here, equal pages */
    L.sliding = g_sliding;
    p.budget_pages = 0;
    p.budget_bytes = 5 * 2 * (2 * 2 * 16 * 4 * 4) + 10;
    assert_int_equal(lms_kv_create(cpu(), &L, &p, &kv), 0);
    lms_kv_geometry g;
    lms_kv_get_geometry(kv, &g);
    assert_int_equal(g.n_pages, 5);
    assert_int_equal(g.window_n_pages, 5);
    assert_int_equal(g.page_bytes, 2 * 2 * 16 * 4 * 4);
    assert_int_equal(g.window_page_bytes, g.page_bytes);
    assert_ptr_equal(g.window_base, (uint8_t *)g.base + 5 * g.page_bytes);
    /* layer 0 is the window group's layer 0, layer 1 group 0's layer 0 */
    uint32_t idx = 9;
    assert_int_equal(lms_kv_layer_group(kv, 0, &idx), 1);
    assert_int_equal(idx, 0);
    assert_int_equal(lms_kv_layer_group(kv, 1, &idx), 0);
    assert_int_equal(idx, 0);
    assert_ptr_equal(lms_kv_page_k(kv, 0, 3), (uint8_t *)g.window_base + 3 * g.window_page_bytes);
    assert_ptr_equal(lms_kv_page_v(kv, 1, 2), (uint8_t *)g.base + 2 * g.page_bytes + g.v_offset);
    lms_kv_layout got;
    lms_kv_get_layout(kv, &got);
    assert_int_equal(got.window, 8);
    assert_memory_equal(got.sliding, g_sliding, 2);
    assert_ptr_not_equal(got.sliding, g_sliding); /* the cache's own copy */
    assert_int_equal(lms_kv_destroy(kv), 0);
}

/* Appends one token at a time (writing and committing each) up to n. */
static void grow_by_ones(lms_kv *kv, lms_kv_seq *s, int32_t *toks, uint32_t from, uint32_t n, uint32_t max_window_used)
{
    for (uint32_t len = from; len < n; len++) {
        append_written(kv, s, toks, len, len + 1);
        lms_kv_stats stats;
        lms_kv_get_stats(kv, &stats);
        uint32_t first, np;
        lms_kv_layout L;
        lms_kv_get_layout(kv, &L);
        lms_kv_seq_window_pages(s, &first, &np);
        /* what it holds: the pages of positions [len + 1 - window, len] */
        uint32_t lo = len + 1 > L.window ? len + 1 - L.window : 0;
        assert_int_equal(first, lo / kv->P);
        assert_int_equal(np, len / kv->P + 1);
        assert_true(stats.window_used_pages <= max_window_used);
    }
}

static void window_pages_in_use_stay_at_the_window_while_a_sequence_grows(void **st)
{
    (void)st;
    lms_kv *kv = make_window_kv(8, 6, 40, 4);
    int32_t toks[128];
    for (int i = 0; i < 128; i++) toks[i] = 7 * i + 1;
    lms_kv_seq *s;
    assert_int_equal(lms_kv_seq_new(kv, &s), 0);
    /* 8x the window: the sliding layer never holds more than window / P + 1 pages
     * although its group has only 6 pages (group 0 grows to 32 pages) */
    grow_by_ones(kv, s, toks, 0, 64, 8 / 4 + 1);
    lms_kv_stats stats;
    lms_kv_get_stats(kv, &stats);
    assert_int_equal(stats.used_pages, 16);
    assert_int_equal(stats.window_used_pages, 2); /* positions 56..63 */
    assert_int_equal(stats.window_pages, 6);
    assert_true(check_kv(kv, s, toks, 64)); /* every position of layer 1, the held window of layer 0 */
    assert_int_equal(lms__kv_check(kv), 0);
    /* a block of 12 tokens at once holds its own pages until it is committed */
    assert_int_equal(lms_kv_seq_append(kv, s, toks + 64, 12), 0);
    lms_kv_get_stats(kv, &stats);
    assert_int_equal(stats.window_used_pages, 5);
    assert_int_equal(lms_kv_seq_append(kv, s, toks + 76, 8), LMS_ENOSPACE); /* the window group is full */
    assert_non_null(strstr(lms_last_error(), "window pages needed"));
    write_kv(kv, s, toks, 64, 76);
    assert_int_equal(lms_kv_seq_commit(kv, s, 76), 0);
    lms_kv_get_stats(kv, &stats);
    assert_int_equal(stats.window_used_pages, 2);
    assert_true(check_kv(kv, s, toks, 76));
    lms_kv_seq_free(kv, s);
    assert_int_equal(lms__kv_check(kv), 0);
    assert_int_equal(lms_kv_destroy(kv), 0);
}

static void truncate_past_the_window_reattaches_cached_window_pages_or_refuses(void **st)
{
    (void)st;
    lms_kv *kv = make_window_kv(6, 12, 20, 4);
    int32_t a[40], b[40];
    for (int i = 0; i < 40; i++) a[i] = i + 1, b[i] = 100 + i;
    lms_kv_seq *s, *o;
    assert_int_equal(lms_kv_seq_new(kv, &s), 0);
    append_written(kv, s, a, 0, 32);
    uint32_t first, np;
    lms_kv_seq_window_pages(s, &first, &np);
    assert_int_equal(first, (32 - 6) / 4);
    /* back to 13 tokens: its window pages (positions 7..12) slid out but are cached */
    assert_int_equal(lms_kv_seq_keepable(kv, s, 13), 13);
    assert_int_equal(lms_kv_seq_truncate(kv, s, 13), 0);
    lms_kv_seq_window_pages(s, &first, &np);
    assert_int_equal(first, (13 - 6) / 4);
    assert_int_equal(np, 4);
    assert_true(check_kv(kv, s, a, 13));
    assert_int_equal(lms__kv_check(kv), 0);
    /* regrow the other way from 13 (copy-on-write of the keyed partial window page) */
    memcpy(b, a, 13 * sizeof *a);
    append_written(kv, s, b, 13, 32);
    assert_true(check_kv(kv, s, b, 32));
    /* another sequence takes every free and cached window page: a's old ones are evicted */
    int32_t c[40];
    for (int i = 0; i < 40; i++) c[i] = 500 + i;
    assert_int_equal(lms_kv_seq_new(kv, &o), 0);
    assert_int_equal(lms_kv_seq_append(kv, o, c, 40), 0);
    lms_kv_stats stats;
    lms_kv_get_stats(kv, &stats);
    assert_int_equal(stats.window_free_pages + stats.window_cached_pages, 0);
    /* now truncating s back to 13 cannot find its window: refused, nothing changes */
    uint32_t keep = lms_kv_seq_keepable(kv, s, 13);
    assert_true(keep < 13);
    lms_kv_stats before, after;
    uint32_t tbl[8], wtbl[8], f0, n0;
    lms_kv_get_stats(kv, &before);
    memcpy(tbl, lms_kv_seq_pages(s, &n0), sizeof tbl);
    memcpy(wtbl, lms_kv_seq_window_pages(s, &f0, &n0), sizeof wtbl);
    assert_int_equal(lms_kv_seq_truncate(kv, s, 13), LMS_ERANGE);
    assert_non_null(strstr(lms_last_error(), "sliding-window"));
    lms_kv_get_stats(kv, &after);
    assert_memory_equal(&before, &after, sizeof before);
    assert_int_equal(lms_kv_seq_len(s), 32);
    assert_memory_equal(lms_kv_seq_pages(s, &n0), tbl, sizeof tbl);
    assert_memory_equal(lms_kv_seq_window_pages(s, &first, &np) + f0, wtbl + f0, (n0 - f0) * sizeof *wtbl);
    assert_int_equal(first, f0);
    assert_true(check_kv(kv, s, b, 32));
    /* but the length keepable reports is accepted */
    assert_int_equal(lms_kv_seq_truncate(kv, s, keep), 0);
    assert_int_equal(lms_kv_seq_len(s), keep);
    assert_int_equal(lms__kv_check(kv), 0);
    lms_kv_seq_free(kv, o);
    lms_kv_seq_free(kv, s);
    assert_int_equal(lms__kv_check(kv), 0);
    assert_int_equal(lms_kv_destroy(kv), 0);
}

static void lookup_keeps_only_a_prefix_whose_window_pages_are_cached(void **st)
{
    (void)st;
    lms_kv *kv = make_window_kv(5, 8, 24, 4);
    int32_t a[40];
    for (int i = 0; i < 40; i++) a[i] = i + 1;
    lms_kv_seq *s, *t;
    assert_int_equal(lms_kv_seq_new(kv, &s), 0);
    /* 9 pages, a page per block: the window group's 8 pages go round once, so the
     * window page of positions 0..3 (the first to slide out) is evicted for the 9th */
    for (uint32_t n = 0; n < 36; n += 4) append_written(kv, s, a, n, n + 4);
    lms_kv_stats stats;
    lms_kv_get_stats(kv, &stats);
    assert_int_equal(stats.window_used_pages, 2);
    assert_int_equal(stats.window_cached_pages, 6);
    lms_kv_seq_free(kv, s);
    /* a prefix matches only as far as the window pages of its last 5 positions are cached:
     * ending at 4 or 8 it needs the evicted page, at 12 or later it does not */
    for (uint32_t n = 4; n <= 36; n += 4) {
        uint32_t reused;
        assert_int_equal(lms_kv_lookup(kv, a, n, &t, &reused), 0);
        assert_int_equal(reused, n <= 8 ? 0 : n);
        assert_true(check_kv(kv, t, a, reused));
        uint32_t first, np;
        lms_kv_seq_window_pages(t, &first, &np);
        assert_int_equal(first, reused > 5 ? (reused - 5) / 4 : 0);
        assert_int_equal(lms__kv_check(kv), 0);
        lms_kv_seq_free(kv, t);
    }
    lms_kv_drop_cached(kv);
    lms_kv_get_stats(kv, &stats);
    assert_int_equal(stats.window_cached_pages, 0);
    assert_int_equal(stats.window_free_pages, 8);
    assert_int_equal(lms__kv_check(kv), 0);
    assert_int_equal(lms_kv_destroy(kv), 0);
}

static void fork_shares_window_pages_and_copies_a_shared_partial_one(void **st)
{
    (void)st;
    lms_kv *kv = make_window_kv(6, 0, 16, 4);
    int32_t a[24], b[24];
    for (int i = 0; i < 24; i++) a[i] = i + 1, b[i] = i < 14 ? i + 1 : 50 + i;
    lms_kv_seq *s, *f;
    assert_int_equal(lms_kv_seq_new(kv, &s), 0);
    append_written(kv, s, a, 0, 14);
    assert_int_equal(lms_kv_seq_fork(kv, s, &f), 0);
    uint32_t f1, n1, f2, n2;
    const uint32_t *w1 = lms_kv_seq_window_pages(s, &f1, &n1), *w2 = lms_kv_seq_window_pages(f, &f2, &n2);
    assert_int_equal(f1, f2);
    assert_int_equal(n1, n2);
    for (uint32_t i = f1; i < n1; i++) assert_int_equal(w1[i], w2[i]);
    uint32_t shared_last = w1[n1 - 1];
    append_written(kv, f, b, 14, 24);
    w1 = lms_kv_seq_window_pages(s, &f1, &n1);
    assert_int_equal(w1[n1 - 1], shared_last); /* the original keeps its partial window page */
    assert_true(check_kv(kv, s, a, 14));
    assert_true(check_kv(kv, f, b, 24));
    lms_kv_stats stats;
    lms_kv_get_stats(kv, &stats);
    assert_int_equal(stats.cow_copies, 1); /* group 0's copy; the window group counts its own */
    assert_int_equal(lms__kv_check(kv), 0);
    lms_kv_seq_free(kv, s);
    lms_kv_seq_free(kv, f);
    assert_int_equal(lms__kv_check(kv), 0);
    assert_int_equal(lms_kv_destroy(kv), 0);
}

/* ---- reference model + randomized operations ----------------------------------------- */

#define RM_SEQS 6
#define RM_MAX 40
typedef struct {
    bool live;
    lms_kv_seq *s;
    int32_t toks[RM_MAX];
    uint32_t len, committed;
} ref_seq;

static uint64_t rng_state;
static uint64_t n_refused, n_reattached; /* windowed truncations refused / that attached given-back pages */
static uint32_t rnd(uint32_t n)
{
    rng_state ^= rng_state << 13;
    rng_state ^= rng_state >> 7;
    rng_state ^= rng_state << 17;
    return (uint32_t)(rng_state % n);
}

/* Expected refs from the model's block tables; contents and tokens from its token lists. */
static void check_against_model(lms_kv *kv, ref_seq *m, bool deep)
{
    uint32_t *refs = calloc(lms_kv_n_pages(kv), sizeof *refs);
    for (int i = 0; i < RM_SEQS; i++) {
        if (!m[i].live)
            continue;
        assert_int_equal(lms_kv_seq_len(m[i].s), m[i].len);
        assert_int_equal(lms_kv_seq_committed(m[i].s), m[i].committed);
        uint32_t n;
        const uint32_t *t = lms_kv_seq_pages(m[i].s, &n);
        assert_int_equal(n, (m[i].len + kv->P - 1) / kv->P);
        for (uint32_t j = 0; j < n; j++)
            refs[t[j]]++;
        if (deep)
            assert_true(check_kv(kv, m[i].s, m[i].toks, m[i].committed));
        for (uint32_t pos = 0; pos < m[i].len; pos++)
            assert_int_equal(lms_kv_seq_token(kv, m[i].s, pos), m[i].toks[pos]);
    }
    for (uint32_t p = 0; p < lms_kv_n_pages(kv); p++)
        assert_int_equal(lms_kv_page_refs(kv, p), refs[p]);
    free(refs);
    int rc = lms__kv_check(kv);
    if (rc)
        fail_msg("invariant: %s", lms_last_error());
}

/* One random operation on kv and the model; returns without checking. */
static void random_op(lms_kv *kv, ref_seq *m, bool written)
{
    int i = (int)rnd(RM_SEQS);
    ref_seq *r = &m[i];
    uint32_t op = rnd(10);
    if (!r->live) {
        if (op < 5) {
            if (lms_kv_seq_new(kv, &r->s) == 0) {
                r->live = true;
                r->len = r->committed = 0;
            }
        } else {
            /* lookup a token list drawn from a small alphabet so prefixes repeat */
            int32_t q[RM_MAX];
            uint32_t n = 1 + rnd(RM_MAX);
            int src = (int)rnd(RM_SEQS);
            for (uint32_t k = 0; k < n; k++)
                q[k] = (m[src].live && k < m[src].len && rnd(8)) ? m[src].toks[k] : (int32_t)rnd(3);
            uint32_t reused;
            if (lms_kv_lookup(kv, q, n, &r->s, &reused) == 0) {
                assert_int_equal(reused % kv->P, 0);
                assert_true(reused <= n);
                r->live = true;
                memcpy(r->toks, q, reused * sizeof *q);
                r->len = r->committed = reused;
            }
        }
        return;
    }
    if (op < 4) { /* append (and usually write + commit) */
        uint32_t room = RM_MAX - r->len;
        if (!room)
            return;
        uint32_t n = 1 + rnd(LMS_MIN(room, 9));
        int32_t add[RM_MAX];
        for (uint32_t k = 0; k < n; k++)
            add[k] = (int32_t)rnd(3);
        if (lms_kv_seq_append(kv, r->s, add, n) != 0)
            return;
        memcpy(r->toks + r->len, add, n * sizeof *add);
        uint32_t old = r->len;
        r->len += n;
        if (rnd(4)) {
            uint32_t upto = r->len - (rnd(3) == 0 ? rnd(n + 1) : 0);
            if (upto < r->committed)
                upto = r->committed;
            if (written)
                write_kv(kv, r->s, r->toks, r->committed, upto);
            (void)old;
            assert_int_equal(lms_kv_seq_commit(kv, r->s, upto), 0);
            r->committed = upto;
        }
    } else if (op < 5) { /* commit what was appended */
        if (written)
            write_kv(kv, r->s, r->toks, r->committed, r->len);
        assert_int_equal(lms_kv_seq_commit(kv, r->s, r->len), 0);
        r->committed = r->len;
    } else if (op < 7) { /* fork into a free model slot */
        for (int j = 0; j < RM_SEQS; j++)
            if (!m[j].live) {
                lms_kv_seq *ns;
                if (lms_kv_seq_fork(kv, r->s, &ns) == 0) {
                    m[j] = *r;
                    m[j].s = ns;
                }
                break;
            }
    } else if (op < 9) { /* truncate */
        uint32_t keep = r->len ? rnd(r->len + 1) : 0;
        if (lms_kv_seq_keepable(kv, r->s, keep) != keep) { /* a window page it needs is gone */
            assert_int_equal(lms_kv_seq_truncate(kv, r->s, keep), LMS_ERANGE);
            n_refused++;
            return;
        }
        uint32_t f0, f1, n;
        lms_kv_seq_window_pages(r->s, &f0, &n);
        assert_int_equal(lms_kv_seq_truncate(kv, r->s, keep), 0);
        lms_kv_seq_window_pages(r->s, &f1, &n);
        n_reattached += f1 < f0;
        r->len = keep;
        if (r->committed > keep)
            r->committed = keep;
    } else { /* free */
        lms_kv_seq_free(kv, r->s);
        r->live = false;
    }
}

static void random_operations_match_the_reference_model(void **st)
{
    (void)st;
    uint64_t total_cow = 0, total_evict = 0;
    for (uint64_t seed = 1; seed <= 80; seed++) {
        rng_state = seed * 0x9E3779B97F4A7C15ull;
        uint32_t P = 1 + rnd(5);
        /* odd seeds: layer 0 slides over a window of 1..12 positions in a window group of its own size */
        g_window = seed % 2 ? 1 + rnd(12) : 0;
        g_window_pages = g_window ? 4 + rnd(20) : 0;
        lms_kv *kv = make_kv(6 + rnd(20), P, RM_SEQS + 2);
        ref_seq m[RM_SEQS];
        memset(m, 0, sizeof m);
        for (int step = 0; step < 400; step++) {
            random_op(kv, m, true);
            check_against_model(kv, m, true);
        }
        for (int i = 0; i < RM_SEQS; i++)
            if (m[i].live)
                lms_kv_seq_free(kv, m[i].s);
        assert_int_equal(lms__kv_check(kv), 0);
        lms_kv_stats stats;
        lms_kv_get_stats(kv, &stats);
        assert_int_equal(stats.used_pages, 0);
        total_cow += stats.cow_copies;
        total_evict += stats.evictions;
        assert_int_equal(stats.window_used_pages, 0);
        assert_int_equal(lms_kv_destroy(kv), 0);
    }
    g_window = g_window_pages = 0;
    /* the random walks exercised sharing and eviction, and windowed truncations both ways */
    printf("%llu copies on write, %llu evictions, windowed truncations: %llu reattaching, %llu refused\n",
           (unsigned long long)total_cow, (unsigned long long)total_evict, (unsigned long long)n_reattached,
           (unsigned long long)n_refused);
    assert_true(total_cow > 80);
    assert_true(total_evict > 80);
    assert_true(n_reattached > 20);
    assert_true(n_refused > 20);
}

static void ten_thousand_operations_allocate_nothing_after_creation(void **st)
{
    (void)st;
    rng_state = 12345;
    g_window = 6; /* with a window group: the sliding, truncating and attaching allocate nothing either */
    lms_kv *kv = make_kv(24, 4, RM_SEQS + 2);
    g_window = 0;
    ref_seq m[RM_SEQS];
    memset(m, 0, sizeof m);
    long before = lms__fault_calls(LMS_FAULT_ALLOC);
#if COUNT_LIBC
    long libc_before = libc_allocs;
#endif
    uint32_t ops = 0;
    for (; ops < 10000; ops++)
        random_op(kv, m, false);
    long after = lms__fault_calls(LMS_FAULT_ALLOC);
#if COUNT_LIBC
    long libc_after = libc_allocs;
    assert_int_equal(libc_after - libc_before, 0);
#endif
    assert_int_equal(after - before, 0);
    /* and the operations did real work */
    lms_kv_stats stats;
    lms_kv_get_stats(kv, &stats);
    assert_true(stats.evictions > 0);
    assert_true(stats.cow_copies > 0);
    check_against_model(kv, m, false);
    for (int i = 0; i < RM_SEQS; i++)
        if (m[i].live)
            lms_kv_seq_free(kv, m[i].s);
    assert_int_equal(lms_kv_destroy(kv), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(create_rejects_bad_layouts),
        cmocka_unit_test(geometry_matches_the_documented_page_major_layout),
        cmocka_unit_test(append_reserves_slots_and_commit_keys_full_pages),
        cmocka_unit_test(fork_shares_full_pages_and_copies_a_shared_partial_page_on_write),
        cmocka_unit_test(truncate_into_a_keyed_page_then_append_copies_it),
        cmocka_unit_test(lookup_reuses_whole_committed_pages_of_the_longest_prefix),
        cmocka_unit_test(eviction_takes_the_least_recently_released_pages_tail_first),
        cmocka_unit_test(exhausted_budget_fails_and_leaves_the_cache_unchanged),
        cmocka_unit_test(create_checks_the_window_layout),
        cmocka_unit_test(window_pages_in_use_stay_at_the_window_while_a_sequence_grows),
        cmocka_unit_test(truncate_past_the_window_reattaches_cached_window_pages_or_refuses),
        cmocka_unit_test(lookup_keeps_only_a_prefix_whose_window_pages_are_cached),
        cmocka_unit_test(fork_shares_window_pages_and_copies_a_shared_partial_one),
        cmocka_unit_test(random_operations_match_the_reference_model),
        cmocka_unit_test(ten_thousand_operations_allocate_nothing_after_creation),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
