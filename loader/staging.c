/*
 * loader/staging.c - host memory pinned once per device for the resident
 * loads' staging rings (lms_device_reserve_staging), lent to one load at a
 * time.
 *
 * Why: a load that pins its own ring pays for it before its first layer is
 * on the device, and its first registrations slow the arena allocation
 * beside them. On the H200 host a 16 GB load's first layer took 26 ms that
 * way and 12-15 ms with the ring reserved, of which ~8 ms are the copy
 * itself (bench/RESULTS.md, loader runs 4-9). Pinned once, when the device
 * is opened, the cost (one registration, 14-23 ms for 96 MiB there) is paid
 * once per process, as the CUDA context's own staging buffers are.
 *
 * Lifetime: the pool belongs to the device (lms_device.staging) and is
 * unpinned and freed by lms_device_close, which must not run while a model
 * of that device is open (the device must outlive its models). A load takes
 * it with lms__staging_borrow and gives it back with lms__staging_return
 * once the copies out of it are complete; loads that find it lent (or too
 * small) pin a ring of their own.
 *
 * One process-wide mutex guards every device's pool pointer and lent flag:
 * taken once per load and per reservation, never around the slow pinning.
 */
#include <pthread.h>
#include <sys/mman.h>

#include "loader/loader_internal.h"

struct lms__staging {
    uint8_t *base;
    size_t bytes;
    bool registered; /* our allocation pinned with host_register; else the device's alloc_host */
    bool lent;       /* guarded by staging_mu */
};

static lms__mutex staging_mu = LMS__MUTEX_INIT;

/* Lend the pool (lent = true) or take it back: under staging_mu, and only
 * as a change (one borrower at a time, one return per borrow). */
static void set_lent(lms__staging *s, bool lent)
{
    assert(lms__mutex_held(&staging_mu));
    assert(s->lent != lent);
    s->lent = lent;
}

static void staging_free(lms_device *d, lms__staging *s)
{
    if (!s)
        return;
    assert(!s->lent); /* unpublished and returned: nobody copies out of it */
    lms__pinned_free(d, s->base, s->registered);
    lms__free(s);
}

int lms__pinned_alloc(lms_device *dev, size_t bytes, void **out, bool *registered)
{
    *out = NULL;
    *registered = false;
    int rc = LMS_EDEVICE;
    if (dev->ops->host_register && dev->ops->host_unregister) {
        /* huge pages registered in one call: far cheaper than the pinned allocator (RESULTS.md, run 3) */
        void *p = lms__aligned_alloc((size_t)LMS__CHUNK_ALIGN, (size_t)lms__align_up(bytes, LMS__CHUNK_ALIGN));
        if (!p)
            return lms__err(LMS_ENOMEM, "device '%s': %zu bytes of host memory to pin", dev->ops->name, bytes);
#ifdef MADV_HUGEPAGE
        (void)madvise(p, bytes, MADV_HUGEPAGE); /* best effort */
#endif
        void *dp = NULL;
        if ((rc = dev->ops->host_register(dev, p, bytes, 0, &dp)) == 0) {
            *out = p;
            *registered = true;
            return 0;
        }
        lms__free(p); /* refused: the pinned allocator below */
    }
    if (dev->ops->alloc_host) {
        lms_clear_error();
        rc = dev->ops->alloc_host(dev, bytes, out);
    }
    if (rc)
        return lms__err_prefix(rc, "device '%s': pinning %zu bytes of host memory: ", dev->ops->name, bytes);
    return 0;
}

void lms__pinned_free(lms_device *dev, void *p, bool registered)
{
    if (!p)
        return;
    if (registered) {
        (void)dev->ops->host_unregister(dev, p);
        lms__free(p);
    } else {
        dev->ops->free_host(dev, p);
    }
}

int lms_device_reserve_staging(lms_device *dev, size_t bytes)
{
    if (!dev)
        return lms__err(LMS_EINVAL, "lms_device_reserve_staging: device is NULL");
    if (!bytes)
        bytes = lms_model_staging_bytes(NULL);
    bytes = (size_t)lms__align_up(bytes, LMS__CHUNK_ALIGN);
    lms__mutex_lock(&staging_mu);
    lms__staging *old = dev->staging;
    bool covered = old && old->bytes >= bytes, lent = old && old->lent;
    lms__mutex_unlock(&staging_mu);
    if (covered)
        return 0;
    if (lent)
        return lms__err(LMS_EBUSY, "device '%s': its staging memory is in use by a load", dev->ops->name);
    if (!dev->ops->alloc_host && !dev->ops->host_register)
        return lms__err(LMS_EUNSUPPORTED, "device '%s' has no pinned host memory", dev->ops->name);
    lms__staging *s = lms__calloc(1, sizeof *s);
    if (!s)
        return LMS_ENOMEM;
    s->bytes = bytes;
    void *p = NULL;
    int rc = lms__pinned_alloc(dev, bytes, &p, &s->registered);
    if (rc) {
        lms__free(s);
        return lms__err_prefix(rc, "staging memory: ");
    }
    s->base = p;
    /* publish it, unless a load borrowed the old pool meanwhile */
    lms__mutex_lock(&staging_mu);
    old = dev->staging;
    if (old && old->lent) {
        lms__mutex_unlock(&staging_mu);
        staging_free(dev, s);
        return lms__err(LMS_EBUSY, "device '%s': its staging memory is in use by a load", dev->ops->name);
    }
    dev->staging = s;
    lms__mutex_unlock(&staging_mu);
    staging_free(dev, old); /* unpublished and not lent: nobody can reach it */
    return 0;
}

uint8_t *lms__staging_borrow(lms_device *dev, size_t bytes)
{
    uint8_t *base = NULL;
    lms__mutex_lock(&staging_mu);
    lms__staging *s = dev->staging;
    if (s && s->bytes >= bytes && !s->lent) {
        set_lent(s, true);
        base = s->base;
    }
    lms__mutex_unlock(&staging_mu);
    return base;
}

void lms__staging_return(lms_device *dev)
{
    lms__mutex_lock(&staging_mu);
    /* the pool a load borrowed is never replaced while lent (lms_device_reserve_staging) */
    assert(dev->staging);
    set_lent(dev->staging, false);
    lms__mutex_unlock(&staging_mu);
}

void lms__staging_release(lms_device *dev)
{
    lms__mutex_lock(&staging_mu);
    lms__staging *s = dev->staging;
    assert(!s || !s->lent); /* the device outlives its models, so no load holds the pool */
    dev->staging = NULL;
    lms__mutex_unlock(&staging_mu);
    staging_free(dev, s);
}
