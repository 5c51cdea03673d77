/*
 * bench/cuda_check.h - CK(call): the standalone CUDA benchmarks' check of a
 * runtime call (bench/mlx_gemv.cu, bench/gemv_read.cu): on an error, print
 * it with the line and exit with status 1.
 */
#ifndef LMS_BENCH_CUDA_CHECK_H
#define LMS_BENCH_CUDA_CHECK_H

#include <cstdio>
#include <cstdlib>

#include <cuda_runtime.h>

#define CK(x)                                                                                                          \
    do {                                                                                                               \
        cudaError_t e_ = (x);                                                                                          \
        if (e_) {                                                                                                      \
            printf("CUDA %s at %d\n", cudaGetErrorString(e_), __LINE__);                                               \
            exit(1);                                                                                                   \
        }                                                                                                              \
    } while (0)

#endif
