/*
 * tests/engine/test_engine.c - the engine through its public API on models
 * imported into a store and opened by the loader, with the paged KV cache:
 *  - logits, 24 greedy tokens and perplexity of each family equal
 *    transformers' (tests/fixtures/engine/, see
 *    tests/reference/make_engine_fixtures.py), also with a config written in
 *    the older rope_scaling form (Gemma 3: the older form of its RoPE and
 *    layer settings, with the text config's defaults left out, as
 *    gemma-3-4b's config.json has them);
 *  - a session saved after N tokens and resumed in a NEW PROCESS continues
 *    with exactly the ids of the uninterrupted run (Gemma 3: saved past the
 *    sliding window); resuming a session of another model fails with
 *    LMS_EMISMATCH and leaves the sequence alone;
 *  - Gemma 3's sliding-window layers hold at most the window's pages of the
 *    KV arena over a generation 8x the window, and their pages that slid
 *    out serve a prefix reuse and a regeneration from an earlier point;
 *  - prefix reuse (from the sequence and from the prefix cache) is reported
 *    and gives the same tokens as a full recompute;
 *  - memory stays flat while tokens flow (RSS), and anonymous memory does
 *    not grow with the size of the weights (they stay file-backed);
 *  - unsupported architectures and settings fail at load naming them.
 */
#include <cjson/cJSON.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "engine/engine_priv.h"
#include "engine/internal.h"
#include "lmstore/engine.h"
#include "lmstore/loader.h"
#include "lmstore/tokenizer.h"
#include "testutil.h"

/* ---- helpers ---------------------------------------------------------------------------------- */

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
    static char bufs[4][1024]; /* rotating: several calls may be arguments of one call */
    static int next;
    char *buf = bufs[next++ % 4];
    snprintf(buf, 1024, "%s/tests/fixtures/engine/%s", lms_test_src(), family);
    return buf;
}

static void load_ref(const char *family, ref *r)
{
    char path[1100];
    snprintf(path, sizeof path, "%s/reference.json", fixture(family));
    char *txt = lms_test_slurp(path, NULL);
    assert_non_null(txt);
    cJSON *root = cJSON_Parse(txt);
    free(txt);
    assert_non_null(root);
    r->n_prompt = ids(cJSON_GetObjectItem(root, "prompt_ids"), r->prompt, 64);
    r->n_greedy = ids(cJSON_GetObjectItem(root, "greedy_ids"), r->greedy, 64);
    r->n_ppl = ids(cJSON_GetObjectItem(root, "ppl_ids"), r->ppl_ids, 256);
    r->ppl = cJSON_GetObjectItem(root, "ppl")->valuedouble;
    r->n_logits = 0;
    cJSON *it;
    cJSON_ArrayForEach(it, cJSON_GetObjectItem(root, "last_logits"))
    {
        assert_true(r->n_logits < 4096);
        r->logits[r->n_logits++] = (float)it->valuedouble;
    }
    cJSON_Delete(root);
}

static void import(lms_store *st, const char *dir, const char *name)
{
    lms_import_params ip = lms_import_default_params();
    ip.name = name;
    ip.threads = 1;
    int rc = lms_import(st, dir, &ip, NULL);
    if (rc)
        fail_msg("import %s: %s", dir, lms_last_error());
}

/* A new store in a scratch folder holding the fixture `family` under its name; free the path. */
static char *store_with(const char *tag, const char *family)
{
    char *sd = lms_test_tmpdir(tag);
    lms_store *st;
    assert_int_equal(lms_store_open(sd, LMS_STORE_CREATE, NULL, &st), 0);
    import(st, fixture(family), family);
    assert_int_equal(lms_store_close(st), 0);
    return sd;
}

typedef struct rig {
    lms_store *st;
    lms_model *model;
    lms_engine *eng;
} rig;

static void rig_open(rig *g, const char *store_dir, const char *name, lms_dtype kvdt, uint32_t n_ctx)
{
    memset(g, 0, sizeof *g);
    assert_int_equal(lms_store_open(store_dir, 0, NULL, &g->st), 0);
    assert_int_equal(lms_model_open(g->st, name, NULL, &g->model), 0);
    lms_engine_params ep = lms_engine_default_params();
    ep.threads = 2;
    ep.kv_dtype = kvdt;
    ep.n_ctx = n_ctx;
    ep.prefill_block = 5; /* small: prompts span several blocks and pages */
    int rc = lms_engine_create(g->model, &ep, &g->eng);
    if (rc)
        fail_msg("engine create %s: %s", name, lms_last_error());
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
    long rss_first; /* resident KB after the first token */
} collect;

static long rss_kb(void)
{
    long pages = 0, res = 0;
    FILE *f = fopen("/proc/self/statm", "r");
    if (f) {
        if (fscanf(f, "%ld %ld", &pages, &res) != 2)
            res = 0;
        fclose(f);
    }
    return res * (sysconf(_SC_PAGESIZE) / 1024);
}

static int on_token(void *user, int32_t id, const char *piece, size_t len)
{
    collect *c = user;
    if (id < 0)
        return 0;
    c->ids[c->n++] = id;
    if (c->n == 1)
        c->rss_first = rss_kb();
    return 0;
}

static lms_gen_params greedy(uint32_t max)
{
    lms_gen_params gp = lms_gen_default_params();
    gp.max_tokens = max;
    gp.ignore_eos = true;
    return gp;
}

/* ---- transformers references through the store --------------------------------------------- */

/* fixture: its folder name (gemma3-mm is a gemma3 model) */
static void check_family_dir(const char *family, const char *dir)
{
    ref r;
    rig g;
    load_ref(family, &r);
    const char *arch = strncmp(family, "gemma3", 6) ? family : "gemma3";
    char *sd = lms_test_tmpdir("store");
    lms_store *st;
    assert_int_equal(lms_store_open(sd, LMS_STORE_CREATE, NULL, &st), 0);
    import(st, dir, family);
    assert_int_equal(lms_store_close(st), 0);
    rig_open(&g, sd, family, LMS_DTYPE_F32, 0);
    lms_engine_info info;
    lms_engine_get_info(g.eng, &info);
    assert_string_equal(info.arch, arch);
    assert_int_equal((int)info.n_vocab, r.n_logits);
    if (!strcmp(arch, "gemma3")) { /* stops on <eos> and <end_of_turn>, as its generation config says; BOS 2 */
        assert_int_equal(info.n_eos, 2);
        assert_int_equal(info.eos_ids[0], 1);
        assert_int_equal(info.eos_ids[1], 106);
        assert_int_equal(info.bos_id, 2);
    }
    uint32_t V = info.n_vocab;
    float *lg = malloc(sizeof(float) * V * 256);

    assert_int_equal(lms_engine_eval(g.eng, r.prompt, r.n_prompt, lg, LMS_EVAL_LAST), 0);
    double md = 0, mx = 0;
    for (uint32_t i = 0; i < V; i++) {
        md = fmax(md, fabs((double)lg[i] - r.logits[i]));
        mx = fmax(mx, fabs((double)r.logits[i]));
    }
    printf("%s (%s): last logits rel diff %.3g\n", family, dir, md / mx);
    assert_true(md / mx < 1e-3);

    /* greedy through lms_generate: reuses the prompt already in the sequence */
    collect c = {0};
    lms_gen_params gp = greedy(24);
    lms_gen_metrics m;
    assert_int_equal(lms_generate(g.eng, &gp, r.prompt, r.n_prompt, on_token, &c, &m), 0);
    assert_int_equal(c.n, r.n_greedy);
    assert_memory_equal(c.ids, r.greedy, sizeof(int32_t) * r.n_greedy);
    assert_int_equal(m.reused_tokens, r.n_prompt - 1);
    assert_int_equal(m.gen_tokens, 24);
    assert_int_equal(m.stop_reason, LMS_STOP_MAX_TOKENS);

    /* perplexity over the fixed sequence, all positions' logits */
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
    printf("%s: ppl %.6g, transformers %.6g\n", family, ppl, r.ppl);
    assert_true(fabs(ppl - r.ppl) / r.ppl < 1e-3);
    free(lg);
    rig_close(&g);
    lms_test_rmrf(sd);
    free(sd);
}

static void llama_matches_transformers(void **s) { check_family_dir("llama", fixture("llama")); }
static void qwen2_matches_transformers(void **s) { check_family_dir("qwen2", fixture("qwen2")); }
static void qwen3_matches_transformers(void **s) { check_family_dir("qwen3", fixture("qwen3")); }
static void gemma3_matches_transformers(void **s) { check_family_dir("gemma3", fixture("gemma3")); }
static void gemma3_multimodal_text_matches_transformers(void **s) { check_family_dir("gemma3-mm", fixture("gemma3-mm")); }

/* gemma3-mm's config as gemma-3-4b's config.json is written: RoPE as
 * rope_theta + rope_local_base_freq + rope_scaling, layers by
 * sliding_window_pattern, and the text config's defaults (head_dim and
 * query_pre_attn_scalar aside) left out, eos at the top level only. */
static void gemma3_older_config_form_matches_transformers(void **s)
{
    char *d = lms_test_tmpdir("gemmaold");
    char path[1200];
    assert_int_equal(lms_test_sh(NULL, "cp '%s'/model.safetensors '%s'/generation_config.json '%s'/",
                                 fixture("gemma3-mm"), fixture("gemma3-mm"), d),
                     0);
    snprintf(path, sizeof path, "%s/config.json", fixture("gemma3-mm"));
    char *txt = lms_test_slurp(path, NULL);
    cJSON *root = cJSON_Parse(txt);
    free(txt);
    cJSON *tc = cJSON_GetObjectItem(root, "text_config");
    assert_non_null(tc);
    /* [S, S, F, S] is every third layer global */
    cJSON_DeleteItemFromObject(tc, "layer_types");
    cJSON_AddNumberToObject(tc, "sliding_window_pattern", 3);
    cJSON_DeleteItemFromObject(tc, "rope_parameters");
    cJSON_AddNumberToObject(tc, "rope_theta", 1000000.0);
    cJSON_AddNumberToObject(tc, "rope_local_base_freq", 10000.0);
    cJSON *rs = cJSON_AddObjectToObject(tc, "rope_scaling");
    cJSON_AddStringToObject(rs, "rope_type", "linear");
    cJSON_AddNumberToObject(rs, "factor", 8.0);
    const char *defaults[] = {"rms_norm_eps", "hidden_activation", "bos_token_id", "eos_token_id", "attention_bias",
                              "tie_word_embeddings", "_sliding_window_pattern", "use_bidirectional_attention"};
    for (size_t i = 0; i < sizeof defaults / sizeof *defaults; i++) cJSON_DeleteItemFromObject(tc, defaults[i]);
    char *out = cJSON_Print(root);
    snprintf(path, sizeof path, "%s/config.json", d);
    FILE *f = fopen(path, "w");
    fputs(out, f);
    fclose(f);
    free(out);
    cJSON_Delete(root);
    check_family_dir("gemma3-mm", d);
    lms_test_rmrf(d);
    free(d);
}

/* The same llama model with its RoPE settings written in the other form
 * than the fixture's: rope_parameters {rope_type, rope_theta, ...} <->
 * top-level rope_theta + rope_scaling {rope_type: "llama3", ...}. */
static void llama_other_rope_config_form_matches_transformers(void **s)
{
    char *d = lms_test_tmpdir("otherform");
    char path[1200];
    assert_int_equal(lms_test_sh(NULL, "cp '%s'/model.safetensors '%s'/", fixture("llama"), d), 0);
    snprintf(path, sizeof path, "%s/config.json", fixture("llama"));
    char *txt = lms_test_slurp(path, NULL);
    cJSON *root = cJSON_Parse(txt);
    free(txt);
    cJSON *rp = cJSON_DetachItemFromObject(root, "rope_parameters");
    if (rp) { /* new form -> old form */
        cJSON *theta = cJSON_DetachItemFromObject(rp, "rope_theta");
        assert_non_null(theta);
        cJSON_AddItemToObject(root, "rope_theta", theta);
        cJSON_AddItemToObject(root, "rope_scaling", rp);
    } else { /* old form -> new form */
        cJSON *rs = cJSON_DetachItemFromObject(root, "rope_scaling");
        cJSON *theta = cJSON_DetachItemFromObject(root, "rope_theta");
        assert_non_null(rs);
        assert_non_null(theta);
        cJSON_DeleteItemFromObject(rs, "type");
        if (!cJSON_GetObjectItem(rs, "rope_type"))
            cJSON_AddStringToObject(rs, "rope_type", "llama3");
        cJSON_AddItemToObject(rs, "rope_theta", theta);
        cJSON_AddItemToObject(root, "rope_parameters", rs);
    }
    char *out = cJSON_Print(root);
    snprintf(path, sizeof path, "%s/config.json", d);
    FILE *f = fopen(path, "w");
    fputs(out, f);
    fclose(f);
    free(out);
    cJSON_Delete(root);
    check_family_dir("llama", d);
    lms_test_rmrf(d);
    free(d);
}

/* ---- sessions across processes --------------------------------------------------------------------- */

/* Child: resume `session` of `model` in `store` and generate n more tokens greedily; prints the ids. */
static int child_resume(const char *store, const char *model, const char *session, int n, const char *kvdt)
{
    lms_store *st = NULL;
    lms_model *m = NULL;
    lms_engine *e = NULL;
    int status = 1;
    lms_engine_params ep = lms_engine_default_params();
    ep.threads = 2;
    ep.kv_dtype = !strcmp(kvdt, "f32") ? LMS_DTYPE_F32 : LMS_DTYPE_BF16;
    if (lms_store_open(store, LMS_STORE_RDONLY, NULL, &st) || lms_model_open(st, model, NULL, &m) ||
        lms_engine_create(m, &ep, &e)) {
        fprintf(stderr, "child: %s\n", lms_last_error());
        goto out;
    }
    int rc = lms_engine_session_load(e, st, session);
    if (rc) {
        printf("ERR %d %s\n", rc, lms_last_error());
        status = 3;
        goto out;
    }
    collect *c = calloc(1, sizeof *c);
    lms_gen_params gp = greedy((uint32_t)n);
    if (!lms_generate(e, &gp, NULL, 0, on_token, c, NULL)) {
        printf("IDS");
        for (int i = 0; i < c->n; i++) printf(" %d", c->ids[i]);
        printf("\n");
        status = 0;
    }
    free(c);
out:
    lms_engine_free(e);
    lms_model_close(m);
    lms_store_close(st);
    return status;
}

static int parse_ids(const char *out, int32_t *ids)
{
    const char *p = strstr(out, "IDS");
    int n = 0;
    if (!p)
        return -1;
    p += 3;
    char *end;
    for (;;) {
        long v = strtol(p, &end, 10);
        if (end == p)
            break;
        ids[n++] = (int32_t)v;
        p = end;
    }
    return n;
}

static int session_window_pages(void *ctx, const lms_kv_session_info *info)
{
    *(lms_kv_session_info *)ctx = *info;
    ((lms_kv_session_info *)ctx)->layout.sliding = NULL; /* valid during the callback only */
    return 0;
}

static void session_roundtrip(const char *family)
{
    ref r;
    rig g;
    load_ref(family, &r);
    char *sd = store_with("sess", family);
    const char *kinds[] = {"f32", "bf16"};
    for (int k = 0; k < 2; k++) {
        lms_dtype dt = k == 0 ? LMS_DTYPE_F32 : LMS_DTYPE_BF16;
        /* the uninterrupted run: 24 tokens */
        int32_t full[64];
        rig_open(&g, sd, family, dt, 0);
        collect c = {0};
        lms_gen_params gp = greedy(24);
        assert_int_equal(lms_generate(g.eng, &gp, r.prompt, r.n_prompt, on_token, &c, NULL), 0);
        assert_int_equal(c.n, 24);
        memcpy(full, c.ids, sizeof full);
        if (dt == LMS_DTYPE_F32) /* and that run is transformers' */
            assert_memory_equal(full, r.greedy, 24 * sizeof(int32_t));
        /* interrupted: 10 tokens, save */
        lms_engine_reset(g.eng);
        collect c2 = {0};
        gp = greedy(10);
        gp.no_prefix_reuse = true;
        assert_int_equal(lms_generate(g.eng, &gp, r.prompt, r.n_prompt, on_token, &c2, NULL), 0);
        assert_int_equal(c2.n, 10);
        assert_memory_equal(c2.ids, full, 10 * sizeof(int32_t));
        char sname[32];
        snprintf(sname, sizeof sname, "s-%s", kinds[k]);
        if (lms_engine_session_save(g.eng, g.st, sname))
            fail_msg("save: %s", lms_last_error());
        size_t n;
        lms_engine_tokens(g.eng, &n);
        assert_int_equal(n, r.n_prompt + 10);
        lms_kv_session_info info;
        assert_int_equal(lms_kv_session(g.st, sname, session_window_pages, NULL, &info), 0);
        if (g.eng->hp.window) { /* past the window: the sliding layers' pages of the last window only */
            assert_true(n > 2 * g.eng->hp.window);
            assert_int_equal(info.layout.window, g.eng->hp.window);
            assert_true(info.n_window_pages > 0 && info.n_window_pages <= g.eng->hp.window / 16 + 1);
        } else {
            assert_int_equal(info.n_window_pages, 0);
        }
        rig_close(&g);
        /* resume in a new process, 14 more */
        char *out = NULL;
        int st2 = lms_test_sh(&out, "/proc/%d/exe resume-child '%s' %s %s 14 %s", (int)getpid(), sd, family, sname,
                              kinds[k]);
        if (st2 != 0)
            fail_msg("child failed (%d): %s", st2, out ? out : "");
        int32_t got[64];
        int ng = parse_ids(out, got);
        free(out);
        assert_int_equal(ng, 14);
        assert_memory_equal(got, full + 10, 14 * sizeof(int32_t));
    }
    lms_test_rmrf(sd);
    free(sd);
}

static void session_resumed_in_new_process_continues_greedy_run(void **s) { session_roundtrip("qwen3"); }
static void gemma3_session_saved_past_the_window_resumes_in_new_process(void **s) { session_roundtrip("gemma3"); }

static void resume_with_other_model_fails_and_keeps_sequence(void **s)
{
    ref r;
    rig g;
    load_ref("qwen3", &r);
    char *sd = lms_test_tmpdir("other");
    char *md = lms_test_tmpdir("othermodel");
    /* same shapes (same KV layout) as the qwen3 fixture, other weights */
    assert_int_equal(lms_test_sh(NULL,
                                 "python3 '%s/tests/gen_model.py' '%s/m' --arch qwen3 --hidden 64 --intermediate 96 "
                                 "--layers 2 --heads 4 --kv-heads 2 --head-dim 24 --vocab 384 --seed 7 --single-file",
                                 lms_test_src(), md),
                     0);
    char mdir[1100];
    snprintf(mdir, sizeof mdir, "%s/m", md);
    lms_store *st;
    assert_int_equal(lms_store_open(sd, LMS_STORE_CREATE, NULL, &st), 0);
    import(st, fixture("qwen3"), "qwen3");
    import(st, mdir, "other");
    assert_int_equal(lms_store_close(st), 0);

    rig_open(&g, sd, "qwen3", LMS_DTYPE_F32, 0);
    assert_int_equal(lms_engine_eval(g.eng, r.prompt, r.n_prompt, NULL, 0), 0);
    assert_int_equal(lms_engine_session_save(g.eng, g.st, "q3"), 0);
    rig_close(&g);

    char *out = NULL;
    assert_int_equal(lms_test_sh(&out, "/proc/%d/exe resume-child '%s' other q3 1 f32", (int)getpid(), sd), 3);
    assert_non_null(strstr(out, "ERR"));
    printf("other model: %s", out);
    assert_non_null(strstr(out, "q3"));
    free(out);

    /* in-process: the failed load leaves the sequence as it was */
    rig_open(&g, sd, "other", LMS_DTYPE_F32, 0);
    int32_t t3[3] = {5, 6, 7};
    assert_int_equal(lms_engine_eval(g.eng, t3, 3, NULL, 0), 0);
    assert_int_equal(lms_engine_session_load(g.eng, g.st, "q3"), LMS_EMISMATCH);
    assert_int_equal(lms_engine_session_load(g.eng, g.st, "nope"), LMS_ENOENT);
    size_t n;
    const int32_t *tk = lms_engine_tokens(g.eng, &n);
    assert_int_equal(n, 3);
    assert_memory_equal(tk, t3, sizeof t3);
    rig_close(&g);
    lms_test_rmrf(sd);
    lms_test_rmrf(md);
    free(sd);
    free(md);
}

/* ---- prefix reuse ----------------------------------------------------------------------------------- */

static void prefix_reuse_is_reported_and_exact(void **s)
{
    ref r;
    rig g;
    load_ref("qwen2", &r);
    char *sd = store_with("prefix", "qwen2");
    rig_open(&g, sd, "qwen2", LMS_DTYPE_F32, 0);

    /* a long prompt: the ppl ids (48 tokens = 3 pages) */
    collect a = {0}, b = {0}, c = {0}, d = {0};
    lms_gen_params gp = greedy(8);
    lms_gen_metrics m;
    assert_int_equal(lms_generate(g.eng, &gp, r.ppl_ids, 40, on_token, &a, &m), 0);
    assert_int_equal(m.reused_tokens, 0);
    /* the next turn: prompt = old prompt + answer + more: all of the old part is reused */
    int32_t p2[64];
    memcpy(p2, r.ppl_ids, 40 * sizeof(int32_t));
    memcpy(p2 + 40, a.ids, 8 * sizeof(int32_t));
    p2[48] = 9;
    p2[49] = 10;
    assert_int_equal(lms_generate(g.eng, &gp, p2, 50, on_token, &b, &m), 0);
    assert_int_equal(m.reused_tokens, 48);
    assert_int_equal(m.prompt_tokens, 50);
    /* after a reset the prefix cache still has the full pages (16 tokens each) */
    lms_engine_reset(g.eng);
    assert_int_equal(lms_generate(g.eng, &gp, p2, 50, on_token, &c, &m), 0);
    assert_int_equal(m.reused_tokens, 48);
    assert_memory_equal(c.ids, b.ids, 8 * sizeof(int32_t));
    /* and a full recompute gives the same tokens */
    gp.no_prefix_reuse = true;
    assert_int_equal(lms_generate(g.eng, &gp, p2, 50, on_token, &d, &m), 0);
    assert_int_equal(m.reused_tokens, 0);
    assert_memory_equal(d.ids, b.ids, 8 * sizeof(int32_t));
    rig_close(&g);
    lms_test_rmrf(sd);
    free(sd);
}

/* ---- Gemma 3's sliding window ------------------------------------------------------------------ */

typedef struct window_watch {
    collect c;
    lms_engine *e;
    uint32_t max_window_used, max_used;
} window_watch;

static int watch_window(void *user, int32_t id, const char *piece, size_t len)
{
    window_watch *w = user;
    lms_kv_stats st;
    lms_kv_get_stats(w->e->kv, &st);
    w->max_window_used = LMS_MAX(w->max_window_used, st.window_used_pages);
    w->max_used = LMS_MAX(w->max_used, st.used_pages);
    return on_token(&w->c, id, piece, len);
}

static void gemma3_window_pages_stay_bounded_over_a_generation_8x_the_window(void **s)
{
    ref r;
    load_ref("gemma3", &r);
    char *sd = store_with("gwin", "gemma3");
    int32_t ids[2][256];
    for (int k = 0; k < 2; k++) {
        /* 4 tokens a page: the window (16) is 4 pages; 16 tokens a page: 1 */
        uint32_t P = k ? 16 : 4;
        rig g;
        memset(&g, 0, sizeof g);
        assert_int_equal(lms_store_open(sd, 0, NULL, &g.st), 0);
        assert_int_equal(lms_model_open(g.st, "gemma3", NULL, &g.model), 0);
        lms_engine_params ep = lms_engine_default_params();
        ep.threads = 2;
        ep.kv_dtype = LMS_DTYPE_F32;
        ep.kv_page_tokens = P;
        ep.prefill_block = 5;
        assert_int_equal(lms_engine_create(g.model, &ep, &g.eng), 0);
        window_watch *w = calloc(1, sizeof *w);
        w->e = g.eng;
        lms_gen_params gp = greedy(8 * 16);
        assert_int_equal(lms_generate(g.eng, &gp, r.prompt, r.n_prompt, watch_window, w, NULL), 0);
        assert_int_equal(w->c.n, 128);
        assert_memory_equal(w->c.ids, r.greedy, sizeof(int32_t) * r.n_greedy); /* transformers' first 24 */
        memcpy(ids[k], w->c.ids, 128 * sizeof(int32_t));
        lms_kv_stats kst;
        lms_kv_get_stats(g.eng->kv, &kst);
        printf("gemma3, %u tokens a page: %u + 128 tokens hold %u pages of the global layer, at most %u of the "
               "sliding layers (window 16; the window group has %u pages)\n",
               P, r.n_prompt, w->max_used, w->max_window_used, kst.window_pages);
        /* the sliding layers: the window's pages and the one being filled; the global layer: every position */
        assert_true(w->max_window_used <= 16 / P + 1);
        assert_true(w->max_used >= (uint32_t)(r.n_prompt + 127) / P);
        free(w);
        rig_close(&g);
    }
    /* where the window's pages slide out differs with the page size; the tokens do not */
    assert_memory_equal(ids[0], ids[1], 128 * sizeof(int32_t));
    lms_test_rmrf(sd);
    free(sd);
}

static void gemma3_prefix_reuse_and_regeneration_past_the_window(void **s)
{
    ref r;
    rig g;
    load_ref("gemma3", &r);
    char *sd = store_with("greuse", "gemma3");
    rig_open(&g, sd, "gemma3", LMS_DTYPE_F32, 0);
    collect a = {0}, b = {0}, c = {0};
    lms_gen_params gp = greedy(30);
    lms_gen_metrics m;
    assert_int_equal(lms_generate(g.eng, &gp, r.prompt, r.n_prompt, on_token, &a, &m), 0);
    /* regenerate from the prompt's end (39 tokens kept), long past the window
     * now: its window pages slid out, and are attached again from the cache */
    assert_int_equal(lms_generate(g.eng, &gp, r.prompt, r.n_prompt, on_token, &b, &m), 0);
    assert_int_equal(m.reused_tokens, r.n_prompt - 1);
    assert_memory_equal(b.ids, a.ids, 30 * sizeof(int32_t));
    /* after a reset the prefix cache gives whole pages (16 tokens) with their window */
    lms_engine_reset(g.eng);
    assert_int_equal(lms_generate(g.eng, &gp, r.prompt, r.n_prompt, on_token, &c, &m), 0);
    assert_int_equal(m.reused_tokens, 32);
    assert_memory_equal(c.ids, a.ids, 30 * sizeof(int32_t));
    assert_memory_equal(a.ids, r.greedy, sizeof(int32_t) * r.n_greedy);
    rig_close(&g);
    lms_test_rmrf(sd);
    free(sd);
}

/* ---- memory -------------------------------------------------------------------------------------------- */

static void rss_flat_during_1000_token_generation(void **s)
{
    rig g;
    char *sd = store_with("rss", "llama");
    rig_open(&g, sd, "llama", LMS_DTYPE_F16, 1100);
    collect *c = calloc(1, sizeof *c);
    lms_gen_params gp = greedy(1000);
    int32_t p[3] = {1, 2, 3};
    lms_gen_metrics m;
    assert_int_equal(lms_generate(g.eng, &gp, p, 3, on_token, c, &m), 0);
    assert_int_equal(c->n, 1000);
    long grow = rss_kb() - c->rss_first;
    printf("RSS after the first token %ld KB, after 1000 tokens %+ld KB\n", c->rss_first, grow);
    assert_true(grow <= 1024);
    free(c);
    rig_close(&g);
    lms_test_rmrf(sd);
    free(sd);
}

/* The KV budget is reserved at creation, but on the CPU only the pages
 * written hold memory: a 256 MiB budget costs about the pages of the tokens
 * run, and the metrics say how much of it was written. */
static void kv_budget_holds_memory_only_for_pages_written(void **s)
{
    char *sd = store_with("kvlazy", "llama");
    lms_store *st;
    lms_model *m;
    lms_engine *e;
    assert_int_equal(lms_store_open(sd, 0, NULL, &st), 0);
    assert_int_equal(lms_model_open(st, "llama", NULL, &m), 0);
    lms_engine_params ep = lms_engine_default_params();
    ep.threads = 2;
    ep.n_ctx = 256;
    ep.kv_bytes = 256u << 20;
    long r0 = rss_kb();
    assert_int_equal(lms_engine_create(m, &ep, &e), 0);
    long r1 = rss_kb();
    collect *c = calloc(1, sizeof *c);
    lms_gen_params gp = greedy(16);
    int32_t p[40];
    for (int i = 0; i < 40; i++) p[i] = (int32_t)((i * 37 + 11) % 384);
    lms_gen_metrics mt;
    assert_int_equal(lms_generate(e, &gp, p, 40, on_token, c, &mt), 0);
    long r2 = rss_kb();
    printf("KV reserved %llu bytes, written %llu; RSS +%ld KB at creation, +%ld KB after 56 tokens\n",
           (unsigned long long)mt.kv_bytes, (unsigned long long)mt.kv_touched_bytes, r1 - r0, r2 - r1);
    assert_true(mt.kv_bytes >= (256u << 20) - (1u << 20) && mt.kv_bytes <= (256u << 20));
    assert_true(mt.kv_touched_bytes > 0 && mt.kv_touched_bytes < (1u << 20)); /* 4 pages of 16 tokens */
    assert_true(r2 - r0 < 32 * 1024);
    free(c);
    lms_engine_free(e);
    lms_model_close(m);
    assert_int_equal(lms_store_close(st), 0);
    lms_test_rmrf(sd);
    free(sd);
}

static long anon_kb(void)
{
    char line[256];
    long v = -1;
    FILE *f = fopen("/proc/self/status", "r");
    while (f && fgets(line, sizeof line, f))
        if (!strncmp(line, "RssAnon:", 8))
            v = strtol(line + 8, NULL, 10);
    if (f)
        fclose(f);
    return v;
}

/* Child: open model, create engine, run a prompt, print the anonymous RSS growth in KB. */
static int child_anon(const char *store, const char *model)
{
    lms_store *st;
    lms_model *m;
    lms_engine *e;
    lms_engine_params ep = lms_engine_default_params();
    ep.threads = 2;
    ep.n_ctx = 64;
    ep.prefill_block = 4; /* engine scratch is block x n_ff: keep it small next to the weights */
    long a0 = anon_kb();
    if (lms_store_open(store, LMS_STORE_RDONLY, NULL, &st) || lms_model_open(st, model, NULL, &m) ||
        lms_engine_create(m, &ep, &e))
        return 1;
    int32_t p[8] = {1, 2, 3, 4, 5, 6, 7, 8};
    float *lg = malloc(sizeof(float) * 512);
    if (lms_engine_eval(e, p, 8, lg, 0))
        return 1;
    printf("ANON %ld\n", anon_kb() - a0);
    free(lg);
    lms_engine_free(e);
    lms_model_close(m);
    lms_store_close(st);
    return 0;
}

static void anonymous_memory_does_not_grow_with_model_size(void **s)
{
    char *sd = lms_test_tmpdir("anon");
    char *md = lms_test_tmpdir("anonmodels");
    /* same attention shape (same KV), weights 1x and ~16x: n_ff 64 vs 4096 */
    const char *fmt = "python3 '%s/tests/gen_model.py' '%s/%s' --arch llama --hidden 128 --intermediate %d "
                      "--layers 2 --heads 4 --kv-heads 2 --vocab 512 --single-file";
    assert_int_equal(lms_test_sh(NULL, fmt, lms_test_src(), md, "small", 64), 0);
    assert_int_equal(lms_test_sh(NULL, fmt, lms_test_src(), md, "big", 8192), 0);
    lms_store *st;
    char p[1100];
    assert_int_equal(lms_store_open(sd, LMS_STORE_CREATE, NULL, &st), 0);
    snprintf(p, sizeof p, "%s/small", md);
    import(st, p, "small");
    snprintf(p, sizeof p, "%s/big", md);
    import(st, p, "big");
    assert_int_equal(lms_store_close(st), 0);
    long kb[2];
    const char *names[2] = {"small", "big"};
    for (int i = 0; i < 2; i++) {
        char *out = NULL;
        assert_int_equal(lms_test_sh(&out, "/proc/%d/exe anon-child '%s' %s", (int)getpid(), sd, names[i]), 0);
        char *a = strstr(out, "ANON ");
        assert_non_null(a);
        kb[i] = strtol(a + 5, NULL, 10);
        free(out);
    }
    /* the big model's weights are 2 x 3 x 128 x (8192 - 64) x 2 bytes = 12 MiB more; the
     * engine's own scratch grows by 2 x block x n_ff f32 = 254 KB */
    printf("anonymous RSS growth: small model %ld KB, big model %ld KB\n", kb[0], kb[1]);
    assert_true(kb[1] - kb[0] < 1024 + 2 * 4 * (8192 - 64) * 4 / 1024);
    lms_test_rmrf(sd);
    lms_test_rmrf(md);
    free(sd);
    free(md);
}


/* ---- text: streaming pieces and stop strings ------------------------------------------------------- */

typedef struct textcol {
    char text[8192];
    size_t len;
    int32_t ids[256];
    int n;
} textcol;

static int on_text(void *user, int32_t id, const char *piece, size_t len)
{
    textcol *t = user;
    if (id >= 0)
        t->ids[t->n++] = id;
    assert_true(t->len + len < sizeof t->text);
    if (len) {
        assert_non_null(piece);
        memcpy(t->text + t->len, piece, len);
    }
    t->len += len;
    t->text[t->len] = 0;
    return 0;
}

static void streamed_text_equals_decode_and_stop_strings_cut_it(void **s)
{
    char *sd = lms_test_tmpdir("text");
    char *md = lms_test_tmpdir("textmodel");
    /* a small random qwen3 model whose ids (< 4096) are ordinary tokens of the real Qwen3 tokenizer */
    assert_int_equal(lms_test_sh(NULL,
                                 "python3 '%s/tests/gen_model.py' '%s/m' --arch qwen3 --hidden 64 --intermediate 128 "
                                 "--layers 2 --heads 4 --kv-heads 2 --vocab 4096 --std 0.5 --seed 3 --single-file "
                                 "--tokenizer '%s/tests/fixtures/tokenizers/qwen3'",
                                 lms_test_src(), md, lms_test_src()),
                     0);
    char mdir[1100];
    snprintf(mdir, sizeof mdir, "%s/m", md);
    lms_store *st;
    assert_int_equal(lms_store_open(sd, LMS_STORE_CREATE, NULL, &st), 0);
    import(st, mdir, "t");
    assert_int_equal(lms_store_close(st), 0);
    rig g;
    rig_open(&g, sd, "t", LMS_DTYPE_F32, 0);
    lms_tokenizer *tok = lms_engine_tokenizer(g.eng);
    assert_non_null(tok);
    int32_t p[4] = {785, 3974, 13, 1207}; /* ids below the model's 4096 */
    size_t np = 4;

    /* 1. the streamed pieces (and the final id -1 flush) are exactly the decode of the ids */
    textcol *a = calloc(1, sizeof *a), *b = calloc(1, sizeof *b);
    lms_gen_params gp = greedy(40);
    lms_gen_metrics m;
    assert_int_equal(lms_generate(g.eng, &gp, p, np, on_text, a, &m), 0);
    assert_int_equal(a->n, 40);
    char *dec = NULL;
    size_t dl = 0;
    assert_int_equal(lms_tokenizer_decode(tok, a->ids, a->n, true, &dec, &dl), 0);
    printf("generated: \"%s\"\n", a->text);
    assert_true(lms__utf8_valid(dec, dl)); /* this seed's output is valid UTF-8: then the stream must equal it */
    assert_int_equal(a->len, dl);
    assert_memory_equal(a->text, dec, dl);

    /* 2. a stop string from the middle of that text: the output ends just before its first occurrence */
    char stop[16];
    size_t mid = dl / 2;
    while (mid < dl && ((unsigned char)dec[mid] & 0xC0) == 0x80) mid++;
    size_t sl = 0;
    while (sl < 4 && mid + sl < dl) {
        sl++;
        while (mid + sl < dl && ((unsigned char)dec[mid + sl] & 0xC0) == 0x80) sl++;
    }
    memcpy(stop, dec + mid, sl);
    stop[sl] = 0;
    const char *first = strstr(dec, stop);
    assert_non_null(first);
    const char *stops[1] = {stop};
    gp.stop = stops;
    gp.n_stop = 1;
    lms_engine_reset(g.eng);
    assert_int_equal(lms_generate(g.eng, &gp, p, np, on_text, b, &m), 0);
    printf("stop \"%s\": \"%s\"\n", stop, b->text);
    assert_int_equal(m.stop_reason, LMS_STOP_STRING);
    assert_int_equal(b->len, (size_t)(first - dec));
    assert_memory_equal(b->text, dec, b->len);
    assert_true(b->n < a->n);
    assert_memory_equal(b->ids, a->ids, b->n * sizeof(int32_t));

    lms_tokenizer_buf_free(dec);
    free(a);
    free(b);
    rig_close(&g);
    lms_test_rmrf(sd);
    lms_test_rmrf(md);
    free(sd);
    free(md);
}

/* ---- load-time errors ------------------------------------------------------------------------------------ */

static void unsupported_settings_fail_at_load_naming_them(void **s)
{
    lms__hparams hp;
    const char *base = "{\"architectures\":[\"%s\"],\"vocab_size\":10,\"hidden_size\":8,\"num_hidden_layers\":1,"
                       "\"num_attention_heads\":2,\"intermediate_size\":16%s}";
    char cfg[1024];
    snprintf(cfg, sizeof cfg, base, "GemmaForCausalLM", "");
    assert_int_equal(lms__config_parse(cfg, NULL, "m", &hp), LMS_EUNSUPPORTED);
    assert_non_null(strstr(lms_last_error(), "GemmaForCausalLM"));
    snprintf(cfg, sizeof cfg, base, "LlamaForCausalLM", ",\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":4}");
    assert_int_equal(lms__config_parse(cfg, NULL, "m", &hp), LMS_EUNSUPPORTED);
    assert_non_null(strstr(lms_last_error(), "yarn"));
    snprintf(cfg, sizeof cfg, base, "Qwen3ForCausalLM", ",\"rope_parameters\":{\"rope_type\":\"dynamic\"}");
    assert_int_equal(lms__config_parse(cfg, NULL, "m", &hp), LMS_EUNSUPPORTED);
    assert_non_null(strstr(lms_last_error(), "dynamic"));
    snprintf(cfg, sizeof cfg, base, "Qwen2ForCausalLM", ",\"use_sliding_window\":true");
    assert_int_equal(lms__config_parse(cfg, NULL, "m", &hp), LMS_EUNSUPPORTED);
    assert_non_null(strstr(lms_last_error(), "sliding"));
    snprintf(cfg, sizeof cfg, base, "LlamaForCausalLM", ",\"hidden_act\":\"gelu\"");
    assert_int_equal(lms__config_parse(cfg, NULL, "m", &hp), LMS_EUNSUPPORTED);
    assert_non_null(strstr(lms_last_error(), "gelu"));
    snprintf(cfg, sizeof cfg, base, "LlamaForCausalLM", ",\"num_key_value_heads\":3");
    assert_int_equal(lms__config_parse(cfg, NULL, "m", &hp), LMS_EFORMAT);
    assert_int_equal(lms__config_parse("[1,2]", NULL, "m", &hp), LMS_EFORMAT);
    /* head_dim from the config wins over hidden / heads; eos lists from both files */
    snprintf(cfg, sizeof cfg, base, "Qwen3ForCausalLM", ",\"head_dim\":24,\"eos_token_id\":[3,4]");
    assert_int_equal(lms__config_parse(cfg, "{\"eos_token_id\":5}", "m", &hp), 0);
    assert_int_equal(hp.head_dim, 24);
    assert_int_equal(hp.n_eos, 3);
    assert_int_equal(hp.eos_ids[2], 5);
    assert_true(hp.qk_norm);
    /* Gemma 3: what it does not run, named */
    /* Gemma 3: what it does not run, named */
    const char *gbase = "{\"architectures\":[\"Gemma3ForCausalLM\"],\"vocab_size\":10,\"hidden_size\":8,"
                        "\"num_attention_heads\":2,\"num_key_value_heads\":1,\"intermediate_size\":16,\"head_dim\":4,"
                        "\"sliding_window_pattern\":2%s}";
    struct {
        const char *extra, *named;
        int rc;
    } bad[] = {
        {",\"num_hidden_layers\":2,\"use_bidirectional_attention\":true", "use_bidirectional_attention", LMS_EUNSUPPORTED},
        {",\"num_hidden_layers\":2,\"layer_types\":[\"sliding_attention\",\"chunked_attention\"]", "chunked_attention",
         LMS_EUNSUPPORTED},
        {",\"num_hidden_layers\":1", "every layer is a sliding-window layer", LMS_EUNSUPPORTED}, /* pattern 6: layer 0 local */
        {",\"num_hidden_layers\":2,\"rope_parameters\":{\"sliding_attention\":{\"rope_type\":\"linear\",\"factor\":2}}",
         "sliding_attention rope type 'linear'", LMS_EUNSUPPORTED},
        {",\"num_hidden_layers\":2,\"rope_scaling\":{\"rope_type\":\"yarn\",\"factor\":2}", "yarn", LMS_EUNSUPPORTED},
        {",\"num_hidden_layers\":2,\"hidden_activation\":\"gelu\"", "gelu", LMS_EUNSUPPORTED},
        {",\"num_hidden_layers\":2,\"layer_types\":[\"full_attention\"]", "layer_types", LMS_EFORMAT},
    };
    for (size_t i = 0; i < sizeof bad / sizeof *bad; i++) {
        snprintf(cfg, sizeof cfg, gbase, bad[i].extra);
        int rc = lms__config_parse(cfg, NULL, "m", &hp);
        if (rc != bad[i].rc)
            fail_msg("%s: %d (%s), not %d", cfg, rc, lms_last_error(), bad[i].rc);
        if (!strstr(lms_last_error(), bad[i].named))
            fail_msg("%s: '%s' does not name '%s'", cfg, lms_last_error(), bad[i].named);
    }
    /* the multimodal form needs its text_config; with one, the defaults fill the rest */
    assert_int_equal(lms__config_parse("{\"architectures\":[\"Gemma3ForConditionalGeneration\"]}", NULL, "m", &hp),
                     LMS_EFORMAT);
    assert_non_null(strstr(lms_last_error(), "text_config"));
    assert_int_equal(lms__config_parse("{\"architectures\":[\"Gemma3ForConditionalGeneration\"],\"eos_token_id\":[1,106],"
                                       "\"text_config\":{\"hidden_size\":2560,\"intermediate_size\":10240,"
                                       "\"num_hidden_layers\":34,\"rope_scaling\":{\"factor\":8.0,\"rope_type\":\"linear\"},"
                                       "\"sliding_window\":1024}}",
                                       NULL, "gemma-3-4b", &hp),
                     0);
    assert_string_equal(hp.family->name, "gemma3");
    assert_int_equal(hp.n_vocab, 262208);
    assert_int_equal(hp.n_heads, 8);
    assert_int_equal(hp.n_kv_heads, 4);
    assert_int_equal(hp.head_dim, 256);
    assert_int_equal(hp.window, 1024);
    assert_int_equal(hp.n_eos, 2);
    assert_int_equal(hp.bos_id, 2);
    assert_true(hp.tie_embeddings);
    assert_int_equal(hp.rope_kind, LMS__ROPE_LINEAR);
    assert_true(hp.rope_factor == 8.0 && hp.rope_theta == 1e6 && hp.rope_local_theta == 1e4);
    for (uint32_t l = 0; l < 34; l++) assert_int_equal(hp.sliding[l], (l + 1) % 6 != 0);
    assert_true(fabsf(hp.attn_scale - 1.0f / 16) < 1e-7f && fabsf(hp.embed_scale - sqrtf(2560)) < 1e-3f);
    assert_int_equal(hp.act, LMS__ACT_GELU_TANH);
}

static void missing_or_misshapen_tensor_is_named(void **s)
{
    char *d = lms_test_tmpdir("bad");
    char *sd = lms_test_tmpdir("badstore");
    /* the qwen3 weights under a config that says 3 layers: layer 2 is missing */
    assert_int_equal(lms_test_sh(NULL, "cp '%s'/model.safetensors '%s'/ && sed 's/\"num_hidden_layers\": 2/"
                                       "\"num_hidden_layers\": 3/' '%s'/config.json > '%s'/config.json",
                                 fixture("qwen3"), d, fixture("qwen3"), d),
                     0);
    lms_store *st;
    lms_model *m;
    lms_engine *e;
    assert_int_equal(lms_store_open(sd, LMS_STORE_CREATE, NULL, &st), 0);
    import(st, d, "three");
    assert_int_equal(lms_model_open(st, "three", NULL, &m), 0);
    assert_int_equal(lms_engine_create(m, NULL, &e), LMS_ENOENT);
    assert_null(e);
    assert_non_null(strstr(lms_last_error(), "model.layers.2."));
    lms_model_close(m);
    /* qwen2 weights (head_dim 16) under a qwen3 config (head_dim 24): q_proj has the wrong shape */
    lms_test_sh(NULL, "cp '%s'/config.json '%s'/config.json && cp '%s'/model.safetensors '%s'/", fixture("qwen3"), d,
                fixture("qwen2"), d);
    import(st, d, "mixed");
    assert_int_equal(lms_model_open(st, "mixed", NULL, &m), 0);
    assert_int_equal(lms_engine_create(m, NULL, &e), LMS_EFORMAT);
    printf("mixed: %s\n", lms_last_error());
    assert_non_null(strstr(lms_last_error(), "model.layers.0.self_attn.q_proj.weight"));
    lms_model_close(m);
    assert_int_equal(lms_store_close(st), 0);
    lms_test_rmrf(d);
    lms_test_rmrf(sd);
    free(d);
    free(sd);
}

int main(int argc, char **argv)
{
    /* f32 activations for BF16 weights (the exact products): these checks hold
     * the whole path to transformers' 1e-3; test_forward.c checks the
     * bf16-activation kernels against the same references */
    setenv("LMSTORE_BF16_ACT", "0", 1);
    if (argc == 6 && !strcmp(argv[1], "resume-child"))
        return child_resume(argv[2], argv[3], argv[4], atoi(argv[5]), "f32");
    if (argc == 7 && !strcmp(argv[1], "resume-child"))
        return child_resume(argv[2], argv[3], argv[4], atoi(argv[5]), argv[6]);
    if (argc == 4 && !strcmp(argv[1], "anon-child"))
        return child_anon(argv[2], argv[3]);
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(llama_matches_transformers),
        cmocka_unit_test(qwen2_matches_transformers),
        cmocka_unit_test(qwen3_matches_transformers),
        cmocka_unit_test(gemma3_matches_transformers),
        cmocka_unit_test(gemma3_multimodal_text_matches_transformers),
        cmocka_unit_test(gemma3_older_config_form_matches_transformers),
        cmocka_unit_test(llama_other_rope_config_form_matches_transformers),
        cmocka_unit_test(session_resumed_in_new_process_continues_greedy_run),
        cmocka_unit_test(gemma3_session_saved_past_the_window_resumes_in_new_process),
        cmocka_unit_test(gemma3_window_pages_stay_bounded_over_a_generation_8x_the_window),
        cmocka_unit_test(gemma3_prefix_reuse_and_regeneration_past_the_window),
        cmocka_unit_test(resume_with_other_model_fails_and_keeps_sequence),
        cmocka_unit_test(prefix_reuse_is_reported_and_exact),
        cmocka_unit_test(rss_flat_during_1000_token_generation),
        cmocka_unit_test(kv_budget_holds_memory_only_for_pages_written),
        cmocka_unit_test(anonymous_memory_does_not_grow_with_model_size),
        cmocka_unit_test(streamed_text_equals_decode_and_stop_strings_cut_it),
        cmocka_unit_test(unsupported_settings_fail_at_load_naming_them),
        cmocka_unit_test(missing_or_misshapen_tensor_is_named),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
