/*
 * store/kv_index.h - the index half of saved KV caches, as the store keeps
 * it: kvcache/ encodes and decodes pages and owns the arena; this is the
 * only way it reaches the kvpages, sessions and blobs databases and the
 * segment files. It includes neither LMDB nor store_internal.h: records go
 * in and out as the plain structs of store/kv_records.h.
 *
 * Design notes (the store's invariants, store_internal.h, kept here so
 * that no caller has to):
 *  (1) A save is one writer session: lms__kv_write_begin takes the store's
 *      append lock and lms__kv_write_end releases it, so between them no gc
 *      deletes a page record or blob the save decided to reuse (invariant 3).
 *  (2) Page bytes are appended (lms__kv_write_reserve, _bytes) and fsync'd
 *      (lms__kv_write_sync) before lms__kv_write_commit makes them reachable
 *      (invariant 1); the commit puts the new blobs (or adds a reference to
 *      identical stored bytes), the kvpages records and the session record
 *      in ONE write transaction, so every reference count changes with the
 *      record that holds it (invariant 4). A writer that ends without a
 *      commit truncates what it appended.
 *  (3) A reader is one LMDB snapshot: the session, page and blob records it
 *      returns are consistent with each other, and the segments it maps
 *      are share-locked (invariant 5) from before the snapshot ends
 *      (lms__kv_read_release) until lms__kv_read_end, so gc cannot unlink
 *      or trim the bytes those records point at while pages are read.
 *
 *   write_begin -> write_lookup -> { find_blobs -> reserve -> bytes }* ->
 *   write_sync -> write_commit -> write_end (kept)
 *   any step failing -> write_end (rolled back)
 *
 *   read_begin -> read_session / read_sessions -> read_page* -> read_map* ->
 *   read_release (snapshot ends, maps stay) -> read_bytes* -> read_end
 */
#ifndef LMS_KV_INDEX_H
#define LMS_KV_INDEX_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "store/kv_records.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- reading: resume, kv ls, kv info ------------------------------------------------ */

typedef struct lms__kv_reader lms__kv_reader;

/* Open a snapshot of the index. lms__kv_read_end frees the reader. */
int lms__kv_read_begin(lms_store *s, lms__kv_reader **out);
/* End the snapshot (if still open), unmap every segment, free r. NULL ok. */
void lms__kv_read_end(lms__kv_reader *r);
/* End the snapshot; mapped segments stay mapped and share-locked. */
void lms__kv_read_release(lms__kv_reader *r);

/*
 * Read and decode session `name` into *rec, from a copy the reader owns
 * (valid until the next read_session or read_end; the snapshot may end
 * before). LMS_ENOENT with detail "KV session 'NAME' not found in STORE";
 * the decoder's LMS_ECORRUPT / LMS_EVERSION with its detail, rec->version
 * then still set when the record had one.
 */
int lms__kv_read_session(lms__kv_reader *r, const char *name, lms__session_rec *rec);

/* Called for every session in name order: `name` NUL-terminated (at most
 * LMS__SESSION_NAME_MAX bytes shown), dec_rc the decoder's result for rec
 * (detail set when non-zero). rec points into the snapshot: valid during the
 * call. A non-zero return stops the walk and is returned. */
typedef int (*lms__kv_session_fn)(void *ctx, lms__kv_reader *r, const char *name, int dec_rc,
                                  const lms__session_rec *rec);
int lms__kv_read_sessions(lms__kv_reader *r, lms__kv_session_fn fn, void *ctx);

/* A stored page as the index describes it. */
typedef struct lms__kv_page_loc {
    lms__kvpage_rec rec;   /* its kvpages record */
    bool has_blob;         /* the blob rec.blob names is in the index */
    bool blob_ok;          /* ... and is a KV page blob of rec.stored_size bytes */
    uint32_t segment;      /* where the blob lies (has_blob) */
    uint64_t offset;
    uint64_t size;
} lms__kv_page_loc;

/*
 * Look page `key` (16 bytes) up in the snapshot. 0: *loc filled (has_blob
 * false when the blob record is absent); LMS_ENOENT: no page record (no
 * detail set); LMS_ECORRUPT / LMS_EVERSION: the page or blob record does
 * not decode (detail); LMS_EDB.
 */
int lms__kv_read_page(lms__kv_reader *r, const uint8_t key[16], lms__kv_page_loc *loc);

/*
 * Map segment `segment` (once per reader) and share-lock it until read_end.
 * *index names the mapping for read_bytes; *size is the file's size and
 * *path its path (valid until read_end), for the caller's range checks and
 * messages. The snapshot must be open. Errors of lms__segment_map (a bad
 * header is LMS_ECORRUPT).
 */
int lms__kv_read_map(lms__kv_reader *r, uint32_t segment, int *index, uint64_t *size, const char **path);

/* pread len bytes at offset of mapping `index`. Thread-safe. LMS_EIO. */
int lms__kv_read_bytes(const lms__kv_reader *r, int index, void *buf, size_t len, uint64_t offset);

/* ---- writing: save ------------------------------------------------------------------ */

typedef struct lms__kv_writer lms__kv_writer;

/* Take the append lock (waits for an import or gc) for a save of session
 * `name` (used in messages; must outlive w). LMS_EINVAL on a read-only store. */
int lms__kv_write_begin(lms_store *s, const char *name, lms__kv_writer **out);
/* Commit nothing more: roll back what was appended unless committed, release
 * the lock, free w. NULL ok. */
void lms__kv_write_end(lms__kv_writer *w);

/* stored[i] = a page record of key i (keys: n x 16 bytes) exists, in one
 * snapshot. The lock keeps it there until the commit. */
int lms__kv_write_lookup(lms__kv_writer *w, const uint8_t *keys, uint32_t n, bool *stored);

/* One page's encoded bytes, asked for by lms__kv_write_find_blobs. */
typedef struct lms__kv_blob_query {
    const uint8_t *hash; /* 16 bytes: XXH3-128 of data */
    const void *data;
    uint64_t len;
    uint32_t page;       /* the page's index in the session, for messages */
    bool exists;         /* out: a stored KV page blob holds exactly these bytes */
} lms__kv_blob_query;
/* Dedup against the store, in one snapshot: by hash AND a byte comparison.
 * LMS_EEXIST ("KV save 'NAME': page N's bytes collide with a different blob
 * of the same hash"), mapping errors. */
int lms__kv_write_find_blobs(lms__kv_writer *w, lms__kv_blob_query *q, uint32_t n);

/* Reserve `size` bytes for a page blob (one thread), then write them
 * (thread-safe for disjoint ranges). */
int lms__kv_write_reserve(lms__kv_writer *w, uint64_t size, uint32_t *segment, uint64_t *offset);
int lms__kv_write_bytes(lms__kv_writer *w, uint32_t segment, uint64_t offset, const void *data, size_t len);
/* *same = the len bytes this writer wrote at (segment, offset) equal data. */
int lms__kv_write_same(lms__kv_writer *w, uint32_t segment, uint64_t offset, const void *data, size_t len,
                       bool *same);
/* fsync what was written (before the commit). */
int lms__kv_write_sync(lms__kv_writer *w);

/* What the commit does with page i of the session. */
enum lms__kv_put {
    LMS__KV_PUT_SKIP,    /* same key as an earlier page of the session */
    LMS__KV_PUT_STORED,  /* the lookup found its record: it must still be there */
    LMS__KV_PUT_SHARE,   /* new record; its bytes are an existing blob (refs + 1) */
    LMS__KV_PUT_NEW,     /* new record and new blob at (segment, offset), refs 1 */
};
typedef struct lms__kv_page_put {
    uint8_t put;         /* lms__kv_put */
    lms__kvpage_rec rec; /* rec.blob: the blob's hash */
    uint32_t segment;    /* LMS__KV_PUT_NEW */
    uint64_t offset;
} lms__kv_page_put;

/*
 * In one write transaction: the page records of pages[rec->n_pages] (keyed
 * by the session's page keys; a record another save committed meanwhile is
 * kept and ours dropped), their blobs' records and reference counts, and the
 * session record (replacing one of that name unless no_replace: LMS_EEXIST).
 * LMS_EBUSY when a page record the lookup found has vanished. After it
 * returns 0, write_end keeps the appended bytes.
 */
int lms__kv_write_commit(lms__kv_writer *w, const lms__session_rec *rec, const lms__kv_page_put *pages,
                         bool no_replace);

/* ---- sessions ------------------------------------------------------------------------- */

/* Set session `name`'s last-used time to now (a no-op on a read-only store
 * or when the record does not decode). LMS_ENOENT, LMS_EDB. */
int lms__kv_touch(lms_store *s, const char *name);
/* lms__kv_touch on the store's own thread, so that the caller does not wait
 * for the commit (a sync of the index, tens of milliseconds right after a
 * large save on some disks): names queue, one thread writes them in order,
 * and all are written before lms_store_close returns (lms__kv_touch_wait).
 * A failure is logged as a warning: the time orders gc and `kv ls`, nothing
 * else. Until then a reader of the record sees the previous time. */
void lms__kv_touch_later(lms_store *s, const char *name);
void lms__kv_touch_wait(lms_store *s);
/* Delete session `name`'s record (its pages stay for gc). LMS_ENOENT with
 * detail "KV session 'NAME' not found in STORE". */
int lms__kv_remove(lms_store *s, const char *name);

#ifdef __cplusplus
}
#endif
#endif
