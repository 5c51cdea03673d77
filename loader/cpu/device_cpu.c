/*
 * loader/cpu/device_cpu.c - the CPU backend of the device interface: device
 * memory is host memory (64-byte aligned), copies are memcpy, streams and
 * events are no-ops because every operation completes before it returns.
 *
 * Large allocations (the KV arena: hundreds of MB reserved at start-up) are
 * anonymous mappings aligned to 2 MiB. Zeroing one of them whole drops its
 * pages (they read back as zeros) instead of writing them, so the memory is
 * taken only as pages are first written: a KV arena holds memory for the
 * pages in use, not for its whole budget. They are advised as huge pages
 * when the kernel has that many free 2 MiB blocks at hand (/proc/buddyinfo):
 * then a page fault takes 2 MiB at once; without free blocks the advice makes
 * the kernel compact memory first, which was seen to stall for seconds
 * (bench/RESULTS.md, cold start).
 */
#include <assert.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

#include "common/common.h"
#include "loader/device.h"


#define BIG_ALLOC ((size_t)2 << 20) /* and the huge page size on x86-64 and arm64 */

/* The large allocations live: (pointer, mapping, length). Few (the KV arena,
 * staging buffers), so a list under a mutex. */
typedef struct big_map {
    void *p, *base;
    size_t len, bytes;
    struct big_map *next;
} big_map;
static pthread_mutex_t big_mu = PTHREAD_MUTEX_INITIALIZER;
static big_map *big_list;

/* 2 MiB blocks free in the buddy allocator (orders 9 and up, all zones):
 * huge pages to be had without compaction; 0 when unknown. */
static uint64_t free_huge_blocks(void)
{
    FILE *f = fopen("/proc/buddyinfo", "r");
    char line[512];
    uint64_t blocks = 0;
    if (!f)
        return 0;
    while (fgets(line, sizeof line, f)) { /* Node 0, zone   Normal  c0 c1 ... c10 */
        char *p = strstr(line, "zone");
        if (!p)
            continue;
        p += 4;
        while (*p == ' ')
            p++;
        while (*p && *p != ' ') /* the zone's name */
            p++;
        char *end;
        for (int order = 0;; order++) {
            unsigned long long c = strtoull(p, &end, 10);
            if (end == p)
                break;
            if (order >= 9 && order < 9 + 20)
                blocks += (uint64_t)c << (order - 9);
            p = end;
        }
    }
    fclose(f);
    return blocks;
}

static void *big_alloc(size_t bytes)
{
    if (lms__fault_hit(LMS_FAULT_ALLOC)) /* counted as lms__aligned_alloc's would be */
        return NULL;
    size_t len = bytes + BIG_ALLOC;
    big_map *b = lms__malloc(sizeof *b);
    if (!b)
        return NULL;
    void *base = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (base == MAP_FAILED) {
        lms__free(b);
        return NULL;
    }
    b->base = base;
    b->len = len;
    b->bytes = bytes;
    b->p = (void *)(((uintptr_t)base + BIG_ALLOC - 1) & ~(uintptr_t)(BIG_ALLOC - 1));
    if (free_huge_blocks() >= 2 * (bytes / BIG_ALLOC + 1)) /* with room to spare: no compaction stall */
        madvise(b->p, bytes, MADV_HUGEPAGE);                  /* advice: fine to be refused */
    pthread_mutex_lock(&big_mu);
    b->next = big_list;
    big_list = b;
    pthread_mutex_unlock(&big_mu);
    return b->p;
}

/* The live large allocation holding [p, p + n), or NULL; unlinked with take. */
static big_map *big_find(const void *p, size_t n, bool take)
{
    pthread_mutex_lock(&big_mu);
    big_map **pp = &big_list, *b = NULL;
    for (; *pp; pp = &(*pp)->next)
        if ((const char *)p >= (const char *)(*pp)->p && n <= (*pp)->bytes &&
            (size_t)((const char *)p - (const char *)(*pp)->p) <= (*pp)->bytes - n) {
            b = *pp;
            if (take)
                *pp = b->next;
            break;
        }
    pthread_mutex_unlock(&big_mu);
    return b;
}

/* MemAvailable of /proc/meminfo in bytes (what can be allocated without
 * swapping, page cache counted as free); the free pages when it is absent. */
static uint64_t mem_available(void)
{
    uint64_t bytes = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[128];
        unsigned long long kb;
        while (fgets(line, sizeof line, f))
            if (sscanf(line, "MemAvailable: %llu kB", &kb) == 1) {
                bytes = (uint64_t)kb << 10;
                break;
            }
        fclose(f);
    }
    if (!bytes) {
        long pages = sysconf(_SC_AVPHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
        bytes = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
    }
    return bytes;
}

static int cpu_props(lms_device *dev, lms_device_props *out)
{
    (void)dev;
    memset(out, 0, sizeof *out);
    strcpy(out->name, "cpu");
    long pages = sysconf(_SC_PHYS_PAGES), psz = sysconf(_SC_PAGESIZE);
    out->total_mem = pages > 0 && psz > 0 ? (uint64_t)pages * (uint64_t)psz : 0;
    out->free_mem = mem_available();
    out->unified_memory = true;
    return 0;
}

static int cpu_alloc(lms_device *dev, size_t bytes, void **out)
{
    (void)dev;
    if (bytes >= BIG_ALLOC) {
        if (!(*out = big_alloc(bytes)))
            return lms__err(LMS_ENOMEM, "out of memory (%zu bytes)", bytes);
        return 0;
    }
    *out = lms__aligned_alloc(64, bytes);
    return *out ? 0 : LMS_ENOMEM;
}

static void cpu_free(lms_device *dev, void *p)
{
    (void)dev;
    big_map *b = p ? big_find(p, 0, true) : NULL;
    if (b && b->p == p) {
        munmap(b->base, b->len);
        lms__free(b);
    } else {
        assert(!b); /* a pointer inside a large allocation is not one to free */
        lms__free(p);
    }
}

static int cpu_copy(lms_device *dev, void *dst, const void *src, size_t n, lms_stream *s)
{
    (void)dev;
    (void)s;
    memmove(dst, src, n);
    return 0;
}

static int cpu_memset(lms_device *dev, void *dst, int byte, size_t n, lms_stream *s)
{
    (void)dev;
    (void)s;
    /* Zeroing whole huge pages of a large allocation: drop them (anonymous
     * memory reads back as zeros) and leave them unpopulated, so they hold
     * memory again only once written (the KV arena commits as it fills); the
     * edges by memset. */
    uintptr_t a = ((uintptr_t)dst + BIG_ALLOC - 1) & ~(uintptr_t)(BIG_ALLOC - 1);
    uintptr_t e = ((uintptr_t)dst + n) & ~(uintptr_t)(BIG_ALLOC - 1);
    if (byte == 0 && n >= BIG_ALLOC && e > a && big_find(dst, n, false) && !madvise((void *)a, e - a, MADV_DONTNEED)) {
        memset(dst, 0, a - (uintptr_t)dst);
        memset((void *)e, 0, (uintptr_t)dst + n - e);
        return 0;
    }
    memset(dst, byte, n); /* also after a refused madvise: the pages hold zeros or are faulted in here */
    return 0;
}

/* Streams and events: a non-NULL token so callers can tell "created". */
static char cpu_token;

static int cpu_stream_create(lms_device *dev, lms_stream **out)
{
    (void)dev;
    *out = (lms_stream *)&cpu_token;
    return 0;
}
static void cpu_stream_destroy(lms_device *dev, lms_stream *s) { (void)dev; (void)s; }
static int cpu_stream_sync(lms_device *dev, lms_stream *s) { (void)dev; (void)s; return 0; }
static int cpu_event_create(lms_device *dev, lms_event **out)
{
    (void)dev;
    *out = (lms_event *)&cpu_token;
    return 0;
}
static void cpu_event_destroy(lms_device *dev, lms_event *e) { (void)dev; (void)e; }
static int cpu_event_record(lms_device *dev, lms_event *e, lms_stream *s) { (void)dev; (void)e; (void)s; return 0; }
static int cpu_event_sync(lms_device *dev, lms_event *e) { (void)dev; (void)e; return 0; }
static bool cpu_event_done(lms_device *dev, lms_event *e) { (void)dev; (void)e; return true; }
static int cpu_sync(lms_device *dev) { (void)dev; return 0; }
static void cpu_close(lms_device *dev) { lms__free(dev); }

static const lms_device_ops cpu_ops = {
    .name = "cpu",
    .props = cpu_props,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .alloc_host = cpu_alloc,
    .free_host = cpu_free,
    .host_register = NULL, /* host memory is already the device's */
    .host_unregister = NULL,
    .copy_h2d = cpu_copy,
    .copy_d2h = cpu_copy,
    .copy_d2d = cpu_copy,
    .memset = cpu_memset,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .stream_sync = cpu_stream_sync,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .event_sync = cpu_event_sync,
    .event_done = cpu_event_done,
    .sync = cpu_sync,
    .close = cpu_close,
};

int lms__device_cpu_open(int ordinal, lms_device **out)
{
    lms_device *d = lms__calloc(1, sizeof *d);
    if (!d)
        return LMS_ENOMEM;
    d->ops = &cpu_ops;
    d->kind = LMS_DEVICE_CPU;
    d->ordinal = ordinal;
    *out = d;
    return 0;
}
