/*
 * tools/cmd_logits.c - `lmstore logits MODEL -p TEXT --out FILE`: the raw
 * logits of the last (or, with --all, every) position of a prompt, written
 * as little-endian float32, row-major (positions x vocabulary). For
 * comparing lmstore with other runtimes (e.g. numpy.fromfile(FILE,
 * "<f4").reshape(-1, n_vocab) against transformers' logits).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tools/cli.h"
#include "tools/cli_gen.h"

const char lms_cmd_logits_help[] = "write a prompt's logits as raw little-endian float32 (--out FILE)";

enum { BLOCK = 64 };

static void usage(FILE *f)
{
    fprintf(f,
            "usage: lmstore logits MODEL (-p TEXT | --prompt-ids LIST) [--all] --out FILE\n"
            "\n"
            "  -p, --prompt TEXT      the prompt (tokenized as the tokenizer does by default)\n"
            "  --prompt-ids LIST      the prompt as token ids, comma separated\n"
            "  --all                  every position's logits (positions x n_vocab), not only the last\n"
            "  --out FILE             where to write the float32 values (little-endian)\n"
            "  --json                 print {\"ids\", \"rows\", \"n_vocab\", \"out\"} on stdout\n"
            "  --device D             cpu (default) or cuda[:N]\n"
            "  --threads N, --store DIR\n");
}

/* Write floats little-endian whatever the host order. */
static bool write_le(FILE *f, const float *x, size_t n)
{
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__
    return fwrite(x, sizeof *x, n, f) == n;
#else
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        unsigned char b[4] = {u & 0xff, (u >> 8) & 0xff, (u >> 16) & 0xff, u >> 24};
        if (fwrite(b, 1, 4, f) != 4)
            return false;
    }
    return true;
#endif
}

int lms_cmd_logits(int argc, char **argv)
{
    const char *cmd = "logits";
    lms_cli_gen_opts o;
    lms_cli_gen_opts_init(&o);
    const char *text = NULL, *ids_arg = NULL, *out_path = NULL, *v;
    bool all = false, json = false;
    for (int i = 1; i < argc;) {
        if (lms_cli_end_of_options(argv, &i))
            continue;
        if (lms_cli_flag(argv, i, "-h") || lms_cli_flag(argv, i, "--help")) {
            usage(stdout);
            return LMS_EXIT_OK;
        } else if (lms_cli_opt(argc, argv, &i, "-p", &v) || lms_cli_opt(argc, argv, &i, "--prompt", &v)) {
            text = v;
        } else if (lms_cli_opt(argc, argv, &i, "--prompt-ids", &v)) {
            ids_arg = v;
        } else if (lms_cli_opt(argc, argv, &i, "--out", &v) || lms_cli_opt(argc, argv, &i, "-o", &v)) {
            out_path = v;
        } else if (lms_cli_flag(argv, i, "--all")) {
            all = true;
            i++;
        } else if (lms_cli_flag(argv, i, "--json")) {
            json = true;
            i++;
        } else {
            int r = lms_cli_gen_positional(cmd, argc, argv, &i, &o,
                                           LMS_CLI_GEN_STORE | LMS_CLI_GEN_THREADS | LMS_CLI_GEN_CTX |
                                               LMS_CLI_GEN_DEVICE);
            if (r)
                return r;
        }
    }
    if (!o.model)
        return lms_cli_usage(cmd, "which model? (lmstore logits MODEL -p TEXT --out FILE)");
    if (!text == !ids_arg)
        return lms_cli_usage(cmd, "give one of -p TEXT or --prompt-ids LIST");
    if (!out_path)
        return lms_cli_usage(cmd, "--out FILE is required");

    int32_t *ids = NULL, *enc = NULL;
    size_t n = 0;
    if (ids_arg && !lms_cli_parse_ids(ids_arg, &ids, &n))
        return lms_cli_usage(cmd, "--prompt-ids: '%s' is not a comma-separated list of ids", ids_arg);

    int status = LMS_EXIT_FAIL, rc;
    float *logits = NULL;
    FILE *f = NULL;
    lms_cli_model cm;
    if (lms_cli_model_open(cmd, &o, LMS_CLI_STORE_READ, &cm) != LMS_EXIT_OK) {
        free(ids);
        return LMS_EXIT_FAIL;
    }
    const int32_t *toks = ids;
    if (text) {
        if ((rc = lms_cli_encode(&cm, text, true, &enc, &n))) {
            lms_cli_fail(cmd, rc, o.model);
            goto out;
        }
        toks = enc;
    }
    if (n == 0) {
        fprintf(stderr, "lmstore logits: error: the prompt is empty (0 tokens)\n");
        goto out;
    }
    const size_t V = cm.info.n_vocab;
    if (!(logits = malloc((size_t)BLOCK * V * sizeof *logits))) {
        fprintf(stderr, "lmstore logits: error: out of memory\n");
        goto out;
    }
    if (!(f = fopen(out_path, "wb"))) {
        fprintf(stderr, "lmstore logits: error: %s: %s\n", out_path, strerror(errno));
        goto out;
    }
    lms_engine_reset(cm.eng);
    size_t rows = 0;
    for (size_t s = 0; s < n; s += BLOCK) {
        size_t b = n - s < BLOCK ? n - s : BLOCK;
        bool last_block = s + b == n;
        if (!all && !last_block) { /* fill the cache only */
            rc = lms_engine_eval(cm.eng, toks + s, b, NULL, LMS_EVAL_LAST);
        } else {
            rc = lms_engine_eval(cm.eng, toks + s, b, logits, all ? LMS_EVAL_ALL : LMS_EVAL_LAST);
        }
        if (rc) {
            lms_cli_fail(cmd, rc, NULL); /* engine messages name the model */
            goto out;
        }
        if (all || last_block) {
            size_t r = all ? b : 1;
            if (!write_le(f, logits, r * V)) {
                fprintf(stderr, "lmstore logits: error: %s: %s\n", out_path, strerror(errno));
                goto out;
            }
            rows += r;
        }
    }
    if (fclose(f) != 0) {
        f = NULL;
        fprintf(stderr, "lmstore logits: error: %s: %s\n", out_path, strerror(errno));
        goto out;
    }
    f = NULL;
    if (json) {
        fputs("{\"ids\": ", stdout);
        lms_cli_json_ids(stdout, toks, n);
        printf(", \"rows\": %zu, \"n_vocab\": %zu, \"out\": ", rows, V);
        lms_cli_json_str(stdout, out_path, strlen(out_path));
        fputs("}\n", stdout);
    } else {
        fprintf(stderr, "wrote %zu x %zu float32 logits (%zu bytes) for %zu prompt tokens to %s\n", rows, V,
                rows * V * 4, n, out_path);
    }
    status = LMS_EXIT_OK;
out:
    if (f)
        fclose(f);
    free(logits);
    lms_tokenizer_buf_free(enc);
    free(ids);
    lms_cli_model_close(&cm);
    return status;
}
