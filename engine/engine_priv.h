/*
 * engine/engine_priv.h - the lms_engine structure, shared by engine.c (step
 * API, sessions) and generate.c (lms_generate). Internal.
 */
#ifndef LMS_ENGINE_PRIV_H
#define LMS_ENGINE_PRIV_H

#include "engine/internal.h"
#include "lmstore/engine.h"
#include "lmstore/kvcache.h"
#include "lmstore/tokenizer.h"

struct lms_engine {
    lms_engine_params p;  /* settings in effect */
    lms__wsrc src;
    char name[256];       /* model name for messages */
    lms__hparams hp;
    lms__weights w;
    const lms__kernels *kernels;
    lms_pool *pool;
    lms__fwd *fwd;
    lms_device *dev;      /* the device weights and KV live on (CPU: host memory) */
    bool own_dev;         /* dev was opened here (the CPU), closed by lms_engine_free */
    char device_name[160]; /* "cpu", "cuda:0 (NVIDIA H200)" */
    lms_kv *kv;
    lms_kv_seq *seq;      /* tokens with K/V computed */
    int32_t pending;      /* sampled token not yet run (-1 = none); follows seq */
    lms__kvview kvv;      /* geometry; pages set per call */
    lms_tokenizer *tok;   /* NULL without tokenizer.json */
    int32_t *tokbuf;      /* [n_ctx + 2]: lms_engine_tokens */
    int32_t *evalbuf;     /* [n_ctx + 2]: pending + new tokens */
    int32_t *keepbuf;     /* [n_ctx + 2]: tokens run again by keep_tokens */
    bool restoring;       /* keep_tokens is running tokens again (a failure then stays as it is) */
    uint8_t *kv_group;    /* [n_layers] with sliding-window layers: each layer's KV group (kvv.group) */
    uint32_t *kv_index;   /* [n_layers] ... and its index in that group (kvv.index) */
    float *logits;        /* [n_vocab]: generate */
    double load_ms;
    uint32_t kv_seqs;     /* sequences the KV cache holds besides the engine's own (lms__engine_opts) */
    uint64_t kv_pages;    /* KV pages asked for (0 = from the params) */
    uint32_t max_block;   /* rows per forward pass (>= prefill_block) */
};

/* Settings of an engine that runs other sequences than its own (engine/batch.c). */
typedef struct lms__engine_opts {
    uint32_t kv_seqs;     /* more sequences in the KV cache at once (0 = none) */
    uint64_t kv_pages;    /* KV arena pages when params->kv_bytes is 0 (0 = the engine's default) */
    uint32_t max_block;   /* rows per forward pass, beyond prefill_block (0 = prefill_block) */
} lms__engine_opts;

/* Create over any weight source (the loader's model, or a folder for tools).
 * model_id: LMS_MODEL_ID_LEN bytes for the KV cache's page keys and sessions.
 * dev: the device the weights are on (borrowed), NULL for the CPU. */
int lms__engine_create_src(const lms__wsrc *src, const uint8_t *model_id, lms_device *dev,
                           const lms_engine_params *params, lms_engine **out);
/* lms_engine_create with opts (NULL = none). */
int lms__engine_create_model(lms_model *model, const lms_engine_params *params, const lms__engine_opts *opts,
                             lms_engine **out);
int lms__engine_create_ex(const lms__wsrc *src, const uint8_t *model_id, lms_device *dev,
                          const lms_engine_params *params, const lms__engine_opts *opts, lms_engine **out);
/* Length including the pending token. */
size_t lms__engine_len(const lms_engine *e);
int lms__engine_flush_pending(lms_engine *e);
const char *lms__engine_kernels(const lms_engine *e);


int lms__engine_step(lms_engine *e, float *logits);
/* Greedy decoding on the device: the next id without bringing logits back. */
bool lms__engine_has_argmax(const lms_engine *e);
int lms__engine_step_argmax(lms_engine *e, int32_t *id);
uint32_t lms__engine_lookup(lms_engine *e, const int32_t *toks, uint32_t n, uint32_t have);
/* The longest prefix of at most n tokens the sequence can keep without running
 * any again (n itself, but for sliding-window K/V that were given back). */
size_t lms__engine_keepable(const lms_engine *e, size_t n);
#endif
