/*
 * loader/device.c - opening devices by kind or by name, closing them, and
 * describing them (the public device calls of include/lmstore/loader.h).
 * Which backends exist is decided at build time by which backend registry
 * file CMake compiles (device_registry_cuda.c or device_registry_nocuda.c),
 * so no function body here depends on LMS_CUDA.
 *
 * lms_device_open_name is the one parser of device names ("cpu", "cuda",
 * "cuda:N"): the CLI, the engine and the benchmarks all resolve names here.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "loader/device.h"
#include "loader/device_backends.h"
#include "loader/loader_internal.h"

int lms_device_open(lms_device_kind kind, int ordinal, lms_device **out)
{
    if (!out)
        return lms__err(LMS_EINVAL, "lms_device_open: out is NULL");
    *out = NULL;
    if (kind == LMS_DEVICE_CPU)
        return lms__device_cpu_open(ordinal, out);
    if (kind == LMS_DEVICE_CUDA) {
        if (!lms__device_cuda_open)
            return lms__err(LMS_EUNSUPPORTED, "this lmstore was built without CUDA (LMS_CUDA=OFF)");
        return lms__device_cuda_open(ordinal, out);
    }
    return lms__err(LMS_EINVAL, "unknown device kind %d", (int)kind);
}

int lms_device_open_name(const char *name, lms_device **out)
{
    if (!out)
        return lms__err(LMS_EINVAL, "lms_device_open_name: out is NULL");
    *out = NULL;
    if (!name || !strcmp(name, "cpu"))
        return lms_device_open(LMS_DEVICE_CPU, 0, out);
    if (!strncmp(name, "cuda", 4)) {
        long ord = 0;
        if (name[4] == ':') {
            char *end;
            ord = strtol(name + 5, &end, 10);
            if (end == name + 5 || *end || ord < 0 || ord > 1024)
                return lms__err(LMS_EINVAL, "device '%s': expected cuda:N", name);
        } else if (name[4]) {
            return lms__err(LMS_EINVAL, "unknown device '%s' (cpu, cuda, cuda:N)", name);
        }
        int rc = lms_device_open(LMS_DEVICE_CUDA, (int)ord, out);
        return rc ? lms__err_prefix(rc, "device '%s': ", name) : 0;
    }
    return lms__err(LMS_EINVAL, "unknown device '%s' (cpu, cuda, cuda:N)", name);
}

void lms_device_close(lms_device *dev)
{
    if (!dev)
        return;
    lms__staging_release(dev); /* unpinned while the backend still works */
    dev->ops->close(dev);
}

bool lms_device_available(lms_device_kind kind)
{
    return kind == LMS_DEVICE_CPU || (kind == LMS_DEVICE_CUDA && lms__device_cuda_open != NULL);
}

int lms_device_get_info(const lms_device *dev, lms_device_info *out)
{
    if (!dev || !out)
        return lms__err(LMS_EINVAL, "lms_device_get_info: device and out are required");
    lms_device_props p;
    memset(&p, 0, sizeof p);
    if (dev->ops->props) /* reads the free memory now; the device is not changed */
        (void)dev->ops->props((lms_device *)dev, &p);
    *out = (lms_device_info){.kind = dev->kind, .ordinal = dev->ordinal, .total_mem = p.total_mem,
                             .free_mem = p.free_mem, .unified_memory = p.unified_memory,
                             .compute_major = p.compute_major, .compute_minor = p.compute_minor};
    if (dev->kind == LMS_DEVICE_CPU)
        snprintf(out->name, sizeof out->name, "%s", dev->ops->name);
    else
        snprintf(out->name, sizeof out->name, "%s:%d (%.127s)", dev->ops->name, dev->ordinal, p.name);
    return 0;
}
