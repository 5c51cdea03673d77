/*
 * store/store_internal.h - the store's internal API, shared by the store
 * itself (import, ls, info), the durability tools (verify, rm, gc, export,
 * cp, mv), the kvcache persistence (pages as blobs, sessions) and the loader.
 *
 * docs/FORMAT.md is the normative description of every byte written here;
 * this header is the code side of it:
 *   - struct lms_store: the LMDB environment and its named databases;
 *   - transaction helpers that grow the map on MDB_MAP_FULL;
 *   - the segment appender (the only code that writes segment files) and the
 *     segment header reader;
 *   - record encoders/decoders: pure functions over bytes, so fuzzers and
 *     verify can call them on anything;
 *   - blob reference-count helpers.
 *
 * Design notes (numbered invariants, see also DESIGN.md "Invariants"):
 * (1) Bytes are appended and fsync'd (lms__append_sync) before the write
 *     transaction that makes them reachable commits.
 * (2) A committed segment region is never rewritten. The appender only
 *     writes past the end the segment had when the append session began.
 * (3) Every writer that appends, that adds a reference to an existing blob,
 *     or that deletes blob records holds the append lock (flock LOCK_EX on
 *     STORE/lock) from before it looks blobs up until after its commit:
 *     lms__append_begin ... lms__txn_write ... lms__append_end. So dedup and
 *     gc never race. Writers that only drop references (rm) need no lock.
 *     Asserted (lms__append_locked) where it is kept: lms__blob_put,
 *     lms__blob_ref with delta > 0, the appender's reserve and write, gc's
 *     deletion of blob records, the KV index's commit.
 * (4) Blob reference counts change in the same transaction as the records
 *     that hold the references. A blob record with 0 references is garbage
 *     that gc may delete (and an import may revive while it is there).
 * (5) Readers map segments and hold flock(LOCK_SH) on every segment file
 *     they map (lms__segment_map does this). gc takes LOCK_EX|LOCK_NB on a
 *     segment before unlinking it and skips it when that fails. Bytes of a
 *     mapping are read through lms__segmap_at, which asserts the mapping
 *     is live and the range checked.
 *
 * Append session states:
 *
 *   idle --lms__append_begin--> open --lms__append_reserve/write--> open
 *   open --lms__append_sync--> synced --lms__txn_write(commit)--> committed
 *   any --lms__append_end(keep=false)--> idle (segments truncated back,
 *                                              new segments unlinked)
 *   committed --lms__append_end(keep=true)--> idle
 */
#ifndef LMS_STORE_INTERNAL_H
#define LMS_STORE_INTERNAL_H

#include <assert.h>
#include <lmdb.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "common/common.h"
#include "store/segmap.h"   /* segment mappings, the store reference (the loader's view) */
#include "lmstore/store.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- format constants (docs/FORMAT.md) ----------------------------------- */

/* Store format (meta "format"): 1 = the first format; 2 = every index
 * record ends with its checksum (LMS__REC_SUM_SIZE, lms__rec_sum). A
 * writable open upgrades a format-1 store (lms__store_upgrade); a read-only
 * one reads it as it is. */
#define LMS__FORMAT_VERSION 2u
#define LMS__FORMAT_SUMS 2u      /* first format whose records carry checksums */
#define LMS__SEG_VERSION 1u      /* segment header version: the segment layout has not changed */
#define LMS__REC_SUM_SIZE 8u
#define LMS__SEG_MAGIC "\x89LMSSEG\n"   /* 8 bytes */
#define LMS__SEG_BOM 0x0A0B0C0Du         /* stored little-endian: 0D 0C 0B 0A */
#define LMS__DEFAULT_ALIGNMENT 4096u
#define LMS__MAX_ALIGNMENT (2u << 20)
#define LMS__DEFAULT_SEGMENT_MAX (4ull << 30)
#define LMS__MODEL_NAME_MAX 200   /* bytes; model NUL tensor must fit LMDB's 511-byte keys */
#define LMS__ITEM_NAME_MAX 300    /* bytes of a tensor or file name */
#define LMS__INITIAL_MAP_SIZE (64ull << 20)

/* Named databases, in this order in lms_store.dbi[]. */
enum lms__db {
    LMS__DB_META,
    LMS__DB_MODELS,
    LMS__DB_TENSORS,
    LMS__DB_BLOBS,
    LMS__DB_FILES,
    LMS__DB_KVPAGES,
    LMS__DB_SESSIONS,
    LMS__DB_COUNT
};
extern const char *const lms__db_names[LMS__DB_COUNT];

/* ---- the store handle -------------------------------------------------------- */

struct lms_store {
    char *path;        /* STORE */
    char *index_path;  /* STORE/index */
    char *seg_dir;     /* STORE/segments */
    char *lock_path;   /* STORE/lock (append lock, see invariant 3) */
    MDB_env *env;
    MDB_dbi dbi[LMS__DB_COUNT];
    bool rdonly;
    bool nolock;           /* read-only without LMDB's lock file (lms_store_open) */
    int data_fd;           /* index/data.mdb (LMDB's descriptor): flock of write txns, size checks */
    _Atomic uint32_t format; /* meta "format"; adopted anew by each transaction while below the current one */
    uint32_t alignment;    /* meta "alignment" */
    uint64_t segment_max;  /* meta "segment_max" */
    uint8_t uuid[16];      /* meta "uuid", also in every segment header */
    /* Transactions hold it shared; growing the map holds it exclusive
     * (mdb_env_set_mapsize needs no live transaction in the process). */
    pthread_rwlock_t map_lock;
    pthread_mutex_t write_mu;   /* one write transaction of this handle at a time (its flock on data_fd) */
    pthread_mutex_t nolock_mu;  /* nolock: read transactions of this handle sharing one flock */
    int nolock_readers;
    bool dbis_open;        /* dbi[] valid (load_meta done) */
    atomic_int users;      /* open models etc.; lms_store_close fails with LMS_EBUSY while > 0 */
    atomic_int append_locks; /* append sessions and admin locks of this handle holding STORE/lock */
    /* lms__kv_touch_later (kv_index.c): the names waiting, and the thread
     * that writes them; touch_mu guards all four. The thread is joined
     * before the environment closes (store_free). */
    pthread_mutex_t touch_mu;
    struct lms__touch *touch_head, *touch_tail;
    pthread_t touch_th;
    bool touch_joinable; /* touch_th started and not joined */
    bool touch_busy;     /* touch_th has not yet emptied the list */
};

/* True while this handle holds the append lock (an append session, or
 * lms__lock_take): the precondition of appending, of adding a reference to
 * a blob and of writing or deleting blob records (invariant 3). For
 * assertions, as SQLite's btree.c opens with sqlite3BtreeHoldsMutex(). */
static inline bool lms__append_locked(lms_store *s) { return atomic_load(&s->append_locks) > 0; }


/* ---- transactions -------------------------------------------------------------- */

/* Turn an LMDB return code into an LMS_E* code with detail "<what>: <mdb text>". */
int lms__mdb_err(int mdb_rc, const char *fmt, ...) LMS_PRINTF(2, 3);

/* Begin a read-only transaction (a snapshot). End it with lms__txn_end. */
int lms__txn_read(lms_store *s, MDB_txn **out);
/* Abort a read or write transaction and release the map lock. NULL ok. */
void lms__txn_end(lms_store *s, MDB_txn *txn);

/*
 * Run fn in a write transaction and commit it. When LMDB reports
 * MDB_MAP_FULL (from fn's puts, returned as LMS_ENOSPACE by lms__mdb_err,
 * or from the commit) the transaction is aborted, the map doubled and fn run
 * again from scratch: fn must have no effects outside the transaction.
 * A non-zero return from fn aborts and is returned. LMS_EINVAL on a
 * read-only store.
 */
typedef int (*lms__txn_fn)(lms_store *s, MDB_txn *txn, void *ctx);
int lms__txn_write(lms_store *s, lms__txn_fn fn, void *ctx);

/* ---- record checksums (format 2, docs/FORMAT.md section 3) -------------------------------
 * Every value in every named database ends with 8 bytes: the XXH3-64 of the
 * value bytes before them, seeded with the XXH3-64 (seed 0) of the key. A
 * flipped bit in a key or a value fails the check; the wrappers below add
 * the checksum on every write and check and strip it on every read, so
 * record decoders never see it. Stores of format 1 have none (read as they
 * are until a writable open upgrades them). */
static inline bool lms__has_sums(lms_store *s) { return atomic_load(&s->format) >= LMS__FORMAT_SUMS; }
uint64_t lms__rec_sum(const void *key, size_t klen, const void *val, size_t vlen);
/* "tensors record 'model'/'tensor'": a record for messages (key bytes that
 * are not printable ASCII escaped). */
void lms__rec_name(int db, const void *key, size_t klen, char *buf, size_t cap);
/* Check a raw record of db read from LMDB and strip its checksum (*v shrinks
 * by LMS__REC_SUM_SIZE). LMS_ECORRUPT naming the record when it fails (*v
 * then still loses its last 8 bytes when it has them, so that a checker can
 * go on and decode it). A no-op on a format-1 store. */
int lms__rec_check(lms_store *s, int db, const MDB_val *k, MDB_val *v);
/*
 * mdb_cursor_get on a cursor of db, through the checksum: returns LMDB's
 * code (0, MDB_NOTFOUND, ...); when it is 0, *check is lms__rec_check's
 * result for the record (0, or LMS_ECORRUPT with the detail naming it) and
 * *v the value without its checksum.
 */
int lms__cursor_get(lms_store *s, MDB_cursor *c, int db, MDB_val *k, MDB_val *v, MDB_cursor_op op, int *check);

/* Thin wrappers: get/put/del with error detail and the record checksum.
 * get returns LMS_ENOENT when absent (detail not set: absence is often
 * expected) and LMS_ECORRUPT (detail naming the record) when the record
 * fails its checksum. The value returned by get is owned by LMDB, holds no
 * checksum and is valid until the transaction ends. put appends the
 * checksum. */
int lms__db_get(lms_store *s, MDB_txn *txn, int db, const void *key, size_t klen, MDB_val *val);
int lms__db_put(lms_store *s, MDB_txn *txn, int db, const void *key, size_t klen, const void *val,
                size_t vlen, unsigned flags);
int lms__db_del(lms_store *s, MDB_txn *txn, int db, const void *key, size_t klen);
/* The model record of `model` (lms__db_get); LMS_ENOENT names the model and the store. */
int lms__model_get(lms_store *s, MDB_txn *txn, const char *model, MDB_val *val);

/*
 * Composite key "model NUL item" (tensors, files). Returns the length, or 0
 * when it does not fit `cap` (keys are at most 511 bytes).
 */
size_t lms__key_item(char *buf, size_t cap, const char *model, const char *item);
/* Split such a key: *model_len is the length before the NUL; false if none. */
bool lms__key_split(const void *key, size_t len, size_t *model_len);

/* Delete every "model NUL *" key of db. */
int lms__db_del_prefix(lms_store *s, MDB_txn *txn, int db, const char *model);

/*
 * Call fn, in key order, for every "model NUL item" record of db: item and
 * val point into LMDB memory, valid until the transaction ends or writes to
 * db (item is not NUL-terminated). Stops at the first non-zero return of fn
 * and returns it; LMDB errors come back with detail ("index: read tensors").
 */
typedef int (*lms__prefix_fn)(lms_store *s, MDB_txn *txn, void *ctx, const char *item, size_t item_len,
                              const MDB_val *val);
int lms__db_prefix_each(lms_store *s, MDB_txn *txn, int db, const char *model, lms__prefix_fn fn, void *ctx);

/* ---- records (pure; docs/FORMAT.md "Records") ------------------------------------
 * Decoders check versions, lengths and ranges and return LMS_ECORRUPT
 * (malformed) or LMS_EVERSION (newer record version) with detail; strings in
 * decoded records point into the input buffer and are NOT NUL-terminated. */

#define LMS__BLOB_REC_SIZE 32
enum lms__blob_kind { LMS__BLOB_TENSOR = 0, LMS__BLOB_KVPAGE = 1 };
typedef struct lms__blob_rec {
    uint16_t kind;     /* lms__blob_kind */
    uint32_t segment;
    uint64_t offset;   /* multiple of the store alignment */
    uint64_t size;     /* bytes */
    uint64_t refs;     /* records referencing it */
} lms__blob_rec;
void lms__blob_rec_encode(const lms__blob_rec *r, uint8_t out[LMS__BLOB_REC_SIZE]);
int lms__blob_rec_decode(const void *buf, size_t len, lms__blob_rec *r);

#define LMS__TENSOR_REC_FIXED 40
/* Version 1 holds plain dtypes; version 2, written for the quantized
 * encodings only, adds their parameters (docs/FORMAT.md 3.3). */
typedef struct lms__tensor_rec {
    lms_dtype dtype;
    uint32_t ndim;
    uint64_t shape[LMS_MAX_DIMS]; /* elements (for quantized dtypes too), outermost first */
    uint64_t nbytes;
    int32_t layer;     /* -1 before the blocks, INT32_MAX after */
    uint32_t order;    /* position in the model's storage (forward-pass) order */
    uint8_t hash[16];  /* blob key */
    uint32_t bits;     /* MLX_AFFINE: bits per code (2..8); else 0 */
    uint32_t group;    /* MLX_AFFINE: codes per scale and bias (32, 64, 128); else 0 */
} lms__tensor_rec;
size_t lms__tensor_rec_size(uint32_t ndim);
/* out must hold lms__tensor_rec_size(r->ndim) bytes; returns that size. */
size_t lms__tensor_rec_encode(const lms__tensor_rec *r, uint8_t *out);
int lms__tensor_rec_decode(const void *buf, size_t len, lms__tensor_rec *r);

/* The model id (docs/FORMAT.md 3.2) over config.json's bytes (NULL: none)
 * and n tensors given by name and record (dtype, shape, byte size, blob
 * hash, MLX parameters); sorts t by name. LMS_ENOMEM. */
typedef struct lms__id_tensor {
    const char *name;
    const lms__tensor_rec *rec;
} lms__id_tensor;
int lms__model_id(const void *config, size_t config_len, lms__id_tensor *t, size_t n, uint8_t out[16]);

typedef struct lms__model_rec {
    uint8_t id[LMS_MODEL_ID_LEN];
    uint64_t created;
    uint64_t n_tensors, n_params, tensor_bytes;
    uint32_t dtype_mask;
    uint32_t n_files;
    const char *arch; uint32_t arch_len;             /* architecture */
    const char *source; uint32_t source_len;         /* import source */
    const char *st_meta; uint32_t st_meta_len;       /* safetensors __metadata__ as JSON ("" if none) */
} lms__model_rec;
/* Allocates *out (lms__free). */
int lms__model_rec_encode(const lms__model_rec *r, uint8_t **out, size_t *len);
int lms__model_rec_decode(const void *buf, size_t len, lms__model_rec *r);

enum lms__codec { LMS__CODEC_RAW = 0, LMS__CODEC_ZSTD = 1 };
#define LMS__FILE_REC_FIXED 24
typedef struct lms__file_rec {
    uint16_t codec;
    uint64_t raw_size;
    uint64_t raw_hash;         /* XXH3-64 (seed 0) of the raw bytes */
    const uint8_t *payload;    /* zstd frame (codec 1) or raw bytes (codec 0) */
    size_t payload_len;
} lms__file_rec;
/* Compress raw into a new record; allocates *out (lms__free). */
int lms__file_rec_encode(const void *raw, size_t raw_len, int zstd_level, uint8_t **out, size_t *len);
int lms__file_rec_decode(const void *buf, size_t len, lms__file_rec *r);
/* Largest stored side file (import refuses larger ones). */
#define LMS__FILE_RAW_MAX (256u << 20)
/* Decompress and check size and hash; *data is NUL-terminated (lms__free).
 * The size the record claims is checked before anything is allocated: over
 * LMS__FILE_RAW_MAX, or unequal to the zstd frame's content size (or to the
 * raw payload's length), it is LMS_ECORRUPT. `what` names the model and
 * file in errors. */
int lms__file_rec_inflate(const lms__file_rec *r, const char *what, char **data, size_t *len);

/* A named record: a side file's encoded record (files db). */
typedef struct lms__named_rec {
    char *name;
    uint8_t *rec;
    size_t len;
} lms__named_rec;
void lms__named_recs_free(lms__named_rec *v, size_t n); /* the names, records and v; NULL ok */

/* What a new model's records are made of (import, quantize). */
typedef struct lms__model_put {
    const char *name, *arch, *source, *st_meta; /* arch, st_meta may be NULL */
    const uint8_t *id;                           /* 16 bytes: lms__model_id */
    size_t nt;
    const char *const *tnames;                   /* storage order */
    const lms__tensor_rec *trecs;                /* blob hashes set; order is the index */
    size_t nf;
    const lms__named_rec *files;
} lms__model_put;

/* Put the tensor, file and model records of a new model (docs/FORMAT.md
 * 3.2, 3.3, 3.5) in txn; the caller puts or references the blobs.
 * LMS_EINVAL (a key longer than 511 bytes), LMS_EDB, LMS_ENOSPACE, LMS_ENOMEM. */
int lms__model_put_records(lms_store *s, MDB_txn *txn, const lms__model_put *mp);

/* meta values */
int lms__meta_get_u32(lms_store *s, MDB_txn *txn, const char *key, uint32_t *v);
int lms__meta_get_u64(lms_store *s, MDB_txn *txn, const char *key, uint64_t *v);

/* ---- blobs and reference counts ------------------------------------------------- */

int lms__blob_get(lms_store *s, MDB_txn *txn, const uint8_t hash[16], lms__blob_rec *out); /* LMS_ENOENT */
/* Write a blob record (new, or repointed by gc): the append lock is held. */
int lms__blob_put(lms_store *s, MDB_txn *txn, const uint8_t hash[16], const lms__blob_rec *r);
/* refs += delta (delta > 0 needs the append lock; dropping references does
 * not). LMS_ENOENT if the blob is absent; LMS_ECORRUPT if a damaged count
 * would go below zero. The record stays (with 0 refs) for gc. */
int lms__blob_ref(lms_store *s, MDB_txn *txn, const uint8_t hash[16], int64_t delta, uint64_t *refs_after);

/* ---- segments -------------------------------------------------------------------- */

/* "STORE/segments/NNNNNNNN.seg" into buf. */
int lms__segment_path(const lms_store *s, uint32_t id, char *buf, size_t len);
/* Fill a 4096-byte header. */
void lms__segment_header_encode(uint8_t hdr[LMS__SEG_HEADER_SIZE], uint32_t id, const uint8_t uuid[16],
                                uint32_t alignment, uint64_t created);
/* Check a header (pure). uuid/expect_id may be NULL/UINT32_MAX to skip those
 * checks. path names the file in errors. LMS_ECORRUPT, LMS_EVERSION. */
int lms__segment_header_check(const void *hdr, size_t len, const uint8_t *uuid, uint32_t expect_id,
                              const char *path);
/* Segment ids present in STORE/segments, ascending; *ids allocated (lms__free). */
int lms__segment_list(const lms_store *s, uint32_t **ids, size_t *n);


/*
 * The append lock (invariant 3; docs/FORMAT.md 5.1). flock(LOCK_EX) on
 * STORE/lock, taken again until the path still names the inode locked (a
 * lock file deleted and made anew meanwhile would otherwise let two writers
 * each lock one), then flock(LOCK_EX) on the STORE folder itself, which
 * nothing deletes from under a writer: two writers exclude each other even
 * when STORE/lock is deleted while one of them holds it. Counted in
 * s->append_locks. Blocking; LMS_EIO, LMS_EINVAL (read-only store).
 */
typedef struct lms__lock {
    int file_fd, dir_fd; /* -1 when not held */
} lms__lock;
#define LMS__LOCK_NONE ((lms__lock){-1, -1})
int lms__lock_take(lms_store *s, lms__lock *l);
void lms__lock_release(lms_store *s, lms__lock *l); /* not held: nothing to do */

/* The append session (see the state diagram above). */
typedef struct lms__appender lms__appender;
/* Takes the append lock (blocking), finds or creates the current segment. */
int lms__append_begin(lms_store *s, lms__appender **out);
/* Reserve `size` bytes at an aligned offset in the current segment (or a
 * new one past segment_max). Not thread-safe: reserve from one thread, then
 * write from many. */
int lms__append_reserve(lms__appender *a, uint64_t size, uint32_t *segment, uint64_t *offset);
/* Writable fd and path of a segment this session reserved in (valid until
 * lms__append_end); thread-safe. */
int lms__append_fd(lms__appender *a, uint32_t segment, int *fd, const char **path);
/* pwrite into a reserved range; thread-safe for disjoint ranges. */
int lms__append_write(lms__appender *a, uint32_t segment, uint64_t offset, const void *buf, size_t len);
/* Give back the last range reserved (a blob that turned out to be stored
 * already): the segment ends at `offset` again. LMS_EINVAL for any other range. */
int lms__append_unreserve(lms__appender *a, uint32_t segment, uint64_t offset, uint64_t size);
/* fsync every segment written (and the folder when segments were created). */
int lms__append_sync(lms__appender *a);
/* Bytes reserved so far in this session (padding included). */
uint64_t lms__append_bytes(const lms__appender *a);
/* End the session. keep=false restores every segment to its size at begin
 * and unlinks segments the session created. Releases the lock, frees a. */
void lms__append_end(lms__appender *a, bool keep);

#ifdef __cplusplus
}
#endif
#endif
