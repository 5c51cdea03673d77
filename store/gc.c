/*
 * store/gc.c - `lmstore gc`: gives space back (lmstore/store.h, guarantee 2).
 *
 * Three steps, each leaving the index consistent if the process dies in it:
 *
 *   1. drop   (append lock, one txn): delete kvpages records no session
 *             names (dropping their blobs' references) and blob records
 *             with no references; remove stray "*.seg.tmp" files.
 *   2. compact (append session, one txn): copy the live blobs of sparse
 *             segments to the end of the store, fsync, then repoint them.
 *             A crash before the commit leaves unreferenced copies (step 3
 *             of the next gc trims them), after it the old copies.
 *   3. shrink (append lock, after the reader grace period; run before
 *             step 2 too, so compaction appends right after live data): for each
 *             segment, unlink it when no blob lives in it, else truncate
 *             the bytes past its last blob (left by crashed imports or by
 *             deleted blobs); each only under flock(LOCK_EX|LOCK_NB) on the
 *             segment, skipping (and reporting) segments a reader maps.
 *             Dead ranges between blobs get their disk blocks punched out
 *             (see punch_range), also only under that lock.
 *
 * Every blob record still in the index at step 3, whatever its count,
 * keeps its bytes: an import may revive a 0-reference blob at any time.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <linux/falloc.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/crashpoint.h"
#include "lmstore/store.h"
#include "store/admin_internal.h"
#include "store/kv_records.h"

lms_gc_params lms_gc_default_params(void)
{
    lms_gc_params p = {0};
    return p;
}

int lms_store_segment_bytes(lms_store *s, uint64_t *bytes, uint64_t *count)
{
    lms__segset ss;
    int rc = lms__segset_load(s, &ss);
    if (rc)
        return rc;
    uint64_t b = 0;
    for (size_t i = 0; i < ss.n; i++)
        b += ss.v[i].size;
    if (bytes)
        *bytes = b;
    if (count)
        *count = ss.n;
    lms__segset_free(&ss);
    return 0;
}

/* ---- step 1: drop unreferenced KV pages and blob records ------------------------------------ */

typedef struct keyset {
    uint8_t (*k)[16];
    size_t n, cap;
} keyset;

static int keyset_add(keyset *ks, const uint8_t key[16])
{
    if (ks->n == ks->cap) {
        size_t cap = ks->cap ? ks->cap * 2 : 256;
        void *nk = lms__realloc(ks->k, cap * 16);
        if (!nk)
            return LMS_ENOMEM;
        ks->k = nk;
        ks->cap = cap;
    }
    memcpy(ks->k[ks->n++], key, 16);
    return 0;
}

static int cmp16(const void *a, const void *b) { return memcmp(a, b, 16); }

static bool keyset_has(const keyset *ks, const uint8_t key[16])
{
    return ks->n && bsearch(key, ks->k, ks->n, 16, cmp16) != NULL;
}

/* Page keys every session names (sorted). Sessions that do not decode keep
 * nothing alive: verify reports them. */
static int session_pages(lms_store *s, MDB_txn *txn, keyset *ks)
{
    MDB_cursor *cur;
    MDB_val k, d;
    int mrc = mdb_cursor_open(txn, s->dbi[LMS__DB_SESSIONS], &cur);
    if (mrc)
        return lms__mdb_err(mrc, "%s: cursor", s->index_path);
    int rc = 0;
    for (mrc = mdb_cursor_get(cur, &k, &d, MDB_FIRST); mrc == 0 && !rc; mrc = mdb_cursor_get(cur, &k, &d, MDB_NEXT)) {
        lms__session_rec sr;
        if (lms__session_rec_decode(d.mv_data, d.mv_size, NULL, &sr) == LMS_EVERSION) {
            /* a newer build's session: we cannot tell its pages, so keep every page */
            rc = lms__err(LMS_EVERSION, "%s: a session record is newer than this build; gc left KV pages alone",
                          s->index_path);
            break;
        }
        if (lms__session_rec_decode(d.mv_data, d.mv_size, NULL, &sr))
            continue;
        for (uint32_t p = 0; p < lms__session_n_keys(&sr) && !rc; p++)
            rc = keyset_add(ks, lms__session_page_key(&sr, p));
    }
    mdb_cursor_close(cur);
    if (!rc && mrc && mrc != MDB_NOTFOUND)
        rc = lms__mdb_err(mrc, "%s: read sessions", s->index_path);
    if (!rc && ks->n)
        qsort(ks->k, ks->n, 16, cmp16);
    return rc;
}

typedef struct drop_ctx {
    bool dry;
    uint64_t kvpages, blobs, blob_bytes;
    bool kv_skipped;
} drop_ctx;

static int drop_txn(lms_store *s, MDB_txn *txn, void *vctx)
{
    drop_ctx *c = vctx;
    c->kvpages = c->blobs = c->blob_bytes = 0;
    c->kv_skipped = false;
    keyset ks = {0};
    MDB_cursor *cur = NULL;
    MDB_val k, d;
    int mrc, rc = session_pages(s, txn, &ks);
    if (rc == LMS_EVERSION) {
        c->kv_skipped = true;
        rc = 0;
    } else if (rc) {
        goto out;
    }
    if (!c->kv_skipped) {
        if ((mrc = mdb_cursor_open(txn, s->dbi[LMS__DB_KVPAGES], &cur))) {
            rc = lms__mdb_err(mrc, "%s: cursor", s->index_path);
            goto out;
        }
        for (mrc = mdb_cursor_get(cur, &k, &d, MDB_FIRST); mrc == 0;) {
            lms__kvpage_rec pr;
            if (k.mv_size != 16 || keyset_has(&ks, k.mv_data) ||
                lms__kvpage_rec_decode(d.mv_data, d.mv_size, &pr)) {
                mrc = mdb_cursor_get(cur, &k, &d, MDB_NEXT);
                continue;
            }
            c->kvpages++;
            if (!c->dry) {
                rc = lms__blob_ref(s, txn, pr.blob, -1, NULL);
                if (rc && rc != LMS_ENOENT)
                    goto out;
                if ((mrc = mdb_cursor_del(cur, 0))) {
                    rc = lms__mdb_err(mrc, "%s: delete from kvpages", s->index_path);
                    goto out;
                }
                mrc = mdb_cursor_get(cur, &k, &d, MDB_GET_CURRENT);
                if (mrc == EINVAL)
                    mrc = MDB_NOTFOUND;
            } else {
                mrc = mdb_cursor_get(cur, &k, &d, MDB_NEXT);
            }
        }
        mdb_cursor_close(cur);
        cur = NULL;
        if (mrc != MDB_NOTFOUND) {
            rc = lms__mdb_err(mrc, "%s: read kvpages", s->index_path);
            goto out;
        }
    }
    if ((mrc = mdb_cursor_open(txn, s->dbi[LMS__DB_BLOBS], &cur))) {
        rc = lms__mdb_err(mrc, "%s: cursor", s->index_path);
        goto out;
    }
    for (mrc = mdb_cursor_get(cur, &k, &d, MDB_FIRST); mrc == 0;) {
        lms__blob_rec br;
        if (lms__blob_rec_decode(d.mv_data, d.mv_size, &br) || br.refs != 0 ||
            (c->dry && br.kind == LMS__BLOB_KVPAGE)) {
            mrc = mdb_cursor_get(cur, &k, &d, MDB_NEXT);
            continue;
        }
        c->blobs++;
        c->blob_bytes += br.size;
        if (c->dry) {
            mrc = mdb_cursor_get(cur, &k, &d, MDB_NEXT);
            continue;
        }
        assert(lms__append_locked(s)); /* invariant 3: no import or cp is reviving it */
        if ((mrc = mdb_cursor_del(cur, 0))) {
            rc = lms__mdb_err(mrc, "%s: delete from blobs", s->index_path);
            goto out;
        }
        mrc = mdb_cursor_get(cur, &k, &d, MDB_GET_CURRENT);
        if (mrc == EINVAL)
            mrc = MDB_NOTFOUND;
    }
    if (mrc != MDB_NOTFOUND) {
        rc = lms__mdb_err(mrc, "%s: read blobs", s->index_path);
        goto out;
    }
    if (!c->dry)
        lms__crashpoint("gc:drop-before-commit");
    rc = 0;
out:
    if (cur)
        mdb_cursor_close(cur);
    lms__free(ks.k);
    return rc;
}

static void remove_tmp_segments(lms_store *s)
{
    DIR *d = opendir(s->seg_dir);
    if (!d)
        return;
    struct dirent *e;
    while ((e = readdir(d))) {
        size_t n = strlen(e->d_name);
        if (n > 8 && !strcmp(e->d_name + n - 8, ".seg.tmp")) {
            char path[4096];
            snprintf(path, sizeof path, "%s/%s", s->seg_dir, e->d_name);
            (void)unlink(path);
        }
    }
    closedir(d);
}

/* ---- step 2: compaction ----------------------------------------------------------------------- */

typedef struct move {
    uint8_t hash[16];
    uint32_t from_seg, to_seg;
    uint64_t from_off, to_off, size;
} move;

typedef struct repoint_ctx {
    move *m;
    size_t n;
    uint64_t moved, bytes;
} repoint_ctx;

static int repoint_txn(lms_store *s, MDB_txn *txn, void *vctx)
{
    repoint_ctx *c = vctx;
    c->moved = c->bytes = 0;
    for (size_t i = 0; i < c->n; i++) {
        move *m = &c->m[i];
        lms__blob_rec br;
        int rc = lms__blob_get(s, txn, m->hash, &br);
        if (rc == LMS_ENOENT)
            continue;
        if (rc)
            return rc;
        if (br.segment != m->from_seg || br.offset != m->from_off || br.size != m->size)
            continue; /* changed meanwhile: leave it */
        br.segment = m->to_seg;
        br.offset = m->to_off;
        if ((rc = lms__blob_put(s, txn, m->hash, &br)))
            return rc;
        c->moved++;
        c->bytes += m->size;
    }
    lms__crashpoint("gc:compact-before-commit");
    return 0;
}

/* Segments to compact: not the last (imports append there), holding blobs,
 * with a live fraction under the threshold. */
static bool compact_candidate(const lms__segent *g, const lms__segent *last, double below)
{
    if (g == last || !g->has_blobs || !g->header_ok || below <= 0)
        return false;
    uint64_t body = g->size > LMS__SEG_HEADER_SIZE ? g->size - LMS__SEG_HEADER_SIZE : 0;
    return body && (double)g->live_bytes < below * (double)body;
}

/* Fill has_blobs / live_bytes / live_end of each segment. live_only: count
 * only blobs with references (the dry-run forecast). Live bytes include each
 * blob's alignment padding: padding is not garbage compaction could win back. */
static void place_blobs(const lms__blobset *bs, lms__segset *ss, bool live_only, uint32_t align)
{
    for (size_t i = 0; i < bs->n; i++) {
        const lms__blobent *b = &bs->v[i];
        if (b->bad || (live_only && b->rec.refs == 0))
            continue;
        lms__segent *g = lms__segset_find(ss, b->rec.segment);
        if (!g)
            continue;
        g->has_blobs = true;
        g->live_bytes += lms__align_up(b->rec.size, align);
        uint64_t end = b->rec.offset + b->rec.size;
        if (end > g->live_end)
            g->live_end = end;
    }
}

/* Every blob record of a fresh snapshot, placed in the segment files. */
static int load_layout(lms_store *s, lms__blobset *bs, lms__segset *ss)
{
    MDB_txn *txn;
    int rc = lms__txn_read(s, &txn);
    if (rc)
        return rc;
    rc = lms__blobset_load(s, txn, bs);
    lms__txn_end(s, txn);
    if (!rc)
        rc = lms__segset_load(s, ss);
    if (!rc)
        place_blobs(bs, ss, false, s->alignment);
    return rc;
}

static int compact(lms_store *s, double below, lms_gc_report *rep)
{
    lms__blobset bs = {0};
    lms__segset ss = {0};
    move *moves = NULL;
    size_t n_moves = 0;
    size_t *idx = NULL;
    lms__appender *a = NULL;
    /* the append lock first: what we read cannot change under another gc */
    int rc = lms__append_begin(s, &a);
    if (rc)
        return rc;
    if ((rc = load_layout(s, &bs, &ss)))
        goto out;
    const lms__segent *last = ss.n ? &ss.v[ss.n - 1] : NULL;
    if (!(idx = lms__blobset_by_place(&bs)) || !(moves = lms__calloc(bs.n ? bs.n : 1, sizeof *moves))) {
        rc = LMS_ENOMEM;
        goto out;
    }
    for (size_t j = 0; j < bs.n; j++) {
        const lms__blobent *b = &bs.v[idx[j]];
        if (b->bad)
            continue;
        const lms__segent *g = lms__segset_find(&ss, b->rec.segment);
        if (!g || !compact_candidate(g, last, below) || b->rec.offset + b->rec.size > g->size)
            continue;
        move *m = &moves[n_moves++];
        memcpy(m->hash, b->hash, 16);
        m->from_seg = b->rec.segment;
        m->from_off = b->rec.offset;
        m->size = b->rec.size;
    }
    if (!n_moves)
        goto out;
    uint32_t in_seg = UINT32_MAX;
    int in_fd = -1;
    char in_path[4096];
    for (size_t i = 0; i < n_moves; i++) {
        move *m = &moves[i];
        if ((rc = lms__append_reserve(a, m->size, &m->to_seg, &m->to_off)))
            break;
        int out_fd;
        const char *out_path;
        if ((rc = lms__append_fd(a, m->to_seg, &out_fd, &out_path)))
            break;
        if (m->from_seg != in_seg) {
            if (in_fd >= 0)
                close(in_fd);
            in_seg = m->from_seg;
            if ((rc = lms__segment_path(s, in_seg, in_path, sizeof in_path)))
                break;
            in_fd = lms__open(in_path, O_RDONLY, 0);
            if (in_fd < 0) {
                rc = in_fd;
                break;
            }
        }
        if ((rc = lms__copy_range(in_fd, m->from_off, out_fd, m->to_off, m->size, in_path, out_path)))
            break;
    }
    if (in_fd >= 0)
        close(in_fd);
    if (rc)
        goto out;
    lms__crashpoint("gc:compact-copied");
    if ((rc = lms__append_sync(a)))
        goto out;
    lms__crashpoint("gc:compact-synced");
    repoint_ctx rc_ctx = {moves, n_moves, 0, 0};
    if ((rc = lms__txn_write(s, repoint_txn, &rc_ctx)))
        goto out;
    lms__append_end(a, true);
    a = NULL;
    lms__crashpoint("gc:compact-after-commit");
    rep->blobs_moved += rc_ctx.moved;
    rep->bytes_moved += rc_ctx.bytes;
out:
    lms__append_end(a, false);
    lms__free(idx);
    lms__free(moves);
    lms__segset_free(&ss);
    lms__blobset_free(&bs);
    return rc;
}

/* ---- step 3: shrink ----------------------------------------------------------------------------- */

/*
 * Give the disk blocks of dead ranges inside a segment back to the file
 * system (FALLOC_FL_PUNCH_HOLE, size kept): bytes a crashed import left that
 * later imports appended after, and bytes of deleted blobs between live
 * ones. Like truncation, only under flock(LOCK_EX) on the segment: a reader
 * that mapped it may still use ranges the index no longer reaches (an open
 * model that was removed meanwhile). Best effort; returns bytes freed.
 */
#define PUNCH_MIN (64u << 10)

static uint64_t punch_range(int fd, uint64_t a, uint64_t b, bool dry)
{
    a = lms__align_up(a, 4096);
    b &= ~(uint64_t)4095;
    if (b <= a || b - a < PUNCH_MIN)
        return 0;
    off_t d = lseek(fd, (off_t)a, SEEK_DATA); /* already a hole? */
    if (d < 0 || (uint64_t)d >= b)
        return 0;
    if (dry)
        return b - (uint64_t)d;
    if (lms__fault_hit(LMS_FAULT_WRITE))
        return 0;
    if (fallocate(fd, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, (off_t)d, (off_t)(b - (uint64_t)d)))
        return 0;
    return b - (uint64_t)d;
}

/* Punch every dead range of segment g before byte `end` (blobs of bs by
 * place in idx); dry: only count what would be punched. */
static uint64_t punch_segment(int fd, const lms__segent *g, const lms__blobset *bs, const size_t *idx, uint64_t end,
                              bool dry)
{
    uint64_t cur = LMS__SEG_HEADER_SIZE, freed = 0;
    for (size_t j = 0; j < bs->n; j++) {
        const lms__blobent *b = &bs->v[idx[j]];
        if (b->bad || b->rec.segment != g->id)
            continue;
        freed += punch_range(fd, cur, b->rec.offset, dry);
        cur = LMS_MAX(cur, b->rec.offset + b->rec.size);
    }
    return freed + punch_range(fd, cur, end, dry);
}

/* Segments reported busy in this gc run (shrink may run twice). */
typedef struct busy_set {
    uint32_t ids[256];
    size_t n;
} busy_set;

static bool busy_seen(busy_set *b, uint32_t id)
{
    for (size_t i = 0; i < b->n; i++)
        if (b->ids[i] == id)
            return true;
    if (b->n < LMS_ARRAY_LEN(b->ids))
        b->ids[b->n++] = id;
    return false;
}

static int shrink(lms_store *s, const lms_gc_params *p, lms_gc_busy_cb busy, void *ctx, lms_gc_report *rep,
                  busy_set *seen)
{
    int lock = -1;
    lms__blobset bs = {0};
    lms__segset ss = {0};
    size_t *idx = NULL;
    int rc = lms__admin_lock(s, &lock);
    if (rc)
        return rc;
    remove_tmp_segments(s);
    /* no blob record can disappear while we hold the lock; wait out readers
     * whose snapshots still reach bytes earlier commits released, and
     * readers between reading records and locking their segments */
    double grace = p->grace_seconds > 0 ? p->grace_seconds : 5.0;
    bool quiet = lms__admin_wait_readers(s, grace) && lms__read_barrier_wait(s, grace);
    if ((rc = load_layout(s, &bs, &ss)))
        goto out;
    if (!(idx = lms__blobset_by_place(&bs))) {
        rc = LMS_ENOMEM;
        goto out;
    }
    for (size_t i = 0; i < ss.n; i++) {
        lms__segent *g = &ss.v[i];
        uint64_t keep = g->has_blobs ? g->live_end : 0;
        if (g->has_blobs && keep < LMS__SEG_HEADER_SIZE)
            keep = LMS__SEG_HEADER_SIZE;
        if (g->has_blobs && !g->header_ok)
            continue;
        char path[4096];
        if ((rc = lms__segment_path(s, g->id, path, sizeof path)))
            goto out;
        int fd = lms__open(path, O_RDWR, 0);
        if (fd < 0) {
            if (fd == LMS_ENOMEM) {
                rc = fd;
                goto out;
            }
            continue; /* gone already */
        }
        /* anything to do? (holes: dead ranges still holding blocks) */
        bool holes = g->has_blobs && punch_segment(fd, g, &bs, idx, keep, true) > 0;
        if (g->has_blobs && g->size <= keep && !holes) {
            close(fd);
            continue;
        }
        /* Every change below needs the segment to ourselves: a process that
         * mapped it may still use bytes its (ended) snapshot showed it, even
         * ones the index no longer reaches (verify, an open model). */
        if (!quiet || flock(fd, LOCK_EX | LOCK_NB)) {
            close(fd);
            if (!busy_seen(seen, g->id)) {
                rep->segments_busy++;
                if (busy)
                    busy(ctx, g->id, path);
            }
            continue;
        }
        if (!g->has_blobs) {
            lms__crashpoint("gc:before-unlink");
            if (unlink(path) && errno != ENOENT) {
                rc = lms__err_errno(LMS_EIO, errno, "%s: unlink", path);
                close(fd);
                goto out;
            }
            rep->segments_removed++;
            lms__crashpoint("gc:after-unlink");
        } else {
            if (holes)
                rep->bytes_punched += punch_segment(fd, g, &bs, idx, keep, false);
            if (g->size > keep) {
                lms__crashpoint("gc:before-truncate");
                rc = lms__ftruncate(fd, keep, path);
                if (!rc)
                    rc = lms__fsync(fd, path);
                if (rc) {
                    close(fd);
                    goto out;
                }
                rep->segments_truncated++;
                lms__crashpoint("gc:after-truncate");
            }
        }
        close(fd);
    }
    if (rep->segments_removed)
        rc = lms__fsync_dir(s->seg_dir);
out:
    lms__free(idx);
    lms__segset_free(&ss);
    lms__blobset_free(&bs);
    lms__admin_unlock(s, lock);
    return rc;
}

/* ---- dry run -------------------------------------------------------------------------------------- */

/* Bytes shrink would punch out of segment g (kept up to byte `keep`). */
static uint64_t forecast_punch(lms_store *s, const lms__segent *g, const lms__blobset *bs, const size_t *idx,
                               uint64_t keep)
{
    char path[4096];
    if (lms__segment_path(s, g->id, path, sizeof path))
        return 0;
    int fd = lms__open(path, O_RDONLY, 0);
    if (fd < 0)
        return 0;
    uint64_t n = punch_segment(fd, g, bs, idx, keep, true);
    close(fd);
    return n;
}

static int forecast(lms_store *s, double below, lms_gc_report *rep)
{
    MDB_txn *txn = NULL;
    lms__blobset bs = {0};
    lms__segset ss = {0};
    size_t *idx = NULL;
    drop_ctx dc = {.dry = true};
    int rc = lms__txn_read(s, &txn);
    if (rc)
        return rc;
    rc = drop_txn(s, txn, &dc);
    if (!rc)
        rc = lms__blobset_load(s, txn, &bs);
    lms__txn_end(s, txn);
    if (rc)
        goto out;
    rep->blobs_deleted = dc.blobs;
    rep->kvpages_deleted = dc.kvpages;
    if ((rc = lms__segset_load(s, &ss)))
        goto out;
    place_blobs(&bs, &ss, true, s->alignment);
    for (size_t i = 0; i < bs.n; i++) /* blobs the drop step deletes leave holes */
        bs.v[i].bad = bs.v[i].bad || bs.v[i].rec.refs == 0;
    if (!(idx = lms__blobset_by_place(&bs))) {
        rc = LMS_ENOMEM;
        goto out;
    }
    const lms__segent *last = ss.n ? &ss.v[ss.n - 1] : NULL;
    for (size_t i = 0; i < ss.n; i++) {
        const lms__segent *g = &ss.v[i];
        if (!g->has_blobs) {
            rep->bytes_freed += g->size;
            rep->segments_removed++;
        } else if (compact_candidate(g, last, below)) {
            rep->bytes_freed += g->size - LMS_MIN(g->live_bytes, g->size); /* the live bytes move elsewhere */
            rep->bytes_moved += g->live_bytes;
            rep->segments_removed++;
        } else {
            uint64_t keep = LMS_MAX(g->live_end, (uint64_t)LMS__SEG_HEADER_SIZE);
            if (g->header_ok)
                rep->bytes_punched += forecast_punch(s, g, &bs, idx, keep);
            if (g->size > keep) {
                rep->bytes_freed += g->size - keep;
                rep->segments_truncated++;
            }
        }
    }
    rep->bytes_freed += rep->bytes_punched;
out:
    lms__free(idx);
    lms__segset_free(&ss);
    lms__blobset_free(&bs);
    return rc;
}

/* ---- entry ------------------------------------------------------------------------------------------ */

int lms_store_gc(lms_store *s, const lms_gc_params *params, lms_gc_busy_cb busy, void *ctx, lms_gc_report *report)
{
    lms_gc_params defp = lms_gc_default_params();
    lms_gc_report rep0;
    if (!params)
        params = &defp;
    if (!report)
        report = &rep0;
    memset(report, 0, sizeof *report);
    if (!s)
        return lms__err(LMS_EINVAL, "gc: no store");
    double t0 = lms__now();
    double below = params->compact_below == 0 ? 0.5 : params->compact_below;
    int rc = lms_store_segment_bytes(s, &report->bytes_before, NULL);
    if (rc)
        return rc;
    if (params->dry_run) {
        rc = forecast(s, below, report);
        report->bytes_after = report->bytes_before - LMS_MIN(report->bytes_freed, report->bytes_before);
        goto out;
    }
    if (s->rdonly)
        return lms__err(LMS_EINVAL, "%s: store is open read-only", s->path);

    /* 1. drop */
    int lock;
    if ((rc = lms__admin_lock(s, &lock)))
        goto out;
    drop_ctx dc = {.dry = false};
    rc = lms__txn_write(s, drop_txn, &dc);
    lms__admin_unlock(s, lock);
    if (rc)
        goto out;
    lms__crashpoint("gc:drop-after-commit");
    report->blobs_deleted = dc.blobs;
    report->kvpages_deleted = dc.kvpages;

    /* 3. shrink first as well: trimming the last segment's unreachable tail
     * (a crashed import or gc) lets compaction append right after live data
     * instead of after garbage no later gc could reach. 2. compact, 3. shrink. */
    busy_set seen = {.n = 0};
    if ((rc = shrink(s, params, busy, ctx, report, &seen)))
        goto out;
    if ((rc = compact(s, below, report)))
        goto out;
    if (report->blobs_moved && (rc = shrink(s, params, busy, ctx, report, &seen)))
        goto out;
    rc = lms_store_segment_bytes(s, &report->bytes_after, NULL);
    if (!rc) /* what the files shrank by, and the holes punched inside them (their size stays) */
        report->bytes_freed = (report->bytes_before > report->bytes_after ? report->bytes_before - report->bytes_after
                                                                          : 0) +
                              report->bytes_punched;
out:
    report->seconds = lms__now() - t0;
    return rc;
}
