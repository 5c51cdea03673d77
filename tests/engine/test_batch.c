/*
 * tests/engine/test_batch.c - the batched engine (lmstore/batch.h) on the
 * tiny fixture models (tests/fixtures/engine/), F32 K/V:
 *  - 16 concurrent greedy requests of different prompts and lengths,
 *    admitted staggered, each return exactly the ids lms_generate returns for
 *    that prompt alone (llama, qwen2, qwen3, gemma3 with its sliding-window
 *    layers); seeded sampling likewise;
 *  - an arena too small for all requests preempts some and still finishes
 *    every one with the ids it returns alone;
 *  - a long prompt prefix is saved into the store, and a batch in a NEW
 *    PROCESS resumes it (cached tokens reported) with the ids of a cold run;
 *    the disk budget removes the least recently used prefixes;
 *  - cancel frees a request's pages; admission errors name their cause.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "lmstore/batch.h"
#include "lmstore/engine.h"
#include "lmstore/kvcache.h"
#include "lmstore/loader.h"
#include "lmstore/store.h"
#include "testutil.h"
#include "engine/fixture_store.h"

#define NP 16
#define MAXG 64
#if defined(__SANITIZE_ADDRESS__)
#define GEN 8 /* the sanitized build is ~20x slower: fewer tokens, same checks */
#else
#define GEN 32
#endif

typedef struct prompts {
    int32_t ids[NP][256];
    int n[NP];
} prompts;

/* Prompts of lengths 3, 8, 13 ... from a fixed generator; the second half
 * share their first 32 tokens (prefix pages shared in the arena). */
static void make_prompts(prompts *p, uint32_t vocab, int count, int shared_from)
{
    uint64_t x = 12345;
    for (int i = 0; i < count; i++) {
        p->n[i] = 3 + 5 * i;
        for (int k = 0; k < p->n[i]; k++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            p->ids[i][k] = (int32_t)((x >> 33) % vocab);
        }
    }
    for (int i = shared_from; i < count - 1; i++)
        if (p->n[i] > 40)
            memcpy(p->ids[i], p->ids[count - 1], 32 * sizeof(int32_t));
}

typedef struct outs {
    int32_t ids[NP][MAXG];
    int n[NP];
    uint32_t cached[NP];
    int stop[NP];
} outs;

static int collect_cb(void *user, int32_t id, const char *piece, size_t len)
{
    (void)piece;
    (void)len;
    int32_t *o = user;
    if (id >= 0 && o[0] < MAXG)
        o[1 + o[0]++] = id;
    return 0;
}

static lms_engine_params eparams(void)
{
    lms_engine_params ep = lms_engine_default_params();
    ep.threads = 2;
    ep.kv_dtype = LMS_DTYPE_F32;
    ep.n_ctx = 256;
    return ep;
}

/* Each prompt alone through lms_generate (no prefix reuse: a cold run). */
static void reference(lms_model *m, const prompts *p, int count, const lms_gen_params *gp, outs *r)
{
    lms_engine_params ep = eparams();
    lms_engine *e = NULL;
    if (lms_engine_create(m, &ep, &e))
        fail_msg("engine: %s", lms_last_error());
    for (int i = 0; i < count; i++) {
        int32_t buf[1 + MAXG] = {0};
        lms_gen_params g = *gp;
        g.no_prefix_reuse = true;
        g.seed = gp->seed + (uint64_t)i;
        lms_engine_reset(e);
        assert_int_equal(lms_generate(e, &g, p->ids[i], (size_t)p->n[i], collect_cb, buf, NULL), 0);
        r->n[i] = buf[0];
        memcpy(r->ids[i], buf + 1, (size_t)buf[0] * sizeof(int32_t));
    }
    lms_engine_free(e);
}

/* Run every prompt through the batch: `first` admitted at once, then one more
 * after each step (requests the batch refuses for now wait in order). */
static void run_batch(lms_batch *b, const prompts *p, int count, const lms_gen_params *gp, int first, outs *o)
{
    uint64_t ids[NP];
    int next = 0, done = 0, steps = 0;
    lms_batch_event ev[64];
    memset(o, 0, sizeof *o);
    while (done < count) {
        int admit = steps == 0 ? first : 1;
        for (int k = 0; k < admit && next < count; k++) {
            lms_gen_params g = *gp;
            g.seed = gp->seed + (uint64_t)next;
            int rc = lms_batch_add(b, p->ids[next], (size_t)p->n[next], &g, &ids[next]);
            if (rc == LMS_ENOSPACE)
                break;
            if (rc)
                fail_msg("add %d: %s", next, lms_last_error());
            next++;
        }
        size_t n = 0;
        if (lms_batch_step(b, ev, 64, &n))
            fail_msg("step: %s", lms_last_error());
        steps++;
        assert_true(steps < 10000);
        for (size_t k = 0; k < n; k++) {
            int i = 0;
            while (i < next && ids[i] != ev[k].id) i++;
            assert_true(i < next);
            assert_int_equal(ev[k].prompt_tokens, p->n[i]);
            o->cached[i] = ev[k].cached_tokens;
            if (ev[k].token >= 0 && ev[k].stop_reason != LMS_STOP_EOS) {
                assert_true(o->n[i] < MAXG);
                assert_true(ev[k].logprob <= 0.0f);
                o->ids[i][o->n[i]++] = ev[k].token;
            }
            if (ev[k].stop_reason != LMS_STOP_NONE) {
                o->stop[i] = ev[k].stop_reason;
                done++;
            }
        }
    }
    size_t n = 0;
    assert_int_equal(lms_batch_step(b, ev, 64, &n), 0); /* nothing left: no event */
    assert_int_equal(n, 0);
}

static void assert_same(const outs *a, const outs *r, int count, const char *what)
{
    for (int i = 0; i < count; i++) {
        if (a->n[i] != r->n[i] || memcmp(a->ids[i], r->ids[i], (size_t)r->n[i] * sizeof(int32_t))) {
            int k = 0;
            while (k < a->n[i] && k < r->n[i] && a->ids[i][k] == r->ids[i][k]) k++;
            fail_msg("%s: request %d (prompt %d tokens): %d ids, alone %d; first difference at %d", what, i, i * 5 + 3,
                     a->n[i], r->n[i], k);
        }
    }
}

typedef struct rig {
    char *sd;
    lms_store *st;
    lms_model *m;
    uint32_t vocab;
} rig;

static void rig_open(rig *g, const char *family)
{
    memset(g, 0, sizeof *g);
    g->sd = lms_test_fixture_store(family, family);
    assert_int_equal(lms_store_open(g->sd, 0, NULL, &g->st), 0);
    assert_int_equal(lms_model_open(g->st, family, NULL, &g->m), 0);
    lms_engine_params ep = eparams();
    lms_engine *e;
    assert_int_equal(lms_engine_create(g->m, &ep, &e), 0);
    lms_engine_info info;
    lms_engine_get_info(e, &info);
    g->vocab = info.n_vocab;
    lms_engine_free(e);
}

static void rig_close(rig *g)
{
    lms_model_close(g->m);
    assert_int_equal(lms_store_close(g->st), 0);
    lms_test_rmrf(g->sd);
    free(g->sd);
}

/* ---- exactness -------------------------------------------------------------------------------------- */

static void exact_family(const char *family)
{
    rig g;
    rig_open(&g, family);
    prompts *p = calloc(1, sizeof *p);
    outs *r = calloc(1, sizeof *r), *o = calloc(1, sizeof *o);
    make_prompts(p, g.vocab, NP, NP / 2);
    lms_gen_params gp = lms_gen_default_params();
    gp.max_tokens = GEN;
    gp.ignore_eos = true;
    reference(g.m, p, NP, &gp, r);

    lms_batch_params bp = lms_batch_default_params();
    bp.max_seqs = 16;
    bp.step_tokens = 48; /* prompts need several steps, beside other requests' decode rows */
    lms_engine_params ep = eparams();
    lms_batch *b = NULL;
    if (lms_batch_create(g.m, &ep, &bp, &b))
        fail_msg("batch: %s", lms_last_error());
    run_batch(b, p, NP, &gp, 4, o);
    assert_same(o, r, NP, family);
    for (int i = 0; i < NP; i++) assert_int_equal(o->stop[i], LMS_STOP_MAX_TOKENS);
    lms_batch_stats bs;
    lms_batch_get_stats(b, &bs);
    assert_int_equal(bs.running, 0);
    assert_int_equal(bs.kv_pages_used, 0);
    assert_true(bs.prefix_hits_ram > 0); /* the shared 32 tokens */
    printf("%s: 16 requests in %llu steps, %llu prefix hits\n", family, (unsigned long long)bs.steps,
           (unsigned long long)bs.prefix_hits_ram);

    /* seeded sampling: the same draws as alone */
    if (strcmp(family, "qwen3"))
        goto done;
    gp.temperature = 0.9f;
    gp.top_p = 0.95f;
    gp.seed = 77;
    reference(g.m, p, NP, &gp, r);
    run_batch(b, p, NP, &gp, 16, o);
    assert_same(o, r, NP, "seeded");
done:
    lms_batch_free(b);
    free(p);
    free(r);
    free(o);
    rig_close(&g);
}

static void batched_greedy_llama_equals_each_request_alone(void **s) { exact_family("llama"); }
static void batched_greedy_qwen2_equals_each_request_alone(void **s) { exact_family("qwen2"); }
static void batched_greedy_qwen3_equals_each_request_alone(void **s) { exact_family("qwen3"); }
static void batched_greedy_gemma3_equals_each_request_alone(void **s) { exact_family("gemma3"); }

/* ---- preemption -------------------------------------------------------------------------------------- */

static void small_arena_preempts_and_still_finishes_every_request_exactly(void **s)
{
    rig g;
    rig_open(&g, "qwen3");
    prompts *p = calloc(1, sizeof *p);
    outs *r = calloc(1, sizeof *r), *o = calloc(1, sizeof *o);
    make_prompts(p, g.vocab, 8, 8);
    lms_gen_params gp = lms_gen_default_params();
    gp.max_tokens = 60;
    gp.ignore_eos = true;
    reference(g.m, p, 8, &gp, r);

    lms_engine_params ep = eparams();
    lms_engine *e;
    lms_engine_info info;
    assert_int_equal(lms_engine_create(g.m, &ep, &e), 0);
    lms_engine_get_info(e, &info);
    lms_engine_free(e);
    /* 8 requests of up to 38 + 60 tokens need about 40 pages of 16: give 16 */
    uint64_t page = (uint64_t)info.n_layers * 2 * info.n_kv_heads * info.head_dim * 4 * 16;
    ep.kv_bytes = 16 * page;
    lms_batch_params bp = lms_batch_default_params();
    bp.max_seqs = 8;
    bp.step_tokens = 32;
    lms_batch *b = NULL;
    if (lms_batch_create(g.m, &ep, &bp, &b))
        fail_msg("batch: %s", lms_last_error());
    run_batch(b, p, 8, &gp, 8, o);
    assert_same(o, r, 8, "preempted");
    lms_batch_stats bs;
    lms_batch_get_stats(b, &bs);
    printf("preemptions %llu, steps %llu\n", (unsigned long long)bs.preemptions, (unsigned long long)bs.steps);
    assert_true(bs.preemptions > 0);
    assert_int_equal(bs.kv_pages_total, 16);
    lms_batch_free(b);
    free(p);
    free(r);
    free(o);
    rig_close(&g);
}

/* ---- cancel and errors ------------------------------------------------------------------------------- */

static void cancel_frees_pages_and_errors_name_their_cause(void **s)
{
    rig g;
    rig_open(&g, "qwen3");
    lms_engine_params ep = eparams();
    lms_batch_params bp = lms_batch_default_params();
    bp.max_seqs = 2;
    bp.step_tokens = 16;
    lms_batch *b = NULL;
    assert_int_equal(lms_batch_create(g.m, &ep, &bp, &b), 0);
    int32_t pr[300];
    for (int i = 0; i < 300; i++) pr[i] = i % (int)g.vocab;
    uint64_t id1, id2, id3;
    lms_batch_event ev[4];
    size_t n;
    assert_int_equal(lms_batch_add(b, pr, 300, NULL, &id1), LMS_ERANGE); /* n_ctx 256 */
    assert_non_null(strstr(lms_last_error(), "context"));
    int32_t bad = (int32_t)g.vocab;
    assert_int_equal(lms_batch_add(b, &bad, 1, NULL, &id1), LMS_EINVAL);
    assert_non_null(strstr(lms_last_error(), "vocabulary"));
    assert_int_equal(lms_batch_step(b, ev, 1, &n), LMS_EINVAL); /* cap < max_seqs */
    assert_int_equal(lms_batch_add(b, pr, 40, NULL, &id1), 0);
    assert_int_equal(lms_batch_add(b, pr + 1, 40, NULL, &id2), 0);
    assert_true(id1 != id2 && id1 && id2);
    assert_int_equal(lms_batch_add(b, pr, 10, NULL, &id3), LMS_ENOSPACE);
    assert_non_null(strstr(lms_last_error(), "slots"));
    for (int k = 0; k < 6; k++) assert_int_equal(lms_batch_step(b, ev, 4, &n), 0);
    lms_batch_stats bs;
    lms_batch_get_stats(b, &bs);
    assert_int_equal(bs.running, 2);
    uint32_t used2 = bs.kv_pages_used;
    assert_true(used2 >= 6);
    assert_int_equal(lms_batch_cancel(b, id1), 0);
    assert_int_equal(lms_batch_cancel(b, id1), LMS_ENOENT);
    lms_batch_get_stats(b, &bs);
    assert_int_equal(bs.running, 1);
    assert_true(bs.kv_pages_used < used2);
    assert_int_equal(lms_batch_add(b, pr, 10, NULL, &id3), 0); /* the slot is free again */
    assert_int_equal(lms_batch_cancel(b, id2), 0);
    assert_int_equal(lms_batch_cancel(b, id3), 0);
    lms_batch_get_stats(b, &bs);
    assert_int_equal(bs.kv_pages_used, 0);
    lms_batch_free(b);
    rig_close(&g);
}

/* ---- the prefix store --------------------------------------------------------------------------------- */

#define LONG 100 /* prompt tokens: 96 in whole pages of 16 are saved */

/* Prompts 1 and 2 share their first 96 tokens; prompt 3 only the first 64. */
static void long_prompt(int32_t *p, uint32_t vocab, int which)
{
    for (int i = 0; i < LONG; i++) p[i] = (int32_t)((i * 37 + 11) % vocab);
    for (int i = which == 3 ? 64 : 96; i < LONG; i++) p[i] = (int32_t)((i * 13 + which) % vocab);
}

static int count_prefix_sessions(void *ctx, const lms_kv_session_info *si)
{
    if (!strncmp(si->name, "prefix-", 7))
        ++*(int *)ctx;
    return 0;
}

/* Run one request to its end; ids into out (returns how many), cached tokens into *cached. */
static int run_one(lms_batch *b, const int32_t *p, int n, int G, int32_t *out, uint32_t *cached)
{
    uint64_t id;
    lms_gen_params gp = lms_gen_default_params();
    gp.max_tokens = (uint32_t)G;
    gp.ignore_eos = true;
    if (lms_batch_add(b, p, (size_t)n, &gp, &id))
        return -1;
    lms_batch_event ev[16];
    int k = 0;
    for (;;) {
        size_t ne = 0;
        if (lms_batch_step(b, ev, 16, &ne))
            return -1;
        for (size_t i = 0; i < ne; i++) {
            out[k++] = ev[i].token;
            *cached = ev[i].cached_tokens;
            if (ev[i].stop_reason)
                return k;
        }
    }
}

/* Child: a new batch over the store; prompts 3, 1, 2; prints cached tokens and ids of each. */
static int child_prefix(const char *store, int G)
{
    lms_store *st = NULL;
    lms_model *m = NULL;
    lms_batch *b = NULL;
    lms_engine_params ep = eparams();
    lms_batch_params bp = lms_batch_default_params();
    int status = 1;
    if (lms_store_open(store, 0, NULL, &st) || lms_model_open(st, "qwen3", NULL, &m))
        goto out;
    bp.max_seqs = 4;
    bp.prefix_store = st;
    bp.prefix_min_tokens = 32;
    if (lms_batch_create(m, &ep, &bp, &b))
        goto out;
    lms_engine_info info;
    lms_batch_get_info(b, &info);
    static const int order[3] = {3, 1, 2};
    for (int t = 0; t < 3; t++) {
        int32_t p[LONG], ids[MAXG];
        uint32_t cached = 0;
        long_prompt(p, info.n_vocab, order[t]);
        int n = run_one(b, p, LONG, G, ids, &cached);
        if (n < 0)
            goto out;
        printf("CACHED %u IDS", cached);
        for (int i = 0; i < n; i++) printf(" %d", ids[i]);
        printf("\n");
    }
    lms_batch_stats bs;
    lms_batch_get_stats(b, &bs);
    printf("STORE_HITS %llu\n", (unsigned long long)bs.prefix_hits_store);
    status = 0;
out:
    if (status)
        fprintf(stderr, "child: %s\n", lms_last_error());
    lms_batch_free(b);
    lms_model_close(m);
    lms_store_close(st);
    return status;
}

static void prefix_saved_to_store_is_resumed_by_a_new_process_with_cold_ids(void **s)
{
    rig g;
    rig_open(&g, "qwen3");
    int G = 20;
    int32_t p1[LONG], p2[LONG], p3[LONG], cold[3][MAXG] = {{0}};
    long_prompt(p1, g.vocab, 1);
    long_prompt(p2, g.vocab, 2);
    long_prompt(p3, g.vocab, 3);
    /* cold runs, alone */
    lms_engine_params ep = eparams();
    lms_engine *e;
    assert_int_equal(lms_engine_create(g.m, &ep, &e), 0);
    for (int t = 0; t < 3; t++) {
        int32_t buf[1 + MAXG] = {0};
        lms_gen_params gp = lms_gen_default_params();
        gp.max_tokens = (uint32_t)G;
        gp.ignore_eos = true;
        gp.no_prefix_reuse = true;
        lms_engine_reset(e);
        assert_int_equal(lms_generate(e, &gp, t == 0 ? p1 : t == 1 ? p2 : p3, LONG, collect_cb, buf, NULL), 0);
        assert_int_equal(buf[0], G);
        memcpy(cold[t], buf + 1, (size_t)G * sizeof(int32_t));
    }
    lms_engine_free(e);

    /* first batch: p1 computed and its 96-token prefix saved */
    lms_batch_params bp = lms_batch_default_params();
    bp.max_seqs = 4;
    bp.prefix_store = g.st;
    bp.prefix_min_tokens = 32;
    lms_batch *b = NULL;
    assert_int_equal(lms_batch_create(g.m, &ep, &bp, &b), 0);
    int32_t ids[MAXG];
    uint32_t cached = 99;
    assert_int_equal(run_one(b, p1, LONG, G, ids, &cached), G);
    assert_int_equal(cached, 0);
    assert_memory_equal(ids, cold[0], (size_t)G * sizeof(int32_t));
    lms_batch_event ev[4];
    size_t n;
    assert_int_equal(lms_batch_step(b, ev, 4, &n), 0); /* between steps: the save */
    lms_batch_stats bs;
    lms_batch_get_stats(b, &bs);
    assert_int_equal(bs.prefix_saves, 1);
    lms_batch_free(b);
    int np = 0;
    assert_int_equal(lms_kv_sessions(g.st, count_prefix_sessions, &np), 0);
    assert_int_equal(np, 1);

    /* a new process: prompt 3 shares the stored prefix's first 64 tokens (its
     * first four pages come from the store), then prompts 1 and 2 its 96 (the
     * rest of the resumed session's pages, still in the arena) */
    char *out = NULL;
    int rc = lms_test_sh(&out, "/proc/%d/exe prefix-child '%s' %d", (int)getpid(), g.sd, G);
    if (rc)
        fail_msg("child failed (%d): %s", rc, out ? out : "");
    const char *q = out;
    static const int want_cached[3] = {64, 96, 96}, which[3] = {2, 0, 1};
    for (int t = 0; t < 3; t++) {
        q = strstr(q, "CACHED ");
        assert_non_null(q);
        char *end;
        long c = strtol(q + 7, &end, 10);
        assert_int_equal(c, want_cached[t]);
        q = strstr(end, "IDS") + 3;
        for (int i = 0; i < G; i++) {
            long v = strtol(q, &end, 10);
            assert_true(end != q);
            if (v != cold[which[t]][i])
                fail_msg("prompt %d: id %d is %ld after resuming, %d cold", which[t] + 1, i, v, cold[which[t]][i]);
            q = end;
        }
    }
    assert_non_null(strstr(out, "STORE_HITS 1"));
    free(out);

    /* the disk budget: a budget of one byte keeps only the newest prefix */
    bp.prefix_disk_budget = 1;
    assert_int_equal(lms_batch_create(g.m, &ep, &bp, &b), 0);
    int32_t p4[LONG];
    for (int i = 0; i < LONG; i++) p4[i] = (int32_t)((i * 7 + 3) % g.vocab);
    assert_int_equal(run_one(b, p4, LONG, 4, ids, &cached), 4);
    assert_int_equal(cached, 0);
    assert_int_equal(lms_batch_step(b, ev, 4, &n), 0);
    lms_batch_get_stats(b, &bs);
    assert_int_equal(bs.prefix_saves, 1);
    lms_batch_free(b);
    np = 0;
    assert_int_equal(lms_kv_sessions(g.st, count_prefix_sessions, &np), 0);
    assert_int_equal(np, 1);
    rig_close(&g);
}

int main(int argc, char **argv)
{
    /* exactness is that of f32 products: with activations rounded to bf16 for BF16
     * weights (the default on CPUs with AVX-512 BF16), a step of many rows and a step
     * of one sum their products in different orders in bf16 pairs, and near-ties of
     * these random models can go either way (docs/ENGINE.md, batching) */
    setenv("LMSTORE_BF16_ACT", "0", 1);
    if (argc == 4 && !strcmp(argv[1], "prefix-child"))
        return child_prefix(argv[2], atoi(argv[3]));
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(batched_greedy_llama_equals_each_request_alone),
        cmocka_unit_test(batched_greedy_qwen2_equals_each_request_alone),
        cmocka_unit_test(batched_greedy_qwen3_equals_each_request_alone),
        cmocka_unit_test(batched_greedy_gemma3_equals_each_request_alone),
        cmocka_unit_test(small_arena_preempts_and_still_finishes_every_request_exactly),
        cmocka_unit_test(cancel_frees_pages_and_errors_name_their_cause),
        cmocka_unit_test(prefix_saved_to_store_is_resumed_by_a_new_process_with_cold_ids),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
