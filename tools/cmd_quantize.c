/*
 * tools/cmd_quantize.c - `lmstore quantize MODEL NEWNAME --type TYPE`: a
 * quantized copy of a stored model (lms_model_quantize); what it does not
 * change stays shared with MODEL.
 */
#include <stdio.h>
#include <string.h>

#include "lmstore/store.h"
#include "tools/cli.h"

const char lms_cmd_quantize_help[] =
    "quantize a model into a new one: quantize MODEL NEWNAME --type q8_0|q4_0|q4_k|q4_k_m|mlx4|mlx8 [--keep-embeddings]";

/* "q8_0" -> Q8_0, "mlx4" -> MLX_AFFINE 4 bits; false if unknown. */
static bool parse_type(const char *s, lms_quantize_params *p)
{
    static const struct {
        const char *name;
        lms_dtype t;
    } gguf[] = {{"q8_0", LMS_DTYPE_Q8_0}, {"q4_0", LMS_DTYPE_Q4_0}, {"q4_1", LMS_DTYPE_Q4_1},
                {"q5_0", LMS_DTYPE_Q5_0}, {"q5_1", LMS_DTYPE_Q5_1}, {"q4_k", LMS_DTYPE_Q4_K},
                {"q6_k", LMS_DTYPE_Q6_K}};
    if (!strcasecmp(s, "q4_k_m")) {
        p->type = LMS_DTYPE_Q4_K;
        p->mix_k_m = true;
        return true;
    }
    for (size_t i = 0; i < sizeof gguf / sizeof gguf[0]; i++)
        if (!strcasecmp(s, gguf[i].name)) {
            p->type = gguf[i].t;
            return true;
        }
    if (!strncasecmp(s, "mlx", 3) && s[3] >= '2' && s[3] <= '8' && !s[4]) {
        p->type = LMS_DTYPE_MLX_AFFINE;
        p->bits = (uint32_t)(s[3] - '0');
        return true;
    }
    return false;
}

int lms_cmd_quantize(int argc, char **argv)
{
    const char *store_opt = NULL, *type = NULL, *group = NULL, *threads = NULL, *model = NULL, *dst = NULL;
    lms_quantize_params qp = lms_quantize_default_params();
    bool quiet = false;
    for (int i = 1; i < argc;) {
        if (lms_cli_end_of_options(argv, &i))
            continue;
        if (lms_cli_opt(argc, argv, &i, "--store", &store_opt) || lms_cli_opt(argc, argv, &i, "--type", &type) ||
            lms_cli_opt(argc, argv, &i, "--group-size", &group) || lms_cli_opt(argc, argv, &i, "--threads", &threads))
            continue;
        if (lms_cli_flag(argv, i, "--keep-embeddings")) {
            qp.keep_embeddings = true;
        } else if (lms_cli_flag(argv, i, "--quiet") || lms_cli_flag(argv, i, "-q")) {
            quiet = true;
        } else if (lms_cli_flag(argv, i, "--help") || lms_cli_flag(argv, i, "-h")) {
            printf("usage: lmstore quantize MODEL NEWNAME --type TYPE [--keep-embeddings] [--group-size N]\n"
                   "                        [--threads N] [--store DIR] [--quiet]\n\n"
                   "Makes NEWNAME from MODEL with its matrices quantized; norms, biases and what is\n"
                   "not quantized stay shared with MODEL (stored once).\n"
                   "TYPE: q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q6_k (GGUF block types, the bytes of the\n"
                   "      reference quantizers; q4_k uses q5_0 and q6_k q8_0 for rows that are not\n"
                   "      whole 256-blocks, as llama-quantize does)\n"
                   "      q4_k_m (llama-quantize's Q4_K_M mix, byte for byte: q6_k for the LM head\n"
                   "      and some v_proj / down_proj matrices, q4_k elsewhere)\n"
                   "      mlx2 .. mlx8 (MLX affine: scales and biases per group, as mlx-lm saves)\n"
                   "--keep-embeddings  leave the token embedding and the LM head unquantized\n"
                   "--group-size N     MLX group size: 32, 64 (default) or 128\n");
            return LMS_EXIT_OK;
        } else if (lms_cli_is_option(argv[i])) {
            return lms_cli_usage("quantize", "unknown option %s", argv[i]);
        } else if (!model) {
            model = argv[i];
        } else if (!dst) {
            dst = argv[i];
        } else {
            return lms_cli_usage("quantize", "too many arguments");
        }
        i++;
    }
    if (!model || !dst)
        return lms_cli_usage("quantize", "want MODEL and NEWNAME");
    if (!type || !parse_type(type, &qp))
        return lms_cli_usage("quantize", "--type wants q8_0, q4_0, q4_1, q5_0, q5_1, q4_k, q6_k, q4_k_m or mlx2..mlx8");
    if (group) {
        int64_t v;
        if (!lms_cli_parse_i64(group, &v) || (v != 32 && v != 64 && v != 128) || qp.type != LMS_DTYPE_MLX_AFFINE)
            return lms_cli_usage("quantize", "--group-size wants 32, 64 or 128, with an mlx type");
        qp.group_size = (uint32_t)v;
    }
    if (threads) {
        int64_t v;
        if (!lms_cli_parse_i64(threads, &v) || v < 0 || v > 1024)
            return lms_cli_usage("quantize", "--threads wants a number from 0 to 1024");
        qp.threads = (int)v;
    }
    qp.progress = !quiet;
    lms_store *s;
    int rc = lms_store_open(lms_cli_store_path(store_opt), 0, NULL, &s);
    if (rc)
        return lms_cli_fail("quantize", rc, "opening the store");
    lms_quantize_stats st;
    rc = lms_model_quantize(s, model, dst, &qp, &st);
    lms_store_close(s);
    if (rc)
        return lms_cli_fail("quantize", rc, NULL);
    printf("quantized %s -> %s: %llu of %llu tensors, %.2f MB (%.2f MB written, %.2f MB shared), %.2f s\n", model,
           dst, (unsigned long long)st.quantized, (unsigned long long)st.tensors, (double)st.bytes_total / 1e6,
           (double)st.bytes_written / 1e6, (double)st.bytes_shared / 1e6, st.seconds);
    return LMS_EXIT_OK;
}
