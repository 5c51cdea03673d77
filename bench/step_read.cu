/*
 * bench/step_read.cu - what the structure of a decode step costs, apart from
 * its arithmetic: one step's weight bytes read in the order the engine reads
 * them (per layer q/k/v, attention, o, gate/up, down; then the head), with
 * the attention replaced by a stand-in of fixed duration on as many blocks as
 * the engine's split attention uses, in four ways:
 *
 *   launches   a launch per product (the probe's read kernel, readbw_kernel)
 *              and one for the attention, in a CUDA graph: the engine's
 *              structure with every product at a plain read's speed;
 *   fused      one persistent kernel for the whole step, a grid-wide barrier
 *              between phases (a megakernel's structure);
 *   fused+reg  the same, each thread's first loads of the next product issued
 *              before the barrier (weights do not depend on the phase before);
 *   fused+smem the same, and while the attention's blocks run, the other
 *              blocks copy the start of the o product into shared memory.
 *
 * All against one plain read of the step's bytes (the probe: the step's
 * roofline). Shapes: Llama-3-8B bf16, gemma-3-12b bf16, and Llama-3-8B at
 * MLX 4-bit sizes (codes + 16-bit scales and biases, groups of 64). The
 * modes alternate, ROUNDS rounds (default 5), medians. ATT_US sets the
 * stand-in's spin (default 6 us for the 8B shapes, 10 for the 12B: about the
 * engine's attention per layer at 128 positions, launch included, once the
 * launch's own cost is added). Not part of the build; on a GPU host:
 *
 *   nvcc -arch=sm_90 -O3 -I. -Iinclude -o step_read bench/step_read.cu && ./step_read
 */
#include "engine/cuda/kernels.cu"
#include "bench/cuda_check.h"
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace {

enum { PH_READ, PH_ATT };

struct phase {
    int kind;
    size_t off, bytes; /* PH_READ: the bytes read */
};

#define MAXPH 512
struct step_desc {
    int n;
    phase ph[MAXPH];
};

__constant__ step_desc c_step;

#define FT 512 /* threads of the fused kernel's blocks */

/* ld_stream as a volatile asm: issued where it is written (the loads of the next phase before
 * the grid barrier), never moved past the barrier by the compiler. */
__device__ __forceinline__ uint4 ld_stream_v(const void *p)
{
    uint4 r;
    asm volatile("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

/* The attention's stand-in: read 16 KB of "K/V", then spin `cycles`. */
__device__ __forceinline__ uint32_t att_standin(const uint4 *kv, long long cycles)
{
    uint32_t x = 0;
    for (int i = threadIdx.x; i < 1024; i += blockDim.x) {
        uint4 a = ld_stream_v(kv + i);
        x ^= a.x ^ a.w;
    }
    const long long t0 = clock64();
    while (clock64() - t0 < cycles) {
    }
    return x;
}

__global__ void att_kernel(const uint4 *kv, long long cycles, uint32_t *sink)
{
    uint32_t x = att_standin(kv + (size_t)blockIdx.x * 1024, cycles);
    if (x == 0x9e3779b9u)
        *sink = x;
}

/* Every block arrives, then waits for all: a monotonic counter (reset before the launch). */
__device__ __forceinline__ void grid_barrier(unsigned *ctr, unsigned &target)
{
    __syncthreads();
    target += gridDim.x;
    if (threadIdx.x == 0) {
        __threadfence();
        atomicAdd(ctr, 1u);
        unsigned v;
        do {
            asm volatile("ld.acquire.gpu.u32 %0, [%1];" : "=r"(v) : "l"(ctr) : "memory");
        } while (v < target);
    }
    __syncthreads();
}

/* The bytes each of `copiers` blocks copies of a read of `bytes`: at most smem_b, 16-byte units,
 * all of them within the read. */
__device__ __forceinline__ int copy_bytes(size_t bytes, int copiers, int smem_b)
{
    const size_t each = bytes / (size_t)copiers;
    return (int)(each < (size_t)smem_b ? each & ~(size_t)15 : (size_t)smem_b);
}

/*
 * The fused step. MODE 0: barriers only; 1: the next read's first loads
 * before each barrier; 2: as 1, and during the attention the other blocks
 * copy SMEM bytes each of the next read into shared memory (cp.async).
 */
template <int MODE>
__global__ void __launch_bounds__(FT, 2) fused_kernel(const uint8_t *base, const uint4 *kv, int natt,
                                                       long long cycles, unsigned *ctr, uint32_t *sink, int smem_b)
{
    extern __shared__ __align__(16) uint8_t sm[];
    uint32_t x = 0;
    unsigned target = 0;
    const size_t stride = (size_t)gridDim.x * FT;
    uint4 pre[4];
    bool have_pre = false; /* pre holds the first loads of this phase (MODE >= 1) */
    size_t skip = 0;       /* MODE 2: bytes of this phase copied into shared memory during the last */
    int cb = 0;            /* MODE 2: the bytes each copying block copied */
    for (int p = 0; p < c_step.n; p++) {
        const phase ph = c_step.ph[p];
        const phase *nx = p + 1 < c_step.n ? &c_step.ph[p + 1] : nullptr;
        if (ph.kind == PH_READ) {
            const uint4 *q = (const uint4 *)(base + ph.off + skip);
            const size_t n = (ph.bytes - skip) / 16;
            size_t i = blockIdx.x * (size_t)FT + threadIdx.x;
            if (have_pre) {
                x ^= pre[0].x ^ pre[1].y ^ pre[2].z ^ pre[3].w;
                i += 4 * stride;
            }
            x ^= read_words(q, i, n, stride);
            if (MODE == 2 && skip && (int)blockIdx.x >= natt) { /* this block's copied bytes: wait, use them */
                asm volatile("cp.async.wait_all;" ::: "memory");
                __syncthreads();
                for (int k = threadIdx.x; k < cb / 16; k += FT) x ^= ((const uint4 *)sm)[k].x;
            }
            have_pre = false;
            skip = 0;
        } else {
            const bool copy = MODE == 2 && nx && nx->kind == PH_READ;
            if (copy) { /* the next read's prefix, copied by the blocks past the attention's, which
                         * every block then skips (the copiers use theirs at its end) */
                cb = copy_bytes(nx->bytes, gridDim.x - natt, smem_b);
                skip = (size_t)(gridDim.x - natt) * cb;
            }
            if ((int)blockIdx.x < natt) {
                x ^= att_standin(kv + (size_t)blockIdx.x * 1024, cycles);
            } else if (copy) { /* bytes [(b - natt) cb, + cb) of the next read */
                const uint8_t *src = base + nx->off + (size_t)(blockIdx.x - natt) * cb;
                for (int k = threadIdx.x; k < cb / 16; k += FT) {
                    const unsigned d = (unsigned)__cvta_generic_to_shared(sm + 16 * k);
                    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(d), "l"(src + 16 * (size_t)k)
                                 : "memory");
                }
                asm volatile("cp.async.commit_group;" ::: "memory");
            }
        }
        if (MODE >= 1 && nx && nx->kind == PH_READ) {
            const uint4 *q = (const uint4 *)(base + nx->off + skip);
            const size_t i = blockIdx.x * (size_t)FT + threadIdx.x, n = (nx->bytes - skip) / 16;
            if (i + 3 * stride < n) {
#pragma unroll
                for (int u = 0; u < 4; u++) pre[u] = ld_stream_v(q + i + u * stride);
                have_pre = true;
            }
        }
        if (p + 1 < c_step.n)
            grid_barrier(ctr, target);
    }
    if (x == 0x9e3779b9u)
        *sink = x;
}

struct shape {
    const char *name;
    int layers, natt;
    double scale; /* bytes a bf16 weight takes in this format, / 2 */
    size_t qkv, o, gu, down, head; /* bf16 bytes */
};

double median(std::vector<double> v)
{
    std::sort(v.begin(), v.end());
    return v[v.size() / 2];
}

} // namespace

int main()
{
    int sms = 0, clk_khz = 0, rounds = getenv("ROUNDS") ? atoi(getenv("ROUNDS")) : 5;
    CK(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0));
    CK(cudaDeviceGetAttribute(&clk_khz, cudaDevAttrClockRate, 0));
    auto mb = [](size_t rows, size_t cols) { return rows * cols * 2; }; /* a bf16 matrix's bytes */
    const shape shapes[] = {
        {"llama-3-8b bf16", 32, 64, 1.0, mb(6144, 4096), mb(4096, 4096), mb(2 * 14336, 4096), mb(4096, 14336),
         mb(128256, 4096)},
        {"gemma-3-12b bf16", 48, 64, 1.0, mb(8192, 3840), mb(3840, 4096), mb(2 * 15360, 3840), mb(3840, 15360),
         mb(262144, 3840)},
        {"llama-3-8b mlx4", 32, 64, 0.28125, mb(6144, 4096), mb(4096, 4096), mb(2 * 14336, 4096), mb(4096, 14336),
         mb(128256, 4096)},
    };
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    uint32_t *sink;
    unsigned *ctr;
    CK(cudaMalloc(&sink, 64));
    CK(cudaMalloc(&ctr, 64));
    uint4 *kv;
    CK(cudaMalloc(&kv, (size_t)256 * 1024 * 16));
    CK(cudaMemset(kv, 3, (size_t)256 * 1024 * 16));
    const int smem_b = getenv("SMEM_KB") ? atoi(getenv("SMEM_KB")) * 1024 : 96 * 1024;
    CK(cudaFuncSetAttribute(fused_kernel<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, smem_b));
    int per_sm[3];
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm[0], fused_kernel<0>, FT, 0));
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm[1], fused_kernel<1>, FT, 0));
    CK(cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm[2], fused_kernel<2>, FT, smem_b));
    const int fb = std::min(2, std::min(per_sm[0], std::min(per_sm[1], per_sm[2]))) * sms;
    printf("# %d SMs, %d MHz; fused grid %d blocks of %d threads; shared memory copy %d KB a block\n", sms,
           clk_khz / 1000, fb, FT, smem_b / 1024);
    for (const shape &s : shapes) {
        auto sz = [&](size_t b) { return ((size_t)(b * s.scale) + 4095) & ~(size_t)4095; };
        const double att_us = getenv("ATT_US") ? atof(getenv("ATT_US")) : s.layers == 48 ? 10.0 : 6.0;
        const long long cycles = (long long)(att_us * clk_khz / 1000.0);
        /* the step's phases over one buffer */
        step_desc d;
        memset(&d, 0, sizeof d);
        size_t off = 0;
        auto rd = [&](size_t b) {
            d.ph[d.n++] = phase{PH_READ, off, sz(b)};
            off += sz(b);
        };
        for (int l = 0; l < s.layers; l++) {
            rd(s.qkv);
            d.ph[d.n++] = phase{PH_ATT, 0, 0};
            rd(s.o);
            rd(s.gu);
            rd(s.down);
        }
        rd(s.head);
        const size_t total = off;
        uint8_t *base;
        CK(cudaMalloc(&base, total));
        CK(cudaMemsetAsync(base, 1, total, st));
        CK(cudaMemcpyToSymbol(c_step, &d, sizeof d));
        /* A: a launch per phase, in a graph; P: the probe over all the bytes */
        cudaGraphExec_t gA, gP;
        for (int k = 0; k < 2; k++) {
            cudaGraph_t gr;
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
            if (k == 0) {
                for (int p = 0; p < d.n; p++) {
                    if (d.ph[p].kind == PH_READ)
                        readbw_kernel<<<sms * 4, 512, 0, st>>>((const uint4 *)(base + d.ph[p].off), d.ph[p].bytes / 16,
                                                               sink);
                    else
                        att_kernel<<<s.natt, 256, 0, st>>>(kv, cycles, sink);
                }
            } else {
                readbw_kernel<<<sms * 4, 512, 0, st>>>((const uint4 *)base, total / 16, sink);
            }
            CK(cudaStreamEndCapture(st, &gr));
            CK(cudaGraphInstantiate(k == 0 ? &gA : &gP, gr, 0));
            cudaGraphDestroy(gr);
        }
        /* the attention's own cost in the launch structure: the same graph without it */
        cudaGraphExec_t gN;
        {
            cudaGraph_t gr;
            CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeThreadLocal));
            for (int p = 0; p < d.n; p++)
                if (d.ph[p].kind == PH_READ)
                    readbw_kernel<<<sms * 4, 512, 0, st>>>((const uint4 *)(base + d.ph[p].off), d.ph[p].bytes / 16,
                                                           sink);
            CK(cudaStreamEndCapture(st, &gr));
            CK(cudaGraphInstantiate(&gN, gr, 0));
            cudaGraphDestroy(gr);
        }
        cudaEvent_t e0, e1;
        CK(cudaEventCreate(&e0));
        CK(cudaEventCreate(&e1));
        const char *names[] = {"launches", "fused", "fused+reg", "fused+smem", "probe", "launches, no attention"};
        std::vector<double> t[6];
        for (int r = 0; r < rounds + 1; r++)
            for (int k = 0; k < 6; k++) {
                CK(cudaMemsetAsync(ctr, 0, 4, st));
                CK(cudaEventRecord(e0, st));
                if (k == 0)
                    CK(cudaGraphLaunch(gA, st));
                else if (k == 4)
                    CK(cudaGraphLaunch(gP, st));
                else if (k == 5)
                    CK(cudaGraphLaunch(gN, st));
                else if (k == 1)
                    fused_kernel<0><<<fb, FT, 0, st>>>(base, kv, s.natt, cycles, ctr, sink, 0);
                else if (k == 2)
                    fused_kernel<1><<<fb, FT, 0, st>>>(base, kv, s.natt, cycles, ctr, sink, 0);
                else
                    fused_kernel<2><<<fb, FT, smem_b, st>>>(base, kv, s.natt, cycles, ctr, sink, smem_b);
                CK(cudaEventRecord(e1, st));
                CK(cudaEventSynchronize(e1));
                CK(cudaGetLastError());
                float ms;
                cudaEventElapsedTime(&ms, e0, e1);
                if (r)
                    t[k].push_back(ms);
            }
        const double probe = median(t[4]);
        printf("\n%s: %.2f GB a step, %d layers, attention stand-in %.1f us on %d blocks; probe %.3f ms (%.0f GB/s)\n",
               s.name, total / 1e9, s.layers, att_us, s.natt, probe, total / probe / 1e6);
        for (int k = 0; k < 6; k++) {
            if (k == 4)
                continue;
            const double m = median(t[k]);
            printf("  %-24s %8.3f ms  (%.3f-%.3f)  %5.1f%% of the probe\n", names[k], m, *std::min_element(t[k].begin(), t[k].end()),
                   *std::max_element(t[k].begin(), t[k].end()), probe / m * 100);
        }
        printf("  attention in the launch structure: %.2f us a layer\n",
               (median(t[0]) - median(t[5])) * 1e3 / s.layers);
        cudaGraphExecDestroy(gA);
        cudaGraphExecDestroy(gP);
        cudaGraphExecDestroy(gN);
        cudaEventDestroy(e0);
        cudaEventDestroy(e1);
        CK(cudaFree(base));
    }
    return 0;
}
