/*
 * bench/bench_engine.c - decode and prefill throughput of the engine on one
 * model, for bench/bench_engine.sh: prefill P random prompt tokens (blocks of
 * the engine's prefill size), then decode D tokens greedily, R times; prints
 * JSON with tok/s and the bytes of weights one decode token reads (every
 * matrix once, the LM head included), so a caller can compare against
 * measured memory bandwidth (bench/membw.c).
 *
 *   bench_engine (--store DIR --model NAME | --folder HF_DIR) [--threads T]
 *                [--prompt P] [--decode D] [--reps R] [--block B]
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_priv.h"
#include "lmstore/loader.h"

static uint64_t mat_bytes(const lms__wt *w) { return (uint64_t)w->rows * w->cols * (w->dt == LMS_DTYPE_F32 ? 4 : 2); }

int main(int argc, char **argv)
{
    const char *store_dir = NULL, *model_name = NULL, *folder = NULL;
    int threads = 0, reps = 3;
    uint32_t P = 128, D = 64, block = 0;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--store") && v) store_dir = v, i++;
        else if (!strcmp(a, "--model") && v) model_name = v, i++;
        else if (!strcmp(a, "--folder") && v) folder = v, i++;
        else if (!strcmp(a, "--threads") && v) threads = atoi(v), i++;
        else if (!strcmp(a, "--prompt") && v) P = (uint32_t)atoi(v), i++;
        else if (!strcmp(a, "--decode") && v) D = (uint32_t)atoi(v), i++;
        else if (!strcmp(a, "--reps") && v) reps = atoi(v), i++;
        else if (!strcmp(a, "--block") && v) block = (uint32_t)atoi(v), i++;
        else {
            fprintf(stderr, "usage: bench_engine (--store DIR --model NAME | --folder DIR) [--threads T] "
                            "[--prompt P] [--decode D] [--reps R] [--block B]\n");
            return 2;
        }
    }
    if (!folder && !(store_dir && model_name))
        return 2;
    lms_store *st = NULL;
    lms_model *model = NULL;
    lms__st_folder *fo = NULL;
    lms_engine *e = NULL;
    lms_engine_params ep = lms_engine_default_params();
    ep.threads = threads;
    ep.n_ctx = P + D + 16;
    ep.prefill_block = block;
    ep.no_tokenizer = true;
    double t0 = lms__now();
    int rc;
    if (folder) {
        lms__wsrc src;
        uint8_t id[LMS_MODEL_ID_LEN] = {1};
        if ((rc = lms__st_folder_open(folder, &fo, &src)) || (rc = lms__engine_create_src(&src, id, NULL, &ep, &e)))
            goto fail;
    } else {
        if ((rc = lms_store_open(store_dir, LMS_STORE_RDONLY, NULL, &st)) ||
            (rc = lms_model_open(st, model_name, NULL, &model)) || (rc = lms_engine_create(model, &ep, &e)))
            goto fail;
    }
    double load_ms = (lms__now() - t0) * 1e3;
    uint64_t wbytes = mat_bytes(&e->w.lm_head);
    for (uint32_t l = 0; l < e->hp.n_layers; l++) {
        const lms__layer_w *L = &e->w.layers[l];
        wbytes += mat_bytes(&L->wq) + mat_bytes(&L->wk) + mat_bytes(&L->wv) + mat_bytes(&L->wo) +
                  mat_bytes(&L->w_gate) + mat_bytes(&L->w_up) + mat_bytes(&L->w_down);
    }
    int32_t *prompt = malloc(sizeof(int32_t) * P);
    float *logits = malloc(sizeof(float) * e->hp.n_vocab);
    uint32_t seed = 12345;
    for (uint32_t i = 0; i < P; i++) {
        seed = seed * 1103515245u + 12345u;
        prompt[i] = (int32_t)((seed >> 8) % e->hp.n_vocab);
    }
    double best_pf = 0, best_dec = 0;
    for (int r = 0; r < reps; r++) {
        lms_engine_reset(e);
        lms_kv_drop_cached(e->kv); /* no prefix reuse between repetitions */
        double a = lms__now();
        if ((rc = lms_engine_eval(e, prompt, P, logits, LMS_EVAL_LAST)))
            goto fail;
        double b = lms__now();
        int32_t tok = 0;
        for (uint32_t i = 0; i < D; i++) {
            uint32_t best = 0;
            for (uint32_t k = 1; k < e->hp.n_vocab; k++)
                if (logits[k] > logits[best]) best = k;
            tok = (int32_t)best;
            if ((rc = lms_engine_eval(e, &tok, 1, logits, LMS_EVAL_LAST)))
                goto fail;
        }
        double c = lms__now();
        best_pf = LMS_MAX(best_pf, P / (b - a));
        best_dec = LMS_MAX(best_dec, D / (c - b));
    }
    lms_engine_info info;
    lms_engine_get_info(e, &info);
    printf("{\"arch\": \"%s\", \"kernels\": \"%s\", \"threads\": %d, \"n_layers\": %u, \"n_embd\": %u, "
           "\"n_vocab\": %u, \"prefill_block\": %u, \"prompt_tokens\": %u, \"decode_tokens\": %u, \"reps\": %d, "
           "\"load_ms\": %.1f, \"weight_bytes_per_token\": %llu, \"prefill_tps\": %.2f, \"decode_tps\": %.3f, "
           "\"peak_rss\": %llu}\n",
           info.arch, lms__engine_kernels(e), info.threads, info.n_layers, info.n_embd, info.n_vocab,
           info.prefill_block, P, D, reps, load_ms, (unsigned long long)wbytes, best_pf, best_dec,
           (unsigned long long)lms__peak_rss_bytes());
    free(prompt);
    free(logits);
    lms_engine_free(e);
    lms_model_close(model);
    lms_store_close(st);
    lms__st_folder_close(fo);
    return 0;
fail:
    fprintf(stderr, "bench_engine: %s: %s\n", lms_strerror(rc), lms_last_error());
    lms_engine_free(e);
    lms_model_close(model);
    lms_store_close(st);
    lms__st_folder_close(fo);
    return 1;
}
