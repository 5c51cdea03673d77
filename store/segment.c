/*
 * store/segment.c - segment files: the 4096-byte header, listing, read-only
 * mappings with shared locks, and the appender (the only writer of segment
 * bytes). docs/FORMAT.md "Segments" and "Locks" describe the bytes and the
 * locking protocol; store_internal.h the append session's states.
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "store/store_internal.h"

/* ---- header ------------------------------------------------------------------- */

void lms__segment_header_encode(uint8_t hdr[LMS__SEG_HEADER_SIZE], uint32_t id, const uint8_t uuid[16],
                                uint32_t alignment, uint64_t created)
{
    memset(hdr, 0, LMS__SEG_HEADER_SIZE);
    memcpy(hdr, LMS__SEG_MAGIC, 8);
    lms__put_u32(hdr + 8, LMS__SEG_BOM);
    lms__put_u32(hdr + 12, LMS__SEG_VERSION);
    lms__put_u32(hdr + 16, id);
    lms__put_u32(hdr + 20, LMS__SEG_HEADER_SIZE);
    memcpy(hdr + 24, uuid, 16);
    lms__put_u32(hdr + 40, alignment);
    lms__put_u32(hdr + 44, 0);
    lms__put_u64(hdr + 48, created);
    lms__put_u64(hdr + 56, lms__hash64(hdr, 56, 0));
}

int lms__segment_header_check(const void *buf, size_t len, const uint8_t *uuid, uint32_t expect_id,
                              const char *path)
{
    const uint8_t *h = buf;
    if (len < LMS__SEG_HEADER_SIZE)
        return lms__err(LMS_ECORRUPT, "%s: segment header truncated (%zu of %u bytes)", path, len,
                        LMS__SEG_HEADER_SIZE);
    if (memcmp(h, LMS__SEG_MAGIC, 8) != 0)
        return lms__err(LMS_ECORRUPT, "%s: not an lmstore segment (bad magic)", path);
    uint32_t bom = lms__get_u32(h + 8);
    if (bom != LMS__SEG_BOM)
        return lms__err(LMS_ECORRUPT, "%s: segment byte-order mark is 0x%08x, expected 0x%08x%s", path, bom,
                        LMS__SEG_BOM, bom == 0x0D0C0B0Au ? " (written big-endian)" : "");
    if (lms__get_u64(h + 56) != lms__hash64(h, 56, 0))
        return lms__err(LMS_ECORRUPT, "%s: segment header checksum mismatch", path);
    uint32_t ver = lms__get_u32(h + 12);
    if (ver != LMS__SEG_VERSION)
        return lms__err(ver > LMS__SEG_VERSION ? LMS_EVERSION : LMS_ECORRUPT,
                        "%s: segment format version %u, this build reads %u", path, ver, LMS__SEG_VERSION);
    if (lms__get_u32(h + 20) != LMS__SEG_HEADER_SIZE)
        return lms__err(LMS_ECORRUPT, "%s: segment header size is not %u", path, LMS__SEG_HEADER_SIZE);
    uint32_t align = lms__get_u32(h + 40);
    if (align < 64 || align > LMS__MAX_ALIGNMENT || (align & (align - 1)))
        return lms__err(LMS_ECORRUPT, "%s: segment alignment %u is invalid", path, align);
    for (size_t i = 64; i < LMS__SEG_HEADER_SIZE; i++)
        if (h[i])
            return lms__err(LMS_ECORRUPT, "%s: segment header reserved byte %zu is not zero", path, i);
    if (expect_id != UINT32_MAX && lms__get_u32(h + 16) != expect_id)
        return lms__err(LMS_ECORRUPT, "%s: segment header names segment %u", path, lms__get_u32(h + 16));
    if (uuid && memcmp(h + 24, uuid, 16) != 0)
        return lms__err(LMS_ECORRUPT, "%s: segment belongs to another store (uuid differs)", path);
    return 0;
}

int lms__segment_path(const lms_store *s, uint32_t id, char *buf, size_t len)
{
    int n = snprintf(buf, len, "%s/%08u.seg", s->seg_dir, id);
    if (n < 0 || (size_t)n >= len)
        return lms__err(LMS_ERANGE, "%s: segment path too long", s->seg_dir);
    return 0;
}

static int cmp_u32(const void *a, const void *b)
{
    uint32_t x = *(const uint32_t *)a, y = *(const uint32_t *)b;
    return x < y ? -1 : x > y;
}

int lms__segment_list(const lms_store *s, uint32_t **ids, size_t *n)
{
    *ids = NULL;
    *n = 0;
    DIR *d = opendir(s->seg_dir);
    if (!d)
        return lms__err_errno(LMS_EIO, errno, "%s", s->seg_dir);
    uint32_t *v = NULL;
    size_t cnt = 0, cap = 0;
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d))) {
        const char *nm = e->d_name;
        if (strlen(nm) != 12 || strcmp(nm + 8, ".seg") != 0)
            continue;
        uint32_t id = 0;
        bool ok = true;
        for (int i = 0; i < 8; i++) {
            if (nm[i] < '0' || nm[i] > '9') {
                ok = false;
                break;
            }
            id = id * 10 + (uint32_t)(nm[i] - '0');
        }
        if (!ok)
            continue;
        if (cnt == cap) {
            cap = cap ? cap * 2 : 16;
            uint32_t *nv = lms__realloc(v, cap * sizeof *v);
            if (!nv) {
                rc = LMS_ENOMEM;
                break;
            }
            v = nv;
        }
        v[cnt++] = id;
    }
    closedir(d);
    if (rc) {
        lms__free(v);
        return rc;
    }
    if (cnt)
        qsort(v, cnt, sizeof *v, cmp_u32);
    *ids = v;
    *n = cnt;
    return 0;
}

/* ---- read-only mappings ------------------------------------------------------------ */

int lms__segment_map(lms_store *s, uint32_t id, lms__segmap *m)
{
    memset(m, 0, sizeof *m);
    m->fd = -1;
    m->id = id;
    int rc = lms__segment_path(s, id, m->path, sizeof m->path);
    if (rc)
        return rc;
    m->fd = lms__open(m->path, O_RDONLY, 0);
    if (m->fd < 0) {
        rc = m->fd;
        m->fd = -1;
        return rc;
    }
    if (flock(m->fd, LOCK_SH)) {
        rc = lms__err_errno(LMS_EIO, errno, "%s: flock", m->path);
        goto out_close;
    }
    rc = lms__fstat_size(m->fd, &m->size, m->path);
    if (rc)
        goto out_close;
    if (m->size < LMS__SEG_HEADER_SIZE) {
        rc = lms__err(LMS_ECORRUPT, "%s: segment is %llu bytes, shorter than its header", m->path,
                      (unsigned long long)m->size);
        goto out_close;
    }
    void *p = mmap(NULL, (size_t)m->size, PROT_READ, MAP_SHARED, m->fd, 0);
    if (p == MAP_FAILED) {
        /* ENOMEM: out of address space (RLIMIT_AS) or map count: memory, not a damaged file */
        rc = errno == ENOMEM ? lms__err(LMS_ENOMEM, "%s: mapping its %llu bytes: out of memory (address space)",
                                        m->path, (unsigned long long)m->size)
                             : lms__err_errno(LMS_EIO, errno, "%s: mmap", m->path);
        goto out_close;
    }
    m->base = p;
    rc = lms__segment_header_check(m->base, LMS__SEG_HEADER_SIZE, s->uuid, id, m->path);
    if (rc)
        goto out_unmap;
    return 0;
out_unmap:
    munmap((void *)m->base, (size_t)m->size);
    m->base = NULL;
out_close:
    close(m->fd); /* also drops the flock */
    m->fd = -1;
    return rc;
}

void lms__segment_unmap(lms__segmap *m)
{
    if (!m)
        return;
    /* only a successful lms__segment_map leaves base set; a failed one has
     * already closed its fd, so a zeroed struct is safe here too */
    if (m->base) {
        munmap((void *)m->base, (size_t)m->size);
        close(m->fd);
    }
    m->base = NULL;
    m->fd = -1;
}

/* ---- the append lock ------------------------------------------------------------- */

static int flock_ex(int fd, const char *path)
{
    while (flock(fd, LOCK_EX))
        if (errno != EINTR)
            return lms__err_errno(LMS_EIO, errno, "%s: flock", path);
    return 0;
}

int lms__lock_take(lms_store *s, lms__lock *l)
{
    *l = LMS__LOCK_NONE;
    if (s->rdonly)
        return lms__err(LMS_EINVAL, "%s: store is open read-only", s->path);
    int rc;
    for (int tries = 0;; tries++) {
        int fd = lms__open(s->lock_path, O_RDWR | O_CREAT, 0644);
        if (fd < 0)
            return fd;
        struct stat a, b;
        if ((rc = flock_ex(fd, s->lock_path)) || (rc = fstat(fd, &a) ? lms__err_errno(LMS_EIO, errno, "%s: stat",
                                                                                      s->lock_path)
                                                                    : 0)) {
            close(fd);
            return rc;
        }
        if (stat(s->lock_path, &b) == 0 && a.st_dev == b.st_dev && a.st_ino == b.st_ino) {
            l->file_fd = fd;
            break;
        }
        close(fd); /* deleted or replaced while we waited: lock what the path names now */
        if (tries == 1000)
            return lms__err(LMS_EBUSY, "%s: the lock file keeps being deleted or replaced", s->lock_path);
    }
    l->dir_fd = lms__open(s->path, O_RDONLY | O_DIRECTORY, 0);
    if (l->dir_fd < 0 || (rc = flock_ex(l->dir_fd, s->path))) {
        rc = l->dir_fd < 0 ? l->dir_fd : rc;
        if (l->dir_fd >= 0)
            close(l->dir_fd);
        close(l->file_fd);
        *l = LMS__LOCK_NONE;
        return rc;
    }
    atomic_fetch_add(&s->append_locks, 1);
    return 0;
}

void lms__lock_release(lms_store *s, lms__lock *l)
{
    if (l->dir_fd < 0)
        return;
    int was = atomic_fetch_sub(&s->append_locks, 1);
    assert(was > 0);
    (void)was;
    close(l->dir_fd); /* releases the flocks */
    close(l->file_fd);
    *l = LMS__LOCK_NONE;
}

/* ---- appender ------------------------------------------------------------------ */

typedef struct seg_state {
    uint32_t id;
    int fd;
    bool created;  /* by this session: unlinked on failure */
    uint64_t size0; /* size at begin (pre-existing segments) */
    uint64_t end;   /* end of the last reservation */
    char path[4096];
} seg_state;

struct lms__appender {
    lms_store *s;
    lms__lock lock; /* held: counted in s->append_locks */
    seg_state *segs;
    size_t n, cap;
    seg_state *cur; /* index into segs is stable: we store the position */
    size_t cur_i;
    bool have_cur;
    uint32_t next_id;
    uint64_t reserved;
};

static int add_seg(lms__appender *a, seg_state **out)
{
    if (a->n == a->cap) {
        size_t cap = a->cap ? a->cap * 2 : 4;
        seg_state *v = lms__realloc(a->segs, cap * sizeof *v);
        if (!v)
            return LMS_ENOMEM;
        a->segs = v;
        a->cap = cap;
    }
    seg_state *g = &a->segs[a->n++];
    memset(g, 0, sizeof *g);
    g->fd = -1;
    *out = g;
    return 0;
}

static int create_segment(lms__appender *a, uint32_t id)
{
    lms_store *s = a->s;
    seg_state *g;
    int rc = add_seg(a, &g);
    if (rc)
        return rc;
    g->id = id;
    rc = lms__segment_path(s, id, g->path, sizeof g->path);
    if (rc)
        goto fail;
    if (lms__path_exists(g->path)) {
        rc = lms__err(LMS_ECORRUPT, "%s: segment already exists", g->path);
        goto fail;
    }
    char tmp[4200];
    snprintf(tmp, sizeof tmp, "%s.tmp", g->path);
    int fd = lms__open(tmp, O_RDWR | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) {
        rc = fd;
        goto fail;
    }
    uint8_t *hdr = lms__malloc(LMS__SEG_HEADER_SIZE);
    if (!hdr) {
        rc = LMS_ENOMEM;
        close(fd);
        unlink(tmp);
        goto fail;
    }
    lms__segment_header_encode(hdr, id, s->uuid, s->alignment, lms__unix_time());
    rc = lms__pwrite_all(fd, hdr, LMS__SEG_HEADER_SIZE, 0, tmp);
    lms__free(hdr);
    if (!rc)
        rc = lms__fsync(fd, tmp);
    if (!rc && rename(tmp, g->path))
        rc = lms__err_errno(LMS_EIO, errno, "%s: rename", g->path);
    if (rc) {
        close(fd);
        unlink(tmp);
        goto fail;
    }
    g->fd = fd;
    g->created = true;
    g->size0 = 0;
    g->end = LMS__SEG_HEADER_SIZE;
    a->cur_i = a->n - 1;
    a->have_cur = true;
    a->next_id = id + 1;
    return 0;
fail:
    a->n--;
    return rc;
}

int lms__append_begin(lms_store *s, lms__appender **out)
{
    *out = NULL;
    if (s->rdonly)
        return lms__err(LMS_EINVAL, "%s: store is open read-only", s->path);
    lms__appender *a = lms__calloc(1, sizeof *a);
    if (!a)
        return LMS_ENOMEM;
    a->s = s;
    a->next_id = 1;
    a->lock = LMS__LOCK_NONE;
    int rc = lms__lock_take(s, &a->lock);
    if (rc)
        goto fail;
    uint32_t *ids;
    size_t n;
    rc = lms__segment_list(s, &ids, &n);
    if (rc)
        goto fail;
    if (n) {
        uint32_t last = ids[n - 1];
        lms__free(ids);
        seg_state *g;
        if ((rc = add_seg(a, &g)))
            goto fail;
        g->id = last;
        if ((rc = lms__segment_path(s, last, g->path, sizeof g->path)))
            goto fail;
        g->fd = lms__open(g->path, O_RDWR, 0);
        if (g->fd < 0) {
            rc = g->fd;
            g->fd = -1;
            goto fail;
        }
        uint8_t hdr[LMS__SEG_HEADER_SIZE];
        if ((rc = lms__fstat_size(g->fd, &g->size0, g->path)))
            goto fail;
        if ((rc = lms__pread_all(g->fd, hdr, sizeof hdr, 0, g->path)) ||
            (rc = lms__segment_header_check(hdr, sizeof hdr, s->uuid, last, g->path)))
            goto fail;
        g->end = g->size0;
        a->cur_i = 0;
        a->have_cur = true;
        a->next_id = last + 1;
    } else {
        lms__free(ids);
    }
    *out = a;
    return 0;
fail:
    lms__append_end(a, false);
    return rc;
}

int lms__append_reserve(lms__appender *a, uint64_t size, uint32_t *segment, uint64_t *offset)
{
    lms_store *s = a->s;
    assert(a->lock.dir_fd >= 0); /* invariant 3: appends under the append lock */
    uint64_t off = 0, end = 0;
    if (a->have_cur) {
        seg_state *g = &a->segs[a->cur_i];
        off = lms__align_up(g->end, s->alignment);
        bool has_blobs = g->end > LMS__SEG_HEADER_SIZE;
        if ((lms__add_overflow(off, size, &end) || end > s->segment_max) && has_blobs)
            a->have_cur = false;
    }
    if (!a->have_cur) {
        if (a->next_id == UINT32_MAX)
            return lms__err(LMS_ERANGE, "%s: out of segment numbers", s->seg_dir);
        int rc = create_segment(a, a->next_id);
        if (rc)
            return rc;
        off = lms__align_up(LMS__SEG_HEADER_SIZE, s->alignment);
    }
    seg_state *g = &a->segs[a->cur_i];
    if (lms__add_overflow(off, size, &end))
        return lms__err(LMS_ERANGE, "%s: blob of %llu bytes overflows the segment", g->path,
                        (unsigned long long)size);
    a->reserved += end - g->end;
    g->end = end;
    *segment = g->id;
    *offset = off;
    return 0;
}

static seg_state *find_seg(lms__appender *a, uint32_t id)
{
    for (size_t i = 0; i < a->n; i++)
        if (a->segs[i].id == id)
            return &a->segs[i];
    return NULL;
}

int lms__append_unreserve(lms__appender *a, uint32_t segment, uint64_t offset, uint64_t size)
{
    seg_state *g = find_seg(a, segment);
    if (!g || !a->have_cur || g != &a->segs[a->cur_i] || offset + size != g->end)
        return lms__err(LMS_EINVAL, "only the last range reserved in an append session can be given back");
    a->reserved -= size;
    g->end = offset;
    /* nothing committed lies past offset (invariant 2 holds) */
    return lms__ftruncate(g->fd, offset, g->path);
}

int lms__append_fd(lms__appender *a, uint32_t segment, int *fd, const char **path)
{
    seg_state *g = find_seg(a, segment);
    if (!g)
        return lms__err(LMS_EINVAL, "segment %u is not part of this append session", segment);
    *fd = g->fd;
    if (path)
        *path = g->path;
    return 0;
}

int lms__append_write(lms__appender *a, uint32_t segment, uint64_t offset, const void *buf, size_t len)
{
    assert(a->lock.dir_fd >= 0);
    seg_state *g = find_seg(a, segment);
    if (!g)
        return lms__err(LMS_EINVAL, "segment %u is not part of this append session", segment);
    if (offset < (g->created ? LMS__SEG_HEADER_SIZE : g->size0) || offset + len > g->end)
        return lms__err(LMS_EINVAL, "%s: write at %llu outside the reserved range", g->path,
                        (unsigned long long)offset);
    return lms__pwrite_all(g->fd, buf, len, offset, g->path);
}

int lms__append_sync(lms__appender *a)
{
    bool created = false;
    for (size_t i = 0; i < a->n; i++) {
        seg_state *g = &a->segs[i];
        if (!g->created && g->end == g->size0)
            continue;
        uint64_t size;
        int rc = lms__fstat_size(g->fd, &size, g->path);
        if (!rc && size < g->end)
            rc = lms__ftruncate(g->fd, g->end, g->path);
        if (!rc)
            rc = lms__fsync(g->fd, g->path);
        if (rc)
            return rc;
        created |= g->created;
    }
    return created ? lms__fsync_dir(a->s->seg_dir) : 0;
}

uint64_t lms__append_bytes(const lms__appender *a) { return a->reserved; }

void lms__append_end(lms__appender *a, bool keep)
{
    if (!a)
        return;
    bool unlinked = false;
    for (size_t i = 0; i < a->n; i++) {
        seg_state *g = &a->segs[i];
        if (!keep && g->fd >= 0) {
            if (g->created) {
                unlink(g->path);
                unlinked = true;
            } else if (g->end > g->size0) {
                uint64_t size;
                if (lms__fstat_size(g->fd, &size, g->path) == 0 && size != g->size0) {
                    /* best effort: failure here leaves unreferenced bytes for gc */
                    if (ftruncate(g->fd, (off_t)g->size0) == 0)
                        (void)fsync(g->fd);
                }
            }
        }
        if (g->fd >= 0)
            close(g->fd);
    }
    if (unlinked) {
        int dfd = open(a->s->seg_dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
        if (dfd >= 0) {
            (void)fsync(dfd);
            close(dfd);
        }
    }
    lms__lock_release(a->s, &a->lock);
    lms__free(a->segs);
    lms__free(a);
}
