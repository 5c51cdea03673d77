/*
 * tokenizer/tok_compiled.c - the compiled form of a tokenizer: one
 * little-endian image of the loaded tables (docs/TOKENIZER.md, "Compiled
 * form", is its specification), written by lms_tokenizer_compile and used in
 * place by lms_tokenizer_open_image.
 *
 * Why: parsing a tokenizer.json of 10-30 MB costs 0.1-0.7 s at every start;
 * the image holds the hash tables exactly as the encoder reads them, so
 * opening it reads a header and points the tables into the image (O(1) in
 * the vocabulary size). What is rebuilt at open is small: the added-token
 * list, the normalizer / pre-tokenizer / decoder steps and their regexes
 * (compiled by PCRE2 again: compiled code is not portable).
 *
 * Design notes
 *  (1) The image is untrusted input, like every stored file. Open checks the
 *      header, the section table (every offset and size inside the image,
 *      aligned, of the size its count implies) and every small table it
 *      copies (byte ids, added tokens, post-processor ids, special ids,
 *      the pipeline); the large tables are not read at open, so their
 *      entries are checked where they are used (tok_internal.h, note 4).
 *  (2) The image's string hash is XXH3-64 (seed 0): the header records the
 *      hash of a fixed string, and an image whose value differs from this
 *      build's is refused rather than looked up with another function.
 *  (3) Tables sit at 64-byte aligned offsets; an image must be 8-byte aligned
 *      in memory (a mapping or a heap buffer is), so 64-bit slots are read
 *      aligned.
 */
#include <string.h>

#include "tokenizer/tok_internal.h"
#include "tokenizer/tok_image.h"

#define IMG_MAGIC "\x89LMSTOK\n" /* 8 bytes */
#define IMG_BOM 0x0A0B0C0Du      /* stored little-endian: 0D 0C 0B 0A */
#define IMG_VERSION 1u
#define IMG_HEADER 128u
#define IMG_ALIGN 64u
#define IMG_HASH_PROBE "lmstore-tokenizer"

/* Sections, in table order (the table has one entry per section). */
enum {
    SEC_VOCAB_SLOTS, /* lms__sm_ent[cap]: token string as written -> id */
    SEC_VOCAB_KEYS,  /* its key bytes */
    SEC_ENC_SLOTS,   /* byte-level models: raw bytes -> id */
    SEC_ENC_KEYS,
    SEC_MERGES,      /* lms__um_ent[cap]: (a << 32 | b) -> (rank << 32 | merged id) */
    SEC_TOK_BYTES,   /* id -> string storage, each string NUL-terminated */
    SEC_TOK_OFF,     /* u32[vocab_size] */
    SEC_TOK_LEN,     /* u32[vocab_size], UINT32_MAX = no token */
    SEC_TOK_FLAGS,   /* u8[vocab_size] */
    SEC_BYTE_IDS,    /* i32[256] byte-level ids, i32[256] byte-fallback ids */
    SEC_ADDED,       /* img_added[n_added] */
    SEC_ADDED_BYTES, /* their contents, each NUL-terminated */
    SEC_TRIE_RAW_EDGES, /* lms__um_ent[cap]: (node << 8 | byte) -> child */
    SEC_TRIE_RAW_TERM,  /* i32[nodes]: added-token index or -1 */
    SEC_TRIE_NORM_EDGES,
    SEC_TRIE_NORM_TERM,
    SEC_TRIE_FIRST,  /* u8[256] raw trie, u8[256] normalized trie */
    SEC_POST,        /* i32 prefix ids, then suffix ids */
    SEC_PIPELINE,    /* normalizers, pre-tokenizers, decoders (below) */
    SEC_CHAT,        /* chat template bytes */
    SEC_COUNT
};

static const char *const sec_names[SEC_COUNT] = {
    "vocab slots", "vocab keys", "encode slots", "encode keys", "merges", "token bytes", "token offsets",
    "token lengths", "token flags", "byte ids", "added tokens", "added token bytes", "raw trie edges",
    "raw trie terminals", "normalized trie edges", "normalized trie terminals", "trie first bytes",
    "post-processor ids", "pipeline", "chat template"};

enum {
    HF_BYTE_LEVEL = 1 << 0,
    HF_IGNORE_MERGES = 1 << 1,
    HF_BYTE_FALLBACK = 1 << 2,
    HF_FUSE_UNK = 1 << 3,
    HF_TRIE_RAW_EMPTY = 1 << 4,
    HF_TRIE_NORM_EMPTY = 1 << 5,
};
enum { AF_SPECIAL = 1, AF_LSTRIP = 2, AF_RSTRIP = 4, AF_SINGLE_WORD = 8, AF_NORMALIZED = 16 };

/* Header fields (byte offsets). */
enum {
    H_MAGIC = 0,
    H_BOM = 8,
    H_VERSION = 12,
    H_HEADER_SIZE = 16,
    H_SECTIONS = 20,
    H_TOTAL = 24,
    H_HASH_PROBE = 32,
    H_VOCAB = 36,
    H_FLAGS = 40,
    H_UNK = 44,
    H_BOS = 48,
    H_EOS = 52,
    H_POST_PREFIX = 56,
    H_POST_SUFFIX = 60,
    H_ADDED = 64,
    H_TRIE_RAW_NODES = 68,
    H_TRIE_NORM_NODES = 72,
    H_VOCAB_N = 80,
    H_ENC_N = 88,
    H_MERGES_N = 96,
    H_TRIE_RAW_N = 104,
    H_TRIE_NORM_N = 112,
};
#define TABLE_ENTRY 16u /* u64 offset, u64 size */

_Static_assert(sizeof(struct lms__sm_ent) == 16, "string map slots are 16 bytes in the image");
_Static_assert(sizeof(struct lms__um_ent) == 16, "u64 map slots are 16 bytes in the image");

static bool little_endian(void)
{
    const uint16_t one = 1;
    return *(const uint8_t *)&one == 1;
}

/* ---- little-endian fields (the host is little-endian when these run) ------------- */

static uint32_t rd32(const uint8_t *p)
{
    uint32_t v;
    memcpy(&v, p, 4);
    return v;
}

static uint64_t rd64(const uint8_t *p)
{
    uint64_t v;
    memcpy(&v, p, 8);
    return v;
}

static void wr32(uint8_t *p, uint32_t v) { memcpy(p, &v, 4); }
static void wr64(uint8_t *p, uint64_t v) { memcpy(p, &v, 8); }

/* ---- writing --------------------------------------------------------------------------- */

typedef struct writer {
    tok_buf b;
    uint64_t sec[SEC_COUNT][2]; /* offset, size */
    uint64_t keys[SEC_COUNT];   /* entries of a hash table section */
} writer;

static int put_section(writer *w, int id, const void *p, size_t n)
{
    size_t pad = (IMG_ALIGN - w->b.len % IMG_ALIGN) % IMG_ALIGN;
    static const uint8_t zeros[IMG_ALIGN];
    int rc = lms__tb_add(&w->b, zeros, pad);
    if (rc)
        return rc;
    w->sec[id][0] = w->b.len;
    w->sec[id][1] = n;
    return n ? lms__tb_add(&w->b, p, n) : 0;
}

static int put_u8(tok_buf *b, unsigned v)
{
    uint8_t c = (uint8_t)v;
    return lms__tb_add(b, &c, 1);
}

static int put_u32(tok_buf *b, uint32_t v)
{
    uint8_t c[4];
    wr32(c, v);
    return lms__tb_add(b, c, 4);
}

static int put_bytes(tok_buf *b, const void *p, size_t n)
{
    if (n > UINT32_MAX)
        return lms__err(LMS_ERANGE, "tokenizer: a pipeline string of %zu bytes is too long to compile", n);
    int rc = put_u32(b, (uint32_t)n);
    return rc ? rc : lms__tb_add(b, p, n);
}

enum { PAT_NONE, PAT_LITERAL, PAT_REGEX };

static int put_pattern(tok_buf *b, const tok_pattern *p)
{
    int rc;
    if (p->lit)
        return (rc = put_u8(b, PAT_LITERAL)) ? rc : put_bytes(b, p->lit, p->lit_len);
    if (p->re)
        return (rc = put_u8(b, PAT_REGEX)) ? rc : put_bytes(b, p->src, p->src_len);
    return (rc = put_u8(b, PAT_NONE)) ? rc : put_bytes(b, NULL, 0);
}

/*
 * The pipeline: u32 count, then each normalizer; the same for the
 * pre-tokenizers and the decoders. Strings are u32 length + bytes.
 *   normalizer:    u8 type, u8 strip_left, u8 strip_right, pattern, content
 *   pre-tokenizer: u8 type, pattern, u8 behavior, u8 invert,
 *                  u8 add_prefix_space, u8 use_regex, u8 map_bytes,
 *                  replacement, u8 prepend_scheme, u8 split, u8 chars
 *   decoder:       u8 type, pattern, content, i32 start, i32 stop,
 *                  replacement, u8 prepend_scheme
 *   pattern:       u8 kind (0 none, 1 literal, 2 regex as written), string
 */
static int put_pipeline(const lms_tokenizer *t, tok_buf *b)
{
    int rc = put_u32(b, (uint32_t)t->n_norms);
    for (size_t i = 0; i < t->n_norms && !rc; i++) {
        const tok_norm *n = &t->norms[i];
        if ((rc = put_u8(b, (unsigned)n->type)) || (rc = put_u8(b, n->strip_left)) || (rc = put_u8(b, n->strip_right)) ||
            (rc = put_pattern(b, &n->pat)))
            break;
        rc = put_bytes(b, n->content, n->content_len);
    }
    if (!rc)
        rc = put_u32(b, (uint32_t)t->n_pres);
    for (size_t i = 0; i < t->n_pres && !rc; i++) {
        const tok_pre *p = &t->pres[i];
        if ((rc = put_u8(b, (unsigned)p->type)) || (rc = put_pattern(b, &p->pat)) || (rc = put_u8(b, (unsigned)p->behavior)) ||
            (rc = put_u8(b, p->invert)) || (rc = put_u8(b, p->add_prefix_space)) || (rc = put_u8(b, p->use_regex)) ||
            (rc = put_u8(b, p->map_bytes)) || (rc = put_bytes(b, p->repl, p->repl_len)) ||
            (rc = put_u8(b, (unsigned)p->prepend_scheme)) || (rc = put_u8(b, p->split)))
            break;
        rc = put_u8(b, (unsigned)p->chars);
    }
    if (!rc)
        rc = put_u32(b, (uint32_t)t->n_decs);
    for (size_t i = 0; i < t->n_decs && !rc; i++) {
        const tok_dec *d = &t->decs[i];
        tok_pattern lit = {.lit = d->pat, .lit_len = d->pat_len};
        if ((rc = put_u8(b, (unsigned)d->type)) || (rc = put_pattern(b, &lit)) ||
            (rc = put_bytes(b, d->content, d->content_len)) || (rc = put_u32(b, (uint32_t)d->start)) ||
            (rc = put_u32(b, (uint32_t)d->stop)) || (rc = put_bytes(b, d->repl, d->repl_len)))
            break;
        rc = put_u8(b, (unsigned)d->prepend_scheme);
    }
    return rc;
}

/* A map's slots in the smallest table that holds them (lms__sm_pack). */
static int put_strmap(writer *w, const lms__strmap *m, int slots, int keys)
{
    struct lms__sm_ent *ent;
    size_t cap, n;
    int rc = lms__sm_pack(m, &ent, &cap, &n);
    w->keys[slots] = n;
    if (!rc)
        rc = put_section(w, slots, ent, cap * sizeof *ent);
    if (!rc)
        rc = put_section(w, keys, m->arena, cap ? m->arena_len : 0);
    lms__free(ent);
    return rc;
}

static int put_u64map(writer *w, const lms__u64map *m, int slots)
{
    struct lms__um_ent *ent;
    size_t cap, n;
    int rc = lms__um_pack(m, &ent, &cap, &n);
    w->keys[slots] = n;
    if (!rc)
        rc = put_section(w, slots, ent, cap * sizeof *ent);
    lms__free(ent);
    return rc;
}

static int put_trie(writer *w, const tok_trie *tr, int edges, int term)
{
    int rc = put_u64map(w, &tr->edges, edges);
    return rc ? rc : put_section(w, term, tr->term, tr->n_nodes * sizeof *tr->term);
}

int lms_tokenizer_compile(const lms_tokenizer *t, void **out, size_t *len)
{
    writer w = {0};
    tok_buf aux = {0};
    int rc;
    if (!t || !out || !len)
        return lms__err(LMS_EINVAL, "lms_tokenizer_compile: NULL argument");
    *out = NULL;
    *len = 0;
    if (!little_endian())
        return lms__err(LMS_EUNSUPPORTED, "tokenizer: the compiled form is little-endian; this host is not");
    uint8_t head[IMG_HEADER + SEC_COUNT * TABLE_ENTRY] = {0};
    if ((rc = lms__tb_add(&w.b, head, sizeof head)))
        goto out;
    /* the large tables, as they are in memory (design note 4 of tok_internal.h) */
    if ((rc = put_strmap(&w, &t->vocab, SEC_VOCAB_SLOTS, SEC_VOCAB_KEYS)) ||
        (rc = put_strmap(&w, &t->enc, SEC_ENC_SLOTS, SEC_ENC_KEYS)) || (rc = put_u64map(&w, &t->merges, SEC_MERGES)) ||
        (rc = put_section(&w, SEC_TOK_BYTES, t->tok_arena, t->tok_arena_len)) ||
        (rc = put_section(&w, SEC_TOK_OFF, t->tok_off, t->vocab_size * sizeof *t->tok_off)) ||
        (rc = put_section(&w, SEC_TOK_LEN, t->tok_len, t->vocab_size * sizeof *t->tok_len)) ||
        (rc = put_section(&w, SEC_TOK_FLAGS, t->tok_flags, t->vocab_size)))
        goto out;
    int32_t ids[512];
    memcpy(ids, t->byte_id, sizeof t->byte_id);
    memcpy(ids + 256, t->fallback_id, sizeof t->fallback_id);
    if ((rc = put_section(&w, SEC_BYTE_IDS, ids, sizeof ids)))
        goto out;
    /* added tokens: records, then their bytes */
    size_t off = 0;
    for (size_t i = 0; i < t->n_added && !rc; off += t->added[i].len + 1, i++) {
        const tok_added *a = &t->added[i];
        uint8_t r[16];
        wr32(r, (uint32_t)off);
        wr32(r + 4, (uint32_t)a->len);
        wr32(r + 8, (uint32_t)a->id);
        wr32(r + 12, (a->special ? AF_SPECIAL : 0) | (a->lstrip ? AF_LSTRIP : 0) | (a->rstrip ? AF_RSTRIP : 0) |
                         (a->single_word ? AF_SINGLE_WORD : 0) | (a->normalized ? AF_NORMALIZED : 0));
        rc = lms__tb_add(&aux, r, sizeof r);
    }
    if (rc || (rc = put_section(&w, SEC_ADDED, aux.p, aux.len)))
        goto out;
    aux.len = 0;
    for (size_t i = 0; i < t->n_added && !rc; i++)
        if (!(rc = lms__tb_add(&aux, t->added[i].content, t->added[i].len)))
            aux.len++; /* keep the NUL lms__tb_add wrote */
    if (rc || (rc = put_section(&w, SEC_ADDED_BYTES, aux.p, aux.len)))
        goto out;
    if (aux.len > UINT32_MAX) {
        rc = lms__err(LMS_ERANGE, "tokenizer: added tokens of %zu bytes are too large to compile", aux.len);
        goto out;
    }
    uint8_t first[512];
    memcpy(first, t->trie_raw.first, 256);
    memcpy(first + 256, t->trie_norm.first, 256);
    if ((rc = put_trie(&w, &t->trie_raw, SEC_TRIE_RAW_EDGES, SEC_TRIE_RAW_TERM)) ||
        (rc = put_trie(&w, &t->trie_norm, SEC_TRIE_NORM_EDGES, SEC_TRIE_NORM_TERM)) ||
        (rc = put_section(&w, SEC_TRIE_FIRST, first, sizeof first)))
        goto out;
    aux.len = 0;
    if ((t->n_post_prefix && (rc = lms__tb_add(&aux, t->post_prefix, t->n_post_prefix * sizeof(int32_t)))) ||
        (t->n_post_suffix && (rc = lms__tb_add(&aux, t->post_suffix, t->n_post_suffix * sizeof(int32_t)))) ||
        (rc = put_section(&w, SEC_POST, aux.p, aux.len)))
        goto out;
    aux.len = 0;
    if ((rc = put_pipeline(t, &aux)) || (rc = put_section(&w, SEC_PIPELINE, aux.p, aux.len)))
        goto out;
    if ((rc = put_section(&w, SEC_CHAT, t->chat_template, t->chat_template ? strlen(t->chat_template) : 0)))
        goto out;

    /* header and section table */
    uint8_t *h = (uint8_t *)w.b.p;
    memcpy(h + H_MAGIC, IMG_MAGIC, 8);
    wr32(h + H_BOM, IMG_BOM);
    wr32(h + H_VERSION, IMG_VERSION);
    wr32(h + H_HEADER_SIZE, IMG_HEADER);
    wr32(h + H_SECTIONS, SEC_COUNT);
    wr64(h + H_TOTAL, w.b.len);
    wr32(h + H_HASH_PROBE, (uint32_t)lms__hash64(IMG_HASH_PROBE, strlen(IMG_HASH_PROBE), 0));
    wr32(h + H_VOCAB, (uint32_t)t->vocab_size);
    wr32(h + H_FLAGS, (t->byte_level ? HF_BYTE_LEVEL : 0) | (t->ignore_merges ? HF_IGNORE_MERGES : 0) |
                          (t->byte_fallback ? HF_BYTE_FALLBACK : 0) | (t->fuse_unk ? HF_FUSE_UNK : 0) |
                          (t->trie_raw.empty ? HF_TRIE_RAW_EMPTY : 0) | (t->trie_norm.empty ? HF_TRIE_NORM_EMPTY : 0));
    wr32(h + H_UNK, (uint32_t)t->unk_id);
    wr32(h + H_BOS, (uint32_t)t->bos_id);
    wr32(h + H_EOS, (uint32_t)t->eos_id);
    wr32(h + H_POST_PREFIX, (uint32_t)t->n_post_prefix);
    wr32(h + H_POST_SUFFIX, (uint32_t)t->n_post_suffix);
    wr32(h + H_ADDED, (uint32_t)t->n_added);
    wr32(h + H_TRIE_RAW_NODES, (uint32_t)t->trie_raw.n_nodes);
    wr32(h + H_TRIE_NORM_NODES, (uint32_t)t->trie_norm.n_nodes);
    wr64(h + H_VOCAB_N, w.keys[SEC_VOCAB_SLOTS]);
    wr64(h + H_ENC_N, w.keys[SEC_ENC_SLOTS]);
    wr64(h + H_MERGES_N, w.keys[SEC_MERGES]);
    wr64(h + H_TRIE_RAW_N, w.keys[SEC_TRIE_RAW_EDGES]);
    wr64(h + H_TRIE_NORM_N, w.keys[SEC_TRIE_NORM_EDGES]);
    for (int i = 0; i < SEC_COUNT; i++) {
        wr64(h + IMG_HEADER + i * TABLE_ENTRY, w.sec[i][0]);
        wr64(h + IMG_HEADER + i * TABLE_ENTRY + 8, w.sec[i][1]);
    }
    *out = w.b.p;
    *len = w.b.len;
    w.b.p = NULL;
out:
    lms__tb_free(&w.b);
    lms__tb_free(&aux);
    return rc;
}

/* ---- reading ------------------------------------------------------------------------------ */

typedef struct reader {
    const uint8_t *base;
    size_t len;
    uint64_t sec[SEC_COUNT][2];
} reader;

static int bad(const char *fmt, const char *what)
{
    return lms__err(LMS_EFORMAT, fmt, what);
}

static const void *sec_ptr(const reader *r, int id) { return r->sec[id][1] ? r->base + r->sec[id][0] : NULL; }

/* A section that must be exactly `want` bytes. */
static int sec_exact(const reader *r, int id, uint64_t want)
{
    if (r->sec[id][1] != want)
        return lms__err(LMS_EFORMAT, "tokenizer image: section '%s' is %llu bytes, expected %llu", sec_names[id],
                        (unsigned long long)r->sec[id][1], (unsigned long long)want);
    return 0;
}

/* A slot table: a power-of-two number of 16-byte slots holding n entries. */
static int sec_slots(const reader *r, int id, uint64_t n, size_t *cap)
{
    uint64_t size = r->sec[id][1], c = size / 16;
    if (size % 16 || (c & (c - 1)) || n > c || (c && n == c) || c > ((uint64_t)1 << 32))
        return lms__err(LMS_EFORMAT, "tokenizer image: section '%s' is not a hash table (%llu bytes, %llu entries)",
                        sec_names[id], (unsigned long long)size, (unsigned long long)n);
    *cap = (size_t)c;
    return 0;
}

static int view_strmap(const reader *r, int slots, int keys, uint64_t n, uint32_t vlim, lms__strmap *m)
{
    size_t cap = 0;
    int rc = sec_slots(r, slots, n, &cap);
    if (rc)
        return rc;
    if (r->sec[keys][1] > UINT32_MAX)
        return bad("tokenizer image: section '%s' is larger than 4 GiB", sec_names[keys]);
    /* borrowed and never written (design note 4 of tok_internal.h) */
    m->ent = (struct lms__sm_ent *)sec_ptr(r, slots);
    m->cap = vlim ? cap : 0; /* no id can be valid in an empty vocabulary */
    m->n = (size_t)n;
    m->arena = (char *)sec_ptr(r, keys);
    m->arena_len = (size_t)r->sec[keys][1];
    m->vlim = vlim;
    return 0;
}

static int view_u64map(const reader *r, int slots, uint64_t n, lms__u64map *m)
{
    size_t cap = 0;
    int rc = sec_slots(r, slots, n, &cap);
    if (rc)
        return rc;
    m->ent = (struct lms__um_ent *)sec_ptr(r, slots);
    m->cap = cap;
    m->n = (size_t)n;
    return 0;
}

static bool id_ok(int32_t id, size_t vocab_size, bool allow_none)
{
    return (allow_none && id == -1) || (id >= 0 && (size_t)id < vocab_size);
}

/* A bounded cursor over the pipeline section. */
typedef struct cursor {
    const uint8_t *p, *end;
    bool short_read;
} cursor;

static unsigned get_u8(cursor *c)
{
    if (c->p >= c->end) {
        c->short_read = true;
        return 0;
    }
    return *c->p++;
}

static uint32_t get_u32(cursor *c)
{
    if (c->end - c->p < 4) {
        c->short_read = true;
        c->p = c->end;
        return 0;
    }
    uint32_t v = rd32(c->p);
    c->p += 4;
    return v;
}

static const char *get_bytes(cursor *c, size_t *n)
{
    uint32_t len = get_u32(c);
    if ((size_t)(c->end - c->p) < len) {
        c->short_read = true;
        c->p = c->end;
        *n = 0;
        return "";
    }
    const char *s = (const char *)c->p;
    c->p += len;
    *n = len;
    return s;
}

static int get_pattern(cursor *c, tok_pattern *p, const char *where)
{
    unsigned kind = get_u8(c);
    size_t n;
    const char *s = get_bytes(c, &n);
    if (c->short_read || kind > PAT_REGEX)
        return bad("tokenizer image: %s: bad pattern", where);
    if (kind == PAT_LITERAL) {
        p->lit_len = n;
        return (p->lit = lms__tok_memdup0(s, n)) ? 0 : LMS_ENOMEM;
    }
    if (kind == PAT_REGEX)
        return lms__tok_pattern_regex(p, s, n, where);
    return n ? bad("tokenizer image: %s: bad pattern", where) : 0;
}

/* Exactly one UTF-8 character of at most 4 bytes (Metaspace replacement). */
static int get_char(cursor *c, char out[8], size_t *len, bool required, const char *where)
{
    size_t n;
    const char *s = get_bytes(c, &n);
    uint32_t cp;
    if (!n && !required) {
        *len = 0;
        return 0;
    }
    if (c->short_read || !n || n > 4 || lms__utf8_next((const uint8_t *)s, n, &cp) != n)
        return bad("tokenizer image: %s: the replacement is not one character", where);
    memcpy(out, s, n);
    *len = n;
    return 0;
}

static int read_norms(lms_tokenizer *t, cursor *c)
{
    uint32_t n = get_u32(c);
    int rc;
    if (c->short_read || n > 256)
        return bad("tokenizer image: %s: bad normalizer count", "pipeline");
    if (n && !(t->norms = lms__calloc(n, sizeof *t->norms)))
        return LMS_ENOMEM;
    for (uint32_t i = 0; i < n; i++) {
        tok_norm *nm = &t->norms[t->n_norms++];
        nm->type = (int)get_u8(c);
        nm->strip_left = get_u8(c) != 0;
        nm->strip_right = get_u8(c) != 0;
        if (nm->type > NORM_LOWERCASE)
            return bad("tokenizer image: %s: unknown normalizer", "pipeline");
        if ((rc = get_pattern(c, &nm->pat, "pipeline: normalizer Replace")))
            return rc;
        if ((nm->type == NORM_REPLACE) != (nm->pat.lit || nm->pat.re))
            return bad("tokenizer image: %s: a normalizer's pattern does not fit its type", "pipeline");
        size_t cn;
        const char *s = get_bytes(c, &cn);
        if (c->short_read)
            return bad("tokenizer image: %s: truncated", "pipeline");
        if (nm->type == NORM_REPLACE || nm->type == NORM_PREPEND) {
            if (!(nm->content = lms__tok_memdup0(s, cn)))
                return LMS_ENOMEM;
            nm->content_len = cn;
        }
    }
    return 0;
}

static int read_pres(lms_tokenizer *t, cursor *c)
{
    uint32_t n = get_u32(c);
    int rc;
    if (c->short_read || n > 256)
        return bad("tokenizer image: %s: bad pre-tokenizer count", "pipeline");
    if (n && !(t->pres = lms__calloc(n, sizeof *t->pres)))
        return LMS_ENOMEM;
    for (uint32_t i = 0; i < n; i++) {
        tok_pre *p = &t->pres[t->n_pres++];
        p->type = (int)get_u8(c);
        if (p->type > PRE_CHARS)
            return bad("tokenizer image: %s: unknown pre-tokenizer", "pipeline");
        if ((rc = get_pattern(c, &p->pat, p->type == PRE_SPLIT ? "pipeline: pre_tokenizer Split" : "pipeline: ByteLevel")))
            return rc;
        p->behavior = (int)get_u8(c);
        p->invert = get_u8(c) != 0;
        p->add_prefix_space = get_u8(c) != 0;
        p->use_regex = get_u8(c) != 0;
        p->map_bytes = get_u8(c) != 0;
        if ((rc = get_char(c, p->repl, &p->repl_len, p->type == PRE_METASPACE, "pipeline: pre_tokenizer Metaspace")))
            return rc;
        p->prepend_scheme = (int)get_u8(c);
        p->split = get_u8(c) != 0;
        p->chars = (int)get_u8(c);
        bool has_pat = p->pat.lit || p->pat.re;
        bool want_pat = p->type == PRE_SPLIT || (p->type == PRE_BYTELEVEL && p->use_regex);
        if (c->short_read || p->behavior > BEH_CONTIGUOUS || p->prepend_scheme > PREPEND_NEVER ||
            p->chars > CHARS_SPACE || has_pat != want_pat || (p->type == PRE_BYTELEVEL && p->pat.lit))
            return bad("tokenizer image: %s: a pre-tokenizer's settings are out of range", "pipeline");
    }
    return 0;
}

static int read_decs(lms_tokenizer *t, cursor *c)
{
    uint32_t n = get_u32(c);
    int rc;
    if (c->short_read || n > 256)
        return bad("tokenizer image: %s: bad decoder count", "pipeline");
    if (n && !(t->decs = lms__calloc(n, sizeof *t->decs)))
        return LMS_ENOMEM;
    for (uint32_t i = 0; i < n; i++) {
        tok_dec *d = &t->decs[t->n_decs++];
        tok_pattern pat = {0};
        d->type = (int)get_u8(c);
        if (d->type > DEC_METASPACE)
            return bad("tokenizer image: %s: unknown decoder", "pipeline");
        rc = get_pattern(c, &pat, "pipeline: decoder Replace");
        d->pat = pat.lit;
        d->pat_len = pat.lit_len;
        pat.lit = NULL;
        lms__tok_pattern_free(&pat);
        if (rc)
            return rc;
        size_t cn;
        const char *s = get_bytes(c, &cn);
        d->start = (int32_t)get_u32(c);
        d->stop = (int32_t)get_u32(c);
        if ((rc = get_char(c, d->repl, &d->repl_len, d->type == DEC_METASPACE, "pipeline: decoder Metaspace")))
            return rc;
        d->prepend_scheme = (int)get_u8(c);
        uint32_t cp;
        if (c->short_read || d->prepend_scheme > PREPEND_NEVER || (d->type == DEC_REPLACE) != (d->pat != NULL) ||
            (d->type == DEC_REPLACE && !d->pat_len) ||
            (d->type == DEC_STRIP && (!cn || lms__utf8_next((const uint8_t *)s, cn, &cp) != cn || d->start < 0 ||
                                      d->stop < 0 || d->start > 1000000 || d->stop > 1000000)))
            return bad("tokenizer image: %s: a decoder's settings are out of range", "pipeline");
        if (d->type == DEC_REPLACE || d->type == DEC_STRIP) {
            if (!(d->content = lms__tok_memdup0(s, cn)))
                return LMS_ENOMEM;
            d->content_len = cn;
        }
    }
    return 0;
}

static int read_tries(lms_tokenizer *t, const reader *r, const uint8_t *h)
{
    static const int secs[2][2] = {{SEC_TRIE_RAW_EDGES, SEC_TRIE_RAW_TERM}, {SEC_TRIE_NORM_EDGES, SEC_TRIE_NORM_TERM}};
    static const int nodes_at[2] = {H_TRIE_RAW_NODES, H_TRIE_NORM_NODES}, n_at[2] = {H_TRIE_RAW_N, H_TRIE_NORM_N};
    uint32_t flags = rd32(h + H_FLAGS);
    int rc;
    if ((rc = sec_exact(r, SEC_TRIE_FIRST, 512)))
        return rc;
    for (int k = 0; k < 2; k++) {
        tok_trie *tr = k ? &t->trie_norm : &t->trie_raw;
        uint32_t nodes = rd32(h + nodes_at[k]);
        if ((rc = view_u64map(r, secs[k][0], rd64(h + n_at[k]), &tr->edges)) ||
            (rc = sec_exact(r, secs[k][1], (uint64_t)nodes * 4)))
            return rc;
        tr->term = (int32_t *)sec_ptr(r, secs[k][1]);
        tr->n_nodes = tr->cap_nodes = nodes;
        memcpy(tr->first, (const uint8_t *)sec_ptr(r, SEC_TRIE_FIRST) + 256 * k, 256);
        tr->empty = (flags & (k ? HF_TRIE_NORM_EMPTY : HF_TRIE_RAW_EMPTY)) != 0;
    }
    return 0;
}

static int read_added(lms_tokenizer *t, const reader *r, uint32_t n)
{
    int rc;
    if ((rc = sec_exact(r, SEC_ADDED, (uint64_t)n * 16)))
        return rc;
    if (n && !(t->added = lms__calloc(n, sizeof *t->added)))
        return LMS_ENOMEM;
    const uint8_t *rec = sec_ptr(r, SEC_ADDED);
    const char *bytes = sec_ptr(r, SEC_ADDED_BYTES);
    uint64_t nbytes = r->sec[SEC_ADDED_BYTES][1];
    for (uint32_t i = 0; i < n; i++, rec += 16) {
        uint64_t off = rd32(rec), len = rd32(rec + 4);
        int32_t id = (int32_t)rd32(rec + 8);
        uint32_t f = rd32(rec + 12);
        if (off + len >= nbytes || bytes[off + len] != '\0' || !id_ok(id, t->vocab_size, false))
            return lms__err(LMS_EFORMAT, "tokenizer image: added token %u lies outside its section or the vocabulary",
                            i);
        tok_added *a = &t->added[t->n_added++];
        a->content = (char *)bytes + off; /* borrowed */
        a->len = (size_t)len;
        a->id = id;
        a->special = f & AF_SPECIAL;
        a->lstrip = f & AF_LSTRIP;
        a->rstrip = f & AF_RSTRIP;
        a->single_word = f & AF_SINGLE_WORD;
        a->normalized = f & AF_NORMALIZED;
    }
    return 0;
}

static int read_post(lms_tokenizer *t, const reader *r, uint32_t npre, uint32_t nsuf)
{
    int rc;
    if (npre > 1024 || nsuf > 1024)
        return bad("tokenizer image: %s: too many ids", "post-processor");
    if ((rc = sec_exact(r, SEC_POST, ((uint64_t)npre + nsuf) * 4)))
        return rc;
    const uint8_t *p = sec_ptr(r, SEC_POST);
    int32_t **dst[2] = {&t->post_prefix, &t->post_suffix};
    size_t *cnt[2] = {&t->n_post_prefix, &t->n_post_suffix};
    uint32_t want[2] = {npre, nsuf};
    for (int k = 0; k < 2; k++) {
        if (!want[k])
            continue;
        if (!(*dst[k] = lms__malloc(want[k] * sizeof(int32_t))))
            return LMS_ENOMEM;
        for (uint32_t i = 0; i < want[k]; i++, p += 4) {
            int32_t id = (int32_t)rd32(p);
            if (!id_ok(id, t->vocab_size, false))
                return bad("tokenizer image: %s: an id outside the vocabulary", "post-processor");
            (*dst[k])[(*cnt[k])++] = id;
        }
    }
    return 0;
}

/* Header and section table: everything about the image's shape. */
static int read_header(reader *r)
{
    const uint8_t *h = r->base;
    if (r->len < IMG_HEADER + SEC_COUNT * TABLE_ENTRY || memcmp(h + H_MAGIC, IMG_MAGIC, 8) != 0)
        return lms__err(LMS_EFORMAT, "tokenizer image: not a compiled tokenizer (%zu bytes, no magic)", r->len);
    uint32_t bom = rd32(h + H_BOM);
    if (bom != IMG_BOM)
        return lms__err(LMS_EFORMAT, "tokenizer image: %s", bom == 0x0D0C0B0Au ? "written with the other byte order"
                                                                              : "bad byte-order mark");
    uint32_t ver = rd32(h + H_VERSION);
    if (ver != IMG_VERSION)
        return lms__err(LMS_EVERSION, "tokenizer image: version %u; this build reads version %u", ver, IMG_VERSION);
    if (rd32(h + H_HEADER_SIZE) != IMG_HEADER || rd32(h + H_SECTIONS) != SEC_COUNT)
        return lms__err(LMS_EFORMAT, "tokenizer image: header of %u bytes with %u sections, expected %u and %u",
                        rd32(h + H_HEADER_SIZE), rd32(h + H_SECTIONS), IMG_HEADER, SEC_COUNT);
    if (rd64(h + H_TOTAL) != r->len)
        return lms__err(LMS_EFORMAT, "tokenizer image: %zu bytes, its header says %llu (truncated?)", r->len,
                        (unsigned long long)rd64(h + H_TOTAL));
    if (rd32(h + H_HASH_PROBE) != (uint32_t)lms__hash64(IMG_HASH_PROBE, strlen(IMG_HASH_PROBE), 0))
        return lms__err(LMS_EFORMAT, "tokenizer image: its tables were hashed with another function");
    uint64_t table_end = IMG_HEADER + SEC_COUNT * TABLE_ENTRY;
    for (int i = 0; i < SEC_COUNT; i++) {
        uint64_t off = rd64(h + IMG_HEADER + i * TABLE_ENTRY), size = rd64(h + IMG_HEADER + i * TABLE_ENTRY + 8);
        if (size && (off < table_end || off % 8 || off > r->len || size > r->len - off))
            return lms__err(LMS_EFORMAT, "tokenizer image: section '%s' (offset %llu, %llu bytes) lies outside the "
                            "%zu-byte image or is misaligned",
                            sec_names[i], (unsigned long long)off, (unsigned long long)size, r->len);
        r->sec[i][0] = size ? off : 0; /* an empty section's offset means nothing */
        r->sec[i][1] = size;
    }
    return 0;
}

int lms_tokenizer_open_image(const void *image, size_t len, lms_tokenizer **out)
{
    reader r = {.base = image, .len = len};
    lms_tokenizer *t = NULL;
    int rc;
    if (!out || !image)
        return lms__err(LMS_EINVAL, "lms_tokenizer_open_image: NULL argument");
    *out = NULL;
    if ((uintptr_t)image % 8)
        return lms__err(LMS_EINVAL, "lms_tokenizer_open_image: the image must be 8-byte aligned");
    if (!little_endian())
        return lms__err(LMS_EUNSUPPORTED, "tokenizer image: little-endian; this host is not");
    if ((rc = read_header(&r)))
        return rc;
    const uint8_t *h = r.base;
    if (!(t = lms__calloc(1, sizeof *t)))
        return LMS_ENOMEM;
    t->image = image;
    uint32_t vs = rd32(h + H_VOCAB), flags = rd32(h + H_FLAGS);
    if (vs > (1u << 24)) {
        rc = bad("tokenizer image: %s is implausibly large", "the vocabulary");
        goto fail;
    }
    t->vocab_size = vs;
    t->byte_level = flags & HF_BYTE_LEVEL;
    t->ignore_merges = flags & HF_IGNORE_MERGES;
    t->byte_fallback = flags & HF_BYTE_FALLBACK;
    t->fuse_unk = flags & HF_FUSE_UNK;
    t->unk_id = (int32_t)rd32(h + H_UNK);
    t->bos_id = (int32_t)rd32(h + H_BOS);
    t->eos_id = (int32_t)rd32(h + H_EOS);
    if (!id_ok(t->unk_id, vs, true) || !id_ok(t->bos_id, vs, true) || !id_ok(t->eos_id, vs, true)) {
        rc = bad("tokenizer image: %s outside the vocabulary", "unk, bos or eos id");
        goto fail;
    }
    /* the large tables: views (design note 1) */
    if ((rc = view_strmap(&r, SEC_VOCAB_SLOTS, SEC_VOCAB_KEYS, rd64(h + H_VOCAB_N), vs, &t->vocab)) ||
        (rc = view_strmap(&r, SEC_ENC_SLOTS, SEC_ENC_KEYS, rd64(h + H_ENC_N), vs, &t->enc)) ||
        (rc = view_u64map(&r, SEC_MERGES, rd64(h + H_MERGES_N), &t->merges)) ||
        (rc = sec_exact(&r, SEC_TOK_OFF, (uint64_t)vs * 4)) || (rc = sec_exact(&r, SEC_TOK_LEN, (uint64_t)vs * 4)) ||
        (rc = sec_exact(&r, SEC_TOK_FLAGS, vs)))
        goto fail;
    if (vs && !r.sec[SEC_TOK_BYTES][1]) {
        rc = bad("tokenizer image: section '%s' is empty", sec_names[SEC_TOK_BYTES]);
        goto fail;
    }
    t->tok_arena = (char *)sec_ptr(&r, SEC_TOK_BYTES);
    t->tok_arena_len = (size_t)r.sec[SEC_TOK_BYTES][1];
    t->tok_off = (uint32_t *)sec_ptr(&r, SEC_TOK_OFF);
    t->tok_len = (uint32_t *)sec_ptr(&r, SEC_TOK_LEN);
    t->tok_flags = (uint8_t *)sec_ptr(&r, SEC_TOK_FLAGS);
    /* the small tables: checked entry by entry */
    if ((rc = sec_exact(&r, SEC_BYTE_IDS, 2048)))
        goto fail;
    const uint8_t *bi = sec_ptr(&r, SEC_BYTE_IDS);
    for (int b = 0; b < 256; b++) {
        t->byte_id[b] = (int32_t)rd32(bi + 4 * b);
        t->fallback_id[b] = (int32_t)rd32(bi + 1024 + 4 * b);
        if (!id_ok(t->byte_id[b], vs, true) || !id_ok(t->fallback_id[b], vs, true)) {
            rc = bad("tokenizer image: section '%s' holds an id outside the vocabulary", sec_names[SEC_BYTE_IDS]);
            goto fail;
        }
    }
    if ((rc = read_added(t, &r, rd32(h + H_ADDED))) || (rc = read_tries(t, &r, h)) ||
        (rc = read_post(t, &r, rd32(h + H_POST_PREFIX), rd32(h + H_POST_SUFFIX))))
        goto fail;
    cursor c = {r.base + r.sec[SEC_PIPELINE][0], r.base + r.sec[SEC_PIPELINE][0] + r.sec[SEC_PIPELINE][1], false};
    if ((rc = read_norms(t, &c)) || (rc = read_pres(t, &c)) || (rc = read_decs(t, &c)))
        goto fail;
    if (c.p != c.end) {
        rc = bad("tokenizer image: section '%s' has bytes after its last step", sec_names[SEC_PIPELINE]);
        goto fail;
    }
    if (r.sec[SEC_CHAT][1] && !(t->chat_template = lms__tok_memdup0(sec_ptr(&r, SEC_CHAT), (size_t)r.sec[SEC_CHAT][1]))) {
        rc = LMS_ENOMEM;
        goto fail;
    }
    *out = t;
    return 0;
fail:
    lms_tokenizer_free(t);
    return rc;
}

void lms__tokenizer_set_release(lms_tokenizer *t, void (*release)(void *), void *arg)
{
    t->release = release;
    t->release_arg = arg;
}
