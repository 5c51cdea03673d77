/*
 * lmstore/error.h - the one error convention of lmstore.
 *
 * Every action returns int: 0 on success, a negative LMS_E* code on failure.
 * lms_strerror(code) names the code; lms_last_error() gives the detail a user
 * needs (file, tensor, offset, session), set by the failing call on the
 * calling thread. Predicates return bool. Pointer-returning lookups return
 * NULL and set the detail.
 */
#ifndef LMSTORE_ERROR_H
#define LMSTORE_ERROR_H

#include "lmstore/types.h" /* LMS_API */

#ifdef __cplusplus
extern "C" {
#endif

enum lms_error {
    LMS_OK = 0,
    LMS_EINVAL = -1,      /* bad argument from the caller */
    LMS_ENOMEM = -2,      /* allocation failed */
    LMS_EIO = -3,         /* read, write, fsync, mmap failed */
    LMS_ENOENT = -4,      /* no such file, model, tensor or session */
    LMS_EEXIST = -5,      /* name already taken */
    LMS_EFORMAT = -6,     /* malformed input (safetensors, json, record) */
    LMS_ECORRUPT = -7,    /* stored data fails its checksum or invariants */
    LMS_EVERSION = -8,    /* unsupported format version */
    LMS_EBUSY = -9,       /* object still in use (live children, locks) */
    LMS_EUNSUPPORTED = -10, /* feature, dtype or architecture not supported */
    LMS_EMISMATCH = -11,  /* other model, other layout */
    LMS_ENOSPACE = -12,   /* budget exhausted (KV pages, map size) */
    LMS_EDEVICE = -13,    /* device (CUDA) error */
    LMS_EDB = -14,        /* LMDB error */
    LMS_ECANCELED = -15,  /* stopped by the caller (callback asked to stop) */
    LMS_ERANGE = -16,     /* value out of range, overflow */
};

/* Name of an error code ("invalid argument"); static storage, never NULL. */
LMS_API const char *lms_strerror(int code);

/*
 * Detail of the last failure on this thread, e.g.
 * "model-00002-of-00004.safetensors: tensor 'x' ends at byte 912 past the
 * data region (800 bytes)". Empty string when there is none. Valid until the
 * next lmstore call on this thread.
 */
LMS_API const char *lms_last_error(void);

/* Code of the last failure on this thread (0 if none). */
LMS_API int lms_last_error_code(void);

/* Forget the last error on this thread. */
LMS_API void lms_clear_error(void);

#ifdef __cplusplus
}
#endif
#endif
