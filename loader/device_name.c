/*
 * loader/device_name.c - lms_device_open_name: "cpu", "cuda", "cuda:N", so
 * callers of the public API (include/lmstore/loader.h) and the CLI can pick
 * a device without the internal device header.
 */
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "lmstore/loader.h"
#include "loader/device.h"

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
        return lms_device_open(LMS_DEVICE_CUDA, (int)ord, out);
    }
    return lms__err(LMS_EINVAL, "unknown device '%s' (cpu, cuda, cuda:N)", name);
}
