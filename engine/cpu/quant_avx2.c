/*
 * engine/cpu/quant_avx2.c - the quantized kernels of quant_x86.h for AVX2
 * CPUs: unsigned x signed byte products by vpmaddubsw, pairs summed to 32
 * bits by vpmaddwd. Chosen at run time by quant.c; per-function target
 * attributes keep the rest of the library baseline x86-64.
 */
#if defined(__x86_64__)
#define T __attribute__((target("avx2,fma,f16c")))
#define DOT(a, x) _mm256_madd_epi16(_mm256_maddubs_epi16((a), (x)), _mm256_set1_epi16(1))
#define QSET lms__qkernels_avx2_partial
#define QSET_NAME "avx2"
#include "engine/cpu/quant_x86.h"
#endif
