/*
 * common/hash.c - XXH3 (64 and 128 bit) from libxxhash: content addresses of
 * blobs and KV pages, checksums of records.
 */
#include <stdio.h>
#include <xxhash.h>
#ifdef LMS_HAVE_XXH_DISPATCH
#include <xxh_x86dispatch.h> /* XXH3 calls go through the library's AVX2 / AVX-512 dispatch */
#endif

#include "common.h"

uint64_t lms__hash64(const void *p, size_t n, uint64_t seed) { return XXH3_64bits_withSeed(p, n, seed); }

lms_hash128 lms__hash128(const void *p, size_t n)
{
    XXH128_hash_t h = XXH3_128bits(p, n);
    return (lms_hash128){h.low64, h.high64};
}

bool lms__hash128_eq(lms_hash128 a, lms_hash128 b) { return a.lo == b.lo && a.hi == b.hi; }

void lms__hash128_put(uint8_t out[16], lms_hash128 h)
{
    lms__put_u64(out, h.lo);
    lms__put_u64(out + 8, h.hi);
}

lms_hash128 lms__hash128_get(const uint8_t in[16]) { return (lms_hash128){lms__get_u64(in), lms__get_u64(in + 8)}; }

void lms__hash128_hex(lms_hash128 h, char out[33])
{
    snprintf(out, 33, "%016llx%016llx", (unsigned long long)h.hi, (unsigned long long)h.lo);
}

struct lms_hasher {
    XXH3_state_t *st;
};

lms_hasher *lms__hasher_new(void)
{
    lms_hasher *h = lms__malloc(sizeof *h);
    if (!h)
        return NULL;
    h->st = XXH3_createState();
    if (!h->st) {
        lms__free(h);
        lms__err(LMS_ENOMEM, "out of memory creating a hash state");
        return NULL;
    }
    XXH3_128bits_reset(h->st);
    return h;
}

void lms__hasher_reset(lms_hasher *h) { XXH3_128bits_reset(h->st); }
void lms__hasher_update(lms_hasher *h, const void *p, size_t n) { XXH3_128bits_update(h->st, p, n); }

lms_hash128 lms__hasher_digest(const lms_hasher *h)
{
    XXH128_hash_t d = XXH3_128bits_digest(h->st);
    return (lms_hash128){d.low64, d.high64};
}

void lms__hasher_free(lms_hasher *h)
{
    if (!h)
        return;
    XXH3_freeState(h->st);
    lms__free(h);
}
