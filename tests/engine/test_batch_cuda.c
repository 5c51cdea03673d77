/*
 * tests/engine/test_batch_cuda.c - the batched engine (lmstore/batch.h) on
 * a CUDA device, where a step is one forward pass over the rows of every
 * running sequence (segments): 16 concurrent greedy requests of different
 * lengths (decode rows of many sequences with prefill chunks mixed in) each
 * return the ids lms_generate returns for that prompt alone on the same
 * device (llama, qwen3 and gemma3 fixtures, F32 K/V), in far fewer steps
 * than one pass per sequence would take, and every page is freed at the
 * end. Rows are grouped differently in the batch (16 decode rows go through
 * cuBLAS, one row alone through the GEMV), so the products agree to f32
 * rounding, not bit for bit; the fixtures' greedy ids do not come near a tie.
 * Without a GPU, or in a build without CUDA, it exits 77: skipped.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "lmstore/batch.h"
#include "lmstore/engine.h"
#include "lmstore/loader.h"
#include "lmstore/store.h"
#include "testutil.h"
#include "engine/fixture_store.h"

#define NR 16
#define GEN 24

static lms_device *g_dev;

static int collect_cb(void *user, int32_t id, const char *piece, size_t len)
{
    (void)piece;
    (void)len;
    int32_t *o = user;
    if (id >= 0 && o[0] < GEN)
        o[1 + o[0]++] = id;
    return 0;
}

static void family_on_cuda(const char *family)
{
    char *sd = lms_test_fixture_store(family, family);
    lms_store *st;
    lms_model *m;
    assert_int_equal(lms_store_open(sd, 0, NULL, &st), 0);
    lms_model_params mp = lms_model_default_params();
    mp.device = g_dev;
    mp.placement = LMS_PLACE_RESIDENT;
    if (lms_model_open(st, family, &mp, &m))
        fail_msg("model open: %s", lms_last_error());
    lms_engine_params ep = lms_engine_default_params();
    ep.kv_dtype = LMS_DTYPE_F32;
    ep.n_ctx = 256;
    ep.device = g_dev;
    lms_engine *e;
    if (lms_engine_create(m, &ep, &e))
        fail_msg("engine: %s", lms_last_error());
    lms_engine_info info;
    lms_engine_get_info(e, &info);
    static int32_t prompts[NR][128], alone[NR][1 + GEN];
    uint64_t x = 99;
    lms_gen_params gp = lms_gen_default_params();
    gp.max_tokens = GEN;
    gp.ignore_eos = true;
    gp.no_prefix_reuse = true;
    for (int i = 0; i < NR; i++) {
        for (int k = 0; k < 128; k++) {
            x = x * 6364136223846793005ull + 1442695040888963407ull;
            prompts[i][k] = (int32_t)((x >> 33) % info.n_vocab);
        }
        alone[i][0] = 0;
        lms_engine_reset(e);
        assert_int_equal(lms_generate(e, &gp, prompts[i], (size_t)(5 + 7 * i), collect_cb, alone[i], NULL), 0);
        assert_int_equal(alone[i][0], GEN);
    }
    lms_engine_free(e);

    lms_batch_params bp = lms_batch_default_params();
    bp.max_seqs = NR;
    bp.step_tokens = 48; /* 16 decode rows and a prefill chunk of up to 32 */
    lms_batch *b;
    if (lms_batch_create(m, &ep, &bp, &b))
        fail_msg("batch: %s", lms_last_error());
    uint64_t ids[NR];
    int got[NR] = {0}, done = 0;
    gp.no_prefix_reuse = false;
    for (int i = 0; i < NR; i++) assert_int_equal(lms_batch_add(b, prompts[i], (size_t)(5 + 7 * i), &gp, &ids[i]), 0);
    lms_batch_event ev[NR];
    while (done < NR) {
        size_t n = 0;
        if (lms_batch_step(b, ev, NR, &n))
            fail_msg("step: %s", lms_last_error());
        for (size_t k = 0; k < n; k++) {
            int i = (int)(ev[k].id - ids[0]);
            assert_true(got[i] < GEN);
            if (ev[k].token != alone[i][1 + got[i]])
                fail_msg("%s: request %d token %d is %d, alone %d", family, i, got[i], ev[k].token,
                         alone[i][1 + got[i]]);
            got[i]++;
            done += ev[k].stop_reason != LMS_STOP_NONE;
        }
    }
    lms_batch_stats bs;
    lms_batch_get_stats(b, &bs);
    assert_int_equal(bs.kv_pages_used, 0);
    printf("%s on %s: %d requests, %llu steps\n", family, info.device, NR, (unsigned long long)bs.steps);
    /* one pass per sequence would take NR x GEN steps at least; together, the decode of
     * all sequences shares steps (GEN steps after the prefills, which take about 30) */
    assert_true(bs.steps < 3 * GEN);
    lms_batch_free(b);
    lms_model_close(m);
    assert_int_equal(lms_store_close(st), 0);
    lms_test_rmrf(sd);
    free(sd);
}

static void batched_greedy_llama_on_cuda_equals_each_request_alone(void **s) { family_on_cuda("llama"); }
static void batched_greedy_qwen3_on_cuda_equals_each_request_alone(void **s) { family_on_cuda("qwen3"); }
static void batched_greedy_gemma3_on_cuda_equals_each_request_alone(void **s) { family_on_cuda("gemma3"); }

int main(void)
{
    if (lms_device_open(LMS_DEVICE_CUDA, 0, &g_dev)) {
        fprintf(stderr, "no CUDA device (%s): skipped\n", lms_last_error());
        return 77;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(batched_greedy_llama_on_cuda_equals_each_request_alone),
        cmocka_unit_test(batched_greedy_qwen3_on_cuda_equals_each_request_alone),
        cmocka_unit_test(batched_greedy_gemma3_on_cuda_equals_each_request_alone),
    };
    int rc = cmocka_run_group_tests(tests, NULL, NULL);
    lms_device_close(g_dev);
    return rc;
}
