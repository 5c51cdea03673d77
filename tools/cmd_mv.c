/*
 * tools/cmd_mv.c - `lmstore mv MODEL NEWNAME`: rename a model in one transaction.
 */
#include "lmstore/store.h"
#include "tools/cli.h"

const char lms_cmd_mv_help[] = "rename a model: mv MODEL NEWNAME";

int lms_cmd_mv(int argc, char **argv) { return lms_cli_model_pair("mv", argc, argv, lms_model_rename, "renamed"); }
