/*
 * kvcache/kv_codec.c - the page codecs of saved KV caches: raw, zstd, and
 * byte-shuffle + zstd (byte k of every element gathered into plane k before
 * zstd, so the slowly varying sign/exponent bytes of 16-bit floats sit
 * together and compress, while the noisy low mantissa bytes do not dilute
 * them). Lossless; the decoder checks sizes so a damaged frame is an error,
 * never an overrun.
 */
#include <stdbool.h>
#include <string.h>
#include <xxhash.h>
#ifdef LMS_HAVE_XXH_DISPATCH
#include <xxh_x86dispatch.h> /* XXH3 calls go through the library's AVX2 / AVX-512 dispatch */
#endif
#include <zstd.h>

#include "kvcache/kv_codec.h"

const char *lms_kv_codec_name(lms_kv_codec c)
{
    switch (c) {
    case LMS_KV_CODEC_RAW: return "raw";
    case LMS_KV_CODEC_ZSTD: return "zstd";
    case LMS_KV_CODEC_SHUFFLE_ZSTD: return "shuffle-zstd";
    case LMS_KV_CODEC_AUTO: return "auto";
    default: return NULL;
    }
}

int lms_kv_codec_from_name(const char *name, lms_kv_codec *out)
{
    for (int c = 0; c <= LMS_KV_CODEC_AUTO; c++)
        if (name && !strcmp(name, lms_kv_codec_name((lms_kv_codec)c))) {
            *out = (lms_kv_codec)c;
            return 0;
        }
    return lms__err(LMS_EINVAL, "unknown KV codec '%s' (raw, zstd, shuffle-zstd, auto)", name ? name : "");
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

size_t lms__kv_encode_bound(size_t raw_len) { return ZSTD_compressBound(raw_len) + 4 + 4 * 8; }

/*
 * Shuffle + zstd frame: a plane table, then the planes.
 *   u8 es, u8[3] zero, then es x u32: bit 31 set = the plane is a zstd frame,
 *   bits 0..30 = its stored length; then the planes in order.
 * Each plane is compressed on its own and kept raw when zstd saves under
 * 1/32 of it: the noisy low mantissa bytes of 16-bit floats then cost a
 * memcpy on both sides instead of entropy coding that gains nothing.
 */
#define PLANE_ZSTD 0x80000000u

static size_t shuffle_header(size_t es) { return 4 + 4 * es; }

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
    if (codec == LMS_KV_CODEC_ZSTD) {
        size_t r = ZSTD_compressCCtx(c->cctx, out, cap, raw, n, level);
        if (ZSTD_isError(r))
            return lms__err(LMS_EIO, "KV encode: zstd: %s", ZSTD_getErrorName(r));
        *out_len = r;
        return 0;
    }
    if (es < 2 || es > 8 || n % es || cap < shuffle_header(es) + n)
        return lms__err(LMS_EINVAL, "KV encode: bad shuffle geometry");
    size_t count = n / es, o = shuffle_header(es);
    lms__kv_shuffle(c->scratch, raw, n, es);
    memset(out, 0, 4);
    out[0] = (uint8_t)es;
    for (size_t b = 0; b < es; b++) {
        const uint8_t *plane = c->scratch + b * count;
        size_t r = (size_t)-1;
        /* A plane whose first 16 KiB do not compress (mantissa noise) is
         * kept raw without compressing the rest: saves the encoder half its
         * work on 16-bit K/V. Deterministic: the same bytes, the same choice. */
        bool try_it = true;
        if (count >= 8 * 16384) {
            size_t t = ZSTD_compressCCtx(c->cctx, out + o, cap - o, plane, 16384, level);
            try_it = !ZSTD_isError(t) && t < 16384 - 16384 / 32;
        }
        if (try_it)
            r = ZSTD_compressCCtx(c->cctx, out + o, cap - o, plane, count, level);
        uint32_t word;
        if (try_it && !ZSTD_isError(r) && r < count - count / 32) {
            word = PLANE_ZSTD | (uint32_t)r;
        } else {
            if (cap - o < count)
                return lms__err(LMS_ERANGE, "KV encode: buffer too small");
            memcpy(out + o, plane, count);
            r = count;
            word = (uint32_t)count;
        }
        lms__put_u32(out + 4 + 4 * b, word);
        o += r;
    }
    *out_len = o;
    return 0;
}

int lms__kv_decode(lms__kv_codec_ctx *c, int codec, const uint8_t *in, size_t in_len, uint8_t *out, size_t n,
                   size_t es, uint64_t *hash)
{
    if (codec == LMS_KV_CODEC_RAW) {
        if (in_len != n)
            return LMS_ECORRUPT;
        memcpy(out, in, n);
        if (hash)
            *hash = XXH3_64bits(out, n);
        return 0;
    }
    if (codec != LMS_KV_CODEC_ZSTD && codec != LMS_KV_CODEC_SHUFFLE_ZSTD)
        return LMS_ECORRUPT;
    if (!c->dctx && !(c->dctx = ZSTD_createDCtx()))
        return LMS_ENOMEM;
    if (codec == LMS_KV_CODEC_ZSTD) {
        size_t r = ZSTD_decompressDCtx(c->dctx, out, n, in, in_len);
        if (ZSTD_isError(r) || r != n)
            return LMS_ECORRUPT;
        if (hash)
            *hash = XXH3_64bits(out, n);
        return 0;
    }
    if (es < 2 || es > 8 || n % es || in_len < shuffle_header(es) || in[0] != es)
        return LMS_ECORRUPT;
    size_t count = n / es, o = shuffle_header(es);
    const uint8_t *planes[8];
    for (size_t b = 0; b < es; b++) {
        uint32_t word = lms__get_u32(in + 4 + 4 * b);
        size_t len = word & ~PLANE_ZSTD;
        if (len > in_len - o)
            return LMS_ECORRUPT;
        if (word & PLANE_ZSTD) {
            size_t r = ZSTD_decompressDCtx(c->dctx, c->scratch + b * count, count, in + o, len);
            if (ZSTD_isError(r) || r != count)
                return LMS_ECORRUPT;
            planes[b] = c->scratch + b * count;
        } else {
            if (len != count)
                return LMS_ECORRUPT;
            planes[b] = in + o;
        }
        o += len;
    }
    if (o != in_len)
        return LMS_ECORRUPT;
    if (es == 2 && ((uintptr_t)out & 1) == 0) {
        /* Interleave and hash in cache-sized chunks: one pass over the output. */
        const uint8_t *lo = planes[0], *hi = planes[1];
        uint16_t *d = (uint16_t *)(void *)out;
        if (hash && !c->hstate && !(c->hstate = XXH3_createState()))
            return LMS_ENOMEM;
        if (hash)
            XXH3_64bits_reset(c->hstate);
        for (size_t i0 = 0; i0 < count; i0 += 16384) {
            size_t i1 = LMS_MIN(count, i0 + 16384);
            for (size_t i = i0; i < i1; i++)
                d[i] = (uint16_t)(lo[i] | (hi[i] << 8));
            if (hash)
                XXH3_64bits_update(c->hstate, d + i0, (i1 - i0) * 2);
        }
        if (hash)
            *hash = XXH3_64bits_digest(c->hstate);
        return 0;
    }
    for (size_t b = 0; b < es; b++)
        for (size_t i = 0; i < count; i++)
            out[i * es + b] = planes[b][i];
    if (hash)
        *hash = XXH3_64bits(out, n);
    return 0;
}

int lms__kv_hash_begin(lms__kv_codec_ctx *c)
{
    if (!c->hstate && !(c->hstate = XXH3_createState()))
        return lms__err(LMS_ENOMEM, "out of memory creating a hash state");
    XXH3_64bits_reset(c->hstate);
    return 0;
}

void lms__kv_hash_update(lms__kv_codec_ctx *c, const void *p, size_t n) { XXH3_64bits_update(c->hstate, p, n); }

uint64_t lms__kv_hash_end(lms__kv_codec_ctx *c) { return XXH3_64bits_digest(c->hstate); }

void lms__kv_codec_ctx_free(lms__kv_codec_ctx *c)
{
    if (!c)
        return;
    ZSTD_freeCCtx(c->cctx);
    ZSTD_freeDCtx(c->dctx);
    XXH3_freeState(c->hstate);
    lms__free(c->scratch);
    memset(c, 0, sizeof *c);
}
