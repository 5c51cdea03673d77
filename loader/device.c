/*
 * loader/device.c - opens devices by kind. Which backends exist is decided
 * at build time by which backend registry file CMake compiles
 * (device_registry_cuda.c or device_registry_nocuda.c), so no function body
 * here depends on LMS_CUDA.
 */
#include "common/common.h"
#include "loader/device.h"
#include "loader/device_backends.h"
#include "loader/loader_internal.h"

int lms_device_open(lms_device_kind kind, int ordinal, lms_device **out)
{
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
