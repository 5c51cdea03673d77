/*
 * tools/bench_engine.c - `lmstore bench engine MODEL`: prefill and decode
 * speed of the engine on a device, and how close decode comes to the
 * memory-bandwidth roofline measured by the same command.
 *
 *   prefill   --prompt N tokens from an empty sequence, timed (tok/s and
 *             TFLOP/s: 2 x parameters of the matrices per token, plus
 *             attention's 4 x layers x heads x head_dim x N^2 / 2);
 *   decode    the sequence is extended to --ctx tokens (untimed), then
 *             --gen tokens are generated greedily through lms_generate
 *             (the path `lmstore run` takes), timed per token;
 *   roofline  bytes one decode token reads (every matrix once, LM head
 *             included, embedding row excluded; plus K and V of the
 *             context) x decode tok/s / the device's read bandwidth,
 *             measured by the engine's backend on a scratch buffer in the
 *             same process.
 * Each of --reps repetitions starts from an empty sequence with the prefix
 * cache dropped; the median is reported.
 *
 * --session N: a sequence of N tokens is prefilled (timed), saved into the
 * store as a session (--codec, default the KV cache's), and resumed into
 * the emptied cache (timed): resume against recompute. Prefill and resume
 * run --reps times (at least 3); the first resume and the medians are
 * reported.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "engine/engine_priv.h"
#include "kvcache/kv_internal.h"
#include "lmstore/engine.h"
#include "lmstore/loader.h"
#include "lmstore/store.h"
#include "tools/bench.h"
#include "tools/cli.h"

static const char usage[] =
    "usage: lmstore bench engine MODEL [--store DIR] [--device cpu|cuda|cuda:N] [--prompt N] [--gen N]\n"
    "           [--ctx N] [--reps R] [--threads T] [--kv-dtype f16|bf16|f32] [--membw-mib N] [--session N]\n"
    "           [--codec C] [--json]\n"
    "  --prompt N   prefill length measured (default 512)\n"
    "  --gen N      tokens generated for the decode rate (default 128)\n"
    "  --ctx N      context when decode starts (default: the prompt)\n"
    "  --session N  also prefill, save and resume a session of N tokens (--codec raw|zstd|shuffle-zstd|auto)\n";

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

double lms_bench_median(double *v, int n)
{
    qsort(v, (size_t)n, sizeof *v, cmp_d);
    return n % 2 ? v[n / 2] : 0.5 * (v[n / 2 - 1] + v[n / 2]);
}

static int quiet(void *u, int32_t id, const char *p, size_t l)
{
    (void)u, (void)id, (void)p, (void)l;
    return 0;
}

int lms_bench_open(const char *cmd, const char *store_opt, bool writable, const char *devname, lms_store **st,
                   lms_device **dev)
{
    const char *path = lms_cli_store_path(store_opt);
    int rc;
    *st = NULL;
    *dev = NULL;
    if ((rc = lms_store_open(path, writable ? 0 : LMS_STORE_RDONLY, NULL, st))) {
        *st = NULL;
        lms_cli_fail(cmd, rc, path);
        return rc;
    }
    if (devname && strcmp(devname, "cpu") && (rc = lms_device_open_name(devname, dev))) {
        *dev = NULL;
        lms_cli_fail(cmd, rc, NULL);
        lms_store_close(*st);
        *st = NULL;
        return rc;
    }
    return LMS_OK;
}

int lms_bench_engine(int argc, char **argv)
{
    const char *store_opt = NULL, *model = NULL, *devname = NULL, *v;
    int64_t prompt = 512, gen = 128, ctx = 0, reps = 3, threads = 0, membw_mib = 0, session = 0, n;
    lms_kv_save_params sp = lms_kv_default_save_params();
    bool json = false;
    lms_dtype kvdt = LMS_DTYPE_F16;
    for (int i = 1; i < argc;) {
        if (lms_cli_end_of_options(argv, &i))
            continue;
        if (lms_cli_opt(argc, argv, &i, "--store", &v)) store_opt = v;
        else if (lms_cli_opt(argc, argv, &i, "--device", &v)) devname = v;
        else if (lms_cli_opt(argc, argv, &i, "--prompt", &v) && lms_cli_parse_i64(v, &n) && n > 0) prompt = n;
        else if (lms_cli_opt(argc, argv, &i, "--gen", &v) && lms_cli_parse_i64(v, &n) && n > 1) gen = n;
        else if (lms_cli_opt(argc, argv, &i, "--ctx", &v) && lms_cli_parse_i64(v, &n) && n >= 0) ctx = n;
        else if (lms_cli_opt(argc, argv, &i, "--reps", &v) && lms_cli_parse_i64(v, &n) && n > 0) reps = n;
        else if (lms_cli_opt(argc, argv, &i, "--threads", &v) && lms_cli_parse_i64(v, &n) && n >= 0) threads = n;
        else if (lms_cli_opt(argc, argv, &i, "--membw-mib", &v) && lms_cli_parse_i64(v, &n) && n > 0) membw_mib = n;
        else if (lms_cli_opt(argc, argv, &i, "--session", &v) && lms_cli_parse_i64(v, &n) && n > 0) session = n;
        else if (lms_cli_opt(argc, argv, &i, "--codec", &v)) {
            if (lms_kv_codec_from_name(v, &sp.codec))
                return lms_cli_usage("bench engine", "--codec: '%s' is not raw, zstd, shuffle-zstd or auto", v);
        }
        else if (lms_cli_opt(argc, argv, &i, "--kv-dtype", &v)) {
            if (!strcmp(v, "f16")) kvdt = LMS_DTYPE_F16;
            else if (!strcmp(v, "bf16")) kvdt = LMS_DTYPE_BF16;
            else if (!strcmp(v, "f32")) kvdt = LMS_DTYPE_F32;
            else return lms_cli_usage("bench engine", "--kv-dtype: '%s' is not f16, bf16 or f32", v);
        } else if (lms_cli_flag(argv, i, "--json")) json = true, i++;
        else if (lms_cli_is_option(argv[i])) return lms_cli_usage("bench engine", "bad option or value '%s'\n%s", argv[i], usage);
        else if (!model) model = argv[i++];
        else return lms_cli_usage("bench engine", "unexpected argument '%s'", argv[i]);
    }
    if (!model)
        return lms_cli_usage("bench engine", "which model?\n%s", usage);
    if (ctx < prompt)
        ctx = prompt;

    int rc, status = LMS_EXIT_FAIL;
    lms_store *st = NULL;
    lms_device *dev = NULL;
    lms_model *m = NULL;
    lms_engine *e = NULL;
    int32_t *toks = NULL;
    double *pf = NULL, *dec = NULL, *s_pfs = NULL, *s_ress = NULL;
    if ((rc = lms_bench_open("bench engine", store_opt, session > 0, devname, &st, &dev)))
        goto out;
    lms_model_params mp = lms_model_default_params();
    mp.device = dev;
    double t0 = lms__now();
    if ((rc = lms_model_open(st, model, &mp, &m))) {
        lms_cli_fail("bench engine", rc, model);
        goto out;
    }
    lms_engine_params ep = lms_engine_default_params();
    ep.device = dev;
    ep.threads = (int)threads;
    ep.kv_dtype = kvdt;
    ep.n_ctx = (uint32_t)(LMS_MAX(ctx + gen, session) + 16);
    ep.no_tokenizer = true;
    if ((rc = lms_engine_create(m, &ep, &e))) {
        lms_cli_fail("bench engine", rc, model);
        goto out;
    }
    double load_s = lms__now() - t0;
    lms_engine_info info;
    lms_engine_get_info(e, &info);

    /* bytes and FLOPs of a token */
    uint64_t wbytes = lms__weights_bytes(&e->w, &e->hp), params = 0;
    for (uint32_t l = 0; l < info.n_layers; l++) {
        const lms__layer_w *L = &e->w.layers[l];
        params += (uint64_t)L->wq.rows * L->wq.cols + (uint64_t)L->wk.rows * L->wk.cols +
                  (uint64_t)L->wv.rows * L->wv.cols + (uint64_t)L->wo.rows * L->wo.cols +
                  (uint64_t)L->w_gate.rows * L->w_gate.cols + (uint64_t)L->w_up.rows * L->w_up.cols +
                  (uint64_t)L->w_down.rows * L->w_down.cols;
    }
    size_t kv_elem = kvdt == LMS_DTYPE_F32 ? 4 : 2;
    uint64_t kv_tok = 2ull * info.n_layers * info.n_kv_heads * info.head_dim * kv_elem; /* K+V bytes per position */
    double avg_ctx = (double)ctx + gen / 2.0;
    double bytes_tok = (double)wbytes + kv_tok * avg_ctx;
    double flops_pf = 2.0 * params * prompt + 4.0 * info.n_layers * info.n_heads * info.head_dim * 0.5 *
                                                  (double)prompt * (double)prompt;

    int64_t ntoks = LMS_MAX(ctx, session);
    toks = malloc(sizeof(int32_t) * (size_t)ntoks);
    pf = calloc((size_t)reps, sizeof *pf);
    dec = calloc((size_t)reps, sizeof *dec);
    if (!toks || !pf || !dec) {
        lms_cli_fail("bench engine", LMS_ENOMEM, NULL);
        goto out;
    }
    uint32_t seed = 12345;
    for (int64_t i = 0; i < ntoks; i++) {
        seed = seed * 1103515245u + 12345u;
        toks[i] = (int32_t)((seed >> 8) % info.n_vocab);
    }
    /* a warm-up pass: first-use costs (kernel loading, graph recording) stay out */
    lms_gen_params gp = lms_gen_default_params();
    gp.ignore_eos = true;
    gp.max_tokens = 4;
    if ((rc = lms_engine_eval(e, toks, (size_t)LMS_MIN(prompt, 64), NULL, 0)) ||
        (rc = lms_generate(e, &gp, NULL, 0, quiet, NULL, NULL))) {
        lms_cli_fail("bench engine", rc, model);
        goto out;
    }
    for (int r = 0; r < reps; r++) {
        lms_engine_reset(e);
        lms_kv_drop_cached(e->kv);
        double a = lms__now();
        if ((rc = lms_engine_eval(e, toks, (size_t)prompt, NULL, 0))) {
            lms_cli_fail("bench engine", rc, model);
            goto out;
        }
        pf[r] = prompt / (lms__now() - a);
        if (ctx > prompt && (rc = lms_engine_eval(e, toks + prompt, (size_t)(ctx - prompt), NULL, 0))) {
            lms_cli_fail("bench engine", rc, model);
            goto out;
        }
        lms_gen_metrics gm;
        gp.max_tokens = (uint32_t)gen;
        if ((rc = lms_generate(e, &gp, NULL, 0, quiet, NULL, &gm))) {
            lms_cli_fail("bench engine", rc, model);
            goto out;
        }
        dec[r] = gm.gen_tps;
    }
    double pf_med = lms_bench_median(pf, (int)reps), dec_med = lms_bench_median(dec, (int)reps);
    size_t probe = membw_mib ? (size_t)membw_mib << 20 : info.device && strncmp(info.device, "cpu", 3) ? 4ull << 30
                                                                                                    : 1ull << 30;
    double bw = lms__fwd_membw(e->fwd, probe);
    double roof = bw > 0 ? dec_med * bytes_tok / (bw * 1e9) : 0;
    double tflops = pf_med / prompt * flops_pf / 1e12;
    /* a session: recompute (prefill) against resume */
    double s_pf = 0, s_save = 0, s_res = 0, s_res2 = 0, s_pf_med = 0, s_res_med = 0;
    int s_n = 0;
    lms__kv_resume_times rt;
    memset(&rt, 0, sizeof rt);
    uint64_t s_raw = 0, s_stored = 0;
    if (session) {
        /* --reps prefills and resumes (at least 3), medians reported beside
         * the first resume: the first reads pages the save has just written */
        static const char sname[] = "lmstore-bench-session";
        lms_kv_io_stats io;
        int sreps = (int)LMS_MAX(reps, 3);
        s_pfs = calloc((size_t)sreps, sizeof *s_pfs);
        s_ress = calloc((size_t)sreps, sizeof *s_ress);
        if (!s_pfs || !s_ress) {
            rc = lms__err(LMS_ENOMEM, "bench engine: out of memory");
            goto session_fail;
        }
        for (int r = 0; r < sreps; r++) {
            lms_engine_reset(e);
            lms_kv_drop_cached(e->kv);
            double a = lms__now();
            if ((rc = lms_engine_eval(e, toks, (size_t)session, NULL, 0)))
                goto session_fail;
            s_pfs[r] = lms__now() - a;
        }
        s_pf = s_pfs[0];
        double a = lms__now();
        memset(&io, 0, sizeof io);
        if ((rc = lms_kv_save_ex(e->kv, e->seq, st, sname, &sp, &io)))
            goto session_fail;
        s_save = lms__now() - a;
        s_raw = io.raw_bytes;
        s_stored = io.stored_bytes;
        for (int r = 0; r < sreps; r++) {
            lms_engine_reset(e);
            lms_kv_drop_cached(e->kv); /* nothing of it stays in device memory */
            a = lms__now();
            if ((rc = lms_engine_session_load(e, st, sname)))
                goto session_fail;
            s_ress[r] = lms__now() - a;
            if (r == 0)
                rt = e->kv->last_resume;
        }
        s_res = s_ress[0];
        s_res2 = s_ress[1];
        s_pf_med = lms_bench_median(s_pfs, sreps);
        s_res_med = lms_bench_median(s_ress, sreps);
        s_n = sreps;
        lms_kv_session_rm(st, sname);
    session_fail:
        if (rc) {
            lms_cli_fail("bench engine", rc, model);
            goto out;
        }
    }
    if (json) {
        printf("{\"model\": \"%s\", \"device\": \"%s\", \"kernels\": \"%s\", \"threads\": %d, \"kv_dtype\": \"%s\", "
               "\"load_s\": %.3f, \"n_layers\": %u, \"n_embd\": %u, \"n_vocab\": %u, \"weight_bytes\": %llu, "
               "\"matrix_params\": %llu, \"prompt\": %lld, \"prefill_block\": %u, \"prefill_tps\": %.1f, "
               "\"prefill_ms\": %.2f, \"prefill_tflops\": %.1f, \"ctx\": %lld, \"gen\": %lld, \"decode_tps\": %.2f, "
               "\"decode_ms\": %.3f, \"bytes_per_token\": %.0f, \"membw_gbps\": %.1f, \"roofline\": %.3f, "
               "\"reps\": %lld, \"session_tokens\": %lld, \"session_codec\": \"%s\", \"session_prefill_s\": %.4f, "
               "\"session_save_s\": %.4f, \"session_resume_s\": %.4f, \"session_raw_bytes\": %llu, "
               "\"session_stored_bytes\": %llu, \"session_resume2_s\": %.4f, \"session_reps\": %d, "
               "\"session_prefill_median_s\": %.4f, \"session_resume_median_s\": %.4f, \"resume_threads\": %d, "
               "\"resume_ms\": {\"prepare\": %.2f, \"setup\": %.2f, \"pages\": %.2f, \"last_uploads\": %.2f, "
               "\"build\": %.2f, \"last_used\": %.2f, \"per_thread_wait\": %.2f, \"per_thread_read\": %.2f, "
               "\"per_thread_check\": %.2f, \"per_thread_upload_calls\": %.2f}}\n",
               model, info.device, info.kernels, info.threads, lms_dtype_name(kvdt), load_s, info.n_layers,
               info.n_embd, info.n_vocab, (unsigned long long)wbytes, (unsigned long long)params, (long long)prompt,
               info.prefill_block, pf_med, prompt / pf_med * 1e3, tflops, (long long)ctx, (long long)gen, dec_med,
               1e3 / dec_med, bytes_tok, bw, roof, (long long)reps, (long long)session, lms_kv_codec_name(sp.codec),
               s_pf, s_save, s_res, (unsigned long long)s_raw, (unsigned long long)s_stored, s_res2, s_n, s_pf_med, s_res_med, rt.threads,
               rt.prepare * 1e3, rt.setup * 1e3, rt.pipeline * 1e3, rt.sync * 1e3, rt.build * 1e3, rt.touch * 1e3,
               rt.wait * 1e3 / LMS_MAX(1, rt.threads), rt.read * 1e3 / LMS_MAX(1, rt.threads),
               rt.hash * 1e3 / LMS_MAX(1, rt.threads), rt.upload * 1e3 / LMS_MAX(1, rt.threads));
    } else {
        printf("%s on %s (%s), KV %s\n", model, info.device, info.kernels, lms_dtype_name(kvdt));
        printf("  prefill %lld tokens: %.1f tok/s (%.2f ms, %.1f TFLOP/s)\n", (long long)prompt, pf_med,
               prompt / pf_med * 1e3, tflops);
        printf("  decode at %lld tokens of context: %.2f tok/s (%.3f ms/token)\n", (long long)ctx, dec_med,
               1e3 / dec_med);
        printf("  %.2f GB read per token; memory read bandwidth %.1f GB/s: %.1f%% of the roofline\n",
               bytes_tok / 1e9, bw, roof * 100);
        if (session)
            printf("  session of %lld tokens (%s): prefill %.1f ms, save %.1f ms, first resume %.1f ms (%.1fx faster "
                   "than the prefill); medians of %d: prefill %.1f ms, resume %.1f ms (%.1fx)\n",
                   (long long)session, lms_kv_codec_name(sp.codec), s_pf * 1e3, s_save * 1e3, s_res * 1e3,
                   s_pf / s_res, s_n, s_pf_med * 1e3, s_res_med * 1e3, s_pf_med / s_res_med);
    }
    status = LMS_EXIT_OK;
out:
    free(toks);
    free(pf);
    free(dec);
    free(s_pfs);
    free(s_ress);
    lms_engine_free(e);
    lms_model_close(m);
    lms_device_close(dev);
    lms_store_close(st);
    return status;
}
