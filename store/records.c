/*
 * store/records.c - encoders and decoders of the index records (blobs,
 * tensors, models, files) described in docs/FORMAT.md "Records".
 *
 * Pure functions over bytes: decoders treat their input as untrusted (a
 * fuzzer calls them directly) and check every length before reading.
 */
#include <stdlib.h>
#include <string.h>
#include <zstd.h>

#include "quant/quant.h"
#include "store/store_internal.h"

#define REC_V1 1u
#define TENSOR_REC_V2 2u /* tensor records of quantized dtypes */

static int bad(const char *what, const char *why)
{
    return lms__err(LMS_ECORRUPT, "%s record: %s", what, why);
}

static int check_version(const uint8_t *p, size_t len, const char *what)
{
    if (len < 2)
        return bad(what, "shorter than its version field");
    uint16_t v = lms__get_u16(p);
    if (v == 0)
        return bad(what, "version 0");
    if (v > REC_V1)
        return lms__err(LMS_EVERSION, "%s record: version %u is newer than this build (%u)", what, v, REC_V1);
    return 0;
}

/* ---- blobs -------------------------------------------------------------------- */

void lms__blob_rec_encode(const lms__blob_rec *r, uint8_t out[LMS__BLOB_REC_SIZE])
{
    lms__put_u16(out, REC_V1);
    lms__put_u16(out + 2, r->kind);
    lms__put_u32(out + 4, r->segment);
    lms__put_u64(out + 8, r->offset);
    lms__put_u64(out + 16, r->size);
    lms__put_u64(out + 24, r->refs);
}

int lms__blob_rec_decode(const void *buf, size_t len, lms__blob_rec *r)
{
    const uint8_t *p = buf;
    int rc = check_version(p, len, "blob");
    if (rc)
        return rc;
    if (len != LMS__BLOB_REC_SIZE)
        return bad("blob", "wrong length");
    r->kind = lms__get_u16(p + 2);
    r->segment = lms__get_u32(p + 4);
    r->offset = lms__get_u64(p + 8);
    r->size = lms__get_u64(p + 16);
    r->refs = lms__get_u64(p + 24);
    uint64_t end;
    if (r->kind > LMS__BLOB_KVPAGE)
        return bad("blob", "unknown kind");
    if (r->offset < LMS__SEG_HEADER_SIZE || lms__add_overflow(r->offset, r->size, &end))
        return bad("blob", "offset out of range");
    return 0;
}

/* ---- tensors ------------------------------------------------------------------ */

size_t lms__tensor_rec_size(uint32_t ndim) { return LMS__TENSOR_REC_FIXED + 8 * (size_t)ndim; }

size_t lms__tensor_rec_encode(const lms__tensor_rec *r, uint8_t *out)
{
    bool quant = lms_dtype_is_quantized(r->dtype);
    lms__put_u16(out, quant ? TENSOR_REC_V2 : REC_V1);
    out[2] = (uint8_t)r->dtype;
    out[3] = (uint8_t)r->ndim;
    lms__put_u32(out + 4, (uint32_t)r->layer);
    lms__put_u32(out + 8, r->order);
    out[12] = quant ? (uint8_t)r->bits : 0;
    out[13] = 0;
    lms__put_u16(out + 14, quant ? (uint16_t)r->group : 0);
    lms__put_u64(out + 16, r->nbytes);
    memcpy(out + 24, r->hash, 16);
    for (uint32_t i = 0; i < r->ndim; i++)
        lms__put_u64(out + 40 + 8 * i, r->shape[i]);
    return lms__tensor_rec_size(r->ndim);
}

int lms__tensor_rec_decode(const void *buf, size_t len, lms__tensor_rec *r)
{
    const uint8_t *p = buf;
    if (len < 2)
        return bad("tensor", "shorter than its version field");
    uint16_t v = lms__get_u16(p);
    if (v == 0)
        return bad("tensor", "version 0");
    if (v > TENSOR_REC_V2)
        return lms__err(LMS_EVERSION, "tensor record: version %u is newer than this build (%u)", v, TENSOR_REC_V2);
    if (len < LMS__TENSOR_REC_FIXED)
        return bad("tensor", "too short");
    memset(r, 0, sizeof *r);
    r->dtype = (lms_dtype)p[2];
    r->ndim = p[3];
    if (p[2] >= LMS_DTYPE_COUNT_)
        return bad("tensor", "unknown dtype");
    bool quant = lms_dtype_is_quantized(r->dtype);
    if (quant != (v == TENSOR_REC_V2))
        return bad("tensor", quant ? "quantized dtype in a version 1 record" : "plain dtype in a version 2 record");
    if (r->ndim > LMS_MAX_DIMS)
        return bad("tensor", "more than 8 dimensions");
    if (len != lms__tensor_rec_size(r->ndim))
        return bad("tensor", "wrong length");
    r->layer = (int32_t)lms__get_u32(p + 4);
    r->order = lms__get_u32(p + 8);
    r->bits = p[12];
    r->group = lms__get_u16(p + 14);
    if (p[13] != 0 || (!quant && lms__get_u32(p + 12) != 0))
        return bad("tensor", "reserved bytes are not zero");
    if (r->dtype == LMS_DTYPE_MLX_AFFINE) {
        if (!lms__mlx_bits_ok(r->bits) || !lms__mlx_group_ok(r->group))
            return bad("tensor", "MLX_AFFINE bits or group size out of range");
    } else if (r->bits || r->group) {
        return bad("tensor", "quantization parameters on a dtype without them");
    }
    r->nbytes = lms__get_u64(p + 16);
    memcpy(r->hash, p + 24, 16);
    for (uint32_t i = 0; i < r->ndim; i++)
        r->shape[i] = lms__get_u64(p + 40 + 8 * i);
    if (r->dtype == LMS_DTYPE_MLX_AFFINE && (r->ndim == 0 || r->shape[r->ndim - 1] % r->group))
        return bad("tensor", "MLX_AFFINE row is not a whole number of groups");
    uint64_t n;
    if (lms_dtype_nbytes(r->dtype, r->bits, r->shape, r->ndim, &n) || n != r->nbytes)
        return bad("tensor", "byte size does not match shape and dtype");
    return 0;
}

/* ---- model id ---------------------------------------------------------------- */

static int cmp_id_tensor(const void *a, const void *b)
{
    return strcmp(((const lms__id_tensor *)a)->name, ((const lms__id_tensor *)b)->name);
}

int lms__model_id(const void *config, size_t config_len, lms__id_tensor *t, size_t n, uint8_t out[16])
{
    lms_hasher *h = lms__hasher_new();
    uint8_t b[16];
    if (!h)
        return LMS_ENOMEM;
    if (n)
        qsort(t, n, sizeof *t, cmp_id_tensor);
    lms__hasher_update(h, "lmstore-model-v1", 16);
    lms__put_u64(b, config ? config_len : 0);
    lms__hasher_update(h, b, 8);
    if (config)
        lms__hasher_update(h, config, config_len);
    for (size_t k = 0; k < n; k++) {
        const lms__tensor_rec *r = t[k].rec;
        uint32_t nl = (uint32_t)strlen(t[k].name);
        lms__put_u32(b, nl);
        lms__hasher_update(h, b, 4);
        lms__hasher_update(h, t[k].name, nl);
        b[0] = (uint8_t)r->dtype;
        b[1] = (uint8_t)r->ndim;
        lms__hasher_update(h, b, 2);
        if (r->dtype == LMS_DTYPE_MLX_AFFINE) { /* only for MLX_AFFINE: older ids stay */
            b[0] = (uint8_t)r->bits;
            lms__put_u16(b + 1, (uint16_t)r->group);
            lms__hasher_update(h, b, 3);
        }
        for (uint32_t d = 0; d < r->ndim; d++) {
            lms__put_u64(b, r->shape[d]);
            lms__hasher_update(h, b, 8);
        }
        lms__put_u64(b, r->nbytes);
        lms__hasher_update(h, b, 8);
        lms__hasher_update(h, r->hash, 16);
    }
    lms__hash128_put(out, lms__hasher_digest(h));
    lms__hasher_free(h);
    return 0;
}

/* ---- models ------------------------------------------------------------------- */

#define MODEL_FIXED 72

int lms__model_rec_encode(const lms__model_rec *r, uint8_t **out, size_t *len)
{
    size_t n = MODEL_FIXED + (size_t)r->arch_len + r->source_len + r->st_meta_len;
    uint8_t *p = lms__malloc(n);
    if (!p)
        return LMS_ENOMEM;
    lms__put_u16(p, REC_V1);
    lms__put_u16(p + 2, 0);
    lms__put_u32(p + 4, r->dtype_mask);
    memcpy(p + 8, r->id, 16);
    lms__put_u64(p + 24, r->created);
    lms__put_u64(p + 32, r->n_tensors);
    lms__put_u64(p + 40, r->n_params);
    lms__put_u64(p + 48, r->tensor_bytes);
    lms__put_u32(p + 56, r->n_files);
    lms__put_u32(p + 60, r->arch_len);
    lms__put_u32(p + 64, r->source_len);
    lms__put_u32(p + 68, r->st_meta_len);
    uint8_t *q = p + MODEL_FIXED;
    if (r->arch_len) memcpy(q, r->arch, r->arch_len);
    q += r->arch_len;
    if (r->source_len) memcpy(q, r->source, r->source_len);
    q += r->source_len;
    if (r->st_meta_len) memcpy(q, r->st_meta, r->st_meta_len);
    *out = p;
    *len = n;
    return 0;
}

int lms__model_rec_decode(const void *buf, size_t len, lms__model_rec *r)
{
    const uint8_t *p = buf;
    int rc = check_version(p, len, "model");
    if (rc)
        return rc;
    if (len < MODEL_FIXED)
        return bad("model", "too short");
    memset(r, 0, sizeof *r);
    r->dtype_mask = lms__get_u32(p + 4);
    memcpy(r->id, p + 8, 16);
    r->created = lms__get_u64(p + 24);
    r->n_tensors = lms__get_u64(p + 32);
    r->n_params = lms__get_u64(p + 40);
    r->tensor_bytes = lms__get_u64(p + 48);
    r->n_files = lms__get_u32(p + 56);
    r->arch_len = lms__get_u32(p + 60);
    r->source_len = lms__get_u32(p + 64);
    r->st_meta_len = lms__get_u32(p + 68);
    uint64_t need = MODEL_FIXED + (uint64_t)r->arch_len + r->source_len + r->st_meta_len;
    if (need != len)
        return bad("model", "string lengths do not match the record length");
    r->arch = (const char *)p + MODEL_FIXED;
    r->source = r->arch + r->arch_len;
    r->st_meta = r->source + r->source_len;
    return 0;
}

/* ---- files -------------------------------------------------------------------- */

int lms__file_rec_encode(const void *raw, size_t raw_len, int zstd_level, uint8_t **out, size_t *len)
{
    size_t bound = ZSTD_compressBound(raw_len);
    uint8_t *p = lms__malloc(LMS__FILE_REC_FIXED + bound);
    if (!p)
        return LMS_ENOMEM;
    size_t z = ZSTD_compress(p + LMS__FILE_REC_FIXED, bound, raw, raw_len, zstd_level);
    if (ZSTD_isError(z)) {
        lms__free(p);
        return lms__err(LMS_EINVAL, "zstd: %s", ZSTD_getErrorName(z));
    }
    lms__put_u16(p, REC_V1);
    lms__put_u16(p + 2, LMS__CODEC_ZSTD);
    lms__put_u32(p + 4, 0);
    lms__put_u64(p + 8, raw_len);
    lms__put_u64(p + 16, lms__hash64(raw, raw_len, 0));
    *out = p;
    *len = LMS__FILE_REC_FIXED + z;
    return 0;
}

int lms__file_rec_decode(const void *buf, size_t len, lms__file_rec *r)
{
    const uint8_t *p = buf;
    int rc = check_version(p, len, "file");
    if (rc)
        return rc;
    if (len < LMS__FILE_REC_FIXED)
        return bad("file", "too short");
    r->codec = lms__get_u16(p + 2);
    if (r->codec > LMS__CODEC_ZSTD)
        return bad("file", "unknown codec");
    r->raw_size = lms__get_u64(p + 8);
    r->raw_hash = lms__get_u64(p + 16);
    r->payload = p + LMS__FILE_REC_FIXED;
    r->payload_len = len - LMS__FILE_REC_FIXED;
    if (r->codec == LMS__CODEC_RAW && r->raw_size != r->payload_len)
        return bad("file", "raw size does not match the payload");
    if (r->raw_size > (1ull << 40))
        return bad("file", "raw size out of range");
    return 0;
}

int lms__file_rec_inflate(const lms__file_rec *r, const char *what, char **data, size_t *len)
{
    *data = NULL;
    /* Bound what the record claims before allocating for it: a damaged
     * record is LMS_ECORRUPT, never an allocation of its claimed size. */
    if (r->raw_size > LMS__FILE_RAW_MAX)
        return lms__err(LMS_ECORRUPT, "%s: record claims %llu bytes, more than the %u MiB limit of stored files", what,
                        (unsigned long long)r->raw_size, LMS__FILE_RAW_MAX >> 20);
    if (r->codec == LMS__CODEC_RAW) {
        if (r->payload_len != r->raw_size)
            return lms__err(LMS_ECORRUPT, "%s: record claims %llu bytes but holds %zu", what,
                            (unsigned long long)r->raw_size, r->payload_len);
    } else if (r->codec == LMS__CODEC_ZSTD) {
        unsigned long long fs = ZSTD_getFrameContentSize(r->payload, r->payload_len);
        if (fs == ZSTD_CONTENTSIZE_ERROR || fs == ZSTD_CONTENTSIZE_UNKNOWN)
            return lms__err(LMS_ECORRUPT, "%s: stored zstd frame has %s", what,
                            fs == ZSTD_CONTENTSIZE_ERROR ? "a damaged header" : "no content size");
        if (fs != r->raw_size)
            return lms__err(LMS_ECORRUPT, "%s: stored frame holds %llu bytes, the record claims %llu", what, fs,
                            (unsigned long long)r->raw_size);
    } else {
        return lms__err(LMS_ECORRUPT, "%s: record has unknown codec %u", what, (unsigned)r->codec);
    }
    char *buf = lms__malloc((size_t)r->raw_size + 1);
    if (!buf)
        return LMS_ENOMEM;
    if (r->codec == LMS__CODEC_RAW) {
        memcpy(buf, r->payload, r->payload_len);
    } else {
        size_t z = ZSTD_decompress(buf, (size_t)r->raw_size, r->payload, r->payload_len);
        if (ZSTD_isError(z) || z != r->raw_size) {
            lms__free(buf);
            return lms__err(LMS_ECORRUPT, "%s: stored frame is corrupt (%s)", what,
                            ZSTD_isError(z) ? ZSTD_getErrorName(z) : "short");
        }
    }
    if (lms__hash64(buf, (size_t)r->raw_size, 0) != r->raw_hash) {
        lms__free(buf);
        return lms__err(LMS_ECORRUPT, "%s: stored bytes fail their checksum", what);
    }
    buf[r->raw_size] = '\0';
    *data = buf;
    if (len)
        *len = (size_t)r->raw_size;
    return 0;
}
