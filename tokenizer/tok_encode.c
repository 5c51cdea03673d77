/*
 * tokenizer/tok_encode.c - text -> ids, step for step as HuggingFace
 * `tokenizers` does it:
 *
 *   1. split the raw text on added tokens that are not normalized
 *      (leftmost-longest; special ones only with LMS_TOK_PARSE_SPECIAL);
 *   2. normalize each remaining piece (NFC, Replace, Prepend, ...);
 *   3. split the normalized pieces on normalized added tokens;
 *   4. pre-tokenize each remaining piece into words (Split regexes run by
 *      PCRE2 as written, ByteLevel, Metaspace, Digits, Punctuation,
 *      WhitespaceSplit);
 *   5. BPE each word: symbols merged lowest rank first (ties: leftmost)
 *      with a binary heap over a linked list, O(n log n) in the word length;
 *   6. add what the post-processor adds (LMS_TOK_ADD_SPECIAL).
 *
 * Pieces are processed in order and their ids appended as they come, so no
 * intermediate list of the whole text is built. All scratch state lives in
 * one per-call context (the tokenizer stays immutable).
 */
#include <string.h>
#include <utf8proc.h>

#include "tokenizer/tok_internal.h"

/* ---- per-call context ------------------------------------------------------ */

typedef struct span {
    size_t s, e;
    bool origin; /* starts at offset 0 of the original text (Metaspace "first") */
} span;

typedef struct spans {
    span *v;
    size_t n, cap;
} spans;

typedef struct bsym {
    int32_t id, prev, next;
} bsym;

typedef struct bmerge {
    uint32_t rank, pos;
    int32_t new_id;
    int32_t left, right; /* the pair when pushed: unchanged pair = valid entry */
} bmerge;

#define CACHE_MAX_WORD 48
#define CACHE_MAX_ENTRIES (1u << 17)

typedef struct enc_ctx {
    const lms_tokenizer *t;
    unsigned flags;
    int32_t *ids;
    size_t n, cap;
    tok_buf norm[2]; /* normalizer ping-pong */
    tok_buf work;    /* pre-tokenizer content; spans index it */
    spans sa, sb, m;
    pcre2_match_data *md;
    pcre2_match_context *mc;
    pcre2_jit_stack *js;
    bsym *sym;
    size_t sym_cap;
    bmerge *heap;
    size_t heap_n, heap_cap;
    /* word cache: word -> run of ids in cache_ids */
    lms__strmap cache;
    uint32_t *cache_off, *cache_cnt;
    size_t cache_n, cache_cap;
    int32_t *cache_ids;
    size_t cache_ids_n, cache_ids_cap;
} enc_ctx;

static int push_id(enc_ctx *c, int32_t id)
{
    if (c->n == c->cap) {
        size_t cap = c->cap ? c->cap * 2 : 256;
        int32_t *a = lms__realloc(c->ids, cap * sizeof *a);
        if (!a)
            return LMS_ENOMEM;
        c->ids = a;
        c->cap = cap;
    }
    c->ids[c->n++] = id;
    return 0;
}

static int spans_add(spans *a, size_t s, size_t e, bool origin)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 64;
        span *v = lms__realloc(a->v, cap * sizeof *v);
        if (!v)
            return LMS_ENOMEM;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = (span){s, e, origin};
    return 0;
}

static size_t utf8_len(uint8_t c)
{
    return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4;
}

/* ---- pattern matching -------------------------------------------------------- */

/* All non-overlapping matches of p in s[0..n) into c->m (e > s only). */
static int find_matches(enc_ctx *c, const tok_pattern *p, const char *s, size_t n)
{
    int rc;
    c->m.n = 0;
    if (p->lit) {
        if (!p->lit_len)
            return 0;
        const char *at = s, *end = s + n;
        while ((size_t)(end - at) >= p->lit_len) {
            const char *f = memmem(at, (size_t)(end - at), p->lit, p->lit_len);
            if (!f)
                break;
            if ((rc = spans_add(&c->m, (size_t)(f - s), (size_t)(f - s) + p->lit_len, false)))
                return rc;
            at = f + p->lit_len;
        }
        return 0;
    }
    if (!c->md) {
        c->md = pcre2_match_data_create(4, NULL);
        c->mc = pcre2_match_context_create(NULL);
        c->js = pcre2_jit_stack_create(32 * 1024, 4 * 1024 * 1024, NULL);
        if (!c->md || !c->mc || !c->js)
            return lms__err(LMS_ENOMEM, "tokenizer: cannot allocate regex match state");
        pcre2_jit_stack_assign(c->mc, NULL, c->js);
    }
    size_t off = 0;
    while (off <= n) {
        int r = pcre2_match(p->re, (PCRE2_SPTR)s, n, off, PCRE2_NO_UTF_CHECK, c->md, c->mc);
        if (r == PCRE2_ERROR_NOMATCH)
            break;
        if (r < 0) {
            PCRE2_UCHAR msg[128];
            pcre2_get_error_message(r, msg, sizeof msg);
            return lms__err(LMS_ERANGE, "tokenizer: pre-tokenizer regex failed on a %zu-byte piece: %s", n,
                            (const char *)msg);
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(c->md);
        size_t ms = ov[0], me = ov[1];
        if (me == ms) { /* empty match: step over one character */
            if (me >= n)
                break;
            off = me + utf8_len((uint8_t)s[me]);
            continue;
        }
        if ((rc = spans_add(&c->m, ms, me, false)))
            return rc;
        off = me;
    }
    return 0;
}

/* ---- normalizers ------------------------------------------------------------------- */

static int norm_unicode(int type, const char *s, size_t n, tok_buf *out)
{
    size_t i;
    for (i = 0; i < n && (uint8_t)s[i] < 0x80; i++)
        ;
    if (i == n)
        return lms__tb_add(out, s, n); /* ASCII is invariant under every form */
    int opts = UTF8PROC_STABLE;
    switch (type) {
    case NORM_NFC: opts |= UTF8PROC_COMPOSE; break;
    case NORM_NFD: opts |= UTF8PROC_DECOMPOSE; break;
    case NORM_NFKC: opts |= UTF8PROC_COMPOSE | UTF8PROC_COMPAT; break;
    default: opts |= UTF8PROC_DECOMPOSE | UTF8PROC_COMPAT; break;
    }
    utf8proc_ssize_t r = utf8proc_decompose((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, NULL, 0,
                                            (utf8proc_option_t)opts);
    if (r < 0)
        return lms__err(LMS_EINVAL, "tokenizer: normalization failed: %s", utf8proc_errmsg(r));
    utf8proc_int32_t *cps = lms__malloc(((size_t)r + 1) * sizeof *cps);
    if (!cps)
        return LMS_ENOMEM;
    r = utf8proc_decompose((const utf8proc_uint8_t *)s, (utf8proc_ssize_t)n, cps, r, (utf8proc_option_t)opts);
    if (r >= 0)
        r = utf8proc_normalize_utf32(cps, r, (utf8proc_option_t)opts);
    int rc = 0;
    if (r < 0)
        rc = lms__err(LMS_EINVAL, "tokenizer: normalization failed: %s", utf8proc_errmsg(r));
    else if (!(rc = lms__tb_reserve(out, (size_t)r * 4 + 1))) {
        for (utf8proc_ssize_t k = 0; k < r; k++)
            out->len += (size_t)utf8proc_encode_char(cps[k], (utf8proc_uint8_t *)out->p + out->len);
        out->p[out->len] = '\0';
    }
    lms__free(cps);
    return rc;
}

/* One normalizer step: s[0..n) -> out (appended). ctx may be NULL at load. */
static int norm_step(enc_ctx *c, const tok_norm *nm, const char *s, size_t n, tok_buf *out)
{
    int rc;
    switch (nm->type) {
    case NORM_PREPEND:
        if (n && (rc = lms__tb_add(out, nm->content, nm->content_len)))
            return rc;
        return lms__tb_add(out, s, n);
    case NORM_LOWERCASE: { /* Rust char::to_lowercase: simple mappings + U+0130 -> "i\u0307" */
        if ((rc = lms__tb_reserve(out, n * 2 + 1)))
            return rc;
        for (size_t i = 0; i < n;) {
            uint32_t cp;
            size_t k = (uint8_t)s[i] < 0x80 ? (cp = (uint8_t)s[i], 1) : lms__utf8_next((const uint8_t *)s + i, n - i, &cp);
            if (!k)
                k = 1, cp = 0xFFFD;
            if (cp == 0x130) {
                if ((rc = lms__tb_add(out, "i\xCC\x87", 3)))
                    return rc;
            } else {
                uint8_t enc[4];
                utf8proc_ssize_t m = utf8proc_encode_char(utf8proc_tolower((utf8proc_int32_t)cp), enc);
                if ((rc = lms__tb_add(out, enc, (size_t)m)))
                    return rc;
            }
            i += k;
        }
        return 0;
    }
    case NORM_STRIP: {
        size_t a = 0, b = n;
        uint32_t cp;
        size_t k;
        while (nm->strip_left && a < b && (k = lms__utf8_next((const uint8_t *)s + a, b - a, &cp)) &&
               lms__is_unicode_ws(cp))
            a += k;
        while (nm->strip_right && b > a) {
            size_t j = b - 1;
            while (j > a && ((uint8_t)s[j] & 0xC0) == 0x80)
                j--;
            if (!lms__utf8_next((const uint8_t *)s + j, b - j, &cp) || !lms__is_unicode_ws(cp))
                break;
            b = j;
        }
        return lms__tb_add(out, s + a, b - a);
    }
    case NORM_REPLACE: {
        if ((rc = find_matches(c, &nm->pat, s, n)))
            return rc;
        size_t prev = 0;
        for (size_t i = 0; i < c->m.n; i++) {
            if ((rc = lms__tb_add(out, s + prev, c->m.v[i].s - prev)) ||
                (rc = lms__tb_add(out, nm->content, nm->content_len)))
                return rc;
            prev = c->m.v[i].e;
        }
        return lms__tb_add(out, s + prev, n - prev);
    }
    default:
        return norm_unicode(nm->type, s, n, out);
    }
}

static void ctx_free(enc_ctx *c);

/* Normalize s[0..n) into c->norm[k]; returns k (0/1) or a negative code. */
static int normalize(enc_ctx *c, const char *s, size_t n)
{
    const lms_tokenizer *t = c->t;
    int cur = -1, rc;
    for (size_t i = 0; i < t->n_norms; i++) {
        int nx = cur == 0 ? 1 : 0;
        c->norm[nx].len = 0;
        const char *src = cur < 0 ? s : c->norm[cur].p;
        size_t sn = cur < 0 ? n : c->norm[cur].len;
        if ((rc = lms__tb_reserve(&c->norm[nx], 1)) || (rc = norm_step(c, &t->norms[i], src ? src : "", sn, &c->norm[nx])))
            return rc;
        cur = nx;
    }
    return cur;
}

int lms__tok_normalize(const lms_tokenizer *t, const char *s, size_t n, tok_buf *out)
{
    enc_ctx c = {.t = t};
    int k = normalize(&c, s, n), rc = 0;
    if (k < 0)
        rc = k;
    else
        rc = lms__tb_add(out, c.norm[k].p, c.norm[k].len);
    ctx_free(&c);
    return rc;
}

/* ---- added tokens ---------------------------------------------------------------------- */

static size_t ws_run_at_start(const char *s, size_t n)
{
    size_t i = 0;
    while (i < n) {
        uint32_t cp;
        size_t k = lms__utf8_next((const uint8_t *)s + i, n - i, &cp);
        if (!k || !lms__is_unicode_ws(cp))
            break;
        i += k;
    }
    return i;
}

/* Start of the whitespace run that ends s[0..n). */
static size_t ws_run_at_end(const char *s, size_t n)
{
    size_t i = n;
    while (i > 0) {
        size_t j = i - 1;
        while (j > 0 && ((uint8_t)s[j] & 0xC0) == 0x80)
            j--;
        uint32_t cp;
        if (!lms__utf8_next((const uint8_t *)s + j, i - j, &cp) || !lms__is_unicode_ws(cp))
            break;
        i = j;
    }
    return i;
}

/* HF checks single_word with the regex crate's Unicode \w: letters, marks,
 * decimal and letter numbers, connector punctuation, ZWNJ/ZWJ. */
static bool is_word_char(uint32_t cp)
{
    if (cp == 0x200C || cp == 0x200D)
        return true;
    utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
    return (cat >= UTF8PROC_CATEGORY_LU && cat <= UTF8PROC_CATEGORY_LO) ||
           (cat >= UTF8PROC_CATEGORY_MN && cat <= UTF8PROC_CATEGORY_ME) || cat == UTF8PROC_CATEGORY_ND ||
           cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_PC;
}

/* Leftmost-longest added token at or after `from`; false when none. Nodes
 * and token indices read from the tables are checked (an image's tables are
 * untrusted, tok_internal.h design note 4). */
static bool trie_find(const tok_trie *tr, size_t n_added, const char *s, size_t n, size_t from, size_t *ms, size_t *me,
                      int32_t *idx)
{
    for (size_t i = from; i < n; i++) {
        if (!tr->first[(uint8_t)s[i]])
            continue;
        uint64_t node = 0, child;
        size_t best = 0;
        int32_t bi = -1;
        for (size_t j = i; j < n; j++) {
            if (!lms__um_get(&tr->edges, node << 8 | (uint8_t)s[j], &child) || child >= tr->n_nodes)
                break;
            node = child;
            if (tr->term[node] >= 0 && (size_t)tr->term[node] < n_added) {
                best = j + 1;
                bi = tr->term[node];
            }
        }
        if (bi >= 0) {
            *ms = i;
            *me = best;
            *idx = bi;
            return true;
        }
    }
    return false;
}

/*
 * Split s[0..n) on the added tokens of tr: pieces (s, e, id) with id -1 for
 * text. Mirrors HF AddedVocabulary::find_matches, including its handling of
 * single_word, lstrip and rstrip and the skipping of special tokens when
 * they are not to be parsed.
 */
typedef struct apiece {
    size_t s, e;
    int32_t id;
} apiece;

typedef struct apieces {
    apiece *v;
    size_t n, cap;
} apieces;

static int ap_add(apieces *a, size_t s, size_t e, int32_t id)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 16;
        apiece *v = lms__realloc(a->v, cap * sizeof *v);
        if (!v)
            return LMS_ENOMEM;
        a->v = v;
        a->cap = cap;
    }
    a->v[a->n++] = (apiece){s, e, id};
    return 0;
}

static int split_added(enc_ctx *c, const tok_trie *tr, const char *s, size_t n, apieces *out)
{
    const lms_tokenizer *t = c->t;
    size_t start_offset = 0, from = 0, ms, me;
    int32_t idx;
    int rc;
    out->n = 0;
    if (!tr->empty) {
        while (from < n && trie_find(tr, t->n_added, s, n, from, &ms, &me, &idx)) {
            const tok_added *a = &t->added[idx];
            size_t start = ms, stop = me;
            from = me;
            if (a->special && !(c->flags & LMS_TOK_PARSE_SPECIAL))
                continue;
            if (a->single_word) {
                uint32_t cp;
                bool start_space = true, stop_space = true;
                if (start > 0) {
                    size_t j = start - 1;
                    while (j > 0 && ((uint8_t)s[j] & 0xC0) == 0x80)
                        j--;
                    start_space = !(lms__utf8_next((const uint8_t *)s + j, start - j, &cp) && is_word_char(cp));
                }
                if (stop < n)
                    stop_space = !(lms__utf8_next((const uint8_t *)s + stop, n - stop, &cp) && is_word_char(cp));
                if (!start_space || !stop_space)
                    continue;
            }
            if (a->lstrip)
                start = LMS_MAX(ws_run_at_end(s, start), start_offset);
            if (a->rstrip)
                stop += ws_run_at_start(s + stop, n - stop);
            if (start_offset < start && (rc = ap_add(out, start_offset, start, -1)))
                return rc;
            if ((rc = ap_add(out, start, stop, a->id)))
                return rc;
            start_offset = stop;
            if (from < stop)
                from = stop;
        }
    }
    if (start_offset < n || !n)
        return ap_add(out, start_offset, n, -1);
    return 0;
}

/* ---- BPE ------------------------------------------------------------------------------------ */

static inline bool merge_less(bmerge a, bmerge b)
{
    return a.rank != b.rank ? a.rank < b.rank : a.pos < b.pos;
}

static int heap_push(enc_ctx *c, bmerge m)
{
    if (c->heap_n == c->heap_cap) {
        size_t cap = c->heap_cap ? c->heap_cap * 2 : 256;
        bmerge *h = lms__realloc(c->heap, cap * sizeof *h);
        if (!h)
            return LMS_ENOMEM;
        c->heap = h;
        c->heap_cap = cap;
    }
    size_t i = c->heap_n++;
    while (i > 0) {
        size_t p = (i - 1) / 2;
        if (!merge_less(m, c->heap[p]))
            break;
        c->heap[i] = c->heap[p];
        i = p;
    }
    c->heap[i] = m;
    return 0;
}

static bmerge heap_pop(enc_ctx *c)
{
    bmerge top = c->heap[0], last = c->heap[--c->heap_n];
    size_t i = 0, n = c->heap_n;
    for (;;) {
        size_t l = 2 * i + 1, r = l + 1, m = i;
        bmerge best = last;
        if (l < n && merge_less(c->heap[l], best)) {
            m = l;
            best = c->heap[l];
        }
        if (r < n && merge_less(c->heap[r], best))
            m = r;
        if (m == i)
            break;
        c->heap[i] = c->heap[m];
        i = m;
    }
    if (n)
        c->heap[i] = last;
    return top;
}

static inline int try_pair(enc_ctx *c, int32_t pos)
{
    uint64_t v;
    const bsym *a = &c->sym[pos], *b = &c->sym[a->next];
    if (!lms__um_get(&c->t->merges, (uint64_t)(uint32_t)a->id << 32 | (uint32_t)b->id, &v) ||
        (uint32_t)v >= c->t->vocab_size) /* a merged id outside the vocabulary: a damaged image */
        return 0;
    return heap_push(c, (bmerge){(uint32_t)(v >> 32), (uint32_t)pos, (int32_t)(uint32_t)v, a->id, b->id});
}

static int sym_add(enc_ctx *c, size_t *ns, int32_t id)
{
    size_t i = (*ns)++;
    c->sym[i].id = id;
    c->sym[i].prev = (int32_t)i - 1;
    c->sym[i].next = -1;
    if (i > 0)
        c->sym[i - 1].next = (int32_t)i;
    return 0;
}

static int cache_put(enc_ctx *c, const char *w, size_t n, const int32_t *ids, size_t cnt)
{
    if (c->cache_n >= CACHE_MAX_ENTRIES)
        return 0;
    if (c->cache_n == c->cache_cap) { /* grows with use: short texts stay cheap */
        size_t cap = c->cache_cap ? c->cache_cap * 2 : 256;
        uint32_t *o = lms__realloc(c->cache_off, cap * sizeof *o);
        if (!o)
            return LMS_ENOMEM;
        c->cache_off = o;
        uint32_t *k = lms__realloc(c->cache_cnt, cap * sizeof *k);
        if (!k)
            return LMS_ENOMEM;
        c->cache_cnt = k;
        c->cache_cap = cap;
    }
    if (c->cache_ids_cap - c->cache_ids_n < cnt) {
        size_t cap = c->cache_ids_cap ? c->cache_ids_cap * 2 : 256;
        while (cap - c->cache_ids_n < cnt)
            cap *= 2;
        int32_t *a = lms__realloc(c->cache_ids, cap * sizeof *a);
        if (!a)
            return LMS_ENOMEM;
        c->cache_ids = a;
        c->cache_ids_cap = cap;
    }
    int rc = lms__sm_put(&c->cache, w, n, (int32_t)c->cache_n);
    if (rc)
        return rc;
    c->cache_off[c->cache_n] = (uint32_t)c->cache_ids_n;
    c->cache_cnt[c->cache_n] = (uint32_t)cnt;
    memcpy(c->cache_ids + c->cache_ids_n, ids, cnt * sizeof *ids);
    c->cache_ids_n += cnt;
    c->cache_n++;
    return 0;
}

static int bpe_word(enc_ctx *c, const char *w, size_t n)
{
    const lms_tokenizer *t = c->t;
    const lms__strmap *enc = t->byte_level ? &t->enc : &t->vocab;
    int rc;
    if (!n)
        return 0;
    if (t->ignore_merges) {
        int32_t id = lms__sm_get(enc, w, n);
        if (id >= 0)
            return push_id(c, id);
    }
    bool cacheable = n <= CACHE_MAX_WORD;
    if (cacheable && c->cache_n) {
        int32_t ci = lms__sm_get(&c->cache, w, n);
        if (ci >= 0) {
            for (uint32_t k = 0; k < c->cache_cnt[ci]; k++)
                if ((rc = push_id(c, c->cache_ids[c->cache_off[ci] + k])))
                    return rc;
            return 0;
        }
    }
    if (c->sym_cap < n) {
        size_t cap = LMS_MAX(n, c->sym_cap * 2);
        bsym *s = lms__realloc(c->sym, cap * sizeof *s);
        if (!s)
            return LMS_ENOMEM;
        c->sym = s;
        c->sym_cap = cap;
    }
    /* initial symbols: bytes (byte-level) or characters, as HF BPE builds them */
    size_t ns = 0;
    int32_t unk = -1; /* pending unknown run (fuse_unk) */
    for (size_t i = 0; i < n;) {
        size_t k = t->byte_level ? 1 : utf8_len((uint8_t)w[i]);
        if (k > n - i)
            k = n - i;
        int32_t id = t->byte_level ? t->byte_id[(uint8_t)w[i]] : lms__sm_get(enc, w + i, k);
        if (id >= 0) {
            if (unk >= 0) {
                sym_add(c, &ns, unk);
                unk = -1;
            }
            sym_add(c, &ns, id);
        } else {
            bool done = false;
            if (t->byte_fallback) {
                size_t b;
                for (b = 0; b < k && t->fallback_id[(uint8_t)w[i + b]] >= 0; b++)
                    ;
                if (b == k) {
                    for (b = 0; b < k; b++)
                        sym_add(c, &ns, t->fallback_id[(uint8_t)w[i + b]]);
                    done = true;
                }
            }
            if (!done && t->unk_id >= 0) {
                if (unk >= 0 && !t->fuse_unk)
                    sym_add(c, &ns, unk);
                unk = t->unk_id;
            }
            /* no unk token: the character is dropped, as HF does */
        }
        i += k;
    }
    if (unk >= 0)
        sym_add(c, &ns, unk);
    if (!ns)
        return 0;

    c->heap_n = 0;
    for (size_t i = 0; i + 1 < ns; i++)
        if ((rc = try_pair(c, (int32_t)i)))
            return rc;
    while (c->heap_n) {
        bmerge top = heap_pop(c);
        bsym *a = &c->sym[top.pos];
        if (a->id < 0 || a->next < 0)
            continue;
        bsym *b = &c->sym[a->next];
        uint64_t v;
        /* HF's test for a stale entry: the pair now at pos must merge into
         * the same id (the pair as pushed trivially does) */
        if ((a->id != top.left || b->id != top.right) &&
            (!lms__um_get(&t->merges, (uint64_t)(uint32_t)a->id << 32 | (uint32_t)b->id, &v) ||
             (int32_t)(uint32_t)v != top.new_id))
            continue;
        a->id = top.new_id;
        int32_t bn = b->next;
        b->id = -1;
        a->next = bn;
        if (bn >= 0)
            c->sym[bn].prev = (int32_t)top.pos;
        if (a->prev >= 0 && (rc = try_pair(c, a->prev)))
            return rc;
        if (a->next >= 0 && (rc = try_pair(c, (int32_t)top.pos)))
            return rc;
    }
    size_t first = c->n;
    for (int32_t i = 0; i >= 0; i = c->sym[i].next)
        if ((rc = push_id(c, c->sym[i].id)))
            return rc;
    if (cacheable && (rc = cache_put(c, w, n, c->ids + first, c->n - first)))
        return rc;
    return 0;
}

/* ---- pre-tokenizers ------------------------------------------------------------------------------ */

/* Split work[in.s, in.e) by matches of pat (relative offsets in c->m), with
 * HF's SplitDelimiterBehavior; pieces appended to out (empty ones dropped). */
/* Every character of class `chars` as a one-character match (HF's split by
 * a char predicate): numeric = Rust char::is_numeric (Nd, Nl, No),
 * punctuation = ASCII punctuation or P*, space = White_Space. */
static int find_char_matches(enc_ctx *c, int chars, const char *s, size_t n)
{
    int rc;
    c->m.n = 0;
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t k = lms__utf8_next((const uint8_t *)s + i, n - i, &cp);
        if (!k)
            k = 1, cp = 0xFFFD;
        bool hit;
        if (chars == CHARS_SPACE)
            hit = lms__is_unicode_ws(cp);
        else {
            utf8proc_category_t cat = utf8proc_category((utf8proc_int32_t)cp);
            if (chars == CHARS_NUMERIC)
                hit = cat == UTF8PROC_CATEGORY_ND || cat == UTF8PROC_CATEGORY_NL || cat == UTF8PROC_CATEGORY_NO;
            else
                hit = (cp < 0x80 && cp > 0x20 && cp != 0x7F && !(cp >= '0' && cp <= '9') &&
                       !((cp | 0x20) >= 'a' && (cp | 0x20) <= 'z')) ||
                      (cat >= UTF8PROC_CATEGORY_PC && cat <= UTF8PROC_CATEGORY_PO);
        }
        if (hit && (rc = spans_add(&c->m, i, i + k, false)))
            return rc;
        i += k;
    }
    return 0;
}

static int split_by(enc_ctx *c, const tok_pattern *pat, int behavior, bool invert, span in, spans *out)
{
    int rc;
    size_t n = in.e - in.s;
    if ((rc = pat ? find_matches(c, pat, c->work.p + in.s, n) : 0))
        return rc;
    /* the whole piece as (s, e, is_match) covering [0, n) */
    typedef struct {
        size_t s, e;
        bool m;
    } seg;
    size_t nseg = 0, cap = c->m.n * 2 + 1;
    seg *v = lms__malloc(cap * sizeof *v);
    if (!v)
        return LMS_ENOMEM;
    size_t prev = 0;
    for (size_t i = 0; i < c->m.n; i++) {
        if (prev != c->m.v[i].s)
            v[nseg++] = (seg){prev, c->m.v[i].s, invert};
        v[nseg++] = (seg){c->m.v[i].s, c->m.v[i].e, !invert};
        prev = c->m.v[i].e;
    }
    if (prev != n || !nseg)
        v[nseg++] = (seg){prev, n, invert};
    /* apply the behavior in place: the result is a list of (s, e) kept */
    size_t k = 0;
    bool prev_m = false;
    switch (behavior) {
    case BEH_REMOVED:
        for (size_t i = 0; i < nseg; i++)
            if (!v[i].m)
                v[k++] = v[i];
        break;
    case BEH_ISOLATED:
        k = nseg;
        break;
    case BEH_MERGED_PREV:
        for (size_t i = 0; i < nseg; i++) {
            if (v[i].m && !prev_m && k > 0)
                v[k - 1].e = v[i].e;
            else
                v[k++] = v[i];
            prev_m = v[i].m;
        }
        break;
    case BEH_MERGED_NEXT: {
        /* walk backwards, merging a delimiter into the piece after it */
        size_t w = nseg;
        for (size_t i = nseg; i-- > 0;) {
            bool m = v[i].m;
            if (m && !prev_m && w < nseg)
                v[w].s = v[i].s;
            else
                v[--w] = v[i];
            prev_m = m;
        }
        memmove(v, v + w, (nseg - w) * sizeof *v);
        k = nseg - w;
        break;
    }
    default: /* BEH_CONTIGUOUS */
        for (size_t i = 0; i < nseg; i++) {
            if (v[i].m == prev_m && k > 0)
                v[k - 1].e = v[i].e;
            else
                v[k++] = v[i];
            prev_m = v[i].m;
        }
        break;
    }
    rc = 0;
    for (size_t i = 0; i < k && !rc; i++)
        if (v[i].e > v[i].s)
            rc = spans_add(out, in.s + v[i].s, in.s + v[i].e, in.origin && v[i].s == 0);
    lms__free(v);
    return rc;
}

/* Copy prefix + work[in] with every `from` replaced by `to` into new work
 * space; returns the new span through *res. */
static int rewrite(enc_ctx *c, span in, const char *prefix, size_t plen, const char *from, size_t flen,
                   const char *to, size_t tlen, span *res)
{
    size_t n = in.e - in.s, cnt = 0;
    for (size_t i = 0; flen && i + flen <= n; i++)
        if (!memcmp(c->work.p + in.s + i, from, flen)) {
            cnt++;
            i += flen - 1;
        }
    int rc = lms__tb_reserve(&c->work, plen + n + cnt * tlen + 1);
    if (rc)
        return rc;
    size_t start = c->work.len;
    char *d = c->work.p + start;
    const char *s = c->work.p + in.s;
    memcpy(d, prefix, plen);
    d += plen;
    for (size_t i = 0; i < n;) {
        if (flen && i + flen <= n && !memcmp(s + i, from, flen)) {
            memcpy(d, to, tlen);
            d += tlen;
            i += flen;
        } else
            *d++ = s[i++];
    }
    c->work.len = (size_t)(d - c->work.p);
    *res = (span){start, c->work.len, in.origin};
    return 0;
}

static int pre_step(enc_ctx *c, const tok_pre *p, span in, spans *out)
{
    int rc;
    switch (p->type) {
    case PRE_SPLIT:
        return split_by(c, &p->pat, p->behavior, p->invert, in, out);
    case PRE_CHARS:
        if ((rc = find_char_matches(c, p->chars, c->work.p + in.s, in.e - in.s)))
            return rc;
        return split_by(c, NULL, p->behavior, false, in, out);
    case PRE_BYTELEVEL: {
        if (p->add_prefix_space && (in.e == in.s || c->work.p[in.s] != ' ')) {
            if ((rc = rewrite(c, in, " ", 1, NULL, 0, NULL, 0, &in)))
                return rc;
        }
        size_t first = out->n;
        if (p->use_regex)
            rc = split_by(c, &p->pat, BEH_ISOLATED, false, in, out);
        else
            rc = in.e > in.s ? spans_add(out, in.s, in.e, in.origin) : 0;
        for (size_t i = first; i < out->n && !rc && p->map_bytes; i++) {
            span sp = out->v[i];
            if ((rc = lms__tb_reserve(&c->work, (sp.e - sp.s) * 2 + 1)))
                break;
            size_t start = c->work.len;
            for (size_t k = sp.s; k < sp.e; k++) {
                uint32_t cp = lms__bl_byte_to_cp((uint8_t)c->work.p[k]);
                c->work.len += (size_t)utf8proc_encode_char((utf8proc_int32_t)cp, (utf8proc_uint8_t *)c->work.p + c->work.len);
            }
            out->v[i].s = start;
            out->v[i].e = c->work.len;
        }
        return rc;
    }
    default: { /* PRE_METASPACE */
        if ((rc = rewrite(c, in, "", 0, " ", 1, p->repl, p->repl_len, &in)))
            return rc;
        size_t n = in.e - in.s;
        bool starts = n >= p->repl_len && !memcmp(c->work.p + in.s, p->repl, p->repl_len);
        if (!starts && (p->prepend_scheme == PREPEND_ALWAYS || (p->prepend_scheme == PREPEND_FIRST && in.origin))) {
            if ((rc = rewrite(c, in, p->repl, p->repl_len, NULL, 0, NULL, 0, &in)))
                return rc;
        }
        if (!p->split)
            return in.e > in.s ? spans_add(out, in.s, in.e, in.origin) : 0;
        tok_pattern lit = {.lit = (char *)p->repl, .lit_len = p->repl_len};
        return split_by(c, &lit, BEH_MERGED_NEXT, false, in, out);
    }
    }
}

static int pretokenize_and_bpe(enc_ctx *c, const char *s, size_t n, bool origin)
{
    const lms_tokenizer *t = c->t;
    int rc;
    if (!n)
        return 0;
    if (!t->n_pres)
        return bpe_word(c, s, n);
    c->work.len = 0;
    if ((rc = lms__tb_add(&c->work, s, n)))
        return rc;
    c->sa.n = 0;
    if ((rc = spans_add(&c->sa, 0, n, origin)))
        return rc;
    for (size_t i = 0; i < t->n_pres; i++) {
        c->sb.n = 0;
        for (size_t j = 0; j < c->sa.n; j++)
            if ((rc = pre_step(c, &t->pres[i], c->sa.v[j], &c->sb)))
                return rc;
        spans tmp = c->sa;
        c->sa = c->sb;
        c->sb = tmp;
    }
    for (size_t j = 0; j < c->sa.n; j++)
        if ((rc = bpe_word(c, c->work.p + c->sa.v[j].s, c->sa.v[j].e - c->sa.v[j].s)))
            return rc;
    return 0;
}

/* ---- the pipeline ---------------------------------------------------------------------------------------- */

static int encode_text_piece(enc_ctx *c, const char *s, size_t n, bool origin, apieces *np)
{
    const lms_tokenizer *t = c->t;
    int rc;
    const char *ns = s;
    size_t nn = n;
    if (t->n_norms) {
        int k = normalize(c, s, n);
        if (k < 0)
            return k;
        ns = c->norm[k].p;
        nn = c->norm[k].len;
        if (k == 1) { /* keep the result out of the way of the next normalize */
            tok_buf tmp = c->norm[0];
            c->norm[0] = c->norm[1];
            c->norm[1] = tmp;
        }
    }
    if (t->trie_norm.empty)
        return pretokenize_and_bpe(c, ns, nn, origin);
    if ((rc = split_added(c, &t->trie_norm, ns, nn, np)))
        return rc;
    for (size_t i = 0; i < np->n; i++) {
        apiece p = np->v[i];
        if (p.id >= 0)
            rc = push_id(c, p.id);
        else
            rc = pretokenize_and_bpe(c, ns + p.s, p.e - p.s, origin && p.s == 0);
        if (rc)
            return rc;
    }
    return 0;
}

static void ctx_free(enc_ctx *c)
{
    lms__free(c->ids);
    lms__tb_free(&c->norm[0]);
    lms__tb_free(&c->norm[1]);
    lms__tb_free(&c->work);
    lms__free(c->sa.v);
    lms__free(c->sb.v);
    lms__free(c->m.v);
    pcre2_match_data_free(c->md);
    pcre2_match_context_free(c->mc);
    pcre2_jit_stack_free(c->js);
    lms__free(c->sym);
    lms__free(c->heap);
    lms__sm_free(&c->cache);
    lms__free(c->cache_off);
    lms__free(c->cache_cnt);
    lms__free(c->cache_ids);
}

int lms_tokenizer_encode(const lms_tokenizer *t, const char *text, size_t len, unsigned flags, int32_t **ids,
                         size_t *n)
{
    enc_ctx c = {.t = t, .flags = flags};
    apieces rp = {0}, np = {0};
    int rc = 0;
    if (!t || !ids || !n || (!text && len))
        return lms__err(LMS_EINVAL, "lms_tokenizer_encode: NULL argument");
    *ids = NULL;
    *n = 0;
    if (!text)
        text = "";
    if (!lms__utf8_valid(text, len))
        return lms__err(LMS_EINVAL, "tokenizer: text is not valid UTF-8 (byte %zu)", lms__utf8_invalid_at(text, len));
    if ((rc = push_id(&c, 0)))
        goto out;
    c.n = 0;
    if (flags & LMS_TOK_ADD_SPECIAL)
        for (size_t i = 0; i < t->n_post_prefix && !rc; i++)
            rc = push_id(&c, t->post_prefix[i]);
    if (!rc)
        rc = split_added(&c, &t->trie_raw, text, len, &rp);
    for (size_t i = 0; i < rp.n && !rc; i++) {
        apiece p = rp.v[i];
        if (p.id >= 0)
            rc = push_id(&c, p.id);
        else
            rc = encode_text_piece(&c, text + p.s, p.e - p.s, p.s == 0, &np);
    }
    if (!rc && (flags & LMS_TOK_ADD_SPECIAL))
        for (size_t i = 0; i < t->n_post_suffix && !rc; i++)
            rc = push_id(&c, t->post_suffix[i]);
    if (!rc) {
        *ids = c.ids;
        *n = c.n;
        c.ids = NULL;
    }
out:
    lms__free(rp.v);
    lms__free(np.v);
    ctx_free(&c);
    return rc;
}
