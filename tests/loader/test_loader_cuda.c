/*
 * tests/loader/test_loader_cuda.c - the loader on a CUDA device: in the
 * mapped placement and in the resident placement through each of its paths
 * (registered mapping, staging ring, parallel readers, and staging after a
 * refused registration), every tensor's device bytes equal the host bytes
 * and the bytes the generator wrote; placement AUTO chooses resident or
 * mapped by the free device memory and the caller's reserve. Device bytes are read by the GPU
 * (device-to-device copy into a scratch buffer) and copied back.
 *
 * Without a GPU (or in a build without CUDA) it exits 77: skipped.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "common/common.h"
#include "loader/device.h"
#include "loader/loader_internal.h"
#include "testutil.h"

#include "loader_testmodel.h"

static char *g_dir, g_store[1024];
static tm_model g_m;
static lms_device *g_dev;
static bool g_ring_host_alloc; /* open_with: ring slots from cudaHostAlloc */

static int setup_all(void **state)
{
    (void)state;
    g_dir = lms_test_tmpdir("loader-cuda");
    char src[1100];
    snprintf(src, sizeof src, "%s/src", g_dir);
    snprintf(g_store, sizeof g_store, "%s/store", g_dir);
    if (!g_dir || mkdir(src, 0755))
        return -1;
    /* ~110 MB: 6 blocks with 4.5 MiB MLP matrices (they span 2 MiB chunks) */
    tm_llama(&g_m, 6, 8000, 768, 3072);
    int rc = tm_import(&g_m, src, g_store, "m", false);
    if (rc)
        fprintf(stderr, "import: %s\n", lms_last_error());
    return rc ? -1 : 0;
}

static int teardown_all(void **state)
{
    (void)state;
    lms_test_rmrf(g_dir);
    free(g_dir);
    return 0;
}

/* Read every tensor through the device and compare; returns mismatches. */
static int check_device_bytes(lms_model *m)
{
    lms_device *d = g_dev;
    int bad = 0;
    uint64_t maxn = 0;
    for (size_t i = 0; i < lms_model_tensor_count(m); i++)
        maxn = LMS_MAX(maxn, lms_model_tensor_at(m, i)->nbytes);
    void *scratch = NULL;
    assert_int_equal(d->ops->alloc(d, (size_t)maxn, &scratch), 0);
    uint8_t *back = malloc((size_t)maxn);
    for (size_t i = 0; i < lms_model_tensor_count(m); i++) {
        const lms_tensor *t = lms_model_tensor_at(m, i);
        assert_non_null(t->device);
        assert_int_equal(d->ops->memset(d, scratch, 0xA5, (size_t)t->nbytes, NULL), 0);
        /* A registered mapping is made of separate registrations (blocks);
         * cudaMemcpy wants a source inside one, so copy block by block
         * (kernels read across blocks: the device addresses are contiguous). */
        uint64_t grid = 0;
        uintptr_t base = 0;
        if (lms_model_placement(m) == LMS_PLACE_MAPPED) {
            const lms__tinfo *ti = &m->ti[i];
            grid = lms__reg_grid(ti->map, d, 0);
            base = (uintptr_t)ti->map->sm.base;
        }
        for (uint64_t off = 0; off < t->nbytes;) {
            uint64_t n = t->nbytes - off;
            if (grid) {
                uint64_t pos = (uint64_t)((uintptr_t)t->host - base) + off;
                n = LMS_MIN(n, (pos / grid + 1) * grid - pos);
            }
            int rc = d->ops->copy_d2d(d, (uint8_t *)scratch + off, (const uint8_t *)t->device + off, (size_t)n, NULL);
            if (rc)
                fail_msg("tensor %s: reading %llu bytes at %llu through the device: %s", t->name,
                         (unsigned long long)n, (unsigned long long)off, lms_last_error());
            off += n;
        }
        assert_int_equal(d->ops->copy_d2h(d, back, scratch, (size_t)t->nbytes, NULL), 0);
        uint8_t *want = tm_expected(tm_find(&g_m, t->name), false);
        if (memcmp(back, t->host, (size_t)t->nbytes) || memcmp(back, want, (size_t)t->nbytes)) {
            if (bad++ < 5)
                print_error("tensor %s: device bytes differ\n", t->name);
        }
        free(want);
    }
    free(back);
    d->ops->free(d, scratch);
    return bad;
}

static lms_model *open_with(lms_store *st, lms_placement pl, lms_copy_source copy, uint64_t chunk,
                            lms_load_order order)
{
    lms_model_tuning t = {.copy = copy, .chunk_bytes = chunk, .order = order, .ring_host_alloc = g_ring_host_alloc};
    lms_model_params p = lms_model_default_params();
    p.device = g_dev;
    p.placement = pl;
    p.tuning = &t;
    lms_model *m = NULL;
    int rc = lms_model_open(st, "m", &p, &m);
    if (rc)
        fail_msg("open: %s", lms_last_error());
    return m;
}

static const char *path_of(const lms_model_stats *s)
{
    return s->readers && s->registered_bytes ? "split"
           : s->readers ? (s->direct_io ? "readers-odirect" : "readers")
                      : s->staging ? "staging" : s->registered_bytes ? "registered" : "direct";
}

/* Load resident through `copy` (with a registration refusal mode) and
 * check the path taken is `want` and every byte arrived. */
static void run_resident(lms_copy_source copy, int refuse, lms_load_order order, uint64_t chunk, const char *want)
{
    lms_store *st = NULL;
    assert_int_equal(lms_store_open(g_store, LMS_STORE_RDONLY, NULL, &st), 0);
    atomic_store(&lms__loader_test_refuse, refuse);
    lms_model *m = open_with(st, LMS_PLACE_RESIDENT, copy, chunk, order);
    atomic_store(&lms__loader_test_refuse, LMS__REFUSE_NONE);
    assert_int_equal(lms_model_placement(m), LMS_PLACE_RESIDENT);
    /* wait layer by layer from the last: each wait covers exactly its layer */
    for (int l = lms_model_n_layers(m) - 1; l >= 0; l--)
        assert_int_equal(lms_model_wait_layer(m, l), 0);
    assert_int_equal(lms_model_wait_layer(m, LMS_LAYER_PRE), 0);
    assert_int_equal(lms_model_wait_layer(m, LMS_LAYER_POST), 0);
    assert_int_equal(lms_model_wait_layer(m, LMS_LAYER_ALL), 0);
    lms_model_stats s;
    assert_int_equal(lms_model_stats_get(m, &s), 0);
    print_message("resident copy=%d refuse=%d order=%d chunk=%llu: path %s, all %.1f ms, first layer %.1f ms\n",
                  (int)copy, refuse, (int)order, (unsigned long long)chunk, path_of(&s), s.all_s * 1e3,
                  s.first_layer_s * 1e3);
    assert_string_equal(path_of(&s), want);
    assert_true(s.copied_bytes >= s.tensor_bytes);
    assert_int_equal(check_device_bytes(m), 0);
    lms_model_close(m);
    assert_int_equal(lms_store_close(st), 0);
}

static void resident_registered_device_bytes_equal_host(void **state)
{
    (void)state;
    run_resident(LMS_COPY_REGISTER, LMS__REFUSE_NONE, LMS_ORDER_BLOCKS_FIRST, 0, "registered");
    run_resident(LMS_COPY_REGISTER, LMS__REFUSE_NONE, LMS_ORDER_FILE, 2 << 20, "registered");
}

static void resident_staging_ring_device_bytes_equal_host(void **state)
{
    (void)state;
    run_resident(LMS_COPY_STAGE_MAP, LMS__REFUSE_NONE, LMS_ORDER_BLOCKS_FIRST, 2 << 20, "staging");
    run_resident(LMS_COPY_STAGE_READ, LMS__REFUSE_NONE, LMS_ORDER_FILE, 0, "readers");
    run_resident(LMS_COPY_AUTO, LMS__REFUSE_NONE, LMS_ORDER_BLOCKS_FIRST, 0, "readers"); /* warm cache */
    g_ring_host_alloc = true; /* the ring from cudaHostAlloc instead of registered huge pages */
    run_resident(LMS_COPY_STAGE_READ, LMS__REFUSE_NONE, LMS_ORDER_BLOCKS_FIRST, 2 << 20, "readers");
    g_ring_host_alloc = false;
}

/* The staging ring lent by the device (lms_device_reserve_staging): pinned
 * once, used by the loads that follow, each byte arriving as before. */
static void resident_reserved_ring_device_bytes_equal_host(void **state)
{
    (void)state;
    assert_int_equal(lms_device_reserve_staging(g_dev, 0), 0);
    for (int k = 0; k < 2; k++) {
        lms_store *st = NULL;
        assert_int_equal(lms_store_open(g_store, LMS_STORE_RDONLY, NULL, &st), 0);
        lms_model *m = open_with(st, LMS_PLACE_RESIDENT, k ? LMS_COPY_STAGE_DIRECT : LMS_COPY_STAGE_READ, 0,
                                 LMS_ORDER_BLOCKS_FIRST);
        assert_int_equal(lms_model_wait_layer(m, LMS_LAYER_ALL), 0);
        lms_model_stats s;
        assert_int_equal(lms_model_stats_get(m, &s), 0);
        print_message("reserved ring, copy %s: all %.1f ms, first layer %.1f ms, setup %.1f ms\n",
                      k ? "stage-direct" : "stage-read", s.all_s * 1e3, s.first_layer_s * 1e3, s.setup_s * 1e3);
        assert_true(s.ring_reserved);
        assert_int_equal(check_device_bytes(m), 0);
        lms_model_close(m);
        assert_int_equal(lms_store_close(st), 0);
    }
}

static void resident_split_device_bytes_equal_host(void **state)
{
    (void)state; /* registered blocks and staged chunks in flight together */
    run_resident(LMS_COPY_SPLIT, LMS__REFUSE_NONE, LMS_ORDER_BLOCKS_FIRST, 2 << 20, "split");
    run_resident(LMS_COPY_SPLIT, LMS__REFUSE_NONE, LMS_ORDER_FILE, 0, "split");
}

static void resident_parallel_readers_device_bytes_equal_host(void **state)
{
    (void)state;
    run_resident(LMS_COPY_STAGE_DIRECT, LMS__REFUSE_NONE, LMS_ORDER_BLOCKS_FIRST, 2 << 20, "readers-odirect");
    run_resident(LMS_COPY_STAGE_DIRECT, LMS__REFUSE_NONE, LMS_ORDER_FILE, 0, "readers-odirect");
}

static void refused_registration_falls_back_to_staging(void **state)
{
    (void)state;
    run_resident(LMS_COPY_REGISTER, LMS__REFUSE_SIMULATED, LMS_ORDER_BLOCKS_FIRST, 2 << 20, "readers");
    /* a real refusal from the driver: pinning a read-only mapping without
     * the read-only flag (cudaErrorInvalidValue) */
    run_resident(LMS_COPY_REGISTER, LMS__REFUSE_DROP_READONLY, LMS_ORDER_BLOCKS_FIRST, 2 << 20, "readers");
}

static void mapped_device_reads_the_mapping_in_place(void **state)
{
    (void)state;
    lms_store *st = NULL;
    assert_int_equal(lms_store_open(g_store, LMS_STORE_RDONLY, NULL, &st), 0);
    lms_model *a = open_with(st, LMS_PLACE_MAPPED, LMS_COPY_AUTO, 2 << 20, LMS_ORDER_BLOCKS_FIRST);
    /* a second mapped model and a resident one share the registered blocks */
    lms_model *b = open_with(st, LMS_PLACE_MAPPED, LMS_COPY_AUTO, 0, LMS_ORDER_BLOCKS_FIRST);
    lms_model *c = open_with(st, LMS_PLACE_RESIDENT, LMS_COPY_REGISTER, 0, LMS_ORDER_BLOCKS_FIRST);
    assert_int_equal(lms_model_placement(a), LMS_PLACE_MAPPED);
    assert_int_equal(lms_model_wait_layer(c, LMS_LAYER_ALL), 0);
    lms_model_stats s;
    assert_int_equal(lms_model_stats_get(a, &s), 0);
    assert_true(s.registered_bytes >= s.tensor_bytes);
    assert_int_equal(check_device_bytes(a), 0);
    assert_int_equal(check_device_bytes(b), 0);
    assert_int_equal(check_device_bytes(c), 0);
    assert_int_equal(lms_model_stats_get(c, &s), 0);
    assert_string_equal(path_of(&s), "registered");
    lms_model_close(a);
    assert_int_equal(check_device_bytes(b), 0); /* b's registrations outlive a */
    lms_model_close(c);
    lms_model_close(b);
    assert_int_equal(lms_store_close(st), 0);
}

static void auto_placement_and_props(void **state)
{
    (void)state;
    lms_device_props pr;
    assert_int_equal(g_dev->ops->props(g_dev, &pr), 0);
    print_message("device %s: %llu MB total, %llu MB free, cc %d.%d, register %d, readonly %d, map %d, "
                  "host ptr usable %d, pageable access %d, integrated %d\n",
                  pr.name, (unsigned long long)(pr.total_mem >> 20), (unsigned long long)(pr.free_mem >> 20),
                  pr.compute_major, pr.compute_minor, pr.can_register_host, pr.can_register_readonly,
                  pr.can_map_host, pr.host_ptr_is_device_ptr, pr.pageable_access, pr.unified_memory);
    lms_store *st = NULL;
    assert_int_equal(lms_store_open(g_store, LMS_STORE_RDONLY, NULL, &st), 0);
    lms_model_params p = lms_model_default_params();
    p.device = g_dev;
    p.sync = true;
    lms_model *m = NULL;
    assert_int_equal(lms_model_open(st, "m", &p, &m), 0);
    assert_int_equal(lms_model_placement(m), pr.unified_memory ? LMS_PLACE_MAPPED : LMS_PLACE_RESIDENT);
    assert_true(lms_model_layer_ready(m, LMS_LAYER_ALL));
    assert_int_equal(check_device_bytes(m), 0);
    lms_model_close(m);
    assert_int_equal(lms_store_close(st), 0);
}

/* lms_device_get_info names the GPU; placement AUTO keeps the model
 * resident while it fits beside the caller's reserve, and maps it when the
 * reserve leaves too little (the device then reads the weights in place). */
static void auto_placement_weighs_free_memory_against_the_reserve(void **state)
{
    (void)state;
    lms_device_info di;
    assert_int_equal(lms_device_get_info(g_dev, &di), 0);
    print_message("device info: %s, %llu MB total, %llu MB free, cc %d.%d, unified %d\n", di.name,
                  (unsigned long long)(di.total_mem >> 20), (unsigned long long)(di.free_mem >> 20), di.compute_major,
                  di.compute_minor, di.unified_memory);
    assert_int_equal(di.kind, LMS_DEVICE_CUDA);
    assert_int_equal(di.ordinal, 0);
    assert_memory_equal(di.name, "cuda:0 (", 8);
    assert_true(di.free_mem > 0 && di.free_mem <= di.total_mem);
    assert_true(di.compute_major >= 3);
    if (di.unified_memory) {
        print_message("unified memory: AUTO maps whatever fits; nothing to weigh\n");
        return;
    }
    lms_store *st = NULL;
    assert_int_equal(lms_store_open(g_store, LMS_STORE_RDONLY, NULL, &st), 0);
    for (int k = 0; k < 2; k++) {
        lms_model_params p = lms_model_default_params();
        p.device = g_dev;
        p.sync = true;
        p.device_reserve_bytes = k ? di.free_mem : 0; /* k = 1: the caller wants all that is free */
        lms_model *m = NULL;
        assert_int_equal(lms_model_open(st, "m", &p, &m), 0);
        lms_model_stats s;
        assert_int_equal(lms_model_stats_get(m, &s), 0);
        print_message("reserve %llu MB: %s, need %llu MB of %llu MB free\n",
                      (unsigned long long)(p.device_reserve_bytes >> 20), k ? "mapped" : "resident",
                      (unsigned long long)(s.device_need_bytes >> 20), (unsigned long long)(s.device_free_bytes >> 20));
        assert_int_equal(lms_model_placement(m), k ? LMS_PLACE_MAPPED : LMS_PLACE_RESIDENT);
        assert_true(k ? s.device_need_bytes > s.device_free_bytes : s.device_need_bytes <= s.device_free_bytes);
        assert_true(s.device_need_bytes > s.tensor_bytes);
        assert_int_equal(check_device_bytes(m), 0);
        lms_model_close(m);
    }
    assert_int_equal(lms_store_close(st), 0);
}

int main(void)
{
    int rc = lms_device_open(LMS_DEVICE_CUDA, 0, &g_dev);
    if (rc) {
        fprintf(stderr, "no CUDA device (%s): skipped\n", lms_last_error());
        return LMS_TEST_SKIP;
    }
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(auto_placement_and_props),
        cmocka_unit_test(auto_placement_weighs_free_memory_against_the_reserve),
        cmocka_unit_test(resident_registered_device_bytes_equal_host),
        cmocka_unit_test(resident_staging_ring_device_bytes_equal_host),
        cmocka_unit_test(resident_reserved_ring_device_bytes_equal_host),
        cmocka_unit_test(resident_parallel_readers_device_bytes_equal_host),
        cmocka_unit_test(resident_split_device_bytes_equal_host),
        cmocka_unit_test(refused_registration_falls_back_to_staging),
        cmocka_unit_test(mapped_device_reads_the_mapping_in_place),
    };
    rc = cmocka_run_group_tests(tests, setup_all, teardown_all);
    lms_device_close(g_dev);
    return rc;
}
