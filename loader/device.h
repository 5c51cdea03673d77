/*
 * loader/device.h - the device interface: how lmstore allocates and moves
 * memory on a compute device. kvcache and engine allocate device memory only
 * through this table; the loader uses it to place weights. Opening, closing
 * and describing a device are public (include/lmstore/loader.h); this header
 * is the backend half: the struct and its table of operations.
 *
 * A backend is a table of function pointers (ggml's ggml_backend_i idea);
 * entries marked (optional) may be NULL, and callers check. The CPU backend
 * (loader/cpu/) is always built; the CUDA backend (loader/cuda/) is built
 * when LMS_CUDA is on and is reached only through this table.
 *
 * Streams and events are opaque backend objects. On the CPU backend every
 * operation is synchronous and streams/events are no-ops, so code written for
 * asynchronous devices runs unchanged.
 *
 * Thread safety: a device may be used from several threads; a stream must
 * be used by one thread at a time.
 */
#ifndef LMS_DEVICE_H
#define LMS_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lmstore/loader.h" /* lms_device, lms_device_kind, lms_device_open ... (the public half) */

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lms_stream lms_stream; /* backend-defined */
typedef struct lms_event lms_event;   /* backend-defined */

/* Flags of host_register. */
enum {
    LMS_REG_READONLY = 1 << 0, /* the device only reads the range */
    LMS_REG_MAPPED = 1 << 1,   /* the device may address it directly */
};

typedef struct lms_device_props {
    char name[128];
    uint64_t total_mem, free_mem;
    bool unified_memory;      /* integrated / coherent: mapped placement is best */
    bool can_register_host;   /* host_register may work on this device */
    bool can_register_readonly;
    bool can_map_host;        /* device can address registered host memory */
    bool host_ptr_is_device_ptr; /* registered host memory has the same address on the device */
    bool pageable_access;     /* device reads any host memory without registration (coherent) */
    int compute_major, compute_minor;
} lms_device_props;

typedef struct lms_device_ops {
    const char *name; /* "cpu", "cuda" */
    int (*props)(lms_device *dev, lms_device_props *out);
    /* Device memory. alloc returns LMS_ENOMEM (detail: bytes asked, free). */
    int (*alloc)(lms_device *dev, size_t bytes, void **out);
    void (*free)(lms_device *dev, void *ptr); /* NULL ok */
    /* Page-locked host memory for staging (optional). */
    int (*alloc_host)(lms_device *dev, size_t bytes, void **out);
    void (*free_host)(lms_device *dev, void *ptr);
    /* Pin an existing host range in place (optional); dev_ptr gets the
     * device address of the range when LMS_REG_MAPPED is asked and possible,
     * NULL otherwise. A refusal returns LMS_EDEVICE and leaves no state. */
    int (*host_register)(lms_device *dev, void *host, size_t bytes, unsigned flags, void **dev_ptr);
    int (*host_unregister)(lms_device *dev, void *host);
    /* Copies. dst/src are device pointers except where named host. With a
     * NULL stream a copy is complete when the call returns; on a stream it
     * is complete when the stream (or an event recorded after it) is. A
     * host source of an asynchronous copy must stay unchanged until then. */
    int (*copy_h2d)(lms_device *dev, void *dst, const void *host_src, size_t n, lms_stream *s);
    int (*copy_d2h)(lms_device *dev, void *host_dst, const void *src, size_t n, lms_stream *s);
    int (*copy_d2d)(lms_device *dev, void *dst, const void *src, size_t n, lms_stream *s);
    int (*memset)(lms_device *dev, void *dst, int byte, size_t n, lms_stream *s);
    /* Streams (NULL stream = the default stream) and events. */
    int (*stream_create)(lms_device *dev, lms_stream **out);
    void (*stream_destroy)(lms_device *dev, lms_stream *s);
    int (*stream_sync)(lms_device *dev, lms_stream *s);
    int (*event_create)(lms_device *dev, lms_event **out);
    void (*event_destroy)(lms_device *dev, lms_event *e);
    int (*event_record)(lms_device *dev, lms_event *e, lms_stream *s);
    int (*event_sync)(lms_device *dev, lms_event *e);
    /* true when the event has completed (or was never recorded) */
    bool (*event_done)(lms_device *dev, lms_event *e);
    int (*sync)(lms_device *dev); /* wait for all work on the device */
    void (*close)(lms_device *dev);
} lms_device_ops;

struct lms_device {
    const lms_device_ops *ops;
    lms_device_kind kind;
    int ordinal;
    void *impl; /* backend state */
    /* loader-owned: host memory pinned for staging copies by
     * lms_device_reserve_staging (loader/staging.c), freed by lms_device_close */
    struct lms__staging *staging;
};

/* Page-locked host memory of `bytes` for copies to and from dev: huge-page
 * memory pinned with one host_register where the device can, else the
 * device's alloc_host (one registration costs far less than the pinned
 * allocator: RESULTS.md, loader run 3). *registered says which, for
 * lms__pinned_free. LMS_ENOMEM, LMS_EDEVICE (detail set); *out NULL then.
 * loader/staging.c. */
int lms__pinned_alloc(lms_device *dev, size_t bytes, void **out, bool *registered);
void lms__pinned_free(lms_device *dev, void *p, bool registered); /* NULL ok */

#ifdef __cplusplus
}
#endif
#endif
