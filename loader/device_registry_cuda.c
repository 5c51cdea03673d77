/* loader/device_registry_cuda.c - compiled when LMS_CUDA is on: the CUDA backend (loader/cuda/). */
#include "loader/device_backends.h"

int lms__device_cuda_open_impl(int ordinal, lms_device **out); /* loader/cuda/device_cuda.c */

int (*const lms__device_cuda_open)(int ordinal, lms_device **out) = lms__device_cuda_open_impl;
