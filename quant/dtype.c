/*
 * quant/dtype.c - the dtype table: names, element and block sizes of every
 * lms_dtype (lmstore/types.h), the byte size of a tensor, and the mapping
 * to and from GGUF's type numbers.
 */
#include <stdio.h>
#include <string.h>

#include "quant/quant.h"

static const struct {
    const char *name;
    uint32_t block_elems; /* 1 for plain dtypes; 0 for MLX_AFFINE (depends on bits) */
    uint32_t block_bytes;
    int ggml;             /* GGUF type number, -1 if none */
} dtypes[LMS_DTYPE_COUNT_] = {
    [LMS_DTYPE_BOOL] = {"BOOL", 1, 1, -1},
    [LMS_DTYPE_U8] = {"U8", 1, 1, -1},
    [LMS_DTYPE_I8] = {"I8", 1, 1, LMS__GGML_I8},
    [LMS_DTYPE_U16] = {"U16", 1, 2, -1},
    [LMS_DTYPE_I16] = {"I16", 1, 2, LMS__GGML_I16},
    [LMS_DTYPE_F16] = {"F16", 1, 2, LMS__GGML_F16},
    [LMS_DTYPE_BF16] = {"BF16", 1, 2, LMS__GGML_BF16},
    [LMS_DTYPE_U32] = {"U32", 1, 4, -1},
    [LMS_DTYPE_I32] = {"I32", 1, 4, LMS__GGML_I32},
    [LMS_DTYPE_F32] = {"F32", 1, 4, LMS__GGML_F32},
    [LMS_DTYPE_U64] = {"U64", 1, 8, -1},
    [LMS_DTYPE_I64] = {"I64", 1, 8, LMS__GGML_I64},
    [LMS_DTYPE_F64] = {"F64", 1, 8, LMS__GGML_F64},
    [LMS_DTYPE_F8_E4M3] = {"F8_E4M3", 1, 1, -1},
    [LMS_DTYPE_F8_E5M2] = {"F8_E5M2", 1, 1, -1},
    [LMS_DTYPE_Q4_0] = {"Q4_0", 32, 18, LMS__GGML_Q4_0},
    [LMS_DTYPE_Q4_1] = {"Q4_1", 32, 20, LMS__GGML_Q4_1},
    [LMS_DTYPE_Q5_0] = {"Q5_0", 32, 22, LMS__GGML_Q5_0},
    [LMS_DTYPE_Q5_1] = {"Q5_1", 32, 24, LMS__GGML_Q5_1},
    [LMS_DTYPE_Q8_0] = {"Q8_0", 32, 34, LMS__GGML_Q8_0},
    [LMS_DTYPE_Q2_K] = {"Q2_K", 256, 84, LMS__GGML_Q2_K},
    [LMS_DTYPE_Q3_K] = {"Q3_K", 256, 110, LMS__GGML_Q3_K},
    [LMS_DTYPE_Q4_K] = {"Q4_K", 256, 144, LMS__GGML_Q4_K},
    [LMS_DTYPE_Q5_K] = {"Q5_K", 256, 176, LMS__GGML_Q5_K},
    [LMS_DTYPE_Q6_K] = {"Q6_K", 256, 210, LMS__GGML_Q6_K},
    [LMS_DTYPE_Q8_K] = {"Q8_K", 256, 292, LMS__GGML_Q8_K},
    [LMS_DTYPE_MLX_AFFINE] = {"MLX_AFFINE", 0, 0, -1},
};

/* The models record's dtype mask has one bit per code. */
_Static_assert(LMS_DTYPE_COUNT_ <= 32, "dtype codes must stay below 32 (models record dtype mask)");

const char *lms_dtype_name(lms_dtype t) { return (unsigned)t < LMS_DTYPE_COUNT_ ? dtypes[t].name : NULL; }

size_t lms_dtype_size(lms_dtype t)
{
    return (unsigned)t < LMS_DTYPE_COUNT_ && dtypes[t].block_elems == 1 ? dtypes[t].block_bytes : 0;
}

bool lms_dtype_is_quantized(lms_dtype t) { return (unsigned)t < LMS_DTYPE_COUNT_ && dtypes[t].block_elems != 1; }

int lms_dtype_from_name(const char *name, lms_dtype *out)
{
    for (int i = 0; i < LMS_DTYPE_COUNT_; i++)
        if (name && !strcmp(name, dtypes[i].name)) {
            *out = (lms_dtype)i;
            return 0;
        }
    return lms__err(LMS_EFORMAT, "unknown dtype '%s'", name ? name : "(null)");
}

uint32_t lms_dtype_block_elems(lms_dtype t, uint32_t bits)
{
    if ((unsigned)t >= LMS_DTYPE_COUNT_)
        return 0;
    if (t == LMS_DTYPE_MLX_AFFINE)
        return lms__mlx_bits_ok(bits) ? 32 : 0;
    return dtypes[t].block_elems;
}

uint32_t lms_dtype_block_bytes(lms_dtype t, uint32_t bits)
{
    if ((unsigned)t >= LMS_DTYPE_COUNT_)
        return 0;
    if (t == LMS_DTYPE_MLX_AFFINE)
        return lms__mlx_bits_ok(bits) ? 4 * bits : 0;
    return dtypes[t].block_bytes;
}

int lms_dtype_nbytes(lms_dtype t, uint32_t bits, const uint64_t *shape, uint32_t ndim, uint64_t *out)
{
    uint32_t be = lms_dtype_block_elems(t, bits), bb = lms_dtype_block_bytes(t, bits);
    *out = 0;
    if (!be || ndim > LMS_MAX_DIMS)
        return lms__err(LMS_EINVAL, "dtype %s%s: no byte size (unknown dtype, bits or rank)",
                        lms_dtype_name(t) ? lms_dtype_name(t) : "?", t == LMS_DTYPE_MLX_AFFINE ? " with these bits" : "");
    if (be > 1 && ndim == 0)
        return lms__err(LMS_EINVAL, "a scalar cannot be stored as %s", lms_dtype_name(t));
    uint64_t n = 1;
    for (uint32_t i = 0; i + 1 < ndim; i++)
        if (lms__mul_overflow(n, shape[i], &n))
            return lms__err(LMS_ERANGE, "tensor size overflows 64 bits");
    uint64_t inner = ndim ? shape[ndim - 1] : 1;
    if (inner % be)
        return lms__err(LMS_EINVAL, "a row of %llu elements is not a whole number of %s blocks (%u elements)",
                        (unsigned long long)inner, lms_dtype_name(t), be);
    if (lms__mul_overflow(n, inner / be, &n) || lms__mul_overflow(n, bb, &n))
        return lms__err(LMS_ERANGE, "tensor size overflows 64 bits");
    *out = n;
    return 0;
}

bool lms__dtype_from_ggml(uint32_t ggml, lms_dtype *out)
{
    for (int i = 0; i < LMS_DTYPE_COUNT_; i++)
        if (dtypes[i].ggml >= 0 && (uint32_t)dtypes[i].ggml == ggml) {
            *out = (lms_dtype)i;
            return true;
        }
    return false;
}

bool lms__dtype_to_ggml(lms_dtype t, uint32_t *out)
{
    if ((unsigned)t >= LMS_DTYPE_COUNT_ || dtypes[t].ggml < 0)
        return false;
    *out = (uint32_t)dtypes[t].ggml;
    return true;
}

const char *lms__ggml_type_name(uint32_t ggml)
{
    static const char *const names[] = {
        "F32", "F16", "Q4_0", "Q4_1", "Q4_2", "Q4_3", "Q5_0", "Q5_1", "Q8_0", "Q8_1",
        "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "Q8_K", "IQ2_XXS", "IQ2_XS", "IQ3_XXS", "IQ1_S",
        "IQ4_NL", "IQ3_S", "IQ2_S", "IQ4_XS", "I8", "I16", "I32", "I64", "F64", "IQ1_M",
        "BF16", "Q4_0_4_4", "Q4_0_4_8", "Q4_0_8_8", "TQ1_0", "TQ2_0", "IQ4_NL_4_4", "IQ4_NL_4_8",
        "IQ4_NL_8_8", "MXFP4",
    };
    return ggml < LMS_ARRAY_LEN(names) ? names[ggml] : "?";
}
