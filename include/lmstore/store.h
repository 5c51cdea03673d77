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
#include "lmstore/types.h"

#ifdef __cplusplus
extern "C" {
#endif

/* lms_store, lms_dtype, LMS_MAX_DIMS and LMS_MODEL_ID_LEN: lmstore/types.h */
typedef struct lms_tokenizer lms_tokenizer; /* lmstore/tokenizer.h */

/* ---- opening --------------------------------------------------------------- */

enum lms_store_flags {
    LMS_STORE_RDONLY = 1 << 0, /* no writes; fails with LMS_ENOENT if absent */
    LMS_STORE_CREATE = 1 << 1, /* create the folder and an empty store if absent */
};

typedef struct lms_store_params {
    uint32_t alignment;    /* blob alignment for a new store; 0 = 4096. Power of 2, 64..2 MiB */
    uint64_t segment_max;  /* a segment is closed past this many bytes; 0 = 4 GiB */
} lms_store_params;

LMS_API lms_store_params lms_store_default_params(void);

/*
 * Open the store in folder `path`. params may be NULL (defaults); they only
 * matter when a store is created. On failure *out is NULL and nothing needs
 * closing. Errors: LMS_ENOENT (no store and no LMS_STORE_CREATE),
 * LMS_EVERSION (format newer than this build), LMS_ECORRUPT, LMS_EDB, LMS_EIO.
 */
LMS_API int lms_store_open(const char *path, unsigned flags, const lms_store_params *params, lms_store **out);

/*
 * Close the store. LMS_EBUSY (and nothing closed) while models opened from it
 * are still open. NULL is accepted.
 */
LMS_API int lms_store_close(lms_store *store);

LMS_API const char *lms_store_path(const lms_store *store);
LMS_API uint32_t lms_store_alignment(const lms_store *store);
/* The store's format version (docs/FORMAT.md): a store of an older format
 * is read as it is through a read-only handle and upgraded by the first
 * writable open. */
LMS_API uint32_t lms_store_format(const lms_store *store);

/* Free a buffer lmstore returned to the caller. NULL ok. */
LMS_API void lms_free(void *p);

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

LMS_API lms_import_params lms_import_default_params(void);

/*
 * Import a HuggingFace model folder (*.safetensors shards, optional
 * model.safetensors.index.json, config and tokenizer files) or one
 * .safetensors file. All-or-nothing: on failure the store is as before and
 * lms_last_error() names the file and tensor at fault. stats may be NULL.
 */
LMS_API int lms_import(lms_store *store, const char *src, const lms_import_params *params, lms_import_stats *stats);

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
    uint64_t shape[LMS_MAX_DIMS]; /* in elements, also for quantized dtypes */
    uint64_t nbytes;          /* from the shape and dtype: lms_dtype_nbytes(dtype, bits, shape, ndim) */
    int32_t layer;            /* transformer block index; -1 before the blocks, INT32_MAX after */
    uint8_t hash[16];         /* XXH3-128 of the bytes (blob key) */
    uint32_t segment;         /* segment file number */
    uint64_t offset;          /* byte offset in the segment, a multiple of the alignment */
    uint32_t bits;            /* MLX_AFFINE: bits per code; 0 for other dtypes */
    uint32_t group_size;      /* MLX_AFFINE: codes per scale and bias (the tensors NAME.scales and
                               * NAME.biases, for a weight NAME.weight); 0 for other dtypes */
} lms_tensor_record;

/* Callbacks return 0 to go on, non-zero to stop (that value is returned). */
typedef int (*lms_model_cb)(void *ctx, const lms_model_info *info);
typedef int (*lms_tensor_cb)(void *ctx, const lms_tensor_record *rec);
typedef int (*lms_file_cb)(void *ctx, const char *file, uint64_t size);

LMS_API int lms_store_models(lms_store *store, lms_model_cb cb, void *ctx);
/* Info of one model; LMS_ENOENT if absent. Strings valid during cb only. */
LMS_API int lms_store_model(lms_store *store, const char *model, lms_model_cb cb, void *ctx);
/* A model's tensors in storage (forward-pass) order, from one snapshot. */
LMS_API int lms_store_tensors(lms_store *store, const char *model, lms_tensor_cb cb, void *ctx);
/* Stored side files (config.json, tokenizer.json, ...), by name; not
 * lmstore's own, whose names begin with '.' (the compiled tokenizer's
 * reference, docs/FORMAT.md 3.8). */
LMS_API int lms_store_files(lms_store *store, const char *model, lms_file_cb cb, void *ctx);
/* One side file, decompressed; *data is NUL-terminated, free with lms_free
 * (NULL after a failure). LMS_ENOENT naming the model and file when absent;
 * LMS_ECORRUPT naming them when the stored record is damaged (its claimed
 * size is checked before anything is allocated: at most 256 MiB, equal to
 * the compressed frame's; then the bytes' checksum). */
LMS_API int lms_store_file(lms_store *store, const char *model, const char *file, void **data, size_t *len);

/*
 * The model's tokenizer: its compiled image (written at import; docs/FORMAT.md
 * 3.8) mapped and opened in place, which costs O(1) in the vocabulary size;
 * for a model imported before images existed, or whose image is missing or
 * damaged (said on stderr), tokenizer.json parsed as lms_tokenizer_load does,
 * with tokenizer_config.json and, when that holds no chat template,
 * chat_template.jinja. Free *out with lms_tokenizer_free (it may outlive the
 * store handle). Errors: LMS_ENOENT (no such model, or no tokenizer.json),
 * those of lms_tokenizer_load, LMS_ENOMEM, LMS_EDB.
 */
LMS_API int lms_store_tokenizer(lms_store *store, const char *model, lms_tokenizer **out);

/* Path of segment file `segment` into buf. */
LMS_API int lms_store_segment_path(const lms_store *store, uint32_t segment, char *buf, size_t len);

/* ---- administration and durability: rm, cp, mv, verify, gc, export -------------
 *
 * What a store guarantees (docs/DURABILITY.md tells how):
 * (1) A model is visible whole or not at all: import, rm, cp and mv each end
 *     in one LMDB write transaction, which also changes the blobs' reference
 *     counts. A process killed at any point, or a call that fails, leaves the
 *     store consistent; at worst it leaves unreferenced bytes that
 *     lms_store_gc reclaims.
 * (2) gc never rewrites bytes a committed record reaches. It shrinks or
 *     unlinks a segment only after every reader that could still reach the
 *     old bytes has gone (LMDB snapshots that began before its commit, and
 *     processes holding the segment mapped: those hold a shared flock on
 *     it); segments still in use are skipped and reported, and a later gc
 *     takes them.
 * (3) verify reads one snapshot and hashes blobs from a shared mapping held
 *     under the readers' lock, so a concurrent gc leaves them in place.
 * (4) export writes a new folder and removes what it wrote on failure.
 *
 * All of these are safe to call while other processes read, import, remove
 * or gc in the same store. Every string they pass to a callback is valid
 * during the callback only. Functions that change the store return
 * LMS_EINVAL on a store opened LMS_STORE_RDONLY.
 */

/*
 * Remove a model: its model, tensor and file records go and its blobs'
 * reference counts drop, in one transaction; the bytes are freed by
 * lms_store_gc. Models and open handles sharing those blobs are unaffected.
 * Errors: LMS_ENOENT (no such model), LMS_EINVAL, LMS_EDB, LMS_ENOSPACE.
 * On failure the store is unchanged.
 */
LMS_API int lms_model_remove(lms_store *store, const char *model);

/*
 * Metadata-only copy: `dst` gets the same tensors (blob references + 1, no
 * tensor bytes written) and side files, in one transaction. Waits for the
 * store's append lock (an import or gc in progress) so that no blob it
 * references is being deleted. Errors: LMS_ENOENT (no `src`), LMS_EEXIST
 * (`dst` exists), LMS_EINVAL (`dst` is not a valid model name: 1 to 200
 * bytes of UTF-8 without control characters or '/', not beginning with
 * '-'), LMS_EDB, LMS_ENOSPACE. On
 * failure the store is unchanged.
 */
LMS_API int lms_model_copy(lms_store *store, const char *src, const char *dst);

/* Rename `src` to `dst` in one transaction; reference counts unchanged.
 * Errors and state after failure as lms_model_copy. */
LMS_API int lms_model_rename(lms_store *store, const char *src, const char *dst);

typedef struct lms_verify_params {
    const char *model; /* NULL = every model and every blob; else only that model's blobs are hashed
                        * (the index checks always cover the whole store) */
    int threads;       /* hashing threads; 0 = online CPUs */
    bool hash;         /* recompute blob hashes (false: index checks only); default true */
    bool progress;     /* progress bar on stderr when it is a terminal */
} lms_verify_params;

LMS_API lms_verify_params lms_verify_default_params(void);

/* One problem found. `kind` is one of "corrupt" (bytes fail their hash),
 * "missing-blob", "refcount", "blob-range" (outside its segment or
 * misaligned), "blob-overlap", "segment-header", "record" (undecodable),
 * "model" (totals disagree with its tensors), "file" (a side file fails its
 * check), "kv" (KV page or session). Every string is valid during the
 * callback only. */
typedef struct lms_verify_problem {
    const char *kind;
    const char *model;   /* model or KV session name, or NULL */
    const char *item;    /* tensor or file name, or NULL */
    uint32_t segment;    /* UINT32_MAX if not about a segment */
    uint64_t offset;     /* byte offset in that segment */
    const char *detail;  /* a sentence for a user */
} lms_verify_problem;

typedef void (*lms_verify_cb)(void *ctx, const lms_verify_problem *p);

typedef struct lms_verify_report {
    uint64_t models, tensors, blobs, segments;
    uint64_t bytes_hashed;
    uint64_t problems;
    uint64_t garbage_bytes;   /* bytes gc would reclaim (unreferenced blobs, unreachable tails, stray
                               * segments): what a crashed import leaves; not a problem */
    double seconds;
} lms_verify_report;

/*
 * Check the store, read-only (guarantee 3): index consistency (records
 * decode, every tensor's blob exists with its size, reference counts equal
 * the referencing records, blobs lie aligned inside their segments without
 * overlapping, segment headers are valid, side files pass their checksums)
 * and, with params->hash, every blob's XXH3-128. params may be NULL
 * (defaults), report may be NULL. Each problem is passed to cb (may be
 * NULL) as it is found, on the calling thread.
 * Returns 0 when the check ran, whatever it found (report->problems says
 * how many); an error code when it could not run: LMS_ENOENT (unknown
 * params->model), LMS_EIO, LMS_ENOMEM, LMS_EDB. Nothing is ever written.
 */
LMS_API int lms_store_verify(lms_store *store, const lms_verify_params *params, lms_verify_cb cb, void *ctx,
                     lms_verify_report *report);

typedef struct lms_gc_params {
    bool dry_run;           /* report what would be freed, change nothing */
    double compact_below;   /* compact a segment whose live fraction is below this; 0 = 0.5; < 0 = never */
    double grace_seconds;   /* how long to wait for older LMDB readers to end before skipping; 0 = 5 */
    bool progress;          /* progress bar on stderr when it is a terminal */
} lms_gc_params;

LMS_API lms_gc_params lms_gc_default_params(void);

typedef struct lms_gc_report {
    uint64_t blobs_deleted;       /* blob records with no references removed */
    uint64_t kvpages_deleted;     /* KV pages no session references, removed */
    uint64_t blobs_moved, bytes_moved;  /* compaction */
    uint64_t segments_removed;
    uint64_t segments_truncated;
    uint64_t segments_busy;       /* skipped: mapped by another process or reachable from an old snapshot */
    uint64_t bytes_punched;       /* disk blocks of dead ranges inside segments given back (size kept) */
    uint64_t bytes_before, bytes_after; /* total size of the segment files */
    uint64_t bytes_freed;         /* disk space given back: bytes_before - bytes_after, plus bytes_punched;
                                   * dry run: what would be given back */
    double seconds;
} lms_gc_report;

/* Called, on the calling thread, for each segment gc skips because another
 * process holds it; `path` is valid during the call only. */
typedef void (*lms_gc_busy_cb)(void *ctx, uint32_t segment, const char *path);

/*
 * Reclaim space (guarantee 2): delete blob records nothing references,
 * copy live blobs out of segments whose live fraction is below
 * params->compact_below and repoint them in one transaction, then truncate,
 * hole-punch or unlink what no record reaches. params may be NULL
 * (defaults), busy may be NULL, report may be NULL. Runs under the store's
 * append lock (waits for an import, cp or another gc).
 * Returns 0 when it ran, busy segments included (report->segments_busy);
 * an error code (LMS_EIO, LMS_ENOMEM, LMS_EDB, LMS_ENOSPACE, LMS_EINVAL on
 * a read-only store unless dry_run) when a step failed. After a failure
 * the index is as the last committed step left it, always consistent with
 * the segments, and no model changed content; a later gc finishes the work.
 */
LMS_API int lms_store_gc(lms_store *store, const lms_gc_params *params, lms_gc_busy_cb busy, void *ctx,
                 lms_gc_report *report);

/* Total size of the segment files (sum of st_size) and their count; either
 * pointer may be NULL. LMS_EIO, LMS_ENOMEM. */
LMS_API int lms_store_segment_bytes(lms_store *store, uint64_t *bytes, uint64_t *count);

typedef struct lms_export_params {
    uint64_t max_shard_size; /* bytes of tensor data per shard; 0 = 5 GiB (HF's default) */
    bool progress;           /* progress bar on stderr when it is a terminal */
} lms_export_params;

LMS_API lms_export_params lms_export_default_params(void);

typedef struct lms_export_stats {
    uint64_t tensors, bytes, shards, files;
    double seconds;
} lms_export_stats;

/*
 * Write `model` as a HuggingFace folder `dir` (created; if it exists it
 * must be an empty folder): model.safetensors, or model-0000K-of-0000N
 * .safetensors shards plus model.safetensors.index.json, and the stored side
 * files. The tensors are byte-identical to those imported: each is
 * hash-checked while copied. MLX_AFFINE tensors go out as MLX saves them
 * (U32 words of packed codes) beside their scales and biases, so an MLX
 * model exports as an mlx-community folder; GGUF block types are refused
 * (LMS_EUNSUPPORTED: see lms_model_export_gguf). params and stats may be NULL.
 * Errors: LMS_ENOENT (no such model), LMS_EEXIST (`dir` is not an empty
 * folder), LMS_ECORRUPT (a blob fails its hash; the message names the
 * tensor), LMS_EIO, LMS_ENOMEM, LMS_EINVAL. On failure the files written
 * (and `dir`, if this call created it) are removed; the store is never
 * changed.
 */
LMS_API int lms_model_export(lms_store *store, const char *model, const char *dir, const lms_export_params *params,
                     lms_export_stats *stats);

/*
 * Write `model` (a Llama, Qwen2 or Qwen3 model) as one GGUF v3 file at
 * `path` (which must not exist), for llama.cpp: tensors in their stored
 * encoding (F32, F16, BF16, GGUF block types; MLX_AFFINE is refused) under
 * GGUF names, llama's Q/K rows in llama.cpp's rotary order; metadata from
 * config.json, tokenizer.json and tokenizer_config.json. A model exported
 * as HF safetensors (lms_model_export) that holds GGUF block types is
 * refused with LMS_EUNSUPPORTED: export it here. params->max_shard_size is
 * ignored. Errors as lms_model_export (LMS_EEXIST when path exists), plus
 * LMS_EUNSUPPORTED for what GGUF or llama.cpp cannot hold. On failure
 * nothing is left at path.
 */
LMS_API int lms_model_export_gguf(lms_store *store, const char *model, const char *path, const lms_export_params *params,
                          lms_export_stats *stats);

/* ---- quantize ------------------------------------------------------------------------ */

typedef struct lms_quantize_params {
    lms_dtype type;        /* Q8_0, Q4_0, Q4_1, Q5_0, Q5_1, Q4_K, Q6_K or MLX_AFFINE */
    uint32_t bits;         /* MLX_AFFINE: 2, 3, 4, 5, 6 or 8; ignored otherwise */
    uint32_t group_size;   /* MLX_AFFINE: 32, 64 or 128; 0 = 64 (mlx-lm's default) */
    bool keep_embeddings;  /* leave the token embedding and the LM head as they are */
    int threads;           /* quantizing threads; 0 = online CPUs */
    bool progress;         /* progress bar on stderr when it is a terminal */
    bool mix_k_m;          /* with Q4_K: llama-quantize's Q4_K_M mix (Q6_K for the LM head, or the
                            * embedding when tied, and for the v_proj and down_proj of the first and
                            * last eighth of the layers and every third between; Q4_K elsewhere;
                            * Q5_0 / Q8_0 for rows that are not whole 256-element blocks). Dense
                            * Llama / Qwen models; an 80-layer model is refused (its v_proj would
                            * be Q5_K). */
} lms_quantize_params;

LMS_API lms_quantize_params lms_quantize_default_params(void); /* Q8_0 */

typedef struct lms_quantize_stats {
    uint64_t tensors;        /* tensors of the new model */
    uint64_t quantized;      /* of them, newly quantized */
    uint64_t bytes_total;    /* tensor bytes of the new model */
    uint64_t bytes_written;  /* appended to segments */
    uint64_t bytes_shared;   /* tensors shared with stored blobs (the source's, through dedup) */
    double seconds;
} lms_quantize_stats;

/*
 * Make model `dst` from model `src`: every 2-D `.weight` matrix (the
 * embedding and LM head too, unless keep_embeddings) quantized to
 * params->type, everything else (norms, biases, matrices whose rows are not
 * whole blocks, tensors already of that type) shared with the source
 * through the store's deduplication. GGUF types: the bytes of the reference
 * quantizers (quant/quant.h); Q4_K takes Q5_0 and Q6_K Q8_0 for rows that
 * are not a whole number of 256-element blocks, as llama-quantize does, and
 * with mix_k_m the result is llama-quantize's Q4_K_M (without an importance
 * matrix) byte for byte. MLX_AFFINE: each
 * quantized X.weight gets X.scales and X.biases (the source's float dtype;
 * F16 for a GGUF-quantized source) and config.json a "quantization" object,
 * as mlx-lm writes them. Sources quantized to GGUF types are dequantized
 * first; MLX_AFFINE sources are refused. Side files are copied.
 * All-or-nothing like lms_import (same append lock and one commit); params
 * may be NULL (Q8_0), stats may be NULL.
 * Errors: LMS_ENOENT (no `src`), LMS_EEXIST (`dst` exists), LMS_EINVAL
 * (bad name or params), LMS_EUNSUPPORTED, LMS_ECORRUPT, LMS_EIO,
 * LMS_ENOMEM, LMS_EDB, LMS_ENOSPACE.
 */
LMS_API int lms_model_quantize(lms_store *store, const char *src, const char *dst, const lms_quantize_params *params,
                       lms_quantize_stats *stats);

#ifdef __cplusplus
}
#endif
#endif
