/* tools/cmd_version.c - `lmstore version`: library version and built-in backends. */
#include <stdio.h>

#include "loader/device.h"
#include "tools/cli.h"

const char lms_cmd_version_help[] = "print the version and the compiled-in device backends";

int lms_cmd_version(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    printf("lmstore %s (backends: cpu%s)\n", LMS_VERSION, lms_device_available(LMS_DEVICE_CUDA) ? ", cuda" : "");
    return LMS_EXIT_OK;
}
