/*
 * engine/cuda/blas.h - cuBLAS, loaded when the CUDA backend first needs it.
 *
 * lmstore does not link libcublas: the library and its companion
 * libcublasLt (several hundred MB) would be mapped and relocated at every
 * exec of a CUDA build, about 0.15 s and 200 MB of resident memory, for
 * `lmstore ls` and CPU runs alike. The CUDA backend calls lms__blas_open()
 * when it is created; the handful of entry points it uses are resolved from
 * the library named by LMS_CUBLAS_SONAME (the toolkit it was built with).
 *
 * Invariants:
 *   1. lms__blas_open() loads once per process (thread-safe); every call after
 *      a failure returns the same error.
 *   2. The lms__blas_* functions are valid only after lms__blas_open() returned
 *      LMS_OK; they have cuBLAS's signatures and semantics.
 *   3. The library stays loaded until the process exits (handles created
 *      from it may outlive any one backend).
 */
#ifndef LMS_ENGINE_CUDA_BLAS_H
#define LMS_ENGINE_CUDA_BLAS_H

#include <cublas_v2.h>

/* LMS_OK, or LMS_EDEVICE naming the library and the loader's reason. */
int lms__blas_open(void);

cublasStatus_t lms__blas_create(cublasHandle_t *h);
cublasStatus_t lms__blas_destroy(cublasHandle_t h);
cublasStatus_t lms__blas_set_stream(cublasHandle_t h, cudaStream_t s);
cublasStatus_t lms__blas_set_workspace(cublasHandle_t h, void *ws, size_t bytes);
cublasStatus_t lms__blas_gemm_ex(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                 const void *alpha, const void *a, cudaDataType at, int lda, const void *b,
                                 cudaDataType bt, int ldb, const void *beta, void *c, cudaDataType ct, int ldc,
                                 cublasComputeType_t compute, cublasGemmAlgo_t algo);

#endif
