/* tools/bench_kv.c - `lmstore bench kv` (not built yet). */
#include "tools/bench.h"
#include "tools/cli.h"

int lms_bench_kv(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return lms_cli_usage("bench", "'bench kv' is not available in this build yet");
}
