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
 *      cached page is useless once its parent is gone. (Window pages slide
 *      out oldest first, and are evicted in that order.)
 *  (4) With a window, each group of pages keeps its own free stack, LRU and
 *      prefix index (kv_group); a sequence operation checks both groups
 *      before it changes either, so design note (2) holds for the pair.
 *      Window pages follow the group-0 pages of the same positions: keyed
 *      together at commit, given back as commit slides the window, attached
 *      again from the window group's index by lookup and truncate.
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

static inline bool has_window(const lms_kv *kv) { return kv->n_groups == 2; }

uint32_t lms__kv_window_first(const lms_kv *kv, uint32_t committed)
{
    uint32_t W = kv->layout.window;
    return committed > W ? (committed - W) / kv->P : 0;
}

lms_hash128 lms__kv_window_key(lms_hash128 key)
{
    uint8_t buf[16 + 8];
    lms__hash128_put(buf, key);
    memcpy(buf + 16, "lmswindo", 8);
    return lms__hash128(buf, sizeof buf);
}

/* ---- creation ---------------------------------------------------------------------- */

static void group_free(kv_group *G)
{
    lms__free(G->refs);
    lms__free(G->flags);
    lms__free(G->keys);
    lms__free(G->free_stack);
    lms__free(G->lru_prev);
    lms__free(G->lru_next);
    lms__free(G->ht);
}

/* The group's tables for n pages (its arena is set by the caller). */
static int group_alloc(kv_group *G, uint32_t n_pages)
{
    G->n_pages = n_pages;
    G->lru_head = G->lru_tail = KV_NONE;
    G->ht_mask = pow2_at_least(2 * (uint64_t)n_pages) - 1;
    if (!(G->refs = lms__calloc(n_pages, sizeof *G->refs)) || !(G->flags = lms__calloc(n_pages, sizeof *G->flags)) ||
        !(G->keys = lms__calloc(n_pages, sizeof *G->keys)) ||
        !(G->free_stack = lms__calloc(n_pages, sizeof *G->free_stack)) ||
        !(G->lru_prev = lms__calloc(n_pages, sizeof *G->lru_prev)) ||
        !(G->lru_next = lms__calloc(n_pages, sizeof *G->lru_next)) ||
        !(G->ht = lms__calloc((size_t)G->ht_mask + 1, sizeof *G->ht)))
        return LMS_ENOMEM;
    /* Free stack: page 0 on top, so pages are handed out in ascending order. */
    for (uint32_t i = 0; i < n_pages; i++)
        G->free_stack[i] = n_pages - 1 - i;
    G->n_free = G->free_low = n_pages;
    return 0;
}

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
    group_free(&kv->g[0]);
    group_free(&kv->g[1]);
    lms__free(kv->sliding);
    lms__free(kv->layer_at);
    lms__free(kv->tokens);
    lms__free(kv->seqs);
    lms__free(kv->seq_free);
    lms__free(kv->table_mem);
    lms__free(kv);
    return 0;
}

/* Bytes of a page holding `layers` layers of L; 0 on overflow. */
static uint64_t page_bytes_of(const lms_kv_layout *L, size_t elem, uint32_t layers)
{
    uint64_t b = 2 * (uint64_t)elem;
    if (lms__mul_overflow(b, layers, &b) || lms__mul_overflow(b, L->n_kv_heads, &b) ||
        lms__mul_overflow(b, L->page_tokens, &b) || lms__mul_overflow(b, L->head_dim, &b) || b > SIZE_MAX / 2)
        return 0;
    return b;
}

/* The window and the sliding layers, hashed into every page key of a cache with a window. */
static lms_hash128 layout_digest(const lms_kv_layout *L)
{
    uint8_t head[8];
    lms__put_u32(head, L->window);
    lms__put_u32(head + 4, L->n_layers);
    lms_hash128 a = lms__hash128(head, sizeof head), b = lms__hash128(L->sliding, L->n_layers);
    uint8_t both[32];
    lms__hash128_put(both, a);
    lms__hash128_put(both + 16, b);
    return lms__hash128(both, sizeof both);
}

int lms_kv_create(lms_device *dev, const lms_kv_layout *layout, const lms_kv_params *params, lms_kv **out)
{
    lms_kv_params defaults = lms_kv_default_params();
    lms_kv *kv = NULL;
    uint64_t pb[2] = {0, 0}, np[2] = {0, 0}, tbl, arena_bytes, bytes1;
    uint32_t n_slide = 0;
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
    if (L.window) {
        if (!L.sliding)
            return lms__err(LMS_EINVAL, "KV cache: a window of %u positions needs the sliding layers", L.window);
        for (uint32_t l = 0; l < L.n_layers; l++)
            n_slide += L.sliding[l] != 0;
        if (n_slide == 0 || n_slide == L.n_layers)
            return lms__err(LMS_EINVAL, "KV cache: a window needs sliding and full-context layers (%u of %u sliding)",
                            n_slide, L.n_layers);
    } else {
        L.sliding = NULL;
    }
    /* page_bytes = 2 * layers * heads * page_tokens * head_dim * elem, per group */
    if (!(pb[0] = page_bytes_of(&L, elem, L.n_layers - n_slide)) || (n_slide && !(pb[1] = page_bytes_of(&L, elem, n_slide))))
        return lms__err(LMS_ERANGE, "KV cache: page size overflows");
    if (params->budget_pages) {
        np[0] = params->budget_pages;
    } else if (n_slide && params->window_pages) {
        if (lms__mul_overflow(params->window_pages, pb[1], &bytes1))
            return lms__err(LMS_ERANGE, "KV cache: window group size overflows");
        np[0] = params->budget_bytes > bytes1 ? (params->budget_bytes - bytes1) / pb[0] : 0;
    } else {
        np[0] = params->budget_bytes / (pb[0] + pb[1]);
    }
    if (n_slide)
        np[1] = params->window_pages ? params->window_pages : np[0];
    if (np[0] == 0 || (n_slide && np[1] == 0))
        return lms__err(LMS_EINVAL, "KV cache: budget (%llu pages, %llu bytes) is under one page of %llu bytes",
                        (unsigned long long)params->budget_pages, (unsigned long long)params->budget_bytes,
                        (unsigned long long)(pb[0] + pb[1]));
    if (np[0] >= (1u << 30) || np[1] >= (1u << 30))
        return lms__err(LMS_ERANGE, "KV cache: %llu pages is too many", (unsigned long long)LMS_MAX(np[0], np[1]));
    if (lms__mul_overflow(np[0], pb[0], &arena_bytes) || lms__mul_overflow(np[1], pb[1], &bytes1) ||
        arena_bytes > SIZE_MAX / 4 || bytes1 > SIZE_MAX / 4)
        return lms__err(LMS_ERANGE, "KV cache: arena size overflows");
    arena_bytes += bytes1;

    kv = lms__calloc(1, sizeof *kv);
    if (!kv)
        return LMS_ENOMEM;
    kv->dev = dev;
    memcpy(kv->model_id, params->model_id, LMS_MODEL_ID_LEN);
    kv->elem = elem;
    kv->token_bytes = (size_t)L.head_dim * elem;
    kv->head_bytes = kv->token_bytes * L.page_tokens;
    kv->v_offset = kv->head_bytes * L.n_kv_heads;
    kv->layer_bytes = 2 * kv->v_offset;
    kv->P = L.page_tokens;
    kv->n_groups = n_slide ? 2 : 1;
    kv->arena_bytes = (size_t)arena_bytes;
    kv->max_seqs = params->max_seqs ? params->max_seqs : 64;
    uint64_t cap_tokens = np[0] * L.page_tokens;
    if (cap_tokens > UINT32_MAX - LMS_KV_PAGE_TOKENS_MAX)
        cap_tokens = UINT32_MAX - LMS_KV_PAGE_TOKENS_MAX;
    kv->max_seq_tokens = params->max_seq_tokens && params->max_seq_tokens < cap_tokens
                             ? params->max_seq_tokens
                             : (uint32_t)cap_tokens;
    kv->max_seq_pages = (kv->max_seq_tokens + kv->P - 1) / kv->P;
    for (uint32_t g = 0; g < 2; g++) {
        kv->g[g].n_layers = g ? n_slide : L.n_layers - n_slide;
        kv->g[g].page_bytes = (size_t)pb[g];
    }

    if (lms__mul_overflow((uint64_t)kv->max_seqs * kv->n_groups, kv->max_seq_pages, &tbl) || tbl > SIZE_MAX / 8) {
        rc = lms__err(LMS_ERANGE, "KV cache: %u sequences x %u pages overflows", kv->max_seqs, kv->max_seq_pages);
        goto out_free;
    }
    rc = LMS_ENOMEM;
    if (group_alloc(&kv->g[0], (uint32_t)np[0]) || (n_slide && group_alloc(&kv->g[1], (uint32_t)np[1])) ||
        !(kv->tokens = lms__calloc(np[0] * L.page_tokens, sizeof *kv->tokens)) ||
        !(kv->layer_at = lms__calloc(L.n_layers, sizeof *kv->layer_at)) ||
        (n_slide && !(kv->sliding = lms__malloc(L.n_layers))) ||
        !(kv->seqs = lms__calloc(kv->max_seqs, sizeof *kv->seqs)) ||
        !(kv->seq_free = lms__calloc(kv->max_seqs, sizeof *kv->seq_free)) ||
        !(kv->table_mem = lms__calloc((size_t)tbl, sizeof *kv->table_mem)))
        goto out_free;
    uint32_t at[2] = {0, 0};
    for (uint32_t l = 0; l < L.n_layers; l++) {
        int g = n_slide && L.sliding[l];
        if (n_slide)
            kv->sliding[l] = (uint8_t)g;
        kv->layer_at[l] = at[g]++;
    }
    L.sliding = kv->sliding;
    kv->layout = L;
    if (n_slide)
        kv->layout_digest = layout_digest(&L);
    rc = dev->ops->alloc(dev, (size_t)arena_bytes, (void **)&kv->arena);
    if (rc) {
        kv->arena = NULL;
        lms__err_prefix(rc, "KV cache arena of %u + %u pages (%llu bytes): ", kv->g[0].n_pages, kv->g[1].n_pages,
                        (unsigned long long)arena_bytes);
        goto out_free;
    }
    kv->g[0].arena = kv->arena;
    kv->g[1].arena = kv->arena + (size_t)np[0] * pb[0];
    /* Zero the arena (attention kernels read whole tiles of a page, masked, so
     * every byte must be finite). A GPU's memory is committed by its allocation;
     * in host memory (the CPU device) the zeroing leaves whole huge pages
     * unpopulated, so they are committed when first written: resident memory
     * grows with the pages in use (lms_kv_stats.touched_pages), up to the
     * budget, and the pages stay committed when given back and reused. */
    rc = dev->ops->memset(dev, kv->arena, 0, (size_t)arena_bytes, NULL);
    /* the default stream only: a resident load's copies on the device's other
     * streams go on (an engine is created while the weights arrive) */
    if (!rc && dev->ops->stream_sync)
        rc = dev->ops->stream_sync(dev, NULL);
    if (rc) {
        lms__err_prefix(rc, "KV cache: clearing the arena: ");
        goto out_free;
    }
    for (uint32_t i = 0; i < kv->max_seqs; i++) {
        kv->seqs[i].index = i;
        kv->seqs[i].table = kv->table_mem + (size_t)i * kv->n_groups * kv->max_seq_pages;
        kv->seqs[i].wtable = n_slide ? kv->seqs[i].table + kv->max_seq_pages : NULL;
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
uint32_t lms_kv_n_pages(const lms_kv *kv) { return kv->g[0].n_pages; }
const uint8_t *lms_kv_model_id(const lms_kv *kv) { return kv->model_id; }
lms_device *lms_kv_device(const lms_kv *kv) { return kv->dev; }

int lms_kv_layer_group(const lms_kv *kv, uint32_t layer, uint32_t *index)
{
    assert(layer < kv->layout.n_layers);
    if (index)
        *index = kv->layer_at[layer];
    return kv->sliding ? kv->sliding[layer] : 0;
}

void lms_kv_get_geometry(const lms_kv *kv, lms_kv_geometry *out)
{
    memset(out, 0, sizeof *out);
    out->base = kv->arena;
    out->n_pages = kv->g[0].n_pages;
    out->page_tokens = kv->P;
    out->elem_size = kv->elem;
    out->token_bytes = kv->token_bytes;
    out->head_bytes = kv->head_bytes;
    out->v_offset = kv->v_offset;
    out->layer_bytes = kv->layer_bytes;
    out->page_bytes = kv->g[0].page_bytes;
    if (has_window(kv)) {
        out->window_base = kv->g[1].arena;
        out->window_n_pages = kv->g[1].n_pages;
        out->window_page_bytes = kv->g[1].page_bytes;
    }
}

void *lms_kv_page_k(const lms_kv *kv, uint32_t layer, uint32_t page)
{
    const kv_group *G = layer < kv->layout.n_layers ? &kv->g[lms_kv_layer_group(kv, layer, NULL)] : NULL;
    if (!G || page >= G->n_pages) {
        lms__err(LMS_EINVAL, "KV cache: layer %u / page %u out of range (%u layers, %u pages)", layer, page,
                 kv->layout.n_layers, G ? G->n_pages : 0);
        return NULL;
    }
    return lms__kv_gpage_ptr(G, page) + (size_t)kv->layer_at[layer] * kv->layer_bytes;
}

void *lms_kv_page_v(const lms_kv *kv, uint32_t layer, uint32_t page)
{
    uint8_t *k = lms_kv_page_k(kv, layer, page);
    return k ? k + kv->v_offset : NULL;
}

void lms_kv_get_stats(const lms_kv *kv, lms_kv_stats *out)
{
    const kv_group *G = &kv->g[0];
    memset(out, 0, sizeof *out);
    out->n_pages = G->n_pages;
    out->free_pages = G->n_free;
    out->cached_pages = G->n_cached;
    out->used_pages = G->n_pages - G->n_free - G->n_cached;
    out->touched_pages = G->n_pages - G->free_low;
    for (uint32_t p = 0; p < G->n_pages; p++) {
        if (G->refs[p] > 1)
            out->shared_pages++;
        if (G->flags[p] & KV_PUBLISHED)
            out->keyed_pages++;
    }
    out->n_seqs = kv->max_seqs - kv->n_seq_free;
    out->evictions = G->evictions;
    out->cow_copies = G->cow_copies;
    if (has_window(kv)) {
        const kv_group *W = &kv->g[1];
        out->window_pages = W->n_pages;
        out->window_free_pages = W->n_free;
        out->window_cached_pages = W->n_cached;
        out->window_used_pages = W->n_pages - W->n_free - W->n_cached;
        out->window_touched_pages = W->n_pages - W->free_low;
    }
}

uint32_t lms_kv_page_refs(const lms_kv *kv, uint32_t page) { return page < kv->g[0].n_pages ? kv->g[0].refs[page] : 0; }

/* ---- keys and the prefix index ---------------------------------------------------- */

lms_hash128 lms__kv_page_key(const lms_kv *kv, lms_hash128 parent, const int32_t *tokens, uint32_t n)
{
    uint8_t buf[16 + LMS_MODEL_ID_LEN + 20 + 16 + 4 + 4 * LMS_KV_PAGE_TOKENS_MAX];
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
    if (has_window(kv)) { /* the window and the sliding layers (one group: the v1 key, unchanged) */
        lms__hash128_put(p, kv->layout_digest);
        p += 16;
    }
    lms__put_u32(p, n);
    p += 4;
    for (uint32_t i = 0; i < n; i++, p += 4)
        lms__put_u32(p, (uint32_t)tokens[i]);
    return lms__hash128(buf, (size_t)(p - buf));
}

static inline uint32_t ht_home(const kv_group *G, lms_hash128 key)
{
    return (uint32_t)(key.lo ^ (key.hi >> 17)) & G->ht_mask;
}

uint32_t lms__kv_ht_find(const kv_group *G, lms_hash128 key)
{
    for (uint32_t i = ht_home(G, key);; i = (i + 1) & G->ht_mask) {
        uint32_t e = G->ht[i];
        if (!e)
            return KV_NONE;
        if (lms__hash128_eq(G->keys[e - 1], key))
            return e - 1;
    }
}

void lms__kv_ht_insert(kv_group *G, uint32_t page)
{
    /* invariant (3): only a keyed page enters, once, under a key not yet there */
    assert((G->flags[page] & KV_KEYED) && !(G->flags[page] & KV_PUBLISHED));
    assert(lms__kv_ht_find(G, G->keys[page]) == KV_NONE);
    uint32_t i = ht_home(G, G->keys[page]);
    while (G->ht[i])
        i = (i + 1) & G->ht_mask;
    G->ht[i] = page + 1;
    G->flags[page] |= KV_PUBLISHED;
    G->n_keyed_published++;
}

/* Backward-shift deletion keeps probe chains intact without tombstones. */
static void ht_remove(kv_group *G, uint32_t page)
{
    uint32_t i = ht_home(G, G->keys[page]);
    while (G->ht[i] != page + 1)
        i = (i + 1) & G->ht_mask;
    uint32_t j = i;
    for (;;) {
        j = (j + 1) & G->ht_mask;
        uint32_t e = G->ht[j];
        if (!e)
            break;
        uint32_t k = ht_home(G, G->keys[e - 1]);
        /* move e into the hole at i unless its home lies cyclically in (i, j] */
        bool stays = (i <= j) ? (i < k && k <= j) : (i < k || k <= j);
        if (!stays) {
            G->ht[i] = e;
            i = j;
        }
    }
    G->ht[i] = 0;
    G->flags[page] &= (uint8_t)~KV_PUBLISHED;
    G->n_keyed_published--;
}

/* Key page p with k and publish it unless the index has k already. */
static void key_page(kv_group *G, uint32_t p, lms_hash128 k)
{
    G->keys[p] = k;
    G->flags[p] |= KV_KEYED;
    if (lms__kv_ht_find(G, k) == KV_NONE)
        lms__kv_ht_insert(G, p);
}

/* ---- LRU and page references ------------------------------------------------------- */

static void lru_push_tail(kv_group *G, uint32_t p)
{
    assert(G->refs[p] == 0 && (G->flags[p] & KV_PUBLISHED)); /* invariant (1): the LRU holds cached pages */
    G->lru_prev[p] = G->lru_tail;
    G->lru_next[p] = KV_NONE;
    if (G->lru_tail != KV_NONE)
        G->lru_next[G->lru_tail] = p;
    else
        G->lru_head = p;
    G->lru_tail = p;
    G->n_cached++;
}

static void lru_unlink(kv_group *G, uint32_t p)
{
    uint32_t a = G->lru_prev[p], b = G->lru_next[p];
    if (a != KV_NONE)
        G->lru_next[a] = b;
    else
        G->lru_head = b;
    if (b != KV_NONE)
        G->lru_prev[b] = a;
    else
        G->lru_tail = a;
    G->lru_prev[p] = G->lru_next[p] = KV_NONE;
    G->n_cached--;
}

uint32_t lms__kv_take_page(kv_group *G)
{
    uint32_t p;
    if (G->n_free) {
        p = G->free_stack[--G->n_free];
        G->free_low = LMS_MIN(G->free_low, G->n_free);
        assert(G->flags[p] == 0); /* a free page is neither keyed nor published */
    } else if (G->lru_head != KV_NONE) {
        p = G->lru_head;
        lru_unlink(G, p);
        ht_remove(G, p);
        G->evictions++;
    } else {
        return KV_NONE;
    }
    assert(G->refs[p] == 0);
    G->flags[p] = 0;
    return p;
}

void lms__kv_evict(kv_group *G, uint32_t page)
{
    assert(G->refs[page] == 0 && (G->flags[page] & KV_PUBLISHED));
    lru_unlink(G, page);
    ht_remove(G, page);
    G->flags[page] = 0;
    G->evictions++;
}

void lms__kv_return_free(kv_group *G, uint32_t page)
{
    assert(G->refs[page] == 0 && !(G->flags[page] & KV_PUBLISHED) && G->n_free < G->n_pages);
    G->flags[page] = 0;
    G->free_stack[G->n_free++] = page;
}

void lms__kv_ref(kv_group *G, uint32_t page)
{
    /* a page with no reference is either cached (published, in the LRU) or
     * free, and a free page is taken, never referenced */
    assert(G->refs[page] > 0 || (G->flags[page] & KV_PUBLISHED));
    assert(G->refs[page] < UINT32_MAX);
    if (G->refs[page] == 0 && (G->flags[page] & KV_PUBLISHED))
        lru_unlink(G, page);
    G->refs[page]++;
}

void lms__kv_unref(kv_group *G, uint32_t page)
{
    assert(G->refs[page] > 0); /* never below zero */
    if (--G->refs[page])
        return;
    if (G->flags[page] & KV_PUBLISHED) {
        lru_push_tail(G, page);
    } else {
        assert(G->n_free < G->n_pages);
        G->flags[page] = 0;
        G->free_stack[G->n_free++] = page;
    }
}

void lms_kv_drop_cached(lms_kv *kv)
{
    for (uint32_t g = 0; g < kv->n_groups; g++) {
        kv_group *G = &kv->g[g];
        while (G->lru_head != KV_NONE) {
            uint32_t p = G->lru_head;
            lru_unlink(G, p);
            ht_remove(G, p);
            lms__kv_return_free(G, p);
        }
    }
}

/* ---- sequences ---------------------------------------------------------------------- */

static inline uint32_t pages_for(const lms_kv *kv, uint32_t tokens) { return (tokens + kv->P - 1) / kv->P; }

/* The window page that page i of seq (group 0, keyed) would have in the window index, or KV_NONE. */
static uint32_t window_cached(const lms_kv *kv, const lms_kv_seq *seq, uint32_t i)
{
    const kv_group *G = &kv->g[0];
    assert(G->flags[seq->table[i]] & KV_KEYED);
    return lms__kv_ht_find(&kv->g[1], lms__kv_window_key(G->keys[seq->table[i]]));
}

lms_kv_seq *lms__kv_seq_take(lms_kv *kv)
{
    if (!kv->n_seq_free) {
        lms__err(LMS_ENOSPACE, "KV cache: all %u sequence slots are in use", kv->max_seqs);
        return NULL;
    }
    lms_kv_seq *s = &kv->seqs[kv->seq_free[--kv->n_seq_free]];
    s->live = true;
    s->len = s->committed = s->wfirst = 0;
    return s;
}

int lms_kv_seq_new(lms_kv *kv, lms_kv_seq **out)
{
    lms_kv_seq *s = lms__kv_seq_take(kv);
    *out = s;
    return s ? 0 : LMS_ENOSPACE;
}

/* Drop the references of pages [from, ceil(len / P)) of both tables, last page first. */
static void release_pages(lms_kv *kv, lms_kv_seq *seq, uint32_t from)
{
    uint32_t np = pages_for(kv, seq->len);
    for (uint32_t i = np; i-- > from;) {
        lms__kv_unref(&kv->g[0], seq->table[i]);
        if (has_window(kv) && i >= seq->wfirst)
            lms__kv_unref(&kv->g[1], seq->wtable[i]);
    }
}

void lms_kv_seq_free(lms_kv *kv, lms_kv_seq *seq)
{
    if (!seq)
        return;
    assert(seq->live && &kv->seqs[seq->index] == seq);
    release_pages(kv, seq, 0);
    seq->live = false;
    seq->len = seq->committed = seq->wfirst = 0;
    kv->seq_free[kv->n_seq_free++] = seq->index;
}

int lms_kv_seq_append(lms_kv *kv, lms_kv_seq *seq, const int32_t *tokens, uint32_t n)
{
    static const char *const gname[2] = {"", " window"};
    if (!n || !tokens)
        return lms__err(LMS_EINVAL, "KV append: no tokens");
    uint32_t len = seq->len;
    if ((uint64_t)len + n > kv->max_seq_tokens)
        return lms__err(LMS_ENOSPACE, "KV append: %u + %u tokens is more than the %u a sequence may hold", len, n,
                        kv->max_seq_tokens);
    uint32_t np = pages_for(kv, len), np_new = pages_for(kv, len + n), last[2] = {KV_NONE, KV_NONE}, q[2];
    bool cow[2] = {false, false};
    for (uint32_t g = 0; g < kv->n_groups; g++) {
        kv_group *G = &kv->g[g];
        const uint32_t *tbl = g ? seq->wtable : seq->table;
        assert(!g || !np || seq->wfirst <= np - 1 || len % kv->P == 0); /* invariant (6): the last page is held */
        if (np && len % kv->P) {
            last[g] = tbl[np - 1];
            cow[g] = G->refs[last[g]] > 1 || (G->flags[last[g]] & KV_KEYED);
        }
        uint64_t need = (uint64_t)(np_new - np) + (cow[g] ? 1 : 0);
        if (need > (uint64_t)G->n_free + G->n_cached)
            return lms__err(LMS_ENOSPACE, "KV append: %llu%s pages needed, %u free and %u cached left (of %u)",
                            (unsigned long long)need, gname[g], G->n_free, G->n_cached, G->n_pages);
    }
    /* copy-on-write of a shared or keyed partial last page, in each group, before
     * anything else changes: a failed copy undoes only these takes */
    for (uint32_t g = 0; g < kv->n_groups; g++) {
        kv_group *G = &kv->g[g];
        if (!cow[g])
            continue;
        q[g] = lms__kv_take_page(G);
        int rc = kv->dev->ops->copy_d2d(kv->dev, lms__kv_gpage_ptr(G, q[g]), lms__kv_gpage_ptr(G, last[g]),
                                        G->page_bytes, NULL);
        if (rc) {
            /* q came from the free stack or was evicted: either way its old
             * contents are gone, so it goes back as free. */
            for (uint32_t k = 0; k <= g; k++)
                if (cow[k])
                    lms__kv_return_free(&kv->g[k], q[k]);
            return lms__err_prefix(rc, "KV append: copy-on-write of%s page %u: ", gname[g], last[g]);
        }
    }
    for (uint32_t g = 0; g < kv->n_groups; g++) {
        kv_group *G = &kv->g[g];
        uint32_t *tbl = g ? seq->wtable : seq->table;
        if (cow[g]) {
            if (g == 0)
                memcpy(kv->tokens + (size_t)q[g] * kv->P, kv->tokens + (size_t)last[g] * kv->P,
                       kv->P * sizeof(int32_t));
            G->refs[q[g]] = 1;
            tbl[np - 1] = q[g];
            lms__kv_unref(G, last[g]);
            G->cow_copies++;
        }
        for (uint32_t i = np; i < np_new; i++) {
            uint32_t p = lms__kv_take_page(G);
            assert(p != KV_NONE);
            G->refs[p] = 1;
            tbl[i] = p;
        }
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

/* Give back the window pages below lms__kv_window_first(committed), oldest first. */
static void slide_window(lms_kv *kv, lms_kv_seq *seq)
{
    uint32_t first = lms__kv_window_first(kv, seq->committed);
    for (; seq->wfirst < first; seq->wfirst++)
        lms__kv_unref(&kv->g[1], seq->wtable[seq->wfirst]);
}

int lms_kv_seq_commit(lms_kv *kv, lms_kv_seq *seq, uint32_t n_written)
{
    kv_group *G = &kv->g[0];
    if (n_written > seq->len || n_written < seq->committed)
        return lms__err(LMS_EINVAL, "KV commit: %u written positions, but the sequence has %u tokens and %u committed",
                        n_written, seq->len, seq->committed);
    uint32_t full = n_written / kv->P;
    for (uint32_t i = seq->committed / kv->P; i < full; i++) {
        uint32_t p = seq->table[i];
        if (G->flags[p] & KV_KEYED)
            continue; /* and its window page too (invariant 7) */
        lms_hash128 parent = {0, 0};
        if (i > 0) {
            assert(G->flags[seq->table[i - 1]] & KV_KEYED);
            parent = G->keys[seq->table[i - 1]];
        }
        key_page(G, p, lms__kv_page_key(kv, parent, kv->tokens + (size_t)p * kv->P, kv->P));
        if (has_window(kv)) {
            assert(i >= seq->wfirst && !(kv->g[1].flags[seq->wtable[i]] & KV_KEYED));
            key_page(&kv->g[1], seq->wtable[i], lms__kv_window_key(G->keys[p]));
        }
    }
    seq->committed = n_written;
    if (has_window(kv))
        slide_window(kv, seq);
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

const uint32_t *lms_kv_seq_window_pages(const lms_kv_seq *seq, uint32_t *first, uint32_t *n_pages)
{
    if (first)
        *first = seq->wtable ? seq->wfirst : 0;
    if (n_pages)
        *n_pages = seq->wtable ? (seq->len + seq->page_tokens - 1) / seq->page_tokens : 0;
    return seq->wtable;
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
        lms__kv_ref(&kv->g[0], src->table[i]);
    }
    if (has_window(kv))
        for (uint32_t i = src->wfirst; i < np; i++) {
            s->wtable[i] = src->wtable[i];
            lms__kv_ref(&kv->g[1], src->wtable[i]);
        }
    s->len = src->len;
    s->committed = src->committed;
    s->wfirst = src->wfirst;
    return 0;
}

uint32_t lms_kv_seq_keepable(const lms_kv *kv, const lms_kv_seq *seq, uint32_t n)
{
    uint32_t m = LMS_MIN(n, seq->len);
    if (!has_window(kv))
        return m;
    for (;;) {
        /* window pages positions [0, m) need that the sequence gave back: [a, b) */
        uint32_t a = lms__kv_window_first(kv, LMS_MIN(seq->committed, m)), b = LMS_MIN(seq->wfirst, pages_for(kv, m));
        uint32_t j = b;
        while (j > a && window_cached(kv, seq, j - 1) != KV_NONE)
            j--;
        if (j == a)
            return m;
        m = (j - 1) * kv->P; /* page j - 1 is gone: keep only positions before it */
    }
}

int lms_kv_seq_truncate(lms_kv *kv, lms_kv_seq *seq, uint32_t n_keep)
{
    if (n_keep > seq->len)
        return lms__err(LMS_EINVAL, "KV truncate: keep %u of %u tokens", n_keep, seq->len);
    if (!has_window(kv)) {
        release_pages(kv, seq, pages_for(kv, n_keep));
        seq->len = n_keep;
        if (seq->committed > n_keep)
            seq->committed = n_keep;
        return 0;
    }
    uint32_t keep = lms_kv_seq_keepable(kv, seq, n_keep);
    if (keep != n_keep)
        return lms__err(LMS_ERANGE,
                        "KV truncate: the sliding-window K/V that %u kept positions need are no longer held "
                        "(at most %u can be kept)",
                        n_keep, keep);
    uint32_t np_keep = pages_for(kv, n_keep), c = LMS_MIN(seq->committed, n_keep);
    uint32_t a = lms__kv_window_first(kv, c), b = LMS_MIN(seq->wfirst, np_keep);
    release_pages(kv, seq, np_keep);
    if (seq->wfirst > np_keep)
        seq->wfirst = np_keep; /* no window page is held past the kept ones now */
    for (uint32_t i = a; i < b; i++) { /* attach what was given back (keepable found each) */
        uint32_t p = window_cached(kv, seq, i);
        assert(p != KV_NONE);
        lms__kv_ref(&kv->g[1], p);
        seq->wtable[i] = p;
    }
    seq->wfirst = LMS_MIN(seq->wfirst, a);
    seq->len = n_keep;
    seq->committed = c;
    return 0;
}

int lms_kv_lookup(lms_kv *kv, const int32_t *tokens, uint32_t n, lms_kv_seq **out, uint32_t *n_reused)
{
    lms_kv_seq *s = lms__kv_seq_take(kv);
    kv_group *G = &kv->g[0];
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
        uint32_t p = lms__kv_ht_find(G, k);
        if (p == KV_NONE)
            break;
        s->table[i] = p;
        parent = k;
    }
    /* with a window, the match needs the window pages of its last positions:
     * shorten it to before the last page that is missing */
    uint32_t a = 0;
    while (has_window(kv) && i > 0) {
        uint32_t j = i;
        a = lms__kv_window_first(kv, i * kv->P);
        while (j > a && window_cached(kv, s, j - 1) != KV_NONE)
            j--;
        if (j == a)
            break;
        i = j - 1;
    }
    for (uint32_t k = 0; k < i; k++)
        lms__kv_ref(G, s->table[k]);
    if (has_window(kv) && i > 0) {
        for (uint32_t k = a; k < i; k++) {
            s->wtable[k] = window_cached(kv, s, k);
            lms__kv_ref(&kv->g[1], s->wtable[k]);
        }
        s->wfirst = a;
    }
    s->len = s->committed = i * kv->P;
    if (n_reused)
        *n_reused = s->len;
    return 0;
}

/* ---- pages for persistence (kvcache/kv_persist.c) ------------------------------------ */

void lms__kv_save_pages(const lms_kv *kv, const lms_kv_seq *seq, uint32_t n_tokens, lms__kv_save_page *out)
{
    const kv_group *G = &kv->g[0];
    assert(n_tokens > 0 && n_tokens <= seq->committed);
    lms_hash128 parent = {0, 0};
    uint32_t np = pages_for(kv, n_tokens);
    for (uint32_t i = 0; i < np; i++) {
        lms__kv_save_page *sp = &out[i];
        sp->page = seq->table[i];
        sp->n_tokens = LMS_MIN(kv->P, n_tokens - i * kv->P);
        if (sp->n_tokens == kv->P) {
            assert(G->flags[sp->page] & KV_KEYED); /* invariant (5): committed full pages are keyed */
            sp->key = G->keys[sp->page];
        } else {
            sp->key = lms__kv_page_key(kv, parent, kv->tokens + (size_t)sp->page * kv->P, sp->n_tokens);
        }
        parent = sp->key;
    }
    if (!has_window(kv))
        return;
    /* then the window pages the sequence holds, [window_first(n_tokens), np) */
    assert(n_tokens == seq->committed);
    for (uint32_t i = seq->wfirst, k = np; i < np; i++, k++) {
        out[k] = out[i];
        out[k].page = seq->wtable[i];
        out[k].key = lms__kv_window_key(out[i].key);
    }
}

int lms__kv_resume_plan(const lms_kv *kv, uint32_t g, const uint32_t *cached, uint32_t n, uint8_t *mark,
                        uint32_t *target, bool *evict, uint32_t *evictable)
{
    const kv_group *G = &kv->g[g];
    uint32_t to_read = 0, reuse_from_lru = 0;
    for (uint32_t i = 0; i < n; i++) {
        if (cached[i] == KV_NONE) {
            to_read++;
            continue;
        }
        uint32_t p = cached[i];
        if (G->refs[p] == 0 && !mark[p])
            reuse_from_lru++;
        mark[p] = 1;
    }
    *evictable = G->n_cached - reuse_from_lru;
    if ((uint64_t)to_read > (uint64_t)G->n_free + *evictable)
        return LMS_ENOSPACE;
    /* free pages from the top of the stack first (lms__kv_seq_attach takes
     * exactly those), then the oldest cached pages this session does not reuse */
    uint32_t n_from_free = LMS_MIN(to_read, G->n_free), fi = 0, lru = G->lru_head;
    for (uint32_t i = 0; i < n; i++) {
        if (cached[i] != KV_NONE)
            continue;
        if (fi < n_from_free) {
            target[i] = G->free_stack[G->n_free - 1 - fi++];
            evict[i] = false;
        } else {
            while (mark[lru])
                lru = G->lru_next[lru];
            assert(lru != KV_NONE && G->refs[lru] == 0 && (G->flags[lru] & KV_PUBLISHED));
            target[i] = lru;
            lru = G->lru_next[lru];
            evict[i] = true;
        }
    }
    return 0;
}

/* One group's part of lms__kv_seq_attach: pages [first, n) of the session into tbl. */
static void attach_group(lms_kv *kv, uint32_t g, const lms__kv_attach *a, uint32_t *tbl, const int32_t *tokens,
                         uint32_t n_tokens)
{
    kv_group *G = &kv->g[g];
    uint32_t m = a->n - a->first, n_from_free = 0;
    /* Pages reused from the prefix cache (leave the LRU if cached). */
    for (uint32_t k = 0; k < m; k++) {
        if (a->cached[k] != KV_NONE) {
            lms__kv_ref(G, a->cached[k]);
            tbl[a->first + k] = a->cached[k];
        } else if (!a->evict[k]) {
            n_from_free++;
        }
    }
    /* Targets leave their lists: free ones are the top n_from_free entries
     * of the free stack (lms__kv_resume_plan chose them so); cached ones are
     * evicted (unlinked, unpublished) before any new key enters the index. */
    assert(n_from_free <= G->n_free);
    for (uint32_t k = 0; k < m; k++) {
        if (a->cached[k] != KV_NONE)
            continue;
        uint32_t p = a->target[k];
        assert(G->refs[p] == 0);
        if (a->evict[k]) {
            lms__kv_evict(G, p);
        } else {
            bool on_top = false;
            for (uint32_t f = G->n_free - n_from_free; f < G->n_free && !on_top; f++)
                on_top = G->free_stack[f] == p;
            assert(on_top && !G->flags[p]);
        }
    }
    G->n_free -= n_from_free;
    G->free_low = LMS_MIN(G->free_low, G->n_free);
    for (uint32_t k = 0; k < m; k++) {
        if (a->cached[k] != KV_NONE)
            continue;
        uint32_t i = a->first + k, p = a->target[k], pt = LMS_MIN(kv->P, n_tokens - i * kv->P);
        tbl[i] = p;
        G->flags[p] = 0;
        G->refs[p] = 1;
        if (g == 0)
            memcpy(kv->tokens + (size_t)p * kv->P, tokens + (size_t)i * kv->P, pt * sizeof(int32_t));
        if (pt == kv->P)
            key_page(G, p, a->keys[k]);
    }
}

lms_kv_seq *lms__kv_seq_attach(lms_kv *kv, const lms__kv_attach *att, const int32_t *tokens, uint32_t n_tokens)
{
    uint32_t n = pages_for(kv, n_tokens);
    assert(att[0].first == 0 && att[0].n == n && n <= kv->max_seq_pages);
    assert(!has_window(kv) || (att[1].first == lms__kv_window_first(kv, n_tokens) && att[1].n == n));
    lms_kv_seq *seq = lms__kv_seq_take(kv);
    assert(seq); /* the caller checked for a free slot before anything else */
    attach_group(kv, 0, &att[0], seq->table, tokens, n_tokens);
    if (has_window(kv)) {
        attach_group(kv, 1, &att[1], seq->wtable, tokens, n_tokens);
        seq->wfirst = att[1].first;
    }
    seq->len = seq->committed = n_tokens;
    return seq;
}

/* ---- self-check for tests ------------------------------------------------------------ */

/* Invariants (1)-(3) of one group; refs[] counted from the sequences' tables. */
static int check_group(const lms_kv *kv, uint32_t g, uint8_t *state, const uint32_t *refs)
{
    const kv_group *G = &kv->g[g];
    uint32_t n = G->n_pages;
    memset(state, 0, n); /* 1 free, 2 lru */
#define BAD(...) return lms__err(LMS_ECORRUPT, "group %u: " __VA_ARGS__)
    for (uint32_t i = 0; i < G->n_free; i++) {
        uint32_t p = G->free_stack[i];
        if (p >= n || state[p])
            BAD("free stack entry %u (page %u) invalid or duplicated", g, i, p);
        state[p] = 1;
    }
    uint32_t cnt = 0, prev = KV_NONE;
    for (uint32_t p = G->lru_head; p != KV_NONE; p = G->lru_next[p]) {
        if (p >= n || state[p] || G->lru_prev[p] != prev)
            BAD("LRU entry page %u invalid, duplicated or mislinked", g, p);
        state[p] = 2;
        prev = p;
        if (++cnt > n)
            BAD("LRU has a cycle", g);
    }
    if (prev != G->lru_tail || cnt != G->n_cached)
        BAD("LRU tail or count wrong (%u vs %u)", g, cnt, G->n_cached);
    uint32_t published = 0;
    for (uint32_t p = 0; p < n; p++) {
        if (refs[p] != G->refs[p])
            BAD("page %u: refs %u but %u sequences hold it", g, p, G->refs[p], refs[p]);
        if ((refs[p] > 0) + (state[p] != 0) != 1)
            BAD("page %u: used %u and listed %u", g, p, refs[p], state[p]);
        if (state[p] == 2 && !(G->flags[p] & KV_PUBLISHED))
            BAD("page %u: cached but not published", g, p);
        if (state[p] == 1 && G->flags[p])
            BAD("page %u: free but flagged %u", g, p, G->flags[p]);
        if ((G->flags[p] & KV_PUBLISHED) && !(G->flags[p] & KV_KEYED))
            BAD("page %u: published but not keyed", g, p);
        if (G->flags[p] & KV_PUBLISHED) {
            published++;
            if (lms__kv_ht_find(G, G->keys[p]) != p)
                BAD("page %u: published but the index finds another page", g, p);
        }
    }
    uint32_t in_ht = 0;
    for (uint32_t i = 0; i <= G->ht_mask; i++)
        if (G->ht[i]) {
            in_ht++;
            if (!(G->flags[G->ht[i] - 1] & KV_PUBLISHED))
                BAD("index slot %u: page %u is not published", g, i, G->ht[i] - 1);
        }
    if (in_ht != published || published != G->n_keyed_published)
        BAD("index holds %u entries, %u pages published (count %u)", g, in_ht, published, G->n_keyed_published);
#undef BAD
    return 0;
}

int lms__kv_check(const lms_kv *kv)
{
    uint32_t n = LMS_MAX(kv->g[0].n_pages, kv->g[1].n_pages);
    uint8_t *state = lms__calloc(n, 1);
    uint32_t *refs[2] = {lms__calloc(n, sizeof(uint32_t)), lms__calloc(n, sizeof(uint32_t))};
    const kv_group *G = &kv->g[0], *W = &kv->g[1];
    int rc = 0;
    if (!state || !refs[0] || !refs[1]) {
        rc = LMS_ENOMEM;
        goto out;
    }
#define BAD(...)                                  \
    do {                                          \
        rc = lms__err(LMS_ECORRUPT, __VA_ARGS__); \
        goto out;                                 \
    } while (0)
    for (uint32_t s = 0; s < kv->max_seqs; s++) {
        const lms_kv_seq *q = &kv->seqs[s];
        if (!q->live)
            continue;
        if (q->committed > q->len)
            BAD("sequence %u: committed %u > len %u", s, q->committed, q->len);
        uint32_t np = pages_for(kv, q->len);
        if (has_window(kv) && q->wfirst != lms__kv_window_first(kv, q->committed))
            BAD("sequence %u: first window page %u, the committed %u positions need %u", s, q->wfirst, q->committed,
                lms__kv_window_first(kv, q->committed));
        for (uint32_t i = 0; i < np; i++) {
            uint32_t p = q->table[i];
            if (p >= G->n_pages)
                BAD("sequence %u: page %u out of range", s, p);
            refs[0][p]++;
            if ((i + 1) * kv->P <= q->committed && !(G->flags[p] & KV_KEYED))
                BAD("sequence %u: committed full page %u (index %u) is not keyed", s, p, i);
            if (!has_window(kv) || i < q->wfirst)
                continue;
            uint32_t w = q->wtable[i];
            if (w >= W->n_pages)
                BAD("sequence %u: window page %u out of range", s, w);
            refs[1][w]++;
            bool k0 = G->flags[p] & KV_KEYED, k1 = W->flags[w] & KV_KEYED;
            if (k0 != k1 || (k0 && !lms__hash128_eq(W->keys[w], lms__kv_window_key(G->keys[p]))))
                BAD("sequence %u: window page %u (index %u) is keyed unlike page %u", s, w, i, p);
        }
    }
#undef BAD
    for (uint32_t g = 0; g < kv->n_groups && !rc; g++)
        rc = check_group(kv, g, state, refs[g]);
out:
    lms__free(state);
    lms__free(refs[0]);
    lms__free(refs[1]);
    return rc;
}
