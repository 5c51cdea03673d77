/*
 * bench/attn_decode.cu - the decoding attention of the CUDA backend
 * (lms_cu_attn_launch, F16 K/V, one token, RoPE fused) at the shapes of
 * Llama-3-8B (32 heads, 8 kv heads, head dim 128, 32 layers) and gemma-3-12b
 * (16 heads, 8 kv heads, head dim 256, q/k norms, 48 layers): a step's
 * attention launches (one per layer, each over its own layer of the cache)
 * in a CUDA graph, at 128, 1024 and 4096 positions, for each variant (the
 * CUDA-core kernel, the tensor-core kernel with its splits merged through
 * global memory (ticket) or within thread block clusters (the default for
 * ranges short enough: lms_cu_attn_cluster_len), both also with programmatic
 * dependent launch),
 * the variants alternating, ROUNDS rounds (default 5, medians); each
 * variant's output checked against the first's (MISMATCH past 2e-3 of the
 * largest output). Not part of the build; on a GPU host:
 *
 *   nvcc -arch=sm_90 -O3 -I. -Iinclude -o attn_decode bench/attn_decode.cu && [CHUNKS="64 128"] ./attn_decode
 */
#include "engine/cuda/kernels.cu"
#include "bench/cuda_check.h"
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#define PT 16 /* positions a page */

struct shape {
    const char *name;
    int L, nh, nkv, hd, qk_norm;
};

struct variant {
    const char *name;
    int mma, chunk, pdl, cluster; /* lms_cu_set_att_mma, lms_cu_attn.chunk, lms_cu_set_pdl, lms_cu_attn.cluster */
};

__global__ void fill16(uint16_t *p, size_t n, uint32_t seed)
{
    for (size_t i = blockIdx.x * (size_t)blockDim.x + threadIdx.x; i < n; i += (size_t)gridDim.x * blockDim.x) {
        uint32_t h = (uint32_t)i * 2654435761u ^ seed;
        h ^= h >> 15, h *= 2246822519u, h ^= h >> 13;
        p[i] = __half_as_ushort(__float2half(((h >> 8) / 16777216.0f * 2.f - 1.f)));
    }
}

static std::vector<float> rnd(size_t n, uint32_t seed, float lo, float hi)
{
    std::vector<float> v(n);
    for (size_t i = 0; i < n; i++) {
        seed = seed * 1664525u + 1013904223u;
        v[i] = lo + (hi - lo) * (seed >> 8) / 16777216.0f;
    }
    return v;
}

template <class T> static T *dev(const std::vector<T> &h)
{
    T *d;
    CK(cudaMalloc(&d, h.size() * sizeof(T)));
    CK(cudaMemcpy(d, h.data(), h.size() * sizeof(T), cudaMemcpyHostToDevice));
    return d;
}

int main()
{
    const int rounds = getenv("ROUNDS") ? atoi(getenv("ROUNDS")) : 5, reps = 50;
    CK((cudaError_t)lms_cu_kernels_init());
    const shape shapes[] = {{"llama8b", 32, 32, 8, 128, 0}, {"gemma12b", 48, 16, 8, 256, 1}};
    std::vector<variant> vars = {{"cuda cores", 0, 32, 0, 0}, {"mma ticket", 1, 32, 0, 0}, {"mma", 1, 32, 0, 1},
                                 {"mma pdl", 1, 32, 1, 1},    {"mma pdl ticket", 1, 32, 1, 0}};
    /* CHUNKS="64 128 ...": the tensor-core kernel again at those fewest positions a split, with
     * clusters and with the ticket */
    static char names[16][32];
    int nn = 0;
    if (getenv("CHUNKS"))
        for (const char *c = getenv("CHUNKS"); *c && nn + 2 <= 16;) {
            char *end;
            const long ch = strtol(c, &end, 10);
            if (end == c)
                break;
            for (int cl = 1; cl >= 0; cl--, nn++) {
                snprintf(names[nn], sizeof names[nn], "%s chunk%ld", cl ? "mma" : "ticket", ch);
                vars.push_back({names[nn], 1, (int)ch, 0, cl});
            }
            c = end;
        }
    const int nv = (int)vars.size();
    const int positions[] = {128, 1024, 4096};
    cudaStream_t st;
    CK(cudaStreamCreateWithFlags(&st, cudaStreamNonBlocking));
    for (const shape &sh : shapes) {
        for (int pos : positions) {
            const int G = sh.nh / sh.nkv, hd = sh.hd, n_ctx = 4096 + 256;
            const int npages = (n_ctx + PT - 1) / PT;
            const int64_t tb = hd * 2, head_bytes = PT * tb, layer_bytes = 2 * sh.nkv * head_bytes;
            const int64_t page_bytes = sh.L * layer_bytes;
            uint8_t *kvb;
            const size_t kvn = (size_t)npages * page_bytes;
            CK(cudaMalloc(&kvb, kvn));
            fill16<<<1024, 256, 0, st>>>((uint16_t *)kvb, kvn / 2, 7);
            /* step: nb 1, pos0, n_pages, 0, token, block table (identity) */
            std::vector<int32_t> hs(5 + npages);
            hs[0] = 1, hs[1] = pos, hs[2] = npages, hs[3] = 0, hs[4] = 0;
            for (int i = 0; i < npages; i++) hs[5 + i] = i;
            int32_t *dstep = dev(hs);
            std::vector<float> inv(hd / 2);
            for (int i = 0; i < hd / 2; i++) inv[i] = (float)pow(sh.qk_norm ? 1e6 : 5e5, -2.0 * i / hd);
            float *dinv = dev(inv);
            float *dqn = sh.qk_norm ? dev(rnd(hd, 3, 0.5f, 1.5f)) : nullptr;
            float *dkn = sh.qk_norm ? dev(rnd(hd, 4, 0.5f, 1.5f)) : nullptr;
            const std::vector<float> q0 = rnd((size_t)sh.nh * hd, 1, -2.f, 2.f);
            const std::vector<float> k0 = rnd((size_t)sh.nkv * hd, 2, -2.f, 2.f);
            float *dq = dev(q0), *dk = dev(k0), *dv = dev(rnd((size_t)sh.nkv * hd, 5, -1.f, 1.f));
            float *dout, *part;
            int *cnt;
            const int splits = std::max((n_ctx + 127) / 128, std::min((n_ctx + 15) / 16, 32));
            CK(cudaMalloc(&dout, (size_t)sh.L * sh.nh * hd * 4));
            CK(cudaMalloc(&part, (size_t)8 * sh.nkv * splits * G * (hd + 4) * 4));
            CK(cudaMalloc(&cnt, 8 * sh.nkv * 4));
            CK(cudaMemset(cnt, 0, 8 * sh.nkv * 4));
            /* clusters as the engine uses them: ranges of at most cl_len positions */
            const int cl_len = lms_cu_attn_cluster_len(hd, G, LMS_CU_F16);
            std::vector<lms_cu_attn> la(sh.L);
            for (int l = 0; l < sh.L; l++) {
                lms_cu_attn &a = la[l];
                memset(&a, 0, sizeof a);
                a.q = dq;
                a.out = dout + (size_t)l * sh.nh * hd;
                a.n_heads = sh.nh, a.n_kv = sh.nkv, a.hd = hd, a.layer = l;
                a.scale = 1.f / sqrtf((float)hd);
                a.kv.base = kvb, a.kv.page_bytes = page_bytes, a.kv.layer_bytes = layer_bytes;
                a.kv.head_bytes = head_bytes, a.kv.token_bytes = tb, a.kv.v_offset = sh.nkv * head_bytes;
                a.kv.page_tokens = PT, a.kv.dtype = LMS_CU_F16, a.kv.table = 5;
                a.step = dstep, a.max_block = 1, a.part = part, a.counters = cnt, a.splits = splits;
                a.fuse_rope = 1, a.k_new = dk, a.v_new = dv, a.q_norm = dqn, a.k_norm = dkn, a.inv_freq = dinv;
                a.eps = 1e-6f;
            }
            /* each variant once from the same inputs: outputs against the first's */
            std::vector<std::vector<float>> outs(nv);
            for (int v = 0; v < nv; v++) {
                lms_cu_set_att_mma(vars[v].mma);
                lms_cu_set_pdl(vars[v].pdl);
                CK(cudaMemcpy(dk, k0.data(), k0.size() * 4, cudaMemcpyHostToDevice));
                for (int l = 0; l < sh.L; l++) {
                    la[l].chunk = vars[v].chunk, la[l].cluster = vars[v].cluster && pos < cl_len;
                    CK((cudaError_t)lms_cu_attn_launch(&la[l], 1, st));
                    CK(cudaMemcpyAsync(dk, k0.data(), k0.size() * 4, cudaMemcpyHostToDevice, st));
                }
                CK(cudaStreamSynchronize(st));
                outs[v].resize((size_t)sh.L * sh.nh * hd);
                CK(cudaMemcpy(outs[v].data(), dout, outs[v].size() * 4, cudaMemcpyDeviceToHost));
                double md = 0, mx = 0;
                for (size_t i = 0; i < outs[v].size(); i++) {
                    md = std::max(md, (double)fabsf(outs[v][i] - outs[0][i]));
                    mx = std::max(mx, (double)fabsf(outs[0][i]));
                }
                if (v)
                    printf("  %s pos %d %-14s max |diff| %.3g of max |out| %.3g%s\n", sh.name, pos, vars[v].name, md, mx,
                           md > 2e-3 * mx ? "  MISMATCH" : "");
            }
            /* graphs: one per variant, L launches */
            std::vector<cudaGraphExec_t> ge(nv);
            for (int v = 0; v < nv; v++) {
                lms_cu_set_att_mma(vars[v].mma);
                lms_cu_set_pdl(vars[v].pdl);
                cudaGraph_t g;
                CK(cudaStreamBeginCapture(st, cudaStreamCaptureModeGlobal));
                for (int l = 0; l < sh.L; l++) {
                    la[l].chunk = vars[v].chunk, la[l].cluster = vars[v].cluster && pos < cl_len;
                    CK((cudaError_t)lms_cu_attn_launch(&la[l], 1, st));
                }
                CK(cudaStreamEndCapture(st, &g));
                CK(cudaGraphInstantiate(&ge[v], g, 0));
                CK(cudaGraphDestroy(g));
            }
            std::vector<std::vector<double>> us(nv);
            cudaEvent_t e0, e1;
            CK(cudaEventCreate(&e0));
            CK(cudaEventCreate(&e1));
            for (int r = 0; r < rounds; r++)
                for (int v = 0; v < nv; v++) {
                    for (int i = 0; i < 3; i++) CK(cudaGraphLaunch(ge[v], st));
                    CK(cudaEventRecord(e0, st));
                    for (int i = 0; i < reps; i++) CK(cudaGraphLaunch(ge[v], st));
                    CK(cudaEventRecord(e1, st));
                    CK(cudaEventSynchronize(e1));
                    float ms;
                    CK(cudaEventElapsedTime(&ms, e0, e1));
                    us[v].push_back(ms * 1e3 / reps / sh.L);
                }
            for (int v = 0; v < nv; v++) {
                std::sort(us[v].begin(), us[v].end());
                printf("%s pos %d %-14s %7.2f us a layer (min %.2f max %.2f), %.3f ms a step\n", sh.name, pos,
                       vars[v].name, us[v][rounds / 2], us[v][0], us[v][rounds - 1], us[v][rounds / 2] * sh.L / 1e3);
            }
            for (int v = 0; v < nv; v++) CK(cudaGraphExecDestroy(ge[v]));
            CK(cudaFree(kvb));
            CK(cudaFree(dstep));
            CK(cudaFree(dinv));
            CK(cudaFree(dq));
            CK(cudaFree(dk));
            CK(cudaFree(dv));
            CK(cudaFree(dout));
            CK(cudaFree(part));
            CK(cudaFree(cnt));
            if (dqn) {
                CK(cudaFree(dqn));
                CK(cudaFree(dkn));
            }
        }
    }
    return 0;
}
