/*
 * store/kv_records.h - the index records of saved KV caches: "kvpages"
 * (one per stored page, keyed by the page's content key) and "sessions" (one
 * per saved sequence, keyed by its name). docs/FORMAT.md "kvpages" and
 * "sessions" is the normative description of the bytes.
 *
 * Pure functions over bytes, like store/records.c: decoders treat input as
 * untrusted (fuzzers call them), check every length before reading, and
 * return LMS_ECORRUPT (malformed) or LMS_EVERSION (a newer record version)
 * with a detail. Decoded pointers point into the input buffer.
 *
 * How the pieces reference each other (what gc and verify follow):
 *   sessions[name]   -> page keys (16 bytes each, in sequence order)
 *   kvpages[key]     -> blob hash (16 bytes) + codec, sizes, raw checksum
 *   blobs[hash]      -> kind LMS__BLOB_KVPAGE, segment, offset, stored size,
 *                       refs = number of kvpages records naming this blob
 * A kvpages record no session names is garbage: gc deletes it and drops its
 * blob's reference (in one transaction), and the blob then goes the usual
 * way of a blob with 0 references. Sessions hold no counted references.
 */
#ifndef LMS_KV_RECORDS_H
#define LMS_KV_RECORDS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lmstore/store.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LMS__KVPAGE_VERSION 1u
#define LMS__SESSION_VERSION 2u   /* 2: with a sliding window (a session without one is written as 1) */
#define LMS__KVPAGE_REC_SIZE 56
#define LMS__SESSION_REC_FIXED 72 /* + 4 per token + 16 per page (and window page) + n_layers (v2) + 8 checksum */
#define LMS__SESSION_NAME_MAX 400 /* bytes; LMDB keys are at most 511 */
#define LMS__SESSION_MAX_TOKENS (1u << 26)

/* Page codecs (the public lms_kv_codec values). */
enum { LMS__KV_CODEC_RAW = 0, LMS__KV_CODEC_ZSTD = 1, LMS__KV_CODEC_SHUFFLE_ZSTD = 2 };

typedef struct lms__kvpage_rec {
    uint16_t codec;
    uint16_t elem_size;    /* bytes per element (the shuffle width) */
    uint32_t n_tokens;     /* valid token positions in the page */
    uint64_t raw_size;     /* bytes after decoding */
    uint64_t raw_hash;     /* XXH3-64 (seed 0) of the decoded bytes */
    uint8_t blob[16];      /* XXH3-128 of the stored bytes: key in the blobs db */
    uint64_t stored_size;  /* bytes of the blob */
} lms__kvpage_rec;

void lms__kvpage_rec_encode(const lms__kvpage_rec *r, uint8_t out[LMS__KVPAGE_REC_SIZE]);
int lms__kvpage_rec_decode(const void *buf, size_t len, lms__kvpage_rec *r);

typedef struct lms__session_rec {
    uint16_t version;
    uint8_t model_id[LMS_MODEL_ID_LEN];
    uint32_t n_layers, n_kv_heads, head_dim, dtype, page_tokens;
    uint32_t n_tokens;
    uint32_t n_pages;          /* ceil(n_tokens / page_tokens) */
    uint32_t window;           /* v2: positions of a sliding-window layer (0: v1, no window) */
    uint32_t n_window_pages;   /* v2: window pages saved, those of the last `window` positions */
    uint64_t created, last_used;
    const uint8_t *tokens;     /* n_tokens little-endian int32 (decode: into the input) */
    const uint8_t *page_keys;  /* (n_pages + n_window_pages) x 16 bytes: the pages, then the window pages */
    const uint8_t *sliding;    /* v2: n_layers bytes, 1 = a sliding-window layer */
} lms__session_rec;

/* Page keys the record lists (what gc keeps and verify checks). */
static inline uint32_t lms__session_n_keys(const lms__session_rec *r) { return r->n_pages + r->n_window_pages; }

/* Bytes of the encoded record (version 2 when r->window, else 1). */
size_t lms__session_rec_size(const lms__session_rec *r);
/* out must hold lms__session_rec_size(...) bytes; returns that size. tokens
 * and page_keys are read from the struct's pointers (tokens as LE int32). */
size_t lms__session_rec_encode(const lms__session_rec *r, uint8_t *out);
/*
 * Decode and check a session record: version (LMS_EVERSION when newer; only
 * the version field is read then), exact length, n_pages consistent with
 * n_tokens and page_tokens (v2: n_window_pages with the window, sliding
 * bytes 0 or 1), token ids >= 0, trailing checksum. LMS_ECORRUPT otherwise.
 * `name` (may be NULL) is used in the detail.
 */
int lms__session_rec_decode(const void *buf, size_t len, const char *name, lms__session_rec *r);

/* Page key i (< lms__session_n_keys) of a decoded session (16 bytes). */
static inline const uint8_t *lms__session_page_key(const lms__session_rec *r, uint32_t i)
{
    return r->page_keys + 16 * (size_t)i;
}

/* Overwrite last_used in an encoded, valid record (and its checksum). */
void lms__session_rec_touch(uint8_t *buf, size_t len, uint64_t last_used);

#ifdef __cplusplus
}
#endif
#endif
