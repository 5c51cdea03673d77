/*
 * quant/quantize.c - reference quantizers: float32 rows into GGUF blocks
 * and MLX affine codes.
 *
 * Q4_0, Q4_1, Q5_0, Q5_1 and Q8_0 compute what gguf-py's quantize functions
 * compute (which equal ggml's quantize_row_*_ref), Q4_K, Q6_K and Q8_K what
 * ggml's quantize_row_q4_K_ref / _q6_K_ref / _q8_K_ref compute (the path
 * llama-quantize takes without an importance matrix), and MLX affine what
 * mlx.core.quantize computes on its CPU backend. Same operations in the
 * same order, each float32 result rounded once (-ffp-contract=off), so the
 * bytes are equal (tests/quant/).
 */
#include <math.h>
#include <string.h>

#include "quant/quant.h"

static inline void put_f16(uint8_t *p, float f) { lms__put_u16(p, lms__f32_to_f16(f)); }
static inline float h2f(const uint8_t *p) { return lms__f16_to_f32(lms__get_u16(p)); }

/* ggml's nearest_int: round half to even for |x| < 2^22 (the magic-number trick). */
static inline int nearest_int(float f)
{
    float v = f + 12582912.f;
    int32_t i;
    memcpy(&i, &v, 4);
    return (i & 0x007fffff) - 0x00400000;
}

/* numpy's (and ggml's, on x86) float -> 8-bit integer conversion: truncate
 * toward zero through a 32-bit integer, whose value for infinity, NaN and
 * out-of-range input is INT32_MIN (cvttss2si), then keep the low byte. A
 * block of subnormals makes 1/d infinite, and these are its codes. */
static inline uint8_t cvt_u8(float v)
{
    int32_t i = v > -2147483648.f && v < 2147483648.f ? (int32_t)v : INT32_MIN;
    return (uint8_t)i;
}

/* The first element of largest magnitude: numpy's x[argmax(abs(x))], also
 * for a block of zeros (then x[0], whose sign makes d -0 or +0). */
static float signed_absmax(const float *x, int n)
{
    float amax = fabsf(x[0]), max = x[0];
    for (int j = 1; j < n; j++)
        if (amax < fabsf(x[j])) {
            amax = fabsf(x[j]);
            max = x[j];
        }
    return max;
}

static void min_max(const float *x, int n, float *mn, float *mx)
{
    float a = x[0], b = x[0];
    for (int j = 1; j < n; j++) {
        if (x[j] < a) a = x[j];
        if (x[j] > b) b = x[j];
    }
    *mn = a;
    *mx = b;
}

/* Q4_0 (bits 4) and Q5_0 (bits 5): d = the largest-magnitude value / -2^(bits-1),
 * codes truncated from x/d + 2^(bits-1) + 0.5; Q5_0's fifth bits in a u32 after d. */
static void q_sym(const float *x, uint8_t *b, int bits)
{
    const int half = 1 << (bits - 1), top = (1 << bits) - 1;
    float d = signed_absmax(x, 32) / (float)-half, id = d != 0 ? 1.f / d : 0.f;
    uint8_t *qs = b + (bits == 5 ? 6 : 2);
    uint32_t qh = 0;
    put_f16(b, d);
    for (int j = 0; j < 16; j++) {
        int q0 = LMS_MIN(top, cvt_u8(x[j] * id + ((float)half + 0.5f)));
        int q1 = LMS_MIN(top, cvt_u8(x[j + 16] * id + ((float)half + 0.5f)));
        qs[j] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
        qh |= (uint32_t)(q0 >> 4) << j;
        qh |= (uint32_t)(q1 >> 4) << (j + 16);
    }
    if (bits == 5)
        lms__put_u32(b + 2, qh);
}

/* Q4_1 (bits 4) and Q5_1 (bits 5): d = (max - min) / (2^bits - 1), m = min,
 * codes truncated from (x - min)/d + 0.5; Q5_1's fifth bits in a u32 after d, m. */
static void q_min(const float *x, uint8_t *b, int bits)
{
    const int top = (1 << bits) - 1;
    float mn, mx;
    min_max(x, 32, &mn, &mx);
    float d = (mx - mn) / (float)top, id = d != 0 ? 1.f / d : 0.f;
    uint8_t *qs = b + (bits == 5 ? 8 : 4);
    uint32_t qh = 0;
    put_f16(b, d);
    put_f16(b + 2, mn);
    for (int j = 0; j < 16; j++) {
        int q0 = LMS_MIN(top, cvt_u8((x[j] - mn) * id + 0.5f));
        int q1 = LMS_MIN(top, cvt_u8((x[j + 16] - mn) * id + 0.5f));
        qs[j] = (uint8_t)((q0 & 0x0f) | ((q1 & 0x0f) << 4));
        qh |= (uint32_t)(q0 >> 4) << j;
        qh |= (uint32_t)(q1 >> 4) << (j + 16);
    }
    if (bits == 5)
        lms__put_u32(b + 4, qh);
}

static void q4_0(const float *x, uint8_t *b) { q_sym(x, b, 4); }
static void q5_0(const float *x, uint8_t *b) { q_sym(x, b, 5); }
static void q4_1(const float *x, uint8_t *b) { q_min(x, b, 4); }
static void q5_1(const float *x, uint8_t *b) { q_min(x, b, 5); }

static void q8_0(const float *x, uint8_t *b)
{
    float amax = 0;
    for (int j = 0; j < 32; j++)
        amax = LMS_MAX(amax, fabsf(x[j]));
    float d = amax / 127.f, id = d != 0 ? 1.f / d : 0.f;
    put_f16(b, d);
    for (int j = 0; j < 32; j++)
        b[2 + j] = cvt_u8(roundf(x[j] * id));
}

/* ggml's make_qkx2_quants: scale and (negated) min of n values with weights,
 * codes 0..nmax in L, searching nstep+1 candidate scales. */
static float make_qkx2(int n, int nmax, const float *x, const float *w, uint8_t *L, float *the_min, uint8_t *Laux,
                       float rmin, float rdelta, int nstep)
{
    float mn = x[0], mx = x[0], sum_w = w[0], sum_x = sum_w * x[0];
    for (int i = 1; i < n; i++) {
        if (x[i] < mn) mn = x[i];
        if (x[i] > mx) mx = x[i];
        sum_w += w[i];
        sum_x += w[i] * x[i];
    }
    if (mn > 0)
        mn = 0;
    if (mx == mn) {
        memset(L, 0, (size_t)n);
        *the_min = -mn;
        return 0.f;
    }
    float iscale = nmax / (mx - mn), scale = 1 / iscale, best = 0;
    for (int i = 0; i < n; i++) {
        int l = nearest_int(iscale * (x[i] - mn));
        L[i] = (uint8_t)LMS_MAX(0, LMS_MIN(nmax, l));
        float diff = scale * L[i] + mn - x[i];
        best += w[i] * (diff * diff);
    }
    for (int is = 0; is <= nstep; is++) {
        iscale = (rmin + rdelta * is + nmax) / (mx - mn);
        float sum_l = 0, sum_l2 = 0, sum_xl = 0;
        for (int i = 0; i < n; i++) {
            int l = LMS_MAX(0, LMS_MIN(nmax, nearest_int(iscale * (x[i] - mn))));
            Laux[i] = (uint8_t)l;
            sum_l += w[i] * l;
            sum_l2 += w[i] * l * l;
            sum_xl += w[i] * l * x[i];
        }
        float D = sum_w * sum_l2 - sum_l * sum_l;
        if (D > 0) {
            float this_scale = (sum_w * sum_xl - sum_x * sum_l) / D;
            float this_min = (sum_l2 * sum_x - sum_l * sum_xl) / D;
            if (this_min > 0) {
                this_min = 0;
                this_scale = sum_xl / sum_l2;
            }
            float err = 0;
            for (int i = 0; i < n; i++) {
                float diff = this_scale * Laux[i] + this_min - x[i];
                err += w[i] * (diff * diff);
            }
            if (err < best) {
                memcpy(L, Laux, (size_t)n);
                best = err;
                scale = this_scale;
                mn = this_min;
            }
        }
    }
    *the_min = -mn;
    return scale;
}

static void q4_k(const float *x, uint8_t *b)
{
    uint8_t L[256], Laux[32];
    float w[32], mins[8], scales[8], max_scale = 0, max_min = 0;
    uint8_t *sc = b + 4, *qs = b + 16;
    for (int j = 0; j < 8; j++) {
        const float *xj = x + 32 * j;
        float sum_x2 = 0;
        for (int l = 0; l < 32; l++)
            sum_x2 += xj[l] * xj[l];
        float av_x = sqrtf(sum_x2 / 32);
        for (int l = 0; l < 32; l++)
            w[l] = av_x + fabsf(xj[l]);
        scales[j] = make_qkx2(32, 15, xj, w, L + 32 * j, &mins[j], Laux, -1.f, 0.1f, 20);
        if (scales[j] > max_scale) max_scale = scales[j];
        if (mins[j] > max_min) max_min = mins[j];
    }
    float inv_scale = max_scale > 0 ? 63.f / max_scale : 0.f, inv_min = max_min > 0 ? 63.f / max_min : 0.f;
    memset(sc, 0, 12);
    for (int j = 0; j < 8; j++) {
        uint8_t ls = (uint8_t)LMS_MIN(63, (uint8_t)nearest_int(inv_scale * scales[j]));
        uint8_t lm = (uint8_t)LMS_MIN(63, (uint8_t)nearest_int(inv_min * mins[j]));
        if (j < 4) {
            sc[j] = ls;
            sc[j + 4] = lm;
        } else {
            sc[j + 4] = (uint8_t)((ls & 0x0f) | ((lm & 0x0f) << 4));
            sc[j - 4] |= (uint8_t)((ls >> 4) << 6);
            sc[j] |= (uint8_t)((lm >> 4) << 6);
        }
    }
    put_f16(b, max_scale / 63.f);
    put_f16(b + 2, max_min / 63.f);
    float d = h2f(b), dmin = h2f(b + 2);
    for (int j = 0; j < 8; j++) {
        int s, m;
        lms__k4_scale_min(sc, j, &s, &m);
        float dd = d * s;
        if (dd == 0)
            continue;
        float dm = dmin * m;
        for (int l = 0; l < 32; l++)
            L[32 * j + l] = (uint8_t)LMS_MAX(0, LMS_MIN(15, nearest_int((x[32 * j + l] + dm) / dd)));
    }
    for (int j = 0; j < 256; j += 64)
        for (int l = 0; l < 32; l++)
            qs[j / 2 + l] = (uint8_t)(L[j + l] | (L[j + l + 32] << 4));
}

/* ggml's make_qx_quants with rmse_type 1 and no importance weights: the
 * scale of n values into codes [-nmax, nmax) (L = code + nmax) that best
 * fits them with weights x^2, searched over 19 candidate scales. */
static float make_qx(int n, int nmax, const float *x, int8_t *L)
{
    float max = 0, amax = 0;
    for (int i = 0; i < n; i++) {
        float ax = fabsf(x[i]);
        if (ax > amax) {
            amax = ax;
            max = x[i];
        }
    }
    if (amax < 1e-15f) {
        memset(L, 0, (size_t)n);
        return 0.f;
    }
    float iscale = -nmax / max, sumlx = 0, suml2 = 0;
    for (int i = 0; i < n; i++) {
        int l = LMS_MAX(-nmax, LMS_MIN(nmax - 1, nearest_int(iscale * x[i])));
        L[i] = (int8_t)(l + nmax);
        float w = x[i] * x[i];
        sumlx += w * x[i] * (float)l;
        suml2 += w * (float)l * (float)l;
    }
    float scale = suml2 != 0 ? sumlx / suml2 : 0.0f, best = scale * sumlx;
    for (int is = -9; is <= 9; is++) {
        if (is == 0)
            continue;
        iscale = -((float)nmax + 0.1f * (float)is) / max;
        sumlx = suml2 = 0;
        for (int i = 0; i < n; i++) {
            int l = LMS_MAX(-nmax, LMS_MIN(nmax - 1, nearest_int(iscale * x[i])));
            float w = x[i] * x[i];
            sumlx += w * x[i] * (float)l;
            suml2 += w * (float)l * (float)l;
        }
        if (suml2 > 0 && sumlx * sumlx > best * suml2) {
            for (int i = 0; i < n; i++)
                L[i] = (int8_t)(nmax + LMS_MAX(-nmax, LMS_MIN(nmax - 1, nearest_int(iscale * x[i]))));
            scale = sumlx / suml2;
            best = scale * sumlx;
        }
    }
    return scale;
}

/* Q6_K: 16 groups of 16 with 8-bit scales of one f16 d, 6-bit codes (ggml's quantize_row_q6_K_ref). */
static void q6_k(const float *x, uint8_t *b)
{
    int8_t L[256];
    float scales[16], max_scale = 0, max_abs_scale = 0;
    uint8_t *ql = b, *qh = b + 128;
    int8_t *sc = (int8_t *)(b + 192);
    for (int ib = 0; ib < 16; ib++) {
        float scale = make_qx(16, 32, x + 16 * ib, L + 16 * ib);
        scales[ib] = scale;
        if (fabsf(scale) > max_abs_scale) {
            max_abs_scale = fabsf(scale);
            max_scale = scale;
        }
    }
    if (max_abs_scale < 1e-15f) {
        memset(b, 0, 210);
        return;
    }
    float iscale = -128.f / max_scale;
    put_f16(b + 208, 1 / iscale);
    for (int ib = 0; ib < 16; ib++)
        sc[ib] = (int8_t)LMS_MIN(127, nearest_int(iscale * scales[ib]));
    for (int j = 0; j < 16; j++) {
        float d = h2f(b + 208) * (float)sc[j];
        if (d == 0)
            continue;
        for (int i = 0; i < 16; i++)
            L[16 * j + i] = (int8_t)(LMS_MAX(-32, LMS_MIN(31, nearest_int(x[16 * j + i] / d))) + 32);
    }
    for (int j = 0; j < 256; j += 128) {
        for (int l = 0; l < 32; l++) {
            uint8_t q1 = L[j + l] & 0xF, q2 = L[j + l + 32] & 0xF, q3 = L[j + l + 64] & 0xF, q4 = L[j + l + 96] & 0xF;
            ql[l] = (uint8_t)(q1 | (q3 << 4));
            ql[l + 32] = (uint8_t)(q2 | (q4 << 4));
            qh[l] = (uint8_t)((L[j + l] >> 4) | ((L[j + l + 32] >> 4) << 2) | ((L[j + l + 64] >> 4) << 4) |
                              ((L[j + l + 96] >> 4) << 6));
        }
        ql += 64;
        qh += 32;
    }
}

static void q8_k(const float *x, uint8_t *b)
{
    float max = signed_absmax(x, 256);
    int8_t *qs = (int8_t *)(b + 4);
    if (max == 0) {
        memset(b, 0, 292);
        return;
    }
    float iscale = -127.f / max, d = 1 / iscale;
    for (int j = 0; j < 256; j++)
        qs[j] = (int8_t)LMS_MIN(127, nearest_int(iscale * x[j]));
    for (int j = 0; j < 16; j++) {
        int sum = 0;
        for (int l = 0; l < 16; l++)
            sum += qs[16 * j + l];
        lms__put_u16(b + 260 + 2 * j, (uint16_t)(int16_t)sum);
    }
    memcpy(b, &d, 4);
}

bool lms__quant_supported(lms_dtype t)
{
    switch (t) {
    case LMS_DTYPE_Q4_0: case LMS_DTYPE_Q4_1: case LMS_DTYPE_Q5_0: case LMS_DTYPE_Q5_1:
    case LMS_DTYPE_Q8_0: case LMS_DTYPE_Q4_K: case LMS_DTYPE_Q6_K: case LMS_DTYPE_Q8_K: return true;
    default: return false;
    }
}

int lms__quant_row(lms_dtype t, const float *src, void *dst, size_t n)
{
    void (*fn)(const float *, uint8_t *) = NULL;
    switch (t) {
    case LMS_DTYPE_Q4_0: fn = q4_0; break;
    case LMS_DTYPE_Q4_1: fn = q4_1; break;
    case LMS_DTYPE_Q5_0: fn = q5_0; break;
    case LMS_DTYPE_Q5_1: fn = q5_1; break;
    case LMS_DTYPE_Q8_0: fn = q8_0; break;
    case LMS_DTYPE_Q4_K: fn = q4_k; break;
    case LMS_DTYPE_Q6_K: fn = q6_k; break;
    case LMS_DTYPE_Q8_K: fn = q8_k; break;
    default:
        return lms__err(LMS_EINVAL, "no quantizer for dtype %s", lms_dtype_name(t) ? lms_dtype_name(t) : "?");
    }
    uint32_t be = lms_dtype_block_elems(t, 0), bb = lms_dtype_block_bytes(t, 0);
    if (n % be)
        return lms__err(LMS_EINVAL, "%zu elements are not a whole number of %s blocks", n, lms_dtype_name(t));
    uint8_t *out = dst;
    for (size_t i = 0; i < n / be; i++)
        fn(src + i * be, out + i * bb);
    return 0;
}

/* ---- MLX affine ------------------------------------------------------------------------ */

static inline void store_sdt(void *p, size_t i, float x, lms_dtype sdt)
{
    uint8_t *b = p;
    if (sdt == LMS_DTYPE_F32)
        memcpy(b + 4 * i, &x, 4);
    else
        lms__put_u16(b + 2 * i, sdt == LMS_DTYPE_F16 ? lms__f32_to_f16(x) : lms__f32_to_bf16(x));
}

void lms__mlx_quant_row(const float *src, size_t n, uint32_t bits, uint32_t group, lms_dtype sdt, void *w_out,
                        void *scales, void *biases)
{
    uint8_t *w = w_out;
    float n_bins = (float)((1u << bits) - 1);
    memset(w, 0, n * bits / 8);
    for (size_t g = 0; g < n / group; g++) {
        const float *x = src + g * group;
        float mn, mx;
        min_max(x, (int)group, &mn, &mx);
        /* mlx.core.quantize (affine): the end of larger magnitude maps to a
         * code exactly (0 or n_bins), the scale is at least 1e-7 */
        bool neg = fabsf(mn) > fabsf(mx);
        float scale = fmaxf((mx - mn) / n_bins, 1e-7f);
        scale = neg ? scale : -scale;
        float edge = neg ? mn : mx;
        float q0 = rintf(edge / scale);
        if (q0 != 0)
            scale = edge / q0;
        float bias = q0 == 0 ? 0.f : edge;
        float s = lms__round_to(scale, sdt), b = lms__round_to(bias, sdt);
        store_sdt(scales, g, s, sdt);
        store_sdt(biases, g, b, sdt);
        for (size_t i = 0; i < group; i++) {
            float q = rintf((x[i] - bias) / scale);
            q = fminf(fmaxf(q, 0.f), n_bins);
            uint32_t code = (uint32_t)q;
            size_t bit = (g * group + i) * bits;
            w[bit / 8] |= (uint8_t)(code << (bit % 8));
            if (bit % 8 + bits > 8)
                w[bit / 8 + 1] |= (uint8_t)(code >> (8 - bit % 8));
        }
    }
}
