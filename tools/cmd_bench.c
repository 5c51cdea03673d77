/* tools/cmd_bench.c - `lmstore bench load|kv|engine|batch ...`: dispatch to the benchmark drivers. */
#include <stdio.h>
#include <string.h>

#include "tools/bench.h"
#include "tools/cli.h"

const char lms_cmd_bench_help[] = "measure model load (bench load), KV save/resume (bench kv) and prefill/decode speed (bench engine), batched decode (bench batch)";

int lms_cmd_bench(int argc, char **argv)
{
    if (argc < 2 || !strcmp(argv[1], "--help")) {
        printf("usage: lmstore bench load MODEL [--device cpu|cuda] [--place mapped|resident] [--json]\n"
               "       lmstore bench kv [--tokens N] [--codec raw|zstd|shuffle-zstd] [--json]\n"
               "       lmstore bench engine MODEL [--device cpu|cuda] [--prompt N] [--gen N] [--ctx N] [--json]\n"
               "       lmstore bench batch MODEL [--parallel N,...] [--prompt N] [--gen N] [--check] [--json]\n");
        return argc < 2 ? LMS_EXIT_USAGE : LMS_EXIT_OK;
    }
    if (!strcmp(argv[1], "load"))
        return lms_bench_load(argc - 1, argv + 1);
    if (!strcmp(argv[1], "kv"))
        return lms_bench_kv(argc - 1, argv + 1);
    if (!strcmp(argv[1], "engine"))
        return lms_bench_engine(argc - 1, argv + 1);
    if (!strcmp(argv[1], "batch"))
        return lms_bench_batch(argc - 1, argv + 1);
    return lms_cli_usage("bench", "unknown benchmark '%s'", argv[1]);
}
