/* loader/device_registry_nocuda.c - compiled when LMS_CUDA is off: no CUDA backend. */
#include "loader/device_backends.h"

int (*const lms__device_cuda_open)(int ordinal, lms_device **out) = 0;
