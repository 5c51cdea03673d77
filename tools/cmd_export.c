/*
 * tools/cmd_export.c - `lmstore export MODEL DIR [--max-shard-size SIZE]`:
 * write a stored model back out as a HuggingFace folder.
 */
#include <stdio.h>
#include <string.h>

#include "lmstore/store.h"
#include "tools/cli.h"

const char lms_cmd_export_help[] =
    "write a model as a HuggingFace (or MLX) folder or a GGUF file: export MODEL DIR|FILE.gguf [--max-shard-size SIZE]";

int lms_cmd_export(int argc, char **argv)
{
    const char *store_opt = NULL, *model = NULL, *dir = NULL, *shard = NULL;
    bool quiet = false;
    for (int i = 1; i < argc;) {
        if (lms_cli_end_of_options(argv, &i))
            continue;
        if (lms_cli_opt(argc, argv, &i, "--store", &store_opt) ||
            lms_cli_opt(argc, argv, &i, "--max-shard-size", &shard))
            continue;
        if (lms_cli_flag(argv, i, "--quiet") || lms_cli_flag(argv, i, "-q")) {
            quiet = true;
        } else if (lms_cli_flag(argv, i, "--help") || lms_cli_flag(argv, i, "-h")) {
            printf("usage: lmstore export MODEL DIR [--store DIR] [--max-shard-size SIZE] [--quiet]\n"
                   "       lmstore export MODEL FILE.gguf [--store DIR] [--quiet]\n\n"
                   "Writes model.safetensors (or model-0000K-of-0000N.safetensors shards of at most\n"
                   "SIZE tensor bytes, default 5G, and model.safetensors.index.json) and the stored\n"
                   "config, tokenizer and template files into DIR (new or empty); MLX-quantized\n"
                   "models go out in the mlx-community layout. A path ending in .gguf gets one\n"
                   "GGUF file for llama.cpp (models with GGUF-quantized tensors export only so).\n"
                   "Tensor bytes are checked against their hashes on the way out.\n");
            return LMS_EXIT_OK;
        } else if (lms_cli_is_option(argv[i])) {
            return lms_cli_usage("export", "unknown option %s", argv[i]);
        } else if (!model) {
            model = argv[i];
        } else if (!dir) {
            dir = argv[i];
        } else {
            return lms_cli_usage("export", "too many arguments");
        }
        i++;
    }
    if (!model || !dir)
        return lms_cli_usage("export", "want MODEL and DIR");
    lms_export_params ep = lms_export_default_params();
    ep.progress = !quiet;
    if (shard && (!lms_cli_parse_size(shard, &ep.max_shard_size) || !ep.max_shard_size))
        return lms_cli_usage("export", "--max-shard-size wants a size like 500M or 5G");
    lms_store *s = NULL;
    int rc = lms_store_open(lms_cli_store_path(store_opt), LMS_STORE_RDONLY, NULL, &s);
    if (rc)
        return lms_cli_fail("export", rc, "open store");
    lms_export_stats st;
    size_t dl = strlen(dir);
    bool gguf = dl > 5 && !strcmp(dir + dl - 5, ".gguf");
    rc = gguf ? lms_model_export_gguf(s, model, dir, &ep, &st) : lms_model_export(s, model, dir, &ep, &st);
    lms_store_close(s);
    if (rc)
        return lms_cli_fail("export", rc, model);
    printf("exported %s to %s: %llu tensors (%.2f GB) in %llu shard%s, %llu side files, %.2f s\n", model, dir,
           (unsigned long long)st.tensors, (double)st.bytes / 1e9, (unsigned long long)st.shards,
           st.shards == 1 ? "" : "s", (unsigned long long)st.files, st.seconds);
    return LMS_EXIT_OK;
}
