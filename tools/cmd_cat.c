/*
 * tools/cmd_cat.c - `lmstore cat MODEL FILE`: print a side file stored with a
 * model (config.json, tokenizer.json, chat_template.jinja, ...).
 */
#include <stdio.h>

#include "lmstore/store.h"
#include "tools/cli.h"

const char lms_cmd_cat_help[] = "print a stored side file: cat MODEL FILE (e.g. config.json)";

int lms_cmd_cat(int argc, char **argv)
{
    const char *store_opt = NULL, *pos[2] = {NULL, NULL};
    int npos = 0;
    for (int i = 1; i < argc;) {
        if (lms_cli_end_of_options(argv, &i))
            continue;
        if (lms_cli_opt(argc, argv, &i, "--store", &store_opt))
            continue;
        if (lms_cli_flag(argv, i, "--help") || lms_cli_flag(argv, i, "-h")) {
            printf("usage: lmstore cat MODEL FILE [--store DIR]\n");
            return LMS_EXIT_OK;
        }
        if (lms_cli_is_option(argv[i]))
            return lms_cli_usage("cat", "unknown option %s", argv[i]);
        if (npos == 2)
            return lms_cli_usage("cat", "too many arguments");
        pos[npos++] = argv[i++];
    }
    if (npos != 2)
        return lms_cli_usage("cat", "wants MODEL and FILE");
    lms_store *st;
    int rc = lms_store_open(lms_cli_store_path(store_opt), LMS_STORE_RDONLY, NULL, &st);
    if (rc)
        return lms_cli_fail("cat", rc, "opening the store");
    void *data;
    size_t len;
    rc = lms_store_file(st, pos[0], pos[1], &data, &len);
    lms_store_close(st);
    if (rc)
        return lms_cli_fail("cat", rc, NULL);
    fwrite(data, 1, len, stdout); /* a failed write is reported as every command's (tools/main.c) */
    lms_free(data);
    return LMS_EXIT_OK;
}
