/*
 * engine/cpu/quant_avx512.c - the quantized kernels of quant_x86.h for
 * CPUs with AVX-512 VNNI: unsigned x signed byte products summed to 32 bits
 * in one vpdpbusd (on 256-bit registers, with AVX-512 VL), which neither
 * saturates nor needs the pairwise step. Chosen at run time by quant.c.
 */
#if defined(__x86_64__)
#define T __attribute__((target("avx2,fma,f16c,avx512f,avx512bw,avx512vl,avx512vnni")))
#define DOT(a, x) _mm256_dpbusd_epi32(_mm256_setzero_si256(), (a), (x))
#define QSET lms__qkernels_avx512_partial
#define QSET_NAME "avx512"
#define QX_ZMM 1 /* the 512-bit products for several vectors */
#include "engine/cpu/quant_x86.h"
#endif
