/*
 * tools/cmd_cp.c - `lmstore cp MODEL NEWNAME`: a metadata-only copy (the new
 * name references the same blobs; no tensor bytes are written).
 */
#include "lmstore/store.h"
#include "tools/cli.h"

const char lms_cmd_cp_help[] = "copy a model under a new name (metadata only, no tensor bytes written): cp MODEL NEWNAME";

int lms_cmd_cp(int argc, char **argv) { return lms_cli_model_pair("cp", argc, argv, lms_model_copy, "copied"); }
