/*
 * tests/engine/test_engine_cuda.c - the engine on a CUDA device through its
 * public API, on models imported into a store and placed on the GPU by the
 * loader (resident placement):
 *  - each family's (Gemma 3 with its sliding window too) last-position logits within 1e-2 relative of
 *    transformers' float32 reference, 24 greedy ids identical, perplexity
 *    within 0.5% (tests/fixtures/engine/, the CPU engine's fixtures), with
 *    F32 and F16 K/V, prompts in one block and in blocks of 5;
 *  - a session saved on the GPU resumes on the CPU, and one saved on the
 *    CPU resumes on the GPU, continuing with the ids of the uninterrupted
 *    run (F32 K/V), stored raw, shuffle-zstd and as the default codec
 *    chooses;
 *  - an MLX affine model (4- and 8-bit codes) gives the CPU's last logits
 *    within 1e-2 relative and its 24 greedy ids, prefill by GEMM and by GEMV;
 *  - device memory in use does not change over 1,000 generated tokens (no
 *    allocation on the token path);
 *  - the metrics and info name the device.
 * Without a GPU, or in a build without CUDA, it exits 77: skipped.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "engine/engine_priv.h"
#include "lmstore/engine.h"
#include "lmstore/loader.h"
#include "lmstore/store.h"
#include "loader/device.h"
#include "testutil.h"
#include "engine/fixture_store.h"

static lms_device *g_dev;

typedef struct ref {
    int32_t prompt[64], greedy[64], ppl_ids[256];
    int n_prompt, n_greedy, n_ppl;
    float logits[4096];
    int n_logits;
    double ppl;
} ref;

static int ids(cJSON *a, int32_t *out, int max)
{
    int n = 0;
    cJSON *it;
    cJSON_ArrayForEach(it, a)
    {
        assert_true(n < max);
        out[n++] = (int32_t)it->valuedouble;
    }
    return n;
}

static char *fixture(const char *family)
{
    static char buf[4][1024];
    static int next;
    char *b = buf[next++ % 4];
    snprintf(b, 1024, "%s/tests/fixtures/engine/%s", lms_test_src(), family);
    return b;
}

static void load_ref(const char *family, ref *r)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/reference.json", fixture(family));
    char *txt = lms_test_slurp(path, NULL);
    cJSON *root = cJSON_Parse(txt);
    free(txt);
    assert_non_null(root);
    r->n_prompt = ids(cJSON_GetObjectItem(root, "prompt_ids"), r->prompt, 64);
    r->n_greedy = ids(cJSON_GetObjectItem(root, "greedy_ids"), r->greedy, 64);
    r->n_ppl = ids(cJSON_GetObjectItem(root, "ppl_ids"), r->ppl_ids, 256);
    r->ppl = cJSON_GetObjectItem(root, "ppl")->valuedouble;
    r->n_logits = 0;
    cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(root, "last_logits")) r->logits[r->n_logits++] = (float)it->valuedouble;
    cJSON_Delete(root);
}

static char *store_with(const char *family) { return lms_test_fixture_store("store", family); }

typedef struct rig {
    lms_store *st;
    lms_model *model;
    lms_engine *eng;
} rig;

/* dev NULL: the CPU. sync: the load is complete when the model is open. */
static void rig_open_ex(rig *g, const char *sd, const char *name, lms_device *dev, lms_dtype kvdt, uint32_t block,
                        uint32_t n_ctx, bool sync)
{
    memset(g, 0, sizeof *g);
    assert_int_equal(lms_store_open(sd, 0, NULL, &g->st), 0);
    lms_model_params mp = lms_model_default_params();
    mp.device = dev;
    mp.sync = sync;
    if (dev)
        mp.placement = LMS_PLACE_RESIDENT;
    int rc = lms_model_open(g->st, name, &mp, &g->model);
    if (rc)
        fail_msg("model open: %s", lms_last_error());
    lms_engine_params ep = lms_engine_default_params();
    ep.threads = 2;
    ep.kv_dtype = kvdt;
    ep.prefill_block = block;
    ep.n_ctx = n_ctx;
    ep.device = dev;
    if ((rc = lms_engine_create(g->model, &ep, &g->eng)))
        fail_msg("engine create: %s", lms_last_error());
}

static void rig_open(rig *g, const char *sd, const char *name, lms_device *dev, lms_dtype kvdt, uint32_t block,
                     uint32_t n_ctx)
{
    rig_open_ex(g, sd, name, dev, kvdt, block, n_ctx, false);
}

static void rig_close(rig *g)
{
    lms_engine_free(g->eng);
    lms_model_close(g->model);
    assert_int_equal(lms_store_close(g->st), 0);
}

typedef struct collect {
    int32_t ids[2048];
    int n;
    size_t free_first; /* device free memory after the first token */
} collect;

static size_t dev_free(void)
{
    lms_device_props pr;
    memset(&pr, 0, sizeof pr);
    g_dev->ops->props(g_dev, &pr);
    return pr.free_mem;
}

static int on_token(void *user, int32_t id, const char *piece, size_t len)
{
    collect *c = user;
    if (id < 0)
        return 0;
    c->ids[c->n++] = id;
    if (c->n == 1)
        c->free_first = dev_free();
    return 0;
}

static lms_gen_params greedy(uint32_t max)
{
    lms_gen_params gp = lms_gen_default_params();
    gp.max_tokens = max;
    gp.ignore_eos = true;
    return gp;
}

/* ---- transformers references ------------------------------------------------------------------ */

static void check_family(const char *family, lms_dtype kvdt, uint32_t block)
{
    ref r;
    rig g;
    load_ref(family, &r);
    char *sd = store_with(family);
    rig_open(&g, sd, family, g_dev, kvdt, block, 0);
    lms_engine_info info;
    lms_engine_get_info(g.eng, &info);
    printf("%s on %s (%s), kv %s, block %u\n", family, info.device, info.kernels, lms_dtype_name(kvdt),
           info.prefill_block);
    assert_non_null(strstr(info.device, "cuda:0"));
    uint32_t V = info.n_vocab;
    float *lg = malloc(sizeof(float) * V * 256);
    assert_int_equal(lms_engine_eval(g.eng, r.prompt, r.n_prompt, lg, LMS_EVAL_LAST), 0);
    double md = 0, mx = 0;
    for (uint32_t i = 0; i < V; i++) {
        md = fmax(md, fabs((double)lg[i] - r.logits[i]));
        mx = fmax(mx, fabs((double)r.logits[i]));
    }
    printf("  last logits rel diff %.3g\n", md / mx);
    assert_true(md / mx < 1e-2);

    collect c = {0};
    lms_gen_params gp = greedy(24);
    lms_gen_metrics m;
    assert_int_equal(lms_generate(g.eng, &gp, r.prompt, r.n_prompt, on_token, &c, &m), 0);
    assert_non_null(m.device);
    assert_non_null(strstr(m.device, "cuda"));
    int first_bad = -1;
    for (int i = 0; i < r.n_greedy && first_bad < 0; i++)
        if (c.ids[i] != r.greedy[i])
            first_bad = i;
    if (first_bad >= 0)
        printf("  greedy diverges at %d: %d vs %d\n", first_bad, c.ids[first_bad], r.greedy[first_bad]);
    assert_int_equal(c.n, r.n_greedy);
    assert_memory_equal(c.ids, r.greedy, sizeof(int32_t) * r.n_greedy);

    lms_engine_reset(g.eng);
    assert_int_equal(lms_engine_eval(g.eng, r.ppl_ids, r.n_ppl, lg, LMS_EVAL_ALL), 0);
    double nll = 0;
    for (int t = 0; t + 1 < r.n_ppl; t++) {
        const float *row = lg + (size_t)t * V;
        double m2 = -INFINITY, s = 0;
        for (uint32_t i = 0; i < V; i++) m2 = fmax(m2, row[i]);
        for (uint32_t i = 0; i < V; i++) s += exp((double)row[i] - m2);
        nll -= (double)row[r.ppl_ids[t + 1]] - m2 - log(s);
    }
    double ppl = exp(nll / (r.n_ppl - 1));
    printf("  ppl %.6g, transformers %.6g\n", ppl, r.ppl);
    assert_true(fabs(ppl - r.ppl) / r.ppl < 5e-3);
    free(lg);
    rig_close(&g);
    lms_test_rmrf(sd);
    free(sd);
}

static void families_match_transformers(void **s)
{
    /* gemma3: sliding-window layers in the cache's window group, prompts (40) past the window (16) */
    const char *fam[] = {"llama", "qwen2", "qwen3", "gemma3", "gemma3-mm"};
    for (int i = 0; i < 5; i++) {
        check_family(fam[i], LMS_DTYPE_F32, 0);
        check_family(fam[i], LMS_DTYPE_F32, 5);
        check_family(fam[i], LMS_DTYPE_F16, 0);
    }
}

/* ---- MLX affine weights: CUDA against the CPU on the same codes ------------------------------------ */

/* A model's last logits and 24 greedy ids after a 40-token prompt, on dev (NULL: the CPU). */
static void run_mlx(const char *sd, lms_device *dev, uint32_t block, float *lg, collect *c)
{
    rig g;
    int32_t p[40];
    for (int i = 0; i < 40; i++) p[i] = (int32_t)((i * 37 + 11) % 384);
    rig_open(&g, sd, "mlx-llama", dev, LMS_DTYPE_F32, block, 0);
    assert_int_equal(lms_engine_eval(g.eng, p, 40, lg, LMS_EVAL_LAST), 0);
    lms_engine_reset(g.eng);
    lms_gen_params gp = greedy(24);
    assert_int_equal(lms_generate(g.eng, &gp, p, 40, on_token, c, NULL), 0);
    rig_close(&g);
}

/* The CPU's last logits after the prompt of run_mlx and then ids[0 .. n). */
static void mlx_cpu_logits(const char *sd, const int32_t *ids, int n, float *lg)
{
    rig g;
    int32_t p[64];
    for (int i = 0; i < 40; i++) p[i] = (int32_t)((i * 37 + 11) % 384);
    memcpy(p + 40, ids, (size_t)n * sizeof *ids);
    rig_open(&g, sd, "mlx-llama", NULL, LMS_DTYPE_F32, 0, 0);
    assert_int_equal(lms_engine_eval(g.eng, p, 40 + n, lg, LMS_EVAL_LAST), 0);
    rig_close(&g);
}

/* tests/fixtures/quant/mlx-llama: 4-bit codes, an 8-bit layer, groups of 32,
 * bf16 scales and biases. Prefill in one block runs the GEMM path (rows
 * dequantized to bf16 for cuBLAS), blocks of 5 the GEMV on the codes, and
 * one-row steps (the head of a prompt, decode) the GEMV on int8 activations:
 * logits within 1e-2 of the CPU's, greedy ids the CPU's up to a step where
 * the CPU's two candidates are within that error of each other. With
 * LMSTORE_CUDA_MLX_EXACT=1 (f32 activations) the ids are the CPU's. */
static void mlx_weights_match_the_cpu(void **s)
{
    char *sd = lms_test_tmpdir("store");
    lms_store *st;
    assert_int_equal(lms_store_open(sd, LMS_STORE_CREATE, NULL, &st), 0);
    lms_import_params ip = lms_import_default_params();
    ip.name = "mlx-llama";
    char path[1100];
    snprintf(path, sizeof path, "%s/tests/fixtures/quant/mlx-llama", lms_test_src());
    if (lms_import(st, path, &ip, NULL))
        fail_msg("import: %s", lms_last_error());
    assert_int_equal(lms_store_close(st), 0);
    float cpu[384], gpu[384];
    collect cc = {0};
    run_mlx(sd, NULL, 0, cpu, &cc);
    for (int bi = 0; bi < 3; bi++) {
        collect gc = {0};
        if (bi == 2)
            setenv("LMSTORE_CUDA_MLX_EXACT", "1", 1);
        run_mlx(sd, g_dev, bi == 1 ? 5 : 0, gpu, &gc);
        unsetenv("LMSTORE_CUDA_MLX_EXACT");
        double md = 0, mx = 0;
        for (int i = 0; i < 384; i++) {
            md = fmax(md, fabs((double)gpu[i] - cpu[i]));
            mx = fmax(mx, fabs((double)cpu[i]));
        }
        printf("mlx-llama block %d%s: last logits rel diff to the CPU %.3g\n", bi == 1 ? 5 : 0,
               bi == 2 ? " (f32 activations)" : "", md / mx);
        assert_true(md / mx < 1e-2);
        assert_int_equal(gc.n, 24);
        if (bi == 2) {
            assert_memory_equal(gc.ids, cc.ids, 24 * sizeof(int32_t));
            continue;
        }
        int d = 0;
        while (d < 24 && gc.ids[d] == cc.ids[d]) d++;
        if (d < 24) { /* a divergence only where the CPU's logits nearly tie */
            float lg[384];
            mlx_cpu_logits(sd, cc.ids, d, lg);
            double top = 0;
            for (int i = 0; i < 384; i++) top = fmax(top, fabs((double)lg[i]));
            double gap = fabs((double)lg[cc.ids[d]] - lg[gc.ids[d]]) / top;
            printf("mlx-llama: greedy ids the CPU's for %d tokens; then %d vs %d, CPU logits %.3g apart (rel)\n", d,
                   gc.ids[d], cc.ids[d], gap);
            assert_true(gap < 2e-2);
        }
    }
    lms_test_rmrf(sd);
    free(sd);
}

/* ---- sessions across devices ---------------------------------------------------------------------- */

static void session_moves(const char *family)
{
    ref r;
    rig g;
    load_ref(family, &r);
    char *sd = store_with(family);
    /* the uninterrupted run, on the CPU */
    rig_open(&g, sd, family, NULL, LMS_DTYPE_F32, 0, 0);
    collect full = {0};
    lms_gen_params gp = greedy(24);
    assert_int_equal(lms_generate(g.eng, &gp, r.prompt, r.n_prompt, on_token, &full, NULL), 0);
    rig_close(&g);
    /* the default codec (through the engine), then raw and shuffle-zstd pages (the ring's two paths);
     * each in a store of its own, as pages are content-addressed: a second save would store nothing */
    const lms_kv_codec codecs[] = {LMS_KV_CODEC_AUTO, LMS_KV_CODEC_RAW, LMS_KV_CODEC_SHUFFLE_ZSTD};
    for (int k = 0; k < 6; k++) {
        int dir = k % 2;
        lms_kv_codec codec = codecs[k / 2];
        const char *name = dir == 0 ? "from-gpu" : "from-cpu";
        lms_device *save_on = dir == 0 ? g_dev : NULL, *resume_on = dir == 0 ? NULL : g_dev;
        if (k > 0 && dir == 0) {
            lms_test_rmrf(sd);
            free(sd);
            sd = store_with(family);
        }
        rig_open(&g, sd, family, save_on, LMS_DTYPE_F32, 0, 0);
        collect c = {0};
        gp = greedy(10);
        assert_int_equal(lms_generate(g.eng, &gp, r.prompt, r.n_prompt, on_token, &c, NULL), 0);
        assert_memory_equal(c.ids, full.ids, 10 * sizeof(int32_t));
        if (codec == LMS_KV_CODEC_AUTO) {
            assert_int_equal(lms_engine_session_save(g.eng, g.st, name), 0);
        } else {
            lms_kv_save_params sp = lms_kv_default_save_params();
            sp.codec = codec;
            assert_int_equal(lms__engine_flush_pending(g.eng), 0);
            assert_int_equal(lms_kv_save_ex(g.eng->kv, g.eng->seq, g.st, name, &sp, NULL), 0);
        }
        rig_close(&g);
        rig_open(&g, sd, family, resume_on, LMS_DTYPE_F32, 0, 0);
        assert_int_equal(lms_engine_session_load(g.eng, g.st, name), 0);
        collect c2 = {0};
        gp = greedy(14);
        assert_int_equal(lms_generate(g.eng, &gp, NULL, 0, on_token, &c2, NULL), 0);
        printf("%s %s -> %s (%s): %d ids\n", family, dir == 0 ? "gpu" : "cpu", dir == 0 ? "cpu" : "gpu",
               lms_kv_codec_name(codec), c2.n);
        assert_int_equal(c2.n, 14);
        assert_memory_equal(c2.ids, full.ids + 10, 14 * sizeof(int32_t));
        rig_close(&g);
    }
    lms_test_rmrf(sd);
    free(sd);
}

static void session_moves_between_gpu_and_cpu(void **s)
{
    session_moves("qwen3");
    session_moves("gemma3"); /* saved past the window: the window group's pages move too */
}

/* ---- an engine created while the weights arrive ------------------------------------------------------ */

/* Last logits of prompt p[0..n) of model `name`: by an engine created at once
 * on a resident load (its first step runs each layer as its weights arrive)
 * and by one created after a load opened with sync (every weight in). Equal
 * bit for bit: the gated step looks the embedding up in the host mapping,
 * which must give what the device's lookup gives. */
static void behind_load(const char *sd, const char *name, const int32_t *p, int n)
{
    float a[512], b[512];
    for (int sync = 0; sync < 2; sync++) {
        rig g;
        rig_open_ex(&g, sd, name, g_dev, 0, 0, 0, sync);
        bool all_in = lms_model_layer_ready(g.model, LMS_LAYER_ALL);
        lms_engine_info info;
        lms_engine_get_info(g.eng, &info);
        assert_true(info.n_vocab <= 512);
        assert_int_equal(lms_engine_eval(g.eng, p, (size_t)n, sync ? b : a, LMS_EVAL_LAST), 0);
        printf("%s: sync %d, every weight in when the engine was made: %d\n", name, sync, all_in);
        assert_true(!sync || all_in);
        rig_close(&g);
        if (sync)
            assert_memory_equal(a, b, sizeof(float) * info.n_vocab);
    }
}

static void engine_made_during_the_load_computes_as_after_it(void **s)
{
    int32_t p[40];
    for (int i = 0; i < 40; i++) p[i] = (int32_t)((i * 37 + 11) % 256);
    const char *fams[] = {"llama", "gemma3"}; /* gemma3: embeddings scaled in bf16 */
    for (int i = 0; i < 2; i++) {
        char *sd = store_with(fams[i]);
        behind_load(sd, fams[i], p, 40);
        lms_test_rmrf(sd);
        free(sd);
    }
}

/* ---- memory ------------------------------------------------------------------------------------------ */

static void device_memory_flat_over_1000_tokens(void **s)
{
    rig g;
    char *sd = store_with("llama");
    rig_open(&g, sd, "llama", g_dev, LMS_DTYPE_F16, 0, 1100);
    collect *c = calloc(1, sizeof *c);
    lms_gen_params gp = greedy(1000);
    int32_t p[3] = {1, 2, 3};
    assert_int_equal(lms_generate(g.eng, &gp, p, 3, on_token, c, NULL), 0);
    assert_int_equal(c->n, 1000);
    size_t after = dev_free();
    printf("device free after the first token %zu, after 1000 tokens %zu\n", c->free_first, after);
    assert_true(after == c->free_first);
    free(c);
    rig_close(&g);
    lms_test_rmrf(sd);
    free(sd);
}

int main(void)
{
    if (lms_device_open(LMS_DEVICE_CUDA, 0, &g_dev)) {
        fprintf(stderr, "no CUDA device (%s): skipped\n", lms_last_error());
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(families_match_transformers),
        cmocka_unit_test(session_moves_between_gpu_and_cpu),
        cmocka_unit_test(mlx_weights_match_the_cpu),
        cmocka_unit_test(device_memory_flat_over_1000_tokens),
        cmocka_unit_test(engine_made_during_the_load_computes_as_after_it),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    lms_device_close(g_dev);
    return rc;
}
