/*
 * store/admin.h - store administration and durability: verify, rm, cp, mv,
 * gc and export (the `lmstore verify|rm|cp|mv|gc|export` commands).
 *
 * These follow the public API's conventions (0 or a negative LMS_E* code,
 * detail in lms_last_error(), strings passed to callbacks valid during the
 * callback only) and are written to move into include/lmstore/store.h as
 * they are.
 *
 * Design notes (see DESIGN.md "Invariants" and store/store_internal.h):
 * (1) rm, cp and mv are one LMDB write transaction each: a model is either
 *     wholly there under a name or not at all; blob reference counts change
 *     in that same transaction.
 * (2) gc never rewrites a committed region. It deletes blob records with no
 *     references (under the append lock), copies live blobs out of sparse
 *     segments into new bytes and repoints them in one transaction, then
 *     shrinks or unlinks segment files only
 *       - after every LMDB reader that began before its last commit has
 *         ended (so no snapshot can still lead a reader to the old bytes),
 *         and every reader inside the read barrier (admin_internal.h:
 *         records read, segments not yet locked) has left it,
 *       - under the append lock (no import is appending), and
 *       - when flock(LOCK_EX|LOCK_NB) on the segment succeeds (no process
 *         has it mapped); busy segments are skipped and reported.
 * (3) verify reads one snapshot: the index is checked against itself and
 *     against the segment files, and every blob is hashed from a shared
 *     mapping (a reader, so gc leaves those segments alone meanwhile).
 * (4) export writes into a new folder and removes what it wrote on failure;
 *     every byte it writes comes from a blob whose hash it checks on the way.
 */
#ifndef LMS_STORE_ADMIN_H
#define LMS_STORE_ADMIN_H

#include <stdbool.h>
#include <stdint.h>

#include "lmstore/store.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- rm, cp, mv ------------------------------------------------------------- */

/* Remove a model: its model, tensor and file records go and its blobs' reference
 * counts drop, in one transaction. Bytes are freed by gc. LMS_ENOENT if absent. */
int lms_model_remove(lms_store *store, const char *model);

/* Metadata-only copy: `dst` gets the same tensors (blob references +1, no
 * tensor bytes written) and side files. LMS_ENOENT, LMS_EEXIST, LMS_EINVAL (bad name). */
int lms_model_copy(lms_store *store, const char *src, const char *dst);

/* Rename; reference counts unchanged. LMS_ENOENT, LMS_EEXIST, LMS_EINVAL. */
int lms_model_rename(lms_store *store, const char *src, const char *dst);

/* ---- verify ----------------------------------------------------------------- */

typedef struct lms_verify_params {
    const char *model; /* NULL = every model (and every blob); else that model's blobs are hashed */
    int threads;       /* hashing threads; 0 = online CPUs */
    bool hash;         /* recompute blob hashes (else index checks only); default true */
    bool progress;     /* progress bar on stderr when it is a terminal */
} lms_verify_params;

lms_verify_params lms_verify_default_params(void);

/* One problem found. kind is one of "corrupt" (bytes fail their hash),
 * "missing-blob", "refcount", "blob-range" (outside its segment or
 * misaligned), "blob-overlap", "segment-header", "record" (undecodable),
 * "model" (totals disagree with its tensors), "file" (side file fails its
 * check), "kv" (KV page or session). model/item may be NULL. */
typedef struct lms_verify_problem {
    const char *kind;
    const char *model;   /* model or session name, or NULL */
    const char *item;    /* tensor or file name, or NULL */
    uint32_t segment;    /* UINT32_MAX if not about a segment */
    uint64_t offset;
    const char *detail;  /* a sentence for a user */
} lms_verify_problem;

typedef void (*lms_verify_cb)(void *ctx, const lms_verify_problem *p);

typedef struct lms_verify_report {
    uint64_t models, tensors, blobs, segments;
    uint64_t bytes_hashed;
    uint64_t problems;
    uint64_t garbage_bytes;   /* bytes gc would reclaim (unreferenced blobs, unreachable tails, stray segments) */
    double seconds;
} lms_verify_report;

/*
 * Check the store (see design note 3). Each problem is passed to cb (may be
 * NULL) as it is found; cb runs on the calling thread. Returns 0 when the
 * check ran, whatever it found (report->problems says), or an error code when
 * it could not run (LMS_ENOENT for an unknown model, LMS_EIO, LMS_ENOMEM).
 */
int lms_store_verify(lms_store *store, const lms_verify_params *params, lms_verify_cb cb, void *ctx,
                     lms_verify_report *report);

/* ---- gc ------------------------------------------------------------------------ */

typedef struct lms_gc_params {
    bool dry_run;           /* report what would be freed, change nothing */
    double compact_below;   /* compact a segment whose live fraction is below this; 0 = 0.5; < 0 = never */
    double grace_seconds;   /* how long to wait for older LMDB readers to end before skipping; 0 = 5 */
    bool progress;
} lms_gc_params;

lms_gc_params lms_gc_default_params(void);

typedef struct lms_gc_report {
    uint64_t blobs_deleted;       /* blob records with no references removed */
    uint64_t kvpages_deleted;     /* KV pages no session references, removed */
    uint64_t blobs_moved, bytes_moved;  /* compaction */
    uint64_t segments_removed;
    uint64_t segments_truncated;
    uint64_t segments_busy;       /* skipped: mapped by another process or an old snapshot */
    uint64_t bytes_punched;       /* disk blocks of dead ranges inside segments given back (size kept) */
    uint64_t bytes_before, bytes_after; /* total size of the segment files */
    uint64_t bytes_freed;         /* dry run: what would be freed */
    double seconds;
} lms_gc_report;

/* Called for each segment gc skips because another process holds it. */
typedef void (*lms_gc_busy_cb)(void *ctx, uint32_t segment, const char *path);

/*
 * Reclaim space (design note 2). Returns 0 when it ran, busy segments
 * included (report->segments_busy); an error code when a step failed, in
 * which case the index is as the last committed step left it (always
 * consistent) and a later gc finishes the work.
 */
int lms_store_gc(lms_store *store, const lms_gc_params *params, lms_gc_busy_cb busy, void *ctx,
                 lms_gc_report *report);

/* Total size of the segment files (st_size sum) and their count. */
int lms_store_segment_bytes(lms_store *store, uint64_t *bytes, uint64_t *count);

/* ---- export -------------------------------------------------------------------- */

typedef struct lms_export_params {
    uint64_t max_shard_size; /* bytes of tensor data per shard; 0 = 5 GiB (HF's default) */
    bool progress;
} lms_export_params;

lms_export_params lms_export_default_params(void);

typedef struct lms_export_stats {
    uint64_t tensors, bytes, shards, files;
    double seconds;
} lms_export_stats;

/*
 * Write model as a HuggingFace folder `dir` (created; must not exist or be
 * empty): model.safetensors or model-0000K-of-0000N.safetensors shards plus
 * model.safetensors.index.json, and the stored side files. Tensor bytes are
 * hash-checked while copied: a corrupt blob fails with LMS_ECORRUPT naming the
 * tensor. On failure the files written are removed. stats may be NULL.
 */
int lms_model_export(lms_store *store, const char *model, const char *dir, const lms_export_params *params,
                     lms_export_stats *stats);

#ifdef __cplusplus
}
#endif
#endif
