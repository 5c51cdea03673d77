/*
 * lmstore/engine.h - the inference engine: a decoder-only transformer runtime
 * (Llama 3.x, Qwen 2, Qwen 3) that reads its weights in place through the
 * loader (include/lmstore/loader.h) and keeps its state in the paged KV cache
 * (include/lmstore/kvcache.h).
 *
 * Two levels:
 *  - the step API (lms_engine_eval and friends): append tokens to the
 *    engine's sequence and get logits; what `lmstore logits` and
 *    `lmstore perplexity` use;
 *  - lms_generate: prompt ids in, sampled tokens streamed through a callback,
 *    with automatic prefix reuse (the part of the prompt already in the
 *    sequence or in the KV cache's prefix cache is not computed again), stop
 *    on EOS ids and stop strings, and metrics.
 *
 * One engine holds one sequence (the conversation); sessions save it into the
 * store and resume it in another process (lms_engine_session_save/_load).
 *
 * Thread safety: an engine is used by one thread at a time; it runs its own
 * worker threads inside calls. Several engines may share one lms_model.
 *
 * Errors follow lmstore/error.h: 0 or a negative LMS_E* code, detail in
 * lms_last_error().
 */
#ifndef LMSTORE_ENGINE_H
#define LMSTORE_ENGINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "lmstore/error.h"
#include "lmstore/types.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct lms_engine lms_engine;
typedef struct lms_tokenizer lms_tokenizer; /* include/lmstore/tokenizer.h */

/* ---- creation ---------------------------------------------------------------- */

typedef struct lms_engine_params {
    int threads;            /* worker threads; 0 = online CPUs */
    uint32_t n_ctx;         /* max tokens of the sequence; 0 = min(model's max positions, 4096);
                               larger than the model's max positions is allowed (RoPE extrapolates) */
    uint64_t kv_bytes;      /* KV cache budget in bytes; 0 = n_ctx tokens plus as many again
                               for the prefix cache */
    lms_dtype kv_dtype;     /* LMS_DTYPE_F32, _F16 or _BF16; 0 (LMS_DTYPE_BOOL) = F16 */
    uint32_t kv_page_tokens;/* tokens per KV page; 0 = 16 */
    uint32_t prefill_block; /* tokens per prefill block (weight reuse); 0 = 512 on the CPU */
    lms_device *device;     /* where to compute: NULL = the device the model was opened on
                               (lms_model_params.device), the CPU when none. A GPU engine reads
                               the weights the loader placed on that device (resident or mapped) and
                               keeps its KV cache there. Borrowed: must outlive the engine */
    bool no_tokenizer;      /* do not load tokenizer.json (ids only; pieces are NULL) */
} lms_engine_params;

LMS_API lms_engine_params lms_engine_default_params(void);

/*
 * Create an engine for `model` (borrowed: it must stay open until
 * lms_engine_free). Reads config.json (and generation_config.json,
 * tokenizer.json) from the model's stored files, checks every tensor's
 * presence, dtype and shape, and allocates the KV cache and all scratch
 * buffers once: nothing is allocated on the token path. A model opened
 * resident without params.sync may still be copying: the engine does not
 * wait for it; its first step of several tokens runs each layer as soon as
 * that layer's weights are on the device (the embedding looked up in the
 * host mapping meanwhile), any other step waits for every weight first, and
 * a failed copy is that step's error (as lms_model_wait_layer reports it).
 * Errors: LMS_EUNSUPPORTED naming an architecture or setting this engine does
 * not run (e.g. "rope_scaling type 'yarn'"), LMS_EFORMAT for a malformed
 * config or a tensor of the wrong shape (named), LMS_ENOENT for a missing
 * tensor (named), LMS_ENOMEM. On failure *out is NULL and nothing needs
 * freeing.
 */
LMS_API int lms_engine_create(lms_model *model, const lms_engine_params *params, lms_engine **out);
LMS_API void lms_engine_free(lms_engine *eng); /* NULL ok */

/* ---- what is in effect --------------------------------------------------------- */

typedef struct lms_engine_info {
    const char *arch;        /* "llama", "qwen2", "qwen3", "gemma3" */
    uint32_t n_vocab;        /* rows of the LM head (logits per position) */
    uint32_t n_layers, n_embd, n_heads, n_kv_heads, head_dim, n_ff;
    uint32_t n_ctx;          /* in effect */
    uint32_t max_pos;        /* config max_position_embeddings */
    int threads;             /* in effect */
    lms_dtype kv_dtype;      /* in effect */
    uint32_t kv_page_tokens;
    uint32_t prefill_block;
    const int32_t *eos_ids;  /* stop ids from config/generation_config; valid while eng lives */
    size_t n_eos;
    int32_t bos_id;          /* -1 if none */
    double load_ms;          /* time spent in lms_engine_create */
    const char *device;      /* the device computing: "cpu", "cuda:0 (NVIDIA H200)"; valid while eng lives */
    const char *kernels;     /* the kernel set: "avx512", "avx2", "generic", "cuda sm_90" */
} lms_engine_info;

LMS_API void lms_engine_get_info(const lms_engine *eng, lms_engine_info *out);

/* The model's tokenizer (owned by the engine, valid while eng lives), or
 * NULL when created with no_tokenizer or when the tokenizer module is
 * unavailable. */
LMS_API lms_tokenizer *lms_engine_tokenizer(lms_engine *eng);

/* ---- step API --------------------------------------------------------------- */

enum lms_eval_flags {
    LMS_EVAL_LAST = 0,        /* logits of the last position only: n_vocab floats */
    LMS_EVAL_ALL = 1 << 0,    /* logits of every position: n * n_vocab floats, row-major */
};

/*
 * Append tokens[0..n) to the engine's sequence, run the model over them
 * (prefill in blocks) and write logits (f32) for the last position, or all
 * positions with LMS_EVAL_ALL, into `logits` (may be NULL: fill the cache
 * only). Errors: LMS_EINVAL (id out of vocabulary, n == 0), LMS_ENOSPACE
 * (the sequence would pass n_ctx or the KV budget is exhausted). After a
 * failure the sequence is as it was before the call (with sliding-window
 * layers, Gemma 3's, this may run earlier tokens again, and should that
 * fail too the sequence is left shorter).
 */
LMS_API int lms_engine_eval(lms_engine *eng, const int32_t *tokens, size_t n, float *logits, unsigned flags);

/* Tokens of the sequence (borrowed, valid until the next call that changes it). */
LMS_API const int32_t *lms_engine_tokens(const lms_engine *eng, size_t *n);
/* Keep the first n_keep tokens (n_keep <= length). With sliding-window layers
 * (Gemma 3) whose K/V for that point were given back and evicted from the
 * cache, the tokens since the last point that still has them are run again
 * (errors of lms_engine_eval). */
LMS_API int lms_engine_truncate(lms_engine *eng, size_t n_keep);
/* Empty the sequence. Its full pages stay in the KV prefix cache (LRU) so a
 * later prompt starting the same way reuses them. */
LMS_API void lms_engine_reset(lms_engine *eng);

/* ---- sessions -------------------------------------------------------------- */

/*
 * Save the sequence (tokens and K/V pages) into `store` as session `name`
 * (replacing one of that name). Resume loads it into the engine's sequence
 * (replacing what was there) in this or another process. Errors from the KV
 * cache: LMS_ENOENT (no such session), LMS_EMISMATCH (saved with another
 * model or KV layout, detail names both), LMS_ECORRUPT (page index named).
 * After a failed load the sequence is as before.
 */
LMS_API int lms_engine_session_save(lms_engine *eng, lms_store *store, const char *name);
LMS_API int lms_engine_session_load(lms_engine *eng, lms_store *store, const char *name);

/* ---- generation ------------------------------------------------------------- */

typedef struct lms_gen_params {
    uint32_t max_tokens;     /* tokens to generate; 0 = until a stop or n_ctx */
    float temperature;       /* 0 = greedy (argmax) */
    int32_t top_k;           /* 0 = off */
    float top_p;             /* 1 (or 0) = off */
    float min_p;             /* 0 = off */
    float repeat_penalty;    /* 1 (or 0) = off */
    uint32_t repeat_window;  /* last N tokens the penalty looks at; 0 = 64 */
    uint64_t seed;           /* sampling seed */
    const char *const *stop; /* stop strings (borrowed for the call) */
    size_t n_stop;
    bool ignore_eos;         /* do not stop on the model's EOS ids */
    bool no_prefix_reuse;    /* recompute the whole prompt */
} lms_gen_params;

LMS_API lms_gen_params lms_gen_default_params(void);

/*
 * The model's own sampling defaults: lms_gen_default_params() with the
 * settings of its generation_config.json read as transformers does. With
 * "do_sample": true, temperature (default 1.0), top_k (default 50), top_p
 * (default 1.0) and min_p (default 0) come from the file; without the file
 * or without do_sample, decoding is greedy (temperature 0). A
 * "repetition_penalty" applies either way. Everything else in *out (max
 * tokens, seed, stops) is as lms_gen_default_params() sets it.
 * Errors: LMS_EFORMAT naming the model and the field when a value is not a
 * number in range (*out is then the greedy defaults), LMS_EINVAL.
 */
LMS_API int lms_engine_default_gen_params(const lms_engine *eng, lms_gen_params *out);

enum lms_stop_reason {
    LMS_STOP_NONE = 0,
    LMS_STOP_EOS,         /* an EOS id was sampled (not passed to the callback) */
    LMS_STOP_STRING,      /* a stop string appeared (text before it was streamed) */
    LMS_STOP_MAX_TOKENS,
    LMS_STOP_CTX,         /* the context (n_ctx) is full */
    LMS_STOP_CALLBACK,    /* the callback returned non-zero */
};

typedef struct lms_gen_metrics {
    double load_ms;          /* engine creation (from lms_engine_info) */
    double ttft_ms;          /* call start -> first generated token */
    uint32_t prompt_tokens;  /* prompt length */
    uint32_t reused_tokens;  /* prompt tokens taken from the sequence or prefix cache */
    double prompt_ms;        /* time to compute the non-reused prompt tokens */
    double prompt_tps;       /* (prompt_tokens - reused_tokens) / prompt seconds */
    uint32_t gen_tokens;     /* tokens generated (EOS not counted) */
    double gen_ms;           /* first generated token -> end */
    double gen_tps;          /* decode tokens per second: (gen_tokens - 1) / gen_ms, the decode
                                steps after the first token */
    uint64_t peak_rss;       /* bytes, VmHWM */
    int stop_reason;         /* lms_stop_reason */
    const char *device;      /* the device that computed (lms_engine_info.device) */
    uint64_t kv_bytes;       /* the KV cache's budget, reserved at creation */
    uint64_t kv_touched_bytes; /* of it, the pages written at least once: on the CPU the
                                  only ones that hold memory */
} lms_gen_metrics;

/*
 * Called for each generated token with its id and its text piece (UTF-8,
 * incomplete characters held back, text of a partial stop string held back;
 * piece may be NULL without a tokenizer, len 0 when held back). Return
 * non-zero to stop. At the end of a generation that did not stop on a stop
 * string or the callback, one more call with id -1 delivers the text still
 * held back (if any). Strings are valid during the call only.
 */
typedef int (*lms_token_cb)(void *user, int32_t id, const char *piece, size_t len);

/*
 * Generate after the prompt ids. The sequence becomes prompt + generated
 * tokens (the longest common prefix of the old sequence and the prompt is
 * kept, the rest of the old sequence dropped; a longer prefix found in the
 * KV cache's prefix index is attached instead of recomputed). n_prompt == 0
 * continues the sequence as it is (e.g. after lms_engine_session_load).
 * An EOS id that stops the generation stays at the end of the sequence (it
 * belongs to the conversation); so does the last generated token, which is
 * run through the model only when the sequence is used next (eval, generate,
 * session save). metrics may be NULL. Errors as lms_engine_eval; a stop is
 * not an error.
 */
LMS_API int lms_generate(lms_engine *eng, const lms_gen_params *gp, const int32_t *prompt, size_t n_prompt,
                 lms_token_cb cb, void *user, lms_gen_metrics *metrics);

#ifdef __cplusplus
}
#endif
#endif
