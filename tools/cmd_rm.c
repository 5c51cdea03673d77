/*
 * tools/cmd_rm.c - `lmstore rm MODEL...`: remove models (one transaction
 * each); `lmstore gc` gives the bytes back.
 */
#include <stdio.h>

#include "lmstore/store.h"
#include "tools/cli.h"

const char lms_cmd_rm_help[] = "remove models from the store (bytes are freed by gc): rm MODEL...";

int lms_cmd_rm(int argc, char **argv)
{
    const char *store_opt = NULL;
    const char *models[256];
    int n = 0;
    for (int i = 1; i < argc;) {
        if (lms_cli_end_of_options(argv, &i))
            continue;
        if (lms_cli_opt(argc, argv, &i, "--store", &store_opt))
            continue;
        if (lms_cli_flag(argv, i, "--help") || lms_cli_flag(argv, i, "-h")) {
            printf("usage: lmstore rm MODEL... [--store DIR]\n\n"
                   "Removes each model's records in one transaction and drops its blobs'\n"
                   "reference counts. Run `lmstore gc` to give the space back.\n");
            return LMS_EXIT_OK;
        }
        if (lms_cli_is_option(argv[i]))
            return lms_cli_usage("rm", "unknown option %s", argv[i]);
        if (n == 256)
            return lms_cli_usage("rm", "at most 256 models at once");
        models[n++] = argv[i++];
    }
    if (!n)
        return lms_cli_usage("rm", "missing MODEL");
    lms_store *s = NULL;
    int rc = lms_store_open(lms_cli_store_path(store_opt), 0, NULL, &s);
    if (rc)
        return lms_cli_fail("rm", rc, "open store");
    int status = LMS_EXIT_OK;
    for (int i = 0; i < n; i++) {
        rc = lms_model_remove(s, models[i]);
        if (rc)
            status = lms_cli_fail("rm", rc, models[i]);
        else
            printf("removed %s\n", models[i]);
    }
    lms_store_close(s);
    return status;
}
