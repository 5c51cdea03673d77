/*
 * quant/quant.h - element encodings: the dtype table (names, element and
 * block sizes), GGUF's type numbers, and the reference dequantizers and
 * quantizers of every quantized encoding lmstore stores.
 *
 * Why a module of its own: the store needs the block sizes (import, verify,
 * export) and the quantizers (`lmstore quantize`); the engine's kernels need
 * the block layouts and a reference to test against. Both stand on this
 * folder, which stands on common only.
 *
 * "Reference" means bit-exact with the implementations we did not write:
 * the dequantizers give the float32 values of gguf-py's numpy dequantizers
 * (PyPI `gguf`, which follow ggml's dequantize_row_*), and the quantizers
 * give the bytes of gguf-py's quantize functions (Q8_0, Q4_0, Q4_1, Q5_0,
 * Q5_1), of ggml's quantize_row_*_ref (Q4_K, Q8_K), and of
 * mlx.core.quantize (MLX affine). The module is compiled without
 * floating-point contraction (-ffp-contract=off): a fused multiply-add
 * rounds once where numpy rounds twice.
 *
 * Block layouts (little-endian; "f16" is IEEE half):
 *   Q4_0  32: f16 d, u8 qs[16]             x = d * (q - 8), q = 4 bits: low nibbles are elements 0..15
 *   Q4_1  32: f16 d, f16 m, u8 qs[16]      x = d * q + m
 *   Q5_0  32: f16 d, u32 qh, u8 qs[16]     x = d * (q - 16), bit 4 of element j in bit j of qh
 *   Q5_1  32: f16 d, f16 m, u32 qh, qs[16] x = d * q + m
 *   Q8_0  32: f16 d, i8 qs[32]             x = d * q
 *   Q2_K 256: u8 scales[16], qs[64], f16 d, f16 dmin
 *   Q3_K 256: u8 hmask[32], qs[64], scales[12], f16 d
 *   Q4_K 256: f16 d, f16 dmin, u8 scales[12], qs[128]
 *   Q5_K 256: f16 d, f16 dmin, u8 scales[12], qh[32], qs[128]
 *   Q6_K 256: u8 ql[128], qh[64], i8 scales[16], f16 d
 *   Q8_K 256: f32 d, i8 qs[256], i16 bsums[16]
 *   MLX_AFFINE: codes of `bits` bits, a little-endian bit stream along the
 *         row (MLX stores it as uint32 words); per group of `group` codes a
 *         scale s and a bias b (separate tensors, dtype of the model):
 *         x = s * q + b.
 */
#ifndef LMS_QUANT_H
#define LMS_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "lmstore/types.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LMS__QK 32   /* elements of a Q4_0 .. Q8_0 block */
#define LMS__QK_K 256 /* elements of a K-quant super-block */

/* ---- GGUF type numbers (ggml's enum ggml_type) ----------------------------------- */

enum {
    LMS__GGML_F32 = 0, LMS__GGML_F16 = 1, LMS__GGML_Q4_0 = 2, LMS__GGML_Q4_1 = 3,
    LMS__GGML_Q5_0 = 6, LMS__GGML_Q5_1 = 7, LMS__GGML_Q8_0 = 8, LMS__GGML_Q8_1 = 9,
    LMS__GGML_Q2_K = 10, LMS__GGML_Q3_K = 11, LMS__GGML_Q4_K = 12, LMS__GGML_Q5_K = 13,
    LMS__GGML_Q6_K = 14, LMS__GGML_Q8_K = 15, LMS__GGML_I8 = 24, LMS__GGML_I16 = 25,
    LMS__GGML_I32 = 26, LMS__GGML_I64 = 27, LMS__GGML_F64 = 28, LMS__GGML_BF16 = 30,
};

/* The lms_dtype of GGUF type `ggml`; false for a type lmstore does not store
 * (an I-quant, Q8_1, an unknown number). */
bool lms__dtype_from_ggml(uint32_t ggml, lms_dtype *out);
/* The GGUF type number of t; false for dtypes GGUF has no number for
 * (BOOL, unsigned integers, F8, MLX_AFFINE). */
bool lms__dtype_to_ggml(lms_dtype t, uint32_t *out);
/* ggml's name of GGUF type `ggml` ("Q4_K", "IQ2_XXS", ...) for messages; "?" if unknown. */
const char *lms__ggml_type_name(uint32_t ggml);

/* True for the bits MLX_AFFINE has (2, 3, 4, 5, 6, 8). */
static inline bool lms__mlx_bits_ok(uint32_t bits) { return bits >= 2 && bits <= 8 && bits != 7; }
/* True for the group sizes MLX_AFFINE has (32, 64, 128). */
static inline bool lms__mlx_group_ok(uint32_t g) { return g == 32 || g == 64 || g == 128; }

/* ---- half-precision conversions (round to nearest even) ------------------------------ */
/* lms__f16_to_f32, lms__f32_to_f16, lms__bf16_to_f32, lms__f32_to_bf16: common/common.h */

/* x rounded to dtype t (F16, BF16; F32 unchanged), as a float. */
static inline float lms__round_to(float x, lms_dtype t)
{
    if (t == LMS_DTYPE_F16)
        return lms__f16_to_f32(lms__f32_to_f16(x));
    if (t == LMS_DTYPE_BF16)
        return lms__bf16_to_f32(lms__f32_to_bf16(x));
    return x;
}

/* The 6-bit scale and minimum of sub-block j (0..7) of a Q4_K / Q5_K
 * super-block's 12 scale bytes q (ggml's get_scale_min_k4). */
static inline void lms__k4_scale_min(const uint8_t *q, int j, int *sc, int *m)
{
    if (j < 4) {
        *sc = q[j] & 63;
        *m = q[j + 4] & 63;
    } else {
        *sc = (q[j + 4] & 0x0f) | ((q[j - 4] >> 6) << 4);
        *m = (q[j + 4] >> 4) | ((q[j] >> 6) << 4);
    }
}

/* ---- reference dequantization ---------------------------------------------------------- */

/*
 * n elements of a row of dtype t at src into dst (float32). t: F32, F16,
 * BF16 or a GGUF block type; n a multiple of the block. LMS_EINVAL for other
 * dtypes or a partial block (nothing written).
 */
int lms__dequant_row(lms_dtype t, const void *src, float *dst, size_t n);

/*
 * n elements of an MLX_AFFINE row: codes of `bits` bits at w (a bit stream
 * starting at bit 0 of w), the row's n/group scales and biases of dtype sdt
 * (F32, F16 or BF16) into dst. Computes what mlx.core.dequantize computes,
 * in the scales' dtype: s * q rounded to sdt, plus b rounded to sdt (the
 * results are sdt values, returned as float32). n a multiple of group.
 */
void lms__mlx_dequant_row(const void *w, uint32_t bits, uint32_t group, const void *scales, const void *biases,
                          lms_dtype sdt, float *dst, size_t n);

/* ---- reference quantization ------------------------------------------------------------- */

/* True for the dtypes lms__quant_row writes. */
bool lms__quant_supported(lms_dtype t);

/*
 * Quantize n floats (finite) of one row into dst (n / block elems blocks).
 * t: Q4_0, Q4_1, Q5_0, Q5_1, Q8_0 (bytes equal to gguf-py's quantize),
 * Q4_K, Q6_K and Q8_K (ggml's quantize_row_*_ref: what llama-quantize
 * writes without an importance matrix). LMS_EINVAL for another dtype or a partial
 * block (nothing written).
 */
int lms__quant_row(lms_dtype t, const float *src, void *dst, size_t n);

/*
 * MLX affine quantization of one row of n floats (n a multiple of group),
 * as mlx.core.quantize(w, group, bits) computes it for a row of w whose
 * dtype is sdt (F32, F16, BF16: the source's values are exactly
 * representable in it, and scales and biases are rounded to it). Writes
 * n * bits / 8 bytes of codes at w_out, n / group scales and biases of dtype
 * sdt.
 */
void lms__mlx_quant_row(const float *src, size_t n, uint32_t bits, uint32_t group, lms_dtype sdt, void *w_out,
                        void *scales, void *biases);

#ifdef __cplusplus
}
#endif
#endif
