/*
 * bench/mlx_gemv.cu - the MLX affine GEMV of the CUDA backend on its own:
 * every one-row kernel (int8 activations, and f32 ones with exact = 1)
 * against a float64 product on random codes, bf16 scales and biases and x
 * (relative error of the largest output; int8 must stay under 1e-2, f32
 * under 1e-4), then each one's time and bandwidth at Llama-3-8B's shapes
 * (4- and 8-bit codes, groups of 64), rotating over copies of the matrices
 * so that HBM, not L2, serves them. Not part of the build; on a GPU host:
 *
 *   nvcc -arch=sm_90 -O3 -I. -Iinclude -o mlx_gemv bench/mlx_gemv.cu && ./mlx_gemv
 *
 * -DMLXQ_TH=256 -DMLXQ_BLOCKS=2 builds the int8 kernel's earlier launch shape
 * (2 blocks of 256 threads a multiprocessor instead of 1 of 512).
 *
 * NOTIME=1 skips the timings; SHAPES=o,down (names) times only those; BITS8=1
 * times 8-bit codes too; NOEXACT=1 skips the f32-activation kernel; SB=0|1
 * picks how scales and biases are read (lms_cu_set_mlx_sb). Each shape's
 * line "read" is a plain read of the same bytes (read_kernel), what HBM gives
 * a launch of that size. Exit status 1 when a check fails.
 */
#include "engine/cuda/kernels.cu"
#include "bench/cuda_check.h"
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>
static uint64_t rs = 88172645463325252ull;
static float frand() {
    rs ^= rs << 13;
    rs ^= rs >> 7;
    rs ^= rs << 17;
    return (float)((rs >> 40) / (double)(1ull << 24)) * 2.0f - 1.0f;
}
static uint16_t bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}
static float unbf(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}
struct M {
    int rows, K, gs, bits;
    std::vector<uint8_t> codes;
    std::vector<uint16_t> sc, bi;
    void *dw, *ds, *db;
};
static void make(M &m, int rows, int K, int gs, int bits) {
    m.rows = rows, m.K = K, m.gs = gs, m.bits = bits;
    size_t nb = (size_t)rows * K * bits / 8, ns = (size_t)rows * (K / gs);
    m.codes.resize(nb);
    m.sc.resize(ns);
    m.bi.resize(ns);
    for (auto &c : m.codes)
        c = (uint8_t)(rs = rs * 6364136223846793005ull + 1, rs >> 56);
    float scale = 1.0f / sqrtf((float)K);
    for (size_t i = 0; i < ns; i++) {
        m.sc[i] = bf(2 * scale / ((1 << bits) - 1) * (0.75f + 0.25f * frand()));
        m.bi[i] = bf(-scale * (1 + 0.1f * frand()));
    }
    CK(cudaMalloc(&m.dw, nb));
    CK(cudaMalloc(&m.ds, ns * 2));
    CK(cudaMalloc(&m.db, ns * 2));
    CK(cudaMemcpy(m.dw, m.codes.data(), nb, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(m.ds, m.sc.data(), ns * 2, cudaMemcpyHostToDevice));
    CK(cudaMemcpy(m.db, m.bi.data(), ns * 2, cudaMemcpyHostToDevice));
}
static double wv(const M &m, int r, int k) {
    size_t bit = ((size_t)r * m.K + k) * m.bits;
    uint32_t q = (m.codes[bit / 8] >> (bit % 8)) & ((1u << m.bits) - 1);
    size_t g = (size_t)r * (m.K / m.gs) + k / m.gs;
    return (double)unbf(m.sc[g]) * q + unbf(m.bi[g]);
}
/* a plain read of the same bytes (codes, scales, biases), 8 blocks of 256 a multiprocessor,
 * 4 16-byte loads a thread in flight: what HBM gives a launch of that size */
__global__ void __launch_bounds__(256) read_kernel(const uint4 *p, size_t n, const uint4 *q, size_t nq, const uint4 *r,
                                                   unsigned *sink) {
    uint32_t acc = 0;
    const size_t stride = (size_t)gridDim.x * 256;
    size_t i = (size_t)blockIdx.x * 256 + threadIdx.x;
    for (; i + 3 * stride < n; i += 4 * stride) {
        uint4 v[4];
#pragma unroll
        for (int u = 0; u < 4; u++) v[u] = ld_stream(p + i + u * stride);
#pragma unroll
        for (int u = 0; u < 4; u++) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
    }
    for (; i < n; i += stride) {
        uint4 v = ld_stream(p + i);
        acc ^= v.x ^ v.y ^ v.z ^ v.w;
    }
    for (size_t j = (size_t)blockIdx.x * 256 + threadIdx.x; j < nq; j += stride) {
        uint4 v = ld_stream(q + j), w = ld_stream(r + j);
        acc ^= v.x ^ w.y;
    }
    if (acc == 0x12345678u)
        *sink = acc;
}
int main(int argc, char **argv) {
    if (getenv("SB")) /* the scales' and biases' loads (lms_cu_set_mlx_sb) */
        lms_cu_set_mlx_sb(atoi(getenv("SB")));
    int32_t hstep[16] = {1, 0};
    int32_t *dstep;
    CK(cudaMalloc(&dstep, 64));
    CK(cudaMemcpy(dstep, hstep, 64, cudaMemcpyHostToDevice));
    struct {
        int rows, K, gs, bits;
    } cfg[] = {{64, 64, 32, 4},    {64, 256, 64, 4},  {64, 512, 128, 4}, {64, 576, 32, 8},
               {64, 1024, 128, 4}, {64, 4096, 64, 4}, {64, 4096, 64, 8}, {64, 14336, 64, 4}};
    int fails = 0;
    for (auto &c : cfg) {
        M m;
        make(m, c.rows, c.K, c.gs, c.bits);
        std::vector<float> x(c.K);
        for (int k = 0; k < c.K; k++)
            x[k] = 2 * frand();
        std::vector<double> ref(c.rows);
        double mx = 0;
        for (int r = 0; r < c.rows; r++) {
            double s = 0;
            for (int k = 0; k < c.K; k++)
                s += wv(m, r, k) * x[k];
            ref[r] = s;
            mx = fmax(mx, fabs(s));
        }
        float *dx, *dy;
        CK(cudaMalloc(&dx, c.K * 4));
        CK(cudaMalloc(&dy, c.rows * 4));
        CK(cudaMemcpy(dx, x.data(), c.K * 4, cudaMemcpyHostToDevice));
        for (int ex = 0; ex < 2; ex++) {
            lms_cu_gemv a;
            memset(&a, 0, sizeof a);
            a.w[0] = m.dw;
            a.scales[0] = m.ds;
            a.biases[0] = m.db;
            a.y[0] = dy;
            a.rows[0] = c.rows;
            a.ldy[0] = c.rows;
            a.n_jobs = 1;
            a.K = c.K;
            a.x = dx;
            a.ldx = c.K;
            a.group = c.gs;
            a.step = dstep;
            a.nb_max = 1;
            a.exact = ex;
            CK(cudaMemset(dy, 0xff, c.rows * 4));
            CK((cudaError_t)lms_cu_gemv_mlx_launch(&a, c.bits, LMS_CU_BF16, 0));
            CK(cudaDeviceSynchronize());
            std::vector<float> y(c.rows);
            CK(cudaMemcpy(y.data(), dy, c.rows * 4, cudaMemcpyDeviceToHost));
            double md = 0;
            int at = 0;
            for (int r = 0; r < c.rows; r++) {
                double d = fabs(y[r] - ref[r]);
                if (!(d <= md))
                    md = d, at = r;
            }
            printf("rows %d K %5d gs %3d bits %d %s: rel err %.3g (row %d: %g vs %g)\n", c.rows, c.K, c.gs, c.bits,
                   ex ? "exact" : "int8 ", md / mx, at, y[at], ref[at]);
            if (!(md / mx < (ex ? 1e-4 : 1e-2)))
                fails++;
        }
    }
    if (getenv("NOTIME"))
        return fails != 0;
    // timing at 8B shapes, 4-bit and 8-bit, group 64
    struct {
        int rows, K, pair;
        const char *name;
    } sh[] = {{6144, 4096, 0, "qkv"},
              {4096, 4096, 0, "o"},
              {14336, 4096, 1, "gate/up"},
              {4096, 14336, 0, "down"},
              {128256, 4096, 0, "head"}};
    const char *only = getenv("SHAPES"); /* e.g. "o,down" */
    const int maxbits = getenv("BITS8") ? 8 : 4;
    unsigned *sink;
    CK(cudaMalloc(&sink, 4));
    int sms = 132;
    cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, 0);
    for (int bits = 4; bits <= maxbits; bits += 4)
        for (auto &s : sh) {
            if (only && !strstr(only, s.name))
                continue;
            int nw = s.pair ? 2 : 1;
            M m[2];
            for (int j = 0; j < nw; j++)
                make(m[j], s.rows, s.K, 64, bits);
            /* copies of the matrices, so that repeated launches read HBM, not L2 */
            size_t cb = (size_t)s.rows * s.K * bits / 8, sb = (size_t)s.rows * (s.K / 64) * 2;
            int ncopy = (int)(512e6 / (nw * (cb + 2 * sb))) + 1;
            std::vector<void *> cw, cs, cbi;
            for (int i = 0; i < ncopy * nw; i++) {
                void *p, *q, *r;
                CK(cudaMalloc(&p, cb));
                CK(cudaMalloc(&q, sb));
                CK(cudaMalloc(&r, sb));
                CK(cudaMemcpy(p, m[i % nw].dw, cb, cudaMemcpyDeviceToDevice));
                CK(cudaMemcpy(q, m[i % nw].ds, sb, cudaMemcpyDeviceToDevice));
                CK(cudaMemcpy(r, m[i % nw].db, sb, cudaMemcpyDeviceToDevice));
                cw.push_back(p);
                cs.push_back(q);
                cbi.push_back(r);
            }
            float *dx, *dy, *dh;
            CK(cudaMalloc(&dx, s.K * 4));
            CK(cudaMalloc(&dy, 2 * (size_t)s.rows * 4));
            CK(cudaMalloc(&dh, (size_t)s.rows * 4));
            std::vector<float> x(s.K);
            for (auto &v : x)
                v = frand();
            CK(cudaMemcpy(dx, x.data(), s.K * 4, cudaMemcpyHostToDevice));
            {
                cudaEvent_t e0, e1;
                cudaEventCreate(&e0);
                cudaEventCreate(&e1);
                const int reps = 50;
                for (int i = -5; i < reps; i++) {
                    if (i == 0)
                        cudaEventRecord(e0);
                    for (int j = 0; j < nw; j++) {
                        int c = ((i + 5) % ncopy) * nw + j;
                        read_kernel<<<8 * sms, 256>>>((const uint4 *)cw[c], cb / 16, (const uint4 *)cs[c], sb / 16,
                                                      (const uint4 *)cbi[c], sink);
                    }
                }
                cudaEventRecord(e1);
                CK(cudaEventSynchronize(e1));
                float ms;
                cudaEventElapsedTime(&ms, e0, e1);
                double bytes = nw * ((double)s.rows * s.K * bits / 8 + (double)s.rows * (s.K / 64) * 4);
                printf("%-8s bits %d %s: %7.2f us  %6.0f GB/s\n", s.name, bits, "read ", ms * 1e3 / reps,
                       bytes / (ms * 1e-3 / reps) / 1e9);
            }
            for (int ex = 0; ex < (getenv("NOEXACT") ? 1 : 2); ex++) {
                lms_cu_gemv a;
                memset(&a, 0, sizeof a);
                for (int j = 0; j < nw; j++) {
                    a.w[j] = m[j].dw;
                    a.scales[j] = m[j].ds;
                    a.biases[j] = m[j].db;
                    a.y[j] = dy + (size_t)j * s.rows;
                    a.rows[j] = s.rows;
                    a.ldy[j] = s.rows;
                }
                a.n_jobs = nw;
                a.K = s.K;
                a.x = dx;
                a.ldx = s.K;
                a.group = 64;
                a.step = dstep;
                a.nb_max = 1;
                a.exact = ex;
                a.pair_act = s.pair ? LMS_CU_PRO_SILU : 0;
                a.h = dh;
                a.ldh = s.rows;
                cudaEvent_t e0, e1;
                cudaEventCreate(&e0);
                cudaEventCreate(&e1);
                for (int i = 0; i < 5; i++)
                    CK((cudaError_t)lms_cu_gemv_mlx_launch(&a, bits, LMS_CU_BF16, 0));
                const int reps = 50;
                cudaEventRecord(e0);
                for (int i = 0; i < reps; i++) {
                    for (int j = 0; j < nw; j++) {
                        int c = (i % ncopy) * nw + j;
                        a.w[j] = cw[c];
                        a.scales[j] = cs[c];
                        a.biases[j] = cbi[c];
                    }
                    lms_cu_gemv_mlx_launch(&a, bits, LMS_CU_BF16, 0);
                }
                cudaEventRecord(e1);
                CK(cudaEventSynchronize(e1));
                float ms;
                cudaEventElapsedTime(&ms, e0, e1);
                double bytes = nw * ((double)s.rows * s.K * bits / 8 + (double)s.rows * (s.K / 64) * 4);
                printf("%-8s bits %d %s: %7.2f us  %6.0f GB/s\n", s.name, bits, ex ? "exact" : "int8 ", ms * 1e3 / reps,
                       bytes / (ms * 1e-3 / reps) / 1e9);
            }
            for (int j = 0; j < nw; j++) {
                cudaFree(m[j].dw);
                cudaFree(m[j].ds);
                cudaFree(m[j].db);
            }
            for (size_t i = 0; i < cw.size(); i++) {
                cudaFree(cw[i]);
                cudaFree(cs[i]);
                cudaFree(cbi[i]);
            }
            cudaFree(dx);
            cudaFree(dy);
            cudaFree(dh);
        }
    printf("%s\n", fails ? "CHECK FAILED" : "check ok");
    cudaFree(sink);
    return fails != 0;
}
