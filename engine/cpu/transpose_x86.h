/*
 * engine/cpu/transpose_x86.h - the 16 x 16 transpose of 32-bit elements in
 * AVX-512 registers, shared by the packed products' weight panels
 * (kernels_avx512.c) and the AMX weight tiles (kernels_amx.c). Its target
 * (AVX-512 F) is a subset of both files' functions', so it inlines into
 * them. Include after <immintrin.h>.
 */
#ifndef LMS_ENGINE_CPU_TRANSPOSE_X86_H
#define LMS_ENGINE_CPU_TRANSPOSE_X86_H

/* Transpose 16 x 16 32-bit elements: row i of v becomes column i. */
static inline __attribute__((target("avx512f"))) void lms__tr16(__m512i v[16])
{
    __m512i t[16];
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(v[i], v[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(v[i], v[i + 1]);
    }
    for (int i = 0; i < 16; i += 4) {
        v[i] = _mm512_unpacklo_epi64(t[i], t[i + 2]);
        v[i + 1] = _mm512_unpackhi_epi64(t[i], t[i + 2]);
        v[i + 2] = _mm512_unpacklo_epi64(t[i + 1], t[i + 3]);
        v[i + 3] = _mm512_unpackhi_epi64(t[i + 1], t[i + 3]);
    }
    /* v[4g + c], 128-bit lane L: rows 4g..4g+3 of column 4L + c */
    for (int c = 0; c < 4; c++) {
        __m512i a = _mm512_shuffle_i32x4(v[c], v[4 + c], 0x88), b = _mm512_shuffle_i32x4(v[c], v[4 + c], 0xdd);
        __m512i e = _mm512_shuffle_i32x4(v[8 + c], v[12 + c], 0x88), f = _mm512_shuffle_i32x4(v[8 + c], v[12 + c], 0xdd);
        t[c] = _mm512_shuffle_i32x4(a, e, 0x88);
        t[4 + c] = _mm512_shuffle_i32x4(b, f, 0x88);
        t[8 + c] = _mm512_shuffle_i32x4(a, e, 0xdd);
        t[12 + c] = _mm512_shuffle_i32x4(b, f, 0xdd);
    }
    for (int i = 0; i < 16; i++) v[i] = t[i];
}

#endif
