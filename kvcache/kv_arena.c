/*
 * kvcache/kv_arena.c - the paged KV arena and its sequences: creation (the
 * only place that allocates), page reference counting, the prefix index of
 * keyed pages with its LRU, and the sequence operations append, slot,
 * commit, fork, truncate, free and lookup.
 *
 * Design notes (see include/lmstore/kvcache.h for the memory layout and the
 * page life diagram, kvcache/kv_internal.h for the bookkeeping invariants):
 *  (1) Nothing here allocates after lms_kv_create: pages come from the free
 *      stack or the LRU, sequence slots and block tables from preallocated
 *      pools, hash inputs live on the stack.
 *  (2) Every operation checks that it can complete (pages available, slots
 *      available, bounds) before it changes anything, so a failure leaves the
 *      cache exactly as it was. The one fallible step after that, the device
 *      copy of copy-on-write, is undone if it fails.
 *  (3) A sequence releases its pages last page first, so the tail of a
 *      prefix enters the LRU before its head and is evicted before it: a
 *      cached page is useless once its parent is gone.
 */
#include <assert.h>
#include <string.h>

#include "kvcache/kv_internal.h"

/* ---- layout ---------------------------------------------------------------------- */

size_t lms_kv_elem_size(lms_dtype dtype)
{
    switch (dtype) {
    case LMS_DTYPE_F32: return 4;
    case LMS_DTYPE_F16:
    case LMS_DTYPE_BF16: return 2;
    default: return 0;
    }
}

lms_kv_params lms_kv_default_params(void)
{
    lms_kv_params p;
    memset(&p, 0, sizeof p);
    return p;
}

static uint32_t pow2_at_least(uint64_t x)
{
    uint32_t r = 16;
    while (r < x && r < (1u << 31))
        r <<= 1;
    return r;
}

/* ---- creation ---------------------------------------------------------------------- */

int lms_kv_destroy(lms_kv *kv)
{
    if (!kv)
        return 0;
    if (kv->n_seq_free != kv->max_seqs)
        return lms__err(LMS_EBUSY, "KV cache: %u sequences are still live; free them first",
                        kv->max_seqs - kv->n_seq_free);
    lms__kv_io_free(kv);
    if (kv->arena)
        kv->dev->ops->free(kv->dev, kv->arena);
    lms__free(kv->refs);
    lms__free(kv->flags);
    lms__free(kv->keys);
    lms__free(kv->tokens);
    lms__free(kv->free_stack);
    lms__free(kv->lru_prev);
    lms__free(kv->lru_next);
    lms__free(kv->ht);
    lms__free(kv->seqs);
    lms__free(kv->seq_free);
    lms__free(kv->table_mem);
    lms__free(kv);
    return 0;
}

int lms_kv_create(lms_device *dev, const lms_kv_layout *layout, const lms_kv_params *params, lms_kv **out)
{
    lms_kv_params defaults = lms_kv_default_params();
    lms_kv *kv = NULL;
    uint64_t page_bytes, n_pages, tbl, arena_bytes;
    int rc;

    if (!out)
        return lms__err(LMS_EINVAL, "KV cache: no output pointer");
    *out = NULL;
    if (!dev || !layout)
        return lms__err(LMS_EINVAL, "KV cache: device and layout are required");
    if (!params)
        params = &defaults;
    lms_kv_layout L = *layout;
    if (L.page_tokens == 0)
        L.page_tokens = LMS_KV_PAGE_TOKENS_DEFAULT;
    size_t elem = lms_kv_elem_size(L.dtype);
    if (!elem)
        return lms__err(LMS_EINVAL, "KV cache: dtype %d is not F32, F16 or BF16", (int)L.dtype);
    if (!L.n_layers || !L.n_kv_heads || !L.head_dim)
        return lms__err(LMS_EINVAL, "KV cache: layout has a zero size (layers %u, kv heads %u, head dim %u)",
                        L.n_layers, L.n_kv_heads, L.head_dim);
    if (L.page_tokens > LMS_KV_PAGE_TOKENS_MAX)
        return lms__err(LMS_EINVAL, "KV cache: page_tokens %u is more than %u", L.page_tokens,
                        LMS_KV_PAGE_TOKENS_MAX);
    /* page_bytes = 2 * layers * heads * page_tokens * head_dim * elem */
    page_bytes = 2 * (uint64_t)elem;
    if (lms__mul_overflow(page_bytes, L.n_layers, &page_bytes) ||
        lms__mul_overflow(page_bytes, L.n_kv_heads, &page_bytes) ||
        lms__mul_overflow(page_bytes, L.page_tokens, &page_bytes) ||
        lms__mul_overflow(page_bytes, L.head_dim, &page_bytes) || page_bytes > SIZE_MAX / 2)
        return lms__err(LMS_ERANGE, "KV cache: page size overflows");
    n_pages = params->budget_pages ? params->budget_pages : params->budget_bytes / page_bytes;
    if (n_pages == 0)
        return lms__err(LMS_EINVAL, "KV cache: budget (%llu pages, %llu bytes) is under one page of %llu bytes",
                        (unsigned long long)params->budget_pages, (unsigned long long)params->budget_bytes,
                        (unsigned long long)page_bytes);
    if (n_pages >= (1u << 30))
        return lms__err(LMS_ERANGE, "KV cache: %llu pages is too many", (unsigned long long)n_pages);
    if (lms__mul_overflow(n_pages, page_bytes, &arena_bytes) || arena_bytes > SIZE_MAX / 2)
        return lms__err(LMS_ERANGE, "KV cache: arena size overflows");

    kv = lms__calloc(1, sizeof *kv);
    if (!kv)
        return LMS_ENOMEM;
    kv->dev = dev;
    kv->layout = L;
    memcpy(kv->model_id, params->model_id, LMS_MODEL_ID_LEN);
    kv->elem = elem;
    kv->token_bytes = (size_t)L.head_dim * elem;
    kv->head_bytes = kv->token_bytes * L.page_tokens;
    kv->v_offset = kv->head_bytes * L.n_kv_heads;
    kv->layer_bytes = 2 * kv->v_offset;
    kv->page_bytes = (size_t)page_bytes;
    kv->n_pages = (uint32_t)n_pages;
    kv->P = L.page_tokens;
    kv->lru_head = kv->lru_tail = KV_NONE;
    kv->max_seqs = params->max_seqs ? params->max_seqs : 64;
    uint64_t cap_tokens = n_pages * L.page_tokens;
    if (cap_tokens > UINT32_MAX - LMS_KV_PAGE_TOKENS_MAX)
        cap_tokens = UINT32_MAX - LMS_KV_PAGE_TOKENS_MAX;
    kv->max_seq_tokens = params->max_seq_tokens && params->max_seq_tokens < cap_tokens
                             ? params->max_seq_tokens
                             : (uint32_t)cap_tokens;
    kv->max_seq_pages = (kv->max_seq_tokens + kv->P - 1) / kv->P;
    kv->ht_mask = pow2_at_least(2 * n_pages) - 1;

    if (lms__mul_overflow(kv->max_seqs, kv->max_seq_pages, &tbl) || tbl > SIZE_MAX / 8) {
        rc = lms__err(LMS_ERANGE, "KV cache: %u sequences x %u pages overflows", kv->max_seqs, kv->max_seq_pages);
        goto out_free;
    }
    rc = LMS_ENOMEM;
    if (!(kv->refs = lms__calloc(n_pages, sizeof *kv->refs)) ||
        !(kv->flags = lms__calloc(n_pages, sizeof *kv->flags)) ||
        !(kv->keys = lms__calloc(n_pages, sizeof *kv->keys)) ||
        !(kv->tokens = lms__calloc(n_pages * L.page_tokens, sizeof *kv->tokens)) ||
        !(kv->free_stack = lms__calloc(n_pages, sizeof *kv->free_stack)) ||
        !(kv->lru_prev = lms__calloc(n_pages, sizeof *kv->lru_prev)) ||
        !(kv->lru_next = lms__calloc(n_pages, sizeof *kv->lru_next)) ||
        !(kv->ht = lms__calloc((size_t)kv->ht_mask + 1, sizeof *kv->ht)) ||
        !(kv->seqs = lms__calloc(kv->max_seqs, sizeof *kv->seqs)) ||
        !(kv->seq_free = lms__calloc(kv->max_seqs, sizeof *kv->seq_free)) ||
        !(kv->table_mem = lms__calloc((size_t)tbl, sizeof *kv->table_mem)))
        goto out_free;
    rc = dev->ops->alloc(dev, (size_t)arena_bytes, (void **)&kv->arena);
    if (rc) {
        kv->arena = NULL;
        lms__err_prefix(rc, "KV cache arena of %u pages (%llu bytes): ", kv->n_pages,
                        (unsigned long long)arena_bytes);
        goto out_free;
    }
    /* Touch the whole arena now (device memset): its memory is committed at
     * creation, so resident memory stays flat while tokens flow. */
    rc = dev->ops->memset(dev, kv->arena, 0, (size_t)arena_bytes, NULL);
    if (!rc && dev->ops->sync)
        rc = dev->ops->sync(dev);
    if (rc) {
        lms__err_prefix(rc, "KV cache: clearing the arena: ");
        goto out_free;
    }
    /* Free stack: page 0 on top, so pages are handed out in ascending order. */
    for (uint32_t i = 0; i < kv->n_pages; i++)
        kv->free_stack[i] = kv->n_pages - 1 - i;
    kv->n_free = kv->n_pages;
    for (uint32_t i = 0; i < kv->max_seqs; i++) {
        kv->seqs[i].index = i;
        kv->seqs[i].table = kv->table_mem + (size_t)i * kv->max_seq_pages;
        kv->seqs[i].page_tokens = kv->P;
        kv->seq_free[i] = kv->max_seqs - 1 - i;
    }
    kv->n_seq_free = kv->max_seqs;
    *out = kv;
    return 0;

out_free:
    kv->n_seq_free = kv->max_seqs;
    lms_kv_destroy(kv);
    return rc;
}

/* ---- getters ---------------------------------------------------------------------- */

void lms_kv_get_layout(const lms_kv *kv, lms_kv_layout *out) { *out = kv->layout; }
uint32_t lms_kv_n_pages(const lms_kv *kv) { return kv->n_pages; }
const uint8_t *lms_kv_model_id(const lms_kv *kv) { return kv->model_id; }
lms_device *lms_kv_device(const lms_kv *kv) { return kv->dev; }

void lms_kv_get_geometry(const lms_kv *kv, lms_kv_geometry *out)
{
    out->base = kv->arena;
    out->n_pages = kv->n_pages;
    out->page_tokens = kv->P;
    out->elem_size = kv->elem;
    out->token_bytes = kv->token_bytes;
    out->head_bytes = kv->head_bytes;
    out->v_offset = kv->v_offset;
    out->layer_bytes = kv->layer_bytes;
    out->page_bytes = kv->page_bytes;
}

void *lms_kv_page_k(const lms_kv *kv, uint32_t layer, uint32_t page)
{
    if (layer >= kv->layout.n_layers || page >= kv->n_pages) {
        lms__err(LMS_EINVAL, "KV cache: layer %u / page %u out of range (%u layers, %u pages)", layer, page,
                 kv->layout.n_layers, kv->n_pages);
        return NULL;
    }
    return lms__kv_page_ptr(kv, page) + (size_t)layer * kv->layer_bytes;
}

void *lms_kv_page_v(const lms_kv *kv, uint32_t layer, uint32_t page)
{
    uint8_t *k = lms_kv_page_k(kv, layer, page);
    return k ? k + kv->v_offset : NULL;
}

void lms_kv_get_stats(const lms_kv *kv, lms_kv_stats *out)
{
    memset(out, 0, sizeof *out);
    out->n_pages = kv->n_pages;
    out->free_pages = kv->n_free;
    out->cached_pages = kv->n_cached;
    out->used_pages = kv->n_pages - kv->n_free - kv->n_cached;
    for (uint32_t p = 0; p < kv->n_pages; p++) {
        if (kv->refs[p] > 1)
            out->shared_pages++;
        if (kv->flags[p] & KV_PUBLISHED)
            out->keyed_pages++;
    }
    out->n_seqs = kv->max_seqs - kv->n_seq_free;
    out->evictions = kv->evictions;
    out->cow_copies = kv->cow_copies;
}

uint32_t lms_kv_page_refs(const lms_kv *kv, uint32_t page) { return page < kv->n_pages ? kv->refs[page] : 0; }

/* ---- keys and the prefix index ---------------------------------------------------- */

lms_hash128 lms__kv_page_key(const lms_kv *kv, lms_hash128 parent, const int32_t *tokens, uint32_t n)
{
    uint8_t buf[16 + LMS_MODEL_ID_LEN + 20 + 4 + 4 * LMS_KV_PAGE_TOKENS_MAX];
    uint8_t *p = buf;
    assert(n <= LMS_KV_PAGE_TOKENS_MAX);
    lms__hash128_put(p, parent);
    p += 16;
    memcpy(p, kv->model_id, LMS_MODEL_ID_LEN);
    p += LMS_MODEL_ID_LEN;
    lms__put_u32(p, kv->layout.n_layers);
    lms__put_u32(p + 4, kv->layout.n_kv_heads);
    lms__put_u32(p + 8, kv->layout.head_dim);
    lms__put_u32(p + 12, (uint32_t)kv->layout.dtype);
    lms__put_u32(p + 16, kv->layout.page_tokens);
    p += 20;
    lms__put_u32(p, n);
    p += 4;
    for (uint32_t i = 0; i < n; i++, p += 4)
        lms__put_u32(p, (uint32_t)tokens[i]);
    return lms__hash128(buf, (size_t)(p - buf));
}

static inline uint32_t ht_home(const lms_kv *kv, lms_hash128 key) { return (uint32_t)(key.lo ^ (key.hi >> 17)) & kv->ht_mask; }

uint32_t lms__kv_ht_find(const lms_kv *kv, lms_hash128 key)
{
    for (uint32_t i = ht_home(kv, key);; i = (i + 1) & kv->ht_mask) {
        uint32_t e = kv->ht[i];
        if (!e)
            return KV_NONE;
        if (lms__hash128_eq(kv->keys[e - 1], key))
            return e - 1;
    }
}

void lms__kv_ht_insert(lms_kv *kv, uint32_t page)
{
    /* invariant (3): only a keyed page enters, once, under a key not yet there */
    assert((kv->flags[page] & KV_KEYED) && !(kv->flags[page] & KV_PUBLISHED));
    assert(lms__kv_ht_find(kv, kv->keys[page]) == KV_NONE);
    uint32_t i = ht_home(kv, kv->keys[page]);
    while (kv->ht[i])
        i = (i + 1) & kv->ht_mask;
    kv->ht[i] = page + 1;
    kv->flags[page] |= KV_PUBLISHED;
    kv->n_keyed_published++;
}

/* Backward-shift deletion keeps probe chains intact without tombstones. */
static void ht_remove(lms_kv *kv, uint32_t page)
{
    uint32_t i = ht_home(kv, kv->keys[page]);
    while (kv->ht[i] != page + 1)
        i = (i + 1) & kv->ht_mask;
    uint32_t j = i;
    for (;;) {
        j = (j + 1) & kv->ht_mask;
        uint32_t e = kv->ht[j];
        if (!e)
            break;
        uint32_t k = ht_home(kv, kv->keys[e - 1]);
        /* move e into the hole at i unless its home lies cyclically in (i, j] */
        bool stays = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
        if (!stays) {
            kv->ht[i] = e;
            i = j;
        }
    }
    kv->ht[i] = 0;
    kv->flags[page] &= (uint8_t)~KV_PUBLISHED;
    kv->n_keyed_published--;
}

/* ---- LRU and page references ------------------------------------------------------- */

static void lru_push_tail(lms_kv *kv, uint32_t p)
{
    assert(kv->refs[p] == 0 && (kv->flags[p] & KV_PUBLISHED)); /* invariant (1): the LRU holds cached pages */
    kv->lru_prev[p] = kv->lru_tail;
    kv->lru_next[p] = KV_NONE;
    if (kv->lru_tail != KV_NONE)
        kv->lru_next[kv->lru_tail] = p;
    else
        kv->lru_head = p;
    kv->lru_tail = p;
    kv->n_cached++;
}

static void lru_unlink(lms_kv *kv, uint32_t p)
{
    uint32_t a = kv->lru_prev[p], b = kv->lru_next[p];
    if (a != KV_NONE)
        kv->lru_next[a] = b;
    else
        kv->lru_head = b;
    if (b != KV_NONE)
        kv->lru_prev[b] = a;
    else
        kv->lru_tail = a;
    kv->lru_prev[p] = kv->lru_next[p] = KV_NONE;
    kv->n_cached--;
}

uint32_t lms__kv_take_page(lms_kv *kv)
{
    uint32_t p;
    if (kv->n_free) {
        p = kv->free_stack[--kv->n_free];
        assert(kv->flags[p] == 0); /* a free page is neither keyed nor published */
    } else if (kv->lru_head != KV_NONE) {
        p = kv->lru_head;
        lru_unlink(kv, p);
        ht_remove(kv, p);
        kv->evictions++;
    } else {
        return KV_NONE;
    }
    assert(kv->refs[p] == 0);
    kv->flags[p] = 0;
    return p;
}

void lms__kv_evict(lms_kv *kv, uint32_t page)
{
    assert(kv->refs[page] == 0 && (kv->flags[page] & KV_PUBLISHED));
    lru_unlink(kv, page);
    ht_remove(kv, page);
    kv->flags[page] = 0;
    kv->evictions++;
}

void lms__kv_return_free(lms_kv *kv, uint32_t page)
{
    assert(kv->refs[page] == 0 && !(kv->flags[page] & KV_PUBLISHED) && kv->n_free < kv->n_pages);
    kv->flags[page] = 0;
    kv->free_stack[kv->n_free++] = page;
}

void lms__kv_ref(lms_kv *kv, uint32_t page)
{
    /* a page with no reference is either cached (published, in the LRU) or
     * free, and a free page is taken, never referenced */
    assert(kv->refs[page] > 0 || (kv->flags[page] & KV_PUBLISHED));
    assert(kv->refs[page] < UINT32_MAX);
    if (kv->refs[page] == 0 && (kv->flags[page] & KV_PUBLISHED))
        lru_unlink(kv, page);
    kv->refs[page]++;
}

void lms__kv_unref(lms_kv *kv, uint32_t page)
{
    assert(kv->refs[page] > 0); /* never below zero */
    if (--kv->refs[page])
        return;
    if (kv->flags[page] & KV_PUBLISHED) {
        lru_push_tail(kv, page);
    } else {
        assert(kv->n_free < kv->n_pages);
        kv->flags[page] = 0;
        kv->free_stack[kv->n_free++] = page;
    }
}

void lms_kv_drop_cached(lms_kv *kv)
{
    while (kv->lru_head != KV_NONE) {
        uint32_t p = kv->lru_head;
        lru_unlink(kv, p);
        ht_remove(kv, p);
        lms__kv_return_free(kv, p);
    }
}

/* ---- sequences ---------------------------------------------------------------------- */

static inline uint32_t pages_for(const lms_kv *kv, uint32_t tokens) { return (tokens + kv->P - 1) / kv->P; }

lms_kv_seq *lms__kv_seq_take(lms_kv *kv)
{
    if (!kv->n_seq_free) {
        lms__err(LMS_ENOSPACE, "KV cache: all %u sequence slots are in use", kv->max_seqs);
        return NULL;
    }
    lms_kv_seq *s = &kv->seqs[kv->seq_free[--kv->n_seq_free]];
    s->live = true;
    s->len = s->committed = 0;
    return s;
}

int lms_kv_seq_new(lms_kv *kv, lms_kv_seq **out)
{
    lms_kv_seq *s = lms__kv_seq_take(kv);
    *out = s;
    return s ? 0 : LMS_ENOSPACE;
}

static void release_pages(lms_kv *kv, lms_kv_seq *seq, uint32_t from)
{
    uint32_t np = pages_for(kv, seq->len);
    for (uint32_t i = np; i-- > from;)
        lms__kv_unref(kv, seq->table[i]);
}

void lms_kv_seq_free(lms_kv *kv, lms_kv_seq *seq)
{
    if (!seq)
        return;
    assert(seq->live && &kv->seqs[seq->index] == seq);
    release_pages(kv, seq, 0);
    seq->live = false;
    seq->len = seq->committed = 0;
    kv->seq_free[kv->n_seq_free++] = seq->index;
}

int lms_kv_seq_append(lms_kv *kv, lms_kv_seq *seq, const int32_t *tokens, uint32_t n)
{
    if (!n || !tokens)
        return lms__err(LMS_EINVAL, "KV append: no tokens");
    uint32_t len = seq->len;
    if ((uint64_t)len + n > kv->max_seq_tokens)
        return lms__err(LMS_ENOSPACE, "KV append: %u + %u tokens is more than the %u a sequence may hold", len, n,
                        kv->max_seq_tokens);
    uint32_t np = pages_for(kv, len), np_new = pages_for(kv, len + n);
    uint32_t last = np ? seq->table[np - 1] : KV_NONE;
    bool cow = (len % kv->P) != 0 && (kv->refs[last] > 1 || (kv->flags[last] & KV_KEYED));
    uint64_t need = (uint64_t)(np_new - np) + (cow ? 1 : 0);
    if (need > (uint64_t)kv->n_free + kv->n_cached)
        return lms__err(LMS_ENOSPACE, "KV append: %llu pages needed, %u free and %u cached left (of %u)",
                        (unsigned long long)need, kv->n_free, kv->n_cached, kv->n_pages);
    if (cow) {
        uint32_t q = lms__kv_take_page(kv);
        int rc = kv->dev->ops->copy_d2d(kv->dev, lms__kv_page_ptr(kv, q), lms__kv_page_ptr(kv, last),
                                        kv->page_bytes, NULL);
        if (rc) {
            /* q came from the free stack or was evicted: either way its old
             * contents are gone, so it goes back as free. */
            lms__kv_return_free(kv, q);
            return lms__err_prefix(rc, "KV append: copy-on-write of page %u: ", last);
        }
        memcpy(kv->tokens + (size_t)q * kv->P, kv->tokens + (size_t)last * kv->P, kv->P * sizeof(int32_t));
        kv->refs[q] = 1;
        seq->table[np - 1] = q;
        lms__kv_unref(kv, last);
        kv->cow_copies++;
    }
    for (uint32_t i = np; i < np_new; i++) {
        uint32_t q = lms__kv_take_page(kv);
        assert(q != KV_NONE);
        kv->refs[q] = 1;
        seq->table[i] = q;
    }
    for (uint32_t i = 0; i < n; i++) {
        uint32_t pos = len + i;
        kv->tokens[(size_t)seq->table[pos / kv->P] * kv->P + pos % kv->P] = tokens[i];
    }
    seq->len = len + n;
    return 0;
}

int lms_kv_seq_slot(const lms_kv *kv, const lms_kv_seq *seq, uint32_t pos, uint32_t *page, uint32_t *slot)
{
    if (pos >= seq->len)
        return lms__err(LMS_ERANGE, "KV slot: position %u is past the sequence's %u tokens", pos, seq->len);
    *page = seq->table[pos / kv->P];
    *slot = pos % kv->P;
    return 0;
}

int lms_kv_seq_commit(lms_kv *kv, lms_kv_seq *seq, uint32_t n_written)
{
    if (n_written > seq->len || n_written < seq->committed)
        return lms__err(LMS_EINVAL, "KV commit: %u written positions, but the sequence has %u tokens and %u committed",
                        n_written, seq->len, seq->committed);
    uint32_t full = n_written / kv->P;
    for (uint32_t i = seq->committed / kv->P; i < full; i++) {
        uint32_t p = seq->table[i];
        if (kv->flags[p] & KV_KEYED)
            continue;
        lms_hash128 parent = {0, 0};
        if (i > 0) {
            assert(kv->flags[seq->table[i - 1]] & KV_KEYED);
            parent = kv->keys[seq->table[i - 1]];
        }
        kv->keys[p] = lms__kv_page_key(kv, parent, kv->tokens + (size_t)p * kv->P, kv->P);
        kv->flags[p] |= KV_KEYED;
        if (lms__kv_ht_find(kv, kv->keys[p]) == KV_NONE)
            lms__kv_ht_insert(kv, p);
    }
    seq->committed = n_written;
    return 0;
}

uint32_t lms_kv_seq_len(const lms_kv_seq *seq) { return seq->len; }
uint32_t lms_kv_seq_committed(const lms_kv_seq *seq) { return seq->committed; }

const uint32_t *lms_kv_seq_pages(const lms_kv_seq *seq, uint32_t *n_pages)
{
    if (n_pages)
        *n_pages = (seq->len + seq->page_tokens - 1) / seq->page_tokens;
    return seq->table;
}

int32_t lms_kv_seq_token(const lms_kv *kv, const lms_kv_seq *seq, uint32_t pos)
{
    if (pos >= seq->len)
        return -1;
    return kv->tokens[(size_t)seq->table[pos / kv->P] * kv->P + pos % kv->P];
}

uint32_t lms_kv_seq_tokens(const lms_kv *kv, const lms_kv_seq *seq, int32_t *out, uint32_t n)
{
    uint32_t m = LMS_MIN(n, seq->len);
    for (uint32_t pos = 0; pos < m;) {
        uint32_t take = LMS_MIN(kv->P - pos % kv->P, m - pos);
        memcpy(out + pos, kv->tokens + (size_t)seq->table[pos / kv->P] * kv->P + pos % kv->P, take * sizeof *out);
        pos += take;
    }
    return m;
}

int lms_kv_seq_fork(lms_kv *kv, const lms_kv_seq *src, lms_kv_seq **out)
{
    lms_kv_seq *s = lms__kv_seq_take(kv);
    *out = s;
    if (!s)
        return LMS_ENOSPACE;
    uint32_t np = pages_for(kv, src->len);
    for (uint32_t i = 0; i < np; i++) {
        s->table[i] = src->table[i];
        lms__kv_ref(kv, src->table[i]);
    }
    s->len = src->len;
    s->committed = src->committed;
    return 0;
}

int lms_kv_seq_truncate(lms_kv *kv, lms_kv_seq *seq, uint32_t n_keep)
{
    if (n_keep > seq->len)
        return lms__err(LMS_EINVAL, "KV truncate: keep %u of %u tokens", n_keep, seq->len);
    release_pages(kv, seq, pages_for(kv, n_keep));
    seq->len = n_keep;
    if (seq->committed > n_keep)
        seq->committed = n_keep;
    return 0;
}

int lms_kv_lookup(lms_kv *kv, const int32_t *tokens, uint32_t n, lms_kv_seq **out, uint32_t *n_reused)
{
    lms_kv_seq *s = lms__kv_seq_take(kv);
    *out = s;
    if (n_reused)
        *n_reused = 0;
    if (!s)
        return LMS_ENOSPACE;
    if (!tokens)
        n = 0;
    lms_hash128 parent = {0, 0};
    uint32_t i = 0, limit = LMS_MIN(n, kv->max_seq_tokens) / kv->P;
    for (; i < limit; i++) {
        lms_hash128 k = lms__kv_page_key(kv, parent, tokens + (size_t)i * kv->P, kv->P);
        uint32_t p = lms__kv_ht_find(kv, k);
        if (p == KV_NONE)
            break;
        lms__kv_ref(kv, p);
        s->table[i] = p;
        parent = k;
    }
    s->len = s->committed = i * kv->P;
    if (n_reused)
        *n_reused = s->len;
    return 0;
}

/* ---- pages for persistence (kvcache/kv_persist.c) ------------------------------------ */

void lms__kv_save_pages(const lms_kv *kv, const lms_kv_seq *seq, uint32_t n_tokens, lms__kv_save_page *out)
{
    assert(n_tokens > 0 && n_tokens <= seq->committed);
    lms_hash128 parent = {0, 0};
    for (uint32_t i = 0; i * kv->P < n_tokens; i++) {
        lms__kv_save_page *sp = &out[i];
        sp->page = seq->table[i];
        sp->n_tokens = LMS_MIN(kv->P, n_tokens - i * kv->P);
        if (sp->n_tokens == kv->P) {
            assert(kv->flags[sp->page] & KV_KEYED); /* invariant (5): committed full pages are keyed */
            sp->key = kv->keys[sp->page];
        } else {
            sp->key = lms__kv_page_key(kv, parent, kv->tokens + (size_t)sp->page * kv->P, sp->n_tokens);
        }
        parent = sp->key;
    }
}

int lms__kv_resume_plan(const lms_kv *kv, const uint32_t *cached, uint32_t n, uint8_t *mark, uint32_t *target,
                        bool *evict, uint32_t *evictable)
{
    uint32_t to_read = 0, reuse_from_lru = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (cached[i] == KV_NONE) {
            to_read++;
            continue;
        }
        uint32_t p = cached[i];
        if (kv->refs[p] == 0 && !mark[p])
            reuse_from_lru++;
        mark[p] = 1;
    }
    *evictable = kv->n_cached - reuse_from_lru;
    if ((uint64_t)to_read > (uint64_t)kv->n_free + *evictable)
        return LMS_ENOSPACE;
    /* free pages from the top of the stack first (lms__kv_seq_attach takes
     * exactly those), then the oldest cached pages this session does not reuse */
    uint32_t n_from_free = LMS_MIN(to_read, kv->n_free), fi = 0, lru = kv->lru_head;
    for (uint32_t i = 0; i < n; i++) {
        if (cached[i] != KV_NONE)
            continue;
        if (fi < n_from_free) {
            target[i] = kv->free_stack[kv->n_free - 1 - fi++];
            evict[i] = false;
        } else {
            while (mark[lru])
                lru = kv->lru_next[lru];
            assert(lru != KV_NONE && kv->refs[lru] == 0 && (kv->flags[lru] & KV_PUBLISHED));
            target[i] = lru;
            lru = kv->lru_next[lru];
            evict[i] = true;
        }
    }
    return 0;
}

lms_kv_seq *lms__kv_seq_attach(lms_kv *kv, uint32_t n, const uint32_t *cached, const uint32_t *target,
                               const bool *evict, const lms_hash128 *keys, const int32_t *tokens, uint32_t n_tokens)
{
    assert(n == pages_for(kv, n_tokens) && n <= kv->max_seq_pages);
    lms_kv_seq *seq = lms__kv_seq_take(kv);
    assert(seq); /* the caller checked for a free slot before anything else */
    /* Pages reused from the prefix cache (leave the LRU if cached). */
    uint32_t n_from_free = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (cached[i] != KV_NONE) {
            lms__kv_ref(kv, cached[i]);
            seq->table[i] = cached[i];
        } else if (!evict[i]) {
            n_from_free++;
        }
    }
    /* Targets leave their lists: free ones are the top n_from_free entries
     * of the free stack (lms__kv_resume_plan chose them so); cached ones are
     * evicted (unlinked, unpublished) before any new key enters the index. */
    assert(n_from_free <= kv->n_free);
    for (uint32_t i = 0; i < n; i++) {
        if (cached[i] != KV_NONE)
            continue;
        uint32_t p = target[i];
        assert(kv->refs[p] == 0);
        if (evict[i]) {
            lms__kv_evict(kv, p);
        } else {
            bool on_top = false;
            for (uint32_t k = kv->n_free - n_from_free; k < kv->n_free && !on_top; k++)
                on_top = kv->free_stack[k] == p;
            assert(on_top && !kv->flags[p]);
        }
    }
    kv->n_free -= n_from_free;
    for (uint32_t i = 0; i < n; i++) {
        if (cached[i] != KV_NONE)
            continue;
        uint32_t p = target[i], pt = LMS_MIN(kv->P, n_tokens - i * kv->P);
        seq->table[i] = p;
        kv->flags[p] = 0;
        kv->refs[p] = 1;
        memcpy(kv->tokens + (size_t)p * kv->P, tokens + (size_t)i * kv->P, pt * sizeof(int32_t));
        if (pt == kv->P) {
            kv->keys[p] = keys[i];
            kv->flags[p] = KV_KEYED;
            if (lms__kv_ht_find(kv, keys[i]) == KV_NONE)
                lms__kv_ht_insert(kv, p);
        }
    }
    seq->len = seq->committed = n_tokens;
    return seq;
}

/* ---- self-check for tests ------------------------------------------------------------ */

int lms__kv_check(const lms_kv *kv)
{
    uint32_t n = kv->n_pages;
    uint8_t *state = lms__calloc(n, 1); /* 1 free, 2 lru */
    uint32_t *refs = lms__calloc(n, sizeof *refs);
    int rc = 0;
    if (!state || !refs) {
        rc = LMS_ENOMEM;
        goto out;
    }
#define BAD(...)                                  \
    do {                                          \
        rc = lms__err(LMS_ECORRUPT, __VA_ARGS__); \
        goto out;                                 \
    } while (0)
    for (uint32_t i = 0; i < kv->n_free; i++) {
        uint32_t p = kv->free_stack[i];
        if (p >= n || state[p])
            BAD("free stack entry %u (page %u) invalid or duplicated", i, p);
        state[p] = 1;
    }
    uint32_t cnt = 0, prev = KV_NONE;
    for (uint32_t p = kv->lru_head; p != KV_NONE; p = kv->lru_next[p]) {
        if (p >= n || state[p] || kv->lru_prev[p] != prev)
            BAD("LRU entry page %u invalid, duplicated or mislinked", p);
        state[p] = 2;
        prev = p;
        if (++cnt > n)
            BAD("LRU has a cycle");
    }
    if (prev != kv->lru_tail || cnt != kv->n_cached)
        BAD("LRU tail or count wrong (%u vs %u)", cnt, kv->n_cached);
    for (uint32_t s = 0; s < kv->max_seqs; s++) {
        const lms_kv_seq *q = &kv->seqs[s];
        if (!q->live)
            continue;
        if (q->committed > q->len)
            BAD("sequence %u: committed %u > len %u", s, q->committed, q->len);
        uint32_t np = pages_for(kv, q->len);
        for (uint32_t i = 0; i < np; i++) {
            uint32_t p = q->table[i];
            if (p >= n)
                BAD("sequence %u: page %u out of range", s, p);
            refs[p]++;
            if ((i + 1) * kv->P <= q->committed && !(kv->flags[p] & KV_KEYED))
                BAD("sequence %u: committed full page %u (index %u) is not keyed", s, p, i);
        }
    }
    uint32_t published = 0;
    for (uint32_t p = 0; p < n; p++) {
        if (refs[p] != kv->refs[p])
            BAD("page %u: refs %u but %u sequences hold it", p, kv->refs[p], refs[p]);
        if ((refs[p] > 0) + (state[p] != 0) != 1)
            BAD("page %u: used %u and listed %u", p, refs[p], state[p]);
        if (state[p] == 2 && !(kv->flags[p] & KV_PUBLISHED))
            BAD("page %u: cached but not published", p);
        if (state[p] == 1 && kv->flags[p])
            BAD("page %u: free but flagged %u", p, kv->flags[p]);
        if ((kv->flags[p] & KV_PUBLISHED) && !(kv->flags[p] & KV_KEYED))
            BAD("page %u: published but not keyed", p);
        if (kv->flags[p] & KV_PUBLISHED) {
            published++;
            if (lms__kv_ht_find(kv, kv->keys[p]) != p)
                BAD("page %u: published but the index finds another page", p);
        }
    }
    uint32_t in_ht = 0;
    for (uint32_t i = 0; i <= kv->ht_mask; i++)
        if (kv->ht[i]) {
            in_ht++;
            if (!(kv->flags[kv->ht[i] - 1] & KV_PUBLISHED))
                BAD("index slot %u: page %u is not published", i, kv->ht[i] - 1);
        }
    if (in_ht != published || published != kv->n_keyed_published)
        BAD("index holds %u entries, %u pages published (count %u)", in_ht, published, kv->n_keyed_published);
#undef BAD
out:
    lms__free(state);
    lms__free(refs);
    return rc;
}
