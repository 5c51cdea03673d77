/*
 * tools/cmd_import.c - `lmstore import SRC`: pack a HuggingFace model folder
 * or one .safetensors file into the store (creating the store if needed) and
 * print a one-line summary. A refused import leaves no trace: the store is
 * as it was, and a store this command created for it is removed again.
 */
#define _XOPEN_SOURCE 700
#include <dirent.h>
#include <ftw.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "lmstore/kvcache.h"
#include "lmstore/store.h"
#include "tools/cli.h"

const char lms_cmd_import_help[] =
    "import a HuggingFace or MLX model folder, a .safetensors file or a GGUF model: import SRC [--name NAME] [--replace]";

static int count_model(void *ctx, const lms_model_info *info)
{
    (void)info;
    (*(int *)ctx)++;
    return 0;
}

static int count_session(void *ctx, const lms_kv_session_info *info)
{
    (void)info;
    (*(int *)ctx)++;
    return 0;
}

static const char *rm_root;

static int rm_one(const char *path, const struct stat *sb, int flag, struct FTW *ftw)
{
    (void)sb;
    (void)flag;
    (void)ftw;
    if (!strcmp(path, rm_root))
        return 0; /* the folder itself: the caller decides */
    return remove(path);
}

/* After a failed import into a store this command created: if the store is
 * still empty (no model, no session), remove what creating it wrote. */
static void remove_new_store(lms_store *st, const char *path, bool folder_existed)
{
    int n = 0;
    if (lms_store_models(st, count_model, &n) || n || lms_kv_sessions(st, count_session, &n) || n) {
        lms_store_close(st);
        return;
    }
    lms_store_close(st);
    rm_root = path;
    (void)nftw(path, rm_one, 16, FTW_DEPTH | FTW_PHYS);
    if (!folder_existed)
        (void)rmdir(path);
}

/* A GGUF source (a file with the GGUF magic, or a folder of *.gguf
 * files): its metadata is the config. */
static bool gguf_source(const char *src, bool dir)
{
    if (!dir) {
        char magic[4] = {0};
        FILE *f = fopen(src, "rb");
        bool yes = f && fread(magic, 1, 4, f) == 4 && !memcmp(magic, "GGUF", 4);
        if (f)
            fclose(f);
        return yes;
    }
    DIR *d = opendir(src);
    bool yes = false;
    for (struct dirent *e; d && !yes && (e = readdir(d));) {
        size_t n = strlen(e->d_name);
        yes = n > 5 && !strcmp(e->d_name + n - 5, ".gguf");
    }
    if (d)
        closedir(d);
    return yes;
}

/* The warning for a source without config.json: stored, but not runnable. */
static void warn_no_config(const char *src)
{
    struct stat sb;
    char cfg[4096];
    bool dir = stat(src, &sb) == 0 && S_ISDIR(sb.st_mode);
    snprintf(cfg, sizeof cfg, "%s/config.json", src);
    if ((dir && access(cfg, F_OK) == 0) || gguf_source(src, dir))
        return;
    fprintf(stderr,
            "lmstore import: warning: %s has no config.json: the tensors are stored, but `lmstore run` cannot "
            "run the model without it (import the model's whole folder)\n",
            dir ? src : "a single .safetensors file");
}

int lms_cmd_import(int argc, char **argv)
{
    const char *store_opt = NULL, *name = NULL, *threads = NULL, *align = NULL, *src = NULL, *segmax = NULL;
    bool replace = false, quiet = false;
    for (int i = 1; i < argc;) {
        if (lms_cli_end_of_options(argv, &i))
            continue;
        if (lms_cli_opt(argc, argv, &i, "--store", &store_opt) || lms_cli_opt(argc, argv, &i, "--name", &name) ||
            lms_cli_opt(argc, argv, &i, "--threads", &threads) ||
            lms_cli_opt(argc, argv, &i, "--alignment", &align) ||
            lms_cli_opt(argc, argv, &i, "--segment-max", &segmax))
            continue;
        if (lms_cli_flag(argv, i, "--replace")) {
            replace = true;
        } else if (lms_cli_flag(argv, i, "--quiet") || lms_cli_flag(argv, i, "-q")) {
            quiet = true;
        } else if (lms_cli_flag(argv, i, "--help") || lms_cli_flag(argv, i, "-h")) {
            printf("usage: lmstore import SRC [--store DIR] [--name NAME] [--replace] [--threads N]\n"
                   "                      [--alignment BYTES] [--segment-max BYTES] [--quiet]\n\n"
                   "SRC is a HuggingFace model folder (*.safetensors shards, optional\n"
                   "model.safetensors.index.json, config.json, tokenizer and chat template files;\n"
                   "MLX quantized folders too), a single .safetensors file, or a GGUF model (a .gguf\n"
                   "file, the first file of a split set, or a folder of them: config and tokenizer\n"
                   "files are rebuilt from its metadata). NAME defaults to SRC's base name.\n"
                   "--replace       replace a model of the same name\n"
                   "--threads N     hashing/copying threads (default: online CPUs)\n"
                   "--alignment B   blob alignment of a NEW store (default 4096)\n"
                   "--segment-max B segment size of a NEW store (default 4G)\n");
            return LMS_EXIT_OK;
        } else if (lms_cli_is_option(argv[i])) {
            return lms_cli_usage("import", "unknown option %s", argv[i]);
        } else if (!src) {
            src = argv[i];
        } else {
            return lms_cli_usage("import", "more than one SRC given");
        }
        i++;
    }
    if (!src)
        return lms_cli_usage("import", "missing SRC (a model folder or .safetensors file)");
    lms_import_params ip = lms_import_default_params();
    ip.name = name;
    ip.replace = replace;
    ip.progress = !quiet;
    if (threads) {
        int64_t v;
        if (!lms_cli_parse_i64(threads, &v) || v < 0 || v > 1024)
            return lms_cli_usage("import", "--threads wants a number from 0 to 1024");
        ip.threads = (int)v;
    }
    lms_store_params sp = lms_store_default_params();
    if (align) {
        uint64_t v;
        if (!lms_cli_parse_size(align, &v) || v > (1u << 21))
            return lms_cli_usage("import", "--alignment wants a power of two from 64 to 2M");
        sp.alignment = (uint32_t)v;
    }
    if (segmax && !lms_cli_parse_size(segmax, &sp.segment_max))
        return lms_cli_usage("import", "--segment-max wants a size");

    if (access(src, R_OK) != 0) { /* before creating a store for nothing */
        fprintf(stderr, "lmstore import: error: %s: no such file or folder (or not readable)\n", src);
        return LMS_EXIT_FAIL;
    }
    const char *path = lms_cli_store_path(store_opt);
    struct stat sb;
    bool fresh = lms_cli_nothing_at(path), folder_existed = stat(path, &sb) == 0;
    lms_store *st;
    int rc = lms_store_open(path, LMS_STORE_CREATE, &sp, &st);
    if (rc)
        return lms_cli_fail("import", rc, "opening the store");
    lms_import_stats stats;
    rc = lms_import(st, src, &ip, &stats);
    if (rc) {
        lms_cli_fail("import", rc, NULL);
        if (fresh)
            remove_new_store(st, path, folder_existed);
        else
            lms_store_close(st);
        return LMS_EXIT_FAIL;
    }
    lms_store_close(st);
    warn_no_config(src);
    char w[32], d[32], t[32];
    lms_cli_human_bytes((double)stats.bytes_written, w, sizeof w);
    lms_cli_human_bytes((double)stats.bytes_dedup, d, sizeof d);
    lms_cli_human_bytes((double)stats.bytes_total, t, sizeof t);
    double secs = stats.seconds > 0 ? stats.seconds : 1e-9;
    printf("imported %llu tensors (%s): %s written, %s deduplicated, %.2f s, %.2f GB/s\n",
           (unsigned long long)stats.tensors, t, w, d, stats.seconds, (double)stats.bytes_total / secs / 1e9);
    return LMS_EXIT_OK;
}
