/*
 * engine/cuda/blas.c - cuBLAS through dlopen (engine/cuda/blas.h).
 */
#include "engine/cuda/blas.h"

#include <dlfcn.h>
#include <pthread.h>

#include <stdio.h>

#include "common/common.h"

#ifndef LMS_CUBLAS_SONAME
#define LMS_CUBLAS_SONAME "libcublas.so"
#endif

static struct {
    cublasStatus_t (*create)(cublasHandle_t *);
    cublasStatus_t (*destroy)(cublasHandle_t);
    cublasStatus_t (*set_stream)(cublasHandle_t, cudaStream_t);
    cublasStatus_t (*set_workspace)(cublasHandle_t, void *, size_t);
    cublasStatus_t (*gemm_ex)(cublasHandle_t, cublasOperation_t, cublasOperation_t, int, int, int, const void *,
                              const void *, cudaDataType, int, const void *, cudaDataType, int, const void *, void *,
                              cudaDataType, int, cublasComputeType_t, cublasGemmAlgo_t);
} api;
static pthread_once_t once = PTHREAD_ONCE_INIT;
static char why[256]; /* empty: loaded */

static void load(void)
{
    void *h = dlopen(LMS_CUBLAS_SONAME, RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        const char *e = dlerror();
        snprintf(why, sizeof why, "%s", e ? e : "not found");
        return;
    }
    /* the _v2 names are what cublas_v2.h's macros call */
    static const char *const names[] = {"cublasCreate_v2", "cublasDestroy_v2", "cublasSetStream_v2",
                                        "cublasSetWorkspace_v2", "cublasGemmEx"};
    void **slots[] = {(void **)&api.create, (void **)&api.destroy, (void **)&api.set_stream,
                      (void **)&api.set_workspace, (void **)&api.gemm_ex};
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        *slots[i] = dlsym(h, names[i]);
        if (!*slots[i]) {
            snprintf(why, sizeof why, "%s has no %s", LMS_CUBLAS_SONAME, names[i]);
            dlclose(h);
            return;
        }
    }
}

int lms__blas_open(void)
{
    pthread_once(&once, load);
    if (why[0])
        return lms__err(LMS_EDEVICE, "cuda engine: cannot load cuBLAS (%s): %s", LMS_CUBLAS_SONAME, why);
    return LMS_OK;
}

cublasStatus_t lms__blas_create(cublasHandle_t *h) { return api.create(h); }
cublasStatus_t lms__blas_destroy(cublasHandle_t h) { return api.destroy(h); }
cublasStatus_t lms__blas_set_stream(cublasHandle_t h, cudaStream_t s) { return api.set_stream(h, s); }
cublasStatus_t lms__blas_set_workspace(cublasHandle_t h, void *ws, size_t bytes)
{
    return api.set_workspace(h, ws, bytes);
}

cublasStatus_t lms__blas_gemm_ex(cublasHandle_t h, cublasOperation_t ta, cublasOperation_t tb, int m, int n, int k,
                                 const void *alpha, const void *a, cudaDataType at, int lda, const void *b,
                                 cudaDataType bt, int ldb, const void *beta, void *c, cudaDataType ct, int ldc,
                                 cublasComputeType_t compute, cublasGemmAlgo_t algo)
{
    return api.gemm_ex(h, ta, tb, m, n, k, alpha, a, at, lda, b, bt, ldb, beta, c, ct, ldc, compute, algo);
}
