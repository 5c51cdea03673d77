/*
 * loader/cpu/device_cpu.c - the CPU backend of the device interface: device
 * memory is host memory (64-byte aligned), copies are memcpy, streams and
 * events are no-ops because every operation completes before it returns.
 */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include "common/common.h"
#include "loader/device.h"

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
    *out = lms__aligned_alloc(64, bytes);
    return *out ? 0 : LMS_ENOMEM;
}

static void cpu_free(lms_device *dev, void *p)
{
    (void)dev;
    lms__free(p);
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
    memset(dst, byte, n);
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
