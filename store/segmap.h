/*
 * store/segmap.h - what a reader of stored bytes outside store/ (the
 * loader) needs of the store: a read-only, share-locked mapping of a whole
 * segment, and the reference that keeps the store open under it. No LMDB,
 * no records: where a tensor lies comes from the public lms_store_* calls
 * and store/admin_internal.h's model records.
 *
 * Invariants (store_internal.h, invariant 5: gc never moves or punches
 * bytes under a reader):
 *  (1) A mapping holds flock(LOCK_SH) on its segment from lms__segment_map
 *      to lms__segment_unmap; gc compacts or truncates a segment only under
 *      LOCK_EX|LOCK_NB, so mapped bytes never change under the mapping.
 *  (2) Bytes are read through lms__segmap_at, which asserts that the
 *      segment is mapped and the range inside it (the caller checks ranges
 *      from records, which are untrusted, before).
 *  (3) A handle that maps segments for a model holds lms__store_ref, so
 *      lms_store_close refuses (LMS_EBUSY) while any is mapped.
 */
#ifndef LMS_STORE_SEGMAP_H
#define LMS_STORE_SEGMAP_H

#include <assert.h>
#include <stdint.h>

#include "lmstore/store.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LMS__SEG_HEADER_SIZE 4096u /* a segment's header; data starts after it */

/* Children (models, kv caches) call these so that lms_store_close can refuse
 * to close under them. */
void lms__store_ref(lms_store *s);
void lms__store_unref(lms_store *s);

/* A read-only mapping of a whole segment, with flock(LOCK_SH) held while mapped. */
typedef struct lms__segmap {
    uint32_t id;
    int fd;
    const uint8_t *base; /* PROT_READ, MAP_SHARED; valid until lms__segment_unmap */
    uint64_t size;
    char path[4096];
} lms__segmap;
int lms__segment_map(lms_store *s, uint32_t id, lms__segmap *m);
void lms__segment_unmap(lms__segmap *m); /* safe on a zeroed struct or after a failed map */
/* Bytes [offset, offset + len) of a mapping. The segment must be mapped (and
 * so share-locked) and the caller must have checked the range against
 * m->size: records are untrusted, this only asserts that it was done. */
static inline const uint8_t *lms__segmap_at(const lms__segmap *m, uint64_t offset, uint64_t len)
{
    assert(m->base && m->fd >= 0);
    assert(offset <= m->size && len <= m->size - offset);
    return m->base + offset;
}

#ifdef __cplusplus
}
#endif
#endif
