/*
 * engine/cpu/quant.h - CPU matrix products over quantized weights read in
 * place (GGUF block types and MLX affine), for the engine's forward pass.
 *
 * The contract is lms__gemm_fn's (engine/internal.h):
 *   y[b*ldy + r] (=, or += with acc) sum_k W[r][k] * x[b*ldx + k]
 *   for r in [0, rows), b in [0, nb), k in [0, cols)
 * with W's row r at (const uint8_t *)W + r * ldw: ldw is in BYTES here
 * (a quantized row is blocks, not elements). x and y are float32.
 *
 * How each type is computed, as llama.cpp does it: the activations are
 * quantized per block to 8 bits and each block's products are summed in
 * integers, then scaled in float32:
 *   Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 against 32-element blocks {d, s, i8 q[32]}:
 *     ggml's x86 quantize_row_q8_1: q = round-to-nearest-even(x * 127 / amax),
 *     d = f16(amax / 127), s = f16(amax / 127 * sum(q))
 *   Q2_K .. Q6_K against 256-element Q8_K blocks {f32 d, i8 q[256], i16 sums of 16}
 *     (ggml's quantize_row_q8_K_ref)
 * so the activations are bit for bit what llama.cpp's CPU backend computes
 * with, and a result differs from the float32 dot of the dequantized
 * weights by at most sum over blocks of |w|_1 * d_x * (1/2 + 127 * 2^-11)
 * (the rounding of x to q, and of d to f16) plus |m| * |s| * 2^-11 for the
 * minimum of Q4_1 / Q5_1.
 * MLX affine keeps x in float32: y = sum over groups of s * (q . x) + b * sum(x).
 *
 * Kernel sets: "avx512" (AVX-512 F/BW/VL with VNNI: vpdpbusd), "avx2"
 * (AVX2 + FMA: vpmaddubsw), "generic" (portable C), chosen at run time
 * (LMSTORE_KERNELS=generic|avx2|avx512 forces one the CPU has). A NULL
 * entry falls back to the next set down; every set fills every entry.
 *
 * Memory: the lms__gemm_fn-shaped entries quantize x into a thread-local
 * buffer that grows to the largest (nb x cols) seen and is then reused, so
 * decode allocates nothing after its first token. Callers that share one
 * quantized x between threads use lms__qx_quantize + gemm_q.
 */
#ifndef LMS_ENGINE_CPU_QUANT_H
#define LMS_ENGINE_CPU_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "lmstore/types.h"
#include "quant/quant.h"

#ifdef __cplusplus
extern "C" {
#endif

/* An activation block for the 32-element types (ggml's block_q8_1 with its
 * two halves as float32 holding f16 values): x ~ d * q. */
typedef struct lms__q8a {
    float d;      /* amax / 127 rounded to f16, as ggml stores it */
    float s;      /* (amax / 127) * sum of q rounded to f16 (Q4_1 / Q5_1's minimum term) */
    int32_t sum;  /* the exact sum of q as stored (the offset correction of unsigned-code products) */
    int8_t q[32];
} lms__q8a;

/* An activation super-block for the K types (ggml's block_q8_K layout). */
typedef struct lms__q8k {
    float d;
    int8_t q[256];
    int16_t bsums[16]; /* sums of q in 16s */
} lms__q8k;

/* The lms__gemm_fn shape; ldw in bytes. */
typedef void (*lms__qgemm_fn)(const void *W, size_t ldw, const float *x, size_t ldx, float *y, size_t ldy, int rows,
                              int nb, int cols, bool acc);
/* The same over activations already quantized by lms__qx_quantize for this
 * dtype: vector b at (const uint8_t *)xq + b * lms__qx_row_bytes(dt, cols). */
typedef void (*lms__qgemm_q_fn)(const void *W, size_t ldw, const void *xq, float *y, size_t ldy, int rows, int nb,
                                int cols, bool acc);

/* An MLX_AFFINE matrix: codes (ldw bytes a row), and per row cols/group
 * scales and biases of dtype sdt (F32, F16, BF16), lds elements a row. */
typedef struct lms__mlx_mat {
    const void *w;
    size_t ldw;
    const void *scales, *biases;
    size_t lds;
    lms_dtype sdt;
    uint32_t bits, group;
} lms__mlx_mat;
typedef void (*lms__mlx_gemm_fn)(const lms__mlx_mat *W, const float *x, size_t ldx, float *y, size_t ldy, int rows,
                                 int nb, int cols, bool acc);

typedef struct lms__qkernels {
    const char *name;                       /* "avx512", "avx2", "generic" */
    lms__qgemm_fn gemm[LMS_DTYPE_COUNT_];     /* by weight dtype; NULL for dtypes without kernels */
    lms__qgemm_q_fn gemm_q[LMS_DTYPE_COUNT_];
    lms__mlx_gemm_fn mlx;                    /* bits 4 and 8 vectorized, the others portable */
    /* one activation row: form LMS_DTYPE_Q8_K (lms__q8k blocks) or, for any
     * other t, lms__q8a blocks; every set writes the same bytes */
    void (*qx)(lms_dtype form, const float *x, int cols, void *out);
} lms__qkernels;

/* True for the weight dtypes these kernels take: Q4_0, Q4_1, Q5_0, Q5_1,
 * Q8_0, Q2_K, Q3_K, Q4_K, Q5_K, Q6_K (MLX_AFFINE through ->mlx). */
bool lms__qkernel_supported(lms_dtype t);

/* Bytes of one quantized activation vector of `cols` for weights of dtype t. */
size_t lms__qx_row_bytes(lms_dtype t, int cols);
/* Quantize nb vectors (ldx apart) for weights of dtype t into xq (with the
 * best set's quantizer: all write the same bytes). */
void lms__qx_quantize(lms_dtype t, const float *x, size_t ldx, int nb, int cols, void *xq);
/* The portable quantizer of one activation block of `form` (as ->qx). */
void lms__qx_quantize_ref(lms_dtype form, const float *x, void *out);

/* The best set for this CPU (LMSTORE_KERNELS forces one); by name, NULL if
 * this CPU lacks it. */
const lms__qkernels *lms__qkernels_best(void);
const lms__qkernels *lms__qkernels_by_name(const char *name);

/* ---- shared by the kernel files (quant.c, quant_avx2.c, quant_avx512.c) ---- */

/* n bytes of this thread's activation buffer (grown, kept, 64-byte
 * aligned); NULL on ENOMEM. lms__qscratch is slot 0 (the lms__gemm_fn
 * entries' quantized x); slot 1 is a kernel's own working memory. */
void *lms__qscratch(size_t n);
void *lms__qscratch_slot(int slot, size_t n);
/* Scale or bias i of an MLX matrix's row data, as float. */
float lms__mlx_scale(const void *p, size_t i, lms_dtype t);

#ifdef __cplusplus
}
#endif
#endif
