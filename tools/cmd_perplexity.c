/*
 * tools/cmd_perplexity.c - `lmstore perplexity MODEL --file F`: the
 * perplexity of a model over the first N tokens of a text, the standard
 * check that a model (and its conversion, tokenizer and runtime) is right:
 * ppl = exp(mean negative log-likelihood of tokens 2..N given the tokens
 * before them), computed in one window. Logits are taken a block of
 * positions at a time, so memory stays at block x vocabulary floats.
 */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "tools/cli.h"
#include "tools/cli_gen.h"

const char lms_cmd_perplexity_help[] = "perplexity of a model over a text file (--file F [--ctx N])";

enum { BLOCK = 64 };

static void usage(FILE *f)
{
    fprintf(f,
            "usage: lmstore perplexity MODEL (--file F | --prompt-ids LIST) [--ctx N] [--json]\n"
            "\n"
            "Tokenizes F as the tokenizer does by default (with its BOS if it adds one),\n"
            "takes the first N tokens (--ctx; default: all, up to the model's context)\n"
            "as one window and prints exp(mean NLL of tokens 2..N).\n"
            "\n"
            "  --file F               the text (UTF-8)\n"
            "  --prompt-ids LIST      score these token ids instead of a file\n"
            "  --ctx N                window length in tokens\n"
            "  --json                 print {\"ppl\": x, \"n_tokens\": n, \"nll\": mean, \"seconds\": s}\n"
            "  --device D             cpu (default) or cuda[:N]\n"
            "  --threads N, --store DIR\n");
}

int lms_cmd_perplexity(int argc, char **argv)
{
    const char *cmd = "perplexity";
    lms_cli_gen_opts o;
    lms_cli_gen_opts_init(&o);
    const char *file = NULL, *ids_arg = NULL, *v;
    bool json = false;
    int64_t ctx = 0;
    for (int i = 1; i < argc;) {
        if (lms_cli_end_of_options(argv, &i))
            continue;
        if (lms_cli_flag(argv, i, "-h") || lms_cli_flag(argv, i, "--help")) {
            usage(stdout);
            return LMS_EXIT_OK;
        } else if (lms_cli_opt(argc, argv, &i, "--file", &v) || lms_cli_opt(argc, argv, &i, "-f", &v)) {
            file = v;
        } else if (lms_cli_opt(argc, argv, &i, "--prompt-ids", &v)) {
            ids_arg = v;
        } else if (lms_cli_opt(argc, argv, &i, "--ctx", &v)) {
            if (!lms_cli_parse_i64(v, &ctx) || ctx < 2 || ctx > INT32_MAX)
                return lms_cli_usage(cmd, "--ctx: '%s' is not a token count >= 2", v);
        } else if (lms_cli_flag(argv, i, "--json")) {
            json = true;
            i++;
        } else {
            /* --ctx is this command's own (the window), not the generation option */
            int r = lms_cli_gen_positional(cmd, argc, argv, &i, &o, LMS_CLI_GEN_STORE | LMS_CLI_GEN_THREADS | LMS_CLI_GEN_DEVICE);
            if (r)
                return r;
        }
    }
    if (!o.model)
        return lms_cli_usage(cmd, "which model? (lmstore perplexity MODEL --file F)");
    if (!file == !ids_arg)
        return lms_cli_usage(cmd, "give one of --file F or --prompt-ids LIST");

    int32_t *ids = NULL;
    size_t n_ids = 0;
    char *text = NULL;
    size_t text_len = 0;
    if (ids_arg && !lms_cli_parse_ids(ids_arg, &ids, &n_ids))
        return lms_cli_usage(cmd, "--prompt-ids: '%s' is not a comma-separated list of ids", ids_arg);
    if (file && !(text = lms_cli_read_file(file, &text_len))) {
        fprintf(stderr, "lmstore perplexity: error: %s: %s\n", file, strerror(errno));
        return LMS_EXIT_FAIL;
    }
    o.ctx = (uint32_t)ctx; /* the engine's context must hold the window */

    int status = LMS_EXIT_FAIL, rc;
    float *logits = NULL;
    int32_t *enc = NULL;
    lms_cli_model cm;
    if (lms_cli_model_open(cmd, &o, LMS_CLI_STORE_READ, &cm) != LMS_EXIT_OK) {
        free(ids);
        free(text);
        return LMS_EXIT_FAIL;
    }
    const int32_t *toks = ids;
    size_t n = n_ids;
    if (text) {
        if (!cm.tok) {
            fprintf(stderr, "lmstore perplexity: error: model '%s' has no tokenizer: use --prompt-ids\n",
                    o.model);
            goto out;
        }
        if ((rc = lms_tokenizer_encode(cm.tok, text, text_len, LMS_TOK_ADD_SPECIAL, &enc, &n))) {
            lms_cli_fail(cmd, rc, file);
            goto out;
        }
        toks = enc;
    }
    if (ctx && (size_t)ctx < n)
        n = (size_t)ctx;
    if (n > cm.info.n_ctx)
        n = cm.info.n_ctx;
    if (n < 2) {
        fprintf(stderr, "lmstore perplexity: error: %s: %zu tokens; at least 2 are needed\n",
                file ? file : "--prompt-ids", n);
        goto out;
    }
    const size_t V = cm.info.n_vocab;
    if (!(logits = malloc((size_t)BLOCK * V * sizeof *logits))) {
        fprintf(stderr, "lmstore perplexity: error: out of memory\n");
        goto out;
    }
    double t0 = lms__now(), nll = 0.0;
    lms_engine_reset(cm.eng);
    for (size_t s = 0; s + 1 < n; s += BLOCK) {
        /* Positions s .. s+b-1 predict tokens s+1 .. s+b; the last token of
         * the window is never fed (nothing after it is scored). */
        size_t b = n - 1 - s < BLOCK ? n - 1 - s : BLOCK;
        if ((rc = lms_engine_eval(cm.eng, toks + s, b, logits, LMS_EVAL_ALL))) {
            lms_cli_fail(cmd, rc, NULL); /* engine messages name the model */
            goto out;
        }
        for (size_t j = 0; j < b; j++) {
            const float *row = logits + j * V;
            int32_t next = toks[s + j + 1];
            if (next < 0 || (size_t)next >= V) {
                fprintf(stderr, "lmstore perplexity: error: token id %d is outside the vocabulary (%zu)\n",
                        (int)next, V);
                goto out;
            }
            double m = -INFINITY, z = 0.0;
            for (size_t k = 0; k < V; k++)
                if (row[k] > m)
                    m = row[k];
            for (size_t k = 0; k < V; k++)
                z += exp((double)row[k] - m);
            nll += (m + log(z)) - (double)row[next];
        }
    }
    double secs = lms__now() - t0;
    nll /= (double)(n - 1);
    double ppl = exp(nll);
    if (json)
        printf("{\"ppl\": %.9g, \"n_tokens\": %zu, \"nll\": %.9g, \"seconds\": %.3f}\n", ppl, n, nll, secs);
    else
        printf("perplexity %.4f over %zu tokens (mean NLL %.5f; %.1f tok/s)\n", ppl, n, nll,
               (double)(n - 1) / (secs > 0 ? secs : 1e-9));
    status = LMS_EXIT_OK;
out:
    free(logits);
    lms_tokenizer_buf_free(enc);
    free(ids);
    free(text);
    lms_cli_model_close(&cm);
    return status;
}
