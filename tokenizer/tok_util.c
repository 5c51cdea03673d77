/*
 * tokenizer/tok_util.c - small pieces the tokenizer is built from:
 * hash maps (string -> id, u64 -> u64), a growable buffer, UTF-8 decoding
 * with Rust's lossy semantics (what HF decode does on invalid bytes), the
 * GPT-2 byte alphabet and Unicode whitespace.
 */
#include <string.h>

#include "tokenizer/tok_internal.h"

/* ---- growable buffer ------------------------------------------------------- */

int lms__tb_reserve(tok_buf *b, size_t extra)
{
    if (b->cap - b->len >= extra)
        return 0;
    size_t need = b->len + extra;
    if (need < b->len)
        return lms__err(LMS_ENOMEM, "tokenizer: buffer size overflow");
    size_t cap = b->cap ? b->cap : 64;
    while (cap < need)
        cap = cap * 2 < cap ? need : cap * 2;
    char *p = lms__realloc(b->p, cap);
    if (!p)
        return LMS_ENOMEM;
    b->p = p;
    b->cap = cap;
    return 0;
}

int lms__tb_add(tok_buf *b, const void *p, size_t n)
{
    int rc = lms__tb_reserve(b, n + 1);
    if (rc)
        return rc;
    if (n)
        memcpy(b->p + b->len, p, n);
    b->len += n;
    b->p[b->len] = '\0';
    return 0;
}

char *lms__tok_memdup0(const char *s, size_t n)
{
    char *d = lms__malloc(n + 1);
    if (d) {
        if (n)
            memcpy(d, s, n);
        d[n] = '\0';
    }
    return d;
}

void lms__tb_free(tok_buf *b)
{
    lms__free(b->p);
    b->p = NULL;
    b->len = b->cap = 0;
}

/* ---- string map ---------------------------------------------------------------- */

static int sm_grow_to(lms__strmap *m, size_t ncap)
{
    struct lms__sm_ent *ne = lms__malloc(ncap * sizeof *ne);
    if (!ne)
        return LMS_ENOMEM;
    for (size_t i = 0; i < ncap; i++)
        ne[i].len = UINT32_MAX;
    for (size_t i = 0; i < m->cap; i++) {
        if (m->ent[i].len == UINT32_MAX)
            continue;
        size_t j = m->ent[i].h & (ncap - 1);
        while (ne[j].len != UINT32_MAX)
            j = (j + 1) & (ncap - 1);
        ne[j] = m->ent[i];
    }
    lms__free(m->ent);
    m->ent = ne;
    m->cap = ncap;
    return 0;
}

static int sm_grow(lms__strmap *m) { return sm_grow_to(m, m->cap ? m->cap * 2 : 1024); }

int lms__sm_reserve(lms__strmap *m, size_t n)
{
    size_t cap = m->cap ? m->cap : 1024;
    while (n * 4 > cap * 3)
        cap *= 2;
    return cap > m->cap ? sm_grow_to(m, cap) : 0;
}

int lms__sm_put(lms__strmap *m, const char *k, size_t n, int32_t val)
{
    if (!k)
        k = "";
    if (n >= UINT32_MAX)
        return lms__err(LMS_ERANGE, "tokenizer: token of %zu bytes is too long", n);
    if ((m->n + 1) * 4 > m->cap * 3) {
        int rc = sm_grow(m);
        if (rc)
            return rc;
    }
    uint32_t h = (uint32_t)lms__hash64(k, n, 0);
    size_t j = h & (m->cap - 1);
    while (m->ent[j].len != UINT32_MAX) {
        if (m->ent[j].h == h && m->ent[j].len == n && !memcmp(m->arena + m->ent[j].off, k, n)) {
            m->ent[j].val = val;
            return 0;
        }
        j = (j + 1) & (m->cap - 1);
    }
    if (m->arena_cap - m->arena_len < n + 1) {
        size_t cap = m->arena_cap ? m->arena_cap : 4096;
        while (cap - m->arena_len < n + 1)
            cap *= 2;
        if (cap > UINT32_MAX)
            return lms__err(LMS_ERANGE, "tokenizer: vocabulary strings exceed 4 GiB");
        char *a = lms__realloc(m->arena, cap);
        if (!a)
            return LMS_ENOMEM;
        m->arena = a;
        m->arena_cap = cap;
    }
    memcpy(m->arena + m->arena_len, k, n);
    m->arena[m->arena_len + n] = '\0';
    m->ent[j].off = (uint32_t)m->arena_len;
    m->ent[j].len = (uint32_t)n;
    m->ent[j].val = val;
    m->ent[j].h = h;
    m->arena_len += n + 1;
    m->n++;
    return 0;
}

int32_t lms__sm_get(const lms__strmap *m, const char *k, size_t n)
{
    if (!k)
        k = "";
    if (!m->cap)
        return -1;
    uint32_t h = (uint32_t)lms__hash64(k, n, 0);
    size_t j = h & (m->cap - 1);
    /* at most cap probes, and only keys inside the arena: the table may come
     * from an untrusted image (tok_internal.h, design note 4) */
    for (size_t probes = 0; probes < m->cap && m->ent[j].len != UINT32_MAX; probes++) {
        const struct lms__sm_ent *e = &m->ent[j];
        if (e->h == h && e->len == n && (uint64_t)e->off + n <= m->arena_len && !memcmp(m->arena + e->off, k, n))
            return m->vlim && (uint32_t)e->val >= m->vlim ? -1 : e->val;
        j = (j + 1) & (m->cap - 1);
    }
    return -1;
}

/* Smallest table (a power of two, at least 16) that holds n keys at the load
 * the map keeps while it grows. */
static size_t sm_min_cap(size_t n)
{
    size_t cap = 16;
    while (n * 4 > cap * 3)
        cap *= 2;
    return cap;
}

int lms__sm_pack(const lms__strmap *m, struct lms__sm_ent **out, size_t *cap, size_t *n)
{
    *out = NULL;
    *cap = *n = 0;
    if (!m->cap)
        return 0;
    size_t used = 0; /* counted, not m->n: an image's count is untrusted */
    for (size_t i = 0; i < m->cap; i++)
        used += m->ent[i].len != UINT32_MAX;
    size_t nc = sm_min_cap(used);
    bool same = nc >= m->cap; /* already as small as it gets: the same slots (so re-packing is stable) */
    if (same)
        nc = m->cap;
    struct lms__sm_ent *ne = lms__malloc(nc * sizeof *ne);
    if (!ne)
        return LMS_ENOMEM;
    for (size_t i = 0; i < nc; i++) /* empty slots written whole: the image's bytes are deterministic */
        ne[i] = (struct lms__sm_ent){0, UINT32_MAX, 0, 0};
    for (size_t i = 0; i < m->cap; i++) {
        if (m->ent[i].len == UINT32_MAX)
            continue;
        size_t j = same ? i : m->ent[i].h & (nc - 1);
        while (!same && ne[j].len != UINT32_MAX)
            j = (j + 1) & (nc - 1);
        ne[j] = m->ent[i];
    }
    *out = ne;
    *cap = nc;
    *n = used;
    return 0;
}

void lms__sm_free(lms__strmap *m)
{
    lms__free(m->ent);
    lms__free(m->arena);
    memset(m, 0, sizeof *m);
}

/* ---- u64 map ----------------------------------------------------------------------- */

static inline size_t um_slot(uint64_t k, size_t cap)
{
    k ^= k >> 33;
    k *= 0xff51afd7ed558ccdULL;
    k ^= k >> 33;
    k *= 0xc4ceb9fe1a85ec53ULL;
    k ^= k >> 33;
    return (size_t)k & (cap - 1);
}

static int um_grow_to(lms__u64map *m, size_t ncap)
{
    struct lms__um_ent *ne = lms__malloc(ncap * sizeof *ne);
    if (!ne)
        return LMS_ENOMEM;
    for (size_t i = 0; i < ncap; i++)
        ne[i].key = UINT64_MAX;
    for (size_t i = 0; i < m->cap; i++) {
        if (m->ent[i].key == UINT64_MAX)
            continue;
        size_t j = um_slot(m->ent[i].key, ncap);
        while (ne[j].key != UINT64_MAX)
            j = (j + 1) & (ncap - 1);
        ne[j] = m->ent[i];
    }
    lms__free(m->ent);
    m->ent = ne;
    m->cap = ncap;
    return 0;
}

static int um_grow(lms__u64map *m) { return um_grow_to(m, m->cap ? m->cap * 2 : 1024); }

int lms__um_reserve(lms__u64map *m, size_t n)
{
    size_t cap = m->cap ? m->cap : 1024;
    while (n * 2 > cap)
        cap *= 2;
    return cap > m->cap ? um_grow_to(m, cap) : 0;
}

int lms__um_put(lms__u64map *m, uint64_t k, uint64_t v)
{
    if (k == UINT64_MAX)
        return lms__err(LMS_EINVAL, "tokenizer: reserved map key");
    if ((m->n + 1) * 2 > m->cap) {
        int rc = um_grow(m);
        if (rc)
            return rc;
    }
    size_t j = um_slot(k, m->cap);
    while (m->ent[j].key != UINT64_MAX) {
        if (m->ent[j].key == k) {
            m->ent[j].val = v;
            return 0;
        }
        j = (j + 1) & (m->cap - 1);
    }
    m->ent[j].key = k;
    m->ent[j].val = v;
    m->n++;
    return 0;
}

bool lms__um_get(const lms__u64map *m, uint64_t k, uint64_t *v)
{
    if (!m->cap)
        return false;
    size_t j = um_slot(k, m->cap);
    for (size_t probes = 0; probes < m->cap && m->ent[j].key != UINT64_MAX; probes++) { /* bounded: see lms__sm_get */
        if (m->ent[j].key == k) {
            *v = m->ent[j].val;
            return true;
        }
        j = (j + 1) & (m->cap - 1);
    }
    return false;
}

int lms__um_pack(const lms__u64map *m, struct lms__um_ent **out, size_t *cap, size_t *n)
{
    *out = NULL;
    *cap = *n = 0;
    if (!m->cap)
        return 0;
    size_t used = 0, nc = 16; /* as in lms__sm_pack */
    for (size_t i = 0; i < m->cap; i++)
        used += m->ent[i].key != UINT64_MAX;
    while (used * 2 > nc)
        nc *= 2;
    bool same = nc >= m->cap;
    if (same)
        nc = m->cap;
    struct lms__um_ent *ne = lms__malloc(nc * sizeof *ne);
    if (!ne)
        return LMS_ENOMEM;
    for (size_t i = 0; i < nc; i++)
        ne[i] = (struct lms__um_ent){UINT64_MAX, 0};
    for (size_t i = 0; i < m->cap; i++) {
        if (m->ent[i].key == UINT64_MAX)
            continue;
        size_t j = same ? i : um_slot(m->ent[i].key, nc);
        while (!same && ne[j].key != UINT64_MAX)
            j = (j + 1) & (nc - 1);
        ne[j] = m->ent[i];
    }
    *out = ne;
    *cap = nc;
    *n = used;
    return 0;
}

void lms__um_free(lms__u64map *m)
{
    lms__free(m->ent);
    memset(m, 0, sizeof *m);
}

/* ---- UTF-8 ------------------------------------------------------------------------------ */

size_t lms__utf8_next(const uint8_t *s, size_t n, uint32_t *cp)
{
    if (!n)
        return 0;
    uint32_t c = s[0];
    if (c < 0x80) {
        *cp = c;
        return 1;
    }
    size_t len;
    uint32_t v, min;
    if ((c & 0xE0) == 0xC0) { len = 2; v = c & 0x1F; min = 0x80; }
    else if ((c & 0xF0) == 0xE0) { len = 3; v = c & 0x0F; min = 0x800; }
    else if ((c & 0xF8) == 0xF0) { len = 4; v = c & 0x07; min = 0x10000; }
    else return 0;
    if (n < len)
        return 0;
    for (size_t k = 1; k < len; k++) {
        if ((s[k] & 0xC0) != 0x80)
            return 0;
        v = (v << 6) | (s[k] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF))
        return 0;
    *cp = v;
    return len;
}

size_t lms__utf8_invalid_at(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t k = (uint8_t)s[i] < 0x80 ? 1 : lms__utf8_next((const uint8_t *)s + i, n - i, &cp);
        if (!k)
            return i;
        i += k;
    }
    return n;
}

/*
 * Length of the longest prefix of s[0..n) that is a valid start of a UTF-8
 * sequence (the "maximal subpart" of Unicode's U+FFFD substitution rules),
 * and the full length the lead byte asks for.
 */
static size_t utf8_valid_prefix(const uint8_t *s, size_t n, size_t *need)
{
    uint8_t c = s[0];
    uint8_t lo = 0x80, hi = 0xBF;
    if (c >= 0xC2 && c <= 0xDF) *need = 2;
    else if (c >= 0xE0 && c <= 0xEF) {
        *need = 3;
        if (c == 0xE0) lo = 0xA0;
        if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
        *need = 4;
        if (c == 0xF0) lo = 0x90;
        if (c == 0xF4) hi = 0x8F;
    } else {
        *need = 1;
        return 0;
    }
    size_t k = 1;
    if (k < n && s[k] >= lo && s[k] <= hi) {
        k++;
        while (k < *need && k < n && (s[k] & 0xC0) == 0x80)
            k++;
    }
    return k;
}

int lms__utf8_lossy(tok_buf *out, const uint8_t *s, size_t n, bool final, size_t *consumed)
{
    static const char repl[] = "\xEF\xBF\xBD";
    size_t i = 0, run = 0; /* run: start of the pending valid ASCII/char run */
    int rc = 0;
    while (i < n) {
        if (s[i] < 0x80) {
            i++;
            continue;
        }
        size_t need, k = utf8_valid_prefix(s + i, n - i, &need);
        if (k == need) {
            i += k;
            continue;
        }
        if (i + k == n && k > 0 && !final)
            break; /* incomplete at the end: wait for more */
        if ((rc = lms__tb_add(out, s + run, i - run)) || (rc = lms__tb_add(out, repl, 3)))
            return rc;
        i += k ? k : 1;
        run = i;
    }
    if ((rc = lms__tb_add(out, s + run, i - run)))
        return rc;
    if (consumed)
        *consumed = i;
    return 0;
}

bool lms__is_unicode_ws(uint32_t c)
{
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
           c == 0x205F || c == 0x3000;
}

/* ---- GPT-2 byte alphabet -------------------------------------------------------------------- */

/* Printable Latin-1 bytes stand for themselves; the others map to U+0100..
 * in byte order (the table GPT-2's bytes_to_unicode builds): 0x00-0x20 ->
 * U+0100-U+0120, 0x7F-0xA0 -> U+0121-U+0142, 0xAD -> U+0143. */
static inline bool bl_printable(uint32_t b)
{
    return (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
}

uint32_t lms__bl_byte_to_cp(uint8_t b)
{
    if (bl_printable(b))
        return b;
    if (b <= 0x20)
        return 0x100 + b;
    if (b >= 0x7F && b <= 0xA0)
        return 0x121 + (b - 0x7F);
    return 0x143; /* 0xAD */
}

int lms__bl_cp_to_byte(uint32_t cp)
{
    if (cp < 0x100)
        return bl_printable(cp) ? (int)cp : -1;
    if (cp <= 0x120)
        return (int)(cp - 0x100);
    if (cp <= 0x142)
        return (int)(cp - 0x121 + 0x7F);
    return cp == 0x143 ? 0xAD : -1;
}
