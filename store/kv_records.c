/*
 * store/kv_records.c - encoders and decoders of the KV records: kvpages and
 * sessions (see store/kv_records.h and docs/FORMAT.md). Pure functions over
 * bytes; decoders are fuzzed.
 */
#include <string.h>

#include "common/common.h"
#include "store/kv_records.h"

static int bad(const char *what, const char *name, const char *why)
{
    if (name)
        return lms__err(LMS_ECORRUPT, "%s record '%s': %s", what, name, why);
    return lms__err(LMS_ECORRUPT, "%s record: %s", what, why);
}

/* ---- kvpages ---------------------------------------------------------------------- */

/* Layout (56 bytes, little-endian):
 *  0 u16 version   2 u16 codec   4 u16 elem_size   6 u16 zero
 *  8 u32 n_tokens 12 u32 zero   16 u64 raw_size   24 u64 raw_hash
 * 32 u8[16] blob  48 u64 stored_size */
void lms__kvpage_rec_encode(const lms__kvpage_rec *r, uint8_t out[LMS__KVPAGE_REC_SIZE])
{
    memset(out, 0, LMS__KVPAGE_REC_SIZE);
    lms__put_u16(out, LMS__KVPAGE_VERSION);
    lms__put_u16(out + 2, r->codec);
    lms__put_u16(out + 4, r->elem_size);
    lms__put_u32(out + 8, r->n_tokens);
    lms__put_u64(out + 16, r->raw_size);
    lms__put_u64(out + 24, r->raw_hash);
    memcpy(out + 32, r->blob, 16);
    lms__put_u64(out + 48, r->stored_size);
}

int lms__kvpage_rec_decode(const void *buf, size_t len, lms__kvpage_rec *r)
{
    const uint8_t *p = buf;
    if (len < 2)
        return bad("kvpage", NULL, "shorter than its version field");
    uint16_t v = lms__get_u16(p);
    if (v == 0)
        return bad("kvpage", NULL, "version 0");
    if (v > LMS__KVPAGE_VERSION)
        return lms__err(LMS_EVERSION, "kvpage record: version %u is newer than this build (%u)", v,
                        LMS__KVPAGE_VERSION);
    if (len != LMS__KVPAGE_REC_SIZE)
        return bad("kvpage", NULL, "wrong length");
    r->codec = lms__get_u16(p + 2);
    r->elem_size = lms__get_u16(p + 4);
    r->n_tokens = lms__get_u32(p + 8);
    r->raw_size = lms__get_u64(p + 16);
    r->raw_hash = lms__get_u64(p + 24);
    memcpy(r->blob, p + 32, 16);
    r->stored_size = lms__get_u64(p + 48);
    if (r->codec > LMS__KV_CODEC_SHUFFLE_ZSTD)
        return bad("kvpage", NULL, "unknown codec");
    if (r->elem_size != 2 && r->elem_size != 4)
        return bad("kvpage", NULL, "element size is not 2 or 4");
    if (r->n_tokens == 0 || r->raw_size == 0 || r->raw_size % r->elem_size)
        return bad("kvpage", NULL, "empty page or size not a multiple of the element size");
    if (r->codec == LMS__KV_CODEC_RAW && r->stored_size != r->raw_size)
        return bad("kvpage", NULL, "raw page whose stored size differs from its size");
    if (r->stored_size == 0)
        return bad("kvpage", NULL, "stored size 0");
    return 0;
}

/* ---- sessions ---------------------------------------------------------------------- */

/* Layout (little-endian):
 *  0 u16 version  2 u16 zero  4 u32 window (v1: zero)  8 u8[16] model id
 * 24 u32 n_layers 28 u32 n_kv_heads 32 u32 head_dim 36 u32 dtype 40 u32 page_tokens
 * 44 u32 n_tokens 48 u32 n_pages 52 u32 n_window_pages (v1: zero) 56 u64 created 64 u64 last_used
 * 72 i32[n_tokens] tokens, then u8[16][n_pages + n_window_pages] page keys,
 * then (v2) u8[n_layers] sliding layers,
 * then u64 XXH3-64 (seed 0) of every byte before it. */
static size_t rec_size(uint32_t n_tokens, uint32_t n_keys, uint32_t sliding_bytes)
{
    return LMS__SESSION_REC_FIXED + 4 * (size_t)n_tokens + 16 * (size_t)n_keys + sliding_bytes + 8;
}

size_t lms__session_rec_size(const lms__session_rec *r)
{
    return rec_size(r->n_tokens, lms__session_n_keys(r), r->window ? r->n_layers : 0);
}

static void put_checksum(uint8_t *buf, size_t len)
{
    lms__put_u64(buf + len - 8, lms__hash64(buf, len - 8, 0));
}

size_t lms__session_rec_encode(const lms__session_rec *r, uint8_t *out)
{
    size_t len = lms__session_rec_size(r), keys = 16 * (size_t)lms__session_n_keys(r);
    memset(out, 0, LMS__SESSION_REC_FIXED);
    lms__put_u16(out, r->window ? 2 : 1);
    lms__put_u32(out + 4, r->window);
    lms__put_u32(out + 52, r->window ? r->n_window_pages : 0);
    memcpy(out + 8, r->model_id, LMS_MODEL_ID_LEN);
    lms__put_u32(out + 24, r->n_layers);
    lms__put_u32(out + 28, r->n_kv_heads);
    lms__put_u32(out + 32, r->head_dim);
    lms__put_u32(out + 36, r->dtype);
    lms__put_u32(out + 40, r->page_tokens);
    lms__put_u32(out + 44, r->n_tokens);
    lms__put_u32(out + 48, r->n_pages);
    lms__put_u64(out + 56, r->created);
    lms__put_u64(out + 64, r->last_used);
    memcpy(out + LMS__SESSION_REC_FIXED, r->tokens, 4 * (size_t)r->n_tokens);
    memcpy(out + LMS__SESSION_REC_FIXED + 4 * (size_t)r->n_tokens, r->page_keys, keys);
    if (r->window)
        memcpy(out + LMS__SESSION_REC_FIXED + 4 * (size_t)r->n_tokens + keys, r->sliding, r->n_layers);
    put_checksum(out, len);
    return len;
}

int lms__session_rec_decode(const void *buf, size_t len, const char *name, lms__session_rec *r)
{
    const uint8_t *p = buf;
    memset(r, 0, sizeof *r);
    if (len < 2)
        return bad("session", name, "shorter than its version field");
    r->version = lms__get_u16(p);
    if (r->version == 0)
        return bad("session", name, "version 0");
    if (r->version > LMS__SESSION_VERSION) {
        if (name)
            return lms__err(LMS_EVERSION, "session '%s' has record version %u; this build reads version %u",
                            name, r->version, LMS__SESSION_VERSION);
        return lms__err(LMS_EVERSION, "session record version %u; this build reads version %u", r->version,
                        LMS__SESSION_VERSION);
    }
    if (len < LMS__SESSION_REC_FIXED + 8)
        return bad("session", name, "shorter than its fixed part");
    memcpy(r->model_id, p + 8, LMS_MODEL_ID_LEN);
    r->n_layers = lms__get_u32(p + 24);
    r->n_kv_heads = lms__get_u32(p + 28);
    r->head_dim = lms__get_u32(p + 32);
    r->dtype = lms__get_u32(p + 36);
    r->page_tokens = lms__get_u32(p + 40);
    r->n_tokens = lms__get_u32(p + 44);
    r->n_pages = lms__get_u32(p + 48);
    r->window = r->version >= 2 ? lms__get_u32(p + 4) : 0;
    r->n_window_pages = r->version >= 2 ? lms__get_u32(p + 52) : 0;
    r->created = lms__get_u64(p + 56);
    r->last_used = lms__get_u64(p + 64);
    if (r->page_tokens == 0 || r->n_tokens == 0 || r->n_tokens > LMS__SESSION_MAX_TOKENS)
        return bad("session", name, "page size 0 or token count out of range");
    if (r->n_pages != r->n_tokens / r->page_tokens + (r->n_tokens % r->page_tokens != 0))
        return bad("session", name, "page count does not match the token count");
    if (r->version >= 2) {
        /* the window pages are those of the last `window` positions (kvcache's lms__kv_window_first) */
        uint32_t first = r->n_tokens > r->window ? (r->n_tokens - r->window) / r->page_tokens : 0;
        if (r->window == 0 || r->n_layers == 0 || r->n_layers > 65536 || r->n_window_pages != r->n_pages - first)
            return bad("session", name, "window, layer or window page count out of range");
    }
    if (len != rec_size(r->n_tokens, lms__session_n_keys(r), r->window ? r->n_layers : 0))
        return bad("session", name, "length does not match its token and page counts");
    if (lms__get_u64(p + len - 8) != lms__hash64(p, len - 8, 0))
        return bad("session", name, "checksum mismatch");
    r->tokens = p + LMS__SESSION_REC_FIXED;
    r->page_keys = r->tokens + 4 * (size_t)r->n_tokens;
    if (r->window) {
        r->sliding = r->page_keys + 16 * (size_t)lms__session_n_keys(r);
        for (uint32_t l = 0; l < r->n_layers; l++)
            if (r->sliding[l] > 1)
                return bad("session", name, "sliding layer flag other than 0 or 1");
    }
    for (uint32_t i = 0; i < r->n_tokens; i++)
        if ((int32_t)lms__get_u32(r->tokens + 4 * (size_t)i) < 0)
            return bad("session", name, "negative token id");
    return 0;
}

void lms__session_rec_touch(uint8_t *buf, size_t len, uint64_t last_used)
{
    lms__put_u64(buf + 64, last_used);
    put_checksum(buf, len);
}
