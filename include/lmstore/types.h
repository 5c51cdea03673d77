/*
 * lmstore/types.h - the few types every public header shares: element
 * dtypes, the largest tensor rank, the model id length, the opaque handles,
 * and LMS_API, the mark of a function the shared library exports.
 *
 * Stable: everything here is part of the public API.
 */
#ifndef LMSTORE_TYPES_H
#define LMSTORE_TYPES_H

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

/* ---- dtypes (safetensors names) ----------------------------------------- */

typedef enum lms_dtype {
    LMS_DTYPE_BOOL = 0,
    LMS_DTYPE_U8, LMS_DTYPE_I8,
    LMS_DTYPE_U16, LMS_DTYPE_I16, LMS_DTYPE_F16, LMS_DTYPE_BF16,
    LMS_DTYPE_U32, LMS_DTYPE_I32, LMS_DTYPE_F32,
    LMS_DTYPE_U64, LMS_DTYPE_I64, LMS_DTYPE_F64,
    LMS_DTYPE_F8_E4M3, LMS_DTYPE_F8_E5M2,
    LMS_DTYPE_COUNT_
} lms_dtype;

/* "BF16", ... ; NULL for an unknown value. */
LMS_API const char *lms_dtype_name(lms_dtype t);
/* bytes per element; 0 for an unknown value. */
LMS_API size_t lms_dtype_size(lms_dtype t);
/* LMS_EFORMAT for a name safetensors does not define. */
LMS_API int lms_dtype_from_name(const char *name, lms_dtype *out);

#define LMS_MAX_DIMS 8
#define LMS_MODEL_ID_LEN 16 /* bytes of a model id (XXH3-128) */

#ifdef __cplusplus
}
#endif
#endif
