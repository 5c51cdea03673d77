/*
 * engine/model_llama.c - the Llama family (Llama 3.x and Llama-architecture
 * models such as SmolLM2): RMSNorm, GQA attention with RoPE (default, linear
 * or llama3 scaling, handled in config.c), SiLU-gated MLP, optional tied
 * embeddings. attention_bias adds biases to q/k/v/o; mlp_bias is not run.
 */
#include <cjson/cJSON.h>

#include "engine/internal.h"

static int configure(lms__hparams *hp, const void *root_, const char *src)
{
    const cJSON *root = root_;
    const cJSON *ab = cJSON_GetObjectItemCaseSensitive(root, "attention_bias");
    const cJSON *mb = cJSON_GetObjectItemCaseSensitive(root, "mlp_bias");
    if (mb && cJSON_IsTrue(mb))
        return lms__err(LMS_EUNSUPPORTED, "%s: config.json: mlp_bias=true is not supported", src);
    const cJSON *tp = cJSON_GetObjectItemCaseSensitive(root, "pretraining_tp");
    (void)tp; /* only affects training-time sharding; the math is the same */
    hp->qkv_bias = hp->o_bias = ab && cJSON_IsTrue(ab);
    hp->qk_norm = false;
    return 0;
}

static const char *const archs[] = {"LlamaForCausalLM", NULL};
const lms__family lms__family_llama = {"llama", archs, "llama", configure, NULL, NULL, NULL};
