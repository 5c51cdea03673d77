/*
 * tests/fuzz/fuzz_records.c - libFuzzer target for the index record
 * decoders (store/records.c): blob, tensor, model and file records, which
 * verify, gc and every reader decode from an LMDB file that may be damaged,
 * and the decoders of saved KV caches (kvpages and sessions records,
 * store/kv_records.c).
 * The first input byte picks the decoder, the rest is the record. Whatever
 * decodes must also survive a round trip: encode(decode(x)) decodes to the
 * same fields (and, for fixed-layout records, gives back the same bytes).
 */
#include <assert.h>
#include <stdint.h>
#include <string.h>

#include "store/kv_records.h"
#include "store/store_internal.h"

static void blob(const uint8_t *p, size_t n)
{
    lms__blob_rec r, r2;
    if (lms__blob_rec_decode(p, n, &r))
        return;
    uint8_t enc[LMS__BLOB_REC_SIZE];
    lms__blob_rec_encode(&r, enc);
    assert(memcmp(enc, p, LMS__BLOB_REC_SIZE) == 0);
    assert(lms__blob_rec_decode(enc, sizeof enc, &r2) == 0);
    assert(r2.kind == r.kind && r2.segment == r.segment && r2.offset == r.offset && r2.size == r.size &&
           r2.refs == r.refs);
}

static void tensor(const uint8_t *p, size_t n)
{
    lms__tensor_rec r, r2;
    if (lms__tensor_rec_decode(p, n, &r))
        return;
    assert(r.ndim <= LMS_MAX_DIMS);
    uint8_t enc[LMS__TENSOR_REC_FIXED + 8 * LMS_MAX_DIMS];
    size_t len = lms__tensor_rec_encode(&r, enc);
    assert(len == n);
    assert(lms__tensor_rec_decode(enc, len, &r2) == 0);
    assert(r2.dtype == r.dtype && r2.ndim == r.ndim && r2.nbytes == r.nbytes && r2.layer == r.layer &&
           r2.order == r.order && memcmp(r2.hash, r.hash, 16) == 0);
    for (uint32_t i = 0; i < r.ndim; i++)
        assert(r2.shape[i] == r.shape[i]);
}

static void model(const uint8_t *p, size_t n)
{
    lms__model_rec r, r2;
    if (lms__model_rec_decode(p, n, &r))
        return;
    /* the strings must lie inside the input */
    assert((const uint8_t *)r.arch >= p && (const uint8_t *)r.st_meta + r.st_meta_len <= p + n);
    uint8_t *enc = NULL;
    size_t len = 0;
    if (lms__model_rec_encode(&r, &enc, &len))
        return;
    assert(len == n);
    assert(lms__model_rec_decode(enc, len, &r2) == 0);
    assert(memcmp(r2.id, r.id, 16) == 0 && r2.n_tensors == r.n_tensors && r2.tensor_bytes == r.tensor_bytes &&
           r2.arch_len == r.arch_len && memcmp(r2.arch, r.arch, r.arch_len) == 0 &&
           r2.source_len == r.source_len && memcmp(r2.source, r.source, r.source_len) == 0 &&
           r2.st_meta_len == r.st_meta_len && memcmp(r2.st_meta, r.st_meta, r.st_meta_len) == 0);
    lms__free(enc);
}

static void file(const uint8_t *p, size_t n)
{
    lms__file_rec r;
    if (lms__file_rec_decode(p, n, &r))
        return;
    assert(r.payload >= p && r.payload + r.payload_len <= p + n);
    /* inflate bounds the size the record claims before allocating */
    char *data = NULL;
    size_t len = 0;
    if (lms__file_rec_inflate(&r, "fuzz", &data, &len) == 0) {
        assert(len == r.raw_size && data[len] == '\0');
        assert(lms__hash64(data, len, 0) == r.raw_hash);
        lms__free(data);
    }
}

static void kvpage(const uint8_t *p, size_t n)
{
    lms__kvpage_rec r, r2;
    if (lms__kvpage_rec_decode(p, n, &r))
        return;
    uint8_t enc[LMS__KVPAGE_REC_SIZE];
    lms__kvpage_rec_encode(&r, enc);
    assert(lms__kvpage_rec_decode(enc, sizeof enc, &r2) == 0);
    assert(r2.codec == r.codec && r2.raw_size == r.raw_size && r2.stored_size == r.stored_size &&
           r2.raw_hash == r.raw_hash && memcmp(r2.blob, r.blob, 16) == 0);
}

static void session(const uint8_t *p, size_t n)
{
    lms__session_rec r, r2;
    if (lms__session_rec_decode(p, n, "fuzz", &r))
        return;
    assert(r.tokens >= p && r.page_keys >= p && r.page_keys + 16 * (size_t)lms__session_n_keys(&r) <= p + n);
    size_t len = lms__session_rec_size(&r);
    assert(len == n);
    uint8_t *enc = lms__malloc(len);
    if (!enc)
        return;
    assert(lms__session_rec_encode(&r, enc) == len);
    assert(lms__session_rec_decode(enc, len, "fuzz", &r2) == 0);
    assert(r2.n_tokens == r.n_tokens && r2.n_pages == r.n_pages && r2.window == r.window &&
           r2.n_window_pages == r.n_window_pages &&
           memcmp(r2.page_keys, r.page_keys, 16 * (size_t)lms__session_n_keys(&r)) == 0 &&
           memcmp(r2.tokens, r.tokens, 4 * (size_t)r.n_tokens) == 0);
    lms__free(enc);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    if (size < 1)
        return 0;
    const uint8_t *p = data + 1;
    size_t n = size - 1;
    switch (data[0] % 6) {
    case 0: blob(p, n); break;
    case 1: tensor(p, n); break;
    case 2: model(p, n); break;
    case 3: file(p, n); break;
    case 4: kvpage(p, n); break;
    case 5: session(p, n); break;
    }
    return 0;
}
