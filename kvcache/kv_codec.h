/*
 * kvcache/kv_codec.h - page codecs of saved KV caches (raw, zstd,
 * byte-shuffle + zstd). Internal; used by persistence and the benchmark.
 */
#ifndef LMS_KV_CODEC_H
#define LMS_KV_CODEC_H

#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "lmstore/kvcache.h"

/* Per-thread codec state: zstd contexts (created on first use) and a
 * scratch buffer of at least the largest raw page, owned by the caller who
 * sets it (freed by lms__kv_codec_ctx_free). */
typedef struct lms__kv_codec_ctx {
    void *cctx; /* ZSTD_CCtx */
    void *dctx; /* ZSTD_DCtx */
    void *hstate; /* XXH3_state_t */
    uint8_t *scratch;
} lms__kv_codec_ctx;

/* Byte planes: dst[b * (n/es) + i] = src[i * es + b]; and back. */
void lms__kv_shuffle(uint8_t *dst, const uint8_t *src, size_t n, size_t es);
void lms__kv_unshuffle(uint8_t *dst, const uint8_t *src, size_t n, size_t es);

size_t lms__kv_encode_bound(size_t raw_len);
/* Encode n raw bytes of es-byte elements into out (cap bytes). */
int lms__kv_encode(lms__kv_codec_ctx *c, int codec, int level, const uint8_t *raw, size_t n, size_t es,
                   uint8_t *out, size_t cap, size_t *out_len);
/* Decode exactly n bytes; LMS_ECORRUPT (no detail set) when the input does
 * not decode to n bytes, LMS_ENOMEM. With hash non-NULL, also XXH3-64
 * (seed 0) of the decoded bytes, computed while they are in cache. */
int lms__kv_decode(lms__kv_codec_ctx *c, int codec, const uint8_t *in, size_t in_len, uint8_t *out, size_t n,
                   size_t es, uint64_t *hash);
void lms__kv_codec_ctx_free(lms__kv_codec_ctx *c);

/* Streaming XXH3-64 (seed 0) with the context's state: equal to
 * lms__hash64(all bytes, 0). begin returns LMS_ENOMEM if no state. */
int lms__kv_hash_begin(lms__kv_codec_ctx *c);
void lms__kv_hash_update(lms__kv_codec_ctx *c, const void *p, size_t n);
uint64_t lms__kv_hash_end(lms__kv_codec_ctx *c);

#endif
