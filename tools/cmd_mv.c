/*
 * tools/cmd_mv.c - `lmstore mv MODEL NEWNAME`: rename a model in one transaction.
 */
#include <stdio.h>

#include "lmstore/store.h"
#include "tools/cli.h"

const char lms_cmd_mv_help[] = "rename a model: mv MODEL NEWNAME";

int lms_cmd_mv(int argc, char **argv)
{
    const char *store_opt = NULL, *src = NULL, *dst = NULL;
    for (int i = 1; i < argc;) {
        if (lms_cli_opt(argc, argv, &i, "--store", &store_opt))
            continue;
        if (lms_cli_flag(argv, i, "--help") || lms_cli_flag(argv, i, "-h")) {
            printf("usage: lmstore mv MODEL NEWNAME [--store DIR]\n");
            return LMS_EXIT_OK;
        }
        if (argv[i][0] == '-' && argv[i][1])
            return lms_cli_usage("mv", "unknown option %s", argv[i]);
        if (!src)
            src = argv[i];
        else if (!dst)
            dst = argv[i];
        else
            return lms_cli_usage("mv", "too many arguments");
        i++;
    }
    if (!src || !dst)
        return lms_cli_usage("mv", "want MODEL and NEWNAME");
    lms_store *s = NULL;
    int rc = lms_store_open(lms_cli_store_path(store_opt), 0, NULL, &s);
    if (rc)
        return lms_cli_fail("mv", rc, "open store");
    rc = lms_model_rename(s, src, dst);
    lms_store_close(s);
    if (rc)
        return lms_cli_fail("mv", rc, src);
    printf("renamed %s -> %s\n", src, dst);
    return LMS_EXIT_OK;
}
