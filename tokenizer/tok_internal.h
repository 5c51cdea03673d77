/*
 * tokenizer/tok_internal.h - the loaded form of a tokenizer.json,
 * shared by the loader (tok_load.c), the encoder (tok_encode.c), the
 * decoders (tok_decode.c) and the chat formats (chat.c).
 *
 * Design notes
 *  (1) A loaded tokenizer is immutable; encode keeps all scratch state in a
 *      per-call context, so one tokenizer serves many threads.
 *  (2) Byte-level models (one ByteLevel pre-tokenizer, the last step) are
 *      keyed in "encode space": their vocabulary strings are mapped back
 *      from the GPT-2 byte alphabet to raw bytes once at load, so encoding
 *      never converts text to that alphabet. id_to_token still returns the
 *      strings as written. When other steps follow a ByteLevel, it writes
 *      the alphabet into the text instead (as HF does) and BPE works on the
 *      vocabulary as written.
 *  (3) Merges are keyed by (left id, right id) -> (rank, merged id); a
 *      repeated pair keeps its last rank, as HF does.
 *  (4) The large tables (the two string maps, the merges, the id -> string
 *      arrays, the added-token tries) have one layout in memory and in the
 *      compiled form (tok_compiled.c, docs/TOKENIZER.md): a tokenizer opened
 *      from a compiled image points them into the image and borrows it.
 *      The image is untrusted, so every lookup checks what it reads (string
 *      offsets inside the arena, values inside the vocabulary, probe
 *      sequences bounded by the table size) instead of checking every entry
 *      at open: opening stays O(1) in the vocabulary size, and a damaged
 *      image gives wrong ids at worst, never a wild read.
 */
#ifndef LMS_TOK_INTERNAL_H
#define LMS_TOK_INTERNAL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include "common/common.h"
#include "lmstore/tokenizer.h"

/* ---- maps ---------------------------------------------------------------- */

/* bytes -> int32, keys copied into an arena. Slots hold the low 32 bits of
 * XXH3-64 (seed 0) of the key; linear probing from h & (cap - 1); an empty
 * slot has len UINT32_MAX. This layout is also the compiled form's. */
typedef struct lms__strmap {
    struct lms__sm_ent {
        uint32_t off, len;
        int32_t val;
        uint32_t h;
    } *ent;
    size_t cap, n; /* cap: power of two (0 = empty) */
    char *arena;
    size_t arena_len, arena_cap;
    uint32_t vlim; /* values >= vlim read as absent (0 = no limit): an untrusted image's */
} lms__strmap;

int lms__sm_put(lms__strmap *m, const char *k, size_t n, int32_t val); /* overwrites */
int32_t lms__sm_get(const lms__strmap *m, const char *k, size_t n);    /* -1 if absent */
void lms__sm_free(lms__strmap *m);
int lms__sm_reserve(lms__strmap *m, size_t n); /* room for n keys without growing */
/* The slots of m in the smallest table that holds its keys at the map's load
 * (*out: *cap slots holding *n keys, lms__free; NULL and 0 for an empty map).
 * Keys keep their offsets; a table already that small is copied as it is. */
int lms__sm_pack(const lms__strmap *m, struct lms__sm_ent **out, size_t *cap, size_t *n);

/* uint64 -> uint64 (key UINT64_MAX reserved = empty slot); key and value side
 * by side so a lookup touches one cache line. Linear probing from the
 * murmur3 64-bit finalizer of the key & (cap - 1); the compiled form's
 * layout too. */
typedef struct lms__u64map {
    struct lms__um_ent {
        uint64_t key, val;
    } *ent;
    size_t cap, n;
} lms__u64map;

int lms__um_put(lms__u64map *m, uint64_t k, uint64_t v);
bool lms__um_get(const lms__u64map *m, uint64_t k, uint64_t *v);
void lms__um_free(lms__u64map *m);
int lms__um_reserve(lms__u64map *m, size_t n);
int lms__um_pack(const lms__u64map *m, struct lms__um_ent **out, size_t *cap, size_t *n); /* as lms__sm_pack */

/* ---- components -------------------------------------------------------------- */

/* A Split / Replace pattern: a literal string or a compiled regex. */
typedef struct tok_pattern {
    char *lit; /* literal (String) or NULL */
    size_t lit_len;
    pcre2_code *re; /* Regex, JIT-compiled when possible */
    char *src;      /* the regex as written in tokenizer.json (for the compiled form) */
    size_t src_len;
} tok_pattern;

enum { NORM_NFC, NORM_NFD, NORM_NFKC, NORM_NFKD, NORM_REPLACE, NORM_PREPEND, NORM_STRIP, NORM_LOWERCASE };
typedef struct tok_norm {
    int type;
    bool strip_left, strip_right; /* Strip */
    tok_pattern pat;
    char *content;
    size_t content_len;
} tok_norm;

enum { PRE_SPLIT, PRE_BYTELEVEL, PRE_METASPACE, PRE_CHARS };
/* PRE_CHARS: split on characters of a class (Digits, Punctuation, WhitespaceSplit) */
enum { CHARS_NUMERIC, CHARS_PUNCT, CHARS_SPACE };
enum { BEH_REMOVED, BEH_ISOLATED, BEH_MERGED_PREV, BEH_MERGED_NEXT, BEH_CONTIGUOUS };
enum { PREPEND_ALWAYS, PREPEND_FIRST, PREPEND_NEVER };
typedef struct tok_pre {
    int type;
    tok_pattern pat; /* Split; ByteLevel with use_regex */
    int behavior;
    bool invert;
    bool add_prefix_space;  /* ByteLevel */
    bool use_regex;         /* ByteLevel */
    bool map_bytes;         /* ByteLevel not last: write the GPT-2 alphabet into the text */
    char repl[8];           /* Metaspace replacement (UTF-8) */
    size_t repl_len;
    int prepend_scheme;     /* Metaspace */
    bool split;             /* Metaspace */
    int chars;              /* PRE_CHARS: CHARS_* */
} tok_pre;

enum { DEC_BYTELEVEL, DEC_REPLACE, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP, DEC_METASPACE };
typedef struct tok_dec {
    int type;
    char *pat, *content; /* Replace (literal), Strip content char */
    size_t pat_len, content_len;
    int start, stop; /* Strip */
    char repl[8];    /* Metaspace */
    size_t repl_len;
    int prepend_scheme;
} tok_dec;

typedef struct tok_added {
    char *content;
    size_t len;
    int32_t id;
    bool special, lstrip, rstrip, single_word, normalized;
} tok_added;

/* Byte trie over added-token contents, for leftmost-longest matching. */
typedef struct tok_trie {
    lms__u64map edges; /* (node << 8 | byte) -> child node */
    int32_t *term;     /* node -> added-token index, -1 */
    size_t n_nodes, cap_nodes;
    uint8_t first[256]; /* bytes that start some token */
    bool empty;
} tok_trie;

struct lms_tokenizer {
    /* model (BPE) */
    lms__strmap vocab;   /* token string as written -> id (model + added) */
    lms__strmap enc;     /* encode-space key -> id (== vocab keys unless byte-level) */
    lms__u64map merges;  /* (a << 32 | b) -> (rank << 32 | new id) */
    char *tok_arena;     /* id -> string storage */
    uint32_t *tok_off, *tok_len; /* per id; tok_len UINT32_MAX = no token */
    uint8_t *tok_flags;  /* per id: TOKF_* */
    size_t vocab_size;   /* max id + 1 */
    bool byte_level;     /* pre-tokenizer ends with its only ByteLevel: raw-byte encode space */
    bool ignore_merges, byte_fallback, fuse_unk;
    int32_t unk_id;
    int32_t byte_id[256];     /* byte-level: id of each single byte; fallback: <0xNN> */
    int32_t fallback_id[256]; /* byte_fallback: id of <0xNN> */

    tok_norm *norms;
    size_t n_norms;
    tok_pre *pres;
    size_t n_pres;
    tok_dec *decs;
    size_t n_decs;
    int32_t *post_prefix, *post_suffix; /* ids added around a single sequence */
    size_t n_post_prefix, n_post_suffix;

    tok_added *added;
    size_t n_added;
    tok_trie trie_raw, trie_norm; /* non-normalized / normalized added tokens */

    int32_t bos_id, eos_id;
    char *chat_template;

    /* Opened from a compiled image (tok_compiled.c): vocab, enc, merges,
     * tok_arena/off/len/flags, the tries' tables and the added tokens'
     * contents point into it (borrowed, design note 4); release(release_arg)
     * runs at lms_tokenizer_free (e.g. to unmap it). */
    const void *image;
    size_t tok_arena_len; /* bytes of tok_arena */
    void (*release)(void *);
    void *release_arg;
};

enum { TOKF_ADDED = 1, TOKF_SPECIAL = 2 };

/* ---- helpers shared between files --------------------------------------------- */

/* A growable byte buffer. */
typedef struct tok_buf {
    char *p;
    size_t len, cap;
} tok_buf;
int lms__tb_reserve(tok_buf *b, size_t extra);
int lms__tb_add(tok_buf *b, const void *p, size_t n);
void lms__tb_free(tok_buf *b);
/* n bytes (NULs included) and a terminating NUL (strndup would stop at a NUL). */
char *lms__tok_memdup0(const char *s, size_t n);

/* The GPT-2 byte <-> unicode alphabet. */
uint32_t lms__bl_byte_to_cp(uint8_t b);
int lms__bl_cp_to_byte(uint32_t cp); /* -1 if cp is not in the alphabet */

/* Decode one UTF-8 char at s[0..n); returns its length (1..4) and sets *cp,
 * or 0 if the bytes are not a valid (complete) char. */
size_t lms__utf8_next(const uint8_t *s, size_t n, uint32_t *cp);
/* Offset of the first invalid UTF-8 byte in s[0..n), n when valid. */
size_t lms__utf8_invalid_at(const char *s, size_t n);
/* Append s as UTF-8 with Rust from_utf8_lossy semantics (maximal invalid
 * subparts -> U+FFFD). When !final, an incomplete char at the very end is
 * not consumed; *consumed gets the bytes used. */
int lms__utf8_lossy(tok_buf *out, const uint8_t *s, size_t n, bool final, size_t *consumed);
bool lms__is_unicode_ws(uint32_t cp); /* Rust char::is_whitespace */

/* The string of an id (NULL if none); NUL-terminated. */
static inline const char *lms__tok_str(const lms_tokenizer *t, int32_t id, size_t *len)
{
    if (id < 0 || (size_t)id >= t->vocab_size || t->tok_len[id] == UINT32_MAX)
        return NULL;
    uint64_t off = t->tok_off[id], n = t->tok_len[id];
    if (off + n >= t->tok_arena_len || t->tok_arena[off + n] != '\0') /* a damaged image */
        return NULL;
    *len = (size_t)n;
    return t->tok_arena + off;
}

/* Regex compilation shared by the JSON loader and the compiled form: the
 * source is kept in p->src. where names the component in errors. */
int lms__tok_pattern_regex(tok_pattern *p, const char *src, size_t n, const char *where);
void lms__tok_pattern_free(tok_pattern *p);

/* Per-token raw bytes for streaming (decoder steps that act per token). */
int lms__tok_piece(const lms_tokenizer *t, int32_t id, bool first, tok_buf *out);

#endif
