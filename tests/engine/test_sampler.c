/*
 * tests/engine/test_sampler.c - the sampler chain (engine/sampler.c) against
 * an independent numpy implementation of its definitions
 * (tests/reference/make_sampler_fixtures.py -> tests/fixtures/sampler/
 * cases.txt): kept sets, probabilities and picks for fixed logits, and the
 * generator's outputs; plus seeded statistical checks of the sampling
 * distribution, seeding behaviour, argument checks and "no allocation per
 * token" (every allocation fails after creation).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "engine/sampler.h"
#include "testutil.h"

/* Sampler-relevant settings all off (the engine's lms_gen_default_params
 * lives in generate.c; the sampler must not depend on it). */
static lms_gen_params defaults(void)
{
    lms_gen_params gp;
    memset(&gp, 0, sizeof gp);
    gp.top_p = 1.0f;
    gp.repeat_penalty = 1.0f;
    return gp;
}

static FILE *open_fixture(void)
{
    char path[4096];
    snprintf(path, sizeof path, "%s/tests/fixtures/sampler/cases.txt", lms_test_src());
    FILE *f = fopen(path, "r");
    if (!f)
        fail_msg("cannot open %s", path);
    return f;
}

static double read_hex(FILE *f)
{
    char buf[64];
    if (fscanf(f, "%63s", buf) != 1)
        fail_msg("fixture: expected a number");
    return strtod(buf, NULL);
}

static void rng_matches_reference_outputs(void **state)
{
    (void)state;
    FILE *f = open_fixture();
    char tag[64];
    int seen = 0;
    while (fscanf(f, "%63s", tag) == 1) {
        if (strcmp(tag, "rng") != 0) {
            int c;
            while ((c = fgetc(f)) != '\n' && c != EOF) {}
            continue;
        }
        unsigned long long seed;
        int n;
        assert_int_equal(fscanf(f, "%llx %d", &seed, &n), 2);
        lms__rng r;
        lms__rng_seed(&r, seed);
        for (int i = 0; i < n; i++) {
            unsigned long long want;
            assert_int_equal(fscanf(f, "%llx", &want), 1);
            assert_true(lms__rng_next(&r) == want);
        }
        seen++;
    }
    fclose(f);
    assert_int_equal(seen, 4);
}

static void sampler_matches_reference_cases(void **state)
{
    (void)state;
    FILE *f = open_fixture();
    char tag[64], name[128] = "";
    int cases = 0;
    float *logits = NULL;
    lms__sampler *s = NULL;
    lms_gen_params gp = defaults();
    uint32_t V = 0;
    while (fscanf(f, "%63s", tag) == 1) {
        if (strcmp(tag, "rng") == 0) {
            int c;
            while ((c = fgetc(f)) != '\n' && c != EOF) {}
        } else if (strcmp(tag, "case") == 0) {
            assert_int_equal(fscanf(f, "%127s", name), 1);
        } else if (strcmp(tag, "params") == 0) {
            unsigned w;
            int k;
            assert_int_equal(fscanf(f, "%u", &V), 1);
            gp.temperature = (float)read_hex(f);
            assert_int_equal(fscanf(f, "%d", &k), 1);
            gp.top_k = k;
            gp.top_p = (float)read_hex(f);
            gp.min_p = (float)read_hex(f);
            gp.repeat_penalty = (float)read_hex(f);
            assert_int_equal(fscanf(f, "%u", &w), 1);
            gp.repeat_window = w;
            gp.seed = 1;
            lms__sampler_free(s);
            s = NULL;
            assert_int_equal(lms__sampler_create(&gp, V, &s), 0);
        } else if (strcmp(tag, "hist") == 0) {
            int n, id;
            assert_int_equal(fscanf(f, "%d", &n), 1);
            for (int i = 0; i < n; i++) {
                assert_int_equal(fscanf(f, "%d", &id), 1);
                lms__sampler_accept(s, id);
            }
        } else if (strcmp(tag, "logits") == 0) {
            unsigned n;
            assert_int_equal(fscanf(f, "%u", &n), 1);
            assert_int_equal(n, V);
            free(logits);
            logits = malloc(n * sizeof *logits);
            for (unsigned i = 0; i < n; i++)
                logits[i] = (float)read_hex(f);
        } else if (strcmp(tag, "probs") == 0) {
            int n;
            assert_int_equal(fscanf(f, "%d", &n), 1);
            (void)lms__sampler_sample_u(s, logits, 0.5);
            if ((size_t)n != lms__sampler_kept(s))
                fail_msg("case %s: kept %zu ids, reference %d", name, lms__sampler_kept(s), n);
            char *kept = calloc(V, 1);
            for (int i = 0; i < n; i++) {
                int id;
                double p;
                assert_int_equal(fscanf(f, "%d %lf", &id, &p), 2);
                kept[id] = 1;
                double got = lms__sampler_prob(s, id);
                if (fabs(got - p) > 1e-12 + 1e-9 * p)
                    fail_msg("case %s: p(%d) = %.17g, reference %.17g", name, id, got, p);
            }
            for (uint32_t i = 0; i < V; i++)
                if (!kept[i] && lms__sampler_prob(s, (int32_t)i) != 0.0)
                    fail_msg("case %s: id %u kept, reference drops it", name, i);
            free(kept);
        } else if (strcmp(tag, "pick") == 0) {
            int n;
            assert_int_equal(fscanf(f, "%d", &n), 1);
            for (int i = 0; i < n; i++) {
                double u = read_hex(f);
                int want;
                assert_int_equal(fscanf(f, "%d", &want), 1);
                int32_t got = lms__sampler_sample_u(s, logits, u);
                if (got != want)
                    fail_msg("case %s: u=%g picks %d, reference %d", name, u, (int)got, want);
            }
        } else if (strcmp(tag, "end") == 0) {
            cases++;
        } else {
            fail_msg("fixture: unknown record '%s'", tag);
        }
    }
    fclose(f);
    free(logits);
    lms__sampler_free(s);
    assert_true(cases >= 20);
}

/* Pearson chi-square of counts against probabilities. */
static double chi2(const long *counts, const double *p, int n, long total)
{
    double x = 0.0;
    for (int i = 0; i < n; i++) {
        double e = p[i] * (double)total;
        if (e > 0)
            x += ((double)counts[i] - e) * ((double)counts[i] - e) / e;
    }
    return x;
}

static void sampled_frequencies_follow_the_distribution(void **state)
{
    (void)state;
    const float logits[6] = {1.0f, 0.5f, -0.2f, 2.0f, 0.0f, -1.5f};
    lms_gen_params gp = defaults();
    gp.temperature = 0.8f;
    gp.seed = 12345;
    lms__sampler *s;
    assert_int_equal(lms__sampler_create(&gp, 6, &s), 0);
    double p[6], z = 0;
    for (int i = 0; i < 6; i++)
        z += p[i] = exp(logits[i] / 0.8);
    for (int i = 0; i < 6; i++)
        p[i] /= z;
    long counts[6] = {0};
    const long N = 60000;
    for (long t = 0; t < N; t++) {
        int32_t id = lms__sampler_sample(s, logits);
        assert_true(id >= 0 && id < 6);
        counts[id]++;
    }
    /* 5 degrees of freedom: P(chi2 > 20.5) = 0.001. */
    double x = chi2(counts, p, 6, N);
    if (x > 20.5)
        fail_msg("chi-square %.2f over 5 dof", x);
    lms__sampler_free(s);

    /* top-k 3 + top-p: only the kept ids, in renormalized proportions. */
    gp.temperature = 1.0f;
    gp.top_k = 3;
    gp.top_p = 0.9f;
    assert_int_equal(lms__sampler_create(&gp, 6, &s), 0);
    /* p at T=1 sorted: ids 3, 0, 1 (then 4, 2, 5); top-k 3 keeps 3,0,1;
     * their mass: e^2, e^1, e^.5 -> cumulative shares .63, .86, 1.0:
     * top-p 0.9 keeps all three. */
    double q[6] = {0}, zq = exp(2.0) + exp(1.0) + exp(0.5);
    q[3] = exp(2.0) / zq;
    q[0] = exp(1.0) / zq;
    q[1] = exp(0.5) / zq;
    memset(counts, 0, sizeof counts);
    for (long t = 0; t < N; t++)
        counts[lms__sampler_sample(s, logits)]++;
    assert_int_equal(counts[2] + counts[4] + counts[5], 0);
    long c3[3] = {counts[3], counts[0], counts[1]};
    double p3[3] = {q[3], q[0], q[1]};
    x = chi2(c3, p3, 3, N);
    if (x > 13.8) /* 2 dof, 0.001 */
        fail_msg("chi-square %.2f over 2 dof (top-k/top-p)", x);
    lms__sampler_free(s);
}

static void same_seed_same_ids_and_reset_reseeds(void **state)
{
    (void)state;
    float logits[100];
    for (int i = 0; i < 100; i++)
        logits[i] = (float)sin(i * 0.7) * 3.0f;
    lms_gen_params gp = defaults();
    gp.temperature = 1.0f;
    gp.top_p = 0.95f;
    gp.seed = 99;
    lms__sampler *a, *b, *c;
    assert_int_equal(lms__sampler_create(&gp, 100, &a), 0);
    assert_int_equal(lms__sampler_create(&gp, 100, &b), 0);
    gp.seed = 100;
    assert_int_equal(lms__sampler_create(&gp, 100, &c), 0);
    int32_t first[64];
    int differ = 0;
    for (int t = 0; t < 64; t++) {
        first[t] = lms__sampler_sample(a, logits);
        assert_int_equal(first[t], lms__sampler_sample(b, logits));
        differ += first[t] != lms__sampler_sample(c, logits);
    }
    assert_true(differ > 10);
    lms__sampler_reset(a);
    for (int t = 0; t < 64; t++)
        assert_int_equal(first[t], lms__sampler_sample(a, logits));
    lms__sampler_free(a);
    lms__sampler_free(b);
    lms__sampler_free(c);
}

static void sampling_allocates_nothing(void **state)
{
    (void)state;
    enum { V = 5000 };
    float *logits = malloc(V * sizeof *logits);
    for (int i = 0; i < V; i++)
        logits[i] = (float)cos(i * 0.37) * 4.0f;
    lms_gen_params gp = defaults();
    gp.temperature = 0.9f;
    gp.top_k = 50;
    gp.top_p = 0.9f;
    gp.min_p = 0.01f;
    gp.repeat_penalty = 1.2f;
    gp.repeat_window = 16;
    lms__sampler *s;
    assert_int_equal(lms__sampler_create(&gp, V, &s), 0);
    lms__fault_reset_counts();
    lms__fault_arm(LMS_FAULT_ALLOC, 1, true);
    for (int t = 0; t < 500; t++) {
        int32_t id = lms__sampler_sample(s, logits);
        assert_true(id >= 0 && id < V);
        assert_true(lms__sampler_prob(s, id) > 0.0);
        lms__sampler_accept(s, id);
    }
    lms__fault_disarm_all();
    assert_int_equal(lms__fault_calls(LMS_FAULT_ALLOC), 0);
    lms__sampler_free(s);
    free(logits);
}

static void repetition_penalty_turns_greedy_away_from_repeats(void **state)
{
    (void)state;
    const float logits[4] = {3.0f, 2.9f, -1.0f, -1.1f};
    lms_gen_params gp = defaults();
    gp.temperature = 0.0f;
    gp.repeat_penalty = 1.1f;
    gp.repeat_window = 2;
    lms__sampler *s;
    assert_int_equal(lms__sampler_create(&gp, 4, &s), 0);
    assert_int_equal(lms__sampler_sample(s, logits), 0);
    lms__sampler_accept(s, 0); /* 3.0 / 1.1 = 2.73 < 2.9 */
    assert_int_equal(lms__sampler_sample(s, logits), 1);
    lms__sampler_accept(s, 1);
    lms__sampler_accept(s, 2); /* window 2: id 0 has left it */
    assert_int_equal(lms__sampler_sample(s, logits), 0);
    lms__sampler_free(s);
}

static void invalid_settings_fail_naming_the_setting(void **state)
{
    (void)state;
    lms__sampler *s = (lms__sampler *)1;
    lms_gen_params gp = defaults();
    gp.top_p = 1.5f;
    assert_int_equal(lms__sampler_create(&gp, 10, &s), LMS_EINVAL);
    assert_null(s);
    assert_non_null(strstr(lms_last_error(), "top_p"));
    gp = defaults();
    gp.top_k = -3;
    assert_int_equal(lms__sampler_create(&gp, 10, &s), LMS_EINVAL);
    assert_non_null(strstr(lms_last_error(), "top_k"));
    gp = defaults();
    gp.min_p = -0.1f;
    assert_int_equal(lms__sampler_create(&gp, 10, &s), LMS_EINVAL);
    assert_non_null(strstr(lms_last_error(), "min_p"));
    gp = defaults();
    assert_int_equal(lms__sampler_create(&gp, 0, &s), LMS_EINVAL);
    lms__sampler_free(NULL);
}

static void all_masked_logits_give_the_lowest_id(void **state)
{
    (void)state;
    const float logits[3] = {-INFINITY, NAN, -INFINITY};
    lms_gen_params gp = defaults();
    gp.temperature = 1.0f;
    gp.top_p = 0.5f;
    lms__sampler *s;
    assert_int_equal(lms__sampler_create(&gp, 3, &s), 0);
    assert_int_equal(lms__sampler_sample(s, logits), 0);
    lms__sampler_free(s);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(rng_matches_reference_outputs),
        cmocka_unit_test(sampler_matches_reference_cases),
        cmocka_unit_test(sampled_frequencies_follow_the_distribution),
        cmocka_unit_test(same_seed_same_ids_and_reset_reseeds),
        cmocka_unit_test(sampling_allocates_nothing),
        cmocka_unit_test(repetition_penalty_turns_greedy_away_from_repeats),
        cmocka_unit_test(invalid_settings_fail_naming_the_setting),
        cmocka_unit_test(all_masked_logits_give_the_lowest_id),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
