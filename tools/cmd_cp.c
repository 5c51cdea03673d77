/*
 * tools/cmd_cp.c - `lmstore cp MODEL NEWNAME`: a metadata-only copy (the new
 * name references the same blobs; no tensor bytes are written).
 */
#include <stdio.h>

#include "lmstore/store.h"
#include "tools/cli.h"

const char lms_cmd_cp_help[] = "copy a model under a new name (metadata only, no tensor bytes written): cp MODEL NEWNAME";

int lms_cmd_cp(int argc, char **argv)
{
    const char *store_opt = NULL, *src = NULL, *dst = NULL;
    for (int i = 1; i < argc;) {
        if (lms_cli_opt(argc, argv, &i, "--store", &store_opt))
            continue;
        if (lms_cli_flag(argv, i, "--help") || lms_cli_flag(argv, i, "-h")) {
            printf("usage: lmstore cp MODEL NEWNAME [--store DIR]\n");
            return LMS_EXIT_OK;
        }
        if (argv[i][0] == '-' && argv[i][1])
            return lms_cli_usage("cp", "unknown option %s", argv[i]);
        if (!src)
            src = argv[i];
        else if (!dst)
            dst = argv[i];
        else
            return lms_cli_usage("cp", "too many arguments");
        i++;
    }
    if (!src || !dst)
        return lms_cli_usage("cp", "want MODEL and NEWNAME");
    lms_store *s = NULL;
    int rc = lms_store_open(lms_cli_store_path(store_opt), 0, NULL, &s);
    if (rc)
        return lms_cli_fail("cp", rc, "open store");
    rc = lms_model_copy(s, src, dst);
    lms_store_close(s);
    if (rc)
        return lms_cli_fail("cp", rc, src);
    printf("copied %s -> %s\n", src, dst);
    return LMS_EXIT_OK;
}
