/*
 * loader/resident.c - the resident placement: every weight copied into one
 * device arena, layer by layer, while the caller already computes.
 *
 * The model's unique tensor bytes are grouped into extents (runs of tensors
 * that follow each other in one segment, padding included) in copy order
 * (lms_load_order), and each extent is cut into chunks: at most chunk_bytes,
 * never across a registration block, and ending where a layer ends. One loader thread issues the chunk
 * copies in order, round-robin over the streams; after the last chunk of a
 * layer it records that layer's event on every stream, so
 * lms_model_wait_layer(l) waits for exactly the copies that layer needs.
 * Worker threads prepare chunks ahead of the issuing thread:
 *
 *   mode          chunk source                       prepared by
 *   REGISTERED    the mapping, pinned in place       lms__reg_acquire (cudaHostRegister)
 *   STAGE_MAP     a pinned ring slot                 memcpy from the mapping
 *   STAGE_READ    a pinned ring slot                 pread from the file (page cache)
 *   STAGE_DIRECT  a pinned ring slot                 pread with O_DIRECT where aligned
 *   SPLIT         registered blocks / ring slots     both of the above at once, block by block
 *   DIRECT        the mapping as it is               nothing (devices that read host memory: CPU)
 *
 * lms_copy_source picks one; AUTO takes STAGE_DIRECT when most of the model
 * is not in the page cache (mincore sample: parallel large reads keep the
 * disk busy ahead of the copies) and AUTO_WARM_MODE otherwise. A refused
 * registration falls back to STAGE_READ. The ring is the device's reserved
 * staging memory when it is free and large enough (lms_device_reserve_staging,
 * loader/staging.c: already pinned); otherwise its slots (huge-page host
 * memory registered with the device, or the device's pinned allocator) are
 * pinned on first use by the worker that fills them: the first layer is then
 * carried by a few slots (ring_first_slots) and the rest of the ring is pinned
 * once that layer's copies are queued. A slot is refilled only after the copy
 * out of its previous chunk was issued and its event completed.
 *
 * The workers start before the device arena is allocated, so the first
 * chunks are read (and their slots pinned) while cudaMalloc runs.
 *
 * States of the loader thread (r->mu guards issued/ready/failed/done):
 *   started --each chunk: wait ready[c], copy, record events--> issuing
 *   issuing --all issued, streams synced, registrations released--> done
 *   any --an error (first one kept in r->err/msg)--> failed, then done
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "loader/loader_internal.h"

enum { MODE_DIRECT, MODE_REGISTERED, MODE_STAGE_MAP, MODE_STAGE_READ, MODE_STAGE_DIRECT, MODE_SPLIT };

static bool ring_mode(int mode) { return mode >= MODE_STAGE_MAP; }

/* AUTO with the page cache warm (chosen by measurement, bench/RESULTS.md) */
#define AUTO_WARM_MODE MODE_STAGE_READ

/* Blocks are shared with mapped models of the same store (loader/maps.c),
 * so resident loads register them mapped too. */
#define REG_FLAGS (LMS_REG_READONLY | LMS_REG_MAPPED)

typedef struct chunk {
    lms__lmap *map;
    uint64_t off, len;  /* bytes of the segment file */
    uint64_t dst;       /* offset in the arena */
    uint64_t grid;      /* registration block size (REGISTERED) */
    uint64_t srcoff;    /* offset of the bytes in their ring slot */
    int slot;           /* ring slot it is staged in; -1 = copied from the mapping */
    size_t prev;        /* the chunk staged in that slot before it (SIZE_MAX = none) */
} chunk;

typedef struct extent {
    lms__lmap *map;
    uint64_t start, end, dst;
    size_t c0, c1;     /* its chunks */
    size_t cut0, cut1; /* its layer boundaries in r->cuts */
    int32_t layer;     /* layer of its last tensor */
} extent;

struct lms__resident {
    lms_model *m;
    lms_device *dev;
    uint8_t *arena;
    uint64_t arena_bytes;
    int mode;
    bool cold;        /* AUTO found the model mostly not in the page cache */
    uint64_t chunk;   /* bytes per chunk in effect (staged chunks in SPLIT) */
    chunk *c;
    size_t nc;
    extent *e;
    size_t ne;
    uint64_t *cuts;   /* offsets where the layer changes inside an extent: chunks end there */
    int ns;
    lms_stream **st;
    /* layer slots: 0 = PRE, 1..n_layers = blocks, n_layers+1 = POST, n_layers+2 = ALL */
    int nl;
    size_t *last;     /* 1 + index of the layer's last chunk; 0 = no bytes */
    lms_event **lev;  /* nl x ns */
    bool *lrec;       /* events recorded (guarded by mu) */
    double *ldone;    /* seconds since open when seen complete (0 = not yet) */
    int first_slot;   /* the first layer in copy order */
    /* staging ring */
    int nslots;
    size_t grow_at;   /* chunks from here may pin the slots the first layer did not use */
    uint8_t **slot_raw, **slot;
    bool *slot_reg;   /* slot is host memory registered with the device (else alloc_host) */
    bool ring_borrowed; /* slots are the device's reserved staging memory (guarded by mu once started) */
    lms_event **sev;
    uint64_t slot_bytes;
    /* threads */
    pthread_t thread;
    bool thread_started;
    pthread_t *workers;
    int nworkers;
    lms__mutex mu;
    pthread_cond_t cv;
    size_t issued, next_take;
    uint8_t *ready;   /* per chunk: 0 not yet, 1 ready, 2 ready (unregistered: copy from pageable memory) */
    bool *held;       /* per chunk: holds a registration reference */
    bool failed, done, stop;
    int err;
    char msg[512];
    atomic_uint_least64_t copied;
    atomic_uint_least64_t registered; /* bytes of chunks copied out of registered memory */
    atomic_bool direct_io;
    atomic_bool warned_refusal;
};

static int slot_of(const lms__resident *r, int32_t layer)
{
    if (layer == LMS_LAYER_ALL)
        return r->nl - 1;
    if (layer == LMS_LAYER_POST)
        return r->nl - 2;
    if (layer < 0)
        return 0;
    return 1 + layer;
}

static void fail_locked(lms__resident *r, int rc)
{
    assert(lms__mutex_held(&r->mu));
    if (!r->failed) {
        r->failed = true;
        r->err = rc ? rc : LMS_EDEVICE;
        snprintf(r->msg, sizeof r->msg, "model '%s': loading to the device: %s", r->m->name,
                 *lms_last_error() ? lms_last_error() : lms_strerror(r->err));
    }
    pthread_cond_broadcast(&r->cv);
}

static void fail(lms__resident *r, int rc)
{
    lms__mutex_lock(&r->mu);
    fail_locked(r, rc);
    lms__mutex_unlock(&r->mu);
}

/* ---- planning ------------------------------------------------------------------ */

/* The extents in copy order and where each lands in the arena: r->e,
 * r->ne, r->cuts and r->arena_bytes; ext_of[i] = the extent of unique
 * tensor i. ord and ext_of hold m->n + 1 entries. */
static int plan_extents(lms__resident *r, size_t *ord, size_t *ext_of)
{
    const lms_model *m = r->m;
    size_t no = 0;
    /* copy order */
    for (int pass = 0; pass < 2; pass++) {
        for (size_t i = 0; i < m->n; i++) {
            if (m->ti[i].canon != i || m->t[i].nbytes == 0)
                continue;
            bool block = m->t[i].layer >= 0 && m->t[i].layer != LMS_LAYER_POST;
            if (m->plan.order == LMS_ORDER_FILE ? pass == 0 : (pass == 0) == block)
                ord[no++] = i;
        }
    }
    /* extents */
    size_t ncuts = 0;
    r->e = lms__calloc(no + 1, sizeof *r->e);
    r->cuts = lms__calloc(no + 1, sizeof *r->cuts);
    if (!r->e || !r->cuts)
        return LMS_ENOMEM;
    uint64_t align = LMS_MAX(256u, lms_store_alignment(m->store));
    uint64_t arena = 0;
    for (size_t j = 0; j < no; j++) {
        size_t i = ord[j];
        uint64_t off = m->ti[i].offset, end = off + m->t[i].nbytes;
        extent *cur = r->ne ? &r->e[r->ne - 1] : NULL;
        if (cur && cur->map == m->ti[i].map && off >= cur->end && off - cur->end <= (1u << 20)) {
            if (m->t[i].layer != cur->layer) /* a layer's last chunk must not wait for the next layer */
                r->cuts[ncuts++] = off;
            cur->end = end;
            cur->cut1 = ncuts;
        } else {
            if (cur)
                arena = cur->dst + (cur->end - cur->start);
            cur = &r->e[r->ne++];
            cur->map = m->ti[i].map;
            cur->start = off;
            cur->end = end;
            cur->dst = lms__align_up(arena, align);
            cur->cut0 = cur->cut1 = ncuts;
        }
        cur->layer = m->t[i].layer;
        ext_of[i] = r->ne - 1;
    }
    if (r->ne)
        arena = r->e[r->ne - 1].dst + (r->e[r->ne - 1].end - r->e[r->ne - 1].start);
    r->arena_bytes = arena;
    return 0;
}

int lms__resident_arena_bytes(const lms_model *m, uint64_t *out)
{
    lms__resident r = {.m = (lms_model *)m};
    size_t *ord = lms__malloc((m->n + 1) * sizeof *ord);
    size_t *ext_of = lms__malloc((m->n + 1) * sizeof *ext_of);
    int rc = ord && ext_of ? plan_extents(&r, ord, ext_of) : LMS_ENOMEM;
    *out = r.arena_bytes;
    lms__free(r.e);
    lms__free(r.cuts);
    lms__free(ord);
    lms__free(ext_of);
    return rc;
}

static int plan(lms__resident *r)
{
    lms_model *m = r->m;
    const lms__load_plan *p = &m->plan;
    size_t *ord = lms__malloc((m->n + 1) * sizeof *ord);
    size_t *ext_of = lms__malloc((m->n + 1) * sizeof *ext_of);
    int rc = ord && ext_of ? plan_extents(r, ord, ext_of) : LMS_ENOMEM;
    if (rc)
        goto out;

    /* chunks */
    uint64_t cb = r->chunk;
    size_t capc = 0;
    for (size_t k = 0; k < r->ne; k++)
        capc += (size_t)((r->e[k].end - r->e[k].start) / cb) + 2;
    r->c = lms__calloc(capc + 1, sizeof *r->c);
    if (!r->c) {
        rc = LMS_ENOMEM;
        goto out;
    }
    for (size_t k = 0; k < r->ne; k++) {
        extent *x = &r->e[k];
        bool regs = r->mode == MODE_REGISTERED || r->mode == MODE_SPLIT;
        uint64_t grid = regs ? lms__reg_grid(x->map, r->dev, p->chunk) : 0;
        x->c0 = r->nc;
        size_t cut = x->cut0;
        for (uint64_t a = x->start; a < x->end;) {
            /* SPLIT: whole registration blocks go in place, spread evenly (percent of them) */
            uint64_t blk = grid ? a / grid : 0;
            bool reg = r->mode == MODE_REGISTERED ||
                       (r->mode == MODE_SPLIT && blk * (uint64_t)p->register_percent % 100 <
                                                     (uint64_t)p->register_percent);
            uint64_t b = reg && r->mode == MODE_SPLIT ? x->end : LMS_MIN(x->end, a + cb);
            if (grid)
                b = LMS_MIN(b, (blk + 1) * grid);
            while (cut < x->cut1 && r->cuts[cut] <= a)
                cut++;
            if (cut < x->cut1)
                b = LMS_MIN(b, r->cuts[cut]);
            if (r->nc == capc) { /* grid cuts can add chunks: grow */
                chunk *q = lms__realloc(r->c, (2 * capc + 1) * sizeof *r->c);
                if (!q) {
                    rc = LMS_ENOMEM;
                    goto out;
                }
                r->c = q;
                capc = 2 * capc;
            }
            r->c[r->nc++] = (chunk){.map = x->map, .off = a, .len = b - a, .dst = x->dst + (a - x->start),
                                    .grid = reg ? grid : 0, .slot = -1, .prev = SIZE_MAX};
            a = b;
        }
        x->c1 = r->nc;
    }

    /* layer slots: last chunk of each layer */
    r->nl = m->n_layers + 3;
    r->last = lms__calloc((size_t)r->nl, sizeof *r->last);
    r->lrec = lms__calloc((size_t)r->nl, sizeof *r->lrec);
    r->ldone = lms__calloc((size_t)r->nl, sizeof *r->ldone);
    if (!r->last || !r->lrec || !r->ldone) {
        rc = LMS_ENOMEM;
        goto out;
    }
    size_t first_chunk = SIZE_MAX;
    r->first_slot = r->nl - 1;
    for (size_t i = 0; i < m->n; i++) {
        size_t ci = m->ti[i].canon;
        if (m->t[ci].nbytes == 0)
            continue;
        extent *x = &r->e[ext_of[ci]];
        uint64_t lastb = m->ti[ci].offset + m->t[ci].nbytes - 1;
        size_t lo = x->c0, hi = x->c1 - 1; /* chunk holding lastb */
        while (lo < hi) {
            size_t mid = (lo + hi + 1) / 2;
            if (r->c[mid].off <= lastb)
                lo = mid;
            else
                hi = mid - 1;
        }
        int s = slot_of(r, m->t[i].layer);
        if (lo + 1 > r->last[s])
            r->last[s] = lo + 1;
    }
    r->last[r->nl - 1] = r->nc;
    for (int s = 0; s < r->nl - 1; s++)
        if (r->last[s] && r->last[s] < first_chunk) {
            first_chunk = r->last[s];
            r->first_slot = s;
        }
    /* device addresses, as arena offsets until the arena exists (lms__resident_start) */
    for (size_t i = 0; i < m->n; i++) {
        size_t ci = m->ti[i].canon;
        m->t[i].device = NULL;
        if (m->t[ci].nbytes == 0)
            continue;
        extent *x = &r->e[ext_of[ci]];
        m->t[i].device = (void *)(uintptr_t)(x->dst + (m->ti[ci].offset - x->start));
    }
out:
    lms__free(ord);
    lms__free(ext_of);
    return rc;
}

/* Ring slots, round-robin over the staged chunks (all chunks, except SPLIT's
 * registered blocks): a slot is refilled only once the copy out of its
 * previous chunk is issued and complete. The first layer in copy order goes
 * round-robin over only ring_first_slots slots; the chunks after it use all,
 * and a chunk that is the first one of its slot waits until the first layer is
 * issued (r->grow_at), so pinning the rest of the ring does not delay layer 0
 * (worker_main). */
static int assign_slots(lms__resident *r)
{
    int first = r->ring_borrowed ? r->nslots /* pinned already */
                                 : LMS_MIN(LMS_MAX(r->m->plan.ring_first_slots, 1), r->nslots);
    r->grow_at = first < r->nslots && r->first_slot < r->nl - 1 ? r->last[r->first_slot] : 0; /* no layers: all */
    size_t *lastuse = lms__malloc((size_t)LMS_MAX(r->nslots, 1) * sizeof *lastuse);
    if (!lastuse)
        return LMS_ENOMEM;
    for (int k = 0; k < r->nslots; k++)
        lastuse[k] = SIZE_MAX;
    size_t staged = 0;
    for (size_t ci = 0; ci < r->nc; ci++) {
        r->c[ci].slot = -1;
        r->c[ci].prev = SIZE_MAX;
        if (r->mode == MODE_SPLIT && r->c[ci].grid)
            continue; /* copied from the registered mapping */
        int si = ci < r->grow_at ? (int)(staged++ % (size_t)first) : (int)(staged++ % (size_t)r->nslots);
        r->c[ci].slot = si;
        r->c[ci].prev = lastuse[si];
        lastuse[si] = ci;
    }
    lms__free(lastuse);
    return 0;
}

/* Fraction of the model's pages in the page cache (mincore), 0..1, from
 * about 256 sampled pages spread over the unique tensors (checking every
 * page of 16 GB costs ~100 ms; 8192 samples cost ~10 ms of the first-layer
 * time on the H200 host, one mincore call each; 256 decide the 50%
 * threshold to within ~3% (one standard deviation) for ~0.3 ms). */
static double cached_fraction(const lms_model *m)
{
    uint64_t total = 0, in = 0, pages = 0;
    for (size_t i = 0; i < m->n; i++)
        if (m->ti[i].canon == i)
            total += m->t[i].nbytes;
    uint64_t stride = lms__align_up(LMS_MAX(total / 256, (uint64_t)LMS__PAGE), LMS__PAGE);
    for (size_t i = 0; i < m->n; i++) {
        if (m->ti[i].canon != i || m->t[i].nbytes == 0)
            continue;
        uintptr_t a = (uintptr_t)m->t[i].host & ~(uintptr_t)(LMS__PAGE - 1);
        uintptr_t e = (uintptr_t)m->t[i].host + m->t[i].nbytes;
        for (; a < e; a += stride) {
            unsigned char v = 1;
            if (mincore((void *)a, LMS__PAGE, &v) != 0)
                v = 1; /* unknown: assume cached */
            in += v & 1;
            pages++;
        }
    }
    return pages ? (double)in / (double)pages : 1.0;
}

/* ---- workers --------------------------------------------------------------------- */

/* Pin ring slot si. Default: huge-page host memory registered with the
 * device (pinning populated huge pages is much cheaper than cudaHostAlloc,
 * which cost ~8 ms per 16 MiB slot on the H200 host); the device's pinned
 * allocator when asked (ring_host_alloc) or when registration is refused. */
static int alloc_slot(lms__resident *r, int si)
{
    lms_device *d = r->dev;
    if (!r->m->plan.ring_host_alloc && d->ops->host_register && d->ops->host_unregister) {
        size_t bytes = (size_t)lms__align_up(r->slot_bytes, LMS__CHUNK_ALIGN);
        void *p = lms__aligned_alloc((size_t)LMS__CHUNK_ALIGN, bytes);
        if (!p)
            return lms__err(LMS_ENOMEM, "staging ring slot of %zu bytes", bytes);
#ifdef MADV_HUGEPAGE
        (void)madvise(p, bytes, MADV_HUGEPAGE); /* best effort */
#endif
        void *dp = NULL;
        if (d->ops->host_register(d, p, bytes, 0, &dp) == 0) {
            r->slot_raw[si] = r->slot[si] = p;
            r->slot_reg[si] = true;
            return 0;
        }
        lms__free(p); /* refused: the pinned allocator below */
    }
    void *raw = NULL;
    int rc = d->ops->alloc_host(d, (size_t)(r->slot_bytes + LMS__PAGE), &raw);
    if (rc)
        return lms__err_prefix(rc, "staging ring slot of %llu bytes: ", (unsigned long long)r->slot_bytes);
    r->slot_raw[si] = raw;
    r->slot[si] = (uint8_t *)lms__align_up((uintptr_t)raw, LMS__PAGE); /* O_DIRECT wants it aligned */
    return 0;
}

/* Ring slot of c may be filled: the copy out of its previous chunk was
 * issued and has completed (or it has none). */
static bool slot_free(lms__resident *r, const chunk *c)
{
    if (c->prev == SIZE_MAX)
        return true;
    lms__mutex_lock(&r->mu);
    bool issued = r->issued > c->prev;
    lms__mutex_unlock(&r->mu);
    return issued && r->dev->ops->event_done(r->dev, r->sev[c->slot]);
}

static int prepare_chunk(lms__resident *r, size_t ci, uint8_t *ready)
{
    chunk *c = &r->c[ci];
    assert(lms__lmap_covers(c->map, c->off, c->len));
    *ready = 1;
    if (c->slot < 0) { /* REGISTERED, and SPLIT's registered blocks */
        void *dp = NULL;
        int rc = lms__reg_acquire(c->map, r->dev, c->grid, (size_t)(c->off / c->grid), REG_FLAGS, &dp);
        if (rc) {
            if (!atomic_exchange(&r->warned_refusal, true)) {
                lms__warn("model '%s': %s; copying from pageable memory", r->m->name, lms_last_error());
            }
            *ready = 2;
            return 0;
        }
        r->held[ci] = true;
        atomic_fetch_add(&r->registered, c->len);
        return 0;
    }
    int si = c->slot;
    assert(si < r->nslots && slot_free(r, c));
    if (!r->slot[si]) { /* ring slots are pinned on first use, by the worker that fills them */
        int rc = alloc_slot(r, si);
        if (rc)
            return rc;
    }
    uint8_t *slot = r->slot[si];
    if (r->mode == MODE_STAGE_MAP) {
        memcpy(slot, c->map->sm.base + c->off, (size_t)c->len);
        c->srcoff = 0;
        return 0;
    }
    if (r->mode == MODE_STAGE_DIRECT) {
        bool direct = false;
        int fd = lms__lmap_fd_direct(c->map, &direct);
        uint64_t ro = c->off & ~(uint64_t)(LMS__PAGE - 1);
        uint64_t re = lms__align_up(c->off + c->len, LMS__PAGE);
        if (direct && re <= c->map->sm.size) {
            assert(re - ro <= r->slot_bytes); /* the page-aligned read fits its slot */
            c->srcoff = c->off - ro;
            int rc = lms__pread_all(fd, slot, (size_t)(re - ro), ro, c->map->sm.path);
            if (rc == 0) {
                atomic_store(&r->direct_io, true);
                return 0;
            }
            if (rc != LMS_EIO) /* truncated: a real problem */
                return rc;
            /* some file systems accept O_DIRECT at open and refuse the read: read buffered */
        }
    }
    c->srcoff = 0;
    return lms__pread_all(c->map->sm.fd, slot, (size_t)c->len, c->off, c->map->sm.path);
}

static void *worker_main(void *arg)
{
    lms__resident *r = arg;
    /* how far ahead of the issuing thread chunks are prepared; a staged chunk
     * also waits until the copy out of its slot's previous chunk is issued */
    size_t window = r->mode == MODE_REGISTERED ? (size_t)LMS_MAX(8, 2 * r->nworkers)
                    : r->mode == MODE_SPLIT    ? (size_t)LMS_MAX(8, 2 * r->nslots)
                                               : (size_t)r->nslots;
    lms__mutex_lock(&r->mu);
    for (;;) {
        if (r->failed || r->stop || r->next_take >= r->nc)
            break;
        size_t ci = r->next_take++;
        const chunk *c = &r->c[ci];
        while (!r->failed && !r->stop &&
               (ci >= r->issued + window || (c->prev != SIZE_MAX && c->prev >= r->issued) ||
                (c->slot >= 0 && c->prev == SIZE_MAX && ci >= r->grow_at && r->issued < r->grow_at)))
            lms__mutex_wait(&r->cv, &r->mu);
        if (r->failed || r->stop)
            break;
        lms__mutex_unlock(&r->mu);
        int rc = 0;
        if (c->slot >= 0 && c->prev != SIZE_MAX) /* the slot's last copy must be done */
            rc = r->dev->ops->event_sync(r->dev, r->sev[c->slot]);
        uint8_t ready = 0;
        if (!rc)
            rc = prepare_chunk(r, ci, &ready);
        lms__mutex_lock(&r->mu);
        if (rc) {
            fail_locked(r, rc);
            break;
        }
        r->ready[ci] = ready;
        pthread_cond_broadcast(&r->cv);
    }
    lms__mutex_unlock(&r->mu);
    return NULL;
}

/* ---- the loader thread ---------------------------------------------------------------- */

/* Layer slot s's events are recorded on every stream (or it has nothing to copy). */
static bool layer_recorded(lms__resident *r, int s)
{
    lms__mutex_lock(&r->mu);
    bool rec = r->lrec[s];
    lms__mutex_unlock(&r->mu);
    return rec;
}

/* Wait for (block) or poll layer slot s's events: 0 when its copies are
 * complete, LMS_EBUSY (poll) when not yet, or the device's error. An event
 * that was never recorded reads as complete, hence the precondition. */
static int layer_events(lms__resident *r, int s, bool block)
{
    lms_device *d = r->dev;
    assert(layer_recorded(r, s));
    for (int k = 0; k < r->ns; k++) {
        lms_event *e = r->lev[s * r->ns + k];
        if (!block && !d->ops->event_done(d, e))
            return LMS_EBUSY;
        int rc = block ? d->ops->event_sync(d, e) : 0;
        if (rc)
            return rc;
    }
    return 0;
}

static void note_done_layers(lms__resident *r, bool block)
{
    double now = 0;
    for (int s = 0; s < r->nl; s++) {
        if (r->ldone[s] != 0 || !r->last[s])
            continue;
        if (!layer_recorded(r, s) || layer_events(r, s, block))
            continue;
        if (now == 0)
            now = lms__now() - r->m->t0;
        lms__mutex_lock(&r->mu);
        r->ldone[s] = now;
        lms__mutex_unlock(&r->mu);
    }
}

static void *loader_main(void *arg)
{
    lms__resident *r = arg;
    lms_device *d = r->dev;
    int rc = 0;
    for (size_t ci = 0; ci < r->nc; ci++) {
        lms__mutex_lock(&r->mu);
        while (!r->failed && !r->stop && !r->ready[ci])
            lms__mutex_wait(&r->cv, &r->mu);
        bool quit = r->failed || r->stop;
        uint8_t ready = r->ready[ci];
        lms__mutex_unlock(&r->mu);
        if (quit)
            break;
        chunk *c = &r->c[ci];
        lms_stream *s = r->st[ci % (size_t)r->ns];
        const uint8_t *src = c->map->sm.base + c->off;
        bool ring = c->slot >= 0;
        /* ready 2: a refused registration, copied from pageable memory */
        assert(ready == 1 || (ready == 2 && !ring));
        assert(ring ? c->srcoff + c->len <= r->slot_bytes : lms__lmap_covers(c->map, c->off, c->len));
        assert(c->dst + c->len <= r->arena_bytes);
        if (ring)
            src = r->slot[c->slot] + c->srcoff;
        rc = d->ops->copy_h2d(d, r->arena + c->dst, src, (size_t)c->len, s);
        if (!rc && ring)
            rc = d->ops->event_record(d, r->sev[c->slot], s);
        for (int ls = 0; !rc && ls < r->nl; ls++)
            if (r->last[ls] == ci + 1)
                for (int k = 0; !rc && k < r->ns; k++)
                    rc = d->ops->event_record(d, r->lev[ls * r->ns + k], r->st[k]);
        if (rc) {
            fail(r, rc);
            break;
        }
        atomic_fetch_add(&r->copied, c->len);
        lms__mutex_lock(&r->mu);
        if (ci == 0)
            r->m->stats.first_copy_s = lms__now() - r->m->t0;
        r->issued = ci + 1;
        for (int ls = 0; ls < r->nl; ls++)
            if (r->last[ls] == ci + 1)
                r->lrec[ls] = true;
        pthread_cond_broadcast(&r->cv);
        lms__mutex_unlock(&r->mu);
        note_done_layers(r, false);
    }
    for (int w = 0; w < r->nworkers; w++)
        pthread_join(r->workers[w], NULL);
    r->nworkers = 0;
    for (int k = 0; k < r->ns; k++) {
        int src = d->ops->stream_sync(d, r->st[k]);
        if (src && !rc)
            fail(r, rc = src);
    }
    /* no copy out of the ring is in flight any more: the next load may have it */
    lms__mutex_lock(&r->mu);
    if (r->ring_borrowed) {
        lms__staging_return(d);
        r->ring_borrowed = false;
    }
    bool complete = !r->failed && r->issued == r->nc;
    lms__mutex_unlock(&r->mu);
    if (complete) {
        note_done_layers(r, true);
        double now = lms__now() - r->m->t0;
        lms__mutex_lock(&r->mu);
        if (r->m->stats.all_s == 0 || r->m->stats.all_s > now)
            r->m->stats.all_s = now;
        lms__mutex_unlock(&r->mu);
    }
    /* registrations are released once the copies out of them are done */
    for (size_t ci = 0; ci < r->nc; ci++)
        if (r->held[ci]) {
            lms__reg_release(r->c[ci].map, d, (size_t)(r->c[ci].off / r->c[ci].grid));
            r->held[ci] = false;
        }
    lms__mutex_lock(&r->mu);
    r->done = true;
    pthread_cond_broadcast(&r->cv);
    lms__mutex_unlock(&r->mu);
    return NULL;
}

/* ---- start / wait / stop ------------------------------------------------------------- */

static int alloc_ring(lms__resident *r)
{
    lms_device *d = r->dev;
    r->slot_bytes = r->chunk + 2 * LMS__PAGE;
    r->slot_raw = lms__calloc((size_t)r->nslots, sizeof *r->slot_raw);
    r->slot = lms__calloc((size_t)r->nslots, sizeof *r->slot);
    r->slot_reg = lms__calloc((size_t)r->nslots, sizeof *r->slot_reg);
    r->sev = lms__calloc((size_t)r->nslots, sizeof *r->sev);
    if (!r->slot_raw || !r->slot || !r->slot_reg || !r->sev)
        return LMS_ENOMEM;
    if (!d->ops->alloc_host)
        return lms__err(LMS_EUNSUPPORTED, "device '%s' has no pinned host memory for a staging ring", d->ops->name);
    uint8_t *pool = r->m->plan.ring_host_alloc ? NULL
                                                  : lms__staging_borrow(d, (size_t)r->nslots * (size_t)r->slot_bytes);
    if (pool) { /* slot_raw stays NULL: not ours to free */
        r->ring_borrowed = true;
        r->m->stats.ring_reserved = true;
        for (int i = 0; i < r->nslots; i++)
            r->slot[i] = pool + (size_t)i * (size_t)r->slot_bytes;
    }
    for (int i = 0; i < r->nslots; i++) { /* the slots themselves are pinned on first use */
        int rc = d->ops->event_create(d, &r->sev[i]);
        if (rc)
            return rc;
    }
    r->m->stats.staging = true;
    return 0;
}

static void free_resident(lms__resident *r)
{
    lms_device *d = r->dev;
    if (r->lev)
        for (int i = 0; i < r->nl * r->ns; i++)
            if (r->lev[i])
                d->ops->event_destroy(d, r->lev[i]);
    if (r->sev)
        for (int i = 0; i < r->nslots; i++)
            if (r->sev[i])
                d->ops->event_destroy(d, r->sev[i]);
    if (r->ring_borrowed) /* the loader thread never ran to its end */
        lms__staging_return(d);
    if (r->slot_raw) {
        for (int i = 0; i < r->nslots; i++) {
            if (r->slot_raw[i] && r->slot_reg && r->slot_reg[i]) {
                (void)d->ops->host_unregister(d, r->slot_raw[i]);
                lms__free(r->slot_raw[i]);
            } else if (r->slot_raw[i]) {
                d->ops->free_host(d, r->slot_raw[i]);
            }
        }
    }
    if (r->st)
        for (int i = 0; i < r->ns; i++)
            if (r->st[i])
                d->ops->stream_destroy(d, r->st[i]);
    if (r->arena)
        d->ops->free(d, r->arena);
    if (r->held)
        for (size_t ci = 0; ci < r->nc; ci++)
            if (r->held[ci])
                lms__reg_release(r->c[ci].map, d, (size_t)(r->c[ci].off / r->c[ci].grid));
    lms__free(r->lev);
    lms__free(r->sev);
    lms__free(r->slot_raw);
    lms__free(r->slot);
    lms__free(r->slot_reg);
    lms__free(r->st);
    lms__free(r->workers);
    lms__free(r->ready);
    lms__free(r->held);
    lms__free(r->last);
    lms__free(r->lrec);
    lms__free(r->ldone);
    lms__free(r->c);
    lms__free(r->e);
    lms__free(r->cuts);
    pthread_mutex_destroy(&r->mu.mu);
    pthread_cond_destroy(&r->cv);
    lms__free(r);
}

int lms__resident_start(lms_model *m)
{
    const lms__load_plan *p = &m->plan;
    lms_device *d = m->dev;
    int rc;
    lms__resident *r = lms__calloc(1, sizeof *r);
    if (!r)
        return LMS_ENOMEM;
    pthread_mutex_init(&r->mu.mu, NULL);
    pthread_cond_init(&r->cv, NULL);
    r->m = m;
    r->dev = d;
    r->ns = p->streams;
    m->res = r;
    double t_start = lms__now() - m->t0;

    /* the copy source (see the table at the top) */
    switch (p->copy) {
    case LMS_COPY_REGISTER: r->mode = MODE_REGISTERED; break;
    case LMS_COPY_STAGE_MAP: r->mode = MODE_STAGE_MAP; break;
    case LMS_COPY_STAGE_READ: r->mode = MODE_STAGE_READ; break;
    case LMS_COPY_STAGE_DIRECT: r->mode = MODE_STAGE_DIRECT; break;
    case LMS_COPY_SPLIT: r->mode = d->ops->host_register ? MODE_SPLIT : MODE_STAGE_READ; break;
    default:
        if (!d->ops->host_register) {
            r->mode = MODE_DIRECT; /* the device reads host memory as it is (CPU) */
        } else if (!p->no_readers && cached_fraction(m) < 0.5) {
            lms__info("model '%s': mostly not in the page cache: parallel O_DIRECT readers", m->name);
            r->mode = MODE_STAGE_DIRECT;
            r->cold = true;
        } else {
            r->mode = AUTO_WARM_MODE;
        }
    }
    r->chunk = r->mode == MODE_REGISTERED || r->mode == MODE_DIRECT ? p->chunk : p->ring_chunk;
    r->nslots = p->ring_slots;
    if ((rc = plan(r)))
        return rc;
    if (r->mode == MODE_REGISTERED && r->nc) {
        /* probe: register the first chunk's block; refused -> staging ring */
        void *dp = NULL;
        chunk *c = &r->c[0];
        r->held = lms__calloc(r->nc, sizeof *r->held);
        if (!r->held)
            return LMS_ENOMEM;
        if (lms__reg_acquire(c->map, d, c->grid, (size_t)(c->off / c->grid), REG_FLAGS, &dp) == 0) {
            r->held[0] = true;
            atomic_fetch_add(&r->registered, c->len);
        } else {
            lms__info("model '%s': %s; copying through a pinned staging ring", m->name, lms_last_error());
            r->mode = MODE_STAGE_READ;
        }
    }
    if (!r->held && !(r->held = lms__calloc(r->nc + 1, sizeof *r->held)))
        return LMS_ENOMEM;
    if (!(r->ready = lms__calloc(r->nc + 1, 1)))
        return LMS_ENOMEM;
    if (r->held[0]) {
        r->ready[0] = 1;
        r->next_take = 1; /* the probe prepared chunk 0 */
    }
    if (ring_mode(r->mode)) {
        if ((rc = alloc_ring(r)) || (rc = assign_slots(r)))
            return rc;
        m->stats.readers = r->mode != MODE_STAGE_MAP;
    }
    if (r->mode == MODE_DIRECT)
        for (size_t ci = 0; ci < r->nc; ci++)
            r->ready[ci] = 1;

    /* workers first: they read the first chunks (and pin their slots) while
     * the arena is allocated below */
    r->workers = lms__calloc((size_t)p->threads + 1, sizeof *r->workers);
    if (!r->workers)
        return LMS_ENOMEM;
    /* the disk, not the copies, bounds a cold load: fewer readers */
    int nw = r->mode == MODE_DIRECT ? 0 : r->cold ? p->cold_readers : p->threads;
    m->stats.threads = nw;
    for (int w = 0; w < nw; w++) {
        if (pthread_create(&r->workers[w], NULL, worker_main, r))
            return lms__err(LMS_ENOMEM, "model '%s': cannot start loader worker threads", m->name);
        r->nworkers = w + 1;
    }

    /* device arena, streams, events */
    if ((rc = d->ops->alloc(d, (size_t)(r->arena_bytes ? r->arena_bytes : 1), (void **)&r->arena)))
        return lms__err_prefix(rc, "model '%s': device arena of %llu bytes: ", m->name,
                               (unsigned long long)r->arena_bytes);
    double t_arena = lms__now() - m->t0;
    m->stats.device_bytes = r->arena_bytes;
    for (size_t i = 0; i < m->n; i++)
        if (m->t[m->ti[i].canon].nbytes)
            m->t[i].device = r->arena + (uintptr_t)m->t[i].device;
    r->st = lms__calloc((size_t)r->ns, sizeof *r->st);
    r->lev = lms__calloc((size_t)(r->nl * r->ns), sizeof *r->lev);
    if (!r->st || !r->lev)
        return LMS_ENOMEM;
    for (int i = 0; i < r->ns; i++)
        if ((rc = d->ops->stream_create(d, &r->st[i])))
            return rc;
    for (int i = 0; i < r->nl * r->ns; i++)
        if ((rc = d->ops->event_create(d, &r->lev[i])))
            return rc;
    for (int s = 0; s < r->nl; s++)
        if (!r->last[s])
            r->lrec[s] = true; /* nothing to copy */
    m->stats.setup_s = lms__now() - m->t0;
    lms__debug("model '%s': resident load set up at %.3f ms (started at %.3f ms; arena at %.3f ms, %llu bytes)",
               m->name, m->stats.setup_s * 1e3, t_start * 1e3, t_arena * 1e3, (unsigned long long)r->arena_bytes);
    if (pthread_create(&r->thread, NULL, loader_main, r))
        return lms__err(LMS_ENOMEM, "model '%s': cannot start the loader thread", m->name);
    r->thread_started = true;
    return 0;
}

int lms__resident_wait(lms_model *m, int32_t layer, bool block)
{
    lms__resident *r = m->res;
    int s = slot_of(r, layer);
    lms__mutex_lock(&r->mu);
    while (!r->lrec[s] && !r->failed) {
        if (!block) {
            lms__mutex_unlock(&r->mu);
            return LMS_EBUSY;
        }
        lms__mutex_wait(&r->cv, &r->mu);
    }
    if (!r->lrec[s]) {
        int rc = lms__err(r->err, "%s", r->msg);
        lms__mutex_unlock(&r->mu);
        return rc;
    }
    lms__mutex_unlock(&r->mu);
    int rc = layer_events(r, s, block);
    if (rc)
        return block ? lms__err_prefix(rc, "model '%s': waiting for layer %d: ", m->name, (int)layer) : rc;
    if (layer == LMS_LAYER_ALL) { /* seen complete here before the loader thread noted it */
        double now = lms__now() - m->t0;
        lms__mutex_lock(&r->mu);
        if (m->stats.all_s == 0 || m->stats.all_s > now)
            m->stats.all_s = now;
        lms__mutex_unlock(&r->mu);
    }
    return 0;
}

void lms__resident_stop(lms_model *m)
{
    lms__resident *r = m->res;
    if (!r)
        return;
    if (r->thread_started) {
        lms__mutex_lock(&r->mu);
        r->stop = true;
        pthread_cond_broadcast(&r->cv);
        lms__mutex_unlock(&r->mu);
        pthread_join(r->thread, NULL);
    } else {
        /* failed before the loader thread started: stop the workers */
        lms__mutex_lock(&r->mu);
        r->stop = true;
        pthread_cond_broadcast(&r->cv);
        lms__mutex_unlock(&r->mu);
        for (int w = 0; w < r->nworkers; w++)
            pthread_join(r->workers[w], NULL);
        if (r->dev && r->st)
            r->dev->ops->sync(r->dev);
    }
    free_resident(r);
    m->res = NULL;
}

int lms_model_stats_get(lms_model *m, lms_model_stats *out)
{
    if (!m || !out)
        return lms__err(LMS_EINVAL, "lms_model_stats_get: model and out are required");
    lms__resident *r = m->res;
    if (r) {
        lms__mutex_lock(&r->mu);
        *out = m->stats;
        out->copied_bytes = atomic_load(&r->copied);
        out->registered_bytes = atomic_load(&r->registered);
        if (r->last[r->first_slot] && r->ldone[r->first_slot])
            out->first_layer_s = r->ldone[r->first_slot];
        out->direct_io = atomic_load(&r->direct_io);
        lms__mutex_unlock(&r->mu);
    } else {
        *out = m->stats;
    }
    return 0;
}
