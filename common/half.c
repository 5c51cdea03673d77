/*
 * common/half.c - conversions between float32 and the two 16-bit floats
 * model weights come in (IEEE half "f16" and bfloat16), rounding to nearest
 * even like numpy, PyTorch and ggml. Shared by the engine's kernels and the
 * quantizers (quant/), whose bytes must equal those references'.
 */
#include <math.h>
#include <string.h>

#include "common/common.h"

float lms__bf16_to_f32(uint16_t h)
{
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t lms__f32_to_bf16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    if ((u & 0x7fffffffu) > 0x7f800000u) /* NaN: keep it a NaN */
        return (uint16_t)((u >> 16) | 0x40);
    u += 0x7fffu + ((u >> 16) & 1); /* round to nearest even */
    return (uint16_t)(u >> 16);
}

float lms__f16_to_f32(uint16_t h)
{
    uint32_t s = (uint32_t)(h & 0x8000) << 16, e = (h >> 10) & 0x1f, m = h & 0x3ff, u;
    if (e == 0) {
        if (m == 0) {
            u = s;
        } else { /* subnormal: renormalize */
            e = 127 - 15 + 1;
            while (!(m & 0x400)) {
                m <<= 1;
                e--;
            }
            u = s | (e << 23) | ((m & 0x3ff) << 13);
        }
    } else if (e == 31) {
        u = s | 0x7f800000u | (m << 13);
    } else {
        u = s | ((e + 127 - 15) << 23) | (m << 13);
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

uint16_t lms__f32_to_f16(float f)
{
    uint32_t u;
    memcpy(&u, &f, 4);
    uint32_t s = (u >> 16) & 0x8000;
    uint32_t a = u & 0x7fffffffu;
    if (a > 0x7f800000u)
        return (uint16_t)(s | 0x7e00); /* NaN */
    if (a >= 0x477ff000u)              /* rounds to >= 65520: inf */
        return (uint16_t)(s | 0x7c00);
    if (a < 0x38800000u) { /* subnormal or zero in f16 */
        float af;
        memcpy(&af, &a, 4);
        /* scale so that the f16 subnormal step (2^-24) becomes 1, round to nearest even */
        float r = nearbyintf(af * 16777216.0f);
        return (uint16_t)(s | (uint32_t)r);
    }
    uint32_t m = a + 0xfffu + ((a >> 13) & 1); /* round mantissa to 10 bits, nearest even */
    return (uint16_t)(s | (((m >> 13) - ((127 - 15) << 10)) & 0x7fff));
}

