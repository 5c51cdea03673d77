/*
 * engine/cpu/kernels_amx.c - the prefill product of BF16 weights with bf16
 * activations on Intel AMX tiles (AMX-TILE + AMX-BF16: Sapphire Rapids and
 * later Xeons), the gemm_xbf16 entry of the "amxbf16" kernel set
 * (kernels_avx512.c), which is the avx512bf16 set in every other entry.
 *
 * One TDPBF16PS multiplies a tile of 16 tokens x 32 bf16 activations (A,
 * read in place from the activation rows) by 16 pairs x 16 weight rows (B,
 * the weights' pairs transposed: B[p][r] = W[r][2p], W[r][2p + 1]) into 16
 * tokens x 16 rows of f32 sums (C), 8192 multiply-adds an instruction, 16x
 * what one vdpbf16ps does. C's rows are 16 consecutive outputs of y, so a
 * C tile is loaded from and stored to y in place.
 *
 * Blocking: columns in panels of KP (512) activations; in each panel, the
 * call's rows 32 at a time (two B tiles) are packed once, as read from the
 * mapping, into this thread's stack (32 KiB, L1-sized), then every token,
 * 32 at a time (two A tiles, read from L2), runs over them with four C
 * tiles (2 x 2). Tiles: C 0-3, A 4-5, B 6-7, each 16 rows x 64 bytes.
 * A panel after the first (or acc) loads C from y and adds to it.
 *
 * What the tiles do not cover goes through the avx512bf16 kernel
 * (lms__gemm_xbf16_avx512), with the same contract: rows past the last
 * whole 16, tokens past the last whole 16 (and calls of fewer than 16
 * tokens: decode), and columns past the last whole 32 (added with acc).
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
#include <string.h>
#include <sys/syscall.h>
#include <unistd.h>

#include "engine/internal.h"

#define TA __attribute__((target("avx512f,avx512bw,avx512vl,avx512bf16,amx-tile,amx-bf16")))

#define ARCH_REQ_XCOMP_PERM 0x1023
#define XFEATURE_XTILEDATA 18

enum {
    KP = 512,            /* activations a column panel */
    TILE_K = 32,         /* activations a tile row (64 bytes of bf16) */
    PK_TILES = KP / TILE_K,
};

bool lms__amx_usable(void)
{
    static atomic_int state; /* 0 unknown, 1 usable, 2 not */
    int s = atomic_load_explicit(&state, memory_order_acquire);
    if (!s) {
        __builtin_cpu_init();
        bool ok = __builtin_cpu_supports("amx-tile") && __builtin_cpu_supports("amx-bf16") &&
                  __builtin_cpu_supports("avx512bf16") && __builtin_cpu_supports("avx512bw") &&
                  __builtin_cpu_supports("avx512vl");
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

/* 16 rows of 16 dwords (row r at src + r * ld dwords) to their transpose at
 * dst (16 rows of 64 bytes, 64-byte aligned): dst[c][r] = src[r][c]. */
static inline TA void transpose16(const uint32_t *src, size_t ld, uint32_t *dst)
{
    __m512i r[16], t[16], u[16];
    for (int i = 0; i < 16; i++) r[i] = _mm512_loadu_si512(src + (size_t)i * ld);
    /* in each 128-bit lane L (columns 4L..4L+3): rows i, i+1 interleaved */
    for (int i = 0; i < 16; i += 2) {
        t[i] = _mm512_unpacklo_epi32(r[i], r[i + 1]);
        t[i + 1] = _mm512_unpackhi_epi32(r[i], r[i + 1]);
    }
    /* u[4g + c], lane L: column 4L + c of rows 4g .. 4g+3 */
    for (int g = 0; g < 16; g += 4) {
        u[g + 0] = _mm512_unpacklo_epi64(t[g], t[g + 2]);
        u[g + 1] = _mm512_unpackhi_epi64(t[g], t[g + 2]);
        u[g + 2] = _mm512_unpacklo_epi64(t[g + 1], t[g + 3]);
        u[g + 3] = _mm512_unpackhi_epi64(t[g + 1], t[g + 3]);
    }
    /* column 4L + c: lane L of u[c], u[4 + c], u[8 + c], u[12 + c] (a 4 x 4 transpose of lanes) */
    for (int c = 0; c < 4; c++) {
        __m512i s0 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0x44), s1 = _mm512_shuffle_i32x4(u[c], u[4 + c], 0xee);
        __m512i s2 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0x44), s3 = _mm512_shuffle_i32x4(u[8 + c], u[12 + c], 0xee);
        _mm512_store_si512(dst + 16 * (0 + c), _mm512_shuffle_i32x4(s0, s2, 0x88));
        _mm512_store_si512(dst + 16 * (4 + c), _mm512_shuffle_i32x4(s0, s2, 0xdd));
        _mm512_store_si512(dst + 16 * (8 + c), _mm512_shuffle_i32x4(s1, s3, 0x88));
        _mm512_store_si512(dst + 16 * (12 + c), _mm512_shuffle_i32x4(s1, s3, 0xdd));
    }
}

/* The panel's B tiles of nr row tiles (16 rows each, row 0 at W): tile
 * (rt, kt) at pk + (rt * kts + kt) * 256 dwords, kts tiles of 32 columns. */
static inline TA void pack_rows(const uint16_t *W, size_t ldw, int nr, int kts, uint32_t *pk)
{
    for (int rt = 0; rt < nr; rt++)
        for (int kt = 0; kt < kts; kt++)
            transpose16((const uint32_t *)(W + (size_t)rt * 16 * ldw + (size_t)kt * TILE_K), ldw / 2,
                        pk + ((size_t)rt * kts + kt) * 256);
}

/*
 * One 32-row (NR 2) or 16-row (NR 1) group of a panel against every token of
 * nb16 (a multiple of 16): C tiles (row tile i, token tile j) = 2 j + i.
 * The tile numbers are immediates, so each shape is spelled out.
 */
#define TLOAD_C(c, first, yp, ldy) \
    do { if (first) _tile_zero(c); else _tile_loadd(c, yp, (ldy) * 4); } while (0)

static inline TA void group(const uint32_t *pk, int kts, int nr, const uint16_t *xb, size_t ldxb, float *y,
                            size_t ldy, int nb16, bool first)
{
    const size_t sx = ldxb * 2, sb = 64;
    int t = 0;
    for (; t + 32 <= nb16; t += 32) {
        const uint16_t *x0 = xb + (size_t)t * ldxb, *x1 = x0 + 16 * ldxb;
        float *y0 = y + (size_t)t * ldy, *y1 = y0 + 16 * ldy;
        if (nr == 2) {
            TLOAD_C(0, first, y0, ldy);
            TLOAD_C(1, first, y0 + 16, ldy);
            TLOAD_C(2, first, y1, ldy);
            TLOAD_C(3, first, y1 + 16, ldy);
            for (int kt = 0; kt < kts; kt++) {
                _tile_loadd(4, x0 + kt * TILE_K, sx);
                _tile_loadd(6, pk + (size_t)kt * 256, sb);
                _tile_loadd(7, pk + ((size_t)kts + kt) * 256, sb);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(1, 4, 7);
                _tile_loadd(5, x1 + kt * TILE_K, sx);
                _tile_dpbf16ps(2, 5, 6);
                _tile_dpbf16ps(3, 5, 7);
            }
            _tile_stored(0, y0, ldy * 4);
            _tile_stored(1, y0 + 16, ldy * 4);
            _tile_stored(2, y1, ldy * 4);
            _tile_stored(3, y1 + 16, ldy * 4);
        } else {
            TLOAD_C(0, first, y0, ldy);
            TLOAD_C(2, first, y1, ldy);
            for (int kt = 0; kt < kts; kt++) {
                _tile_loadd(6, pk + (size_t)kt * 256, sb);
                _tile_loadd(4, x0 + kt * TILE_K, sx);
                _tile_loadd(5, x1 + kt * TILE_K, sx);
                _tile_dpbf16ps(0, 4, 6);
                _tile_dpbf16ps(2, 5, 6);
            }
            _tile_stored(0, y0, ldy * 4);
            _tile_stored(2, y1, ldy * 4);
        }
    }
    if (t < nb16) { /* one token tile left */
        const uint16_t *x0 = xb + (size_t)t * ldxb;
        float *y0 = y + (size_t)t * ldy;
        TLOAD_C(0, first, y0, ldy);
        if (nr == 2)
            TLOAD_C(1, first, y0 + 16, ldy);
        for (int kt = 0; kt < kts; kt++) {
            _tile_loadd(4, x0 + kt * TILE_K, sx);
            _tile_loadd(6, pk + (size_t)kt * 256, sb);
            _tile_dpbf16ps(0, 4, 6);
            if (nr == 2) {
                _tile_loadd(7, pk + ((size_t)kts + kt) * 256, sb);
                _tile_dpbf16ps(1, 4, 7);
            }
        }
        _tile_stored(0, y0, ldy * 4);
        if (nr == 2)
            _tile_stored(1, y0 + 16, ldy * 4);
    }
}

TA void lms__gemm_xbf16_amx(const uint16_t *W, size_t ldw, const uint16_t *xb, size_t ldxb, float *y, size_t ldy,
                            int rows, int nb, int cols, bool acc)
{
    const int rows16 = rows & ~15, nb16 = nb & ~15, cols32 = cols & ~(TILE_K - 1);
    /* B tiles are packed from dword pairs: W's rows must start on pairs */
    if (!rows16 || !nb16 || !cols32 || (ldw & 1)) {
        lms__gemm_xbf16_avx512(W, ldw, xb, ldxb, y, ldy, rows, nb, cols, acc);
        return;
    }
    amx_cfg cfg;
    memset(&cfg, 0, sizeof cfg);
    cfg.palette = 1;
    for (int i = 0; i < 8; i++) {
        cfg.colsb[i] = 64;
        cfg.rows[i] = 16;
    }
    uint32_t pk[2 * PK_TILES * 256] __attribute__((aligned(64))); /* 32 KiB: two row tiles of a panel */
    _tile_loadconfig(&cfg);
    for (int k0 = 0; k0 < cols32; k0 += KP) {
        const int kts = LMS_MIN(KP, cols32 - k0) / TILE_K;
        const bool first = !acc && k0 == 0;
        for (int r = 0; r < rows16; r += 32) {
            const int nr = rows16 - r >= 32 ? 2 : 1;
            pack_rows(W + (size_t)r * ldw + k0, ldw, nr, kts, pk);
            group(pk, kts, nr, xb + k0, ldxb, y + r, ldy, nb16, first);
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
