/*
 * engine/cuda/fwd_cuda.c - the CUDA backend of the forward operations
 * (engine/backend.h). Weights are read where the loader put them (the
 * resident device arena, or registered host memory in mapped placement):
 * nothing is copied. Activations are f32 in device buffers allocated at
 * create, with the KV cache's arena (the kvcache module allocates it on the
 * same device), the logits scratch and the cuBLAS workspace: nothing is
 * allocated per token.
 *
 * Matrix products of steps of up to 8 rows run the GEMV kernel (weights
 * streamed once, input transform fused); larger steps (prefill) transform
 * the input once into the weights' type and call cuBLAS (f32 accumulation),
 * biases added by a small kernel.
 *
 * A decode step (one row, no logits of every row) is recorded once into a
 * CUDA graph per kind of output and replayed afterwards: kernels read the
 * token, the position and the block table from device memory that begin()
 * refreshes, so one recording serves every position. LMSTORE_CUDA_GRAPH=0
 * turns graphs off; programmatic dependent launch is on for every kernel of
 * models with MLX matrices (their small launches gain from the next one's
 * loads issued early: bench/RESULTS.md), LMSTORE_CUDA_PDL=1|0 forces it on or
 * off. Without it (16-bit models), the launch after each GEMV is the GEMV's
 * programmatic dependent, placed once every block of the GEMV has issued its
 * last loads (lms_cu_gemv.late_release: the dependent's first loads overlap
 * the GEMV's drain and take no multiprocessor from its earlier blocks;
 * LMSTORE_CUDA_LATE_PDL=0 turns that off), and so is the launch after a
 * post-norm (cuda_matmul_norm_add). LMSTORE_CUDA_MLX_EXACT=1 turns the int8
 * activations of one-row MLX products off; for tuning,
 * LMSTORE_CUDA_GEMV_BLOCKS=3|4 sets the one-row GEMV's
 * persistent grid to that many blocks a multiprocessor (0: a block per group
 * of rows, no loop), LMSTORE_CUDA_GEMV_GRID=n caps it at n blocks (tests),
 * LMSTORE_CUDA_ATT_CHUNK=n sets the fewest positions of an attention split,
 * LMSTORE_CUDA_ATT_SPLITS=n the most splits a short context gets and
 * LMSTORE_CUDA_ATT_MMA=0 turns the tensor-core decoding attention off and
 * LMSTORE_CUDA_ATT_CLUSTER=0 its merge of splits within thread block clusters
 * (one-token steps at positions below lms_cu_attn_cluster_len, replayed from
 * graphs of their own), LMSTORE_CUDA_POST_PDL=0 puts a decode step's post-norms
 * (Gemma 3) back into their products' last blocks (cuda_matmul_norm_add).
 *
 * Steps of several sequences (segments, engine/batch.c): begin() also
 * writes each row's position and block-table offset and each segment's
 * tables into the step parameters (room for max_segs segments of n_ctx
 * positions, sized at create), which RoPE and attention read per row
 * (kernels.h: lms_cu_kv.rpos, .rtable); matrix products stay one pass over
 * all rows (the GEMV up to 8 rows, cuBLAS above). Attention runs the
 * tensor-core prefill kernel per segment of more than 8 rows (16-bit K/V)
 * and one decoding launch over each run of other rows, its splits per row
 * shrunk so that the partials fit the scratch of 8 rows. Such steps are
 * never recorded into a graph. The wanted rows' logits are gathered and
 * come back in chunks of logit_rows rows.
 *
 * Errors: a failed launch or CUDA call records the first error; end()
 * returns it as LMS_EDEVICE naming the operation.
 */
#include <assert.h>
#include <cuda_runtime_api.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/backend.h"
#include "engine/cuda/blas.h"
#include "engine/cuda/kernels.h"
#include "loader/device.h"

#define LOGIT_ROWS 32           /* rows of logits scratch at least (layers.c asks at most this many at once for
                                 * every row's logits; steps of segments ask up to max_segs rows) */
#define LOGIT_ROWS_MAX 256      /* rows of logits scratch at most (more come back in chunks) */
#define GEMV_MAX_ROWS 8         /* steps up to this many rows use the GEMV kernel */
#define BLAS_WS (32u << 20)     /* cuBLAS workspace */
#define SPLIT_MAX_ROWS 64       /* GEMM steps up to this many rows split their 16-bit input (mm_run) */
#define DQ_BYTES (64u << 20)    /* MLX matrices in GEMMs: rows dequantized to bf16 this many bytes at a time */
#define ATT_CHUNK_MIN 32        /* decoding attention: fewest positions a split takes */
#define ATT_SPLITS_FINE 32u     /* decoding attention: at most this many splits for short contexts */

enum { MODE_NONE = 0, MODE_LAST, MODE_ARGMAX, MODE_COUNT };

struct lms__bk {
    const lms__hparams *hp;
    const lms__weights *w;
    lms_device *dev;
    int ordinal, sms;
    char desc[160];
    cudaStream_t stream;
    cublasHandle_t blas;
    void *blas_ws;
    uint32_t B, n_ctx, max_pages, maxw;
    uint32_t max_segs, logit_rows;
    /* word offsets in the step parameters of a step of segments (kernels.h): each row's
     * position, each row's table per group, the rows whose logits are wanted, then the
     * segments' tables (seg_cap words) */
    uint32_t seg_pos, seg_rtab[2], seg_out, seg_tab, seg_cap;
    bool fa_ok;         /* the tensor-core prefill kernel covers the cache's type and head size */
    float *buf[LMS__B_COUNT_];
    uint32_t width[LMS__B_COUNT_];
    void *xin;          /* [B][maxw] GEMM input, in the weights' type */
    float *split_out;   /* [2 min(B, SPLIT_MAX_ROWS)][max(maxw, V)] product of a split input */
    float *xn;          /* [GEMV_MAX_ROWS][maxw] a GEMV's normalized input */
    float *hbuf;        /* [GEMV_MAX_ROWS][n_ff] act(gate) * up, the down projection's input */
    void *wdq;          /* DQ_BYTES: rows of an MLX matrix as bf16 pairs, a GEMM's weights (MLX models only) */
    bool h_valid;       /* hbuf holds act(G) * U of the current G and U */
    int h_act;
    /* a one-token step's RoPE, deferred into the attention that follows it */
    struct {
        bool pending;
        uint32_t layer;
        const float *q_norm, *k_norm;
        int rope;
    } rope;
    bool no_fuse;       /* LMSTORE_CUDA_FUSE_ROPE=0 */
    bool post_last;     /* LMSTORE_CUDA_POST_PDL=0: a GEMV's post-norm in its last block */
    bool late_pdl;      /* the launch after a 16-bit GEMV is its programmatic dependent, released by
                         * the GEMV's blocks once their loads are in (LMSTORE_CUDA_LATE_PDL=0: not) */
    bool mlx_exact;     /* LMSTORE_CUDA_MLX_EXACT=1: one-row MLX products on f32 activations */
    bool pdl;           /* programmatic dependent launch for this backend's kernels (set per step:
                         * the kernels' switch is per host thread) */
    float *dvec;        /* mirror of w->vec_store */
    float *inv_freq;    /* [2][hd/2] */
    int32_t *dstep;     /* step parameters (kernels.h layout) */
    int32_t *hstep;     /* their pinned host copy */
    float *dlogits;     /* [logit_rows][V] */
    float *hlogits;     /* pinned [logit_rows][V] */
    int32_t *did, *hid; /* argmax */
    void *amax_scratch;
    float *nadd_ws;     /* a GEMV's post-norm sums and ticket (kernels.h), zero between launches */
    float *part;        /* split-attention partials */
    int *counters;      /* [B][n_kv] */
    int splits, chunk;  /* blocks per kv head and token; splits x chunk >= n_ctx */
    int splits1;        /* ... of one-token steps: at least the splits that fill one wave of blocks */
    int att_chunk;      /* fewest positions a split takes (kernels.h: lms_cu_attn.chunk) */
    lms_cu_kv kvg[2];   /* the cache's groups: 0, and the window group (sliding-window layers) */
    const lms__kvview *kv; /* the geometry create was given (group and index of each layer) */
    const lms__step *st;
    int mode;
    bool capturing, use_graphs;
    uint32_t cluster_len; /* the longest attended range merged in a cluster (lms_cu_attn_cluster_len) */
    bool short_step;      /* this step's ranges are at most cluster_len: a graph of its own */
    cudaGraphExec_t graph[MODE_COUNT][2]; /* [mode][short_step] */
    int err;            /* first error of the step (cudaError_t or cublasStatus_t) */
    char err_what[96];
};

/* ---- errors --------------------------------------------------------------------------------- */

static void fail(lms__bk *b, int code, const char *what)
{
    if (code && !b->err) {
        b->err = code;
        snprintf(b->err_what, sizeof b->err_what, "%s", what);
    }
}

static int cu_err(cudaError_t e, const char *what)
{
    return lms__err(LMS_EDEVICE, "cuda: %s: %s", what, cudaGetErrorString(e));
}

#define CU_TRY(b, call, what)                                                                                          \
    do {                                                                                                               \
        int rc_ = (int)(call);                                                                                         \
        if (rc_)                                                                                                       \
            fail(b, rc_, what);                                                                                        \
    } while (0)

/* ---- helpers ---------------------------------------------------------------------------------- */

static void flush_rope(lms__bk *b);

static int cu_type(lms_dtype dt)
{
    return dt == LMS_DTYPE_F32 ? LMS_CU_F32 : dt == LMS_DTYPE_F16 ? LMS_CU_F16 : LMS_CU_BF16;
}

/* The type a GEMM multiplies matrix w in: its own, bf16 for MLX codes (dequantized rows). */
static int mm_type(const lms__wt *w) { return w->mlx ? LMS_CU_BF16 : cu_type(w->dt); }

/* Whether two matrices can share one GEMV launch: the same encoding, and for MLX the same bits,
 * group and scale type. */
static bool same_enc(const lms__wt *a, const lms__wt *b)
{
    if (a->dt != b->dt)
        return false;
    return !a->mlx || (a->mlx->bits == b->mlx->bits && a->mlx->group == b->mlx->group && a->mlx->sdt == b->mlx->sdt);
}

static bool cuda_supports(const lms__wt *w)
{
    if (w->dt == LMS_DTYPE_BF16 || w->dt == LMS_DTYPE_F16 || w->dt == LMS_DTYPE_F32)
        return true;
    /* MLX affine: 16 bytes of codes within one group (groups of 32 .. 128) */
    return w->dt == LMS_DTYPE_MLX_AFFINE && w->mlx && (w->mlx->bits == 4 || w->mlx->bits == 8) &&
           w->mlx->group >= 32;
}

static bool is_mlx(const lms__wt *w) { return w->dt == LMS_DTYPE_MLX_AFFINE; }

static cudaDataType_t blas_type(int t)
{
    return t == LMS_CU_F32 ? CUDA_R_32F : t == LMS_CU_F16 ? CUDA_R_16F : CUDA_R_16BF;
}

/* The device copy of a vector of vec_store (NULL stays NULL). */
static const float *dv(const lms__bk *b, const float *host)
{
    if (!host)
        return NULL;
    assert(host >= b->w->vec_store && host < b->w->vec_store + b->w->vec_len);
    return b->dvec + (host - b->w->vec_store);
}

static int pro_of(const lms__mm *j)
{
    if (j->norm)
        return LMS_CU_PRO_NORM;
    if (j->act == LMS__ACT_SILU)
        return LMS_CU_PRO_SILU;
    if (j->act == LMS__ACT_GELU_TANH)
        return LMS_CU_PRO_GELU;
    return LMS_CU_PRO_NONE;
}


/* ---- create / destroy ----------------------------------------------------------------------- */

static void cuda_destroy(lms__bk *b)
{
    if (!b)
        return;
    cudaSetDevice(b->ordinal);
    for (int i = 0; i < MODE_COUNT; i++)
        for (int j = 0; j < 2; j++)
            if (b->graph[i][j])
                cudaGraphExecDestroy(b->graph[i][j]);
    if (b->blas)
        lms__blas_destroy(b->blas);
    for (int i = 0; i < LMS__B_COUNT_; i++) cudaFree(b->buf[i]);
    cudaFree(b->xin);
    cudaFree(b->split_out);
    cudaFree(b->xn);
    cudaFree(b->hbuf);
    cudaFree(b->wdq);
    cudaFree(b->dvec);
    cudaFree(b->inv_freq);
    cudaFree(b->dstep);
    cudaFree(b->dlogits);
    cudaFree(b->did);
    cudaFree(b->amax_scratch);
    cudaFree(b->nadd_ws);
    cudaFree(b->part);
    cudaFree(b->counters);
    cudaFree(b->blas_ws);
    cudaFreeHost(b->hstep);
    cudaFreeHost(b->hlogits);
    cudaFreeHost(b->hid);
    if (b->stream)
        cudaStreamDestroy(b->stream);
    lms__free(b);
}

static bool env_off(const char *name)
{
    const char *v = getenv(name);
    return v && !strcmp(v, "0");
}

/* Settings this backend cannot run, named. */
static int check_shapes(const lms__hparams *hp, const lms__kvview *kv)
{
    uint32_t hd = hp->head_dim, G = hp->n_heads / hp->n_kv_heads;
    (void)kv;
    if (hd > 256 || hd % 2)
        return lms__err(LMS_EUNSUPPORTED, "cuda engine: head_dim %u (even sizes up to 256 are supported)", hd);
    if (G > 16)
        return lms__err(LMS_EUNSUPPORTED, "cuda engine: %u query heads per KV head (at most 16 are supported)", G);
    return 0;
}

#define ALLOC(p, n)                                                                                                    \
    do {                                                                                                               \
        cudaError_t e_ = cudaMalloc((void **)&(p), (n));                                                               \
        if (e_) {                                                                                                      \
            rc = lms__err(LMS_ENOMEM, "cuda engine: %zu bytes of device memory: %s", (size_t)(n),                      \
                          cudaGetErrorString(e_));                                                                     \
            goto out_fail;                                                                                             \
        }                                                                                                              \
    } while (0)

static int cuda_create(const lms__fwd_cfg *cfg, lms__bk **out)
{
    const lms__hparams *hp = cfg->hp;
    int rc;
    cudaError_t e;
    *out = NULL;
    if ((rc = check_shapes(hp, cfg->kv)))
        return rc;
    lms__bk *b = lms__calloc(1, sizeof *b);
    if (!b)
        return LMS_ENOMEM;
    b->hp = hp;
    b->w = cfg->w;
    b->dev = cfg->dev;
    b->ordinal = cfg->dev->ordinal;
    b->B = cfg->max_block;
    b->n_ctx = cfg->n_ctx;
    b->max_pages = (cfg->n_ctx + cfg->kv->page_tokens - 1) / cfg->kv->page_tokens + 1;
    b->max_segs = LMS_MAX(1u, LMS_MIN(cfg->max_segs, cfg->max_block));
    b->logit_rows = LMS_MIN(LMS_MAX((uint32_t)LOGIT_ROWS, b->max_segs), (uint32_t)LOGIT_ROWS_MAX);
    b->fa_ok = cfg->kv->dtype != LMS_DTYPE_F32 &&
               (hp->head_dim == 64 || hp->head_dim == 128 || hp->head_dim == 256);
    b->use_graphs = !env_off("LMSTORE_CUDA_GRAPH");
    b->no_fuse = env_off("LMSTORE_CUDA_FUSE_ROPE");
    b->post_last = env_off("LMSTORE_CUDA_POST_PDL");
    b->late_pdl = !env_off("LMSTORE_CUDA_LATE_PDL");
    b->mlx_exact = getenv("LMSTORE_CUDA_MLX_EXACT") && !env_off("LMSTORE_CUDA_MLX_EXACT");
    b->pdl = getenv("LMSTORE_CUDA_PDL") ? !env_off("LMSTORE_CUDA_PDL")
                                        : lms__weights_find(b->w, hp, is_mlx, NULL, 0) != NULL;
    lms_cu_set_att_mma(!env_off("LMSTORE_CUDA_ATT_MMA"));
    lms_cu_set_mlx_sb(getenv("LMSTORE_CUDA_MLX_SB") ? atoi(getenv("LMSTORE_CUDA_MLX_SB")) : -1);
    lms_cu_set_gemv_blocks(getenv("LMSTORE_CUDA_GEMV_BLOCKS") ? atoi(getenv("LMSTORE_CUDA_GEMV_BLOCKS")) : -1,
                           getenv("LMSTORE_CUDA_GEMV_GRID") ? atoi(getenv("LMSTORE_CUDA_GEMV_GRID")) : 0);
    if ((e = cudaSetDevice(b->ordinal)) || (e = cudaDeviceGetAttribute(&b->sms, cudaDevAttrMultiProcessorCount, b->ordinal)) ||
        (e = cudaStreamCreateWithFlags(&b->stream, cudaStreamNonBlocking)) || (e = lms_cu_kernels_init())) {
        rc = cu_err(e, "engine setup");
        goto out_fail;
    }
    struct cudaDeviceProp prop;
    if (cudaGetDeviceProperties(&prop, b->ordinal) == cudaSuccess)
        snprintf(b->desc, sizeof b->desc, "cuda sm_%d%d", prop.major, prop.minor);
    else
        snprintf(b->desc, sizeof b->desc, "cuda");

    size_t B = b->B;
    for (int i = 0; i < LMS__B_COUNT_; i++) {
        b->width[i] = lms__buf_width(hp, (lms__buf)i);
        b->maxw = LMS_MAX(b->maxw, b->width[i]);
        ALLOC(b->buf[i], B * b->width[i] * 4);
        cudaMemset(b->buf[i], 0, B * b->width[i] * 4);
    }
    size_t V = hp->n_vocab, hd = hp->head_dim, G = hp->n_heads / hp->n_kv_heads;
    /* split decoding: splits of chunk positions (128, more for contexts past 32k) cover n_ctx;
     * a shorter range is split finer, down to att_chunk positions a split (more blocks, less
     * serial work each), in up to ATT_SPLITS_FINE splits (each split's partial is merged by
     * one block: more would cost the merge more than they save); LMSTORE_CUDA_ATT_CHUNK
     * sets att_chunk (tuning). One-token steps may take as many splits as one wave of the
     * kernel's blocks holds (splits1), and no more (the launch caps them). */
    b->att_chunk = ATT_CHUNK_MIN;
    if (getenv("LMSTORE_CUDA_ATT_CHUNK") && atoi(getenv("LMSTORE_CUDA_ATT_CHUNK")) > 0)
        b->att_chunk = atoi(getenv("LMSTORE_CUDA_ATT_CHUNK"));
    uint32_t fine = ATT_SPLITS_FINE;
    if (getenv("LMSTORE_CUDA_ATT_SPLITS") && atoi(getenv("LMSTORE_CUDA_ATT_SPLITS")) > 0)
        fine = (uint32_t)atoi(getenv("LMSTORE_CUDA_ATT_SPLITS"));
    b->chunk = (int)LMS_MAX(128u, (cfg->n_ctx + 255) / 256);
    b->splits = (int)LMS_MAX((cfg->n_ctx + b->chunk - 1) / b->chunk,
                             LMS_MIN((cfg->n_ctx + b->att_chunk - 1) / b->att_chunk, fine));
    b->splits1 = LMS_MAX(b->splits, lms_cu_attn_wave_splits((int)hd, (int)G, cu_type(cfg->kv->dtype),
                                                           (int)hp->n_kv_heads));
    b->cluster_len = env_off("LMSTORE_CUDA_ATT_CLUSTER")
                         ? 0
                         : (uint32_t)lms_cu_attn_cluster_len((int)hd, (int)G, cu_type(cfg->kv->dtype));
    /* step parameters: a block table per group of the cache (kernels.h), then the rows and
     * tables of a step of segments */
    uint32_t ng = cfg->kv->window ? 2 : 1;
    b->seg_pos = LMS_CU_STEP_TOKENS + b->B + ng * b->max_pages;
    b->seg_rtab[0] = b->seg_pos + b->B;
    b->seg_rtab[1] = b->seg_rtab[0] + (ng - 1) * b->B;
    b->seg_out = b->seg_rtab[1] + b->B;
    b->seg_tab = b->seg_out + b->B;
    b->seg_cap = b->max_segs * ng * b->max_pages;
    size_t nstep = (size_t)b->seg_tab + b->seg_cap;
    ALLOC(b->xin, B * b->maxw * 4);
    ALLOC(b->xn, (size_t)GEMV_MAX_ROWS * b->maxw * 4);
    ALLOC(b->hbuf, (size_t)GEMV_MAX_ROWS * hp->n_ff * 4);
    if (lms__weights_find(b->w, hp, is_mlx, NULL, 0))
        ALLOC(b->wdq, DQ_BYTES);
    ALLOC(b->split_out, 2 * LMS_MIN(B, (size_t)SPLIT_MAX_ROWS) * LMS_MAX((size_t)b->maxw, V) * 4);
    ALLOC(b->dvec, LMS_MAX(b->w->vec_len, 1) * 4);
    ALLOC(b->inv_freq, hd * 4);
    ALLOC(b->dstep, nstep * 4);
    ALLOC(b->dlogits, (size_t)b->logit_rows * V * 4);
    ALLOC(b->did, 4);
    ALLOC(b->amax_scratch, LMS_CU_ARGMAX_SCRATCH);
    cudaMemset(b->amax_scratch, 0, LMS_CU_ARGMAX_SCRATCH);
    ALLOC(b->nadd_ws, 16 * 4);
    cudaMemset(b->nadd_ws, 0, 16 * 4);
    ALLOC(b->part, (size_t)GEMV_MAX_ROWS * hp->n_kv_heads * b->splits1 * G * (hd + 4) * 4);
    ALLOC(b->counters, B * hp->n_kv_heads * 4);
    ALLOC(b->blas_ws, BLAS_WS);
    if ((e = cudaHostAlloc((void **)&b->hstep, nstep * 4, cudaHostAllocDefault)) ||
        (e = cudaHostAlloc((void **)&b->hlogits, (size_t)b->logit_rows * V * 4, cudaHostAllocDefault)) ||
        (e = cudaHostAlloc((void **)&b->hid, 4, cudaHostAllocDefault))) {
        rc = lms__err(LMS_ENOMEM, "cuda engine: pinned host memory: %s", cudaGetErrorString(e));
        goto out_fail;
    }
    memset(b->hstep, 0, nstep * 4);
    float *freqs = lms__malloc(hd * 4);
    if (!freqs) {
        rc = LMS_ENOMEM;
        goto out_fail;
    }
    lms__rope_freqs(hp, LMS__ROPE_GLOBAL, freqs);
    lms__rope_freqs(hp, LMS__ROPE_LOCAL, freqs + hd / 2);
    e = cudaMemcpy(b->inv_freq, freqs, hd * 4, cudaMemcpyHostToDevice);
    lms__free(freqs);
    if (!e && b->w->vec_len)
        e = cudaMemcpy(b->dvec, b->w->vec_store, b->w->vec_len * 4, cudaMemcpyHostToDevice);
    if (!e)
        e = cudaMemset(b->counters, 0, B * hp->n_kv_heads * 4);
    if (!e) /* the default stream's memsets; not the device: a resident load may still be copying */
        e = cudaStreamSynchronize(0);
    if (e) {
        rc = cu_err(e, "engine setup copies");
        goto out_fail;
    }
    if ((rc = lms__blas_open()) != LMS_OK)
        goto out_fail;
    cublasStatus_t bs;
    if ((bs = lms__blas_create(&b->blas)) || (bs = lms__blas_set_stream(b->blas, b->stream)) ||
        (bs = lms__blas_set_workspace(b->blas, b->blas_ws, BLAS_WS))) {
        rc = lms__err(LMS_EDEVICE, "cuda engine: cuBLAS setup failed (status %d)", (int)bs);
        goto out_fail;
    }
    const lms__kvview *kv = cfg->kv;
    b->kv = kv;
    b->kvg[0] = (lms_cu_kv){kv->base, (int64_t)kv->page_bytes, (int64_t)kv->layer_bytes, (int64_t)kv->head_bytes,
                            (int64_t)kv->token_bytes, (int64_t)kv->v_offset, (int)kv->page_tokens,
                            cu_type(kv->dtype), (int)(LMS_CU_STEP_TOKENS + B), 0, 0};
    b->kvg[1] = b->kvg[0];
    b->kvg[1].base = kv->wbase;
    b->kvg[1].page_bytes = (int64_t)kv->wpage_bytes;
    b->kvg[1].table = (int)(LMS_CU_STEP_TOKENS + B + b->max_pages);
    *out = b;
    return 0;
out_fail:
    cuda_destroy(b);
    return rc;
}

static const char *cuda_describe(const lms__bk *b) { return b->desc; }

/* ---- steps ---------------------------------------------------------------------------------------- */

/* The window group's block table of a sequence (np entries) into t1. Its entries below
 * wfirst name pages given back: no key there is attended, but the prefill kernel loads
 * whole tiles of keys and masks those before the window, so they get a held page
 * (finite rows). */
static void window_table(int32_t *t1, const lms__kvview *kv, uint32_t np)
{
    uint32_t f = LMS_MIN(kv->wfirst, np - 1);
    for (uint32_t i = 0; i < f; i++) t1[i] = (int32_t)kv->wpages[f];
    memcpy(t1 + f, kv->wpages + f, (np - f) * 4);
}

/* The rows, tables and wanted rows of a step of segments into the step parameters. */
static int begin_segments(lms__bk *b, const lms__step *st)
{
    int32_t *h = b->hstep;
    uint32_t row = 0, used = 0, pt = b->kv->page_tokens;
    if (st->n_segs > b->max_segs)
        return lms__err(LMS_EINVAL, "cuda engine: a step of %u sequences (this engine takes at most %u)", st->n_segs,
                        b->max_segs);
    for (uint32_t i = 0; i < st->n_segs; i++) {
        const lms__seg *g = &st->segs[i];
        uint32_t np = (g->pos0 + g->nb + pt - 1) / pt;
        assert(g->row0 == row && g->nb >= 1 && g->pos0 + g->nb <= b->n_ctx);
        assert(g->kv->base == b->kvg[0].base && g->kv->window == b->kv->window && g->kv->page_tokens == pt);
        assert(np <= g->kv->n_pages && np <= b->max_pages);
        uint32_t t0 = b->seg_tab + used;
        memcpy(h + t0, g->kv->pages, np * 4);
        used += np;
        if (b->kv->window) {
            window_table(h + t0 + np, g->kv, np);
            used += np;
        }
        for (uint32_t t = 0; t < g->nb; t++, row++) {
            h[b->seg_pos + row] = (int32_t)(g->pos0 + t);
            h[b->seg_rtab[0] + row] = (int32_t)t0;
            if (b->kv->window)
                h[b->seg_rtab[1] + row] = (int32_t)(t0 + np); /* the window group's, after group 0's */
        }
    }
    assert(row == st->nb && used <= b->seg_cap);
    assert(st->out != LMS__OUT_ROWS || (st->n_out >= 1 && st->n_out <= st->nb));
    for (uint32_t i = 0; st->out == LMS__OUT_ROWS && i < st->n_out; i++) h[b->seg_out + i] = (int32_t)st->out_rows[i];
    cudaError_t e = cudaMemcpyAsync(b->dstep + b->seg_pos, h + b->seg_pos, (b->seg_tab - b->seg_pos + used) * 4,
                                    cudaMemcpyHostToDevice, b->stream);
    return e ? cu_err(e, "step parameters") : 0;
}

static int cuda_begin(lms__bk *b, const lms__step *st, bool *replayed)
{
    cudaError_t e;
    assert(st->nb >= 1 && st->nb <= b->B && (st->n_segs || st->pos0 + st->nb <= b->n_ctx));
    assert(st->kv->base == b->kvg[0].base && st->kv->window == b->kv->window);
    *replayed = false;
    lms_cu_set_pdl(b->pdl);
    lms_cu_pdl_next(0);
    b->st = st;
    b->err = 0;
    b->capturing = false;
    b->short_step = false;
    b->mode = st->out == LMS__OUT_LAST ? MODE_LAST : st->out == LMS__OUT_ARGMAX ? MODE_ARGMAX : MODE_NONE;
    if (st->n_segs) {
        int rc;
        b->hstep[LMS_CU_STEP_NB] = (int32_t)st->nb;
        b->hstep[LMS_CU_STEP_POS0] = (int32_t)st->pos0;
        b->hstep[2] = 0;
        memcpy(b->hstep + LMS_CU_STEP_TOKENS, st->tokens, st->nb * 4);
        if ((e = cudaSetDevice(b->ordinal)) ||
            (e = cudaMemcpyAsync(b->dstep, b->hstep, (LMS_CU_STEP_TOKENS + st->nb) * 4, cudaMemcpyHostToDevice,
                                 b->stream)))
            return cu_err(e, "step parameters");
        if ((rc = begin_segments(b, st)))
            b->st = NULL;
        return rc; /* never recorded into a graph */
    }
    uint32_t np = (st->pos0 + st->nb + st->kv->page_tokens - 1) / st->kv->page_tokens;
    assert(np <= st->kv->n_pages && np <= b->max_pages);
    b->hstep[LMS_CU_STEP_NB] = (int32_t)st->nb;
    b->hstep[LMS_CU_STEP_POS0] = (int32_t)st->pos0;
    b->hstep[2] = (int32_t)np;
    memcpy(b->hstep + LMS_CU_STEP_TOKENS, st->tokens, st->nb * 4);
    memcpy(b->hstep + LMS_CU_STEP_TOKENS + b->B, st->kv->pages, np * 4);
    if ((e = cudaSetDevice(b->ordinal)) ||
        (e = cudaMemcpyAsync(b->dstep, b->hstep, (LMS_CU_STEP_TOKENS + b->B + np) * 4, cudaMemcpyHostToDevice,
                             b->stream)))
        return cu_err(e, "step parameters");
    if (st->kv->window) {
        int32_t *t1 = b->hstep + b->kvg[1].table;
        window_table(t1, st->kv, np);
        if ((e = cudaMemcpyAsync(b->dstep + b->kvg[1].table, t1, np * 4, cudaMemcpyHostToDevice, b->stream)))
            return cu_err(e, "step parameters");
    }
    b->short_step = st->nb == 1 && st->pos0 < b->cluster_len;
    bool graphable = b->use_graphs && st->nb == 1 && st->out != LMS__OUT_ALL;
    cudaGraphExec_t *gx = &b->graph[b->mode][b->short_step];
    if (graphable && *gx) {
        if ((e = cudaGraphLaunch(*gx, b->stream)))
            return cu_err(e, "decode graph launch");
        *replayed = true;
        return 0;
    }
    if (graphable) {
        if ((e = cudaStreamBeginCapture(b->stream, cudaStreamCaptureModeThreadLocal)))
            return cu_err(e, "decode graph capture");
        b->capturing = true;
    }
    return 0;
}

static int cuda_end(lms__bk *b)
{
    cudaError_t e = cudaSuccess;
    int rc = 0;
    flush_rope(b);
    lms_cu_pdl_next(0); /* a step's last post-norm may have marked a launch that never came */
    if (b->capturing) {
        cudaGraph_t g = NULL;
        b->capturing = false;
        e = cudaStreamEndCapture(b->stream, &g);
        if (!e && !b->err) {
            cudaGraphExec_t *gx = &b->graph[b->mode][b->short_step];
            e = cudaGraphInstantiate(gx, g, 0);
            if (!e)
                e = cudaGraphLaunch(*gx, b->stream);
        }
        if (g)
            cudaGraphDestroy(g);
        if (e)
            fail(b, (int)e, "decode graph");
    }
    if ((e = cudaStreamSynchronize(b->stream)))
        fail(b, (int)e, "step");
    if (b->err) {
        rc = lms__err(LMS_EDEVICE, "cuda engine: %s failed: %s (%d)", b->err_what,
                      b->err < 1000 ? cudaGetErrorString((cudaError_t)b->err) : "cuBLAS", b->err);
        cudaGetLastError(); /* clear a non-sticky error */
    } else if (b->mode == MODE_LAST && b->st->logits) {
        memcpy(b->st->logits, b->hlogits, (size_t)b->hp->n_vocab * 4);
    } else if (b->mode == MODE_ARGMAX && b->st->argmax) {
        *b->st->argmax = *b->hid;
    }
    b->st = NULL;
    return rc;
}

static void cuda_embed(lms__bk *b, float scale)
{
    flush_rope(b);
    const lms__wt *e = &b->w->embed;
    if (e->mlx) {
        const lms__mlx_q *q = e->mlx;
        CU_TRY(b, lms_cu_embed_mlx_launch(b->buf[LMS__B_X], e->dp, q->dscales, q->dbiases, (int)q->bits, cu_type(q->sdt),
                                          (int)b->hp->n_embd, (int)q->group, scale, b->dstep, (int)b->st->nb,
                                          b->stream),
               "embedding");
        return;
    }
    CU_TRY(b, lms_cu_embed_launch(b->buf[LMS__B_X], e->dp, cu_type(e->dt), (int)b->hp->n_embd, scale, b->dstep,
                                  (int)b->st->nb, b->stream),
           "embedding");
}

/* c[col][r] (=, or += with beta 1) W . xin[col] for an MLX matrix W, cols columns of
 * xin (bf16): rows of W dequantized into wdq as two bf16 halves (value and rounding
 * error, DQ_BYTES for both), a cuBLAS product with each, summed. Prefill is
 * compute-bound, so the dequantization (one pass over the codes) costs little
 * against the products; decode never comes here (the GEMV reads the codes). */
static void mm_mlx(lms__bk *b, const lms__wt *w, int cols, float beta, float *c, int ldc)
{
    const lms__mlx_q *q = w->mlx;
    const float one = 1.0f;
    uint32_t K = w->cols, chunk = (uint32_t)LMS_MAX(1u, DQ_BYTES / 2 / ((size_t)K * 2));
    uint16_t *hi = b->wdq, *lo = hi + (size_t)chunk * K;
    for (uint32_t r0 = 0; r0 < w->rows && !b->err; r0 += chunk) {
        uint32_t n = LMS_MIN(chunk, w->rows - r0);
        CU_TRY(b, lms_cu_mlx_dequant_launch(hi, lo, w->dp, q->dscales, q->dbiases, (int)q->bits, cu_type(q->sdt),
                                            (int)K, (int)q->group, (int)r0, (int)n, b->stream),
               "MLX dequantization");
        for (int h = 0; h < 2; h++) {
            cublasStatus_t st = lms__blas_gemm_ex(b->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)n, cols, (int)K, &one,
                                             h ? lo : hi, CUDA_R_16BF, (int)K, b->xin, CUDA_R_16BF, (int)K,
                                             h ? &one : &beta, c + r0, CUDA_R_32F, ldc, CUBLAS_COMPUTE_32F,
                                             CUBLAS_GEMM_DEFAULT);
            if (st != CUBLAS_STATUS_SUCCESS)
                fail(b, 1000 + (int)st, "cuBLAS matrix product");
        }
    }
}

/* One matrix product group on rows [row0, row0 + n) (n == 0: the step's rows). With
 * nadd_y (one job), the GEMV path also adds RMSNorm(its output) * nadd_w to nadd_y
 * and returns true; false: the caller does that. */
static bool mm_run(lms__bk *b, const lms__mm *jobs, int n_jobs, uint32_t row0, uint32_t n, float *y_override,
                   int ldy_override, float *nadd_y, const float *nadd_w)
{
    const lms__mm *j0 = &jobs[0];
    uint32_t K = j0->w->cols, nb = n ? n : b->st->nb;
    int pro = pro_of(j0), wtype = cu_type(j0->w->dt);
    const lms__mlx_q *q0 = j0->w->mlx;
    const float *x = b->buf[j0->x], *x2 = j0->act != LMS__ACT_NONE ? b->buf[j0->x2] : NULL;
    int ldx = (int)b->width[j0->x];
    assert(K == b->width[j0->x]);
    bool same_type = true;
    for (int i = 1; i < n_jobs; i++) same_type = same_type && same_enc(jobs[i].w, j0->w);
    if (nb <= GEMV_MAX_ROWS && same_type) {
        /* the input, transformed once into device scratch (rows of K floats) */
        const float *xg = x + (size_t)row0 * ldx;
        int ldg = ldx;
        if (j0->act != LMS__ACT_NONE) {
            if (!(b->h_valid && j0->x == LMS__B_G && j0->x2 == LMS__B_U && pro == b->h_act))
                CU_TRY(b, lms_cu_act_mul_launch(b->hbuf, x, x2, (int)K, pro, b->dstep, (int)nb, b->stream),
                       "gated activation");
            xg = b->hbuf, ldg = (int)K;
        }
        lms_cu_gemv a;
        memset(&a, 0, sizeof a);
        for (int i = 0; i < n_jobs; i++) {
            a.w[i] = jobs[i].w->dp;
            a.y[i] = y_override ? y_override : b->buf[jobs[i].y];
            a.ldy[i] = y_override ? ldy_override : (int)b->width[jobs[i].y];
            a.bias[i] = dv(b, jobs[i].bias);
            a.rows[i] = (int)jobs[i].w->rows;
            a.acc[i] = jobs[i].acc;
            if (q0) {
                a.scales[i] = jobs[i].w->mlx->dscales;
                a.biases[i] = jobs[i].w->mlx->dbiases;
            }
            assert(y_override || b->width[jobs[i].y] == jobs[i].w->rows);
        }
        /* gate and up: the warp that computes row r of both writes act(gate) * up too,
         * the down projection's input (b->hbuf) */
        bool pair = n_jobs == 2 && !y_override && jobs[0].y == LMS__B_G && jobs[1].y == LMS__B_U && !jobs[0].acc &&
                    !jobs[1].acc && jobs[0].w->rows == jobs[1].w->rows && b->hp->act != LMS__ACT_NONE;
        a.n_jobs = n_jobs;
        a.wtype = wtype;
        a.K = (int)K;
        a.x = xg;
        a.ldx = ldg;
        a.norm = dv(b, j0->norm); /* the GEMV applies it (RMS scale summed over the same loads) */
        a.eps = b->hp->eps;
        a.pair_act = pair ? (b->hp->act == LMS__ACT_SILU ? LMS_CU_PRO_SILU : LMS_CU_PRO_GELU) : 0;
        a.h = b->hbuf;
        a.ldh = (int)b->hp->n_ff;
        a.step = b->dstep;
        a.nb_max = (int)nb;
        a.nb_fixed = n ? (int)n : 0;
        a.row0 = 0;
        a.y_row0 = y_override ? 0 : (int)row0;
        if (nadd_y) {
            assert(n_jobs == 1 && !jobs[0].acc && !y_override && row0 == 0 && !pair);
            a.nadd_y = nadd_y;
            a.nadd_w = nadd_w;
            a.nadd_ws = b->nadd_ws;
        }
        if (q0) {
            a.group = (int)q0->group;
            a.exact = b->mlx_exact;
            CU_TRY(b, lms_cu_gemv_mlx_launch(&a, (int)q0->bits, cu_type(q0->sdt), b->stream), "matrix-vector product");
        } else {
            a.late_release = b->late_pdl && !b->pdl;
            CU_TRY(b, lms_cu_gemv_launch(&a, b->sms, b->stream), "matrix-vector product");
            if (a.late_release)
                lms_cu_pdl_next(1);
        }
        b->h_valid = pair;
        b->h_act = a.pair_act;
        return true;
    }
    b->h_valid = false;
    /* GEMM: the input transformed once into the weights' type, then cuBLAS per job.
     * Steps of at most SPLIT_MAX_ROWS rows are memory-bound (each weight is read
     * once whatever the rows): their 16-bit input is split into two halves
     * (value and rounding error) multiplied in one product and summed, which
     * costs no time and keeps about 16 bits of the f32 activations. */
    for (int i = 0; i < n_jobs; i++) {
        const lms__mm *j = &jobs[i];
        int jt = mm_type(j->w);
        bool split = nb <= SPLIT_MAX_ROWS && jt != LMS_CU_F32;
        if (i == 0 || jt != mm_type(jobs[i - 1].w)) /* a job of another weight type needs its own input */
            CU_TRY(b, lms_cu_prologue_launch(b->xin, jt, x, x2, ldx, dv(b, j0->norm), pro, b->hp->eps, (int)K,
                                             (int)row0, (int)nb, n ? NULL : b->dstep, split, b->stream),
                   "matrix product input");
        float alpha = 1.0f, beta = j->acc && !split ? 1.0f : 0.0f;
        float *y = y_override ? y_override : b->buf[j->y] + (size_t)row0 * b->width[j->y];
        int ldy = y_override ? ldy_override : (int)b->width[j->y];
        float *c = split ? b->split_out : y;
        int ldc = split ? (int)j->w->rows : ldy;
        if (j->w->mlx)
            mm_mlx(b, j->w, split ? 2 * (int)nb : (int)nb, beta, c, ldc);
        else {
            cublasStatus_t st = lms__blas_gemm_ex(b->blas, CUBLAS_OP_T, CUBLAS_OP_N, (int)j->w->rows,
                                             split ? 2 * (int)nb : (int)nb, (int)K, &alpha, j->w->dp, blas_type(jt),
                                             (int)K, b->xin, blas_type(jt), (int)K, &beta, c, CUDA_R_32F, ldc,
                                             CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT);
            if (st != CUBLAS_STATUS_SUCCESS)
                fail(b, 1000 + (int)st, "cuBLAS matrix product");
        }
        if (split)
            CU_TRY(b, lms_cu_split_sum_launch(y, ldy, b->split_out, (int)j->w->rows, (int)nb, dv(b, j->bias), j->acc,
                                              b->stream),
                   "split product sum");
        else if (j->bias)
            CU_TRY(b, lms_cu_bias_launch(y, ldy, dv(b, j->bias), (int)j->w->rows, b->dstep, (int)nb, b->stream),
                   "bias");
    }
    return false;
}

static void cuda_matmul(lms__bk *b, const lms__mm *jobs, int n)
{
    flush_rope(b);
    assert(n >= 1 && n <= LMS_CU_GEMV_JOBS);
    for (int i = 1; i < n; i++) assert(jobs[i].x == jobs[0].x && jobs[i].norm == jobs[0].norm && jobs[i].act == jobs[0].act);
    mm_run(b, jobs, n, 0, 0, NULL, 0, NULL, NULL);
}

/* The geometry of layer's group and the layer's index within it; in a step of
 * segments, with the rows' own positions and tables. */
static lms_cu_kv kv_of(const lms__bk *b, uint32_t layer, int *index)
{
    int g = b->kv->group ? b->kv->group[layer] : 0;
    *index = (int)(b->kv->group ? b->kv->index[layer] : layer);
    lms_cu_kv kv = b->kvg[g];
    if (b->st && b->st->n_segs) {
        kv.rpos = (int)b->seg_pos;
        kv.rtable = (int)b->seg_rtab[g];
    }
    return kv;
}

static void rope_launch(lms__bk *b, uint32_t layer, const float *q_norm, const float *k_norm, int rope)
{
    const lms__hparams *hp = b->hp;
    int li;
    lms_cu_kv kv = kv_of(b, layer, &li);
    lms_cu_rope a = {b->buf[LMS__B_Q], b->buf[LMS__B_K], b->buf[LMS__B_V], dv(b, q_norm), dv(b, k_norm),
                     b->inv_freq + (rope == LMS__ROPE_LOCAL ? hp->head_dim / 2 : 0), (int)hp->n_heads,
                     (int)hp->n_kv_heads, (int)hp->head_dim, li, hp->eps, kv, b->dstep, (int)b->B,
                     (int)b->st->nb};
    CU_TRY(b, lms_cu_rope_launch(&a, b->stream), "rope");
}

/* A deferred RoPE that no attention took: run it now (before anything reads Q, K or the cache). */
static void flush_rope(lms__bk *b)
{
    if (!b->rope.pending)
        return;
    b->rope.pending = false;
    rope_launch(b, b->rope.layer, b->rope.q_norm, b->rope.k_norm, b->rope.rope);
}

/* One-token steps defer RoPE into the attention of the same layer (the attention kernel
 * rotates q and k itself and writes the token's K/V): one launch fewer per layer. Q then
 * holds the un-rotated q after the attention (nothing reads it). */
static void cuda_qk_rope(lms__bk *b, uint32_t layer, const float *q_norm, const float *k_norm, int rope)
{
    flush_rope(b);
    if (b->st->nb == 1 && !b->st->n_segs && !b->no_fuse) {
        b->rope.pending = true;
        b->rope.layer = layer;
        b->rope.q_norm = q_norm;
        b->rope.k_norm = k_norm;
        b->rope.rope = rope;
        return;
    }
    rope_launch(b, layer, q_norm, k_norm, rope);
}

/* Rows [r0, r0 + n) of a step of segments, each over its own sequence, by the decoding
 * kernel: the splits per row shrink as rows grow, so that n x splits stays within the
 * partials' scratch (GEMV_MAX_ROWS x splits). */
static void attention_rows(lms__bk *b, lms_cu_attn *a, uint32_t r0, uint32_t n)
{
    uint32_t sp = LMS_MIN((uint32_t)b->splits, LMS_MAX(1u, GEMV_MAX_ROWS * (uint32_t)b->splits / n));
    a->splits = (int)sp;
    a->chunk = b->att_chunk;
    a->row0 = (int)r0;
    a->nrows = (int)n;
    a->decode_only = 1;
    CU_TRY(b, lms_cu_attn_launch(a, (int)n, b->stream), "attention");
}

/* Attention of a step of segments: the tensor-core kernel for each segment of more than
 * GEMV_MAX_ROWS rows where it covers the cache, one decoding launch for each run of
 * rows between them (decode rows of many sequences, short chunks). */
static void attention_segments(lms__bk *b, lms_cu_attn *a)
{
    const lms__step *st = b->st;
    uint32_t r0 = 0;
    for (uint32_t i = 0; i < st->n_segs; i++) {
        const lms__seg *g = &st->segs[i];
        if (!b->fa_ok || g->nb <= GEMV_MAX_ROWS)
            continue;
        if (g->row0 > r0)
            attention_rows(b, a, r0, g->row0 - r0);
        a->row0 = (int)g->row0;
        a->nrows = (int)g->nb;
        a->decode_only = 0;
        CU_TRY(b, lms_cu_attn_launch(a, (int)g->nb, b->stream), "attention");
        r0 = g->row0 + g->nb;
    }
    if (st->nb > r0)
        attention_rows(b, a, r0, st->nb - r0);
}

static void cuda_attention(lms__bk *b, uint32_t layer, uint32_t window, float scale, float softcap)
{
    const lms__hparams *hp = b->hp;
    lms_cu_attn a;
    memset(&a, 0, sizeof a);
    a.q = b->buf[LMS__B_Q];
    a.out = b->buf[LMS__B_ATT];
    a.n_heads = (int)hp->n_heads;
    a.n_kv = (int)hp->n_kv_heads;
    a.hd = (int)hp->head_dim;
    a.kv = kv_of(b, layer, &a.layer);
    a.window = (int)window;
    a.scale = scale;
    a.softcap = softcap;
    a.step = b->dstep;
    a.max_block = (int)b->B;
    a.part = b->part;
    a.counters = b->counters;
    a.splits = b->splits;
    a.chunk = b->att_chunk;
    if (b->rope.pending && b->rope.layer == layer) {
        b->rope.pending = false;
        a.fuse_rope = 1;
        a.k_new = b->buf[LMS__B_K];
        a.v_new = b->buf[LMS__B_V];
        a.q_norm = dv(b, b->rope.q_norm);
        a.k_norm = dv(b, b->rope.k_norm);
        a.inv_freq = b->inv_freq + (b->rope.rope == LMS__ROPE_LOCAL ? hp->head_dim / 2 : 0);
        a.eps = hp->eps;
    }
    flush_rope(b);
    if (b->st->n_segs) {
        attention_segments(b, &a);
        return;
    }
    a.splits = b->st->nb == 1 ? b->splits1 : b->st->nb <= GEMV_MAX_ROWS ? b->splits : 1;
    a.cluster = b->short_step;
    CU_TRY(b, lms_cu_attn_launch(&a, (int)b->st->nb, b->stream), "attention");
}

static void cuda_norm_add(lms__bk *b, lms__buf y, lms__buf x, const float *w)
{
    flush_rope(b);
    CU_TRY(b, lms_cu_norm_add_launch(b->buf[y], b->buf[x], dv(b, w), (int)b->hp->n_embd, b->hp->eps, b->dstep,
                                     (int)b->st->nb, b->stream),
           "norm add");
}

/*
 * Decode steps (GEMV) of models without programmatic dependent launch on every kernel
 * (16-bit weights): the product, then norm_add as its programmatic dependent, and the
 * next launch (the next product) as norm_add's. That next product's first weight loads
 * then overlap norm_add, and the product ends without a last block that runs alone:
 * its ticket, fence and the post-norm's round trips (faster on the H200 than the post-
 * norm in the product's last block, bench/RESULTS.md; LMSTORE_CUDA_POST_PDL=0 keeps
 * that). Models with PDL on: the post-norm in the product's last block (kernels.h:
 * nadd_y). Prefill: the GEMM, then norm_add.
 */
static void cuda_matmul_norm_add(lms__bk *b, const lms__mm *job, lms__buf y, const float *w)
{
    flush_rope(b);
    assert(!job->acc && b->width[job->y] == b->hp->n_embd && b->width[y] == b->hp->n_embd);
    if (!b->post_last && !b->pdl && b->st->nb <= GEMV_MAX_ROWS) {
        mm_run(b, job, 1, 0, 0, NULL, 0, NULL, NULL);
        lms_cu_pdl_next(1);
        cuda_norm_add(b, y, job->y, w);
        lms_cu_pdl_next(1);
        return;
    }
    if (!mm_run(b, job, 1, 0, 0, NULL, 0, b->buf[y], dv(b, w)))
        cuda_norm_add(b, y, job->y, w);
}

static void cuda_head(lms__bk *b, const lms__mm *j, uint32_t row0, uint32_t n, float softcap, float *host_out)
{
    flush_rope(b);
    size_t V = j->w->rows;
    /* every row's or the wanted rows' logits are delivered now, logit_rows at a time
     * (the scratch is reused by the next rows); the last row's by end() */
    bool now = b->st->out == LMS__OUT_ALL || b->st->out == LMS__OUT_ROWS;
    assert(n >= 1 && row0 + n <= b->st->nb && (now || n <= b->logit_rows));
    for (uint32_t r = 0; r < n && !b->err; r += b->logit_rows) {
        uint32_t cn = LMS_MIN(b->logit_rows, n - r);
        mm_run(b, j, 1, row0 + r, cn, b->dlogits, (int)V, NULL, NULL);
        if (softcap > 0)
            CU_TRY(b, lms_cu_softcap_launch(b->dlogits, (size_t)cn * V, softcap, b->stream), "softcap");
        CU_TRY(b, cudaMemcpyAsync(b->hlogits, b->dlogits, (size_t)cn * V * 4, cudaMemcpyDeviceToHost, b->stream),
               "logits copy");
        if (now) {
            CU_TRY(b, cudaStreamSynchronize(b->stream), "logits copy");
            if (!b->err)
                memcpy(host_out + (size_t)r * V, b->hlogits, (size_t)cn * V * 4);
        }
    }
}

/* Rows rows[i] of buffer id to rows i (the wanted rows of a step of segments, whose
 * device copy begin() made): gathered into scratch, then copied back. */
static void cuda_gather(lms__bk *b, lms__buf id, const uint32_t *rows, uint32_t n)
{
    size_t W = b->width[id];
    flush_rope(b);
    assert(b->st->n_segs && b->st->out == LMS__OUT_ROWS && rows == b->st->out_rows && n == b->st->n_out);
    (void)rows;
    CU_TRY(b, lms_cu_gather_launch((float *)b->xin, b->buf[id], (int)W, b->dstep + b->seg_out, (int)n, b->stream),
           "gather");
    CU_TRY(b, cudaMemcpyAsync(b->buf[id], b->xin, n * W * 4, cudaMemcpyDeviceToDevice, b->stream), "gather");
    b->h_valid = false;
}

static void cuda_head_argmax(lms__bk *b, const lms__mm *j, float softcap, int32_t *id)
{
    flush_rope(b);
    size_t V = j->w->rows;
    (void)id; /* delivered by end() into step.argmax */
    mm_run(b, j, 1, b->st->nb - 1, 1, b->dlogits, (int)V, NULL, NULL);
    if (softcap > 0)
        CU_TRY(b, lms_cu_softcap_launch(b->dlogits, V, softcap, b->stream), "softcap");
    CU_TRY(b, lms_cu_argmax_launch(b->dlogits, (int)V, b->did, b->amax_scratch, b->stream), "argmax");
    CU_TRY(b, cudaMemcpyAsync(b->hid, b->did, 4, cudaMemcpyDeviceToHost, b->stream), "argmax copy");
}

static double cuda_membw(lms__bk *b, size_t bytes)
{
    void *buf = NULL;
    uint32_t *sink = NULL;
    cudaEvent_t e0 = NULL, e1 = NULL;
    double best = 0;
    bytes &= ~(size_t)15;
    cudaSetDevice(b->ordinal);
    if (cudaMalloc(&buf, bytes) || cudaMalloc((void **)&sink, 4) || cudaMemset(buf, 0x3c, bytes) ||
        cudaEventCreate(&e0) || cudaEventCreate(&e1))
        goto out;
    for (int r = 0; r < 6; r++) { /* the first pass warms up */
        float ms = 0;
        if (cudaEventRecord(e0, b->stream) || lms_cu_readbw_launch(buf, bytes / 16, sink, b->sms, b->stream) ||
            cudaEventRecord(e1, b->stream) || cudaEventSynchronize(e1) || cudaEventElapsedTime(&ms, e0, e1))
            goto out;
        if (r > 0 && ms > 0)
            best = LMS_MAX(best, bytes / (ms * 1e-3) / 1e9);
    }
out:
    cudaGetLastError();
    if (e0)
        cudaEventDestroy(e0);
    if (e1)
        cudaEventDestroy(e1);
    cudaFree(sink);
    cudaFree(buf);
    return best;
}

static int cuda_read(lms__bk *b, lms__buf id, uint32_t n, float *host)
{
    if (b->st) { /* inside a step: the deferred RoPE first */
        flush_rope(b);
        cudaStreamSynchronize(b->stream);
    }
    cudaError_t e = cudaMemcpy(host, b->buf[id], (size_t)n * b->width[id] * 4, cudaMemcpyDeviceToHost);
    return e ? cu_err(e, "read activations") : 0;
}

static int cuda_write(lms__bk *b, lms__buf id, uint32_t n, const float *host)
{
    b->h_valid = false;
    cudaError_t e = cudaMemcpy(b->buf[id], host, (size_t)n * b->width[id] * 4, cudaMemcpyHostToDevice);
    return e ? cu_err(e, "write activations") : 0;
}

const lms__fwd_ops lms__fwd_cuda_ops = {
    .name = "cuda",
    .segments = true,
    .create = cuda_create,
    .destroy = cuda_destroy,
    .describe = cuda_describe,
    .supports = cuda_supports,
    .begin = cuda_begin,
    .end = cuda_end,
    .embed = cuda_embed,
    .matmul = cuda_matmul,
    .qk_rope = cuda_qk_rope,
    .attention = cuda_attention,
    .norm_add = cuda_norm_add,
    .matmul_norm_add = cuda_matmul_norm_add,
    .head = cuda_head,
    .head_argmax = cuda_head_argmax,
    .gather = cuda_gather,
    .membw = cuda_membw,
    .read = cuda_read,
    .write = cuda_write,
};
