/*
 * store/admin_internal.h - pieces shared by verify, gc, export and rm/cp/mv
 * (store/admin.c): the blob table of one snapshot, the segment files on disk,
 * the append lock taken without an append session, the reader grace period,
 * and the KV references (sessions -> pages) gc and verify must count.
 */
#ifndef LMS_STORE_ADMIN_INTERNAL_H
#define LMS_STORE_ADMIN_INTERNAL_H

#include "store/kv_records.h"
#include "store/store_internal.h"

/* ---- blobs of one snapshot, in key (hash) order ----------------------------------- */

typedef struct lms__blobent {
    uint8_t hash[16];
    lms__blob_rec rec;
    uint64_t counted;   /* references found in tensor (and KV) records */
    bool count_known;   /* counted covers every kind of referrer (tensor blobs always) */
    bool bad;           /* undecodable record (or failing its checksum), or outside its segment */
    bool sum_bad;       /* the record fails its checksum */
    bool wanted;        /* used by the model verify was asked about */
    bool corrupt;       /* bytes fail the hash (verify) */
} lms__blobent;

typedef struct lms__blobset {
    lms__blobent *v;
    size_t n;
} lms__blobset;

int lms__blobset_load(lms_store *s, MDB_txn *txn, lms__blobset *out);
bool lms__blobset_find(const lms__blobset *bs, const uint8_t hash[16], size_t *index);
/* Indexes of the blobs sorted by (segment, offset); lms__free. NULL on ENOMEM. */
size_t *lms__blobset_by_place(const lms__blobset *bs);
void lms__blobset_free(lms__blobset *bs);

/* ---- segment files on disk ---------------------------------------------------------- */

typedef struct lms__segent {
    uint32_t id;
    uint64_t size;       /* st_size */
    bool header_ok;
    char header_err[512];
    bool has_blobs;      /* some blob record points into it */
    bool wanted;         /* holds a blob of the model verify was asked about */
    uint64_t live_end;   /* end of the last blob in it */
    uint64_t live_bytes;
    lms__segmap map;     /* verify's mapping (fd -1 when unmapped) */
} lms__segent;

typedef struct lms__segset {
    lms__segent *v;
    size_t n;
} lms__segset;

/* List STORE/segments and read each header (not mapped). */
int lms__segset_load(lms_store *s, lms__segset *out);
lms__segent *lms__segset_find(const lms__segset *ss, uint32_t id);
void lms__segset_free(lms__segset *ss); /* unmaps */

/* ---- KV references ---------------------------------------------------------------------- */

/* The kvpages and sessions records of one snapshot, as verify and gc
 * follow them: sessions -> page keys -> kvpages records -> blobs. */
typedef struct lms__kvpage_ent {
    uint8_t key[16];
    lms__kvpage_rec rec;
    bool bad;      /* fails its checksum or does not decode */
    bool named;    /* some decodable session names it */
} lms__kvpage_ent;

typedef struct lms__kvsess_ent {
    char *name;               /* the key's bytes, NUL-terminated */
    uint8_t *copy;            /* the record (rec points into it) */
    lms__session_rec rec;
    int dec_rc;               /* 0, or why the record fails (LMS_ECORRUPT, LMS_EVERSION) */
} lms__kvsess_ent;

typedef struct lms__kvset {
    lms__kvpage_ent *pages;   /* in key order */
    size_t n_pages;
    lms__kvsess_ent *sess;    /* in name order */
    size_t n_sess;
    bool newer;               /* a session of a newer record version: which pages it names is unknown */
} lms__kvset;

/* Load both databases; each record that fails its checksum or does not
 * decode is reported to fn(ctx, session name or NULL, detail) (fn may be
 * NULL) and kept, marked. LMS_ENOMEM, LMS_EDB. Free with lms__kvset_free
 * also after a failure. */
typedef void (*lms__kv_problem_fn)(void *ctx, const char *session, const char *detail);
int lms__kvset_load(lms_store *s, MDB_txn *txn, lms__kvset *ks, lms__kv_problem_fn fn, void *ctx);
lms__kvpage_ent *lms__kvset_page(const lms__kvset *ks, const uint8_t key[16]);
void lms__kvset_free(lms__kvset *ks);

/* Wait until no LMDB reader still reads a snapshot older than the last
 * committed transaction (so none can reach bytes that commit unlinked from
 * the index). Stale slots of dead processes are cleared first. Returns true
 * when that happened within `seconds`. */
bool lms__admin_wait_readers(lms_store *s, double seconds);

/*
 * The read barrier (STORE/readers.lock) closes the window between a reader
 * reading records in a snapshot and holding the shared lock on the segments
 * they point into, for readers that end their snapshot before mapping (the
 * loader): such a reader holds the barrier shared from before it reads the
 * records until its segments are mapped and locked; gc, after committing and
 * before shrinking or unlinking anything, takes the barrier exclusively once
 * (and lets it go at once): every reader that read the old records has then
 * locked its segments, and every later one reads the new records.
 *
 *   int fd; lms__read_barrier_enter(s, &fd);   read records; map segments;
 *   lms__read_barrier_leave(fd);
 *
 * enter never fails a reader: when the lock file cannot be opened (a
 * read-only folder, where no gc can run either) *fd is -1.
 */
void lms__read_barrier_enter(lms_store *s, int *fd);
void lms__read_barrier_leave(int fd);
/* gc's side: true when every reader inside the barrier left within `seconds`. */
bool lms__read_barrier_wait(lms_store *s, double seconds);

/* ---- a model's tensors for export (export.c) ---------------------------------------------- */

typedef struct lms__etensor {
    char *name;
    lms__tensor_rec tr;
    lms__blob_rec br;
    const uint8_t *bytes; /* in the mapped segment, valid until lms__emodel_free */
    uint32_t shard;       /* export's placement */
    uint64_t begin;
} lms__etensor;

typedef struct lms__emodel {
    lms_store *s;
    const char *model;
    lms__etensor *t;      /* storage order */
    size_t n, cap;
    char *st_meta;        /* __metadata__ JSON or NULL */
    lms__segset segs;     /* mapped segments (shared locks) */
} lms__emodel;

/* Read a model's tensor records in one snapshot and map their segments.
 * LMS_ENOENT, LMS_ECORRUPT (blob missing or outside its segment), LMS_EIO.
 * Free with lms__emodel_free also after a failure. */
int lms__emodel_load(lms_store *s, const char *model, lms__emodel *e);
void lms__emodel_free(lms__emodel *e);

/* 32 hex digits of a 16-byte key, byte by byte (as `lmstore info` prints
 * blob hashes and page keys), NUL-terminated. */
void lms__admin_hex16(const void *key, char out[33]);

#endif
