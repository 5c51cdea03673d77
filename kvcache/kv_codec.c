/*
 * kvcache/kv_codec.c - the page codecs of saved KV caches: raw, zstd, and
 * byte-shuffle + zstd (byte k of every element gathered into plane k before
 * zstd, so the slowly varying sign/exponent bytes of 16-bit floats sit
 * together and compress, while the noisy low mantissa bytes do not dilute
 * them). Lossless; the decoder checks sizes so a damaged frame is an error,
 * never an overrun.
 */
#include <string.h>
#include <zstd.h>

#include "kvcache/kv_codec.h"

const char *lms_kv_codec_name(lms_kv_codec c)
{
    switch (c) {
    case LMS_KV_CODEC_RAW: return "raw";
    case LMS_KV_CODEC_ZSTD: return "zstd";
    case LMS_KV_CODEC_SHUFFLE_ZSTD: return "shuffle-zstd";
    default: return NULL;
    }
}

int lms_kv_codec_from_name(const char *name, lms_kv_codec *out)
{
    for (int c = 0; c <= LMS_KV_CODEC_SHUFFLE_ZSTD; c++)
        if (name && !strcmp(name, lms_kv_codec_name((lms_kv_codec)c))) {
            *out = (lms_kv_codec)c;
            return 0;
        }
    return lms__err(LMS_EINVAL, "unknown KV codec '%s' (raw, zstd, shuffle-zstd)", name ? name : "");
}

void lms__kv_shuffle(uint8_t *dst, const uint8_t *src, size_t n, size_t es)
{
    size_t count = n / es;
    if (es == 2) {
        uint8_t *lo = dst, *hi = dst + count;
        for (size_t i = 0; i < count; i++) {
            lo[i] = src[2 * i];
            hi[i] = src[2 * i + 1];
        }
    } else {
        for (size_t b = 0; b < es; b++) {
            uint8_t *plane = dst + b * count;
            for (size_t i = 0; i < count; i++)
                plane[i] = src[i * es + b];
        }
    }
}

void lms__kv_unshuffle(uint8_t *dst, const uint8_t *src, size_t n, size_t es)
{
    size_t count = n / es;
    if (es == 2) {
        const uint8_t *lo = src, *hi = src + count;
        uint16_t *d = (uint16_t *)(void *)dst;
        if (((uintptr_t)dst & 1) == 0) {
            for (size_t i = 0; i < count; i++)
                d[i] = (uint16_t)(lo[i] | (hi[i] << 8));
        } else {
            for (size_t i = 0; i < count; i++) {
                dst[2 * i] = lo[i];
                dst[2 * i + 1] = hi[i];
            }
        }
    } else {
        for (size_t b = 0; b < es; b++) {
            const uint8_t *plane = src + b * count;
            for (size_t i = 0; i < count; i++)
                dst[i * es + b] = plane[i];
        }
    }
}

size_t lms__kv_encode_bound(size_t raw_len) { return ZSTD_compressBound(raw_len); }

int lms__kv_encode(lms__kv_codec_ctx *c, int codec, int level, const uint8_t *raw, size_t n, size_t es,
                   uint8_t *out, size_t cap, size_t *out_len)
{
    if (codec == LMS_KV_CODEC_RAW) {
        if (cap < n)
            return lms__err(LMS_ERANGE, "KV encode: buffer too small");
        memcpy(out, raw, n);
        *out_len = n;
        return 0;
    }
    if (!c->cctx && !(c->cctx = ZSTD_createCCtx()))
        return lms__err(LMS_ENOMEM, "KV encode: cannot create a zstd context");
    const uint8_t *src = raw;
    if (codec == LMS_KV_CODEC_SHUFFLE_ZSTD) {
        lms__kv_shuffle(c->scratch, raw, n, es);
        src = c->scratch;
    }
    size_t r = ZSTD_compressCCtx(c->cctx, out, cap, src, n, level);
    if (ZSTD_isError(r))
        return lms__err(LMS_EIO, "KV encode: zstd: %s", ZSTD_getErrorName(r));
    *out_len = r;
    return 0;
}

int lms__kv_decode(lms__kv_codec_ctx *c, int codec, const uint8_t *in, size_t in_len, uint8_t *out, size_t n,
                   size_t es)
{
    if (codec == LMS_KV_CODEC_RAW) {
        if (in_len != n)
            return LMS_ECORRUPT;
        memcpy(out, in, n);
        return 0;
    }
    if (codec != LMS_KV_CODEC_ZSTD && codec != LMS_KV_CODEC_SHUFFLE_ZSTD)
        return LMS_ECORRUPT;
    if (!c->dctx && !(c->dctx = ZSTD_createDCtx()))
        return LMS_ENOMEM;
    uint8_t *dst = codec == LMS_KV_CODEC_SHUFFLE_ZSTD ? c->scratch : out;
    size_t r = ZSTD_decompressDCtx(c->dctx, dst, n, in, in_len);
    if (ZSTD_isError(r) || r != n)
        return LMS_ECORRUPT;
    if (codec == LMS_KV_CODEC_SHUFFLE_ZSTD)
        lms__kv_unshuffle(out, c->scratch, n, es);
    return 0;
}

void lms__kv_codec_ctx_free(lms__kv_codec_ctx *c)
{
    if (!c)
        return;
    ZSTD_freeCCtx(c->cctx);
    ZSTD_freeDCtx(c->dctx);
    lms__free(c->scratch);
    memset(c, 0, sizeof *c);
}
