/*
 * loader/device_backends.h - entry points of the compiled-in device
 * backends. lms__device_cuda_open is a pointer: device_registry_cuda.c sets
 * it to the CUDA backend, device_registry_nocuda.c to NULL.
 */
#ifndef LMS_DEVICE_BACKENDS_H
#define LMS_DEVICE_BACKENDS_H
#include "loader/device.h"

int lms__device_cpu_open(int ordinal, lms_device **out);
extern int (*const lms__device_cuda_open)(int ordinal, lms_device **out);

#endif
