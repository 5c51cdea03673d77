/*
 * loader/maps.c - the per-store table of segment mappings and of their
 * registrations with devices (loader_internal.h, invariants 1-5).
 *
 * The store handle is opaque to the loader and has no slot for it, so the
 * tables live in one process-wide list keyed by store handle. A table exists
 * while it holds a mapping; every mapping holds a store reference, so the
 * handle cannot be closed (and its address reused) under it.
 */
#include <errno.h>
#include <fcntl.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "loader/loader_internal.h"

typedef struct storetab {
    lms_store *store;
    lms__lmap *maps;
    struct storetab *next;
} storetab;

static lms__mutex g_mu = LMS__MUTEX_INIT;
static pthread_cond_t g_cv = PTHREAD_COND_INITIALIZER; /* a busy block or mapping changed state */
static storetab *g_tabs;

atomic_int lms__loader_test_refuse;
_Thread_local char lms__thread_tag;

static storetab *tab_find(lms_store *st, bool create)
{
    assert(lms__mutex_held(&g_mu));
    for (storetab *t = g_tabs; t; t = t->next)
        if (t->store == st)
            return t;
    if (!create)
        return NULL;
    storetab *t = lms__calloc(1, sizeof *t);
    if (!t)
        return NULL;
    t->store = st;
    t->next = g_tabs;
    g_tabs = t;
    return t;
}

static void tab_drop_if_empty(storetab *t)
{
    assert(lms__mutex_held(&g_mu));
    if (t->maps)
        return;
    for (storetab **pp = &g_tabs; *pp; pp = &(*pp)->next)
        if (*pp == t) {
            *pp = t->next;
            break;
        }
    lms__free(t);
}

int lms__lmap_acquire(lms_store *st, uint32_t seg, uint64_t need_end, lms__lmap **out)
{
    *out = NULL;
    lms__mutex_lock(&g_mu);
    storetab *t = tab_find(st, true);
    if (!t) {
        lms__mutex_unlock(&g_mu);
        return LMS_ENOMEM;
    }
    /* the newest mapping of seg comes first in the list */
    for (lms__lmap *m = t->maps; m; m = m->next) {
        if (m->sm.id == seg && m->sm.size >= need_end) {
            m->refs++;
            lms__mutex_unlock(&g_mu);
            *out = m;
            return 0;
        }
    }
    lms__mutex_unlock(&g_mu);

    /* Map outside the lock; two threads may race to map the same segment,
     * and the loser unmaps its copy (cheap, rare). */
    lms__lmap *m = lms__calloc(1, sizeof *m);
    if (!m)
        return LMS_ENOMEM;
    m->fd_direct = -1;
    int rc = lms__segment_map(st, seg, &m->sm);
    if (rc) {
        lms__free(m);
        return rc;
    }
    if (m->sm.size < need_end) {
        rc = lms__err(LMS_ECORRUPT, "%s: segment is %llu bytes, but the index has data up to byte %llu",
                      m->sm.path, (unsigned long long)m->sm.size, (unsigned long long)need_end);
        lms__segment_unmap(&m->sm);
        lms__free(m);
        return rc;
    }
    lms__mutex_lock(&g_mu);
    t = tab_find(st, true);
    if (!t) {
        lms__mutex_unlock(&g_mu);
        lms__segment_unmap(&m->sm);
        lms__free(m);
        return LMS_ENOMEM;
    }
    for (lms__lmap *o = t->maps; o; o = o->next) {
        if (o->sm.id == seg && o->sm.size >= need_end) { /* lost the race */
            o->refs++;
            lms__mutex_unlock(&g_mu);
            lms__segment_unmap(&m->sm);
            lms__free(m);
            *out = o;
            return 0;
        }
    }
    m->refs = 1;
    m->next = t->maps;
    t->maps = m;
    lms__store_ref(st);
    lms__mutex_unlock(&g_mu);
    *out = m;
    return 0;
}

void lms__lmap_release(lms_store *st, lms__lmap *m)
{
    if (!m)
        return;
    lms__mutex_lock(&g_mu);
    assert(m->refs > 0); /* invariant 2: released once per acquire */
    if (--m->refs > 0) {
        lms__mutex_unlock(&g_mu);
        return;
    }
    storetab *t = tab_find(st, false);
    if (t) {
        for (lms__lmap **pp = &t->maps; *pp; pp = &(*pp)->next)
            if (*pp == m) {
                *pp = m->next;
                break;
            }
        tab_drop_if_empty(t);
    }
    lms__mutex_unlock(&g_mu);

    /* Invariant 3: no block of an unused mapping is still registered (or
     * being registered): every holder released its reference first. */
    for (lms__regset *r = m->regs, *next; r; r = next) {
        next = r->next;
        for (size_t k = 0; k < r->nblocks; k++)
            assert(r->b[k].refs == 0 && (r->b[k].state == 0 || r->b[k].state == 3));
        lms__free(r->b);
        lms__free(r);
    }
    if (m->mlock_users > 0)
        munlock(m->sm.base, (size_t)m->sm.size);
    if (m->fd_direct >= 0)
        close(m->fd_direct);
    lms__segment_unmap(&m->sm);
    lms__free(m);
    lms__store_unref(st);
}

void lms__lmap_note_mlock(lms__lmap *m)
{
    lms__mutex_lock(&g_mu);
    assert(m->refs > 0);
    m->mlock_users++;
    lms__mutex_unlock(&g_mu);
}

int lms__lmap_mlock_users(lms__lmap *m)
{
    lms__mutex_lock(&g_mu);
    int n = m->mlock_users;
    lms__mutex_unlock(&g_mu);
    return n;
}

int lms__lmap_fd_direct(lms__lmap *m, bool *direct)
{
    lms__mutex_lock(&g_mu);
    assert(m->refs > 0); /* the file stays open while the mapping is held */
    if (m->fd_direct == -1) {
        int fd = open(m->sm.path, O_RDONLY | O_DIRECT | O_CLOEXEC);
        m->fd_direct = fd >= 0 ? fd : -2; /* tmpfs and some others refuse O_DIRECT */
    }
    int fd = m->fd_direct >= 0 ? m->fd_direct : m->sm.fd;
    *direct = m->fd_direct >= 0;
    lms__mutex_unlock(&g_mu);
    return fd;
}

/* ---- registrations ------------------------------------------------------------ */

static lms__regset *regset_get(lms__lmap *m, lms_device *dev, uint64_t block, bool create)
{
    assert(lms__mutex_held(&g_mu));
    assert(!create || (block > 0 && block % LMS__CHUNK_ALIGN == 0)); /* the grid: whole 2 MiB pages */
    for (lms__regset *r = m->regs; r; r = r->next)
        if (r->dev == dev)
            return r;
    if (!create)
        return NULL;
    lms__regset *r = lms__calloc(1, sizeof *r);
    if (!r)
        return NULL;
    r->dev = dev;
    r->block = block;
    r->nblocks = (size_t)((m->sm.size + block - 1) / block);
    r->b = lms__calloc(r->nblocks ? r->nblocks : 1, sizeof *r->b);
    if (!r->b) {
        lms__free(r);
        return NULL;
    }
    r->next = m->regs;
    m->regs = r;
    return r;
}

uint64_t lms__reg_grid(lms__lmap *m, lms_device *dev, uint64_t want)
{
    lms__mutex_lock(&g_mu);
    lms__regset *r = regset_get(m, dev, want, false);
    uint64_t g = r ? r->block : want;
    lms__mutex_unlock(&g_mu);
    return g;
}

static int do_register(lms__lmap *m, lms_device *dev, uint64_t block, size_t k, unsigned flags, void **dev_base)
{
    uint64_t off = k * block;
    uint64_t end = LMS_MIN(off + block, lms__align_up(m->sm.size, LMS__PAGE));
    int mode = atomic_load(&lms__loader_test_refuse);
    *dev_base = NULL;
    if (!dev->ops->host_register)
        return lms__err(LMS_EDEVICE, "%s: device '%s' cannot register host memory", m->sm.path, dev->ops->name);
    if (mode == LMS__REFUSE_SIMULATED)
        return lms__err(LMS_EDEVICE, "%s: host registration refused (test hook)", m->sm.path);
    if (mode == LMS__REFUSE_DROP_READONLY)
        flags &= ~(unsigned)LMS_REG_READONLY;
    int rc = dev->ops->host_register(dev, (void *)(m->sm.base + off), (size_t)(end - off), flags, dev_base);
    if (rc)
        return lms__err_prefix(rc, "%s: register bytes %llu..%llu", m->sm.path, (unsigned long long)off,
                               (unsigned long long)end);
    return 0;
}

int lms__reg_acquire(lms__lmap *m, lms_device *dev, uint64_t block, size_t k, unsigned flags, void **dev_base)
{
    lms__mutex_lock(&g_mu);
    assert(m->refs > 0); /* invariant 3: only a held mapping is registered */
    lms__regset *r = regset_get(m, dev, block, true);
    if (!r) {
        lms__mutex_unlock(&g_mu);
        return LMS_ENOMEM;
    }
    if (k >= r->nblocks) {
        lms__mutex_unlock(&g_mu);
        return lms__err(LMS_EINVAL, "%s: block %zu past the mapping", m->sm.path, k);
    }
    lms__regblock *b = &r->b[k];
    for (;;) {
        if (b->state == 2) {
            b->refs++;
            *dev_base = b->dev_ptr;
            lms__mutex_unlock(&g_mu);
            return 0;
        }
        if (b->state == 3) {
            lms__mutex_unlock(&g_mu);
            return lms__err(LMS_EDEVICE, "%s: host registration of block %zu was refused", m->sm.path, k);
        }
        if (b->state == 0)
            break;
        lms__mutex_wait(&g_cv, &g_mu);
    }
    b->state = 1;
    block = r->block;
    lms__mutex_unlock(&g_mu);

    void *dp = NULL;
    int rc = do_register(m, dev, block, k, flags, &dp);

    lms__mutex_lock(&g_mu);
    if (rc) {
        /* Remember a refusal only for real ones; a simulated refusal must
         * not outlive the test that asked for it. */
        b->state = atomic_load(&lms__loader_test_refuse) ? 0 : 3;
    } else {
        b->state = 2;
        b->refs = 1;
        b->dev_ptr = dp;
        *dev_base = dp;
    }
    pthread_cond_broadcast(&g_cv);
    lms__mutex_unlock(&g_mu);
    return rc;
}

void lms__reg_release(lms__lmap *m, lms_device *dev, size_t k)
{
    lms__mutex_lock(&g_mu);
    lms__regset *r = regset_get(m, dev, 0, false);
    /* registrations are balanced: only a reference taken by lms__reg_acquire is released */
    assert(r && k < r->nblocks && r->b[k].state == 2 && r->b[k].refs > 0);
    lms__regblock *b = &r->b[k];
    if (--b->refs > 0) {
        lms__mutex_unlock(&g_mu);
        return;
    }
    b->state = 1;
    uint64_t block = r->block;
    lms__mutex_unlock(&g_mu);

    dev->ops->host_unregister(dev, (void *)(m->sm.base + k * block));

    lms__mutex_lock(&g_mu);
    b->state = 0;
    b->dev_ptr = NULL;
    pthread_cond_broadcast(&g_cv);
    lms__mutex_unlock(&g_mu);
}
