/*
 * engine/cuda/kernels.cu - the kernels of the CUDA engine backend (see
 * kernels.h for what each computes). Memory traffic per call, which is what
 * bounds every one of them at the sizes an LLM has:
 *
 *   gemv       reads each weight byte once (rows x K x elem), x (nb x K
 *              floats, from L2) once per group of rows, writes nb x rows
 *              floats. A block per group of 4 rows, or for small one-row
 *              products a persistent grid (3 blocks per SM) looping over
 *              groups; each thread keeps 8 16-byte weight loads in flight;
 *              the input's RMSNorm is fused. Decode: 1 row of x; batches
 *              of up to 8.
 *   attention  decoding: reads K and V of the positions attended once
 *              (2 x positions x kv heads x head_dim x elem per layer),
 *              split over up to `splits` blocks per kv head by context
 *              length, merged by the last block to finish (no second
 *              launch), or for short ranges on sm_90 inside a thread
 *              block cluster. Prefill: tensor cores
 *              (mma.sync m16n8k16, f32 accumulation), 64 queries x 64 keys
 *              per tile, online softmax in registers (FlashAttention-2's
 *              scheme); K/V re-read from L2 per query head.
 *   rope, embed, norm_add, bias, softcap, argmax, prologue: one pass over
 *              their rows.
 *
 * f32 accumulation everywhere; the tensor-core paths take 16-bit inputs.
 * Kernels of a decode step start with griddepcontrol.wait, so that with
 * programmatic dependent launch (kernels.h: lms_cu_set_pdl) each one is
 * scheduled while the previous one drains; without it the instruction is a
 * no-op.
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>
#include <stdint.h>

#include <algorithm>

#include "engine/cuda/kernels.h"

namespace {

thread_local int g_pdl = 0; /* lms_cu_set_pdl: per host thread (each engine's steps run on one) */
thread_local int g_pdl_once = 0; /* lms_cu_pdl_next: the next launch of this host thread only */
int g_att_mma = 1; /* decoding attention on tensor cores where it applies (lms_cu_set_att_mma) */
int g_cluster_ok = 0;  /* the device runs thread block clusters (sm_90 on; lms_cu_kernels_init) */
int g_mlx_sb = -1; /* lms_cu_set_mlx_sb */

/* An instruction of sm_90 (programmatic dependent launch, thread block clusters): a no-op
 * where the code is compiled for older devices (kernels that need it only run on sm_90). */
#if __CUDA_ARCH__ >= 900
#define SM90_ASM(text) asm volatile(text ::: "memory")
#else
#define SM90_ASM(text) ((void)0)
#endif

__device__ __forceinline__ void griddep_wait() { SM90_ASM("griddepcontrol.wait;"); }
__device__ __forceinline__ void griddep_launch() { SM90_ASM("griddepcontrol.launch_dependents;"); }

/* Thread block clusters (sm_90; kernels launched with launch_ex's cluster_y only run there):
 * the cluster barrier's two halves, every thread of the block taking part (threads that
 * exited do not hold it up), this block's rank in its cluster, and the generic
 * address of p (a shared-memory address of this block) in the block of rank r. */
__device__ __forceinline__ void cluster_arrive_relaxed() { SM90_ASM("barrier.cluster.arrive.relaxed.aligned;"); }
__device__ __forceinline__ void cluster_arrive_release() { SM90_ASM("barrier.cluster.arrive.release.aligned;"); }
__device__ __forceinline__ void cluster_wait_acquire() { SM90_ASM("barrier.cluster.wait.acquire.aligned;"); }
__device__ __forceinline__ unsigned cluster_rank()
{
    unsigned r = 0;
#if __CUDA_ARCH__ >= 900
    asm volatile("mov.u32 %0, %%cluster_ctarank;" : "=r"(r));
#endif
    return r;
}
template <class T> __device__ __forceinline__ T *cluster_map(T *p, unsigned r)
{
#if __CUDA_ARCH__ >= 900
    uint64_t d;
    asm volatile("mapa.u64 %0, %1, %2;" : "=l"(d) : "l"(p), "r"(r));
    return (T *)d;
#else
    (void)r;
    return p;
#endif
}

/* Launch `k` with grid/block/smem on `stream`, with programmatic stream
 * serialization when pdl (launch: when enabled), in clusters of cluster_y
 * blocks along y when cluster_y > 1 (sm_90: thread block clusters). */
template <typename... KArgs, typename... Args>
int launch_ex(void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem, void *stream, unsigned cluster_y, int pdl,
              Args... args)
{
    cudaLaunchConfig_t cfg = {};
    cudaLaunchAttribute attr[2];
    unsigned n = 0;
    cfg.gridDim = grid;
    cfg.blockDim = block;
    cfg.dynamicSmemBytes = smem;
    cfg.stream = (cudaStream_t)stream;
    pdl = pdl || g_pdl_once;
    g_pdl_once = 0;
    if (pdl) {
        attr[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
        attr[n++].val.programmaticStreamSerializationAllowed = 1;
    }
    if (cluster_y > 1) {
        attr[n].id = cudaLaunchAttributeClusterDimension;
        attr[n].val.clusterDim.x = 1, attr[n].val.clusterDim.y = cluster_y, attr[n].val.clusterDim.z = 1;
        n++;
    }
    cfg.attrs = n ? attr : nullptr;
    cfg.numAttrs = n;
    cudaError_t e = cudaLaunchKernelEx(&cfg, k, args...);
    return (int)e;
}

template <typename... KArgs, typename... Args>
int launch(void (*k)(KArgs...), dim3 grid, dim3 block, size_t smem, void *stream, Args... args)
{
    return launch_ex(k, grid, block, smem, stream, 1u, g_pdl, args...);
}

/* ---- element conversions --------------------------------------------------------- */

__device__ __forceinline__ float bf16_lo(uint32_t u) { return __uint_as_float(u << 16); }
__device__ __forceinline__ float bf16_hi(uint32_t u) { return __uint_as_float(u & 0xffff0000u); }
__device__ __forceinline__ float f16_lo(uint32_t u) { return __half2float(__ushort_as_half((unsigned short)(u & 0xffff))); }
__device__ __forceinline__ float f16_hi(uint32_t u) { return __half2float(__ushort_as_half((unsigned short)(u >> 16))); }

template <int T> struct elem;
template <> struct elem<LMS_CU_F32> {
    typedef float t;
    enum { per16 = 4 };
    static __device__ __forceinline__ float get(const void *p, size_t i) { return ((const float *)p)[i]; }
    static __device__ __forceinline__ void put(void *p, size_t i, float v) { ((float *)p)[i] = v; }
    static __device__ __forceinline__ void unpack(uint4 v, float *f)
    {
        f[0] = __uint_as_float(v.x), f[1] = __uint_as_float(v.y), f[2] = __uint_as_float(v.z), f[3] = __uint_as_float(v.w);
    }
};
template <> struct elem<LMS_CU_F16> {
    typedef __half t;
    enum { per16 = 8 };
    static __device__ __forceinline__ float get(const void *p, size_t i) { return __half2float(((const __half *)p)[i]); }
    static __device__ __forceinline__ void put(void *p, size_t i, float v) { ((__half *)p)[i] = __float2half_rn(v); }
    static __device__ __forceinline__ void unpack(uint4 v, float *f)
    {
        f[0] = f16_lo(v.x), f[1] = f16_hi(v.x), f[2] = f16_lo(v.y), f[3] = f16_hi(v.y);
        f[4] = f16_lo(v.z), f[5] = f16_hi(v.z), f[6] = f16_lo(v.w), f[7] = f16_hi(v.w);
    }
};
template <> struct elem<LMS_CU_BF16> {
    typedef __nv_bfloat16 t;
    enum { per16 = 8 };
    static __device__ __forceinline__ float get(const void *p, size_t i)
    {
        return __bfloat162float(((const __nv_bfloat16 *)p)[i]);
    }
    static __device__ __forceinline__ void put(void *p, size_t i, float v)
    {
        ((__nv_bfloat16 *)p)[i] = __float2bfloat16_rn(v);
    }
    static __device__ __forceinline__ void unpack(uint4 v, float *f)
    {
        f[0] = bf16_lo(v.x), f[1] = bf16_hi(v.x), f[2] = bf16_lo(v.y), f[3] = bf16_hi(v.y);
        f[4] = bf16_lo(v.z), f[5] = bf16_hi(v.z), f[6] = bf16_lo(v.w), f[7] = bf16_hi(v.w);
    }
};

/* v rounded to type T (and back to f32): MLX dequantizes in its scales' type. */
template <int T> __device__ __forceinline__ float round_to(float v)
{
    if (T == LMS_CU_F32)
        return v;
    typename elem<T>::t t;
    elem<T>::put(&t, 0, v);
    return elem<T>::get(&t, 0);
}

/* A 16-byte weight load that streams past L1 (each weight byte is read once per call). */
__device__ __forceinline__ uint4 ld_stream(const void *p)
{
    uint4 r;
    asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
                 : "l"(p));
    return r;
}

__device__ __forceinline__ float warp_sum(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ float warp_max(float v)
{
#pragma unroll
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    return v;
}

/* Sum over the block (blockDim.x a multiple of 32, <= 1024); every thread gets it. */
__device__ float block_sum(float v, float *red)
{
    int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
    v = warp_sum(v);
    __syncthreads(); /* red may still be read by a previous call */
    if (l == 0)
        red[w] = v;
    __syncthreads();
    float s = 0;
    for (int i = 0; i < nw; i++) s += red[i];
    return s;
}

__device__ __forceinline__ float act_f(int pro, float g)
{
    if (pro == LMS_CU_PRO_SILU)
        return g / (1.0f + expf(-g));
    return 0.5f * g * (1.0f + tanhf(0.7978845608028654f * (g + 0.044715f * g * g * g)));
}

#define GEMV_THREADS 256
#define GEMV_WARPS (GEMV_THREADS / 32)
#define GEMV_R 4 /* rows of a block */
#define GEMV_U 2 /* 16-byte chunks per row and thread in flight (x GEMV_R rows) */
#define GEMV_PERSIST_BLOCKS 3 /* one-row GEMVs: a persistent grid of 3 blocks a multiprocessor */
#define GEMV_PERSIST_GROUPS 8 /* ... for products of at most this many groups of rows a block */

/*
 * A block's GEMV_R rows: rows g*R .. of the jobs' rows laid end to end
 * (job 0 [0, s1), job 1 [s1, s2), job 2 [s2, total)), or with pair_act
 * rows 2g, 2g+1 of job 0 (gate) and of job 1 (up), so that the block can
 * write act(gate) * up.
 */
struct gemv_rows {
    int s1, s2, total, groups;
    bool pair;
    __device__ gemv_rows(const lms_cu_gemv &a)
    {
        pair = a.pair_act != 0;
        s1 = a.rows[0];
        s2 = s1 + (a.n_jobs > 1 ? a.rows[1] : 0);
        total = s2 + (a.n_jobs > 2 ? a.rows[2] : 0);
        groups = pair ? (a.rows[0] + 1) / 2 : (total + GEMV_R - 1) / GEMV_R;
    }
    /* row r (< GEMV_R) of group g: job and row within the job; false past the end */
    __device__ bool at(const lms_cu_gemv &a, int g, int r, int *job, int *row) const
    {
        if (pair) {
            *job = r >> 1, *row = 2 * g + (r & 1);
            return *row < a.rows[0];
        }
        int x = g * GEMV_R + r;
        int j = (a.n_jobs > 1 && x >= s1) + (a.n_jobs > 2 && x >= s2);
        *job = j;
        *row = x - (j == 0 ? 0 : j == 1 ? s1 : s2);
        return x < total;
    }
};

/* A thread's next 16-byte chunks of its block's rows: chunks c0, c0 + TH, ...
 * (GEMV_U of them, TH threads a block), zero past the row or for a row past
 * the matrix. */
template <int TH>
__device__ __forceinline__ void gemv_load(uint4 (&w)[GEMV_R][GEMV_U], const uint8_t *const (&wr)[GEMV_R],
                                          const bool (&ok)[GEMV_R], int c0, int nch)
{
#pragma unroll
    for (int u = 0; u < GEMV_U; u++) {
        int c = c0 + u * TH;
#pragma unroll
        for (int r = 0; r < GEMV_R; r++)
            w[r][u] = (ok[r] && c < nch) ? ld_stream(wr[r] + (size_t)c * 16) : make_uint4(0, 0, 0, 0);
    }
}

/* A block's ticket among n blocks, once every thread of the block wrote its share: thread 0
 * adds one to *counter, a release (cumulative over the block's writes, which the barrier
 * before it orders first) and an acquire (in the last block, the reads after the barrier
 * that follows see every other block's writes). True in the block that finishes last. No
 * __threadfence: a full fence of every thread costs more than the work after it. */
__device__ __forceinline__ bool last_block_ticket(int *counter, int n)
{
    __shared__ int sm_last;
    __syncthreads();
    if (threadIdx.x == 0) {
        int old;
        asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], 1;" : "=r"(old) : "l"(counter) : "memory");
        sm_last = old == n - 1;
    }
    __syncthreads();
    return sm_last != 0;
}

/*
 * With a.nadd_y, after a GEMV's rows are written: y2[b] += RMSNorm(y[b]) *
 * nadd_w, y = job 0's output (all rows[0] of it), y2 = nadd_y, both of width
 * rows[0]. Every block adds the squares of the rows it wrote (sq, thread r *
 * NB + b of warp 0, 0 elsewhere) to nadd_ws[b] and takes a ticket; the block
 * that finishes last (last_block_ticket) reads them, adds the normalized
 * rows and resets nadd_ws for the next launch (stream order: no launch
 * overlaps it). A post-norm (Gemma 3) costs no launch of its own. The backend
 * uses it where every launch is a programmatic dependent (MLX models); for the
 * others a separate norm_add that overlaps the next product's first loads is
 * faster (fwd_cuda.c: cuda_matmul_norm_add).
 */
template <int NB>
__device__ __forceinline__ void gemv_norm_add(const lms_cu_gemv &a, int nb, float sq)
{
    const int tid = threadIdx.x;
    int *ticket = (int *)(a.nadd_ws + 8);
    if (tid < 32) {
#pragma unroll
        for (int o = NB; o < 32; o <<= 1) sq += __shfl_xor_sync(0xffffffffu, sq, o);
        if (tid < NB && tid < nb)
            atomicAdd(a.nadd_ws + tid, sq);
    }
    if (!last_block_ticket(ticket, (int)gridDim.x)) /* this block's rows and sums before it */
        return;
    const int n = a.rows[0], th = blockDim.x;
    for (int b = 0; b < nb; b++) {
        const float r = 1.0f / sqrtf(__ldcg(a.nadd_ws + b) / (float)n + a.eps);
        const float *t = a.y[0] + (size_t)(a.y_row0 + b) * a.ldy[0];
        float *y = a.nadd_y + (size_t)b * n;
        if (n % 4 == 0 && ((uintptr_t)t | (uintptr_t)y | (uintptr_t)a.nadd_w) % 16 == 0) {
            /* 16-byte accesses, every load of a round issued before its first use: this block
             * runs alone after all the others, so its latency is the launch's */
            const int n4 = n / 4;
            for (int i = tid; i < n4; i += 4 * th) {
                float4 tv[4], yv[4], wv[4];
#pragma unroll
                for (int u = 0; u < 4; u++)
                    if (i + u * th < n4) {
                        tv[u] = __ldcg((const float4 *)t + i + u * th);
                        yv[u] = __ldcg((const float4 *)y + i + u * th);
                        wv[u] = __ldg((const float4 *)a.nadd_w + i + u * th);
                    }
#pragma unroll
                for (int u = 0; u < 4; u++)
                    if (i + u * th < n4) {
                        float4 o = yv[u];
                        o.x += wv[u].x * (tv[u].x * r), o.y += wv[u].y * (tv[u].y * r);
                        o.z += wv[u].z * (tv[u].z * r), o.w += wv[u].w * (tv[u].w * r);
                        ((float4 *)y)[i + u * th] = o;
                    }
            }
        } else {
            for (int i = tid; i < n; i += th) y[i] += a.nadd_w[i] * (__ldcg(t + i) * r);
        }
    }
    __syncthreads(); /* every read of the sums done */
    if (tid < NB)
        a.nadd_ws[tid] = 0.f;
    if (tid == 0)
        *ticket = 0;
}

/*
 * The end of a GEMV block's group of rows: partial sums (and sums of x^2
 * with a norm) reduced over the block, then thread (r, b) writes row r of
 * token b: the RMS scale, bias, residual add, and with pair_act act(gate)
 * * up. Returns the square of the value that thread wrote (0 elsewhere),
 * which the block sums over its groups for the post-norm (gemv_norm_add).
 * red: WARPS x (GEMV_R*NB + NB) floats of shared memory (WARPS: the block's
 * warps); a block that finishes several groups alternates two of them, so
 * that one barrier a group suffices.
 */
template <int NB, int WARPS = GEMV_WARPS>
__device__ __forceinline__ float gemv_finish(const lms_cu_gemv &a, const gemv_rows &gr, int g, int nb,
                                             float (&acc)[GEMV_R][NB], float (&ss)[NB],
                                             float (*red)[GEMV_R * NB + NB])
{
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
#pragma unroll
    for (int b = 0; b < NB; b++) {
#pragma unroll
        for (int r = 0; r < GEMV_R; r++) {
            float v = warp_sum(acc[r][b]);
            if (lane == 0)
                red[warp][r * NB + b] = v;
        }
        if (a.norm) {
            float v = warp_sum(ss[b]);
            if (lane == 0)
                red[warp][GEMV_R * NB + b] = v;
        }
    }
    __syncthreads();
    float t2 = 0.f; /* with nadd_y: the square of the row this thread wrote */
    if (tid < GEMV_R * NB) {
        const int r = tid / NB, b = tid % NB;
        const bool live = NB == 1 || b < nb;
        float v = 0.f, sq = 0.f;
#pragma unroll
        for (int i = 0; i < WARPS; i++) {
            v += red[i][r * NB + b];
            if (a.norm)
                sq += red[i][GEMV_R * NB + b];
        }
        if (a.norm)
            v *= 1.0f / sqrtf(sq / (float)a.K + a.eps);
        int j, lr;
        const bool okr = gr.at(a, g, r, &j, &lr);
        if (okr) {
            v += a.bias[j] ? a.bias[j][lr] : 0.f;
            if (live) {
                float *y = a.y[j] + (size_t)(a.y_row0 + b) * a.ldy[j] + lr;
                *y = a.acc[j] ? *y + v : v;
                t2 = v * v;
            }
        }
        if (gr.pair) {
            /* gate rows are r = 0, 1 and up rows r = 2, 3: exchanged through red[0] (each thread
             * writes only the slot it alone read) */
            const unsigned mask = 0xffffffffu >> (32 - GEMV_R * NB);
            __syncwarp(mask);
            red[0][tid] = v;
            __syncwarp(mask);
            if (r < 2 && okr && live)
                a.h[(size_t)b * a.ldh + lr] = act_f(a.pair_act, v) * red[0][(r + 2) * NB + b];
        }
    }
    return t2;
}

/* Code k (of BITS bits) of word wd as the float 1 + q / 2^BITS: the code moved
 * into the top of a float's mantissa under the exponent of 1.0, one shift and
 * one LOP3 where an integer-to-float conversion (a quarter-rate instruction,
 * the bound of this kernel before) would be. */
template <int BITS>
__device__ __forceinline__ float mlx_code_f(uint32_t wd, int k)
{
    const int at = k * BITS, top = 23 - BITS; /* the code's bit, the bit it goes to */
    const uint32_t v = at <= top ? wd << (top - at) : wd >> (at - top);
    return __uint_as_float((v & (((1u << BITS) - 1) << top)) | 0x3F800000u);
}

/* MLX affine (x = s * q + b per group of elements): BITS 4 or 8, scales and
 * biases of type ST. 16 bytes of codes (32 or 16 elements) lie in one group.
 * Per 16 bytes and row: s * sum q x + b * sum x, sum q x from codes as
 * floats 1 + q / 2^BITS (mlx_code_f). */
template <int BITS, int ST, int NB, int TH>
__global__ void __launch_bounds__(TH, NB == 1 ? 768 / TH : 1) gemv_mlx_kernel(const lms_cu_gemv a)
{
    constexpr int EPC = 128 / BITS; /* elements in 16 bytes of codes */
    constexpr int NV = GEMV_R * NB + NB;
    __shared__ float red[TH / 32][NV];
    griddep_launch();
    const int K = a.K, tid = threadIdx.x, nch = K / EPC, g = blockIdx.x, gs = a.group;
    const gemv_rows gr(a);
    const size_t row_bytes = (size_t)K * BITS / 8, srow = (size_t)(K / gs);
    const uint8_t *wr[GEMV_R];
    const void *sc[GEMV_R], *bi[GEMV_R];
    bool ok[GEMV_R];
#pragma unroll
    for (int r = 0; r < GEMV_R; r++) {
        int j, lr;
        ok[r] = gr.at(a, g, r, &j, &lr);
        size_t row = ok[r] ? lr : 0;
        wr[r] = (const uint8_t *)a.w[j] + row * row_bytes;
        sc[r] = (const uint8_t *)a.scales[j] + row * srow * sizeof(typename elem<ST>::t);
        bi[r] = (const uint8_t *)a.biases[j] + row * srow * sizeof(typename elem<ST>::t);
    }
    uint4 w[GEMV_R][GEMV_U];
    gemv_load<TH>(w, wr, ok, tid, nch);
    griddep_wait();
    const int nb = NB == 1 ? 1 : a.nb_fixed > 0 ? a.nb_fixed : a.step[LMS_CU_STEP_NB];
    const float *x = a.x + (size_t)a.row0 * a.ldx;
    float acc[GEMV_R][NB], ss[NB];
#pragma unroll
    for (int b = 0; b < NB; b++) {
        ss[b] = 0.f;
#pragma unroll
        for (int r = 0; r < GEMV_R; r++) acc[r][b] = 0.f;
    }
    for (int c0 = tid; c0 < nch; c0 += GEMV_U * TH) {
#pragma unroll
        for (int u = 0; u < GEMV_U; u++) {
            const int c = c0 + u * TH;
            if (c >= nch)
                break;
            const int k0 = c * EPC, grp = k0 / gs;
            float s[GEMV_R], bb[GEMV_R];
#pragma unroll
            for (int r = 0; r < GEMV_R; r++) s[r] = elem<ST>::get(sc[r], grp), bb[r] = elem<ST>::get(bi[r], grp);
#pragma unroll
            for (int b = 0; b < NB; b++) {
                if (NB > 1 && b >= nb)
                    break;
                const float4 *xv = (const float4 *)(x + (size_t)b * a.ldx + k0);
                const float4 *nv = a.norm ? (const float4 *)(a.norm + k0) : nullptr;
                float xs = 0.f, dq[GEMV_R];
#pragma unroll
                for (int r = 0; r < GEMV_R; r++) dq[r] = 0.f;
#pragma unroll
                for (int q = 0; q < EPC / 4; q++) { /* 4 elements at a time: codes 4q .. 4q + 3 */
                    float4 v4 = __ldg(xv + q);
                    float xf[4] = {v4.x, v4.y, v4.z, v4.w};
                    if (nv) {
                        float4 n4 = __ldg(nv + q);
                        ss[b] += xf[0] * xf[0] + xf[1] * xf[1] + xf[2] * xf[2] + xf[3] * xf[3];
                        xf[0] *= n4.x, xf[1] *= n4.y, xf[2] *= n4.z, xf[3] *= n4.w;
                    }
                    xs += (xf[0] + xf[1]) + (xf[2] + xf[3]);
#pragma unroll
                    for (int r = 0; r < GEMV_R; r++) {
                        const uint32_t wd = q * 4 * BITS / 32 == 0   ? w[r][u].x
                                            : q * 4 * BITS / 32 == 1 ? w[r][u].y
                                            : q * 4 * BITS / 32 == 2 ? w[r][u].z
                                                                     : w[r][u].w;
#pragma unroll
                        for (int e = 0; e < 4; e++) {
                            const int k = (4 * q + e) % (32 / BITS); /* element within its word */
                            dq[r] = fmaf(mlx_code_f<BITS>(wd, k), xf[e], dq[r]);
                        }
                    }
                }
                /* dq = sum (1 + q / 2^BITS) x = xs + sum q x / 2^BITS */
#pragma unroll
                for (int r = 0; r < GEMV_R; r++)
                    acc[r][b] = fmaf(s[r] * (float)(1 << BITS), dq[r] - xs, fmaf(bb[r], xs, acc[r][b]));
            }
        }
        if (c0 + GEMV_U * TH < nch)
            gemv_load<TH>(w, wr, ok, c0 + GEMV_U * TH, nch);
    }
    const float t2 = gemv_finish<NB, TH / 32>(a, gr, g, nb, acc, ss, red);
    if (a.nadd_y)
        gemv_norm_add<NB>(a, nb, t2);
}

/* ---- MLX affine GEMV on int8 activations (one row of x: decode) -------------------------- */

/* a . b over 4 bytes, a's bytes unsigned (codes), b's signed (quantized x), plus c */
__device__ __forceinline__ int dp4a_us(uint32_t a, uint32_t b, int c)
{
    int d;
    asm("dp4a.u32.s32 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(c));
    return d;
}

/* A row's scale and bias of one group: 16-bit types packed in one register (scale low). */
template <int ST> struct mlx_sb {
    uint32_t v;
    __device__ __forceinline__ void load(const uint8_t *sc, const uint8_t *bi, int grp)
    {
        v = (uint32_t)__ldg((const unsigned short *)sc + grp) | (uint32_t)__ldg((const unsigned short *)bi + grp) << 16;
    }
    __device__ __forceinline__ void zero() { v = 0; }
    __device__ __forceinline__ float s() const { return ST == LMS_CU_BF16 ? bf16_lo(v) : f16_lo(v); }
    __device__ __forceinline__ float b() const { return ST == LMS_CU_BF16 ? bf16_hi(v) : f16_hi(v); }
};
template <> struct mlx_sb<LMS_CU_F32> {
    float sv, bv;
    __device__ __forceinline__ void load(const uint8_t *sc, const uint8_t *bi, int grp)
    {
        sv = __ldg((const float *)sc + grp), bv = __ldg((const float *)bi + grp);
    }
    __device__ __forceinline__ void zero() { sv = bv = 0.f; }
    __device__ __forceinline__ float s() const { return sv; }
    __device__ __forceinline__ float b() const { return bv; }
};

/* in(x) (x, or x * norm: the RMS scale is applied to the sums) of K elements quantized to int8
 * per group of gs (a power of two, 32 to 128; gsh = log2 gs) into xq, in code order for 4-bit
 * codes (gemv_mlxq_kernel's comment), and xg[group] = (dx, dx * sum of the rounded values *
 * EPC / gs); thread tid of TH takes 4 elements at a time, gs / 4 consecutive threads a group,
 * XB float4s of x (and of the norm) in flight at a time. Returns the thread's share of
 * sum x^2 (0 without norm). Ends before the block's barrier. */
template <int BITS, int TH, int XB, bool NORM>
__device__ __forceinline__ float mlxq_quantize(const float *x, const float *norm, int K, int gs, int gsh, int tid,
                                               uint8_t *xq, float2 *xg)
{
    constexpr int EPC = 128 / BITS;
    const int gl = gs / 4; /* lanes of a group: 8, 16 or 32 */
    float ss = 0.f;
    for (int base = 0; base < K; base += XB * 4 * TH) {
        float4 v[XB], n[XB];
#pragma unroll
        for (int i = 0; i < XB; i++) {
            const int k = base + (i * TH + tid) * 4;
            v[i] = k < K ? __ldg((const float4 *)(x + k)) : make_float4(0.f, 0.f, 0.f, 0.f);
            if (NORM)
                n[i] = k < K ? __ldg((const float4 *)(norm + k)) : make_float4(0.f, 0.f, 0.f, 0.f);
        }
#pragma unroll
        for (int i = 0; i < XB; i++) {
            const int k = base + (i * TH + tid) * 4;
            if (base + i * TH * 4 >= K) /* the same for the whole block: no thread waits at a shuffle alone */
                break;
            float4 t = v[i];
            if (NORM) {
                ss += t.x * t.x + t.y * t.y + t.z * t.z + t.w * t.w;
                t.x *= n[i].x, t.y *= n[i].y, t.z *= n[i].z, t.w *= n[i].w;
            }
            float amax = fmaxf(fmaxf(fabsf(t.x), fabsf(t.y)), fmaxf(fabsf(t.z), fabsf(t.w)));
            for (int o = 1; o < gl; o <<= 1) amax = fmaxf(amax, __shfl_xor_sync(0xffffffffu, amax, o));
            const float inv = amax > 0.f ? 127.f / amax : 0.f;
            const int i0 = __float2int_rn(t.x * inv), i1 = __float2int_rn(t.y * inv);
            const int i2 = __float2int_rn(t.z * inv), i3 = __float2int_rn(t.w * inv);
            int isum = (i0 + i1) + (i2 + i3); /* the group's sum of the rounded values */
            for (int o = 1; o < gl; o <<= 1) isum += __shfl_xor_sync(0xffffffffu, isum, o);
            if (k >= K)
                continue;
            const uint32_t q0 = (uint32_t)i0 & 0xffu, q1 = (uint32_t)i1 & 0xffu, q2 = (uint32_t)i2 & 0xffu,
                           q3 = (uint32_t)i3 & 0xffu;
            if (BITS == 8) {
                *(uint32_t *)(xq + k) = q0 | q1 << 8 | q2 << 16 | q3 << 24;
            } else { /* elements e0 .. e0 + 3 of a word of codes (e0 0 or 4): even ones to the low
                      * word's bytes e0 / 2, e0 / 2 + 1, odd ones to the high word's */
                const int c = k >> 5, i8 = (k & 31) >> 3, e0 = k & 7;
                uint8_t *p = xq + (i8 >> 1) * (K >> 1) + c * 16 + (i8 & 1) * 8 + (e0 >> 1);
                *(uint16_t *)p = (uint16_t)(q0 | q2 << 8);
                *(uint16_t *)(p + 4) = (uint16_t)(q1 | q3 << 8);
            }
            if ((k & (gs - 1)) == 0) /* each of the group's gs / EPC chunks adds b * its share of the sum */
                xg[k >> gsh] = make_float2(amax * (1.f / 127.f), amax * (1.f / 127.f) * (float)isum * (float)EPC / (float)gs);
        }
    }
    return ss;
}

/* The block's barrier after mlxq_quantize, and the RMS scale 1 / sqrt(mean x^2 + eps) of in(x)
 * with a norm (1 without): ss the thread's share of sum x^2, red W floats of shared memory. */
template <int W> __device__ __forceinline__ float mlxq_rms_scale(const lms_cu_gemv &a, float ss, float *red)
{
    if (a.norm) {
        ss = warp_sum(ss);
        if ((threadIdx.x & 31) == 0)
            red[threadIdx.x >> 5] = ss;
    }
    __syncthreads();
    if (!a.norm)
        return 1.f;
    float t = 0.f;
#pragma unroll
    for (int i = 0; i < W; i++) t += red[i];
    return 1.0f / sqrtf(t / (float)a.K + a.eps);
}

/* sum q x_q over one 16-byte chunk of codes q: xa (and xb, 4-bit) its bytes of x in code order */
template <int BITS> __device__ __forceinline__ int mlxq_dot(uint4 q, uint4 xa, uint4 xb)
{
    int s = 0;
    if (BITS == 4) {
        const uint32_t m = 0x0f0f0f0fu;
        s = dp4a_us(q.x & m, xa.x, s), s = dp4a_us((q.x >> 4) & m, xa.y, s);
        s = dp4a_us(q.y & m, xa.z, s), s = dp4a_us((q.y >> 4) & m, xa.w, s);
        s = dp4a_us(q.z & m, xb.x, s), s = dp4a_us((q.z >> 4) & m, xb.y, s);
        s = dp4a_us(q.w & m, xb.z, s), s = dp4a_us((q.w >> 4) & m, xb.w, s);
    } else {
        s = dp4a_us(q.x, xa.x, s), s = dp4a_us(q.y, xa.y, s);
        s = dp4a_us(q.z, xa.z, s), s = dp4a_us(q.w, xa.w, s);
    }
    return s;
}

/* threads a block and resident blocks per multiprocessor (registers: at most 128 a thread);
 * bench/mlx_gemv.cu builds other values to compare (2 x 256 was the kernel before) */
#ifndef MLXQ_TH
#define MLXQ_TH 512
#endif
#ifndef MLXQ_BLOCKS
#define MLXQ_BLOCKS 1
#endif
#define MLXQ_RW 2   /* rows of a warp */
#define MLXQ_U 4    /* 16-byte chunks of codes per row and lane in flight */
#define MLXQ_XB 4   /* float4s of x and of the norm per thread in flight while quantizing (8 of x without one) */
/* 16-bit scales and biases loaded 16 bytes at a time: a warp's share of a round of loads (its
 * rows' groups of MLXQ_U * 32 chunks) is at most 64 pieces of 16 bytes, 2 a lane */
#define MLXQ_SBP 2
#define MLXQ_SBW (MLXQ_SBP * 32 * 16) /* bytes of a warp's scales and biases in shared memory */

/* Shared memory of gemv_mlxq_kernel for rows of K (group gs): the int8 input, (scale, sum) per
 * group, then (from mlxq_sb_off, 16-byte aligned) each warp's scales and biases of a round. */
__host__ __device__ static size_t mlxq_sb_off(int K, int gs)
{
    return ((size_t)K + (size_t)(K / gs) * sizeof(float2) + 15) / 16 * 16;
}
__host__ __device__ static size_t mlxq_smem(int K, int gs)
{
    return mlxq_sb_off(K, gs) + (size_t)(MLXQ_TH / 32) * MLXQ_SBW;
}

/*
 * y = W . x for MLX affine W (codes of BITS bits, scales and biases of type
 * ST) and one row of x, on products of integers:
 *
 *   1. The block quantizes in(x) (x, or x * norm with the RMS scale applied
 *      at the end) to int8 per group of the weights' group size g (scale
 *      dx_g = max |x| / 127) into shared memory, with dx_g times the group's
 *      sum of the rounded values. 4-bit codes sit in a word as elements 0..7
 *      at bits 4e, so the bytes of x are laid out in code order: for each
 *      word of codes, the even elements' bytes, then the odd ones' (word &
 *      0x0f0f0f0f and (word >> 4) & 0x0f0f0f0f meet them with one dp4a each).
 *      x and the norm are loaded together (mlxq_quantize), MLXQ_XB float4s
 *      of each per thread at a time, twice that of x without a norm: one L2
 *      round trip for a row of 4096 (8192 without a norm).
 *   2. A persistent grid (MLXQ_BLOCKS blocks of MLXQ_TH threads per
 *      multiprocessor, one of 512 by default: x is quantized once per block,
 *      so once per multiprocessor): each warp takes units of MLXQ_RW rows (gate
 *      row r and up row r with pair_act), lane l the 16-byte chunks l, l + 32,
 *      ... of each, MLXQ_U per row in flight; the next unit's first loads go
 *      out before this unit's sums. Per chunk and row: sum q x_q by dp4a (8
 *      for 32 4-bit codes, 4 for 16 8-bit ones), then s dx (that) + b dx
 *      (the chunk's share of the group's sum of x_q).
 *      Scales and biases: without SBV each lane loads its chunks' 2-byte values
 *      (one load per chunk, row and array); with SBV (16-bit scales and biases,
 *      rows of them a multiple of 16 bytes), a round's scales and biases of
 *      the warp's rows come with its codes as 16-byte loads, MLXQ_SBP a
 *      lane, are stored in the warp's slot of shared memory, and each chunk
 *      reads its scale and its bias there.
 *   3. Warp sums; lane 0 writes the row (RMS scale, bias, residual add) and
 *      with pair_act act(gate) * up.
 *
 * The result is W times x rounded to int8 per group, in exact arithmetic
 * but for f32 rounding (|x - x_q dx| <= dx / 2 per element: a few 1e-3 of a
 * product's typical size). The first chunks' loads are issued before
 * griddepcontrol.wait.
 */
template <int BITS, int ST, bool SBV>
__global__ void __launch_bounds__(MLXQ_TH, MLXQ_BLOCKS) gemv_mlxq_kernel(const lms_cu_gemv a)
{
    constexpr int EPC = 128 / BITS, W = MLXQ_TH / 32, RW = MLXQ_RW, U = MLXQ_U;
    extern __shared__ __align__(16) uint8_t mq_smem[];
    __shared__ float red[W];
    griddep_launch();
    const int K = a.K, gs = a.group, gsh = __ffs(gs) - 1, nch = K / EPC, tid = threadIdx.x, lane = tid & 31,
              warp = tid >> 5; /* gs: a power of two */
    uint8_t *xq = mq_smem;                /* K bytes */
    float2 *xg = (float2 *)(mq_smem + K); /* [K / gs]: dx, and dx * sum q * EPC / gs (a chunk's share) */
    /* SBV: the warp's slot, per row scales then biases of a round's G groups */
    uint16_t *sbs = (uint16_t *)(mq_smem + mlxq_sb_off(K, gs) + (size_t)warp * MLXQ_SBW);
    const int G = (U * 32 * EPC) >> gsh; /* groups of a row in a round: 16 to 128 */
    const int ppa = G / 8, ngr = K >> gsh; /* 16-byte pieces of a row's scales (or biases) in a round; groups a row */
    const size_t row_bytes = (size_t)K * BITS / 8, srow = (size_t)(K / gs) * sizeof(typename elem<ST>::t);

    /* the warp's rows: unit gw (gate and up row gw with pair_act, else rows RW gw ..), units
     * gw, gw + gridDim.x * W, ... (a persistent grid: x is quantized once per block) */
    const bool pair = a.pair_act != 0;
    const int s1 = a.rows[0], s2 = s1 + (a.n_jobs > 1 ? a.rows[1] : 0), total = s2 + (a.n_jobs > 2 ? a.rows[2] : 0);
    const int units = pair ? a.rows[0] : (total + RW - 1) / RW, gstride = gridDim.x * W;
    int gw = blockIdx.x * W + warp;
    const uint8_t *wr[RW];
    const uint8_t *scr[RW], *bir[RW];
    bool ok[RW];
    int job[RW], lrow[RW];
    auto setup = [&](int u) {
#pragma unroll
        for (int r = 0; r < RW; r++) {
            if (pair) {
                job[r] = r, lrow[r] = u;
                ok[r] = u < a.rows[0];
            } else {
                const int x = u * RW + r;
                const int j = (a.n_jobs > 1 && x >= s1) + (a.n_jobs > 2 && x >= s2);
                job[r] = j, lrow[r] = x - (j == 0 ? 0 : j == 1 ? s1 : s2);
                ok[r] = x < total;
            }
            const size_t row = ok[r] ? (size_t)lrow[r] : 0;
            wr[r] = (const uint8_t *)a.w[job[r]] + row * row_bytes;
            scr[r] = (const uint8_t *)a.scales[job[r]] + row * srow;
            bir[r] = (const uint8_t *)a.biases[job[r]] + row * srow;
        }
    };
    uint4 w[RW][U];
    mlx_sb<ST> sb[SBV ? 1 : RW][SBV ? 1 : U];
    uint4 sbp[SBV ? MLXQ_SBP : 1]; /* SBV: piece p = lane + 32 i of the round: row, array, offset */
    auto load = [&](int i0) {
#pragma unroll
        for (int u = 0; u < U; u++) {
            const int c = (i0 + u) * 32 + lane, grp = (c * EPC) >> gsh;
#pragma unroll
            for (int r = 0; r < RW; r++) {
                if (ok[r] && c < nch) {
                    w[r][u] = ld_stream(wr[r] + (size_t)c * 16);
                    if constexpr (!SBV)
                        sb[r][u].load(scr[r], bir[r], grp);
                } else {
                    w[r][u] = make_uint4(0, 0, 0, 0);
                    if constexpr (!SBV)
                        sb[r][u].zero();
                }
            }
        }
        if constexpr (SBV) {
            const int g0 = (i0 * 32 * EPC) >> gsh; /* the round's first group */
#pragma unroll
            for (int i = 0; i < MLXQ_SBP; i++) {
                const int p = lane + 32 * i, r = p / (2 * ppa), arr = (p / ppa) & 1, off = g0 + (p % ppa) * 8;
                sbp[i] = make_uint4(0, 0, 0, 0);
#pragma unroll
                for (int rr = 0; rr < RW; rr++) /* rr: a constant index into the row arrays */
                    if (rr == r && ok[rr] && off < ngr)
                        sbp[i] = ld_stream((arr ? bir[rr] : scr[rr]) + (size_t)off * 2);
            }
        }
    };
    setup(gw);
    load(0);
    griddep_wait();

    /* 1. quantize */
    const float *x = a.x + (size_t)a.row0 * a.ldx;
    float ss = a.norm ? mlxq_quantize<BITS, MLXQ_TH, MLXQ_XB, true>(x, a.norm, K, gs, gsh, tid, xq, xg)
                      : mlxq_quantize<BITS, MLXQ_TH, 2 * MLXQ_XB, false>(x, a.norm, K, gs, gsh, tid, xq, xg);
    const float rs = mlxq_rms_scale<W>(a, ss, red);

    /* 2. the products, unit after unit; the next unit's first loads before this one's sums */
    for (; gw < units; gw += gstride) {
        float acc[RW];
#pragma unroll
        for (int r = 0; r < RW; r++) acc[r] = 0.f;
        for (int i0 = 0; i0 * 32 < nch; i0 += U) {
            if constexpr (SBV) { /* the round's scales and biases into the warp's slot (the last round's read) */
                __syncwarp();
#pragma unroll
                for (int i = 0; i < MLXQ_SBP; i++)
                    if (lane + 32 * i < RW * 2 * ppa)
                        *(uint4 *)(sbs + (lane + 32 * i) * 8) = sbp[i];
                __syncwarp();
            }
#pragma unroll
            for (int u = 0; u < U; u++) {
                const int c = (i0 + u) * 32 + lane;
                if (c >= nch)
                    break;
                const float2 g2 = xg[(c * EPC) >> gsh];
                const uint4 xa = *(const uint4 *)(xq + (size_t)c * 16);
                uint4 xb = make_uint4(0, 0, 0, 0);
                if (BITS == 4)
                    xb = *(const uint4 *)(xq + (K >> 1) + (size_t)c * 16);
#pragma unroll
                for (int r = 0; r < RW; r++) {
                    const int s = mlxq_dot<BITS>(w[r][u], xa, xb);
                    float sc, bi;
                    if constexpr (SBV) {
                        const int gl = ((u * 32 + lane) * EPC) >> gsh; /* the group within the round */
                        const uint32_t sv = sbs[(2 * r) * G + gl], bv = sbs[(2 * r + 1) * G + gl];
                        sc = ST == LMS_CU_BF16 ? bf16_lo(sv) : f16_lo(sv);
                        bi = ST == LMS_CU_BF16 ? bf16_lo(bv) : f16_lo(bv);
                    } else {
                        sc = sb[r][u].s(), bi = sb[r][u].b();
                    }
                    /* s * dx * sum q x_q + b * dx * sum x_q (this chunk's share) */
                    acc[r] = fmaf(sc, g2.x * (float)s, fmaf(bi, g2.y, acc[r]));
                }
            }
            if ((i0 + U) * 32 < nch)
                load(i0 + U);
        }
        /* 3. the rows */
        int jb[RW], lr[RW];
        bool okw[RW];
#pragma unroll
        for (int r = 0; r < RW; r++) jb[r] = job[r], lr[r] = lrow[r], okw[r] = ok[r];
        if (gw + gstride < units) {
            setup(gw + gstride);
            load(0);
        }
        float v[RW];
#pragma unroll
        for (int r = 0; r < RW; r++) {
            v[r] = warp_sum(acc[r]) * rs;
            if (okw[r] && a.bias[jb[r]])
                v[r] += a.bias[jb[r]][lr[r]];
        }
        if (lane == 0) {
#pragma unroll
            for (int r = 0; r < RW; r++)
                if (okw[r]) {
                    float *y = a.y[jb[r]] + (size_t)a.y_row0 * a.ldy[jb[r]] + lr[r];
                    *y = a.acc[jb[r]] ? *y + v[r] : v[r];
                }
            if (pair && okw[0])
                a.h[lr[0]] = act_f(a.pair_act, v[0]) * v[1];
        }
    }
}

/* hi[r][k] + lo[r][k] = s * q + b of rows [r0, r0 + n) of an MLX affine matrix:
 * the value rounded to bf16, and what that rounding lost, also bf16 (a GEMM
 * over both carries about 16 bits of the weights, as the f32 CPU path does).
 * One thread per 32-bit word of codes (32-bit index arithmetic: K * BITS / 32
 * words a row, rows of a chunk fit in 32 bits). */
template <int BITS, int ST>
__global__ void mlx_dequant_kernel(__nv_bfloat16 *hi, __nv_bfloat16 *lo, const uint8_t *w, const void *scales,
                                   const void *biases, int K, int group, int r0, int n)
{
    griddep_launch();
    griddep_wait();
    constexpr int EPW = 32 / BITS;
    const int wpr = K / EPW; /* words a row */
    const unsigned total = (unsigned)n * (unsigned)wpr;
    const uint32_t *wr = (const uint32_t *)(w + (size_t)r0 * ((size_t)K * BITS / 8));
    for (unsigned i = blockIdx.x * blockDim.x + threadIdx.x; i < total; i += gridDim.x * blockDim.x) {
        const unsigned row = i / (unsigned)wpr, k0 = (i % (unsigned)wpr) * EPW;
        const uint32_t wd = wr[i];
        const size_t gi = (size_t)(r0 + row) * (size_t)(K / group) + k0 / group; /* EPW <= group */
        const float sc = elem<ST>::get(scales, gi), bi = elem<ST>::get(biases, gi);
        __nv_bfloat16 h[EPW], l[EPW];
#pragma unroll
        for (int e = 0; e < EPW; e++) {
            float v = fmaf(sc, (float)((wd >> (e * BITS)) & ((1u << BITS) - 1)), bi);
            h[e] = __float2bfloat16_rn(v);
            l[e] = __float2bfloat16_rn(v - __bfloat162float(h[e]));
        }
        const size_t o = (size_t)row * K + k0;
        if (EPW == 8) {
            *(uint4 *)(hi + o) = *(const uint4 *)h;
            *(uint4 *)(lo + o) = *(const uint4 *)l;
        } else {
#pragma unroll
            for (int e = 0; e < EPW; e++) hi[o + e] = h[e], lo[o + e] = l[e];
        }
    }
}

/* x[b] = the dequantized embedding row tokens[b] of an MLX affine matrix (values in the
 * scales' type, as MLX's), times scale. */
template <int BITS, int ST>
__global__ void embed_mlx_kernel(float *x, const uint8_t *w, const void *scales, const void *biases, int E, int group,
                                 float scale, const int32_t *step)
{
    griddep_launch();
    griddep_wait();
    int b = blockIdx.x;
    if (b >= step[LMS_CU_STEP_NB])
        return;
    size_t row = (size_t)step[LMS_CU_STEP_TOKENS + b];
    const uint32_t *wr = (const uint32_t *)(w + row * ((size_t)E * BITS / 8));
    for (int k = threadIdx.x; k < E; k += blockDim.x) {
        uint32_t q = (wr[k / (32 / BITS)] >> ((k % (32 / BITS)) * BITS)) & ((1u << BITS) - 1);
        size_t gi = row * (size_t)(E / group) + k / group;
        /* as mlx.core.dequantize (and the CPU backend): s * q and + b each rounded to the scales' type */
        float v = round_to<ST>(round_to<ST>(elem<ST>::get(scales, gi) * (float)q) + elem<ST>::get(biases, gi));
        x[(size_t)b * E + k] = v * scale;
    }
}

/*
 * Block i: groups of GEMV_R rows g = i, i + gridDim.x, ... (a persistent
 * grid of a few blocks per SM when the launcher sizes it so; one group per
 * block otherwise), the whole of K split over the block's threads (thread
 * t takes the 16-byte chunks t, t + 256, ...), GEMV_U x GEMV_R loads per
 * thread in flight; partial sums reduced over the block. The loads of a
 * group's first chunks are issued as soon as the previous group's last
 * chunks are in registers, before that group's reduction, so that a block's
 * memory pipe never drains between groups and the blocks of a launch do
 * not move in lockstep (waves of blocks that all load, then all reduce).
 * With a norm, the input is x * norm and the block also sums x^2 over the
 * same chunks, so the RMS scale (a scalar per row of x) multiplies the
 * result: the RMSNorm costs no pass of its own. The first loads are issued
 * before griddepcontrol.wait (weights do not depend on the previous kernel).
 */
template <int T, int NB, int MINB, bool LOOP>
__global__ void __launch_bounds__(GEMV_THREADS, MINB) gemv_vec_kernel(const lms_cu_gemv a)
{
    typedef elem<T> E;
    constexpr int per = E::per16;
    constexpr int NV = GEMV_R * NB + NB; /* reduced values: sums, then sums of squares */
    __shared__ float red[LOOP ? 2 : 1][GEMV_WARPS][NV];
    if (!a.late_release)
        griddep_launch();
    const int K = a.K, tid = threadIdx.x, nch = K / per;
    const gemv_rows gr(a);
    const size_t row_bytes = (size_t)K * sizeof(typename E::t);
    uint4 w[GEMV_R][GEMV_U];
    const uint8_t *wr[GEMV_R];
    bool ok[GEMV_R];
    auto rows_of = [&](int g) {
#pragma unroll
        for (int r = 0; r < GEMV_R; r++) {
            int j, lr;
            ok[r] = gr.at(a, g, r, &j, &lr);
            wr[r] = (const uint8_t *)a.w[j] + (size_t)(ok[r] ? lr : 0) * row_bytes;
        }
    };
    /* chunks c0, c0 + 256, ... of group g's rows into w; with LOOP the row addresses are
     * recomputed each time (fewer registers live across the loop) */
    auto load = [&](int g, int c0) {
        if (LOOP)
            rows_of(g);
        gemv_load<GEMV_THREADS>(w, wr, ok, c0, nch);
    };
    int g = blockIdx.x;
    rows_of(g);
    load(g, tid);
    griddep_wait();
    const int nb = NB == 1 ? 1 : a.nb_fixed > 0 ? a.nb_fixed : a.step[LMS_CU_STEP_NB];
    const float *x = a.x + (size_t)a.row0 * a.ldx;
    float t2 = 0.f; /* with nadd_y: the squares of the rows this thread wrote */

    for (int par = 0; g < gr.groups; g += LOOP ? gridDim.x : gr.groups, par ^= 1) {
        float acc[GEMV_R][NB], ss[NB];
#pragma unroll
        for (int b = 0; b < NB; b++) {
            ss[b] = 0.f;
#pragma unroll
            for (int r = 0; r < GEMV_R; r++) acc[r][b] = 0.f;
        }
        for (int c0 = tid; c0 < nch; c0 += GEMV_U * GEMV_THREADS) {
#pragma unroll
            for (int u = 0; u < GEMV_U; u++) {
                const int c = c0 + u * GEMV_THREADS;
                if (c >= nch)
                    break;
                float wf[GEMV_R][8], nf[8];
#pragma unroll
                for (int r = 0; r < GEMV_R; r++) E::unpack(w[r][u], wf[r]);
                if (a.norm) {
                    const float4 *nv = (const float4 *)(a.norm + (size_t)c * per);
                    float4 n0 = __ldg(nv);
                    nf[0] = n0.x, nf[1] = n0.y, nf[2] = n0.z, nf[3] = n0.w;
                    if (per == 8) {
                        float4 n1 = __ldg(nv + 1);
                        nf[4] = n1.x, nf[5] = n1.y, nf[6] = n1.z, nf[7] = n1.w;
                    }
                }
#pragma unroll
                for (int b = 0; b < NB; b++) {
                    if (NB > 1 && b >= nb)
                        break;
                    const float4 *xv = (const float4 *)(x + (size_t)b * a.ldx + (size_t)c * per);
                    float xf[8];
                    float4 x0 = __ldg(xv);
                    xf[0] = x0.x, xf[1] = x0.y, xf[2] = x0.z, xf[3] = x0.w;
                    if (per == 8) {
                        float4 x1 = __ldg(xv + 1);
                        xf[4] = x1.x, xf[5] = x1.y, xf[6] = x1.z, xf[7] = x1.w;
                    }
                    if (a.norm) {
#pragma unroll
                        for (int e = 0; e < per; e++) {
                            ss[b] = fmaf(xf[e], xf[e], ss[b]);
                            xf[e] *= nf[e];
                        }
                    }
#pragma unroll
                    for (int r = 0; r < GEMV_R; r++)
#pragma unroll
                        for (int e = 0; e < per; e++) acc[r][b] = fmaf(wf[r][e], xf[e], acc[r][b]);
                }
            }
            /* the next round's loads: this group's next chunks, or the next group's first */
            if (c0 + GEMV_U * GEMV_THREADS < nch)
                load(g, c0 + GEMV_U * GEMV_THREADS);
            else if (LOOP && g + (int)gridDim.x < gr.groups)
                load(g + gridDim.x, tid);
        }
        if (a.late_release && (!LOOP || g + (int)gridDim.x >= gr.groups))
            griddep_launch(); /* this block's last loads are in */
        t2 += gemv_finish<NB>(a, gr, g, nb, acc, ss, red[LOOP ? par : 0]);
    }
    if (a.nadd_y)
        gemv_norm_add<NB>(a, nb, t2);
}

/* Scalar path (rows not 16-byte aligned, or K not a multiple of 16 bytes): a warp per row. */
template <int T, int NB>
__global__ void __launch_bounds__(GEMV_THREADS) gemv_scalar_kernel(const lms_cu_gemv a)
{
    typedef elem<T> E;
    griddep_launch();
    griddep_wait();
    const int K = a.K, lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    const int nb = NB == 1 ? 1 : a.nb_fixed > 0 ? a.nb_fixed : a.step[LMS_CU_STEP_NB];
    const float *x = a.x + (size_t)a.row0 * a.ldx;
    const gemv_rows gr(a);
    const size_t row_bytes = (size_t)K * sizeof(typename E::t);
    __shared__ float hv[GEMV_WARPS][NB];
    const int g = blockIdx.x;
    for (int r = warp; r < GEMV_R; r += GEMV_WARPS) {
        int j, lr;
        bool ok = gr.at(a, g, r, &j, &lr);
        const uint8_t *wr = (const uint8_t *)a.w[j] + (size_t)(ok ? lr : 0) * row_bytes;
        float acc[NB], ss[NB];
#pragma unroll
        for (int b = 0; b < NB; b++) acc[b] = ss[b] = 0.f;
        for (int k = lane; ok && k < K; k += 32) {
            float wv = E::get(wr, k);
#pragma unroll
            for (int b = 0; b < NB; b++)
                if (NB == 1 || b < nb) {
                    float xv = x[(size_t)b * a.ldx + k];
                    if (a.norm)
                        ss[b] = fmaf(xv, xv, ss[b]), xv *= a.norm[k];
                    acc[b] = fmaf(wv, xv, acc[b]);
                }
        }
#pragma unroll
        for (int b = 0; b < NB; b++) {
            float v = warp_sum(acc[b]), sq = warp_sum(ss[b]);
            if (a.norm)
                v *= 1.0f / sqrtf(sq / (float)K + a.eps);
            if (ok && (NB == 1 || b < nb)) {
                v += a.bias[j] ? a.bias[j][lr] : 0.f;
                if (lane == 0) {
                    float *y = a.y[j] + (size_t)(a.y_row0 + b) * a.ldy[j] + lr;
                    *y = a.acc[j] ? *y + v : v;
                }
            }
            if (lane == 0)
                hv[warp][b] = v;
        }
    }
    if (gr.pair) {
        __syncthreads();
        int b = threadIdx.x % NB, r = threadIdx.x / NB, j, lr;
        if (r < 2 && (NB == 1 || b < nb) && gr.at(a, g, r, &j, &lr))
            a.h[(size_t)b * a.ldh + lr] = act_f(a.pair_act, hv[r][b]) * hv[r + 2][b];
    }
}

int gemv_norm_add_launch(const lms_cu_gemv *a, void *stream);

/* One-row GEMVs: blocks a multiprocessor of the persistent grid, 3 or 4 (the kernel's
 * register budget: 80 or 64 a thread), or 0: a block per group of rows
 * (lms_cu_set_gemv_blocks). */
int g_gemv_blocks = GEMV_PERSIST_BLOCKS;
int g_gemv_grid_cap; /* > 0: at most this many blocks (lms_cu_set_gemv_blocks) */

/* The grid of a persistent GEMV of `groups` groups of rows, `fit` blocks a multiprocessor:
 * at most the blocks that run at once, each taking the same number of groups (the last
 * maybe fewer). */
int gemv_grid(int groups, int fit, int sms)
{
    int most = fit * (sms > 0 ? sms : 132);
    if (g_gemv_grid_cap > 0 && g_gemv_grid_cap < most)
        most = g_gemv_grid_cap;
    if (groups <= most)
        return groups;
    const int each = (groups + most - 1) / most;
    return (groups + each - 1) / each;
}

template <int T, int NB>
int gemv_typed(const lms_cu_gemv *a, int sms, void *stream)
{
    bool vec = a->K % elem<T>::per16 == 0;
    for (int j = 0; j < a->n_jobs; j++) vec = vec && ((uintptr_t)a->w[j] % 16 == 0);
    vec = vec && ((uintptr_t)a->x % 16 == 0) && a->ldx % 4 == 0;
    int total = 0;
    for (int j = 0; j < a->n_jobs; j++) total += a->rows[j];
    int groups = a->pair_act ? (a->rows[0] + 1) / 2 : (total + GEMV_R - 1) / GEMV_R;
    /* one row and a product small enough that its blocks would come in a few lockstep
     * waves (each group's rows in one round of loads, a few groups a block at most): the
     * persistent grid. Larger products keep a block per group (many waves, the blocks
     * desynchronized already, 4 of them a multiprocessor: measured faster). */
    const bool persist = vec && NB == 1 && g_gemv_blocks &&
                         (g_gemv_grid_cap > 0 || (a->K / elem<T>::per16 <= GEMV_U * GEMV_THREADS &&
                                                  groups <= GEMV_PERSIST_GROUPS * g_gemv_blocks * std::max(sms, 1)));
    if (persist && g_gemv_blocks == 3)
        return launch(gemv_vec_kernel<T, 1, 3, true>, dim3(gemv_grid(groups, 3, sms)), dim3(GEMV_THREADS), 0, stream,
                      *a);
    if (persist)
        return launch(gemv_vec_kernel<T, 1, 4, true>, dim3(gemv_grid(groups, 4, sms)), dim3(GEMV_THREADS), 0, stream,
                      *a);
    if (vec)
        return launch(gemv_vec_kernel<T, NB, NB == 1 ? 4 : 2, false>, dim3(groups), dim3(GEMV_THREADS), 0, stream, *a);
    int rc = launch(gemv_scalar_kernel<T, NB>, dim3(groups), dim3(GEMV_THREADS), 0, stream, *a);
    return rc ? rc : gemv_norm_add_launch(a, stream); /* the scalar kernel leaves the post-norm */
}

/* out[b] = RMSNorm(x[row0 + b]) * w (rows of n floats; b < nb, from step or n_rows). */
__global__ void rmsnorm_kernel(float *out, const float *x, const float *w, int n, float eps, int row0, int n_rows,
                               const int32_t *step)
{
    __shared__ float red[32];
    griddep_launch();
    griddep_wait();
    int b = blockIdx.x, nb = n_rows > 0 ? n_rows : step[LMS_CU_STEP_NB];
    if (b >= nb)
        return;
    const float *xr = x + (size_t)(row0 + b) * n;
    float ss = 0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) ss += xr[i] * xr[i];
    ss = block_sum(ss, red);
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = threadIdx.x; i < n; i += blockDim.x) out[(size_t)b * n + i] = w[i] * (xr[i] * r);
}

/* h[b][i] = act(g[b][i]) * u[b][i] (b < nb from step). */
__global__ void act_mul_kernel(float *h, const float *g, const float *u, int n, int act, const int32_t *step)
{
    griddep_launch();
    griddep_wait();
    int b = blockIdx.y;
    if (b >= step[LMS_CU_STEP_NB])
        return;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x)
        h[(size_t)b * n + i] = act_f(act, g[(size_t)b * n + i]) * u[(size_t)b * n + i];
}

/* ---- prologue, embed, norm_add, bias, softcap, argmax --------------------------------------- */

template <int T>
__global__ void prologue_kernel(void *out, const float *x, const float *x2, int ldx, const float *norm, int pro,
                                float eps, int K, int row0, int n, const int32_t *step, int split)
{
    __shared__ float red[32];
    griddep_launch();
    griddep_wait();
    int nb = step ? step[LMS_CU_STEP_NB] : n;
    int b = blockIdx.x;
    if (b >= nb)
        return;
    const float *xr = x + (size_t)(row0 + b) * ldx, *x2r = x2 ? x2 + (size_t)(row0 + b) * ldx : nullptr;
    float r = 1.f;
    const bool vec = K % 4 == 0 && ldx % 4 == 0;
    if (pro == LMS_CU_PRO_NORM) {
        float ss = 0;
        if (vec)
            for (int i = threadIdx.x * 4; i < K; i += blockDim.x * 4) {
                float4 v = *(const float4 *)(xr + i);
                ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
            }
        else
            for (int i = threadIdx.x; i < K; i += blockDim.x) ss += xr[i] * xr[i];
        ss = block_sum(ss, red);
        r = 1.0f / sqrtf(ss / (float)K + eps);
    }
    if (vec) { /* 4 elements a thread: 16-byte loads */
        for (int i = threadIdx.x * 4; i < K; i += blockDim.x * 4) {
            float4 xv = *(const float4 *)(xr + i);
            float v[4] = {xv.x, xv.y, xv.z, xv.w};
            if (pro == LMS_CU_PRO_NORM) {
                float4 nv = *(const float4 *)(norm + i);
                v[0] = nv.x * (v[0] * r), v[1] = nv.y * (v[1] * r), v[2] = nv.z * (v[2] * r), v[3] = nv.w * (v[3] * r);
            } else if (pro != LMS_CU_PRO_NONE) {
                float4 uv = *(const float4 *)(x2r + i);
                v[0] = act_f(pro, v[0]) * uv.x, v[1] = act_f(pro, v[1]) * uv.y;
                v[2] = act_f(pro, v[2]) * uv.z, v[3] = act_f(pro, v[3]) * uv.w;
            }
#pragma unroll
            for (int e = 0; e < 4; e++) {
                elem<T>::put(out, (size_t)b * K + i + e, v[e]);
                if (split) {
                    float hi = elem<T>::get(out, (size_t)b * K + i + e);
                    elem<T>::put(out, (size_t)(nb + b) * K + i + e, v[e] - hi);
                }
            }
        }
        return;
    }
    for (int i = threadIdx.x; i < K; i += blockDim.x) {
        float v = pro == LMS_CU_PRO_NORM ? norm[i] * (xr[i] * r)
                  : pro == LMS_CU_PRO_NONE ? xr[i]
                                           : act_f(pro, xr[i]) * x2r[i];
        elem<T>::put(out, (size_t)b * K + i, v);
        if (split) { /* the rounding error as a second row: hi + lo carries ~16 bits of v */
            float hi = elem<T>::get(out, (size_t)b * K + i);
            elem<T>::put(out, (size_t)(nb + b) * K + i, v - hi);
        }
    }
}

/* y[b][r] (=, or += with acc) c[b][r] + c[nb + b][r] (+ bias[r]): the two halves of a split product. */
__global__ void split_sum_kernel(float *y, int ldy, const float *c, int rows, int nb, const float *bias, int acc)
{
    griddep_launch();
    griddep_wait();
    int b = blockIdx.y;
    for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += gridDim.x * blockDim.x) {
        float v = c[(size_t)b * rows + r] + c[(size_t)(nb + b) * rows + r] + (bias ? bias[r] : 0.f);
        float *o = y + (size_t)b * ldy + r;
        *o = acc ? *o + v : v;
    }
}

template <int T>
__global__ void embed_kernel(float *x, const void *embed, int E, float scale, const int32_t *step)
{
    griddep_launch();
    griddep_wait();
    int b = blockIdx.x;
    if (b >= step[LMS_CU_STEP_NB])
        return;
    int64_t tok = step[LMS_CU_STEP_TOKENS + b];
    const size_t off = (size_t)tok * E;
    float s = scale;
    if (scale != 1.f && T != LMS_CU_F32) { /* the scale and the product in the weights' type */
        float tmp;
        elem<T>::put(&tmp, 0, scale);
        s = elem<T>::get(&tmp, 0);
    }
    for (int i = threadIdx.x; i < E; i += blockDim.x) {
        float v = elem<T>::get(embed, off + i);
        if (scale != 1.f) {
            v *= s;
            if (T != LMS_CU_F32) {
                float tmp;
                elem<T>::put(&tmp, 0, v);
                v = elem<T>::get(&tmp, 0);
            }
        }
        x[(size_t)b * E + i] = v;
    }
}

/* Block i: row i of dst from row rows[i] of src. */
__global__ void gather_kernel(float *dst, const float *src, int width, const int32_t *rows)
{
    griddep_launch();
    griddep_wait(); /* src is the kernel before's output (a step of segments' last rows) */
    const float *s = src + (size_t)rows[blockIdx.x] * width;
    float *d = dst + (size_t)blockIdx.x * width;
    for (int k = threadIdx.x; k < width; k += blockDim.x) d[k] = s[k];
}

/*
 * y[b] += RMSNorm(x[b]) * w, b < the step's rows (a block each). Rows of at most
 * NORM_ADD_U x 4 x blockDim floats, 16-byte aligned, take one round of 16-byte loads: w's
 * before griddepcontrol.wait (weights do not depend on the kernel before), x's and y's
 * after it together. Dependents are released only after the wait: a product launched as
 * this kernel's programmatic dependent (lms_cu_pdl_next) issues its first weight loads
 * while this kernel runs, and holds no multiprocessor while the kernel before still does.
 */
#define NORM_ADD_U 4
__global__ void norm_add_kernel(float *y, const float *x, const float *w, int n, float eps, const int32_t *step)
{
    __shared__ float red[32];
    const int b = blockIdx.x, tid = threadIdx.x, th = blockDim.x, n4 = n / 4;
    const float *xr = x + (size_t)b * n;
    float *yr = y + (size_t)b * n;
    const bool vec = n % 4 == 0 && n4 <= NORM_ADD_U * th && ((uintptr_t)xr | (uintptr_t)yr | (uintptr_t)w) % 16 == 0;
    float4 wv[NORM_ADD_U], xv[NORM_ADD_U], yv[NORM_ADD_U];
    if (vec) {
#pragma unroll
        for (int u = 0; u < NORM_ADD_U; u++)
            if (tid + u * th < n4)
                wv[u] = __ldg((const float4 *)w + tid + u * th);
    }
    griddep_wait();
    griddep_launch();
    if (vec) {
        /* x and y of rows past the step's are loaded too (every row up to the grid's is
         * allocated), so that no load waits for the step's row count */
        float ss = 0.f;
#pragma unroll
        for (int u = 0; u < NORM_ADD_U; u++)
            if (tid + u * th < n4) {
                xv[u] = __ldcg((const float4 *)xr + tid + u * th);
                yv[u] = __ldcg((const float4 *)yr + tid + u * th);
            }
        if (b >= step[LMS_CU_STEP_NB])
            return;
#pragma unroll
        for (int u = 0; u < NORM_ADD_U; u++)
            if (tid + u * th < n4)
                ss += xv[u].x * xv[u].x + xv[u].y * xv[u].y + xv[u].z * xv[u].z + xv[u].w * xv[u].w;
        ss = block_sum(ss, red);
        const float r = 1.0f / sqrtf(ss / (float)n + eps);
#pragma unroll
        for (int u = 0; u < NORM_ADD_U; u++)
            if (tid + u * th < n4) {
                float4 o = yv[u];
                o.x += wv[u].x * (xv[u].x * r), o.y += wv[u].y * (xv[u].y * r);
                o.z += wv[u].z * (xv[u].z * r), o.w += wv[u].w * (xv[u].w * r);
                ((float4 *)yr)[tid + u * th] = o;
            }
        return;
    }
    if (b >= step[LMS_CU_STEP_NB])
        return;
    float ss = 0;
    for (int i = tid; i < n; i += th) ss += xr[i] * xr[i];
    ss = block_sum(ss, red);
    float r = 1.0f / sqrtf(ss / (float)n + eps);
    for (int i = tid; i < n; i += th) yr[i] += w[i] * (xr[i] * r);
}

/* norm_add_kernel's threads for rows of n floats: enough for one round of loads up to
 * 16384 floats, 256 at least. */
int norm_add_threads(int n)
{
    const int t = (n / 4 + NORM_ADD_U - 1) / NORM_ADD_U;
    return std::min(1024, std::max(256, (t + 31) / 32 * 32));
}

/* The post-norm of a GEMV whose kernel does not do it (a.nadd_y; nothing without). */
int gemv_norm_add_launch(const lms_cu_gemv *a, void *stream)
{
    if (!a->nadd_y)
        return 0;
    return lms_cu_norm_add_launch(a->nadd_y, (const float *)a->y[0] + (size_t)a->y_row0 * a->ldy[0], a->nadd_w,
                                  a->rows[0], a->eps, a->step, a->nb_max, stream);
}

__global__ void bias_kernel(float *y, int ldy, const float *bias, int rows, const int32_t *step)
{
    griddep_launch();
    griddep_wait();
    int b = blockIdx.y;
    if (b >= step[LMS_CU_STEP_NB])
        return;
    for (int r = blockIdx.x * blockDim.x + threadIdx.x; r < rows; r += gridDim.x * blockDim.x)
        y[(size_t)b * ldy + r] += bias[r];
}

__global__ void softcap_kernel(float *v, size_t n, float c)
{
    griddep_launch();
    griddep_wait();
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x)
        v[i] = c * tanhf(v[i] / c);
}

/* (value, index) pairs, first index on ties; NaN values never win. */
__device__ __forceinline__ void amax_merge(float &bv, int &bi, float v, int i)
{
    if (v > bv || (v == bv && i < bi))
        bv = v, bi = i;
}

/*
 * Arg max in one launch: block k scans its slice and writes (max, index) to
 * part[k]; the last block to finish (atomic ticket) merges the parts and
 * resets the ticket for the next launch.
 */
__global__ void argmax_kernel(const float *v, int n, int32_t *id, float2 *part, int *ticket)
{
    __shared__ float bv[32];
    __shared__ int bi[32];
    __shared__ bool last;
    griddep_launch();
    griddep_wait();
    float best = -INFINITY;
    int bidx = 0x7fffffff;
    for (int i = blockIdx.x * blockDim.x + threadIdx.x; i < n; i += gridDim.x * blockDim.x) amax_merge(best, bidx, v[i], i);
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        amax_merge(best, bidx, __shfl_xor_sync(0xffffffffu, best, o), __shfl_xor_sync(0xffffffffu, bidx, o));
    int w = threadIdx.x >> 5, l = threadIdx.x & 31, nw = blockDim.x >> 5;
    if (l == 0)
        bv[w] = best, bi[w] = bidx;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int i = 1; i < nw; i++) amax_merge(best, bidx, bv[i], bi[i]);
        part[blockIdx.x] = make_float2(best, __int_as_float(bidx));
        __threadfence();
        last = atomicAdd(ticket, 1) == (int)gridDim.x - 1;
    }
    __syncthreads();
    if (!last)
        return;
    __threadfence();
    best = -INFINITY, bidx = 0x7fffffff;
    for (int k = threadIdx.x; k < (int)gridDim.x; k += blockDim.x) {
        float2 p = __ldcg(&part[k]);
        amax_merge(best, bidx, p.x, __float_as_int(p.y));
    }
#pragma unroll
    for (int o = 16; o > 0; o >>= 1)
        amax_merge(best, bidx, __shfl_xor_sync(0xffffffffu, best, o), __shfl_xor_sync(0xffffffffu, bidx, o));
    __syncthreads();
    if (l == 0)
        bv[w] = best, bi[w] = bidx;
    __syncthreads();
    if (threadIdx.x == 0) {
        for (int i = 1; i < nw; i++) amax_merge(best, bidx, bv[i], bi[i]);
        *id = bidx == 0x7fffffff ? 0 : bidx;
        *ticket = 0;
    }
}

/* The XOR of 16-byte words i, i + stride, ... below n, four loads of a thread in flight: the
 * probe's read (also bench/step_read.cu's). */
__device__ __forceinline__ uint32_t read_words(const uint4 *p, size_t i, size_t n, size_t stride)
{
    uint32_t x = 0;
    for (; i + 3 * stride < n; i += 4 * stride) {
        uint4 a = ld_stream(p + i), b = ld_stream(p + i + stride), c = ld_stream(p + i + 2 * stride),
              d = ld_stream(p + i + 3 * stride);
        x ^= a.x ^ a.y ^ a.z ^ a.w ^ b.x ^ b.y ^ b.z ^ b.w ^ c.x ^ c.y ^ c.z ^ c.w ^ d.x ^ d.y ^ d.z ^ d.w;
    }
    for (; i < n; i += stride) {
        uint4 a = ld_stream(p + i);
        x ^= a.x ^ a.y ^ a.z ^ a.w;
    }
    return x;
}

__global__ void __launch_bounds__(512) readbw_kernel(const uint4 *p, size_t n, uint32_t *sink)
{
    const uint32_t x = read_words(p, blockIdx.x * (size_t)blockDim.x + threadIdx.x, n, (size_t)gridDim.x * blockDim.x);
    if (x == 0x9e3779b9u)
        *sink = x;
}

/* ---- RoPE and the K/V write -------------------------------------------------------------------- */

/* Row `row`'s position: pos0 + row for one sequence, its own in a step of several (kv.rpos). */
__device__ __forceinline__ int row_pos(const int32_t *step, const lms_cu_kv *kv, int row)
{
    return kv->rpos ? step[kv->rpos + row] : step[LMS_CU_STEP_POS0] + row;
}

/* Row `row`'s block table in kv's group: the step's one, or its sequence's (kv.rtable). */
__device__ __forceinline__ const int32_t *row_pages(const int32_t *step, const lms_cu_kv *kv, int row)
{
    return step + (kv->rtable ? step[kv->rtable + row] : kv->table);
}

/* The arithmetic of a head's RMSNorm and RoPE, shared by rope_kernel, warp_norm_rope and
 * head_rope: the norm's factor from the sum of squares of the head's hd values (the warp's
 * partial sums), and the pair (x1, x2) at dimensions (i, i + hd / 2), normed (n1, n2: the
 * norm's weights; r: the factor) when norm, rotated by pos x f (f: dimension i's inverse
 * frequency) and scaled. */
__device__ __forceinline__ float head_norm_factor(float ss, int hd, float eps)
{
    return 1.0f / sqrtf(warp_sum(ss) / (float)hd + eps);
}
__device__ __forceinline__ void rope_pair(float x1, float x2, bool norm, float n1, float n2, float r, int pos, float f,
                                          float scale, float &y1, float &y2)
{
    if (norm)
        x1 = n1 * (x1 * r), x2 = n2 * (x2 * r);
    float sn, c;
    sincosf((float)pos * f, &sn, &c);
    y1 = (x1 * c - x2 * sn) * scale;
    y2 = (x2 * c + x1 * sn) * scale;
}

/*
 * Block b: token b of the step, all of its heads; a warp per head (q heads,
 * then k heads), lanes over the rotated pairs (i, i + hd/2). q is written
 * back, k and v go into the cache at position pos0 + b of the layer.
 */
template <int KT>
__global__ void rope_kernel(const lms_cu_rope a)
{
    griddep_launch();
    griddep_wait();
    const int b = blockIdx.x;
    if (b >= a.step[LMS_CU_STEP_NB])
        return;
    const lms_cu_kv *kv = &a.kv;
    const int pos = row_pos(a.step, kv, b), hd = a.hd, half = hd / 2;
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
    /* the row's block table of the layer's group (group 0's, or the window group's) */
    const int page = row_pages(a.step, kv, b)[pos / kv->page_tokens], slot = pos % kv->page_tokens;
    uint8_t *kvrow = kv->base + (size_t)page * kv->page_bytes + (size_t)a.layer * kv->layer_bytes +
                     (size_t)slot * kv->token_bytes;
    for (int head = warp; head < a.n_heads + a.n_kv; head += nw) {
        const bool isq = head < a.n_heads;
        const int h = isq ? head : head - a.n_heads;
        float *v = isq ? a.q + ((size_t)b * a.n_heads + h) * hd : a.k + ((size_t)b * a.n_kv + h) * hd;
        const float *nw_ = isq ? a.q_norm : a.k_norm;
        float r = 1.f;
        if (nw_) {
            float ss = 0;
            for (int i = lane; i < hd; i += 32) ss += v[i] * v[i];
            r = head_norm_factor(ss, hd, a.eps);
        }
        for (int i = lane; i < half; i += 32) {
            float o1, o2;
            rope_pair(v[i], v[i + half], nw_ != nullptr, nw_ ? nw_[i] : 1.f, nw_ ? nw_[i + half] : 1.f, r, pos,
                      a.inv_freq[i], 1.f, o1, o2);
            v[i] = o1;
            v[i + half] = o2;
            if (!isq) {
                uint8_t *dst = kvrow + (size_t)h * kv->head_bytes;
                elem<KT>::put(dst, i, o1);
                elem<KT>::put(dst, i + half, o2);
            }
        }
        if (!isq) {
            const float *vv = a.v + ((size_t)b * a.n_kv + h) * hd;
            uint8_t *dst = kvrow + kv->v_offset + (size_t)h * kv->head_bytes;
            for (int j = lane; j < hd; j += 32) elem<KT>::put(dst, j, vv[j]);
        }
    }
}

/* ---- asynchronous copies into shared memory -------------------------------------------------------- */

__device__ __forceinline__ uint32_t smem_addr(const void *p) { return (uint32_t)__cvta_generic_to_shared(p); }

/* 16 bytes global -> shared, asynchronous; src_bytes 0 writes zeros. */
__device__ __forceinline__ void cp_async16(void *dst, const void *src, int src_bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(smem_addr(dst)), "l"(src), "r"(src_bytes)
                 : "memory");
}
/* 4 bytes global -> shared, asynchronous. */
__device__ __forceinline__ void cp_async4(void *dst, const void *src)
{
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;" ::"r"(smem_addr(dst)), "l"(src) : "memory");
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
template <int N> __device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_group %0;" ::"n"(N) : "memory"); }

/* ---- attention: decoding ------------------------------------------------------------------------ */

#define ATT_GMAX 16  /* query heads per kv head */
#define ATT_T 32     /* positions of a tile: one per lane when scoring */
#define ATT_PSTRIDE(hd) ((hd) + 4) /* floats of a split's partial per head: m, l, 2 unused, acc[hd] */

/* Shared-memory stages of K/V tiles (rows of tb bytes): 3, 2 for rows over 512 bytes (deeper
 * pipelines, 5 stages of 128-dim rows, were measured slower at 4096 positions). */
__host__ __device__ inline int attn_stages(int64_t tb) { return tb > 512 ? 2 : 3; }

#define ATT_THREADS 256 /* threads of a decoding block */

/* Threads of a decoding block for head_dim hd: ATT_THREADS, in attn_groups(hd) groups of
 * hd / 2 threads (each thread 2 dimensions; each group sums V over a share of a tile's
 * positions). */
__host__ __device__ inline int attn_threads(int hd) { return (void)hd, ATT_THREADS; }
__host__ __device__ inline int attn_groups(int hd) { return ATT_THREADS / (hd / 2); }

/* Parts each query head's dot products are split into, so that the G heads
 * keep the block's warps busy: a power of two, at most warps / G, dividing hd
 * into whole 16-byte chunks of K (1 for rows not a multiple of 16 bytes). */
__host__ __device__ inline int attn_parts(int G, int hd, int64_t tb)
{
    const int nw = attn_threads(hd) / 32, per = (int)(16 * hd / tb); /* elements in 16 bytes */
    int p = 1;
    if (tb % 16)
        return 1;
    while (2 * p * G <= nw && hd % (2 * p * per) == 0) p *= 2;
    return p;
}

/* Bytes of the K/V tile stages, which hold the thread groups' sums of V at the end. */
__host__ __device__ inline size_t attn_stage_bytes(int G, int hd, int64_t tb)
{
    const size_t st = (size_t)attn_stages(tb) * ATT_T * (2 * tb + 16), sums = (size_t)(attn_groups(hd) - 1) * G * hd * 4;
    return ((st > sums ? st : sums) + 15) / 16 * 16;
}

/* Dynamic shared memory of the decoding kernel: q, the K/V tile stages, the
 * scores, and the new token's K and V rows. */
__host__ __device__ inline size_t attn_decode_smem(int G, int hd, int64_t tb)
{
    return ((size_t)G * hd * 4 + 15) / 16 * 16 + attn_stage_bytes(G, hd, tb) +
           (size_t)G * attn_parts(G, hd, tb) * ATT_T * 4 + 2 * (size_t)tb;
}

/* RMSNorm (weight nw, optional) and RoPE of one head of hd floats at position pos, by one
 * warp; the result times `scale` into dst (may be src). */
__device__ void warp_norm_rope(float *dst, const float *src, const float *nw, const float *inv_freq, int hd, int pos,
                               float eps, float scale, int lane)
{
    float r = 1.f;
    if (nw) {
        float ss = 0;
        for (int i = lane; i < hd; i += 32) ss += src[i] * src[i];
        r = head_norm_factor(ss, hd, eps);
    }
    const int half = hd / 2;
    for (int i = lane; i < half; i += 32)
        rope_pair(src[i], src[i + half], nw != nullptr, nw ? nw[i] : 1.f, nw ? nw[i + half] : 1.f, r, pos,
                  inv_freq[i], scale, dst[i], dst[i + half]);
}

/* The G query heads of kv head h for row `row` into qs ([G][hd] floats, times the scale;
 * with fuse_rope after their RMSNorm and RoPE at pos), and with own_new this token's K and V
 * (K rotated) into the cache at pos and into newrow (K then V, token_bytes each), by the
 * block's last warp. kbase: the layer's K of head h in page 0; pages: the row's table. */
template <int KT>
__device__ void attn_decode_q(const lms_cu_attn &a, float *qs, uint8_t *newrow, uint8_t *kbase, const int32_t *pages,
                              int row, int h, int G, int hd, int pos, bool own_new)
{
    typedef elem<KT> E;
    const int tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
    const float *qb = a.q + (size_t)row * a.n_heads * hd + (size_t)(h * G) * hd;
    if (!a.fuse_rope) {
        for (int i = tid; i < G * hd; i += blockDim.x) qs[i] = qb[i] * a.scale;
        return;
    }
    for (int g = warp; g < G; g += nw)
        warp_norm_rope(qs + (size_t)g * hd, qb + (size_t)g * hd, a.q_norm, a.inv_freq, hd, pos, a.eps, a.scale, lane);
    if (own_new && warp == nw - 1) {
        const lms_cu_kv *kv = &a.kv;
        const size_t kvd = (size_t)a.n_kv * hd, tb = (size_t)kv->token_bytes;
        float *kn = a.k_new + row * kvd + (size_t)h * hd;
        warp_norm_rope(kn, kn, a.k_norm, a.inv_freq, hd, pos, a.eps, 1.f, lane);
        __syncwarp();
        const int pt = kv->page_tokens;
        uint8_t *dst = kbase + (size_t)pages[pos / pt] * kv->page_bytes + (size_t)(pos % pt) * tb;
        const float *vn = a.v_new + row * kvd + (size_t)h * hd;
        for (int i = lane; i < hd; i += 32) {
            const float kf = kn[i], vf = vn[i];
            E::put(dst, i, kf);
            E::put(dst + kv->v_offset, i, vf);
            E::put(newrow, i, kf);
            E::put(newrow + tb, i, vf);
        }
    }
}

/* After every block of (h, b) wrote its split's partial ([b][h][split][g] = m, l, -, -,
 * acc[hd], unnormalized): the last block to finish merges the S splits into out ([G][hd]).
 * Thread i takes 4 dimensions (1 when hd % 4) of one head over every split, rescaling as the running
 * maximum grows; the loads of 8 splits are issued together. Resets the counter. */
__device__ void attn_merge_splits(const lms_cu_attn &a, int b, int h, int S, int G, int hd, float *out)
{
    const int tid = threadIdx.x;
    const size_t stride = ATT_PSTRIDE(hd);
    const bool last = last_block_ticket(&a.counters[b * a.n_kv + h], S);
    if (!last)
        return;
    const float *p0 = a.part + ((size_t)b * a.n_kv + h) * gridDim.y * G * stride;
    const int vw = hd % 4 == 0 ? 4 : 1, nv = hd / vw; /* 4 dimensions a thread (1 when hd % 4) */
    for (int i = tid; i < G * nv; i += blockDim.x) {
        const int g = i / nv, d = (i % nv) * vw;
        float M = -INFINITY, L = 0.f;
        float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int j0 = 0; j0 < S; j0 += 8) {
            float2 ml[8];
            float4 v[8];
#pragma unroll
            for (int u = 0; u < 8; u++) { /* past S: the last split again (weighted by nothing) */
                const float *pj = p0 + ((size_t)min(j0 + u, S - 1) * G + g) * stride;
                ml[u] = __ldcg((const float2 *)pj);
                v[u] = vw == 4 ? __ldcg((const float4 *)(pj + 4 + d)) : make_float4(__ldcg(pj + 4 + d), 0.f, 0.f, 0.f);
            }
#pragma unroll
            for (int u = 0; u < 8; u++)
                if (j0 + u < S) {
                    const float Mn = fmaxf(M, ml[u].x), al = expf(M - Mn), w = expf(ml[u].x - Mn);
                    L = L * al + ml[u].y * w;
                    o.x = o.x * al + v[u].x * w, o.y = o.y * al + v[u].y * w;
                    o.z = o.z * al + v[u].z * w, o.w = o.w * al + v[u].w * w;
                    M = Mn;
                }
        }
        const float inv = 1.f / L;
        if (vw == 4)
            *(float4 *)(out + g * hd + d) = make_float4(o.x * inv, o.y * inv, o.z * inv, o.w * inv);
        else
            out[g * hd + d] = o.x * inv;
    }
    if (tid == 0)
        a.counters[b * a.n_kv + h] = 0;
}

#define ATM_CLUSTER_MAX 8 /* blocks of a decoding attention's cluster (the portable most) */

/* Block (h, s, b) of a decoding launch: row b of the step (row), its position (pos, P =
 * pos + 1) and split s = [t0, t1) of its attended range [lo, P), which is cut into S splits
 * of max(a.chunk, ceil(len / splits)) positions rounded up to a multiple of `tile`. With
 * round > 0 a split also takes up to `round` positions (a tile for each of the block's
 * warps, which run at once) before the range spreads past ATM_CLUSTER_MAX splits: at 1024
 * positions 9 splits of 128 took 0.77x the time of 33 of 32 (bench/RESULTS.md), and a range
 * of up to that many splits merges in one cluster. False when the block has no row or its
 * split no positions (blocks past them exit at once). */
struct attn_split {
    int row, pos, P, S, t0, t1;
};
__device__ __forceinline__ bool attn_split_of(const lms_cu_attn &a, int tile, attn_split &r, int round = 0)
{
    const int s = blockIdx.y, b = blockIdx.z, nb = a.nrows ? a.nrows : a.step[LMS_CU_STEP_NB];
    if (b >= nb)
        return false;
    r.row = a.row0 + b;
    r.pos = row_pos(a.step, &a.kv, r.row), r.P = r.pos + 1;
    const int lo = a.window > 0 && r.P > a.window ? r.P - a.window : 0, len = r.P - lo;
    int chunk = gridDim.y == 1 ? len : max(a.chunk, (len + (int)gridDim.y - 1) / (int)gridDim.y);
    if (round > 0)
        chunk = max(chunk, min(round, (len + ATM_CLUSTER_MAX - 1) / ATM_CLUSTER_MAX));
    chunk = (chunk + tile - 1) / tile * tile;
    r.S = (len + chunk - 1) / chunk;
    if (s >= r.S)
        return false;
    r.t0 = lo + s * chunk, r.t1 = min(r.P, r.t0 + chunk);
    return true;
}

/*
 * Block (h, s, b): kv head h, split s, token b. The attended range [lo, P)
 * is cut into splits of `chunk` positions, chunk = max(a.chunk, len /
 * gridDim.y): short contexts get several small splits (many blocks at once,
 * each little serial work) instead of one long one; blocks of splits past
 * the range exit at once. A split's K and V rows go into shared memory by
 * cp.async in tiles of ATT_T positions, attn_stages() - 1 tiles in flight (the
 * next tiles load while this one is scored), issued before the query's
 * RoPE so that their latency covers it. Per tile: scores with lanes over
 * positions and warps over (query head, part of the head dim), an online
 * softmax by one warp per head, then each thread sums its dimension of V.
 * The last block of (h, b) to finish (ticket) merges the splits' partials,
 * every thread over the splits of its 4 dimensions in one pass (online
 * rescaling: the partials' loads are independent). With fuse_rope
 * (one-token steps) the block applies q/k RMSNorm and RoPE itself, and the
 * last split writes the token's K and V into the cache and into its tile
 * (it alone reads that position): no RoPE launch.
 * ATT_THREADS threads; HD > 0: head_dim HD, HD == 0: a.hd (<= 256). The
 * weighted sum of V runs in attn_groups() groups of hd (rounded up to a warp)
 * threads, each over its share of a tile's positions (all of them at head
 * dim 256, every second at 128, every fourth at 64), added up at the end.
 */
template <int KT, int HD, int GM>
__global__ void __launch_bounds__(ATT_THREADS) attn_decode_kernel(const lms_cu_attn a)
{
    typedef elem<KT> E;
    extern __shared__ __align__(16) uint8_t smem[];
    __shared__ float sm_m[ATT_GMAX], sm_l[ATT_GMAX], sm_alpha[ATT_GMAX];
    griddep_launch();
    griddep_wait();
    attn_split sp;
    if (!attn_split_of(a, 1, sp))
        return;
    const int h = blockIdx.x, s = blockIdx.y, b = blockIdx.z, row = sp.row, pos = sp.pos, P = sp.P, S = sp.S;
    const int t0 = sp.t0, t1 = sp.t1;
    const int hd = HD ? HD : a.hd;
    const int G = a.n_heads / a.n_kv, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5, nw = blockDim.x >> 5;
    const lms_cu_kv *kv = &a.kv;
    const bool own_new = a.fuse_rope && t1 == P; /* this split writes and reads the token's own row */
    const int tl = own_new ? P - 1 : t1;        /* rows [t0, tl) come from the cache */
    const int tb = (int)kv->token_bytes, tbp = tb + 16, stg = attn_stages(tb), Pp = attn_parts(G, hd, tb);
    const int pt = kv->page_tokens;
    const int32_t *pages = row_pages(a.step, kv, row); /* the row's table of the layer's group */
    const size_t qd = (size_t)a.n_heads * hd;
    uint8_t *kbase = kv->base + (size_t)a.layer * kv->layer_bytes + (size_t)h * kv->head_bytes;
    float *qs = (float *)smem;                                   /* [G][hd] */
    uint8_t *ks = smem + ((size_t)G * hd * 4 + 15) / 16 * 16;    /* [stg][ATT_T][tbp]: rows padded */
    uint8_t *vs = ks + (size_t)stg * ATT_T * tbp;                /* [stg][ATT_T][tb] */
    float *sc = (float *)(ks + attn_stage_bytes(G, hd, tb));     /* [G][Pp][ATT_T] */
    uint8_t *newrow = (uint8_t *)(sc + (size_t)G * Pp * ATT_T);  /* K then V of the token (tb each) */

    /* the K and V rows of positions [tt, min(tt + ATT_T, tl)) into stage st (one commit group) */
    const int64_t pgb = kv->page_bytes, voff = kv->v_offset;
    const int psh = (pt & (pt - 1)) == 0 ? __ffs(pt) - 1 : -1; /* page_tokens a power of two: shifts */
    /* the K and V rows of positions [tt, min(tt + ATT_T, tl)) into stage st (one commit group):
     * 16-byte pieces (4-byte for rows not a multiple of 16 bytes), the page-table reads of 4
     * pieces a thread issued before their copies */
    auto load_tile = [&](int st, int tt) {
        const int n = min(ATT_T, tl - tt), w = tb % 16 == 0 ? 16 : 4, cpr = tb / w, total = n * cpr;
        uint8_t *kd = ks + (size_t)st * ATT_T * tbp, *vd = vs + (size_t)st * ATT_T * tb;
        for (int i0 = tid; i0 < total; i0 += 4 * (int)blockDim.x) {
            const uint8_t *src[4];
            int dk[4], dv[4];
#pragma unroll
            for (int u = 0; u < 4; u++) {
                const int i = i0 + u * (int)blockDim.x, r = i / cpr, c = i - r * cpr, p = tt + r;
                src[u] = nullptr;
                if (i < total) {
                    const int pg = psh >= 0 ? p >> psh : p / pt, sl = psh >= 0 ? p & (pt - 1) : p % pt;
                    src[u] = kbase + (int64_t)pages[pg] * pgb + (int64_t)sl * tb + c * w;
                    dk[u] = r * tbp + c * w, dv[u] = r * tb + c * w;
                }
            }
#pragma unroll
            for (int u = 0; u < 4; u++)
                if (src[u]) {
                    if (w == 16) {
                        cp_async16(kd + dk[u], src[u], 16);
                        cp_async16(vd + dv[u], src[u] + voff, 16);
                    } else {
                        cp_async4(kd + dk[u], src[u]);
                        cp_async4(vd + dv[u], src[u] + voff);
                    }
                }
        }
        cp_async_commit();
    };
    /* the first stg - 1 tiles in flight before anything else (empty groups past the split) */
    for (int i = 0; i < stg - 1; i++) {
        if (t0 + i * ATT_T < tl)
            load_tile(i, t0 + i * ATT_T);
        else
            cp_async_commit();
    }

    attn_decode_q<KT>(a, qs, newrow, kbase, pages, row, h, G, hd, pos, own_new);
    if (tid < ATT_GMAX)
        sm_m[tid] = -INFINITY, sm_l[tid] = 0.f;
    float acc[GM][2]; /* dimensions 2 dim, 2 dim + 1 of query head g */
#pragma unroll
    for (int g = 0; g < GM; g++) acc[g][0] = acc[g][1] = 0.f;

    const int dpp = hd / Pp; /* dimensions of a part */
    const int hh = hd / 2, ngr = attn_groups(hd), qg = tid / hh, dim = tid % hh; /* group, dimension pair */
    for (int tt = t0, it = 0; tt < t1; tt += ATT_T, it++) {
        const int n = min(ATT_T, t1 - tt), st = it % stg;
        uint8_t *kt = ks + (size_t)st * ATT_T * tbp, *vt = vs + (size_t)st * ATT_T * tb;
        if (stg == 3)
            cp_async_wait<1>(); /* this tile's group done (the next one may still fly) */
        else
            cp_async_wait<0>();
        if (own_new && tt + n == P && warp == nw - 1) { /* the token's row, from the warp that wrote it */
            const int r = P - 1 - tt;
            for (int i = lane; i < tb / 4; i += 32) {
                ((uint32_t *)(kt + (size_t)r * tbp))[i] = ((const uint32_t *)newrow)[i];
                ((uint32_t *)(vt + (size_t)r * tb))[i] = ((const uint32_t *)(newrow + tb))[i];
            }
        }
        __syncthreads(); /* the tile (and q) visible; every thread is past the previous tile */
        {   /* the tile stg - 1 on, into the stage the previous tile used */
            const int tn = tt + (stg - 1) * ATT_T;
            if (tn < tl)
                load_tile((it + stg - 1) % stg, tn);
            else
                cp_async_commit();
        }
        /* scores: lanes over positions, warps over (head, part of the head dim) */
        for (int wi = warp; wi < G * Pp; wi += nw) {
            const int g = wi / Pp, part = wi % Pp;
            if (lane < n) {
                const float *qg = qs + (size_t)g * hd + part * dpp;
                const uint8_t *krow = kt + (size_t)lane * tbp;
                float dsum = 0.f;
                if (tb % 16 == 0) {
                    constexpr int per = E::per16;
                    const int c0 = part * dpp / per;
#pragma unroll 4
                    for (int c = 0; c < dpp / per; c++) {
                        float kf[8];
                        E::unpack(*(const uint4 *)(krow + (size_t)(c0 + c) * 16), kf);
                        const float4 *qv = (const float4 *)(qg + c * per);
                        float4 q0 = qv[0];
                        dsum = fmaf(kf[0], q0.x, dsum), dsum = fmaf(kf[1], q0.y, dsum);
                        dsum = fmaf(kf[2], q0.z, dsum), dsum = fmaf(kf[3], q0.w, dsum);
                        if (per == 8) {
                            float4 q1 = qv[1];
                            dsum = fmaf(kf[4], q1.x, dsum), dsum = fmaf(kf[5], q1.y, dsum);
                            dsum = fmaf(kf[6], q1.z, dsum), dsum = fmaf(kf[7], q1.w, dsum);
                        }
                    }
                } else {
                    for (int d = 0; d < hd; d++) dsum = fmaf(E::get(krow, d), qg[d], dsum);
                }
                sc[(size_t)wi * ATT_T + lane] = dsum;
            }
        }
        __syncthreads();
        /* online softmax: a warp per head */
        for (int g = warp; g < G; g += nw) {
            float v = -INFINITY;
            if (lane < n) {
                v = 0.f;
                for (int part = 0; part < Pp; part++) v += sc[((size_t)g * Pp + part) * ATT_T + lane];
                if (a.softcap > 0.f)
                    v = a.softcap * tanhf(v / a.softcap);
            }
            const float mold = sm_m[g], mnew = fmaxf(mold, warp_max(v));
            const float p = lane < n ? expf(v - mnew) : 0.f;
            const float sum = warp_sum(p);
            sc[(size_t)g * Pp * ATT_T + lane] = p;
            if (lane == 0) {
                const float al = expf(mold - mnew); /* mold = -inf: 0 */
                sm_alpha[g] = al;
                sm_l[g] = sm_l[g] * al + sum;
                sm_m[g] = mnew;
            }
        }
        __syncthreads();
        if (qg < ngr) { /* group qg: positions 4 qg .. 4 qg + 3, then 4 (qg + ngr) .., of the tile */
#pragma unroll
            for (int g = 0; g < GM; g++)
                if (g < G)
                    acc[g][0] *= sm_alpha[g], acc[g][1] *= sm_alpha[g];
            for (int t0 = 4 * qg; t0 < n; t0 += 4 * ngr) {
                float v0[4], v1[4];
#pragma unroll
                for (int u = 0; u < 4; u++) { /* rows past the tile: 0 (their weights are 0 too) */
                    v0[u] = v1[u] = 0.f;
                    if (t0 + u < n) {
                        const uint8_t *vr = vt + (size_t)(t0 + u) * tb;
                        v0[u] = E::get(vr, 2 * dim), v1[u] = E::get(vr, 2 * dim + 1);
                    }
                }
#pragma unroll
                for (int g = 0; g < GM; g++)
                    if (g < G) {
                        const float4 p4 = *(const float4 *)(sc + (size_t)g * Pp * ATT_T + t0);
                        acc[g][0] = fmaf(p4.x, v0[0], fmaf(p4.y, v0[1], fmaf(p4.z, v0[2], fmaf(p4.w, v0[3], acc[g][0]))));
                        acc[g][1] = fmaf(p4.x, v1[0], fmaf(p4.y, v1[1], fmaf(p4.z, v1[2], fmaf(p4.w, v1[3], acc[g][1]))));
                    }
            }
        }
    }
    cp_async_wait<0>(); /* no copy outlives the block (the trailing groups are empty) */
    if (ngr > 1) { /* the groups' sums of V into group 0's threads (tid = dim < hd / 2) */
        float2 *sums = (float2 *)ks; /* [ngr - 1][G][hd / 2] */
        __syncthreads();             /* every thread is past its last tile */
        if (qg > 0 && qg < ngr)
#pragma unroll
            for (int g = 0; g < GM; g++)
                if (g < G)
                    sums[((size_t)(qg - 1) * G + g) * hh + dim] = make_float2(acc[g][0], acc[g][1]);
        __syncthreads();
        if (tid < hh)
            for (int j = 0; j < ngr - 1; j++)
#pragma unroll
                for (int g = 0; g < GM; g++)
                    if (g < G) {
                        const float2 v = sums[((size_t)j * G + g) * hh + tid];
                        acc[g][0] += v.x, acc[g][1] += v.y;
                    }
    }
    float *out = a.out + row * qd + (size_t)(h * G) * hd;
    if (S == 1) {
        if (tid < hh)
#pragma unroll
            for (int g = 0; g < GM; g++)
                if (g < G) {
                    const float il = 1.f / sm_l[g];
                    out[g * hd + 2 * tid] = acc[g][0] * il, out[g * hd + 2 * tid + 1] = acc[g][1] * il;
                }
        return;
    }
    /* partials: [b][h][s][g] = (m, l, -, -, acc[hd]) */
    const size_t stride = ATT_PSTRIDE(hd);
    const int SM = gridDim.y;
    float *part = a.part + (((size_t)b * a.n_kv + h) * SM + s) * G * stride;
    if (tid < hh)
#pragma unroll
        for (int g = 0; g < GM; g++)
            if (g < G)
                part[g * stride + 4 + 2 * tid] = acc[g][0], part[g * stride + 4 + 2 * tid + 1] = acc[g][1];
    if (tid < G)
        part[tid * stride] = sm_m[tid], part[tid * stride + 1] = sm_l[tid];
    attn_merge_splits(a, b, h, S, G, hd, out);
}

/* ---- attention: prefill on tensor cores ---------------------------------------------------------- */

template <int KT> struct mma16;
template <> struct mma16<LMS_CU_F16> {
    static __device__ __forceinline__ uint32_t pack(float lo, float hi)
    {
        __half2 h = __floats2half2_rn(lo, hi);
        return *(uint32_t *)&h;
    }
    static __device__ __forceinline__ void mma(float *d, const uint32_t *a, uint32_t b0, uint32_t b1)
    {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};
template <> struct mma16<LMS_CU_BF16> {
    static __device__ __forceinline__ uint32_t pack(float lo, float hi)
    {
        __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
        return *(uint32_t *)&h;
    }
    static __device__ __forceinline__ void mma(float *d, const uint32_t *a, uint32_t b0, uint32_t b1)
    {
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
                     "{%0,%1,%2,%3};"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    }
};

#define FA_BQ 64 /* queries per block: 4 warps x 16 */

/* Four 8x8 16-bit matrices: lane L gives the address of row L % 8 of matrix L / 8. */
__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

/* Four 8x8 16-bit matrices, transposed: lane L gives the address of row L % 8 of matrix L / 8. */
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(smem_addr(p)));
}

template <int HD, int BK> __host__ __device__ constexpr size_t fa_smem() { return (size_t)4 * BK * (HD + 8) * 2; }

/*
 * Block (query tile qt, head): the 64 queries qt*64.. of the step for one
 * query head, over key tiles of BK positions, double-buffered in shared
 * memory by cp.async (the next tile loads while this one is computed).
 * Fragment layouts are those of mma.m16n8k16 (PTX ISA): with g = lane / 4
 * and t = lane % 4, A holds rows g and g + 8, columns 2t, 2t + 1 (+8); B
 * holds k = 2t, 2t + 1 (+8) of column g; C holds rows g, g + 8, columns
 * 2t, 2t + 1. S = Q K^T takes B straight from K rows; P (S's C fragments,
 * as 16-bit) is the A operand of O += P V, whose B comes from V rows by
 * ldmatrix.trans. Rows are padded by 16 bytes: no bank conflicts.
 */
template <int KT, int HD, int BK>
__global__ void __launch_bounds__(128) attn_prefill_kernel(const lms_cu_attn a)
{
    typedef mma16<KT> M;
    typedef typename elem<KT>::t T16;
    constexpr int KS = HD + 8; /* padded row stride (elements) */
    extern __shared__ __align__(16) uint8_t fa_mem[];
    T16 *Ks = (T16 *)fa_mem, *Vs = Ks + 2 * BK * KS; /* [2][BK][KS] each */
    griddep_launch();
    griddep_wait();
    const lms_cu_kv *kv = &a.kv;
    /* rows [row0, row0 + nb): consecutive positions of one sequence */
    const int nb = a.nrows ? a.nrows : a.step[LMS_CU_STEP_NB], pos0 = row_pos(a.step, kv, a.row0);
    const float *qbase = a.q + (size_t)a.row0 * a.n_heads * HD;
    float *obase = a.out + (size_t)a.row0 * a.n_heads * HD;
    /* the longest (last, causal) query tiles first: the short ones fill the tail */
    const int qt = (int)(gridDim.x - 1 - blockIdx.x), head = blockIdx.y, kvh = head / (a.n_heads / a.n_kv);
    if (qt * FA_BQ >= nb)
        return;
    const int tid = threadIdx.x, warp = tid >> 5, lane = tid & 31, g = lane >> 2, t = lane & 3;
    const int32_t *pages = row_pages(a.step, kv, a.row0); /* the sequence's table of the layer's group */
    const size_t qd = (size_t)a.n_heads * HD;
    const uint8_t *lbase = kv->base + (size_t)a.layer * kv->layer_bytes + (size_t)kvh * kv->head_bytes;
    const float LOG2E = 1.4426950408889634f;

    const int qrow0 = qt * FA_BQ + warp * 16 + g, qrow1 = qrow0 + 8;
    const int qpos0 = pos0 + qrow0, qpos1 = pos0 + qrow1;
    const int last_q = min(nb, (qt + 1) * FA_BQ) - 1;
    const int qmax = pos0 + last_q, qmin = pos0 + qt * FA_BQ;
    const int kmin = a.window > 0 ? max(0, qmin - a.window + 1) : 0;
    const int kfirst = (kmin / BK) * BK;

    /* one tile of K and V rows into buffer `buf` (positions past qmax: zeros). Thread i always
     * copies 16-byte chunk i % (HD/8) of keys i / (HD/8), + 128 / (HD/8), ...: one page lookup
     * per key it copies, a shift when the page size is a power of two. */
    const int pt = kv->page_tokens, pt_shift = (pt & (pt - 1)) == 0 ? __ffs(pt) - 1 : -1;
    auto load_tile = [&](int buf, int k0) {
        T16 *kd = Ks + buf * BK * KS, *vd = Vs + buf * BK * KS;
        constexpr int CPR = HD / 8, KSTEP = 128 / CPR;
        const int c = tid % CPR;
        for (int key = tid / CPR; key < BK; key += KSTEP) {
            const int kp = k0 + key;
            const bool ok = kp <= qmax;
            size_t off = 0;
            if (ok) {
                int pg = pt_shift >= 0 ? kp >> pt_shift : kp / pt, sl = pt_shift >= 0 ? kp & (pt - 1) : kp % pt;
                off = (size_t)pages[pg] * kv->page_bytes + (size_t)sl * kv->token_bytes;
            }
            const uint8_t *row = lbase + off + (size_t)c * 16;
            cp_async16(kd + key * KS + c * 8, row, ok ? 16 : 0);
            cp_async16(vd + key * KS + c * 8, row + kv->v_offset, ok ? 16 : 0);
        }
        cp_async_commit();
    };
    load_tile(0, kfirst);

    uint32_t qa[HD / 16][4];
#pragma unroll
    for (int kk = 0; kk < HD / 16; kk++) {
        const int c = kk * 16 + 2 * t;
        float2 v00 = qrow0 < nb ? *(const float2 *)(qbase + qrow0 * qd + (size_t)head * HD + c) : make_float2(0, 0);
        float2 v10 = qrow1 < nb ? *(const float2 *)(qbase + qrow1 * qd + (size_t)head * HD + c) : make_float2(0, 0);
        float2 v01 = qrow0 < nb ? *(const float2 *)(qbase + qrow0 * qd + (size_t)head * HD + c + 8) : make_float2(0, 0);
        float2 v11 = qrow1 < nb ? *(const float2 *)(qbase + qrow1 * qd + (size_t)head * HD + c + 8) : make_float2(0, 0);
        qa[kk][0] = M::pack(v00.x * a.scale, v00.y * a.scale);
        qa[kk][1] = M::pack(v10.x * a.scale, v10.y * a.scale);
        qa[kk][2] = M::pack(v01.x * a.scale, v01.y * a.scale);
        qa[kk][3] = M::pack(v11.x * a.scale, v11.y * a.scale);
    }
    float o[HD / 8][4];
#pragma unroll
    for (int i = 0; i < HD / 8; i++) o[i][0] = o[i][1] = o[i][2] = o[i][3] = 0.f;
    float m0 = -INFINITY, m1 = -INFINITY, l0 = 0.f, l1 = 0.f; /* maxima in log2 units */

    int buf = 0;
    for (int k0 = kfirst; k0 <= qmax; k0 += BK, buf ^= 1) {
        if (k0 + BK <= qmax) {
            load_tile(buf ^ 1, k0 + BK);
            cp_async_wait<1>();
        } else {
            cp_async_wait<0>();
        }
        __syncthreads();
        const T16 *Kt = Ks + buf * BK * KS, *Vt = Vs + buf * BK * KS;

        /* S = Q K^T: BK/8 tiles of 16 x 8 */
        float sc[BK / 8][4];
        {
            /* B from K rows by ldmatrix: matrix m of lane L covers keys j*8 + L%8, dimensions
             * (kk + m/2)*16 + (m%2)*8: fragments of two k-steps per load. The BK/8 tiles are
             * independent accumulators: issued tile after tile, the products do not wait on
             * each other. */
            const int mtx = lane >> 3, r = lane & 7;
#pragma unroll
            for (int j = 0; j < BK / 8; j++) sc[j][0] = sc[j][1] = sc[j][2] = sc[j][3] = 0.f;
#pragma unroll
            for (int kk = 0; kk < HD / 16; kk += 2) {
                uint32_t kb[BK / 8][4];
#pragma unroll
                for (int j = 0; j < BK / 8; j++)
                    ldmatrix_x4(kb[j], &Kt[(j * 8 + r) * KS + (kk + (mtx >> 1)) * 16 + (mtx & 1) * 8]);
#pragma unroll
                for (int j = 0; j < BK / 8; j++) M::mma(sc[j], qa[kk], kb[j][0], kb[j][1]);
#pragma unroll
                for (int j = 0; j < BK / 8; j++) M::mma(sc[j], qa[kk + 1], kb[j][2], kb[j][3]);
            }
        }
        /* softcap, mask (causal and window), row maxima, in log2 units; tiles wholly
         * below the diagonal and inside the window need no mask */
        float mx0 = -INFINITY, mx1 = -INFINITY;
        const bool full = k0 + BK - 1 <= qmin && (a.window <= 0 || k0 > qmax - a.window);
        if (full) {
#pragma unroll
            for (int j = 0; j < BK / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    float v = sc[j][e];
                    if (a.softcap > 0.f)
                        v = a.softcap * tanhf(v / a.softcap);
                    v *= LOG2E;
                    sc[j][e] = v;
                    if (e < 2)
                        mx0 = fmaxf(mx0, v);
                    else
                        mx1 = fmaxf(mx1, v);
                }
        } else {
#pragma unroll
            for (int j = 0; j < BK / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    int kp = k0 + j * 8 + 2 * t + (e & 1), qp = e < 2 ? qpos0 : qpos1;
                    float v = sc[j][e];
                    if (a.softcap > 0.f)
                        v = a.softcap * tanhf(v / a.softcap);
                    bool ok = kp <= qp && (a.window <= 0 || kp > qp - a.window);
                    v = ok ? v * LOG2E : -INFINITY;
                    sc[j][e] = v;
                    if (e < 2)
                        mx0 = fmaxf(mx0, v);
                    else
                        mx1 = fmaxf(mx1, v);
                }
        }
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 1));
        mx0 = fmaxf(mx0, __shfl_xor_sync(0xffffffffu, mx0, 2));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 1));
        mx1 = fmaxf(mx1, __shfl_xor_sync(0xffffffffu, mx1, 2));
        float mn0 = fmaxf(m0, mx0), mn1 = fmaxf(m1, mx1);
        float mu0 = mn0 == -INFINITY ? 0.f : mn0, mu1 = mn1 == -INFINITY ? 0.f : mn1;
        float al0 = exp2f(m0 - mu0), al1 = exp2f(m1 - mu1);
        m0 = mn0, m1 = mn1;
        float s0 = 0.f, s1 = 0.f;
#pragma unroll
        for (int j = 0; j < BK / 8; j++) {
            sc[j][0] = exp2f(sc[j][0] - mu0), sc[j][1] = exp2f(sc[j][1] - mu0);
            sc[j][2] = exp2f(sc[j][2] - mu1), sc[j][3] = exp2f(sc[j][3] - mu1);
            s0 += sc[j][0] + sc[j][1];
            s1 += sc[j][2] + sc[j][3];
        }
        l0 = l0 * al0 + s0;
        l1 = l1 * al1 + s1;
#pragma unroll
        for (int i = 0; i < HD / 8; i++) o[i][0] *= al0, o[i][1] *= al0, o[i][2] *= al1, o[i][3] *= al1;
        /* O += P V */
#pragma unroll
        for (int kk = 0; kk < BK / 16; kk++) {
            uint32_t pa[4];
            pa[0] = M::pack(sc[2 * kk][0], sc[2 * kk][1]);
            pa[1] = M::pack(sc[2 * kk][2], sc[2 * kk][3]);
            pa[2] = M::pack(sc[2 * kk + 1][0], sc[2 * kk + 1][1]);
            pa[3] = M::pack(sc[2 * kk + 1][2], sc[2 * kk + 1][3]);
            const int mtx = lane >> 3, r = lane & 7;
#pragma unroll
            for (int i = 0; i < HD / 8; i += 2) {
                uint32_t vb[4];
                ldmatrix_x4_trans(vb, &Vt[(kk * 16 + (mtx & 1) * 8 + r) * KS + (i + (mtx >> 1)) * 8]);
                M::mma(o[i], pa, vb[0], vb[1]);
                M::mma(o[i + 1], pa, vb[2], vb[3]);
            }
        }
        __syncthreads(); /* this buffer is refilled two tiles on */
    }
    l0 += __shfl_xor_sync(0xffffffffu, l0, 1);
    l0 += __shfl_xor_sync(0xffffffffu, l0, 2);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 1);
    l1 += __shfl_xor_sync(0xffffffffu, l1, 2);
    float i0 = l0 > 0.f ? 1.f / l0 : 0.f, i1 = l1 > 0.f ? 1.f / l1 : 0.f;
#pragma unroll
    for (int i = 0; i < HD / 8; i++) {
        int c = i * 8 + 2 * t;
        if (qrow0 < nb)
            *(float2 *)(obase + qrow0 * qd + (size_t)head * HD + c) = make_float2(o[i][0] * i0, o[i][1] * i0);
        if (qrow1 < nb)
            *(float2 *)(obase + qrow1 * qd + (size_t)head * HD + c) = make_float2(o[i][2] * i1, o[i][3] * i1);
    }
}

/* ---- attention: decoding on tensor cores ---------------------------------------------------------- */

#define ATM_T 16 /* positions of a warp's tile */

/* Warps of a block at head_dim hd: 8, 4 at 256 (whose registers allow one block of 8 a
 * multiprocessor) */
__host__ __device__ constexpr int attm_warps(int hd) { return hd >= 256 ? 4 : 8; }

/* The two 16-bit values of u (type KT) as floats. */
template <int KT> __device__ __forceinline__ float2 unpack2(uint32_t u)
{
    return KT == LMS_CU_BF16 ? make_float2(bf16_lo(u), bf16_hi(u)) : make_float2(f16_lo(u), f16_hi(u));
}

/* (x0, x1) as a 16-bit pair hi plus the pair of what it leaves, lo: hi + lo holds about 16
 * bits of each (two products in place of one keep scores and weights near f32). */
template <int KT> __device__ __forceinline__ void split2(float x0, float x1, uint32_t &hi, uint32_t &lo)
{
    hi = mma16<KT>::pack(x0, x1);
    const float2 f = unpack2<KT>(hi);
    lo = mma16<KT>::pack(x0 - f.x, x1 - f.y);
}

/* (d0, d1, d2, d3) = A B + (c0, c1, c2, c3): mma.m16n8k16 with fp32 accumulators (a0/a2: row
 * g = lane / 4, columns 2t, 2t + 1 / 2t + 8, 2t + 9; a1/a3: row g + 8; d0, d1: row g, d2, d3:
 * row g + 8). */
template <int KT>
__device__ __forceinline__ void mma_full(float &d0, float &d1, float &d2, float &d3, uint32_t a0, uint32_t a1,
                                         uint32_t a2, uint32_t a3, uint32_t b0, uint32_t b1, float c0, float c1,
                                         float c2, float c3)
{
    if constexpr (KT == LMS_CU_BF16)
        asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%10,%11,%12,%13};"
            : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(c0), "f"(c1), "f"(c2), "f"(c3));
    else
        asm("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
            "{%10,%11,%12,%13};"
            : "=f"(d0), "=f"(d1), "=f"(d2), "=f"(d3)
            : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1), "f"(c0), "f"(c1), "f"(c2), "f"(c3));
}

/* One head's RMSNorm (weight nw, optional) and RoPE by one warp, in two parts so that the
 * loads of several heads are in flight together: load() issues them (lane takes the pairs
 * (i, i + HD / 2), i = lane + 32 p), store() writes the head times `scale` to dst. The
 * arithmetic is warp_norm_rope's (head_norm_factor, rope_pair). */
template <int HD> struct head_rope {
    static constexpr int NP = HD / 64, half = HD / 2;
    float x1[NP], x2[NP], f[NP], n1[NP], n2[NP];
    __device__ __forceinline__ void load(const float *src, const float *nw, const float *inv_freq, int lane)
    {
#pragma unroll
        for (int p = 0; p < NP; p++) {
            const int i = lane + 32 * p;
            x1[p] = src[i], x2[p] = src[i + half], f[p] = __ldg(inv_freq + i);
            n1[p] = nw ? __ldg(nw + i) : 1.f, n2[p] = nw ? __ldg(nw + i + half) : 1.f;
        }
    }
    /* the rotated pair p: y1 at dimension lane + 32 p, y2 at that + HD / 2 (times scale) */
    __device__ __forceinline__ void rotate(float (&y1)[NP], float (&y2)[NP], bool norm, int pos, float eps, float scale)
        const
    {
        float r = 1.f;
        if (norm) {
            float ss = 0;
#pragma unroll
            for (int p = 0; p < NP; p++) ss += x1[p] * x1[p];
#pragma unroll
            for (int p = 0; p < NP; p++) ss += x2[p] * x2[p];
            r = head_norm_factor(ss, HD, eps);
        }
#pragma unroll
        for (int p = 0; p < NP; p++) rope_pair(x1[p], x2[p], norm, n1[p], n2[p], r, pos, f[p], scale, y1[p], y2[p]);
    }
    __device__ __forceinline__ void store(float *dst, bool norm, int pos, float eps, float scale, int lane) const
    {
        float y1[NP], y2[NP];
        rotate(y1, y2, norm, pos, eps, scale);
#pragma unroll
        for (int p = 0; p < NP; p++) dst[lane + 32 * p] = y1[p], dst[lane + 32 * p + half] = y2[p];
    }
};

/* Dynamic shared memory of attn_decode_mma_kernel: q ([G][hd] floats), its fragments, the
 * token's K and V rows, the warps' m and l, and each warp's K and V tile (ATM_T rows of 2 hd
 * bytes each, padded by 16), which the warps' partials ([W][G][hd] floats) reuse. */
__host__ __device__ inline size_t attm_smem(int G, int hd)
{
    const size_t W = attm_warps(hd), tiles = W * 2 * ATM_T * (2 * hd + 16), red = W * G * hd * 4;
    const size_t n = (size_t)G * hd * 4 + (size_t)hd * 32 + (size_t)hd * 4 + 2 * W * G * 4 + 16 + (tiles > red ? tiles : red);
    return (n + 15) / 16 * 16;
}

/* Launched in clusters, after attm_smem(G, hd): the cluster's split partials ([C][G][hd + 4]
 * floats, m, l, -, -, acc[hd]), which every block of the cluster writes into its rank 0's. */
__host__ __device__ inline size_t attm_cl_smem(int G, int hd)
{
    return (size_t)ATM_CLUSTER_MAX * G * ATT_PSTRIDE(hd) * 4;
}

/* The S split partials of one cluster (S <= its size; written by its blocks into cp, rank
 * 0's shared memory, before the cluster barrier's release half), merged by rank 0 into out,
 * normalized. Every other block returns once its release arrives. */
template <int HD> __device__ __forceinline__ void attn_cluster_merge(int S, int G, const float *cp, float *out)
{
    cluster_arrive_release();
    if (cluster_rank() != 0)
        return;
    cluster_wait_acquire();
    constexpr size_t stride = ATT_PSTRIDE(HD);
    for (int i = threadIdx.x; i < G * HD / 4; i += blockDim.x) {
        const int g = i / (HD / 4), d = (i % (HD / 4)) * 4;
        float M = -INFINITY, L = 0.f;
        for (int j = 0; j < S; j++) M = fmaxf(M, cp[((size_t)j * G + g) * stride]);
        float4 o = make_float4(0.f, 0.f, 0.f, 0.f);
        for (int j = 0; j < S; j++) {
            const float *pj = cp + ((size_t)j * G + g) * stride;
            const float w = pj[0] == -INFINITY ? 0.f : expf(pj[0] - M);
            const float4 v = *(const float4 *)(pj + 4 + d);
            L += pj[1] * w;
            o.x += v.x * w, o.y += v.y * w, o.z += v.z * w, o.w += v.w * w;
        }
        const float il = 1.f / L;
        *(float4 *)(out + (size_t)g * HD + d) = make_float4(o.x * il, o.y * il, o.z * il, o.w * il);
    }
}

/*
 * Decoding attention on tensor cores (16-bit K/V, head_dim HD of 64/128/256, up to 8 query
 * heads a kv head). Block (h, s, b): kv head h, split s of the attended range (chunk
 * positions, rounded up to whole tiles), token b. Each of the W = attm_warps(HD) warps owns
 * the split's tiles of ATM_T positions warp, warp + W, ... and keeps its own online softmax.
 * A lane copies the 16-byte pieces of K and V its mma.m16n8k16 fragments need into the
 * warp's tile in shared memory (cp.async) and reads back only those: no barrier per tile,
 * and no K or V held in registers while the query is prepared. With g = lane / 4 and t =
 * lane % 4:
 *  - S^T = Q K^T: A = the G query heads as rows 0-7 (16-bit) and their remainders as rows
 *    8-15 (each q split into a 16-bit value and what it leaves), B = K^T, whose
 *    column g is the K row of position tt + g (+8 for the second 8 positions); a lane's
 *    16-byte piece at dimensions 32 kb + 8 t covers two k-steps (the dimensions taken in
 *    the order the pieces give them; q's fragments, made once per block in shared memory,
 *    likewise). C: head g, positions 2t, 2t + 1 (+8), rows 8-15 added to rows 0-7.
 *  - online softmax on those C values: the tile's maximum over the lane's quad (two
 *    shuffles), the sum kept per lane and added up at the end.
 *  - O += P V: A = P (the C fragments as 16-bit in rows 0-7, their remainders in rows
 *    8-15, whose products are added to rows 0-7's after each mma), B = V with k = position: a lane's
 *    16-byte pieces of the rows tt + 2t, +1, +8, +9 at dimensions 8 (8 cb + g) give, by
 *    byte permutes, the B fragments of 8 products (column g of product j is dimension
 *    64 cb + 8 g + j), so the lane's C holds dimensions 64 cb + 16 t (+8) + j of head g.
 * With q and P split so, the scores and weights keep about 16 bits, as near the f32
 * reference as the CUDA-core kernel, at one mma per product. Positions past the split get weight 0, their copies clamped to the split's last
 * row (never past the table); the token's own row (fuse_rope) comes from shared memory.
 *
 * The chain of a short context is what this kernel is built around: the step's position,
 * the page table and the first tile's copies are issued before the query's loads (with
 * PDLO, before griddepcontrol.wait: one-token steps read nothing of the kernel before
 * there), the query's and the token's loads of every head at once (head_rope), a split of
 * one tile written straight from its warp's registers, and the splits' merge by the last
 * block through one release/acquire ticket (attn_merge_splits), or with CL (the splits of a
 * kv head launched as one thread block cluster: ranges of at most lms_cu_attn_cluster_len
 * positions) by the cluster's rank 0 from its shared memory, which the cluster's blocks
 * write their partials into (attn_cluster_merge).
 */
template <int KT, int HD, bool PDLO, bool CL>
__global__ void __launch_bounds__(attm_warps(HD) * 32, 2) attn_decode_mma_kernel(const lms_cu_attn a)
{
    constexpr int KB = HD / 32, CB = HD / 64, KS = HD / 16, W = attm_warps(HD), QH = (8 + W - 1) / W;
    extern __shared__ __align__(16) uint8_t smem[];
    griddep_launch();
    if constexpr (CL)
        cluster_arrive_relaxed(); /* this block has started: its shared memory may be written */
    const bool early = PDLO && a.fuse_rope; /* K/V before the wait: no row of this step is read */
    if (!early)
        griddep_wait();
    attn_split sp;
    if (!attn_split_of(a, ATM_T, sp, W * ATM_T))
        return;
    const int h = blockIdx.x, s = blockIdx.y, b = blockIdx.z, row = sp.row, pos = sp.pos, P = sp.P, S = sp.S;
    const int t0 = sp.t0, t1 = sp.t1;
    const int G = a.n_heads / a.n_kv, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const int g = lane >> 2, t = lane & 3;
    const lms_cu_kv *kv = &a.kv;
    const bool own_new = a.fuse_rope && t1 == P;
    constexpr int tb = HD * 2, tbp = tb + 16;
    const int pt = kv->page_tokens, psh = (pt & (pt - 1)) == 0 ? __ffs(pt) - 1 : -1;
    const int32_t *pages = row_pages(a.step, kv, row);
    const int64_t pgb = kv->page_bytes, voff = kv->v_offset;
    uint8_t *kbase = kv->base + (size_t)a.layer * kv->layer_bytes + (size_t)h * kv->head_bytes;
    float *qs = (float *)smem;                          /* [G][HD] */
    uint4 *qf = (uint4 *)(qs + (size_t)G * HD);         /* [KS][32]: hi01, hi45, lo01, lo45 */
    uint8_t *newrow = (uint8_t *)(qf + KS * 32);        /* K, V of the token */
    float *wm = (float *)(newrow + 2 * tb), *wl = wm + W * G; /* [W][G]: the warps' m and l */
    uint8_t *tiles = (uint8_t *)(((uintptr_t)(wl + W * G) + 15) / 16 * 16);
    uint8_t *kt = tiles + (size_t)warp * 2 * ATM_T * tbp, *vt = kt + ATM_T * tbp; /* the warp's K, V rows */
    float *red = (float *)tiles;                        /* [W][G][HD], after the tiles */

    auto vrow = [&](int r) { return 2 * t + (r & 1) + 8 * (r >> 1); };
    auto rowp = [&](int p) -> const uint8_t * {
        p = min(p, t1 - 1);
        const int pg = psh >= 0 ? p >> psh : p / pt, sl = psh >= 0 ? p & (pt - 1) : p % pt;
        return kbase + (int64_t)pages[pg] * pgb + (int64_t)sl * tb;
    };
    /* the lane's pieces of the tile at tt: K rows tt + g, tt + 8 + g at dimensions 32 kb + 8 t,
     * V rows tt + 2t, +1, +8, +9 at dimensions 8 (8 cb + g) */
    auto issue = [&](int tt) {
#pragma unroll
        for (int n = 0; n < 2; n++) {
            const uint8_t *src = rowp(tt + 8 * n + g) + 16 * t;
#pragma unroll
            for (int kb = 0; kb < KB; kb++) cp_async16(kt + (8 * n + g) * tbp + 16 * t + 64 * kb, src + 64 * kb, 16);
        }
#pragma unroll
        for (int r = 0; r < 4; r++) {
            const uint8_t *src = rowp(tt + vrow(r)) + voff + 16 * g;
#pragma unroll
            for (int cb = 0; cb < CB; cb++) cp_async16(vt + vrow(r) * tbp + 16 * g + 128 * cb, src + 128 * cb, 16);
        }
        cp_async_commit();
    };

    /* the query's heads of this warp (and with own_new, in the last warp, the token's k and v):
     * their loads first without PDL order, after the first tile's copies with it */
    const float *qb = a.q + (size_t)row * a.n_heads * HD + (size_t)(h * G) * HD;
    const size_t kvd = (size_t)a.n_kv * HD;
    float *kn = a.k_new + row * kvd + (size_t)h * HD;
    const float *vn = a.v_new + row * kvd + (size_t)h * HD;
    const bool kwarp = own_new && warp == W - 1;
    head_rope<HD> qr[QH], krp;
    float vv[HD / 32];
    auto qload = [&]() {
        if (!a.fuse_rope)
            return;
#pragma unroll
        for (int j = 0; j < QH; j++)
            if (warp + j * W < G)
                qr[j].load(qb + (size_t)(warp + j * W) * HD, a.q_norm, a.inv_freq, lane);
        if (kwarp) {
            krp.load(kn, a.k_norm, a.inv_freq, lane);
#pragma unroll
            for (int u = 0; u < HD / 32; u++) vv[u] = vn[lane + 32 * u];
        }
    };
    int tt = t0 + ATM_T * warp;
    if (!early)
        qload();
    if (tt < t1)
        issue(tt);
    if (early) {
        griddep_wait();
        qload();
    }
    if (!a.fuse_rope) {
        for (int i = tid; i < G * HD; i += blockDim.x) qs[i] = qb[i] * a.scale;
    } else {
#pragma unroll
        for (int j = 0; j < QH; j++)
            if (warp + j * W < G)
                qr[j].store(qs + (size_t)(warp + j * W) * HD, a.q_norm != nullptr, pos, a.eps, a.scale, lane);
        if (kwarp) { /* k rotated (written back to k_new), K and V into the cache and newrow */
            constexpr int NP = HD / 64;
            float y[2][NP];
            krp.rotate(y[0], y[1], a.k_norm != nullptr, pos, a.eps, 1.f);
            uint8_t *dst = kbase + (size_t)pages[pos / pt] * kv->page_bytes + (size_t)(pos % pt) * tb;
#pragma unroll
            for (int u = 0; u < HD / 32; u++) {
                const int i = lane + 32 * u; /* u < NP: pair u's first, else pair u - NP's second */
                const float kf = y[u / NP][u % NP], vf = vv[u];
                kn[i] = kf;
                elem<KT>::put(dst, i, kf);
                elem<KT>::put(dst + kv->v_offset, i, vf);
                elem<KT>::put(newrow, i, kf);
                elem<KT>::put(newrow + tb, i, vf);
            }
        }
    }
    __syncthreads();
    for (int i = tid; i < KS * 32; i += blockDim.x) { /* q's fragments: k-step ks, lane */
        const int ks = i / 32, fg = (i / 4) % 8, ft = i % 4, d = 32 * (ks / 2) + 8 * ft + 4 * (ks % 2);
        uint4 f = make_uint4(0, 0, 0, 0);
        if (fg < G) {
            const float *q = qs + (size_t)fg * HD + d;
            split2<KT>(q[0], q[1], f.x, f.z);
            split2<KT>(q[2], q[3], f.y, f.w);
        }
        qf[i] = f;
    }
    __syncthreads();

    float m = -INFINITY, l = 0.f, o[CB][8][2];
#pragma unroll
    for (int cb = 0; cb < CB; cb++)
#pragma unroll
        for (int j = 0; j < 8; j++) o[cb][j][0] = o[cb][j][1] = 0.f;
    for (bool first = true; tt < t1; tt += ATM_T * W, first = false) {
        if (!first)
            issue(tt);
        cp_async_wait<0>(); /* the lane's pieces are in */
        const bool tail = own_new && tt + ATM_T >= P; /* the token's row (P - 1) from shared memory */
        /* scores: sc[n][e] = head g, position tt + 8 n + 2 t + e */
        float sc[2][2], sl[2][2]; /* q's 16-bit part (rows 0-7 of A) and its remainder (rows 8-15) */
#pragma unroll
        for (int n = 0; n < 2; n++) {
            const bool mine = tail && min(tt + 8 * n + g, t1 - 1) == P - 1;
            const uint8_t *kp = mine ? newrow + 16 * t : kt + (8 * n + g) * tbp + 16 * t;
            sc[n][0] = sc[n][1] = sl[n][0] = sl[n][1] = 0.f;
#pragma unroll
            for (int kb = 0; kb < KB; kb++) {
                const uint4 k4 = *(const uint4 *)(kp + 64 * kb);
#pragma unroll
                for (int h2 = 0; h2 < 2; h2++) {
                    const uint4 q4 = qf[(2 * kb + h2) * 32 + lane];
                    const uint32_t b0 = h2 ? k4.z : k4.x, b1 = h2 ? k4.w : k4.y;
                    mma_full<KT>(sc[n][0], sc[n][1], sl[n][0], sl[n][1], q4.x, q4.z, q4.y, q4.w, b0, b1, sc[n][0],
                                 sc[n][1], sl[n][0], sl[n][1]);
                }
            }
            sc[n][0] += sl[n][0], sc[n][1] += sl[n][1];
        }
        float mt = -INFINITY;
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) {
                float v = sc[n][e];
                if (a.softcap > 0.f)
                    v = a.softcap * tanhf(v / a.softcap);
                if (tt + 8 * n + 2 * t + e >= t1)
                    v = -INFINITY;
                sc[n][e] = v;
                mt = fmaxf(mt, v);
            }
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 1));
        mt = fmaxf(mt, __shfl_xor_sync(0xffffffffu, mt, 2));
        const float mn = fmaxf(m, mt), al = expf(m - mn); /* m = -inf: 0 */
        float pr[2][2];
#pragma unroll
        for (int n = 0; n < 2; n++)
#pragma unroll
            for (int e = 0; e < 2; e++) pr[n][e] = expf(sc[n][e] - mn);
        l = l * al + (pr[0][0] + pr[0][1]) + (pr[1][0] + pr[1][1]);
        m = mn;
        uint32_t ph0, pl0, ph1, pl1; /* P as A: positions 2t, 2t+1 (a0), 2t+8, 2t+9 (a2) */
        split2<KT>(pr[0][0], pr[0][1], ph0, pl0);
        split2<KT>(pr[1][0], pr[1][1], ph1, pl1);
#pragma unroll
        for (int cb = 0; cb < CB; cb++) {
            uint4 v4[4];
#pragma unroll
            for (int r = 0; r < 4; r++) {
                const bool mine = tail && min(tt + vrow(r), t1 - 1) == P - 1;
                v4[r] = *(const uint4 *)((mine ? newrow + tb : vt + vrow(r) * tbp) + 16 * g + 128 * cb);
            }
#pragma unroll
            for (int w = 0; w < 4; w++) {
                const uint32_t x0 = (&v4[0].x)[w], x1 = (&v4[1].x)[w], x2 = (&v4[2].x)[w], x3 = (&v4[3].x)[w];
#pragma unroll
                for (int e = 0; e < 2; e++) { /* column 8 (8 cb + g) + 2 w + e of V */
                    const uint32_t sel = e ? 0x7632u : 0x5410u;
                    const uint32_t b0 = __byte_perm(x0, x1, sel), b1 = __byte_perm(x2, x3, sel);
                    float *c = o[cb][2 * w + e], r0, r1; /* P's 16-bit part in rows 0-7, its remainder 8-15 */
                    mma_full<KT>(c[0], c[1], r0, r1, ph0, pl0, ph1, pl1, b0, b1, c[0] * al, c[1] * al, 0.f, 0.f);
                    c[0] += r0, c[1] += r1;
                }
            }
        }
    }
    /* o[cb][j][e] is head g, dimension 64 cb + 16 t + 8 e + j */
    l += __shfl_xor_sync(0xffffffffu, l, 1);
    l += __shfl_xor_sync(0xffffffffu, l, 2);
    float *out = a.out + (size_t)row * a.n_heads * HD + (size_t)(h * G) * HD;
    const size_t stride = ATT_PSTRIDE(HD);
    [[maybe_unused]] float *cpart = (float *)(smem + attm_smem(G, HD)); /* CL: the cluster's partials (rank 0's) */
    float *part = a.part + (((size_t)b * a.n_kv + h) * gridDim.y + s) * G * stride;
    /* in a cluster (S is at most its size: chunk >= len / gridDim.y) */
    [[maybe_unused]] const bool clm = CL && S > 1;
    if constexpr (CL) {
        if (clm) { /* rank 0 has started (the first half's wait), so its partials can be written */
            cluster_wait_acquire();
            part = cluster_map(cpart, 0) + (size_t)cluster_rank() * G * stride;
        }
    }
    if (t1 - t0 <= ATM_T) { /* one tile: warp 0's registers hold the split */
        if (warp == 0 && g < G) {
            const float scl = S == 1 ? 1.f / l : 1.f;
            float *dst = S == 1 ? out + (size_t)g * HD : part + g * stride + 4;
#pragma unroll
            for (int cb = 0; cb < CB; cb++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    float4 *d4 = (float4 *)(dst + 64 * cb + 16 * t + 8 * e);
                    d4[0] = make_float4(o[cb][0][e] * scl, o[cb][1][e] * scl, o[cb][2][e] * scl, o[cb][3][e] * scl);
                    d4[1] = make_float4(o[cb][4][e] * scl, o[cb][5][e] * scl, o[cb][6][e] * scl, o[cb][7][e] * scl);
                }
            if (S > 1 && t == 0)
                part[g * stride] = m, part[g * stride + 1] = l;
        }
    } else { /* the warps' partials combined through shared memory (over the tiles: a barrier first) */
        __syncthreads();
        if (g < G) {
            float *r = red + ((size_t)warp * G + g) * HD;
#pragma unroll
            for (int cb = 0; cb < CB; cb++)
#pragma unroll
                for (int e = 0; e < 2; e++) {
                    float4 *d4 = (float4 *)(r + 64 * cb + 16 * t + 8 * e);
                    d4[0] = make_float4(o[cb][0][e], o[cb][1][e], o[cb][2][e], o[cb][3][e]);
                    d4[1] = make_float4(o[cb][4][e], o[cb][5][e], o[cb][6][e], o[cb][7][e]);
                }
            if (t == 0)
                wm[warp * G + g] = m, wl[warp * G + g] = l;
        }
        __syncthreads();
        /* each thread: 4 dimensions of head hg, the warps' scales computed again per thread */
        for (int i = tid; i < G * HD / 4; i += blockDim.x) {
            const int hg = i / (HD / 4), d = (i % (HD / 4)) * 4;
            float M = -INFINITY, L = 0.f;
#pragma unroll
            for (int w = 0; w < W; w++) M = fmaxf(M, wm[w * G + hg]);
            float4 acc = make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
            for (int w = 0; w < W; w++) {
                const float mw = wm[w * G + hg], sw = mw == -INFINITY ? 0.f : expf(mw - M);
                const float4 v = *(const float4 *)(red + ((size_t)w * G + hg) * HD + d);
                L += wl[w * G + hg] * sw;
                acc.x += v.x * sw, acc.y += v.y * sw, acc.z += v.z * sw, acc.w += v.w * sw;
            }
            if (S == 1) {
                const float il = 1.f / L;
                *(float4 *)(out + (size_t)hg * HD + d) = make_float4(acc.x * il, acc.y * il, acc.z * il, acc.w * il);
            } else {
                *(float4 *)(part + hg * stride + 4 + d) = acc;
                if (d == 0)
                    part[hg * stride] = M, part[hg * stride + 1] = L;
            }
        }
    }
    if (clm)
        attn_cluster_merge<HD>(S, G, cpart, out);
    else if (S > 1)
        attn_merge_splits(a, b, h, S, G, HD, out);
}

/* Blocks of the tensor-core decoding kernel (G query heads a kv head, not in clusters) that
 * the current device runs at once; its occupancy is measured once per (KT, HD, G). A launch
 * of more splits than fit would run a second wave, nearly doubling its time (at 4096
 * positions, 37 splits a kv head took 1.4x the time of 33: bench/RESULTS.md). */
template <int KT, int HD> unsigned attm_wave(int G)
{
    static int per_sm[ATT_GMAX + 1];
    int &per = per_sm[std::min(G, ATT_GMAX)];
    if (!per) {
        int n = 0;
        cudaError_t e = cudaOccupancyMaxActiveBlocksPerMultiprocessor(&n, attn_decode_mma_kernel<KT, HD, false, false>,
                                                                      attm_warps(HD) * 32, attm_smem(G, HD));
        per = e == cudaSuccess && n > 0 ? n : 1;
    }
    int dev = 0, sms = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess)
        sms = 1;
    return (unsigned)(per * sms);
}

typedef void (*attn_fn)(const lms_cu_attn);

/* The decoding kernel for G query heads a kv head: its accumulators sized to G rounded up to
 * a power of two (16-bit K/V at head dims 64/128/256), else to the most (ATT_GMAX). */
template <int KT, int HD> attn_fn attn_decode_fn(int G)
{
    if constexpr (KT == LMS_CU_F32 || HD == 0) {
        (void)G;
        return attn_decode_kernel<KT, HD, ATT_GMAX>;
    } else {
        return G <= 1   ? attn_decode_kernel<KT, HD, 1>
               : G <= 2 ? attn_decode_kernel<KT, HD, 2>
               : G <= 4 ? attn_decode_kernel<KT, HD, 4>
               : G <= 8 ? attn_decode_kernel<KT, HD, 8>
                        : attn_decode_kernel<KT, HD, ATT_GMAX>;
    }
}

template <int KT, int HD>
int attn_typed(const lms_cu_attn *a, int nb_max, void *stream)
{
    int threads = attn_threads(a->hd), G = a->n_heads / a->n_kv;
    dim3 dec(a->n_kv, nb_max <= 8 || a->decode_only ? a->splits : 1, nb_max);
    size_t smem = attn_decode_smem(G, a->hd, a->kv.token_bytes);
    if constexpr (KT == LMS_CU_F32 || HD == 0) {
        return launch(attn_decode_fn<KT, HD>(G), dec, dim3(threads), smem, stream, *a);
    } else {
        constexpr int BK = HD >= 256 ? 32 : 64;
        if ((nb_max <= 8 || a->decode_only) && g_att_mma && G <= 8) {
            const dim3 th(attm_warps(HD) * 32);
            const bool cl = a->cluster && g_cluster_ok && nb_max == 1;
            if (cl) /* a range of at most lms_cu_attn_cluster_len: at most one cluster of splits */
                dec.y = std::min(dec.y, (unsigned)ATM_CLUSTER_MAX);
            else if (nb_max == 1) /* one token: every split of every kv head in one wave */
                dec.y = std::min(dec.y, std::max(1u, attm_wave<KT, HD>(G) / a->n_kv));
            const unsigned C = cl ? dec.y : 1;
            if (C > 1) {
                const size_t sm = attm_smem(G, HD) + attm_cl_smem(G, HD);
                return g_pdl ? launch_ex(attn_decode_mma_kernel<KT, HD, true, true>, dec, th, sm, stream, C, 1, *a)
                             : launch_ex(attn_decode_mma_kernel<KT, HD, false, true>, dec, th, sm, stream, C, 0, *a);
            }
            return g_pdl ? launch(attn_decode_mma_kernel<KT, HD, true, false>, dec, th, attm_smem(G, HD), stream, *a)
                         : launch(attn_decode_mma_kernel<KT, HD, false, false>, dec, th, attm_smem(G, HD), stream, *a);
        }
        if (nb_max <= 8 || a->decode_only)
            return launch(attn_decode_fn<KT, HD>(G), dec, dim3(threads), smem, stream, *a);
        return launch(attn_prefill_kernel<KT, HD, BK>, dim3((nb_max + FA_BQ - 1) / FA_BQ, a->n_heads), dim3(128),
                      fa_smem<HD, BK>(), stream, *a);
    }
}

} /* namespace */

/* ---- launchers --------------------------------------------------------------------------- */

extern "C" int lms_cu_gemv_launch(const lms_cu_gemv *a, int sms, void *stream)
{
    bool one = a->nb_max == 1;
    switch (a->wtype) {
    case LMS_CU_F32: return one ? gemv_typed<LMS_CU_F32, 1>(a, sms, stream) : gemv_typed<LMS_CU_F32, 8>(a, sms, stream);
    case LMS_CU_F16: return one ? gemv_typed<LMS_CU_F16, 1>(a, sms, stream) : gemv_typed<LMS_CU_F16, 8>(a, sms, stream);
    case LMS_CU_BF16:
        return one ? gemv_typed<LMS_CU_BF16, 1>(a, sms, stream) : gemv_typed<LMS_CU_BF16, 8>(a, sms, stream);
    }
    return (int)cudaErrorInvalidValue;
}

extern "C" int lms_cu_gemv_mlx_launch(const lms_cu_gemv *a, int bits, int stype, void *stream)
{
    int total = 0;
    for (int j = 0; j < a->n_jobs; j++) total += a->rows[j];
    /* threads a block: one 16-byte chunk of codes each for a row of 4096 (32 x 4 bits,
     * 16 x 8 bits): small blocks, many of them resident, keep the loads in flight */
    constexpr int T4 = 128, T8 = 256;
    dim3 grid(a->pair_act ? (a->rows[0] + 1) / 2 : (total + GEMV_R - 1) / GEMV_R);
    bool one = a->nb_max == 1;
    /* one row of x: products on int8 activations (gemv_mlxq_kernel), where x can be read as
     * float4s and the group is a power of two from 32 to 128 */
    const int g = a->group;
    const size_t qsm = mlxq_smem(a->K, g > 0 ? g : 1);
    const bool q8 = one && !a->exact && (g == 32 || g == 64 || g == 128) && a->K % g == 0 && qsm <= 48 * 1024 &&
                    (uintptr_t)a->x % 16 == 0 && a->ldx % 4 == 0 && (uintptr_t)a->norm % 16 == 0;
    /* scales and biases by 16-byte loads (gemv_mlxq_kernel's SBV): 16-bit, rows of them a
     * multiple of 16 bytes, aligned; by default for 4-bit codes only (with 8-bit ones, whose
     * scales are half as many per byte of codes, the 2-byte loads measured as fast or faster) */
    bool sbv = stype != LMS_CU_F32 && g > 0 && (a->K / g) % 8 == 0;
    for (int j = 0; j < a->n_jobs; j++)
        sbv = sbv && (uintptr_t)a->scales[j] % 16 == 0 && (uintptr_t)a->biases[j] % 16 == 0;
    const bool sb = sbv && (g_mlx_sb >= 0 ? g_mlx_sb == 1 : bits == 4);
    if (q8) {
        const int wr = MLXQ_TH / 32; /* warps a block */
        static int sms;
        if (!sms) {
            int dev = 0;
            if (cudaGetDevice(&dev) || cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev) || sms < 1)
                sms = 132;
        }
        const int units = a->pair_act ? a->rows[0] : (total + MLXQ_RW - 1) / MLXQ_RW;
        /* a persistent grid: MLXQ_BLOCKS per multiprocessor at most */
        dim3 qgrid((unsigned)std::min((units + wr - 1) / wr, MLXQ_BLOCKS * sms));
#define LMS_CU_MLXQ(B, S)                                                                                              \
        if (bits == B && stype == S) {                                                                                 \
            int rc = sb && S != LMS_CU_F32                                                                             \
                         ? launch(gemv_mlxq_kernel<B, S, S != LMS_CU_F32>, qgrid, dim3(MLXQ_TH), qsm, stream, *a)      \
                         : launch(gemv_mlxq_kernel<B, S, false>, qgrid, dim3(MLXQ_TH), qsm, stream, *a);               \
            return rc ? rc : gemv_norm_add_launch(a, stream);                                                          \
        }
        LMS_CU_MLXQ(4, LMS_CU_BF16) LMS_CU_MLXQ(4, LMS_CU_F16) LMS_CU_MLXQ(4, LMS_CU_F32)
        LMS_CU_MLXQ(8, LMS_CU_BF16) LMS_CU_MLXQ(8, LMS_CU_F16) LMS_CU_MLXQ(8, LMS_CU_F32)
#undef LMS_CU_MLXQ
        return (int)cudaErrorInvalidValue;
    }
#define LMS_CU_MLX(B, S)                                                                                               \
    if (bits == B && stype == S)                                                                                       \
        return one ? launch(gemv_mlx_kernel<B, S, 1, B == 4 ? T4 : T8>, grid, dim3(B == 4 ? T4 : T8), 0, stream, *a)   \
                   : launch(gemv_mlx_kernel<B, S, 8, B == 4 ? T4 : T8>, grid, dim3(B == 4 ? T4 : T8), 0, stream, *a);
    LMS_CU_MLX(4, LMS_CU_BF16) LMS_CU_MLX(4, LMS_CU_F16) LMS_CU_MLX(4, LMS_CU_F32)
    LMS_CU_MLX(8, LMS_CU_BF16) LMS_CU_MLX(8, LMS_CU_F16) LMS_CU_MLX(8, LMS_CU_F32)
#undef LMS_CU_MLX
    return (int)cudaErrorInvalidValue;
}

extern "C" int lms_cu_mlx_dequant_launch(void *hi, void *lo, const void *w, const void *scales, const void *biases,
                                         int bits, int stype, int K, int group, int r0, int n, void *stream)
{
    size_t total = (size_t)n * K / (32 / bits), blocks = (total + 255) / 256;
    dim3 grid(blocks > 65535 ? 65535 : (unsigned)blocks), blk(256);
#define LMS_CU_DQ(B, S)                                                                                                \
    if (bits == B && stype == S)                                                                                       \
        return launch(mlx_dequant_kernel<B, S>, grid, blk, 0, stream, (__nv_bfloat16 *)hi, (__nv_bfloat16 *)lo,       \
                      (const uint8_t *)w, scales, biases, K, group, r0, n);
    LMS_CU_DQ(4, LMS_CU_BF16) LMS_CU_DQ(4, LMS_CU_F16) LMS_CU_DQ(4, LMS_CU_F32)
    LMS_CU_DQ(8, LMS_CU_BF16) LMS_CU_DQ(8, LMS_CU_F16) LMS_CU_DQ(8, LMS_CU_F32)
#undef LMS_CU_DQ
    return (int)cudaErrorInvalidValue;
}

extern "C" int lms_cu_embed_mlx_launch(float *x, const void *w, const void *scales, const void *biases, int bits,
                                       int stype, int E, int group, float scale, const int32_t *step, int max_nb,
                                       void *stream)
{
    dim3 grid(max_nb), blk(256);
#define LMS_CU_EM(B, S)                                                                                                \
    if (bits == B && stype == S)                                                                                       \
        return launch(embed_mlx_kernel<B, S>, grid, blk, 0, stream, x, (const uint8_t *)w, scales, biases, E, group,  \
                      scale, step);
    LMS_CU_EM(4, LMS_CU_BF16) LMS_CU_EM(4, LMS_CU_F16) LMS_CU_EM(4, LMS_CU_F32)
    LMS_CU_EM(8, LMS_CU_BF16) LMS_CU_EM(8, LMS_CU_F16) LMS_CU_EM(8, LMS_CU_F32)
#undef LMS_CU_EM
    return (int)cudaErrorInvalidValue;
}

extern "C" int lms_cu_prologue_launch(void *out, int otype, const float *x, const float *x2, int ldx, const float *norm,
                                      int pro, float eps, int K, int row0, int n, const int32_t *step, int split,
                                      void *stream)
{
    dim3 g(n), b(256);
    switch (otype) {
    case LMS_CU_F32: return launch(prologue_kernel<LMS_CU_F32>, g, b, 0, stream, out, x, x2, ldx, norm, pro, eps, K, row0, n, step, 0);
    case LMS_CU_F16: return launch(prologue_kernel<LMS_CU_F16>, g, b, 0, stream, out, x, x2, ldx, norm, pro, eps, K, row0, n, step, split);
    case LMS_CU_BF16: return launch(prologue_kernel<LMS_CU_BF16>, g, b, 0, stream, out, x, x2, ldx, norm, pro, eps, K, row0, n, step, split);
    }
    return (int)cudaErrorInvalidValue;
}

extern "C" int lms_cu_split_sum_launch(float *y, int ldy, const float *c, int rows, int nb, const float *bias, int acc,
                                       void *stream)
{
    return launch(split_sum_kernel, dim3((rows + 255) / 256, nb), dim3(256), 0, stream, y, ldy, c, rows, nb, bias, acc);
}

extern "C" int lms_cu_embed_launch(float *x, const void *embed, int wtype, int E, float scale, const int32_t *step,
                                   int max_nb, void *stream)
{
    dim3 g(max_nb), b(256);
    switch (wtype) {
    case LMS_CU_F32: return launch(embed_kernel<LMS_CU_F32>, g, b, 0, stream, x, embed, E, scale, step);
    case LMS_CU_F16: return launch(embed_kernel<LMS_CU_F16>, g, b, 0, stream, x, embed, E, scale, step);
    case LMS_CU_BF16: return launch(embed_kernel<LMS_CU_BF16>, g, b, 0, stream, x, embed, E, scale, step);
    }
    return (int)cudaErrorInvalidValue;
}

extern "C" int lms_cu_rope_launch(const lms_cu_rope *a, void *stream)
{
    dim3 g(a->max_nb), b(256);
    switch (a->kv.dtype) {
    case LMS_CU_F32: return launch(rope_kernel<LMS_CU_F32>, g, b, 0, stream, *a);
    case LMS_CU_F16: return launch(rope_kernel<LMS_CU_F16>, g, b, 0, stream, *a);
    case LMS_CU_BF16: return launch(rope_kernel<LMS_CU_BF16>, g, b, 0, stream, *a);
    }
    return (int)cudaErrorInvalidValue;
}

extern "C" int lms_cu_attn_launch(const lms_cu_attn *a, int nb_max, void *stream)
{
#define LMS_CU_ATT_HD(KT)                                                                                              \
    switch (a->hd) {                                                                                                   \
    case 64: return attn_typed<KT, 64>(a, nb_max, stream);                                                             \
    case 128: return attn_typed<KT, 128>(a, nb_max, stream);                                                           \
    case 256: return attn_typed<KT, 256>(a, nb_max, stream);                                                           \
    default: return attn_typed<KT, 0>(a, nb_max, stream);                                                              \
    }
    switch (a->kv.dtype) {
    case LMS_CU_F32: LMS_CU_ATT_HD(LMS_CU_F32)
    case LMS_CU_F16: LMS_CU_ATT_HD(LMS_CU_F16)
    case LMS_CU_BF16: LMS_CU_ATT_HD(LMS_CU_BF16)
    }
#undef LMS_CU_ATT_HD
    return (int)cudaErrorInvalidValue;
}

extern "C" int lms_cu_gather_launch(float *dst, const float *src, int width, const int32_t *rows, int n, void *stream)
{
    return launch(gather_kernel, dim3(n), dim3(256), 0, stream, dst, src, width, rows);
}

extern "C" int lms_cu_norm_add_launch(float *y, const float *x, const float *w, int n, float eps, const int32_t *step,
                                      int max_nb, void *stream)
{
    return launch(norm_add_kernel, dim3(max_nb), dim3(norm_add_threads(n)), 0, stream, y, x, w, n, eps, step);
}

extern "C" int lms_cu_bias_launch(float *y, int ldy, const float *bias, int rows, const int32_t *step, int max_nb,
                                  void *stream)
{
    return launch(bias_kernel, dim3((rows + 255) / 256, max_nb), dim3(256), 0, stream, y, ldy, bias, rows, step);
}

extern "C" int lms_cu_softcap_launch(float *v, size_t n, float c, void *stream)
{
    size_t blocks = (n + 255) / 256;
    return launch(softcap_kernel, dim3(blocks > 4096 ? 4096 : (unsigned)blocks), dim3(256), 0, stream, v, n, c);
}

extern "C" int lms_cu_argmax_launch(const float *v, int n, int32_t *id, void *scratch, void *stream)
{
    /* scratch: LMS_CU_ARGMAX_BLOCKS float2 parts, then the ticket (zero between launches) */
    float2 *part = (float2 *)scratch;
    return launch(argmax_kernel, dim3(LMS_CU_ARGMAX_BLOCKS), dim3(256), 0, stream, v, n, id, part,
                  (int *)(part + LMS_CU_ARGMAX_BLOCKS));
}

extern "C" int lms_cu_readbw_launch(const void *p, size_t n16, uint32_t *sink, int sms, void *stream)
{
    cudaError_t e;
    readbw_kernel<<<sms * 4, 512, 0, (cudaStream_t)stream>>>((const uint4 *)p, n16, sink);
    e = cudaGetLastError();
    return (int)e;
}

extern "C" int lms_cu_rmsnorm_launch(float *out, const float *x, const float *w, int n, float eps, int row0, int n_rows,
                                     const int32_t *step, int max_nb, void *stream)
{
    return launch(rmsnorm_kernel, dim3(n_rows > 0 ? n_rows : max_nb), dim3(256), 0, stream, out, x, w, n, eps, row0,
                  n_rows, step);
}

extern "C" int lms_cu_act_mul_launch(float *h, const float *g, const float *u, int n, int act, const int32_t *step,
                                     int max_nb, void *stream)
{
    return launch(act_mul_kernel, dim3((n + 255) / 256, max_nb), dim3(256), 0, stream, h, g, u, n, act, step);
}

extern "C" void lms_cu_set_pdl(int on) { g_pdl = on; }

extern "C" void lms_cu_pdl_next(int on) { g_pdl_once = on; }

extern "C" void lms_cu_set_att_mma(int on) { g_att_mma = on; }
/* One-token decoding launches of this shape run the tensor-core kernel (attn_typed's choice). */
static bool attm_applies(int hd, int G, int kv_dtype)
{
    return g_att_mma && (kv_dtype == LMS_CU_F16 || kv_dtype == LMS_CU_BF16) && (hd == 64 || hd == 128 || hd == 256) &&
           G >= 1 && G <= 8;
}

extern "C" int lms_cu_attn_wave_splits(int hd, int G, int kv_dtype, int n_kv)
{
    if (!attm_applies(hd, G, kv_dtype) || n_kv <= 0)
        return 0;
    const bool bf = kv_dtype == LMS_CU_BF16;
    const unsigned w = hd == 64    ? (bf ? attm_wave<LMS_CU_BF16, 64>(G) : attm_wave<LMS_CU_F16, 64>(G))
                       : hd == 128 ? (bf ? attm_wave<LMS_CU_BF16, 128>(G) : attm_wave<LMS_CU_F16, 128>(G))
                                   : (bf ? attm_wave<LMS_CU_BF16, 256>(G) : attm_wave<LMS_CU_F16, 256>(G));
    return (int)std::max(1u, w / (unsigned)n_kv);
}

extern "C" int lms_cu_attn_cluster_len(int hd, int G, int kv_dtype)
{
    return g_cluster_ok && attm_applies(hd, G, kv_dtype) ? ATM_CLUSTER_MAX * attm_warps(hd) * ATM_T : 0;
}
extern "C" void lms_cu_set_mlx_sb(int mode) { g_mlx_sb = mode == 0 || mode == 1 ? mode : -1; }

extern "C" void lms_cu_set_gemv_blocks(int per_sm, int cap)
{
    g_gemv_blocks = per_sm == 0 || per_sm == 3 || per_sm == 4 ? per_sm : GEMV_PERSIST_BLOCKS;
    g_gemv_grid_cap = cap > 0 ? cap : 0;
}

extern "C" int lms_cu_kernels_init(void)
{
    int limit = 200 * 1024;
    cudaError_t e = cudaSuccess;
#define LMS_CU_ASMEM(KT)                                                                                               \
    for (int G = 1; G <= ATT_GMAX; G *= 2) {                                                                           \
        if (!e) e = cudaFuncSetAttribute(attn_decode_fn<KT, 0>(G), cudaFuncAttributeMaxDynamicSharedMemorySize, limit); \
        if (!e) e = cudaFuncSetAttribute(attn_decode_fn<KT, 64>(G), cudaFuncAttributeMaxDynamicSharedMemorySize, limit);\
        if (!e) e = cudaFuncSetAttribute(attn_decode_fn<KT, 128>(G), cudaFuncAttributeMaxDynamicSharedMemorySize, limit);\
        if (!e) e = cudaFuncSetAttribute(attn_decode_fn<KT, 256>(G), cudaFuncAttributeMaxDynamicSharedMemorySize, limit);\
    }
    LMS_CU_ASMEM(LMS_CU_F32)
    LMS_CU_ASMEM(LMS_CU_F16)
    LMS_CU_ASMEM(LMS_CU_BF16)
#undef LMS_CU_ASMEM
#define LMS_CU_FSMEM(KT)                                                                                               \
    if (!e) e = cudaFuncSetAttribute(attn_prefill_kernel<KT, 64, 64>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fa_smem<64, 64>()); \
    if (!e) e = cudaFuncSetAttribute(attn_prefill_kernel<KT, 128, 64>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fa_smem<128, 64>()); \
    if (!e) e = cudaFuncSetAttribute(attn_prefill_kernel<KT, 256, 32>, cudaFuncAttributeMaxDynamicSharedMemorySize, (int)fa_smem<256, 32>());
    LMS_CU_FSMEM(LMS_CU_F16)
    LMS_CU_FSMEM(LMS_CU_BF16)
#undef LMS_CU_FSMEM
#define LMS_CU_MSMEM1(KT, HD, P)                                                                                      \
    if (!e) e = cudaFuncSetAttribute(attn_decode_mma_kernel<KT, HD, P, false>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
                                     (int)attm_smem(8, HD));                                                         \
    if (!e) e = cudaFuncSetAttribute(attn_decode_mma_kernel<KT, HD, P, true>, cudaFuncAttributeMaxDynamicSharedMemorySize, \
                                     (int)(attm_smem(8, HD) + attm_cl_smem(8, HD)));
#define LMS_CU_MSMEM(KT)                                                                                                 \
    LMS_CU_MSMEM1(KT, 64, false) LMS_CU_MSMEM1(KT, 128, false) LMS_CU_MSMEM1(KT, 256, false)                         \
    LMS_CU_MSMEM1(KT, 64, true) LMS_CU_MSMEM1(KT, 128, true) LMS_CU_MSMEM1(KT, 256, true)
    LMS_CU_MSMEM(LMS_CU_F16)
    LMS_CU_MSMEM(LMS_CU_BF16)
#undef LMS_CU_MSMEM
#undef LMS_CU_MSMEM1
    int dev = 0, major = 0;
    if (!e) e = cudaGetDevice(&dev);
    if (!e) e = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
    g_cluster_ok = major >= 9;
    return (int)e;
}
