/*
 * engine/cpu/kernels_amx.c - the prefill product of BF16 weights with bf16
 * activations on Intel AMX tiles (AMX-TILE + AMX-BF16: Sapphire Rapids and
 * later Xeons), the gemm_xbf16 entry of the "amxbf16" kernel set
 * (kernels_avx512.c), which is the avx512bf16 set in every other entry.
 *
 * One TDPBF16PS multiplies a tile of 16 tokens x 32 bf16 activations (A)
 * by 16 pairs x 16 weight rows (B,
 * the weights' pairs transposed: B[p][r] = W[r][2p], W[r][2p + 1]) into 16
 * tokens x 16 rows of f32 sums (C), 8192 multiply-adds an instruction, 16x
 * what one vdpbf16ps does. C's rows are 16 consecutive outputs of y, so a
 * C tile is loaded from and stored to y in place.
 *
 * Blocking: columns in panels of KP (512) activations; in each panel, the
 * call's rows RB (256) at a time are packed once, as read from the mapping,
 * into this thread's scratch (256 KiB, in L2; lms__qscratch_slot 1), then
 * the tokens 32 at a time are copied into two contiguous A tiles a column
 * tile (32 KiB, in L1: activation rows are often a power of two apart,
 * which would map a tile's 16 rows to one L1 set) and run over every packed
 * row, 2 x 2 tiles of C at once. Tiles: C 0-3, A 4-5, B 6-7, each 16 rows x
 * 64 bytes. A panel after the first (or acc) loads C from y and adds to it.
 * Memory traffic: the weights read once a call, the activations once per
 * RB rows.
 *
 * What the tiles do not cover goes through the avx512bf16 kernel
 * (lms__gemm_xbf16_avx512), with the same contract: rows past the last
 * whole 16, tokens past the last whole 16 (and calls of fewer than 16
 * tokens: decode), and columns past the last whole 32 (added with acc);
 * so does a whole call when the scratch cannot be had.
 *
 * Arithmetic: each product of two bf16 values is exact in f32 and the
 * tile adds them into its f32 sums, rounding to nearest even, with bf16
 * subnormal inputs read as zero (the instruction's DAZ); so the result is
 * the avx512bf16 set's up to the order of the additions.
 *
 * Linux gives a process the tiles' 8 KiB of register state only on request
 * (arch_prctl ARCH_REQ_XCOMP_PERM): lms__amx_usable() asks once, and the
 * set is offered only where that succeeds. Each call loads its tile
 * configuration and releases the tiles when it returns, so a thread holds
 * no tile state between calls.
 */
#if defined(__x86_64__)
#include <immintrin.h>
#include <stdatomic.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "engine/cpu/quant.h"
#include "engine/cpu/transpose_x86.h"
#include "engine/internal.h"

#define TA __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")))

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

enum {
    KP = 512,                /* activations a column panel */
    RB = 256,                /* rows packed at once (B tiles of 16 rows x KP: 256 KiB, in L2) */
    TILE_K = 32,             /* activations a tile row (64 bytes of bf16) */
    PK_TILES = KP / TILE_K,  /* column tiles a panel */
    TILE_BYTES = 1024,       /* every tile: 16 rows x 64 bytes */
    A_TILE = TILE_BYTES / 2, /* an A tile in bf16 elements */
    B_TILE = TILE_BYTES / 4, /* a B tile in dwords (bf16 pairs) */
};

bool lms__amx_usable(void)
{
    static atomic_int state; /* 0 unknown, 1 usable, 2 not */
    int s = atomic_load_explicit(&state, memory_order_acquire);
    if (!s) {
        __builtin_cpu_init();
        /* AMX only: the AVX-512 BF16 the kernel also runs is the caller's check (kernels.c) */
        bool ok = __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-bf16");
        /* the kernel refuses where the tiles' state is not enabled (XCR0) or not supported */
        ok = ok && syscall(SYS_arch_prctl, ARCH_REQ_XCOMP_PERM, XFEATURE_XTILEDATA) == 0;
        s = ok ? 1 : 2;
        atomic_store_explicit(&state, s, memory_order_release);
    }
    return s == 1;
}

/* The palette-1 configuration: 8 tiles of 16 rows x 64 bytes. */
typedef struct amx_cfg {
    uint8_t palette, start_row;
    uint8_t reserved[14];
    uint16_t colsb[16];
    uint8_t rows[16];
} amx_cfg;
static const amx_cfg tile_cfg = {
    .palette = 1,
    .colsb = {64, 64, 64, 64, 64, 64, 64, 64},
    .rows = {16, 16, 16, 16, 16, 16, 16, 16},
};

/* 16 rows of 16 dwords (row r at src + r * ld dwords) to their transpose at
 * dst (16 rows of 64 bytes, 64-byte aligned): dst[c][r] = src[r][c]. */
static inline TA void transpose16(const uint32_t *src, size_t ld, uint32_t *dst)
{
    __m512i v[16];
    for (int i = 0; i < 16; i++) v[i] = _mm512_loadu_si512(src + (size_t)i * ld);
    lms__tr16(v);
    for (int i = 0; i < 16; i++) _mm512_store_si512(dst + 16 * i, v[i]);
}

/* B tiles of nrt row tiles (16 rows each, row 0 at W) over kts tiles of 32
 * columns: tile (rt, kt) at pk + (rt * kts + kt) * B_TILE. */
static inline TA void pack_b(const uint16_t *W, size_t ldw, int nrt, int kts, uint32_t *pk)
{
    for (int rt = 0; rt < nrt; rt++)
        for (int kt = 0; kt < kts; kt++)
            transpose16((const uint32_t *)(W + (size_t)rt * 16 * ldw + (size_t)kt * TILE_K), ldw / 2,
                        pk + ((size_t)rt * kts + kt) * B_TILE);
}

/* A tiles of ntt token tiles (16 rows of xb each) over kts tiles of 32
 * columns, made contiguous: tile (tt, kt) at xa + (tt * kts + kt) * A_TILE. */
static inline TA void pack_a(const uint16_t *xb, size_t ldxb, int ntt, int kts, uint16_t *xa)
{
    for (int j = 0; j < ntt * 16; j++)
        for (int kt = 0; kt < kts; kt++)
            _mm512_store_si512(xa + ((size_t)(j / 16) * kts + kt) * A_TILE + (j % 16) * TILE_K,
                               _mm512_loadu_si512(xb + (size_t)j * ldxb + kt * TILE_K));
}

/* C starts as zeros (the first panel of a product without acc) or as y. */
#define TLOAD_C(c, first, yp, ldy)         \
    do {                                   \
        if (first)                         \
            _tile_zero(c);                 \
        else                               \
            _tile_loadd(c, yp, (ldy) * 4); \
    } while (0)

/* 32 tokens (A tiles at a0, a1) x 32 rows (B tiles at b0, b1) over kts
 * column tiles into y: C tile (token tile j, row tile i) = 2 j + i. */
static inline TA void tiles_2x2(const uint16_t *a0, const uint16_t *a1, const uint32_t *b0, const uint32_t *b1,
                                int kts, float *y, size_t ldy, bool first)
{
    float *y1 = y + 16 * ldy;
    TLOAD_C(0, first, y, ldy);
    TLOAD_C(1, first, y + 16, ldy);
    TLOAD_C(2, first, y1, ldy);
    TLOAD_C(3, first, y1 + 16, ldy);
    for (int kt = 0; kt < kts; kt++) {
        _tile_loadd(4, a0 + (size_t)kt * A_TILE, 64);
        _tile_loadd(6, b0 + (size_t)kt * B_TILE, 64);
        _tile_loadd(7, b1 + (size_t)kt * B_TILE, 64);
        _tile_dpbf16ps(0, 4, 6);
        _tile_dpbf16ps(1, 4, 7);
        _tile_loadd(5, a1 + (size_t)kt * A_TILE, 64);
        _tile_dpbf16ps(2, 5, 6);
        _tile_dpbf16ps(3, 5, 7);
    }
    _tile_stored(0, y, ldy * 4);
    _tile_stored(1, y + 16, ldy * 4);
    _tile_stored(2, y1, ldy * 4);
    _tile_stored(3, y1 + 16, ldy * 4);
}

/* 16 tokens x 16 rows: the edges of tiles_2x2's blocks. */
static inline TA void tiles_1x1(const uint16_t *a, const uint32_t *b, int kts, float *y, size_t ldy, bool first)
{
    TLOAD_C(0, first, y, ldy);
    for (int kt = 0; kt < kts; kt++) {
        _tile_loadd(4, a + (size_t)kt * A_TILE, 64);
        _tile_loadd(6, b + (size_t)kt * B_TILE, 64);
        _tile_dpbf16ps(0, 4, 6);
    }
    _tile_stored(0, y, ldy * 4);
}

TA void lms__gemm_xbf16_amx(const uint16_t *W, size_t ldw, const uint16_t *xb, size_t ldxb, float *y, size_t ldy,
                            int rows, int nb, int cols, bool acc)
{
    const int rows16 = rows & ~15, nb16 = nb & ~15, cols32 = cols & ~(TILE_K - 1);
    /* B tiles are packed from dword pairs: W's rows must start on pairs */
    uint32_t *pk = NULL;
    if (rows16 && nb16 && cols32 && !(ldw & 1))
        pk = lms__qscratch_slot(1, (size_t)(RB / 16 + 2) * PK_TILES * TILE_BYTES); /* B tiles, then two A */
    if (!pk) {
        lms__gemm_xbf16_avx512(W, ldw, xb, ldxb, y, ldy, rows, nb, cols, acc);
        return;
    }
    uint16_t *xa = (uint16_t *)(pk + (size_t)RB / 16 * PK_TILES * B_TILE);
    _tile_loadconfig(&tile_cfg);
    for (int k0 = 0; k0 < cols32; k0 += KP) {
        const int kts = LMS_MIN(KP, cols32 - k0) / TILE_K;
        const bool first = !acc && k0 == 0;
        for (int rb = 0; rb < rows16; rb += RB) {
            const int nrt = LMS_MIN(RB, rows16 - rb) / 16;
            pack_b(W + (size_t)rb * ldw + k0, ldw, nrt, kts, pk);
            for (int t = 0; t < nb16; t += 32) {
                const int ntt = nb16 - t >= 32 ? 2 : 1;
                pack_a(xb + (size_t)t * ldxb + k0, ldxb, ntt, kts, xa);
                float *yt = y + (size_t)t * ldy + rb;
                for (int rt = 0; rt < nrt; rt += 2) {
                    const uint32_t *b0 = pk + (size_t)rt * kts * B_TILE;
                    if (ntt == 2 && rt + 1 < nrt) {
                        tiles_2x2(xa, xa + (size_t)kts * A_TILE, b0, b0 + (size_t)kts * B_TILE, kts, yt + rt * 16, ldy,
                                  first);
                        continue;
                    }
                    for (int i = 0; i < LMS_MIN(2, nrt - rt); i++)
                        for (int j = 0; j < ntt; j++)
                            tiles_1x1(xa + (size_t)j * kts * A_TILE, b0 + (size_t)i * kts * B_TILE, kts,
                                      yt + (size_t)j * 16 * ldy + (rt + i) * 16, ldy, first);
                }
            }
        }
    }
    _tile_release();
    /* what the tiles left: the columns past cols32 of the tiled block, then whole rows and tokens */
    if (cols32 < cols)
        lms__gemm_xbf16_avx512(W + cols32, ldw, xb + cols32, ldxb, y, ldy, rows16, nb16, cols - cols32, true);
    if (nb16 < nb)
        lms__gemm_xbf16_avx512(W, ldw, xb + (size_t)nb16 * ldxb, ldxb, y + (size_t)nb16 * ldy, ldy, rows16, nb - nb16,
                               cols, acc);
    if (rows16 < rows)
        lms__gemm_xbf16_avx512(W + (size_t)rows16 * ldw, ldw, xb, ldxb, y + rows16, ldy, rows - rows16, nb, cols, acc);
}
#endif
