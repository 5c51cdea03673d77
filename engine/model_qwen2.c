/*
 * engine/model_qwen2.c - the Qwen 2 / 2.5 family: Llama-style blocks with
 * biases on the q, k and v projections (not on o), no sliding window
 * (use_sliding_window=true is refused in config.c).
 */
#include "engine/internal.h"

static int configure(lms__hparams *hp, const void *root, const char *src)
{
    (void)root;
    (void)src;
    hp->qkv_bias = true;
    hp->o_bias = false;
    hp->qk_norm = false;
    return 0;
}

static const char *const archs[] = {"Qwen2ForCausalLM", NULL};
const lms__family lms__family_qwen2 = {"qwen2", archs, "qwen2", configure, NULL, NULL, NULL};
