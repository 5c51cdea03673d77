/*
 * tests/loader/test_open_time.c - opening a model costs O(number of
 * tensors), not O(bytes): a ~4 GB model and a ~64 MB model with the same
 * tensor count open in comparable time, and neither open maps data pages.
 *
 * The 4 GB model is generated straight into the store through the store's
 * internal appender: each blob is reserved at full size and only its first
 * 4 KiB written, so the segment is a sparse file (cheap on CI disks) whose
 * bytes are still exactly what the records (and their XXH3-128 hashes) say.
 * The small one goes through lms_import like any model.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "common/common.h"
#include "loader/loader_internal.h"
#include "store/store_internal.h" /* white-box: writes and reads store records directly */
#include "testutil.h"

#include "loader_smaps.h"
#include "loader_testmodel.h"

typedef struct gen_ctx {
    const tm_model *m;
    const char *name;
    uint8_t (*hash)[16];
    uint32_t *seg;
    uint64_t *off;
} gen_ctx;

static int gen_commit(lms_store *s, MDB_txn *txn, void *vctx)
{
    gen_ctx *g = vctx;
    char key[512];
    uint8_t tb[LMS__TENSOR_REC_FIXED + 8 * LMS_MAX_DIMS];
    uint64_t bytes = 0, params = 0;
    int rc;
    for (int i = 0; i < g->m->n; i++) {
        const tm_tensor *t = &g->m->t[i];
        lms__blob_rec b = {.kind = LMS__BLOB_TENSOR, .segment = g->seg[i], .offset = g->off[i], .size = t->nbytes,
                           .refs = 1};
        if ((rc = lms__blob_put(s, txn, g->hash[i], &b)))
            return rc;
        lms__tensor_rec tr = {.ndim = (uint32_t)t->ndim, .nbytes = t->nbytes, .order = (uint32_t)i};
        if ((rc = lms_dtype_from_name(t->dtype, &tr.dtype)))
            return rc;
        for (int d = 0; d < t->ndim; d++)
            tr.shape[d] = t->shape[d];
        tr.layer = !strncmp(t->name, "model.layers.", 13) ? atoi(t->name + 13)
                   : !strcmp(t->name, "model.embed_tokens.weight") ? -1
                                                                   : INT32_MAX;
        memcpy(tr.hash, g->hash[i], 16);
        size_t tl = lms__tensor_rec_encode(&tr, tb);
        size_t kl = lms__key_item(key, sizeof key, g->name, t->name);
        if ((rc = lms__db_put(s, txn, LMS__DB_TENSORS, key, kl, tb, tl, 0)))
            return rc;
        bytes += t->nbytes;
        params += t->nbytes / tm_dtype_size(t->dtype);
    }
    lms__model_rec mr = {.created = lms__unix_time(), .n_tensors = (uint64_t)g->m->n, .n_params = params,
                         .tensor_bytes = bytes, .arch = "LlamaForCausalLM", .arch_len = 16, .source = "generated",
                         .source_len = 9, .st_meta = "", .st_meta_len = 0};
    mr.id[0] = 0x42;
    uint8_t *rec;
    size_t rl;
    if ((rc = lms__model_rec_encode(&mr, &rec, &rl)))
        return rc;
    rc = lms__db_put(s, txn, LMS__DB_MODELS, g->name, strlen(g->name), rec, rl, 0);
    lms__free(rec);
    return rc;
}

/* Write m sparsely (first 4 KiB of each tensor) into the store as `name`. */
static void gen_sparse_model(lms_store *s, const tm_model *m, const char *name)
{
    gen_ctx g = {.m = m, .name = name};
    g.hash = calloc((size_t)m->n, 16);
    g.seg = calloc((size_t)m->n, sizeof *g.seg);
    g.off = calloc((size_t)m->n, sizeof *g.off);
    uint8_t *zeros = calloc(1, 1 << 20);
    lms__appender *a = NULL;
    assert_int_equal(lms__append_begin(s, &a), 0);
    for (int i = 0; i < m->n; i++) {
        const tm_tensor *t = &m->t[i];
        uint8_t *head = tm_expected(t, true); /* only the first 4 KiB are non-zero */
        uint64_t hn = t->nbytes < 4096 ? t->nbytes : 4096;
        assert_int_equal(lms__append_reserve(a, t->nbytes, &g.seg[i], &g.off[i]), 0);
        assert_int_equal(lms__append_write(a, g.seg[i], g.off[i], head, (size_t)hn), 0);
        lms_hasher *h = lms__hasher_new();
        lms__hasher_update(h, head, (size_t)hn);
        for (uint64_t o = hn; o < t->nbytes; o += 1 << 20)
            lms__hasher_update(h, zeros, (size_t)LMS_MIN(1u << 20, t->nbytes - o));
        lms__hash128_put(g.hash[i], lms__hasher_digest(h));
        lms__hasher_free(h);
        free(head);
    }
    assert_int_equal(lms__append_sync(a), 0);
    assert_int_equal(lms__txn_write(s, gen_commit, &g), 0);
    lms__append_end(a, true);
    free(zeros);
    free(g.hash);
    free(g.seg);
    free(g.off);
}

static double median(double *v, int n)
{
    for (int i = 1; i < n; i++)
        for (int j = i; j > 0 && v[j] < v[j - 1]; j--) {
            double x = v[j];
            v[j] = v[j - 1];
            v[j - 1] = x;
        }
    return v[n / 2];
}

static double time_opens(lms_store *st, const char *name, uint64_t *bytes)
{
    double t[15];
    for (int r = 0; r < 15; r++) {
        lms_model *m = NULL;
        double t0 = lms__now();
        assert_int_equal(lms_model_open(st, name, NULL, &m), 0);
        t[r] = lms__now() - t0;
        *bytes = 0;
        for (size_t i = 0; i < lms_model_tensor_count(m); i++)
            *bytes += lms_model_tensor_at(m, i)->nbytes;
        lms_model_close(m);
    }
    return median(t, 15);
}

static void big_and_small_models_open_in_comparable_time(void **state)
{
    (void)state;
    char *dir = lms_test_tmpdir("opentime");
    char store[1200], src[1200];
    snprintf(store, sizeof store, "%s/store", dir);
    snprintf(src, sizeof src, "%s/src", dir);
    assert_int_equal(mkdir(src, 0755), 0);
    static tm_model small, big;
    tm_llama(&small, 24, 2048, 256, 1376);  /* ~64 MB */
    tm_llama(&big, 24, 32000, 2048, 11008); /* ~4.3 GB, sparse */
    assert_int_equal(small.n, big.n);
    assert_int_equal(tm_import(&small, src, store, "small", false), 0);
    lms_store *st = NULL;
    assert_int_equal(lms_store_open(store, 0, NULL, &st), 0);
    gen_sparse_model(st, &big, "big");

    uint64_t bs = 0, bb = 0;
    /* the big model's views are right where it was written (spot check) */
    lms_model *m = NULL;
    assert_int_equal(lms_model_open(st, "big", NULL, &m), 0);
    const lms_tensor *t = lms_model_tensor(m, "model.layers.23.mlp.down_proj.weight");
    uint8_t *want = tm_expected(tm_find(&big, t->name), true);
    assert_memory_equal(t->host, want, 4096);
    free(want);
    seg_usage u;
    lms_model_close(m);

    double ts = time_opens(st, "small", &bs);
    double tb = time_opens(st, "big", &bb);
    assert_true(bb > 3000000000ull);
    assert_true(bs < 80000000ull && bs > 40000000ull);
    print_message("open: %.0f MB model %.3f ms, %.0f MB model %.3f ms (median of 15)\n", bs / 1e6, ts * 1e3,
                  bb / 1e6, tb * 1e3);
    /* 50x the bytes, same tensor count: comparable time (well under 2x + noise) */
    assert_true(tb < 2.0 * ts + 0.002);

    /* and an open maps no data page of the big one */
    assert_int_equal(lms_model_open(st, "big", NULL, &m), 0);
    assert_int_equal(seg_usage_read(getpid(), store, &u), 0);
    assert_true(u.size >= bb);
    assert_true(u.rss <= (unsigned long long)u.mappings * (2 << 20)); /* header page + fault-around / folio */
    lms_model_close(m);
    assert_int_equal(lms_store_close(st), 0);
    lms_test_rmrf(dir);
    free(dir);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(big_and_small_models_open_in_comparable_time),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
