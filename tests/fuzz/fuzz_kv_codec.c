/*
 * tests/fuzz/fuzz_kv_codec.c - libFuzzer target for the page decoder of
 * saved KV caches (lms__kv_decode, kvcache/kv_codec.c), which a resume runs
 * on the stored bytes of every page it reads from a segment that may be
 * damaged: raw, zstd and byte-shuffle + zstd frames.
 *
 * Input: byte 0 picks the codec (bits 0-1; 3 = shuffle-zstd again), the
 * element size (bit 2: 2 or 4 bytes), the mode (bit 3) and an odd output
 * address (bit 4, the decoder's unaligned path); bytes 1-2 are the page's
 * element count (little-endian); the rest is the payload.
 *   decode mode: the payload is a stored page. Decoding either fails with
 *     LMS_ECORRUPT / LMS_ENOMEM and nothing else, or gives exactly the
 *     page size with the checksum of what it wrote; such a page then
 *     survives encode -> decode with every codec.
 *   round-trip mode: the payload is a raw page (cut to whole elements);
 *     every codec must give it back byte for byte (zstd's round_trip
 *     targets).
 */
#include <assert.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "kvcache/kv_codec.h"

#define MAX_ELEMS 16384u /* elements of a page here: up to 64 KiB raw */

static uint8_t scratch[4 * MAX_ELEMS], out_mem[4 * MAX_ELEMS + 1], enc[4 * MAX_ELEMS + 1024],
    back[4 * MAX_ELEMS + 1];

static lms__kv_codec_ctx *ctx(void)
{
    static lms__kv_codec_ctx c; /* contexts live for the process, as a worker's do */
    c.scratch = scratch;
    return &c;
}

/* encode(page) with `codec`, decode again: the same bytes and checksum. */
static void round_trip(int codec, const uint8_t *page, size_t n, size_t es)
{
    size_t len = 0;
    assert(lms__kv_encode_bound(n) <= sizeof enc);
    if (lms__kv_encode(ctx(), codec, 1, page, n, es, enc, sizeof enc, &len) != 0) {
        assert(codec != LMS_KV_CODEC_RAW); /* raw always fits */
        return;                            /* out of memory in zstd: not a decoder matter */
    }
    uint64_t h = 0;
    int rc = lms__kv_decode(ctx(), codec, enc, len, back, n, es, &h);
    if (rc == LMS_ENOMEM)
        return;
    assert(rc == 0);
    assert(memcmp(back, page, n) == 0);
    assert(h == lms__hash64(page, n, 0));
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 3)
        return 0;
    int codec = data[0] & 3;
    if (codec == 3)
        codec = LMS_KV_CODEC_SHUFFLE_ZSTD;
    size_t es = (data[0] & 4) ? 4 : 2;
    bool trip = data[0] & 8, odd = data[0] & 16;
    size_t elems = (size_t)(data[1] | data[2] << 8) % (MAX_ELEMS + 1), n = elems * es;
    const uint8_t *payload = data + 3;
    size_t plen = size - 3;
    if (trip) {
        plen -= plen % es;
        if (plen > 4 * MAX_ELEMS)
            plen = 4 * MAX_ELEMS;
        for (int c = LMS_KV_CODEC_RAW; c <= LMS_KV_CODEC_SHUFFLE_ZSTD; c++)
            round_trip(c, payload, plen, es);
        return 0;
    }
    if (n == 0)
        return 0;
    uint8_t *out = out_mem + (odd ? 1 : 0);
    uint64_t h = 0;
    int rc = lms__kv_decode(ctx(), codec, payload, plen, out, n, es, &h);
    assert(rc == 0 || rc == LMS_ECORRUPT || rc == LMS_ENOMEM);
    if (rc)
        return 0;
    assert(h == lms__hash64(out, n, 0));
    if (codec == LMS_KV_CODEC_RAW)
        assert(plen == n && memcmp(out, payload, n) == 0);
    /* a page that decoded is a page: every codec stores it losslessly */
    static uint8_t page[4 * MAX_ELEMS];
    memcpy(page, out, n);
    for (int c = LMS_KV_CODEC_RAW; c <= LMS_KV_CODEC_SHUFFLE_ZSTD; c++)
        round_trip(c, page, n, es);
    return 0;
}
