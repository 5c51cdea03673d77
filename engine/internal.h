/*
 * engine/internal.h - the engine's internal interfaces: model hyper-parameters
 * (parsed from config.json), the weight views a forward pass reads, the KV
 * view attention reads in place, the CPU kernel table chosen at run time, and
 * the forward pass itself.
 *
 * Layering (each file says which part it is):
 *   config.c            config.json -> lms__hparams (families check their settings)
 *   model_llama.c, model_qwen2.c, model_qwen3.c, model_gemma3.c
 *                       one family each: architecture names, defaults, which
 *                       optional tensors (biases, q/k norms) exist
 *   weights.c           binds tensor views from a weight source (the loader's
 *                       lms_model, or a safetensors folder for tools) with shape checks
 *   layers.c            the forward pass over a block of tokens (shared by all families),
 *                       written against the backend table of engine/backend.h
 *   cpu/fwd_cpu.c       the CPU backend: the forward operations over the thread pool
 *   cpu/kernels*.c      SIMD kernels (AVX-512, AVX2/FMA/F16C, portable), run-time dispatch
 *   cuda/               the CUDA backend (built with LMS_CUDA)
 *   engine.c            lms_engine_*: KV cache glue, eval, sessions
 *   generate.c          lms_generate: prefix reuse, sampling, stops, metrics
 */
#ifndef LMS_ENGINE_INTERNAL_H
#define LMS_ENGINE_INTERNAL_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "common/common.h"
#include "lmstore/store.h"

#define LMS__MAX_EOS 8
#define LMS__MAX_LAYERS 4096 /* config.c's bound on num_hidden_layers */

/* ---- hyper-parameters ------------------------------------------------------------ */

typedef enum lms__rope_kind {
    LMS__ROPE_DEFAULT = 0,
    LMS__ROPE_LINEAR,
    LMS__ROPE_LLAMA3,
} lms__rope_kind;

struct lms__family;

/* Gated activations of the MLP (and of backend matrix-product prologues). */
typedef enum lms__act {
    LMS__ACT_NONE = 0,
    LMS__ACT_SILU,      /* silu(g) * u (SwiGLU) */
    LMS__ACT_GELU_TANH, /* gelu_tanh(g) * u (GeGLU) */
} lms__act;

typedef struct lms__hparams {
    const struct lms__family *family;
    char arch_name[64];      /* as written in config.json (architectures[0]) */
    uint32_t n_vocab, n_embd, n_layers, n_heads, n_kv_heads, head_dim, n_ff;
    uint32_t max_pos;
    float eps;
    double rope_theta;
    lms__rope_kind rope_kind;
    double rope_factor, rope_low_freq, rope_high_freq;
    uint32_t rope_orig_max_pos;
    bool tie_embeddings;
    bool qkv_bias;           /* q/k/v projections have biases */
    bool o_bias;             /* o_proj has a bias (llama attention_bias) */
    bool qk_norm;            /* per-head RMSNorm of q and k before RoPE */
    lms__act act;            /* the MLP's gated activation */
    float embed_scale;       /* embeddings are multiplied by this; 1 = none */
    float attn_scale;        /* attention score scale; 1/sqrt(head_dim) unless the family says */
    float attn_softcap;      /* scores capped to c * tanh(s / c); 0 = none */
    float final_softcap;     /* logits capped likewise; 0 = none */
    uint32_t window;         /* sliding window of the layers marked in `sliding`; 0 = none */
    uint8_t sliding[LMS__MAX_LAYERS]; /* [n_layers] 1 = a sliding-window (local) layer */
    double rope_local_theta; /* RoPE base of the sliding layers (unscaled); 0 = the global table */
    bool norm_plus_one;      /* RMSNorm weights are stored as w and used as 1 + w (Gemma) */
    bool post_norms;         /* RMSNorm of the attention and MLP outputs before each residual add,
                                and a separate pre-MLP norm (Gemma's four norms per layer) */
    int32_t bos_id;          /* -1 = none */
    int32_t eos_ids[LMS__MAX_EOS];
    int n_eos;
} lms__hparams;

/* A model family: the architectures it runs and its settings check. */
typedef struct lms__family {
    const char *name;               /* "llama", "qwen2", "qwen3", "gemma3" */
    const char *const *archs;       /* config "architectures" names, NULL-terminated */
    const char *model_type;         /* config "model_type" */
    /* Fill family-specific fields from the parsed config (cJSON *: the text
     * model's part, defaults filled in), checking settings; LMS_EUNSUPPORTED
     * naming the setting. */
    int (*configure)(lms__hparams *hp, const void *cjson_root, const char *src);
    /* (optional) multimodal architectures (and their model_type) whose language
     * model this family runs: read from their config's text_config */
    const char *const *mm_archs;
    const char *mm_model_type;
    /* (optional) a JSON object of config values for keys a config leaves out */
    const char *defaults;
} lms__family;

extern const lms__family lms__family_llama;
extern const lms__family lms__family_qwen2;
extern const lms__family lms__family_qwen3;
extern const lms__family lms__family_gemma3;

/*
 * Parse config.json text (and optionally generation_config.json text, may be
 * NULL) into *hp. `src` names the model in messages. LMS_EFORMAT for a
 * malformed file or field, LMS_EUNSUPPORTED naming an architecture or setting.
 */
int lms__config_parse(const char *config, const char *gen_config, const char *src, lms__hparams *hp);
/* RoPE type and scaling from one settings object ({rope_type | type, factor,
 * ...}, a cJSON *; NULL = default) into hp (rope_theta is the caller's). */
int lms__config_rope(lms__hparams *hp, const void *params, const char *src);

/* ---- weights -------------------------------------------------------------------- */

/* What an MLX_AFFINE matrix needs besides its codes: per row cols/group
 * scales and biases (x = s * q + b), read in place like the codes. */
typedef struct lms__mlx_q {
    const void *scales, *biases;   /* [rows][cols / group] of sdt: host bytes */
    const void *dscales, *dbiases; /* the same on the engine's device (NULL on the CPU) */
    lms_dtype sdt;                 /* F32, F16 or BF16 */
    uint32_t bits, group;          /* 2..8 bits a code (not 7); groups of 32, 64 or 128 */
} lms__mlx_q;

/*
 * A weight matrix [rows][cols] (row-major, read in place) or vector [rows].
 * dt is BF16, F16 or F32 (vectors are always these), a GGUF block type (each
 * row is cols / block_elems blocks, lms__wt_row_bytes apart) or MLX_AFFINE
 * (codes of mlx->bits bits, lms__wt_row_bytes a row, with mlx's scales and
 * biases). Shapes are in elements for every dtype.
 */
typedef struct lms__wt {
    const void *p;       /* borrowed: mapped bytes, valid while the source lives */
    const void *dp;      /* the same bytes on the engine's device (NULL on the CPU) */
    lms_dtype dt;
    uint32_t rows, cols;
    const lms__mlx_q *mlx; /* MLX_AFFINE only (owned by lms__weights), else NULL */
} lms__wt;

/* Bytes of one row of w (cols elements in w's encoding). */
size_t lms__wt_row_bytes(const lms__wt *w);

typedef struct lms__layer_w {
    lms__wt wq, wk, wv, wo;         /* [n_heads*hd][n_embd], [n_kv*hd][n_embd] x2, [n_embd][n_heads*hd] */
    lms__wt w_gate, w_up, w_down;   /* [n_ff][n_embd] x2, [n_embd][n_ff] */
    float *attn_norm, *ffn_norm;    /* [n_embd], f32 copies (small); ffn_norm is the MLP's input norm */
    float *post_attn_norm, *post_ffn_norm; /* [n_embd] with hp->post_norms, else NULL */
    float *bq, *bk, *bv, *bo;       /* biases or NULL */
    float *q_norm, *k_norm;         /* [head_dim] or NULL */
} lms__layer_w;

typedef struct lms__weights {
    lms__wt embed;                  /* [n_vocab][n_embd] */
    lms__wt lm_head;                /* [n_vocab][n_embd] (the embedding when tied) */
    float *final_norm;              /* [n_embd] */
    lms__layer_w *layers;           /* [n_layers] */
    float *vec_store;               /* owns every f32 vector above */
    size_t vec_len;                 /* floats in vec_store */
    lms__mlx_q *mlx_store;          /* owns the MLX descriptors the matrices point to (or NULL) */
    size_t n_mlx;
} lms__weights;

/* Where tensors come from: the loader's lms_model or a safetensors folder.
 * tensor() gives the host view and, when the source placed it on a device,
 * the device address (*dev, else NULL). */
typedef struct lms__wsrc {
    void *ctx;
    /* Tensor view by name: 0, or LMS_ENOENT (without detail). */
    int (*tensor)(void *ctx, const char *name, lms_dtype *dt, uint32_t *ndim, uint64_t shape[LMS_MAX_DIMS],
                  const void **data, const void **dev, uint64_t *nbytes);
    /* A side file (config.json ...): caller frees *data with lms__free / lms_free as the
     * source says; LMS_ENOENT when absent. */
    int (*file)(void *ctx, const char *name, char **data, size_t *len);
    void (*free_file)(void *p);
    const char *name; /* for messages */
    /* (optional) The model's tokenizer (the store's compiled image, opened in
     * place); LMS_ENOENT when the model has none. NULL: the engine parses
     * tokenizer.json read through `file`. Called on a thread of its own,
     * while the other callbacks may run. */
    int (*tokenizer)(void *ctx, lms_tokenizer **out);
    /* (optional) Read the host pages of the weights into the page tables now
     * (the CPU reads them in place; first touches would otherwise fault them
     * in during the first forward pass), a range at a time until *stop. */
    void (*prefetch)(void *ctx, const atomic_bool *stop);
} lms__wsrc;

int lms__weights_bind(const lms__wsrc *src, const lms__hparams *hp, lms__weights *w);
void lms__weights_release(lms__weights *w);
/* Bytes of the matrices one token's forward pass reads (every layer's, the LM head's). */
uint64_t lms__weights_bytes(const lms__weights *w, const lms__hparams *hp);
/* The first matrix (embedding, layers' projections in order, LM head) for
 * which pred is true, or NULL; its name ("model.layers.3.self_attn.q_proj.weight")
 * into what[n] when what is given. */
const lms__wt *lms__weights_find(const lms__weights *w, const lms__hparams *hp, bool (*pred)(const lms__wt *),
                                char *what, size_t n);
/* lms__weights_find of the matrices stored in a quantized encoding (GGUF block type or MLX affine). */
const lms__wt *lms__weights_quantized(const lms__weights *w, const lms__hparams *hp, char *what, size_t n);
/* true when every matrix has a device address (dp; an MLX matrix's scales and biases too). */
bool lms__weights_on_device(const lms__weights *w, const lms__hparams *hp);

/* Weight source over a folder with model.safetensors (or shards) and
 * config.json: for tools and benchmarks that run a HF folder directly. */
typedef struct lms__st_folder lms__st_folder;
int lms__st_folder_open(const char *dir, lms__st_folder **out, lms__wsrc *src);
void lms__st_folder_close(lms__st_folder *f);

/* ---- kernels (engine/cpu/) -------------------------------------------------------- */

/*
 * y[b*ldy + r] (=, or += with acc) sum_k W[r*ldw + k] * x[b*ldx + k]
 * for r in [0, rows), b in [0, nb), k in [0, cols). W of dtype dt (BF16, F16,
 * F32), x and y f32. Accumulation in f32.
 */
typedef void (*lms__gemm_fn)(const void *W, size_t ldw, const float *x, size_t ldx, float *y, size_t ldy,
                             int rows, int nb, int cols, bool acc);
/* y[k] += a * v[k], v of dtype dt. */
typedef void (*lms__axpy_fn)(float *y, const void *v, float a, int n);
/* y[k] += sum over j in [0, nv) of a[j] * v_j[k], row v_j of dtype dt at
 * (const uint8_t *)v + j * ldv (ldv in bytes), the rows added in order
 * (the bits of nv axpy calls) with y held in registers across them: the
 * attention's weighted sum of value rows. */
typedef void (*lms__axpyn_fn)(float *y, const void *v, size_t ldv, const float *a, int nv, int n);

/*
 * The product of BF16 weights with activations rounded to bf16 (AVX-512
 * BF16's vdpbf16ps: pairs of bf16 products added into f32): as lms__gemm_fn
 * with x given as bf16 rows xb[b*ldxb + k], k in [0, cols), cols even.
 * to_bf16 writes such a row from f32 (round to nearest even).
 */
typedef void (*lms__gemm_xbf16_fn)(const uint16_t *W, size_t ldw, const uint16_t *xb, size_t ldxb, float *y,
                                   size_t ldy, int rows, int nb, int cols, bool acc);

/* The avx512bf16 set's gemm_xbf16 (kernels_avx512.c), and the amxbf16 set's
 * (kernels_amx.c: AMX tiles for whole 16s of rows and tokens and 32s of
 * columns, the rest through the former); the latter only where
 * lms__amx_usable(), which asks the kernel for the tiles' state once. */
void lms__gemm_xbf16_avx512(const uint16_t *W, size_t ldw, const uint16_t *xb, size_t ldxb, float *y, size_t ldy,
                            int rows, int nb, int cols, bool acc);
void lms__gemm_xbf16_amx(const uint16_t *W, size_t ldw, const uint16_t *xb, size_t ldxb, float *y, size_t ldy,
                         int rows, int nb, int cols, bool acc);
bool lms__amx_usable(void);

typedef struct lms__kernels {
    const char *name;             /* "amxbf16", "avx512bf16", "avx512", "avx2", "generic" */
    lms__gemm_fn gemm[3];         /* by lms__dt_index: 0 F32, 1 F16, 2 BF16 */
    lms__axpy_fn axpy[3];
    lms__gemm_xbf16_fn gemm_xbf16; /* NULL: BF16 weights go through gemm[2] with f32 x */
    void (*to_bf16)(const float *x, uint16_t *out, int n);
    lms__axpyn_fn axpyn[3];       /* (optional) NULL: axpy row by row */
    /* (optional) s[i] = exp(s[i] - m) for i in [0, n), returns their sum
     * (within 2 ulp of expf each); NULL: expf row by row */
    float (*expsum)(float *s, int n, float m);
    /* (optional) o[i] = silu(g[i]) * u[i] (silu(g) = g / (1 + exp(-g)), exp
     * as expsum's); NULL: expf element by element */
    void (*silu_mul)(float *o, const float *g, const float *u, int n);
    /* (optional) o[i] = gelu_tanh(g[i]) * u[i], computed as g / (1 + exp(-2 z)) with
     * z = sqrt(2 / pi) (g + 0.044715 g^3) (0.5 (1 + tanh z) = sigmoid(2 z) exactly; exp as
     * expsum's); NULL: tanhf element by element */
    void (*gelu_mul)(float *o, const float *g, const float *u, int n);
    /* (optional) the sum of x[i]^2 in double (the same terms as a scalar
     * loop, added in another order); NULL: the scalar loop */
    double (*sumsq)(const float *x, int n);
    /* (optional) out[i] = x[i] as f16, the bits of lms__f32_to_f16; NULL: that function */
    void (*to_f16)(const float *x, uint16_t *out, int n);
    /* (optional) out[i] = x[i] widened from f16 (exact); NULL: lms__f16_to_f32 */
    void (*from_f16)(const uint16_t *x, float *out, int n);
} lms__kernels;

static inline int lms__dt_index(lms_dtype dt)
{
    return dt == LMS_DTYPE_F32 ? 0 : dt == LMS_DTYPE_F16 ? 1 : 2;
}

/* The best kernel set for this CPU; LMSTORE_KERNELS=generic|avx2|avx512|avx512bf16
 * forces one (if the CPU has it). */
const lms__kernels *lms__kernels_best(void);
const lms__kernels *lms__kernels_by_name(const char *name); /* NULL if unsupported here */

float lms__bf16_to_f32(uint16_t h);
uint16_t lms__f32_to_bf16(float f); /* round to nearest even */
float lms__f16_to_f32(uint16_t h);
uint16_t lms__f32_to_f16(float f);  /* round to nearest even */
/* Row `row` of a matrix view as f32 (embedding lookups). */
void lms__row_to_f32(const lms__wt *w, uint32_t row, float *out);
/* Embedding row `row` of w's host view as f32, of any encoding the CPU backend
 * reads, times scale (scale != 1: in the weights' dtype, as transformers
 * scales Gemma's embeddings). engine/cpu/fwd_cpu.c. */
void lms__embed_row(const lms__wt *w, uint32_t row, float scale, float *out);

/* ---- forward pass (layers.c) ------------------------------------------------------- */

/* Where K/V live: the kvcache's page-major arena (see lmstore/kvcache.h).
 * With sliding-window layers (window > 0) their K/V are in the cache's
 * window group: its own pages and block table, the table's entries valid
 * from wfirst on (older window pages are given back); every other layer
 * is in group 0 (base, page_bytes, pages). A zeroed window part (window 0,
 * group NULL) is one group holding every layer, the layout before windows. */
typedef struct lms__kvview {
    uint8_t *base;         /* group 0's pages: a device address on a device backend */
    lms_dtype dtype;
    uint32_t page_tokens;
    size_t elem_size, token_bytes, head_bytes, v_offset, layer_bytes, page_bytes;
    const uint32_t *pages; /* block table of the sequence (host memory) */
    uint32_t n_pages;      /* entries of pages (and of wpages) */
    uint32_t window;       /* 0: one group */
    const uint8_t *group;  /* [n_layers] 1 = in the window group; NULL: every layer in group 0 */
    const uint32_t *index; /* [n_layers] the layer's index among its group's layers (with group) */
    uint8_t *wbase;        /* the window group's pages (device address on a device backend) */
    size_t wpage_bytes;    /* stride between them */
    const uint32_t *wpages; /* its block table (host memory): entries [wfirst, n_pages) */
    uint32_t wfirst;
} lms__kvview;

/* Layer l's K/V in a view: its group's pages, their stride and block table,
 * and the layer's byte offset within a page. */
typedef struct lms__kvloc {
    uint8_t *base;
    size_t page_bytes, layer_off;
    const uint32_t *pages;
    int group;
} lms__kvloc;

static inline lms__kvloc lms__kv_layer(const lms__kvview *kv, uint32_t l)
{
    lms__kvloc o;
    o.group = kv->group ? kv->group[l] : 0;
    o.layer_off = (size_t)(kv->group ? kv->index[l] : l) * kv->layer_bytes;
    o.base = o.group ? kv->wbase : kv->base;
    o.page_bytes = o.group ? kv->wpage_bytes : kv->page_bytes;
    o.pages = o.group ? kv->wpages : kv->pages;
    return o;
}

typedef struct lms__fwd lms__fwd;
struct lms__fwd_ops;

/*
 * A forward pass over blocks of up to max_block tokens and contexts up to
 * n_ctx on a backend (engine/backend.h); the backend allocates its scratch
 * once, here, for steps of up to max_segs sequences (lms__fwd_segments; 0 =
 * 1). kv gives the cache geometry (its block table is given per call).
 * Borrowed: hp, w, dev, k, pool, kv->base. On failure *out is NULL.
 */
int lms__fwd_create(const struct lms__fwd_ops *ops, const lms__hparams *hp, const lms__weights *w, lms_device *dev,
                    const lms__kernels *k, lms_pool *pool, uint32_t max_block, uint32_t max_segs, uint32_t n_ctx,
                    const lms__kvview *kv, lms__fwd **out);
void lms__fwd_free(lms__fwd *f);
const char *lms__fwd_describe(const lms__fwd *f); /* "avx512", "cuda sm_90" ... */

/*
 * Run tokens[0..nb) at positions pos0.. (nb <= max_block, pos0+nb <= n_ctx):
 * writes their K/V into kv, reads K/V of positions [0, pos0+nb). logits:
 * NULL (none), the last position's (all false) or nb rows (all true).
 * argmax (optional, with logits NULL and all false): the last position's
 * largest logit's id, where the backend computes it on the device.
 * Errors: LMS_EDEVICE (a device operation failed; the detail says which).
 */
int lms__fwd_block(lms__fwd *f, const int32_t *tokens, uint32_t nb, uint32_t pos0, const lms__kvview *kv,
                   float *logits, bool all);
/* As lms__fwd_block with the last position's argmax instead of its logits;
 * LMS_EUNSUPPORTED when the backend has no device argmax. */
int lms__fwd_block_argmax(lms__fwd *f, const int32_t *tokens, uint32_t nb, uint32_t pos0, const lms__kvview *kv,
                          int32_t *id);
bool lms__fwd_has_argmax(const lms__fwd *f);

/*
 * Gate f's steps behind weights that are still arriving (a resident load in
 * progress): wait(ctx, layer) blocks until layer `layer` (LMS_LAYER_ALL: every
 * weight; lms_model_wait_layer's indices) is on the device, 0 or an error.
 * Until a wait for every weight returned 0, a step of several rows runs its
 * layers as their weights arrive (layers.c says how); a step of one row, or
 * of several sequences, waits for every weight first. ctx is borrowed until
 * then. LMS_ENOMEM.
 */
typedef int (*lms__fwd_wait_fn)(void *ctx, int32_t layer);
int lms__fwd_gate(lms__fwd *f, lms__fwd_wait_fn wait, void *ctx);
bool lms__fwd_gated(const lms__fwd *f);

/*
 * Several sequences in one pass (the batched engine): tokens[0..nb) are the
 * rows of segments segs[0..n_segs) (struct lms__seg, engine/backend.h: rows,
 * first position and KV view of each sequence, in row order). Every
 * segment's K/V are written into its own pages; logits of the rows
 * out_rows[0..n_out) (ascending) into logits (n_out x n_vocab, f32).
 * Only on backends with segments (lms__fwd_has_segments). Errors as
 * lms__fwd_block.
 */
struct lms__seg;
bool lms__fwd_has_segments(const lms__fwd *f);
int lms__fwd_segments(lms__fwd *f, const int32_t *tokens, uint32_t nb, const struct lms__seg *segs, uint32_t n_segs,
                      const uint32_t *out_rows, uint32_t n_out, float *logits);
/* Read bandwidth of the backend's memory, GB/s (0: unknown); see lms__fwd_ops.membw. */
double lms__fwd_membw(lms__fwd *f, size_t bytes);

#endif
