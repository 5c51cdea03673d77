/*
 * bench/gemv_read.cu - the one-row GEMV of the CUDA backend
 * (lms_cu_gemv_launch, bf16) at the decode shapes of Llama-3-8B and
 * gemma-3-12b, each beside a plain read of the same number of bytes in one
 * launch (readbw_kernel, the engine's bandwidth probe): what the memory gives
 * a launch of that size, the bound of a product that is one launch. Timed in
 * CUDA graphs of 16 launches rotating over copies of the matrices (so that
 * HBM, not L2, serves them), the two alternating, ROUNDS rounds (default 5,
 * medians). Not part of the build; on a GPU host:
 *
 *   nvcc -arch=sm_90 -O3 -I. -Iinclude -o gemv_read bench/gemv_read.cu && ./gemv_read
 *
 * GEMV_BLOCKS=n sets the one-row GEMV's persistent grid as LMSTORE_CUDA_GEMV_BLOCKS does for
 * the engine (3 or 4 blocks a multiprocessor; 0: a block per group of rows).
 */
#include "engine/cuda/kernels.cu"
#include "bench/cuda_check.h"
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

/* n bf16 values, uniform in [-scale, scale), from a hash of their index and seed */
__global__ void fill_kernel(uint16_t *p, size_t n, uint32_t seed, float scale)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        const float f = ((h >> 8) / 16777216.0f * 2.f - 1.f) * scale;
        const uint32_t u = __float_as_uint(f);
        p[i] = (uint16_t)((u + 0x7fff + ((u >> 16) & 1)) >> 16);
    }
}

struct shape {
    const char *name;
    int n_jobs, rows[3], K, pair, acc, norm;
};

int main()
{
    int sms = 0, rounds = getenv("ROUNDS") ? atoi(getenv("ROUNDS")) : 5;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CK((cudaError_t)lms_cu_kernels_init());
    if (getenv("GEMV_BLOCKS"))
        lms_cu_set_gemv_blocks(atoi(getenv("GEMV_BLOCKS")), 0);
    const shape shapes[] = {
        {"8B gate/up", 2, {14336, 14336, 0}, 4096, 1, 0, 1}, {"8B down", 1, {4096, 0, 0}, 14336, 0, 1, 0},
        {"8B q/k/v", 3, {4096, 1024, 1024}, 4096, 0, 0, 1},   {"8B o", 1, {4096, 0, 0}, 4096, 0, 1, 0},
        {"8B head", 1, {128256, 0, 0}, 4096, 0, 0, 1},        {"12B gate/up", 2, {15360, 15360, 0}, 3840, 1, 0, 1},
        {"12B down", 1, {3840, 0, 0}, 15360, 0, 1, 0},        {"12B q/k/v", 3, {4096, 2048, 2048}, 3840, 0, 0, 1},
        {"12B o", 1, {3840, 0, 0}, 4096, 0, 1, 0},
    };
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    uint32_t *sink;
    CK(cudaMalloc(&sink, 64));
    double layer[2] = {0, 0}; /* one 8B layer's four products: GEMV, read */
    for (const shape &s : shapes) {
        size_t bytes = 0;
        for (int j = 0; j < s.n_jobs; j++) bytes += (size_t)s.rows[j] * s.K * 2;
        const int copies = (int)std::max<size_t>(2, (400u << 20) / bytes + 1);
        std::vector<uint16_t *> w(copies * 3);
        for (int c = 0; c < copies; c++)
            for (int j = 0; j < s.n_jobs; j++) {
                CK(cudaMalloc(&w[c * 3 + j], (size_t)s.rows[j] * s.K * 2));
                fill_kernel<<<4 * sms, 256, 0, st>>>(w[c * 3 + j], (size_t)s.rows[j] * s.K, c * 7 + j,
                                                      1.f / sqrtf((float)s.K));
            }
        uint8_t *flat; /* the read's bytes: two buffers of the product's size */
        CK(cudaMalloc(&flat, bytes * 2));
        CK(cudaMemsetAsync(flat, 1, bytes * 2, st));
        float *x, *norm, *y[3], *h;
        const int ymax = std::max(s.rows[0], std::max(s.rows[1], s.rows[2]));
        CK(cudaMalloc(&x, s.K * 4));
        CK(cudaMalloc(&norm, s.K * 4));
        std::vector<float> hx(s.K), hn(s.K);
        for (int k = 0; k < s.K; k++) hx[k] = sinf(0.37f * k) + 0.1f, hn[k] = 1.f + 0.2f * cosf(0.11f * k);
        CK(cudaMemcpy(x, hx.data(), s.K * 4, cudaMemcpyHostToDevice));
        CK(cudaMemcpy(norm, hn.data(), s.K * 4, cudaMemcpyHostToDevice));
        for (int j = 0; j < 3; j++) {
            CK(cudaMalloc(&y[j], ymax * 4));
            CK(cudaMemset(y[j], 0, ymax * 4));
        }
        CK(cudaMalloc(&h, ymax * 4));
        const int L = 16;
        cudaGraphExec_t g[2];
        for (int k = 0; k < 2; k++) {
            cudaGraph_t gr;
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
            for (int i = 0; i < L; i++) {
                if (k == 1) {
                    readbw_kernel<<<sms * 4, 512, 0, st>>>((const uint4 *)(flat + (i % 2) * bytes), bytes / 16, sink);
                    continue;
                }
                lms_cu_gemv a;
                memset(&a, 0, sizeof a);
                a.n_jobs = s.n_jobs;
                for (int j = 0; j < s.n_jobs; j++) {
                    a.w[j] = w[(i % copies) * 3 + j];
                    a.y[j] = y[j];
                    a.ldy[j] = s.rows[j];
                    a.rows[j] = s.rows[j];
                    a.acc[j] = s.acc;
                }
                a.wtype = LMS_CU_BF16;
                a.K = s.K;
                a.x = x;
                a.ldx = s.K;
                a.norm = s.norm ? norm : NULL;
                a.eps = 1e-5f;
                a.pair_act = s.pair ? LMS_CU_PRO_SILU : 0;
                a.h = h;
                a.ldh = s.rows[0];
                a.nb_max = 1;
                a.nb_fixed = 1;
                CK((cudaError_t)lms_cu_gemv_launch(&a, sms, st));
            }
            CK(cudaStreamEndCapture(st, &gr));
            CK(cudaGraphInstantiate(&g[k], gr, 0));
            cudaGraphDestroy(gr);
        }
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        std::vector<double> t[2];
        for (int r = 0; r < rounds + 1; r++) /* the first round warms up */
            for (int k = 0; k < 2; k++) {
                CK(cudaEventRecord(e0, st));
                CK(cudaGraphLaunch(g[k], st));
                CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                float ms;
                cudaEventElapsedTime(&ms, e0, e1);
                if (r)
                    t[k].push_back(ms * 1e-3 / L);
            }
        double med[2];
        for (int k = 0; k < 2; k++) {
            std::sort(t[k].begin(), t[k].end());
            med[k] = t[k][t[k].size() / 2];
        }
        printf("%-12s %7.1f MB  GEMV %7.2f us %6.0f GB/s | read %7.2f us %6.0f GB/s | GEMV / read %.1f%%\n", s.name,
               bytes / 1e6, med[0] * 1e6, bytes / med[0] / 1e9, med[1] * 1e6, bytes / med[1] / 1e9,
               med[1] / med[0] * 100);
        if (s.name[0] == '8' && strcmp(s.name, "8B head"))
            for (int k = 0; k < 2; k++) layer[k] += med[k];
        for (int k = 0; k < 2; k++) cudaGraphExecDestroy(g[k]);
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
        for (auto p : w) cudaFree(p);
        cudaFree(flat);
        cudaFree(x);
        cudaFree(norm);
        for (int j = 0; j < 3; j++) cudaFree(y[j]);
        cudaFree(h);
    }
    printf("8B layer's four products: GEMV %.1f us, read %.1f us (%.1f%%)\n", layer[0] * 1e6, layer[1] * 1e6,
           layer[1] / layer[0] * 100);
    return 0;
}
