/*
 * lmstore/store.h - the model store: an LMDB index plus aligned, append-only
 * segment files (docs/FORMAT.md is the normative spec of the bytes).
 *
 * A store is a folder, opened once per process and shared by every model
 * opened from it. Writers (import, rm, gc, kv save) serialize on LMDB's
 * writer lock; readers see consistent snapshots and never block writers.
 *
 * Lifetimes: strings and records passed to callbacks are valid only during
 * the callback. Buffers returned through `void **` are owned by the caller
 * and freed with lms_free().
 */
#ifndef LMSTORE_STORE_H
#define LMSTORE_STORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lmstore/error.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lms_store lms_store;

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
const char *lms_dtype_name(lms_dtype t);
/* bytes per element; 0 for an unknown value. */
size_t lms_dtype_size(lms_dtype t);
/* LMS_EFORMAT for a name safetensors does not define. */
int lms_dtype_from_name(const char *name, lms_dtype *out);

#define LMS_MAX_DIMS 8
#define LMS_MODEL_ID_LEN 16 /* bytes of a model id (XXH3-128) */

/* ---- opening --------------------------------------------------------------- */

enum lms_store_flags {
    LMS_STORE_RDONLY = 1 << 0, /* no writes; fails with LMS_ENOENT if absent */
    LMS_STORE_CREATE = 1 << 1, /* create the folder and an empty store if absent */
};

typedef struct lms_store_params {
    uint32_t alignment;    /* blob alignment for a new store; 0 = 4096. Power of 2, 64..2 MiB */
    uint64_t segment_max;  /* a segment is closed past this many bytes; 0 = 4 GiB */
} lms_store_params;

lms_store_params lms_store_default_params(void);

/*
 * Open the store in folder `path`. params may be NULL (defaults); they only
 * matter when a store is created. On failure *out is NULL and nothing needs
 * closing. Errors: LMS_ENOENT (no store and no LMS_STORE_CREATE),
 * LMS_EVERSION (format newer than this build), LMS_ECORRUPT, LMS_EDB, LMS_EIO.
 */
int lms_store_open(const char *path, unsigned flags, const lms_store_params *params, lms_store **out);

/*
 * Close the store. LMS_EBUSY (and nothing closed) while models opened from it
 * are still open. NULL is accepted.
 */
int lms_store_close(lms_store *store);

const char *lms_store_path(const lms_store *store);
uint32_t lms_store_alignment(const lms_store *store);

/* Free a buffer lmstore returned to the caller. NULL ok. */
void lms_free(void *p);

/* ---- import ------------------------------------------------------------------ */

typedef struct lms_import_params {
    const char *name;   /* model name; NULL = the source folder's (or file's) base name */
    bool replace;       /* replace a model of the same name (else LMS_EEXIST) */
    int threads;        /* hashing/copying threads; 0 = online CPUs */
    bool progress;      /* progress bar on stderr when it is a terminal */
} lms_import_params;

typedef struct lms_import_stats {
    uint64_t tensors;
    uint64_t bytes_total;   /* tensor bytes in the source */
    uint64_t bytes_written; /* tensor bytes appended to segments */
    uint64_t bytes_dedup;   /* tensor bytes found already stored */
    double seconds;
} lms_import_stats;

lms_import_params lms_import_default_params(void);

/*
 * Import a HuggingFace model folder (*.safetensors shards, optional
 * model.safetensors.index.json, config and tokenizer files) or one
 * .safetensors file. All-or-nothing: on failure the store is as before and
 * lms_last_error() names the file and tensor at fault. stats may be NULL.
 */
int lms_import(lms_store *store, const char *src, const lms_import_params *params, lms_import_stats *stats);

/* ---- reading the index ---------------------------------------------------------- */

typedef struct lms_model_info {
    const char *name;
    const char *architecture; /* config.json "architectures"[0] or model_type; "" if none */
    uint8_t id[LMS_MODEL_ID_LEN]; /* content hash over config + sorted tensor records */
    uint64_t n_tensors;
    uint64_t n_params;        /* sum of element counts */
    uint64_t tensor_bytes;    /* sum of tensor byte sizes */
    uint64_t created;         /* unix seconds */
    uint32_t dtype_mask;      /* bit (1 << lms_dtype) for each dtype present */
    const char *source;       /* where it was imported from (absolute path) */
    const char *st_metadata;  /* safetensors "__metadata__" as compact JSON; "" if none */
} lms_model_info;

typedef struct lms_tensor_record {
    const char *name;
    lms_dtype dtype;
    uint32_t ndim;
    uint64_t shape[LMS_MAX_DIMS];
    uint64_t nbytes;
    int32_t layer;            /* transformer block index; -1 before the blocks, INT32_MAX after */
    uint8_t hash[16];         /* XXH3-128 of the bytes (blob key) */
    uint32_t segment;         /* segment file number */
    uint64_t offset;          /* byte offset in the segment, a multiple of the alignment */
} lms_tensor_record;

/* Callbacks return 0 to go on, non-zero to stop (that value is returned). */
typedef int (*lms_model_cb)(void *ctx, const lms_model_info *info);
typedef int (*lms_tensor_cb)(void *ctx, const lms_tensor_record *rec);
typedef int (*lms_file_cb)(void *ctx, const char *file, uint64_t size);

int lms_store_models(lms_store *store, lms_model_cb cb, void *ctx);
/* Info of one model; LMS_ENOENT if absent. Strings valid during cb only. */
int lms_store_model(lms_store *store, const char *model, lms_model_cb cb, void *ctx);
/* A model's tensors in storage (forward-pass) order, from one snapshot. */
int lms_store_tensors(lms_store *store, const char *model, lms_tensor_cb cb, void *ctx);
/* Stored side files (config.json, tokenizer.json, ...), by name. */
int lms_store_files(lms_store *store, const char *model, lms_file_cb cb, void *ctx);
/* One side file, decompressed; *data is NUL-terminated, free with lms_free.
 * LMS_ENOENT naming the model and file when absent. */
int lms_store_file(lms_store *store, const char *model, const char *file, void **data, size_t *len);

/* Path of segment file `segment` into buf. */
int lms_store_segment_path(const lms_store *store, uint32_t segment, char *buf, size_t len);

#ifdef __cplusplus
}
#endif
#endif
