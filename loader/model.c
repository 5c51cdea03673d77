/*
 * loader/model.c - lms_model_open and the tensor views (include/lmstore/loader.h).
 *
 * Opening reads the model's tensor records (one LMDB snapshot), maps each
 * segment they live in through the store's shared mapping table
 * (loader/maps.c), and points each view into the mapping: O(number of
 * tensors), no data page touched. Prefetch, mlock, verification and device
 * placement are steps after that, each asked for by a parameter.
 *
 * gc race: gc may move blobs and shrink or unlink a segment between our read
 * of the records and our shared lock on the segment. The store's read
 * barrier (held from before the records are read until the segments are
 * locked) makes gc wait for that window; and as a second line, once the
 * mappings are held, or mapping failed, the records are read again: if a
 * tensor moved, everything is released and the open starts over (a few times
 * at most). A failure with unchanged records is a real one and is returned.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "loader/loader_internal.h"
#include "store/admin_internal.h"

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif

/* ---- reading the records -------------------------------------------------------- */

typedef struct rec {
    size_t name_off;
    lms_dtype dtype;
    uint32_t ndim;
    uint64_t shape[LMS_MAX_DIMS];
    uint64_t nbytes;
    int32_t layer;
    uint8_t hash[16];
    uint32_t segment;
    uint64_t offset;
} rec;

typedef struct reclist {
    rec *r;
    size_t n, cap;
    char *names;
    size_t names_len, names_cap;
} reclist;

static void reclist_free(reclist *l)
{
    lms__free(l->r);
    lms__free(l->names);
    memset(l, 0, sizeof *l);
}

static int collect_cb(void *ctx, const lms_tensor_record *t)
{
    reclist *l = ctx;
    size_t nl = strlen(t->name) + 1;
    if (l->n == l->cap) {
        size_t cap = l->cap ? 2 * l->cap : 256;
        rec *r = lms__realloc(l->r, cap * sizeof *r);
        if (!r)
            return LMS_ENOMEM;
        l->r = r;
        l->cap = cap;
    }
    if (l->names_len + nl > l->names_cap) {
        size_t cap = LMS_MAX(2 * l->names_cap, l->names_len + nl + 4096);
        char *s = lms__realloc(l->names, cap);
        if (!s)
            return LMS_ENOMEM;
        l->names = s;
        l->names_cap = cap;
    }
    rec *r = &l->r[l->n++];
    memset(r, 0, sizeof *r);
    r->name_off = l->names_len;
    memcpy(l->names + l->names_len, t->name, nl);
    l->names_len += nl;
    r->dtype = t->dtype;
    r->ndim = t->ndim > LMS_MAX_DIMS ? LMS_MAX_DIMS : t->ndim;
    memcpy(r->shape, t->shape, sizeof r->shape);
    r->nbytes = t->nbytes;
    r->layer = t->layer;
    memcpy(r->hash, t->hash, 16);
    r->segment = t->segment;
    r->offset = t->offset;
    return 0;
}

static int read_records(lms_store *st, const char *name, reclist *l)
{
    memset(l, 0, sizeof *l);
    int rc = lms_store_tensors(st, name, collect_cb, l);
    if (rc) {
        if (rc == LMS_ENOMEM)
            lms__err(LMS_ENOMEM, "model '%s': out of memory reading its tensor records", name);
        reclist_free(l);
    }
    return rc;
}

typedef struct idctx {
    uint8_t *id;
    bool found;
} idctx;

static int id_cb(void *ctx, const lms_model_info *info)
{
    idctx *c = ctx;
    memcpy(c->id, info->id, LMS_MODEL_ID_LEN);
    c->found = true;
    return 0;
}

/* ---- helpers ------------------------------------------------------------------------ */

static uint64_t name_hash(const char *s) { return lms__hash64(s, strlen(s), 0x6c6d73); }

static int build_name_index(lms_model *m)
{
    size_t cap = 16;
    while (cap < 2 * m->n)
        cap <<= 1;
    m->hidx = lms__malloc(cap * sizeof *m->hidx);
    if (!m->hidx)
        return LMS_ENOMEM;
    memset(m->hidx, 0xff, cap * sizeof *m->hidx);
    m->hcap = cap;
    for (size_t i = 0; i < m->n; i++) {
        size_t h = (size_t)name_hash(m->t[i].name) & (cap - 1);
        while (m->hidx[h] != UINT32_MAX)
            h = (h + 1) & (cap - 1);
        m->hidx[h] = (uint32_t)i;
    }
    return 0;
}

static int cmp_blob(const void *a, const void *b, void *ctx)
{
    const lms__tinfo *ti = ctx;
    const lms__tinfo *x = &ti[*(const uint32_t *)a], *y = &ti[*(const uint32_t *)b];
    if (x->segment != y->segment)
        return x->segment < y->segment ? -1 : 1;
    if (x->offset != y->offset)
        return x->offset < y->offset ? -1 : 1;
    return *(const uint32_t *)a < *(const uint32_t *)b ? -1 : 1;
}

/* canon[i] = the first tensor with the same bytes location (dedup'd blobs). */
static int find_canon(lms_model *m)
{
    uint32_t *ix = lms__malloc((m->n ? m->n : 1) * sizeof *ix);
    if (!ix)
        return LMS_ENOMEM;
    for (size_t i = 0; i < m->n; i++)
        ix[i] = (uint32_t)i;
    qsort_r(ix, m->n, sizeof *ix, cmp_blob, m->ti);
    for (size_t j = 0; j < m->n; j++) {
        if (j > 0 && m->ti[ix[j]].segment == m->ti[ix[j - 1]].segment &&
            m->ti[ix[j]].offset == m->ti[ix[j - 1]].offset)
            m->ti[ix[j]].canon = m->ti[ix[j - 1]].canon;
        else
            m->ti[ix[j]].canon = ix[j];
    }
    lms__free(ix);
    return 0;
}

/* Page-aligned host ranges of the unique tensors, split into <= 64 MiB pieces. */
typedef struct hrange {
    uint8_t *p;
    size_t len;
    lms__lmap *map;
} hrange;

static int host_ranges(const lms_model *m, hrange **out, size_t *nout)
{
    size_t cap = m->n + 16, n = 0;
    hrange *r = lms__malloc(cap * sizeof *r);
    if (!r)
        return LMS_ENOMEM;
    for (size_t i = 0; i < m->n; i++) {
        if (m->ti[i].canon != i || m->t[i].nbytes == 0)
            continue;
        uintptr_t a = (uintptr_t)m->t[i].host & ~(uintptr_t)(LMS__PAGE - 1);
        uintptr_t e = (uintptr_t)m->t[i].host + m->t[i].nbytes;
        while (a < e) {
            uintptr_t b = LMS_MIN(e, a + (64u << 20));
            if (n == cap) {
                cap *= 2;
                hrange *q = lms__realloc(r, cap * sizeof *r);
                if (!q) {
                    lms__free(r);
                    return LMS_ENOMEM;
                }
                r = q;
            }
            r[n++] = (hrange){(uint8_t *)a, b - a, m->ti[i].map};
            a = b;
        }
    }
    *out = r;
    *nout = n;
    return 0;
}

typedef struct par_ctx {
    lms_model *m;
    hrange *r;
    atomic_size_t bad;      /* smallest failing index + 1, 0 = none */
    atomic_int err;
} par_ctx;

static void populate_one(void *arg, size_t i, int worker)
{
    par_ctx *c = arg;
    (void)worker;
    if (madvise(c->r[i].p, c->r[i].len, MADV_POPULATE_READ) == 0)
        return;
    /* old kernels: read one byte of every page */
    volatile const uint8_t *p = c->r[i].p;
    uint8_t sink = 0;
    for (size_t off = 0; off < c->r[i].len; off += LMS__PAGE)
        sink ^= p[off];
    (void)sink;
}

static void verify_one(void *arg, size_t i, int worker)
{
    par_ctx *c = arg;
    lms_model *m = c->m;
    (void)worker;
    if (m->ti[i].canon != i)
        return;
    assert(lms__lmap_covers(m->ti[i].map, m->ti[i].offset, m->t[i].nbytes));
    lms_hash128 h = lms__hash128(m->t[i].host, (size_t)m->t[i].nbytes);
    if (!lms__hash128_eq(h, lms__hash128_get(m->ti[i].hash))) {
        size_t cur = atomic_load(&c->bad);
        while ((cur == 0 || i + 1 < cur) && !atomic_compare_exchange_weak(&c->bad, &cur, i + 1))
            ;
    }
}

static int run_parallel(int threads, size_t n, lms_pool_fn fn, void *arg)
{
    lms_pool *pool = NULL;
    int rc = lms__pool_create(threads, &pool);
    if (rc)
        return rc;
    lms__pool_run(pool, n, fn, arg);
    lms__pool_destroy(pool);
    return 0;
}

static int prepare_host(lms_model *m)
{
    const lms__load_plan *p = &m->plan;
    int rc = 0;
    hrange *r = NULL;
    size_t nr = 0;
    if (p->prefetch == LMS_PREFETCH_NONE && !p->mlock && !p->verify)
        return 0;
    if ((rc = host_ranges(m, &r, &nr)))
        return rc;
    if (p->prefetch == LMS_PREFETCH_WILLNEED) {
        for (size_t i = 0; i < nr; i++)
            (void)madvise(r[i].p, r[i].len, MADV_WILLNEED);
    } else if (p->prefetch == LMS_PREFETCH_POPULATE) {
        par_ctx c = {.m = m, .r = r};
        if ((rc = run_parallel(p->threads, nr, populate_one, &c)))
            goto out;
    }
    if (p->mlock) {
        for (size_t i = 0; i < nr; i++) {
            if (mlock(r[i].p, r[i].len)) {
                rc = lms__err_errno(LMS_EIO, errno, "model '%s': mlock of %zu bytes of %s (see ulimit -l)", m->name,
                                    r[i].len, r[i].map->sm.path);
                for (size_t k = 0; k < i; k++) /* undo ours, unless another model holds its pages locked */
                    if (lms__lmap_mlock_users(r[k].map) == 0)
                        munlock(r[k].p, r[k].len);
                goto out;
            }
        }
        for (size_t j = 0; j < m->nmaps; j++)
            lms__lmap_note_mlock(m->maps[j]); /* munlock'd when the mapping goes */
        m->mlocked = true;
    }
    if (p->verify) {
        par_ctx c = {.m = m};
        atomic_init(&c.bad, 0);
        if ((rc = run_parallel(p->threads, m->n, verify_one, &c)))
            goto out;
        size_t bad = atomic_load(&c.bad);
        if (bad) {
            size_t i = bad - 1;
            rc = lms__err(LMS_ECORRUPT,
                          "model '%s': tensor '%s' (segment %u, offset %llu, %llu bytes): "
                          "stored bytes do not match their hash",
                          m->name, m->t[i].name, m->ti[i].segment, (unsigned long long)m->ti[i].offset,
                          (unsigned long long)m->t[i].nbytes);
            goto out;
        }
    }
out:
    lms__free(r);
    return rc;
}

/* ---- mapped placement ------------------------------------------------------------ */

typedef struct blk {
    lms__lmap *m;
    size_t k;
} blk;

static int cmp_blk(const void *a, const void *b)
{
    const blk *x = a, *y = b;
    if (x->m != y->m)
        return (uintptr_t)x->m < (uintptr_t)y->m ? -1 : 1;
    return x->k < y->k ? -1 : x->k > y->k;
}

static void release_held(lms_model *m)
{
    for (size_t i = 0; i < m->nheld; i++)
        lms__reg_release(m->held[i].m, m->dev, m->held[i].k);
    lms__free(m->held);
    m->held = NULL;
    m->nheld = 0;
}

static int place_mapped(lms_model *m)
{
    lms_device *dev = m->dev;
    int rc = 0;
    if (!dev || !dev->ops->host_register) {
        /* the device reads host memory as it is (CPU) */
        for (size_t i = 0; i < m->n; i++)
            m->t[i].device = (void *)m->t[i].host;
        return 0;
    }
    uint64_t want = m->plan.chunk;
    /* Blocks the tensors touch, each registered once. */
    size_t cap = m->n + 8, n = 0;
    blk *b = lms__malloc(cap * sizeof *b);
    if (!b)
        return LMS_ENOMEM;
    for (size_t i = 0; i < m->n; i++) {
        if (m->ti[i].canon != i || m->t[i].nbytes == 0)
            continue;
        uint64_t g = lms__reg_grid(m->ti[i].map, dev, want);
        for (uint64_t k = m->ti[i].offset / g; k <= (m->ti[i].offset + m->t[i].nbytes - 1) / g; k++) {
            if (n == cap) {
                cap *= 2;
                blk *q = lms__realloc(b, cap * sizeof *b);
                if (!q) {
                    rc = LMS_ENOMEM;
                    goto out;
                }
                b = q;
            }
            b[n++] = (blk){m->ti[i].map, (size_t)k};
        }
    }
    qsort(b, n, sizeof *b, cmp_blk);
    m->held = lms__malloc((n ? n : 1) * sizeof *m->held);
    if (!m->held) {
        rc = LMS_ENOMEM;
        goto out;
    }
    for (size_t j = 0; j < n; j++) {
        if (j > 0 && b[j].m == b[j - 1].m && b[j].k == b[j - 1].k)
            continue;
        void *dp = NULL;
        uint64_t g = lms__reg_grid(b[j].m, dev, want);
        rc = lms__reg_acquire(b[j].m, dev, g, b[j].k, LMS_REG_READONLY | LMS_REG_MAPPED, &dp);
        if (rc)
            goto out;
        m->held[m->nheld].m = b[j].m;
        m->held[m->nheld].k = b[j].k;
        m->nheld++;
        m->stats.registered_bytes += g;
        if (!dp) {
            rc = lms__err(LMS_EDEVICE, "model '%s': device '%s' cannot address registered host memory", m->name,
                          dev->ops->name);
            goto out;
        }
    }
    /* Device addresses: base of the first block + offset; a tensor that spans
     * blocks needs their device ranges to be contiguous (always so with
     * unified addressing, where the device address is the host address). */
    for (size_t i = 0; i < m->n; i++) {
        size_t c = m->ti[i].canon;
        if (c != i) {
            m->t[i].device = m->t[c].device;
            continue;
        }
        if (m->t[i].nbytes == 0) {
            m->t[i].device = NULL;
            continue;
        }
        lms__lmap *mp = m->ti[i].map;
        uint64_t g = lms__reg_grid(mp, dev, want);
        uint64_t k0 = m->ti[i].offset / g, k1 = (m->ti[i].offset + m->t[i].nbytes - 1) / g;
        void *d0 = NULL;
        for (uint64_t k = k0; k <= k1; k++) {
            void *dk = NULL;
            /* already held: a second acquire just reads dev_ptr */
            rc = lms__reg_acquire(mp, dev, g, (size_t)k, LMS_REG_READONLY | LMS_REG_MAPPED, &dk);
            if (rc)
                goto out;
            lms__reg_release(mp, dev, (size_t)k);
            if (k == k0)
                d0 = dk;
            else if ((uint8_t *)dk != (uint8_t *)d0 + (k - k0) * g) {
                rc = lms__err(LMS_EUNSUPPORTED,
                              "model '%s': tensor '%s' spans registered blocks that are not contiguous on the "
                              "device; use the resident placement",
                              m->name, m->t[i].name);
                goto out;
            }
        }
        m->t[i].device = (uint8_t *)d0 + (m->ti[i].offset - k0 * g);
    }
out:
    lms__free(b);
    return rc;
}

/* ---- open / close ------------------------------------------------------------------ */

static void release_maps(lms_model *m)
{
    for (size_t j = 0; j < m->nmaps; j++)
        lms__lmap_release(m->store, m->maps[j]);
    lms__free(m->maps);
    m->maps = NULL;
    m->nmaps = 0;
}

/* Map every segment the records name; check every tensor lies inside. */
static int map_segments(lms_model *m, const reclist *l)
{
    int rc = 0;
    m->maps = lms__calloc(l->n + 1, sizeof *m->maps);
    if (!m->maps)
        return LMS_ENOMEM;
    for (size_t i = 0; i < l->n; i++) {
        const rec *r = &l->r[i];
        uint64_t end;
        if (lms__add_overflow(r->offset, r->nbytes, &end))
            return lms__err(LMS_ECORRUPT, "model '%s': tensor '%s': offset %llu + %llu bytes overflows", m->name,
                            l->names + r->name_off, (unsigned long long)r->offset, (unsigned long long)r->nbytes);
        if (r->offset < LMS__SEG_HEADER_SIZE)
            return lms__err(LMS_ECORRUPT, "model '%s': tensor '%s' starts at byte %llu, inside the header of "
                            "segment %u", m->name, l->names + r->name_off, (unsigned long long)r->offset,
                            r->segment);
        lms__tinfo *ti = &m->ti[i];
        ti->segment = r->segment;
        ti->offset = r->offset;
        memcpy(ti->hash, r->hash, 16);
        /* one acquire per segment: find the mapping taken for an earlier tensor */
        lms__lmap *mp = NULL;
        for (size_t j = 0; j < m->nmaps; j++)
            if (m->maps[j]->sm.id == r->segment) {
                mp = m->maps[j];
                break;
            }
        if (!mp) {
            uint64_t need = 0;
            const char *who = NULL;
            for (size_t k = i; k < l->n; k++)
                if (l->r[k].segment == r->segment && l->r[k].offset + l->r[k].nbytes > need) {
                    need = l->r[k].offset + l->r[k].nbytes;
                    who = l->names + l->r[k].name_off;
                }
            rc = lms__lmap_acquire(m->store, r->segment, need, &mp);
            if (rc == LMS_ECORRUPT)
                return lms__err_prefix(rc, "model '%s': tensor '%s': ", m->name, who);
            if (rc)
                return lms__err_prefix(rc, "model '%s': ", m->name);
            m->maps[m->nmaps++] = mp;
        }
        ti->map = mp;
    }
    return 0;
}

/*
 * Placement AUTO: HOST without a device or on the CPU; MAPPED on a GPU that
 * reads host memory as its own (unified memory); on a discrete GPU RESIDENT
 * when the arena fits in the free device memory besides the caller's
 * reserve and a margin (lms__load_plan_device_need), MAPPED otherwise, so a
 * model larger than the GPU still runs, reading its weights over the bus.
 * Unknown free memory (a backend that cannot tell) counts as fitting.
 */
static int choose_placement(lms_model *m, lms_placement *out)
{
    lms_device *dev = m->dev;
    if (!dev || dev->kind == LMS_DEVICE_CPU) {
        *out = LMS_PLACE_HOST;
        return 0;
    }
    lms_device_info di;
    lms_device_get_info(dev, &di);
    if (di.unified_memory) {
        *out = LMS_PLACE_MAPPED;
        return 0;
    }
    uint64_t arena = 0;
    int rc = lms__resident_arena_bytes(m, &arena);
    if (rc)
        return rc;
    uint64_t need = lms__load_plan_device_need(&m->plan, arena, di.total_mem);
    if (di.free_mem == 0) {
        lms__info("model '%s': free memory of %s unknown: resident placement", m->name, di.name);
        *out = LMS_PLACE_RESIDENT;
        return 0;
    }
    m->stats.device_free_bytes = di.free_mem;
    m->stats.device_need_bytes = need;
    if (need <= di.free_mem) {
        lms__info("model '%s': resident on %s (%.2f GB of weights; %.2f GB needed with the reserve, "
                  "%.2f GB free)", m->name, di.name, arena / 1e9, need / 1e9, di.free_mem / 1e9);
        *out = LMS_PLACE_RESIDENT;
    } else {
        lms__warn("model '%s': %.2f GB of weights and %.2f GB kept free (device_reserve_bytes and a margin) do "
                  "not fit in the %.2f GB free on %s: mapped placement (the device reads the weights from host "
                  "memory)",
                  m->name, arena / 1e9, (need - arena) / 1e9, di.free_mem / 1e9, di.name);
        *out = LMS_PLACE_MAPPED;
    }
    return 0;
}

static bool records_differ(const reclist *a, const reclist *b)
{
    if (a->n != b->n)
        return true;
    for (size_t i = 0; i < a->n; i++)
        if (a->r[i].segment != b->r[i].segment || a->r[i].offset != b->r[i].offset ||
            a->r[i].nbytes != b->r[i].nbytes)
            return true;
    return false;
}

int lms_model_open(lms_store *store, const char *name, const lms_model_params *params, lms_model **out)
{
    double t0 = lms__now();
    lms__load_plan p;
    reclist l = {0};
    int rc;
    if (!out)
        return lms__err(LMS_EINVAL, "lms_model_open: out is NULL");
    *out = NULL;
    if (!store || !name)
        return lms__err(LMS_EINVAL, "lms_model_open: store and name are required");
    if ((rc = lms__load_plan_resolve(params, &p)))
        return rc;

    lms_model *m = lms__calloc(1, sizeof *m);
    if (!m)
        return LMS_ENOMEM;
    m->t0 = t0;
    m->store = store;
    m->plan = p;
    m->dev = p.device;
    lms__store_ref(store);
    if (!(m->name = lms__strdup(name))) {
        rc = LMS_ENOMEM;
        goto fail;
    }
    idctx ic = {.id = m->id};
    if ((rc = lms_store_model(store, name, id_cb, &ic)))
        goto fail;

    for (int attempt = 0;; attempt++) {
        /* gc's read barrier: held from before the records are read until
         * their segments are mapped and locked (store/admin_internal.h) */
        int barrier = -1;
        lms__read_barrier_enter(store, &barrier);
        if ((rc = read_records(store, name, &l))) {
            lms__read_barrier_leave(barrier);
            goto fail;
        }
        m->n = l.n;
        m->ti = lms__calloc(l.n + 1, sizeof *m->ti);
        if (!m->ti) {
            lms__read_barrier_leave(barrier);
            rc = LMS_ENOMEM;
            goto fail;
        }
        int mrc = map_segments(m, &l);
        lms__read_barrier_leave(barrier);
        reclist again = {0};
        if ((rc = read_records(store, name, &again)))
            goto fail; /* e.g. the model was removed meanwhile: LMS_ENOENT */
        bool moved = records_differ(&l, &again);
        reclist_free(&again);
        if (!moved) {
            if ((rc = mrc))
                goto fail;
            break;
        }
        /* gc moved blobs (and maybe shrank or unlinked a segment) while we
         * were mapping: start over with the new records */
        reclist_free(&l);
        release_maps(m);
        lms__free(m->ti);
        m->ti = NULL;
        if (attempt == 4) {
            rc = lms__err(LMS_EBUSY, "model '%s': its tensors kept moving while it was opened (gc running?)", name);
            goto fail;
        }
    }

    /* views */
    m->strings = l.names;
    l.names = NULL;
    m->t = lms__calloc(m->n + 1, sizeof *m->t);
    if (!m->t) {
        rc = LMS_ENOMEM;
        goto fail;
    }
    int32_t maxl = -1;
    for (size_t i = 0; i < m->n; i++) {
        const rec *r = &l.r[i];
        lms_tensor *t = &m->t[i];
        t->name = m->strings + r->name_off;
        t->dtype = r->dtype;
        t->ndim = r->ndim;
        memcpy(t->shape, r->shape, sizeof t->shape);
        t->nbytes = r->nbytes;
        t->layer = r->layer;
        assert(lms__lmap_covers(m->ti[i].map, r->offset, r->nbytes)); /* map_segments mapped up to its end */
        t->host = m->ti[i].map->sm.base + r->offset;
        if (r->layer >= 0 && r->layer != LMS_LAYER_POST && r->layer > maxl)
            maxl = r->layer;
        m->stats.tensor_bytes += r->nbytes;
    }
    m->n_layers = maxl + 1;
    reclist_free(&l);
    if ((rc = build_name_index(m)) || (rc = find_canon(m)))
        goto fail;
    if ((rc = prepare_host(m)))
        goto fail;

    /* placement */
    lms_placement pl = p.placement;
    if (pl == LMS_PLACE_AUTO && (rc = choose_placement(m, &pl)))
        goto fail;
    bool too_big = m->stats.device_need_bytes > m->stats.device_free_bytes;
    m->placement = pl;
    if (pl == LMS_PLACE_MAPPED) {
        rc = place_mapped(m);
        if (rc && too_big) {
            rc = lms__err_prefix(rc, "model '%s' does not fit in device memory and the mapped placement failed: ",
                                 name);
            goto fail;
        } else if (rc && p.placement == LMS_PLACE_AUTO && rc == LMS_EDEVICE) {
            lms__info("model '%s': mapped placement refused (%s); copying to the device instead", name,
                      lms_last_error());
            release_held(m);
            pl = m->placement = LMS_PLACE_RESIDENT;
            rc = 0;
        } else if (rc) {
            goto fail;
        }
    }
    m->stats.placement = pl;
    m->stats.streams = p.streams;
    m->stats.threads = p.threads;
    if (pl == LMS_PLACE_RESIDENT) {
        if ((rc = lms__resident_start(m)))
            goto fail;
        if (p.sync && (rc = lms__resident_wait(m, LMS_LAYER_ALL, true)))
            goto fail;
    }
    m->stats.open_s = lms__now() - t0;
    *out = m;
    return 0;
fail:
    reclist_free(&l);
    lms_model_close(m);
    return rc;
}

void lms_model_close(lms_model *m)
{
    if (!m)
        return;
    if (m->res)
        lms__resident_stop(m); /* waits for copies, unregisters, frees the arena */
    release_held(m);           /* mapped placement: unregister before unmap */
    release_maps(m);
    lms__free(m->t);
    lms__free(m->ti);
    lms__free(m->strings);
    lms__free(m->hidx);
    lms__free(m->name);
    lms__store_unref(m->store);
    lms__free(m);
}

/* ---- lookups -------------------------------------------------------------------- */

const lms_tensor *lms_model_tensor(const lms_model *m, const char *name)
{
    if (!m || !name) {
        lms__err(LMS_EINVAL, "lms_model_tensor: model and name are required");
        return NULL;
    }
    size_t h = (size_t)name_hash(name) & (m->hcap - 1);
    while (m->hidx[h] != UINT32_MAX) {
        const lms_tensor *t = &m->t[m->hidx[h]];
        if (!strcmp(t->name, name))
            return t;
        h = (h + 1) & (m->hcap - 1);
    }
    lms__err(LMS_ENOENT, "model '%s' has no tensor '%s'", m->name, name);
    return NULL;
}

size_t lms_model_tensor_count(const lms_model *m) { return m ? m->n : 0; }

const lms_tensor *lms_model_tensor_at(const lms_model *m, size_t i)
{
    if (!m || i >= m->n)
        return NULL;
    return &m->t[i];
}

int lms_model_file(const lms_model *m, const char *file, void **data, size_t *len)
{
    if (!m || !file || !data)
        return lms__err(LMS_EINVAL, "lms_model_file: model, file and data are required");
    return lms_store_file(m->store, m->name, file, data, len);
}

int lms_model_tokenizer(const lms_model *m, lms_tokenizer **out)
{
    if (!m || !out)
        return lms__err(LMS_EINVAL, "lms_model_tokenizer: model and out are required");
    return lms_store_tokenizer(m->store, m->name, out);
}

const uint8_t *lms_model_id(const lms_model *m) { return m ? m->id : NULL; }
const char *lms_model_name(const lms_model *m) { return m ? m->name : NULL; }
int lms_model_n_layers(const lms_model *m) { return m ? m->n_layers : 0; }
lms_device *lms_model_device(const lms_model *m) { return m ? m->dev : NULL; }
lms_placement lms_model_placement(const lms_model *m) { return m ? m->placement : LMS_PLACE_HOST; }

static int check_layer(const lms_model *m, int32_t layer)
{
    if (layer == LMS_LAYER_ALL || layer == LMS_LAYER_PRE || layer == LMS_LAYER_POST ||
        (layer >= 0 && layer < m->n_layers))
        return 0;
    return lms__err(LMS_EINVAL, "model '%s': no layer %d (it has %d)", m->name, (int)layer, m->n_layers);
}

int lms_model_wait_layer(lms_model *m, int32_t layer)
{
    if (!m)
        return lms__err(LMS_EINVAL, "lms_model_wait_layer: model is NULL");
    int rc = check_layer(m, layer);
    if (rc || !m->res)
        return rc;
    return lms__resident_wait(m, layer, true);
}

bool lms_model_layer_ready(lms_model *m, int32_t layer)
{
    if (!m || check_layer(m, layer))
        return false;
    if (!m->res)
        return true;
    return lms__resident_wait(m, layer, false) == 0;
}
