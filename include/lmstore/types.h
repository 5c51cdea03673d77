/*
 * lmstore/types.h - the few types every public header shares: element
 * dtypes, the largest tensor rank, the model id length, the opaque handles,
 * and LMS_API, the mark of a function the shared library exports.
 *
 * Stable: everything here is part of the public API.
 */
#ifndef LMSTORE_TYPES_H
#define LMSTORE_TYPES_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Functions of the public API are exported from liblmstore.so; everything
 * else is hidden (the library is built with -fvisibility=hidden). */
#if defined(__GNUC__) || defined(__clang__)
#define LMS_API __attribute__((visibility("default")))
#else
#define LMS_API
#endif

/* Opaque handles (store.h, loader.h, kvcache.h, engine.h, tokenizer.h). */
typedef struct lms_store lms_store;
typedef struct lms_device lms_device;
typedef struct lms_model lms_model;

/* ---- dtypes ------------------------------------------------------------------
 *
 * Plain element types (the safetensors names), then quantized encodings:
 * GGUF block types (the block layouts of ggml, untouched: a row of n
 * elements is n / block_elems blocks of block_bytes bytes) and MLX's affine
 * encoding (MLX_AFFINE: `bits`-bit codes packed little-endian into 32-bit
 * words along each row, with per-group scales and biases held by two more
 * tensors named like the weight: X.weight, X.scales, X.biases). Codes are
 * stored on disk (docs/FORMAT.md): values never change, new ones are
 * appended, and each stays below 32 (the models record's dtype mask has 32
 * bits).
 */
typedef enum lms_dtype {
    LMS_DTYPE_BOOL = 0,
    LMS_DTYPE_U8, LMS_DTYPE_I8,
    LMS_DTYPE_U16, LMS_DTYPE_I16, LMS_DTYPE_F16, LMS_DTYPE_BF16,
    LMS_DTYPE_U32, LMS_DTYPE_I32, LMS_DTYPE_F32,
    LMS_DTYPE_U64, LMS_DTYPE_I64, LMS_DTYPE_F64,
    LMS_DTYPE_F8_E4M3, LMS_DTYPE_F8_E5M2,
    /* GGUF block types: elements per block / bytes per block */
    LMS_DTYPE_Q4_0,  /* 15:  32 / 18  */
    LMS_DTYPE_Q4_1,  /* 16:  32 / 20  */
    LMS_DTYPE_Q5_0,  /* 17:  32 / 22  */
    LMS_DTYPE_Q5_1,  /* 18:  32 / 24  */
    LMS_DTYPE_Q8_0,  /* 19:  32 / 34  */
    LMS_DTYPE_Q2_K,  /* 20: 256 / 84  */
    LMS_DTYPE_Q3_K,  /* 21: 256 / 110 */
    LMS_DTYPE_Q4_K,  /* 22: 256 / 144 */
    LMS_DTYPE_Q5_K,  /* 23: 256 / 176 */
    LMS_DTYPE_Q6_K,  /* 24: 256 / 210 */
    LMS_DTYPE_Q8_K,  /* 25: 256 / 292 */
    /* MLX affine: bits (2, 3, 4, 5, 6 or 8) and group size (32, 64 or 128) per tensor */
    LMS_DTYPE_MLX_AFFINE, /* 26 */
    LMS_DTYPE_COUNT_
} lms_dtype;

/* "BF16", "Q4_K", "MLX_AFFINE", ... ; NULL for an unknown value. */
LMS_API const char *lms_dtype_name(lms_dtype t);
/* Bytes per element of a plain dtype; 0 for an unknown value and for the
 * quantized encodings (whose sizes come from blocks: lms_dtype_nbytes). */
LMS_API size_t lms_dtype_size(lms_dtype t);
/* LMS_EFORMAT for a name this build does not know (any dtype name above). */
LMS_API int lms_dtype_from_name(const char *name, lms_dtype *out);
/* True for the GGUF block types and MLX_AFFINE. */
LMS_API bool lms_dtype_is_quantized(lms_dtype t);
/* Elements and bytes of one block: (1, element size) for plain dtypes,
 * the ggml block for GGUF types, (32, 4 x bits) for MLX_AFFINE (32 codes
 * fill `bits` 32-bit words); (0, 0) for an unknown dtype, or for MLX_AFFINE
 * with bits it does not have. `bits` is ignored except for MLX_AFFINE. */
LMS_API uint32_t lms_dtype_block_elems(lms_dtype t, uint32_t bits);
LMS_API uint32_t lms_dtype_block_bytes(lms_dtype t, uint32_t bits);
/*
 * Bytes of a tensor of `shape` (ndim dimensions, outermost first) in dtype
 * t: product(shape) x element size for plain dtypes; for quantized ones the
 * innermost dimension must be a whole number of blocks (a scalar cannot be
 * quantized). Errors: LMS_EINVAL (unknown dtype or bits, innermost
 * dimension not a whole number of blocks; the detail says which),
 * LMS_ERANGE (the size overflows 64 bits).
 */
LMS_API int lms_dtype_nbytes(lms_dtype t, uint32_t bits, const uint64_t *shape, uint32_t ndim, uint64_t *out);

#define LMS_MAX_DIMS 8
#define LMS_MODEL_ID_LEN 16 /* bytes of a model id (XXH3-128) */

#ifdef __cplusplus
}
#endif
#endif
