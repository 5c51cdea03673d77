/* tools/bench_load.c - `lmstore bench load` (not built yet). */
#include "tools/bench.h"
#include "tools/cli.h"

int lms_bench_load(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return lms_cli_usage("bench", "'bench load' is not available in this build yet");
}
