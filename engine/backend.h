/*
 * engine/backend.h - the engine's compute backends: one table of forward
 * operations (lms__fwd_ops) implemented by the CPU backend (engine/cpu/
 * fwd_cpu.c) and the CUDA backend (engine/cuda/). layers.c writes every
 * family's forward pass once, as a sequence of these operations, so a family
 * runs on every backend and a backend never knows which family it runs.
 *
 * The operations are coarse enough to be fused where it pays (a matrix
 * product takes its input's RMSNorm or its gated activation as a prologue,
 * its bias and the residual add as an epilogue) and fine enough that a new
 * family needs no new backend code unless it brings a new kind of layer.
 *
 * ---- A step --------------------------------------------------------------
 *
 *   begin(step)  -> the backend takes the step's inputs (token ids, first
 *                   position, the sequence's block table; or, on a backend
 *                   with `segments`, several sequences' rows). A backend that
 *                   recorded the same shape of step before (the CUDA decode
 *                   graph) may replay it now and set *replayed: the caller
 *                   then issues no operation until end.
 *   embed, matmul, qk_rope, attention, norm_add, head ...
 *   end()        -> waits for the step's work; returns the first error any
 *                   operation of the step met (operations return void: a
 *                   device error is sticky until end).
 *
 * Operations name activations by buffer id (lms__buf): the backend owns the
 * memory (host or device) and knows each buffer's width. Every buffer holds
 * max_block rows of f32 values, row b for the step's token b.
 *
 * Weights: matrices are lms__wt views (host bytes, and the device address
 * when the loader placed them on a device); vectors (norm weights, biases)
 * are f32 and live in lms__weights.vec_store, which a device backend mirrors
 * once at create and addresses by offset.
 *
 * Lifetimes: create borrows cfg's hparams, weights, pool and device for the
 * backend's life. Thread safety: one thread at a time per backend instance.
 */
#ifndef LMS_ENGINE_BACKEND_H
#define LMS_ENGINE_BACKEND_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "engine/internal.h"

typedef struct lms__bk lms__bk; /* a backend instance (backend-defined) */

/* Activation buffers, [max_block] rows each; width per row: */
typedef enum lms__buf {
    LMS__B_X = 0, /* n_embd: the residual stream */
    LMS__B_Q,     /* n_heads * head_dim */
    LMS__B_K,     /* n_kv_heads * head_dim */
    LMS__B_V,     /* n_kv_heads * head_dim */
    LMS__B_ATT,   /* n_heads * head_dim: attention output */
    LMS__B_G,     /* n_ff: gate */
    LMS__B_U,     /* n_ff: up */
    LMS__B_T,     /* n_embd: a layer's output before a post-norm (Gemma) */
    LMS__B_COUNT_
} lms__buf;

/*
 * One matrix product over the step's rows: y[b] (=, or += with acc)
 * W . in(x[b]) (+ bias), where in() is x itself, RMSNorm(x) * norm, or
 * act(x) * x2. The input transform never changes x. Several jobs of one
 * call share one input transform (same x, norm, act, x2), as q/k/v and
 * gate/up do.
 */
typedef struct lms__mm {
    const lms__wt *w;   /* [rows][cols] */
    lms__buf x;         /* width cols */
    const float *norm;  /* [cols] RMSNorm weight (vec_store), or NULL */
    lms__act act;
    lms__buf x2;        /* with act: the multiplier (width cols) */
    lms__buf y;         /* width rows */
    const float *bias;  /* [rows] (vec_store) or NULL */
    bool acc;
} lms__mm;

/* What a step delivers. */
typedef enum lms__out {
    LMS__OUT_NONE = 0, /* only the cache is filled */
    LMS__OUT_LAST,     /* the last row's logits, into step.logits (head) */
    LMS__OUT_ALL,      /* every row's logits (head per chunk of rows; never replayed) */
    LMS__OUT_ARGMAX,   /* the last row's largest logit's id, into *step.argmax (head_argmax) */
    LMS__OUT_ROWS,     /* the logits of rows out_rows[0, n_out) into step.logits (n_out x n_vocab):
                          gather, then head over rows [0, n_out) (backends with segments) */
} lms__out;

/*
 * A segment of a step: rows [row0, row0 + nb) are consecutive positions
 * pos0.. of one sequence, whose block tables kv holds (the batched engine,
 * engine/batch.c, runs many sequences' rows in one step). Every matrix
 * product runs once over all the step's rows; qk_rope and attention use
 * each row's own position and tables.
 */
typedef struct lms__seg {
    uint32_t row0, nb;
    uint32_t pos0;            /* pos0 + nb <= n_ctx */
    const lms__kvview *kv;    /* same geometry as the step's; its own block tables */
} lms__seg;

/* The step's inputs (borrowed for the step). */
typedef struct lms__step {
    const int32_t *tokens;    /* [nb] ids, in the vocabulary */
    uint32_t nb;              /* 1 .. max_block */
    uint32_t pos0;            /* position of tokens[0]; pos0 + nb <= n_ctx */
    const lms__kvview *kv;    /* the cache: geometry, base (device address), block table (host) */
    lms__out out;
    float *logits;            /* LMS__OUT_LAST: n_vocab floats, written by end() at the latest */
    int32_t *argmax;          /* LMS__OUT_ARGMAX: written by end() at the latest */
    /* Several sequences (backends with `segments` only): n_segs > 0 segments in row
     * order covering rows [0, nb); pos0 and kv are then segs[0]'s. n_segs 0: one
     * sequence, rows at pos0.. of kv. */
    const lms__seg *segs;
    uint32_t n_segs;
    const uint32_t *out_rows; /* LMS__OUT_ROWS: ascending rows whose logits are wanted */
    uint32_t n_out;
} lms__step;

/* What create needs (borrowed for the backend's life). */
typedef struct lms__fwd_cfg {
    const lms__hparams *hp;
    const lms__weights *w;
    lms_device *dev;          /* the device weights and KV live on */
    const lms__kernels *k;    /* CPU kernel set (CPU backend) */
    lms_pool *pool;           /* CPU worker threads (CPU backend; NULL = caller's thread) */
    uint32_t max_block;       /* rows per step */
    uint32_t n_ctx;           /* positions per sequence */
    const lms__kvview *kv;    /* geometry (base, strides) of the cache the steps use */
    uint32_t max_segs;        /* segments per step at most (backends with segments; 0 = 1) */
} lms__fwd_cfg;

/* Rope tables: 0 = the model's (global) RoPE, 1 = local layers' (Gemma 3). */
enum { LMS__ROPE_GLOBAL = 0, LMS__ROPE_LOCAL = 1 };

typedef struct lms__fwd_ops {
    const char *name; /* "cpu", "cuda" */
    /* begin takes steps of several segments and LMS__OUT_ROWS (with gather); a
     * backend without steps one sequence at a time (engine/batch.c then splits). */
    bool segments;
    /* LMS_ENOMEM / LMS_EDEVICE (detail names what); on failure *out is NULL. */
    int (*create)(const lms__fwd_cfg *cfg, lms__bk **out);
    void (*destroy)(lms__bk *bk); /* NULL ok */
    /* (optional) Whether the backend computes with matrix w's encoding; NULL: every
     * encoding the weights binder accepts. */
    bool (*supports)(const lms__wt *w);
    /* Kernel set in use ("avx512", "cuda sm_90"); static or backend-owned storage. */
    const char *(*describe)(const lms__bk *bk);

    int (*begin)(lms__bk *bk, const lms__step *st, bool *replayed);
    int (*end)(lms__bk *bk);

    /* x[b] = embedding row tokens[b] * scale (scale != 1: in the weights' dtype, as
     * transformers scales Gemma's embeddings). */
    void (*embed)(lms__bk *bk, float scale);
    void (*matmul)(lms__bk *bk, const lms__mm *jobs, int n_jobs);
    /* Per token: q and k heads RMSNorm'd with q_norm / k_norm when given, RoPE (table
     * `rope`) on q and k, then k and v written into the cache at the token's position
     * of `layer` (in the cache's dtype). Reads and updates Q and K, reads V. */
    void (*qk_rope)(lms__bk *bk, uint32_t layer, const float *q_norm, const float *k_norm, int rope);
    /* ATT[b] = causal attention of Q[b] over the cache's positions [lo, pos0 + b] of
     * `layer`, lo = 0, or pos0 + b + 1 - window when window > 0; scores scaled by
     * `scale`, then capped to softcap * tanh(s / softcap) when softcap > 0. */
    void (*attention)(lms__bk *bk, uint32_t layer, uint32_t window, float scale, float softcap);
    /* y[b] += RMSNorm(x[b]) * w (widths n_embd). */
    void (*norm_add)(lms__bk *bk, lms__buf y, lms__buf x, const float *w);
    /* (optional) matmul(job) then norm_add(y, job->y, w): one job without acc whose
     * output (width n_embd) a post-norm adds to the residual y (Gemma 3). */
    void (*matmul_norm_add)(lms__bk *bk, const lms__mm *job, lms__buf y, const float *w);
    /* Logits of rows [row0, row0 + n) of the step: job's W . RMSNorm(x) (the job names
     * W, x and norm; y is ignored), capped to softcap * tanh(l / softcap) when
     * softcap > 0, written to host_out (n x rows of W, f32): at once for
     * LMS__OUT_ALL, by end() at the latest for LMS__OUT_LAST (host_out is then
     * step.logits). */
    void (*head)(lms__bk *bk, const lms__mm *job, uint32_t row0, uint32_t n, float softcap, float *host_out);
    /* (optional) The id of the largest logit of the last row (first on ties), instead
     * of head(): *id is valid after end(). */
    void (*head_argmax)(lms__bk *bk, const lms__mm *job, float softcap, int32_t *id);

    /* (optional, with segments) Move rows rows[i] of buffer b to row i, i in [0, n)
     * (rows ascending), so that head() can read the wanted rows as a run. */
    void (*gather)(lms__bk *bk, lms__buf b, const uint32_t *rows, uint32_t n);

    /* (optional) Read bandwidth of the device's memory in GB/s: the best of a few
     * passes that read `bytes` of a scratch buffer allocated for the call (the
     * roofline decode is measured against). 0 when it cannot be measured. */
    double (*membw)(lms__bk *bk, size_t bytes);

    /* Copy rows [0, n) of buffer b to or from host memory (the buffer's width per row).
     * Synchronous. Tests, and a gated step's embedding rows (layers.c). */
    int (*read)(lms__bk *bk, lms__buf b, uint32_t n, float *host);
    int (*write)(lms__bk *bk, lms__buf b, uint32_t n, const float *host);
} lms__fwd_ops;

extern const lms__fwd_ops lms__fwd_cpu;
/* The CUDA backend, or NULL when it was not built (engine/backend_registry_*.c). */
extern const lms__fwd_ops *const lms__fwd_cuda;

/* Width (floats per row) of buffer b for hparams hp. */
uint32_t lms__buf_width(const lms__hparams *hp, lms__buf b);

/* RoPE inverse frequencies (head_dim / 2 floats) of table `rope` for hp. */
void lms__rope_freqs(const lms__hparams *hp, int rope, float *inv_freq);

#endif
