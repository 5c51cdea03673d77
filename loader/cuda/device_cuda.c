/*
 * loader/cuda/device_cuda.c - the CUDA backend of the device interface
 * (loader/device.h), in C over the CUDA runtime API. Built when LMS_CUDA is
 * on; reached only through lms__device_cuda_open (device_registry_cuda.c).
 *
 * Every entry point first makes the device current on the calling thread
 * (the runtime's current device is per thread, and the loader calls from
 * its own threads). Failed calls are turned into LMS_EDEVICE with the
 * runtime's message, and the error state they leave is drained
 * (cudaGetLastError) so the next call does not report it again.
 *
 * Host registration checks the device attributes first (registration
 * supported, read-only registration supported for read-only ranges such as
 * PROT_READ file mappings, host memory mappable) and refuses cleanly when
 * one is missing, so the loader can take its staging-ring fallback.
 */
#include <stdio.h>
#include <string.h>

#include <cuda_runtime_api.h>

#include "common/common.h"
#include "loader/device.h"

typedef struct cuda_impl {
    int ordinal;
    lms_device_props props;
} cuda_impl;

static int cu_fail(cudaError_t e, const char *fmt, ...) LMS_PRINTF(2, 3);
static int cu_fail(cudaError_t e, const char *fmt, ...)
{
    char what[256];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(what, sizeof what, fmt, ap);
    va_end(ap);
    (void)cudaGetLastError(); /* drain the error so later calls start clean */
    return lms__err(e == cudaErrorMemoryAllocation ? LMS_ENOMEM : LMS_EDEVICE, "cuda: %s: %s (%s)", what,
                    cudaGetErrorString(e), cudaGetErrorName(e));
}

static int cur(lms_device *dev)
{
    cuda_impl *c = dev->impl;
    cudaError_t e = cudaSetDevice(c->ordinal);
    return e == cudaSuccess ? 0 : cu_fail(e, "cudaSetDevice(%d)", c->ordinal);
}

static int cuda_props(lms_device *dev, lms_device_props *out)
{
    cuda_impl *c = dev->impl;
    *out = c->props;
    size_t fr = 0, tot = 0;
    if (cur(dev) == 0 && cudaMemGetInfo(&fr, &tot) == cudaSuccess) {
        out->free_mem = fr;
        out->total_mem = tot;
    } else {
        (void)cudaGetLastError();
    }
    return 0;
}

static int cuda_alloc(lms_device *dev, size_t bytes, void **out)
{
    int rc = cur(dev);
    *out = NULL;
    if (rc)
        return rc;
    cudaError_t e = cudaMalloc(out, bytes ? bytes : 1);
    if (e != cudaSuccess) {
        size_t fr = 0, tot = 0;
        (void)cudaGetLastError();
        (void)cudaMemGetInfo(&fr, &tot);
        (void)cudaGetLastError();
        *out = NULL;
        return lms__err(LMS_ENOMEM, "cuda: cudaMalloc of %zu bytes failed (%s); %zu of %zu bytes free", bytes,
                        cudaGetErrorString(e), fr, tot);
    }
    return 0;
}

static void cuda_free(lms_device *dev, void *p)
{
    if (!p || cur(dev))
        return;
    if (cudaFree(p) != cudaSuccess)
        (void)cudaGetLastError();
}

static int cuda_alloc_host(lms_device *dev, size_t bytes, void **out)
{
    int rc = cur(dev);
    *out = NULL;
    if (rc)
        return rc;
    cudaError_t e = cudaHostAlloc(out, bytes ? bytes : 1, cudaHostAllocPortable);
    if (e != cudaSuccess) {
        *out = NULL;
        return cu_fail(e, "cudaHostAlloc of %zu bytes", bytes);
    }
    return 0;
}

static void cuda_free_host(lms_device *dev, void *p)
{
    (void)dev;
    if (p && cudaFreeHost(p) != cudaSuccess)
        (void)cudaGetLastError();
}

static int cuda_host_register(lms_device *dev, void *host, size_t bytes, unsigned flags, void **dev_ptr)
{
    cuda_impl *c = dev->impl;
    unsigned f = cudaHostRegisterPortable;
    *dev_ptr = NULL;
    if (!c->props.can_register_host)
        return lms__err(LMS_EDEVICE, "cuda: device %d does not support cudaHostRegister", c->ordinal);
    if ((flags & LMS_REG_READONLY) && !c->props.can_register_readonly)
        return lms__err(LMS_EDEVICE, "cuda: device %d cannot register read-only host memory", c->ordinal);
    if ((flags & LMS_REG_MAPPED) && !c->props.can_map_host)
        return lms__err(LMS_EDEVICE, "cuda: device %d cannot map host memory", c->ordinal);
    int rc = cur(dev);
    if (rc)
        return rc;
    if (flags & LMS_REG_READONLY)
        f |= cudaHostRegisterReadOnly;
    if (flags & LMS_REG_MAPPED)
        f |= cudaHostRegisterMapped;
    cudaError_t e = cudaHostRegister(host, bytes, f);
    if (e != cudaSuccess)
        return cu_fail(e, "cudaHostRegister of %zu bytes at %p", bytes, host);
    if (flags & LMS_REG_MAPPED) {
        void *d = NULL;
        e = cudaHostGetDevicePointer(&d, host, 0);
        if (e != cudaSuccess) {
            rc = cu_fail(e, "cudaHostGetDevicePointer");
            (void)cudaHostUnregister(host);
            (void)cudaGetLastError();
            return rc;
        }
        *dev_ptr = d;
    }
    return 0;
}

static int cuda_host_unregister(lms_device *dev, void *host)
{
    int rc = cur(dev);
    if (rc)
        return rc;
    cudaError_t e = cudaHostUnregister(host);
    return e == cudaSuccess ? 0 : cu_fail(e, "cudaHostUnregister(%p)", host);
}

static int copy(lms_device *dev, void *dst, const void *src, size_t n, lms_stream *s, enum cudaMemcpyKind k,
                const char *what)
{
    int rc = cur(dev);
    if (rc)
        return rc;
    cudaError_t e = s ? cudaMemcpyAsync(dst, src, n, k, (cudaStream_t)s) : cudaMemcpy(dst, src, n, k);
    return e == cudaSuccess ? 0 : cu_fail(e, "%s of %zu bytes", what, n);
}

static int cuda_copy_h2d(lms_device *dev, void *dst, const void *src, size_t n, lms_stream *s)
{
    return copy(dev, dst, src, n, s, cudaMemcpyHostToDevice, "copy host to device");
}
static int cuda_copy_d2h(lms_device *dev, void *dst, const void *src, size_t n, lms_stream *s)
{
    return copy(dev, dst, src, n, s, cudaMemcpyDeviceToHost, "copy device to host");
}
static int cuda_copy_d2d(lms_device *dev, void *dst, const void *src, size_t n, lms_stream *s)
{
    /* Default: either side may also be the device address of registered host memory */
    return copy(dev, dst, src, n, s, cudaMemcpyDefault, "copy device to device");
}

static int cuda_memset(lms_device *dev, void *dst, int byte, size_t n, lms_stream *s)
{
    int rc = cur(dev);
    if (rc)
        return rc;
    cudaError_t e = s ? cudaMemsetAsync(dst, byte, n, (cudaStream_t)s) : cudaMemset(dst, byte, n);
    return e == cudaSuccess ? 0 : cu_fail(e, "memset of %zu bytes", n);
}

static int cuda_stream_create(lms_device *dev, lms_stream **out)
{
    cudaStream_t s = NULL;
    int rc = cur(dev);
    *out = NULL;
    if (rc)
        return rc;
    cudaError_t e = cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking);
    if (e != cudaSuccess)
        return cu_fail(e, "cudaStreamCreate");
    *out = (lms_stream *)s;
    return 0;
}

static void cuda_stream_destroy(lms_device *dev, lms_stream *s)
{
    if (!s || cur(dev))
        return;
    if (cudaStreamDestroy((cudaStream_t)s) != cudaSuccess)
        (void)cudaGetLastError();
}

static int cuda_stream_sync(lms_device *dev, lms_stream *s)
{
    int rc = cur(dev);
    if (rc)
        return rc;
    cudaError_t e = cudaStreamSynchronize((cudaStream_t)s);
    return e == cudaSuccess ? 0 : cu_fail(e, "cudaStreamSynchronize");
}

static int cuda_event_create(lms_device *dev, lms_event **out)
{
    cudaEvent_t ev = NULL;
    int rc = cur(dev);
    *out = NULL;
    if (rc)
        return rc;
    cudaError_t e = cudaEventCreateWithFlags(&ev, cudaEventDisableTiming);
    if (e != cudaSuccess)
        return cu_fail(e, "cudaEventCreate");
    *out = (lms_event *)ev;
    return 0;
}

static void cuda_event_destroy(lms_device *dev, lms_event *ev)
{
    if (!ev || cur(dev))
        return;
    if (cudaEventDestroy((cudaEvent_t)ev) != cudaSuccess)
        (void)cudaGetLastError();
}

static int cuda_event_record(lms_device *dev, lms_event *ev, lms_stream *s)
{
    int rc = cur(dev);
    if (rc)
        return rc;
    cudaError_t e = cudaEventRecord((cudaEvent_t)ev, (cudaStream_t)s);
    return e == cudaSuccess ? 0 : cu_fail(e, "cudaEventRecord");
}

static int cuda_event_sync(lms_device *dev, lms_event *ev)
{
    int rc = cur(dev);
    if (rc)
        return rc;
    cudaError_t e = cudaEventSynchronize((cudaEvent_t)ev);
    return e == cudaSuccess ? 0 : cu_fail(e, "cudaEventSynchronize");
}

static bool cuda_event_done(lms_device *dev, lms_event *ev)
{
    if (cur(dev))
        return false;
    cudaError_t e = cudaEventQuery((cudaEvent_t)ev);
    if (e == cudaSuccess)
        return true;
    (void)cudaGetLastError(); /* cudaErrorNotReady is not an error */
    return false;
}

static int cuda_sync(lms_device *dev)
{
    int rc = cur(dev);
    if (rc)
        return rc;
    cudaError_t e = cudaDeviceSynchronize();
    return e == cudaSuccess ? 0 : cu_fail(e, "cudaDeviceSynchronize");
}

static void cuda_close(lms_device *dev)
{
    lms__free(dev->impl);
    lms__free(dev);
}

static const lms_device_ops cuda_ops = {
    .name = "cuda",
    .props = cuda_props,
    .alloc = cuda_alloc,
    .free = cuda_free,
    .alloc_host = cuda_alloc_host,
    .free_host = cuda_free_host,
    .host_register = cuda_host_register,
    .host_unregister = cuda_host_unregister,
    .copy_h2d = cuda_copy_h2d,
    .copy_d2h = cuda_copy_d2h,
    .copy_d2d = cuda_copy_d2d,
    .memset = cuda_memset,
    .stream_create = cuda_stream_create,
    .stream_destroy = cuda_stream_destroy,
    .stream_sync = cuda_stream_sync,
    .event_create = cuda_event_create,
    .event_destroy = cuda_event_destroy,
    .event_record = cuda_event_record,
    .event_sync = cuda_event_sync,
    .event_done = cuda_event_done,
    .sync = cuda_sync,
    .close = cuda_close,
};

static int attr(int ordinal, enum cudaDeviceAttr a)
{
    int v = 0;
    if (cudaDeviceGetAttribute(&v, a, ordinal) != cudaSuccess) {
        (void)cudaGetLastError();
        return 0;
    }
    return v;
}

int lms__device_cuda_open_impl(int ordinal, lms_device **out)
{
    int n = 0;
    *out = NULL;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return lms__err(LMS_EDEVICE, "no CUDA device (%s)", cudaGetErrorString(e));
    }
    if (ordinal < 0 || ordinal >= n)
        return lms__err(LMS_EDEVICE, "no CUDA device cuda:%d (%d present)", ordinal, n);
    if ((e = cudaSetDevice(ordinal)) != cudaSuccess || (e = cudaFree(NULL)) != cudaSuccess)
        return cu_fail(e, "initialising device %d", ordinal);

    lms_device *d = lms__calloc(1, sizeof *d);
    cuda_impl *c = lms__calloc(1, sizeof *c);
    if (!d || !c) {
        lms__free(d);
        lms__free(c);
        return LMS_ENOMEM;
    }
    c->ordinal = ordinal;
    struct cudaDeviceProp p;
    if (cudaGetDeviceProperties(&p, ordinal) == cudaSuccess) {
        snprintf(c->props.name, sizeof c->props.name, "%.127s", p.name);
        c->props.total_mem = p.totalGlobalMem;
    } else {
        (void)cudaGetLastError();
        snprintf(c->props.name, sizeof c->props.name, "cuda:%d", ordinal);
    }
    c->props.unified_memory = attr(ordinal, cudaDevAttrIntegrated) != 0;
    c->props.can_register_host = attr(ordinal, cudaDevAttrHostRegisterSupported) != 0;
    c->props.can_register_readonly = attr(ordinal, cudaDevAttrHostRegisterReadOnlySupported) != 0;
    c->props.can_map_host = attr(ordinal, cudaDevAttrCanMapHostMemory) != 0;
    c->props.host_ptr_is_device_ptr = attr(ordinal, cudaDevAttrCanUseHostPointerForRegisteredMem) != 0;
    c->props.pageable_access = attr(ordinal, cudaDevAttrPageableMemoryAccessUsesHostPageTables) != 0;
    c->props.compute_major = attr(ordinal, cudaDevAttrComputeCapabilityMajor);
    c->props.compute_minor = attr(ordinal, cudaDevAttrComputeCapabilityMinor);
    d->ops = &cuda_ops;
    d->kind = LMS_DEVICE_CUDA;
    d->ordinal = ordinal;
    d->impl = c;
    *out = d;
    return 0;
}
