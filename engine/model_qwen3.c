/*
 * engine/model_qwen3.c - the Qwen 3 (dense) family: per-head RMSNorm of q
 * and k (q_norm, k_norm over head_dim) before RoPE, head_dim taken from
 * config.json even when it differs from hidden_size / num_attention_heads,
 * optional attention_bias on q/k/v/o.
 */
#include <cjson/cJSON.h>

#include "engine/internal.h"

static int configure(lms__hparams *hp, const void *root_, const char *src)
{
    const cJSON *ab = cJSON_GetObjectItemCaseSensitive((const cJSON *)root_, "attention_bias");
    (void)src;
    hp->qkv_bias = hp->o_bias = ab && cJSON_IsTrue(ab);
    hp->qk_norm = true;
    return 0;
}

static const char *const archs[] = {"Qwen3ForCausalLM", NULL};
const lms__family lms__family_qwen3 = {"qwen3", archs, "qwen3", configure, NULL, NULL, NULL};
