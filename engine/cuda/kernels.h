/*
 * engine/cuda/kernels.h - the CUDA kernels of the engine's CUDA backend,
 * seen from C: argument structs and launchers (engine/cuda/kernels.cu).
 * Every launcher enqueues on `stream` and returns 0 or a cudaError_t code
 * (the caller turns it into LMS_EDEVICE); none synchronizes, so each may be
 * captured into a CUDA graph.
 *
 * Step parameters live in device memory (lms_cu_step layout below), so that
 * one recorded decode step replays for any position: kernels read the
 * token ids, the first position and the block table from there, never from
 * their launch arguments.
 */
#ifndef LMS_ENGINE_CUDA_KERNELS_H
#define LMS_ENGINE_CUDA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Element types (weights, K/V, GEMM inputs). */
enum { LMS_CU_F32 = 0, LMS_CU_F16 = 1, LMS_CU_BF16 = 2 };
/* Input transforms of a matrix product (lms__act + the norm). */
enum { LMS_CU_PRO_NONE = 0, LMS_CU_PRO_NORM = 1, LMS_CU_PRO_SILU = 2, LMS_CU_PRO_GELU = 3 };

/* Step parameters, int32 words: [0] nb, [1] pos0, [2] n_pages, [3] 0,
 * [4 .. 4+max_block) token ids, [4+max_block ..) the block table, and with
 * sliding-window layers the window group's block table after it (each
 * group's lms_cu_kv.table says where its table starts). A step of several
 * sequences (segments) also has each row's position and, per group, the
 * word offset of each row's block table (lms_cu_kv.rpos and .rtable say
 * where), the rows whose logits are wanted, and the segments' tables. */
#define LMS_CU_STEP_NB 0
#define LMS_CU_STEP_POS0 1
#define LMS_CU_STEP_TOKENS 4

/* The paged KV cache (lmstore/kvcache.h layout): one group of its pages. */
typedef struct lms_cu_kv {
    uint8_t *base;
    int64_t page_bytes, layer_bytes, head_bytes, token_bytes, v_offset;
    int page_tokens, dtype; /* LMS_CU_* */
    int table;              /* word offset of the group's block table in the step parameters */
    /* Steps of several sequences: rpos > 0 is the word offset of the rows' positions
     * (row b at step[rpos + b]), and rtable > 0 that of the rows' block tables for
     * this group (row b's table at step + step[rtable + b]). 0: one sequence, row b
     * at pos0 + b, every row with `table`. */
    int rpos, rtable;
} lms_cu_kv;

/* Matrix-vector products of up to 3 matrices sharing one input (q/k/v,
 * gate/up), for steps of 1 to 8 rows: y_j[b] (=, or += with acc_j)
 * W_j . in(x[b]) + bias_j, in(x) = x, or RMSNorm(x) * norm when norm is
 * given (a gated input comes from lms_cu_act_mul_launch or a pair_act
 * product). With pair_act (2 jobs of equal rows: gate, up), also
 * h[b][r] = act(y_0[b][r]) * y_1[b][r], the next product's input. */
#define LMS_CU_GEMV_JOBS 3
typedef struct lms_cu_gemv {
    const void *w[LMS_CU_GEMV_JOBS];    /* [rows_j][K] of wtype, device */
    float *y[LMS_CU_GEMV_JOBS];         /* [nb][ldy_j] */
    const float *bias[LMS_CU_GEMV_JOBS];/* [rows_j] or NULL */
    int rows[LMS_CU_GEMV_JOBS];
    int ldy[LMS_CU_GEMV_JOBS];
    int acc[LMS_CU_GEMV_JOBS];
    int n_jobs;
    int wtype;          /* LMS_CU_* */
    int K;
    const float *x;     /* [nb][ldx] */
    int ldx;
    const float *norm;  /* [K] RMSNorm weight, or NULL */
    float eps;
    int pair_act;       /* 0, or LMS_CU_PRO_SILU / _GELU: write h */
    /* MLX affine weights (lms_cu_gemv_mlx_launch): per job scales and biases [rows][K / group] */
    const void *scales[LMS_CU_GEMV_JOBS], *biases[LMS_CU_GEMV_JOBS];
    int group;
    int exact;          /* MLX, one row: 1 multiplies f32 activations; 0 (default) int8 ones (kernels.cu) */
    float *h;           /* [nb][ldh] */
    int ldh;
    const int32_t *step; /* device step parameters (nb) */
    int nb_max;         /* rows the launch must cover: 1, or up to 8 */
    int nb_fixed;       /* > 0: exactly this many rows; 0: as many as the step has */
    int row0;           /* first row of x (head of one position) */
    int y_row0;         /* first row of y */
    /* A post-norm after the product (one job, acc 0, rows[0] wide): nadd_y[b] +=
     * RMSNorm(y_0[b]) * nadd_w (eps), rows of rows[0] floats; nadd_ws: 9 words of
     * device memory, zero between launches. NULL: none. */
    float *nadd_y;
    const float *nadd_w;
    float *nadd_ws;
    /* 1: each block releases the launch's programmatic dependents (griddepcontrol.
     * launch_dependents) once it has issued its last weight loads, not at its start, so
     * that a dependent's blocks are placed only while this launch drains (the 16-bit
     * GEMV) */
    int late_release;
} lms_cu_gemv;
int lms_cu_gemv_launch(const lms_cu_gemv *a, int sms, void *stream);
/* The same over MLX affine weights (w: bits-bit codes packed in little-endian 32-bit words,
 * x = s * q + b per group), bits 4 or 8, scales/biases of stype (LMS_CU_*). The input
 * sum per group multiplies b: a product costs the codes, not a dequantized copy. Steps of
 * one row (nb_max 1, !exact) quantize in(x) to int8 per group of the weights' group size
 * and multiply codes by dp4a: the result differs from the exact product by x's rounding
 * (a few 1e-3 of its size). */
int lms_cu_gemv_mlx_launch(const lms_cu_gemv *a, int bits, int stype, void *stream);
/* Rows [r0, r0 + n) of an MLX affine matrix dequantized to bf16 pairs (n x K each): hi, the
 * value rounded, and lo, the rounding error; hi + lo is a GEMM's weights to about 16 bits. */
int lms_cu_mlx_dequant_launch(void *hi, void *lo, const void *w, const void *scales, const void *biases, int bits,
                              int stype, int K, int group, int r0, int n, void *stream);
/* x[b] = dequantized MLX affine embedding row tokens[b] times scale. */
int lms_cu_embed_mlx_launch(float *x, const void *w, const void *scales, const void *biases, int bits, int stype,
                            int E, int group, float scale, const int32_t *step, int max_nb, void *stream);

/* out[b][k] = in(x[b])[k] for b < nb (nb from step, or n when step is NULL), as
 * otype: the input of a GEMM. split (16-bit otype): rows nb + b get the
 * rounding error in(x[b]) - out[b], so that a product over both halves
 * carries about 16 bits of the input instead of 8 or 11. */
int lms_cu_prologue_launch(void *out, int otype, const float *x, const float *x2, int ldx, const float *norm, int pro,
                           float eps, int K, int row0, int n, const int32_t *step, int split, void *stream);
/* y[b][r] (=, or += with acc) c[b][r] + c[nb + b][r] (+ bias[r]), b < nb, r < rows
 * (c: [2 nb][rows], the product of a split input). */
int lms_cu_split_sum_launch(float *y, int ldy, const float *c, int rows, int nb, const float *bias, int acc,
                            void *stream);

/* out[b] = RMSNorm(x[row0 + b]) * w, rows of n floats, b < n_rows (or the step's nb when n_rows is 0). */
int lms_cu_rmsnorm_launch(float *out, const float *x, const float *w, int n, float eps, int row0, int n_rows,
                          const int32_t *step, int max_nb, void *stream);
/* h[b] = act(g[b]) * u[b] (rows of n floats; act LMS_CU_PRO_SILU or _GELU). */
int lms_cu_act_mul_launch(float *h, const float *g, const float *u, int n, int act, const int32_t *step, int max_nb,
                          void *stream);

/* x[b] = embed[tokens[b]] * scale (in the weights' type when scale != 1). */
int lms_cu_embed_launch(float *x, const void *embed, int wtype, int E, float scale, const int32_t *step, int max_nb,
                        void *stream);

/* Per token b: RMSNorm (q_norm/k_norm, optional) and RoPE on the heads of q and k,
 * then k and v written into the cache at row b's position of `layer` (pos0 + b, or
 * its own with kv.rpos). */
typedef struct lms_cu_rope {
    float *q, *k;
    const float *v;
    const float *q_norm, *k_norm;
    const float *inv_freq; /* [hd/2] */
    int n_heads, n_kv, hd, layer;
    float eps;
    lms_cu_kv kv;
    const int32_t *step;
    int max_block;
    int max_nb;
} lms_cu_rope;
int lms_cu_rope_launch(const lms_cu_rope *a, void *stream);

/* Causal attention over the cache for each token of the step. */
typedef struct lms_cu_attn {
    const float *q;   /* [nb][n_heads*hd] */
    float *out;       /* [nb][n_heads*hd] */
    int n_heads, n_kv, hd, layer, window;
    float scale, softcap;
    lms_cu_kv kv;
    const int32_t *step;
    int max_block;
    /* split decoding (nb <= 8): partials of splits x (m, l, acc[hd]) and counters */
    float *part;      /* [8][n_kv][splits][G][hd + 4] */
    int *counters;    /* [8][n_kv], zero between launches */
    int splits;       /* blocks per kv head and token */
    int chunk;        /* fewest positions a split takes: a range of len positions is cut into
                       * splits of max(chunk, ceil(len / splits)) (nrows > 8 without
                       * decode_only: one split) */
    /* one-token steps: RoPE (and q/k RMSNorm) done here instead of a RoPE launch */
    int fuse_rope;
    float *k_new;            /* [nb][n_kv*hd] this token's k (before RoPE; written back after) */
    const float *v_new;      /* [nb][n_kv*hd] */
    const float *q_norm, *k_norm, *inv_freq;
    float eps;
    /* rows [row0, row0 + nrows) of the step (nrows 0: the step's rows, nb from step).
     * With decode_only the decoding kernel runs whatever the rows (each row its own
     * position and table: rows of several sequences); otherwise a launch of more than
     * 8 rows is one sequence's consecutive positions. */
    int row0, nrows;
    int decode_only;
    /* one-token steps whose attended ranges are at most lms_cu_attn_cluster_len positions:
     * the tensor-core kernel's splits merged inside a thread block cluster (sm_90) */
    int cluster;
} lms_cu_attn;
/* nb_max <= 8 or decode_only: flash-decoding over `splits` blocks per kv head
 * and token (splits 1: one block covers the whole range); larger: the
 * tensor-core prefill kernel (16-bit K/V, head_dim 64/128/256) or the
 * decoding kernel over every token. nb is read from step (or nrows); nb_max
 * bounds it. */
int lms_cu_attn_launch(const lms_cu_attn *a, int nb_max, void *stream);

/* dst[i] = src[rows[i]], i < n, rows of width floats (rows: device memory, the
 * step parameters). dst and src must not overlap. */
int lms_cu_gather_launch(float *dst, const float *src, int width, const int32_t *rows, int n, void *stream);

/* y[b] += RMSNorm(x[b]) * w, widths n. */
int lms_cu_norm_add_launch(float *y, const float *x, const float *w, int n, float eps, const int32_t *step,
                           int max_nb, void *stream);
/* y[b][r] += bias[r] for b < nb. */
int lms_cu_bias_launch(float *y, int ldy, const float *bias, int rows, const int32_t *step, int max_nb,
                       void *stream);
/* v[i] = c * tanh(v[i] / c), i < n. */
int lms_cu_softcap_launch(float *v, size_t n, float c, void *stream);
/* *id = the index of the largest of v[0..n) (the first on ties; NaN never wins).
 * scratch: LMS_CU_ARGMAX_SCRATCH bytes of device memory, zeroed once. */
#define LMS_CU_ARGMAX_BLOCKS 128
#define LMS_CU_ARGMAX_SCRATCH (LMS_CU_ARGMAX_BLOCKS * 8 + 16)
int lms_cu_argmax_launch(const float *v, int n, int32_t *id, void *scratch, void *stream);

/* Read n16 16-byte words of p (a bandwidth probe); *sink is written only when
 * their xor is a value no real data gives, so the reads cannot be dropped. */
int lms_cu_readbw_launch(const void *p, size_t n16, uint32_t *sink, int sms, void *stream);

/* Kernel attributes (shared-memory limits) set once; 0 or a cudaError_t. */
int lms_cu_kernels_init(void);
/* Programmatic dependent launch for the kernels this host thread launches next: on (1) or off
 * (0, the default). The backend sets it at each step: on for models with MLX matrices, off for
 * the others (no faster on the H200, bench/RESULTS.md). */
void lms_cu_set_pdl(int on);
/* The next kernel this host thread launches is (1) or is not (0) a programmatic dependent
 * of the one before it, whatever lms_cu_set_pdl says; the launch after it follows
 * lms_cu_set_pdl again. The kernel must call griddepcontrol.wait before it reads what the
 * one before it writes (every kernel here does). */
void lms_cu_pdl_next(int on);
/* Decoding attention on tensor cores for 16-bit K/V, head_dim 64/128/256 and up to 8 query
 * heads a kv head: on (1, the default) or off (0: the CUDA-core kernel for every decoding
 * launch). */
void lms_cu_set_att_mma(int on);
/* The longest attended range whose splits lms_cu_attn.cluster merges inside one thread block
 * cluster, for head_dim hd, G query heads a kv head and K/V of kv_dtype on this device (0:
 * no clusters: not sm_90, not the tensor-core kernel). */
int lms_cu_attn_cluster_len(int hd, int G, int kv_dtype);
/* The splits a kv head of a one-token decoding launch takes when every block of the launch
 * runs at once (the tensor-core kernel's occupancy on this device, n_kv kv heads), or 0 where
 * that kernel does not apply; such launches take at most that many. */
int lms_cu_attn_wave_splits(int hd, int G, int kv_dtype, int n_kv);
/* Blocks a multiprocessor of the one-row GEMV's persistent grid (each block loops over
 * groups of rows): 3 (the default) or 4 (a tighter register budget), or 0: one block per
 * group of rows (no loop); other values: the default. cap > 0: at most cap blocks in all
 * (tests: every block loops), 0: no cap. */
void lms_cu_set_gemv_blocks(int per_sm, int cap);
/* How the one-row MLX GEMV on int8 activations reads 16-bit scales and biases whose rows
 * are a multiple of 16 bytes: 0 a 2-byte load per chunk of codes, 1 16-byte loads staged in
 * shared memory; -1 (or another value): the default, 1 for 4-bit codes, 0 for 8-bit ones. */
void lms_cu_set_mlx_sb(int mode);

#ifdef __cplusplus
}
#endif
#endif
