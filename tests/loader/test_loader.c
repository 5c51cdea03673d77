/*
 * tests/loader/test_loader.c - the loader on the CPU: tensor views equal the
 * bytes the generator wrote into the source safetensors; lookups, side files
 * and ids; open touches no data page; one mapping per segment per store
 * handle, locked against gc; verification names a corrupt tensor; the store
 * refuses to close under an open model; the resident pipeline (direct,
 * staging ring, parallel readers) run on the CPU device copies every byte;
 * the registered paths (with a CPU device that tracks pins like CUDA) pin
 * each block once, share blocks between models, unpin before unmapping, and
 * fall back to the staging ring when pinning is refused; placement AUTO on
 * that device posing as a discrete GPU is resident while the model fits
 * beside the reserve and mapped when not; device info and the errors of a
 * missing CUDA device; a broken precondition stops at an assertion;
 * a segment that grew after it was mapped gets a second mapping; opens and
 * closes from several threads at once; failed opens (every allocation
 * failing in turn) leave nothing behind.
 */
#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "common/common.h"
#include "loader/device.h"
#include "loader/loader_internal.h"
#include "store/store_internal.h" /* white-box: the store handle's user count */
#include "testutil.h"

#include "loader_smaps.h"
#include "loader_testmodel.h"

/* One store with one small model, made once for the whole file. */
static char *g_dir, g_store[1024];
static tm_model g_m;

static int setup_all(void **state)
{
    (void)state;
    g_dir = lms_test_tmpdir("loader");
    if (!g_dir)
        return -1;
    char src[1100];
    snprintf(src, sizeof src, "%s/src", g_dir);
    snprintf(g_store, sizeof g_store, "%s/store", g_dir);
    if (mkdir(src, 0755))
        return -1;
    /* 4 blocks; the MLP matrices are 2.25 MiB so 2 MiB chunks split them */
    tm_llama(&g_m, 4, 1000, 256, 4608);
    int rc = tm_import(&g_m, src, g_store, "tiny", false);
    if (rc)
        fprintf(stderr, "import failed: %s\n", lms_last_error());
    return rc ? -1 : 0;
}

static int teardown_all(void **state)
{
    (void)state;
    lms_test_rmrf(g_dir);
    free(g_dir);
    return 0;
}

static lms_store *open_store(void)
{
    lms_store *st = NULL;
    assert_int_equal(lms_store_open(g_store, LMS_STORE_RDONLY, NULL, &st), 0);
    return st;
}

static void check_bytes_equal_source(const lms_model *m, bool device)
{
    assert_int_equal(lms_model_tensor_count(m), (size_t)g_m.n);
    for (size_t i = 0; i < lms_model_tensor_count(m); i++) {
        const lms_tensor *t = lms_model_tensor_at(m, i);
        const tm_tensor *ref = tm_find(&g_m, t->name);
        assert_non_null(ref);
        assert_int_equal(t->nbytes, ref->nbytes);
        uint8_t *want = tm_expected(ref, false);
        const void *got = device ? t->device : t->host;
        assert_non_null(got);
        if (memcmp(got, want, ref->nbytes) != 0)
            fail_msg("tensor %s: %s bytes differ from the source", t->name, device ? "device" : "host");
        free(want);
    }
}

static void views_equal_source_bytes_shapes_and_layers(void **state)
{
    (void)state;
    lms_store *st = open_store();
    lms_model *m = NULL;
    assert_int_equal(lms_model_open(st, "tiny", NULL, &m), 0);
    assert_int_equal(lms_model_placement(m), LMS_PLACE_HOST);
    check_bytes_equal_source(m, false);
    int32_t prev = INT32_MIN;
    for (size_t i = 0; i < lms_model_tensor_count(m); i++) {
        const lms_tensor *t = lms_model_tensor_at(m, i);
        const tm_tensor *ref = tm_find(&g_m, t->name);
        assert_int_equal(t->ndim, (uint32_t)ref->ndim);
        for (int d = 0; d < ref->ndim; d++)
            assert_int_equal(t->shape[d], ref->shape[d]);
        assert_string_equal(lms_dtype_name(t->dtype), ref->dtype);
        assert_null(t->device);
        assert_int_equal((uintptr_t)t->host % lms_store_alignment(st), 0);
        /* storage order is forward-pass order */
        assert_true(t->layer >= prev);
        prev = t->layer;
        int layer = -5;
        if (!strncmp(t->name, "model.layers.", 13))
            layer = atoi(t->name + 13);
        else if (!strcmp(t->name, "model.embed_tokens.weight"))
            layer = LMS_LAYER_PRE;
        else
            layer = LMS_LAYER_POST;
        assert_int_equal(t->layer, layer);
    }
    assert_null(lms_model_tensor_at(m, lms_model_tensor_count(m)));
    assert_int_equal(lms_model_n_layers(m), 4);
    assert_string_equal(lms_model_name(m), "tiny");
    lms_model_close(m);
    assert_int_equal(lms_store_close(st), 0);
}

static int id_cb(void *ctx, const lms_model_info *info)
{
    memcpy(ctx, info->id, LMS_MODEL_ID_LEN);
    return 0;
}

static void lookups_files_and_ids(void **state)
{
    (void)state;
    lms_store *st = open_store();
    lms_model *m = NULL;
    assert_int_equal(lms_model_open(st, "tiny", NULL, &m), 0);
    const lms_tensor *t = lms_model_tensor(m, "model.layers.2.mlp.up_proj.weight");
    assert_non_null(t);
    assert_string_equal(t->name, "model.layers.2.mlp.up_proj.weight");
    assert_int_equal(t->layer, 2);
    assert_null(lms_model_tensor(m, "model.layers.9.nope"));
    assert_int_equal(lms_last_error_code(), LMS_ENOENT);
    assert_non_null(strstr(lms_last_error(), "tiny"));
    assert_non_null(strstr(lms_last_error(), "model.layers.9.nope"));

    void *data = NULL;
    size_t len = 0;
    assert_int_equal(lms_model_file(m, "config.json", &data, &len), 0);
    assert_non_null(strstr(data, "LlamaForCausalLM"));
    assert_int_equal(strlen(data), len);
    lms_free(data);
    assert_int_equal(lms_model_file(m, "nonexistent.json", &data, &len), LMS_ENOENT);

    uint8_t id[LMS_MODEL_ID_LEN];
    assert_int_equal(lms_store_model(st, "tiny", id_cb, id), 0);
    assert_memory_equal(lms_model_id(m), id, LMS_MODEL_ID_LEN);
    lms_model_close(m);

    assert_int_equal(lms_model_open(st, "no-such-model", NULL, &m), LMS_ENOENT);
    assert_null(m);
    assert_non_null(strstr(lms_last_error(), "no-such-model"));
    lms_model_params p = lms_model_default_params();
    p.placement = LMS_PLACE_RESIDENT; /* needs a device */
    assert_int_equal(lms_model_open(st, "tiny", &p, &m), LMS_EINVAL);
    lms_model_tuning tu = {0};
    p = lms_model_default_params();
    p.tuning = &tu;
    tu.streams = -1;
    assert_int_equal(lms_model_open(st, "tiny", &p, &m), LMS_EINVAL);
    assert_int_equal(lms_store_close(st), 0);
}

static void store_close_with_open_model_returns_ebusy(void **state)
{
    (void)state;
    lms_store *st = open_store();
    lms_model *m = NULL, *m2 = NULL;
    assert_int_equal(lms_model_open(st, "tiny", NULL, &m), 0);
    assert_int_equal(lms_model_open(st, "tiny", NULL, &m2), 0);
    assert_int_equal(lms_store_close(st), LMS_EBUSY);
    /* the store and the views still work */
    check_bytes_equal_source(m, false);
    lms_model_close(m);
    assert_int_equal(lms_store_close(st), LMS_EBUSY);
    lms_model_close(m2);
    assert_int_equal(lms_store_close(st), 0);
}

static void open_touches_no_data_page_until_populate(void **state)
{
    (void)state;
    lms_store *st = open_store();
    lms_model *m = NULL;
    seg_usage u;
    uint64_t total = 0;
    assert_int_equal(lms_model_open(st, "tiny", NULL, &m), 0);
    for (size_t i = 0; i < lms_model_tensor_count(m); i++)
        total += lms_model_tensor_at(m, i)->nbytes;
    assert_int_equal(seg_usage_read(getpid(), g_store, &u), 0);
    assert_true(u.mappings >= 1);
    assert_true(u.size >= total);
    /* the segment header page, plus what the kernel maps next to it from the
     * page cache (fault-around: 64 KiB; a large folio: up to 2 MiB), never
     * the data */
    assert_true(u.rss <= (unsigned long long)u.mappings * (2 << 20));
    assert_true(total > 10 * (2 << 20));
    lms_model_close(m);

    lms_model_params p = lms_model_default_params();
    p.prefetch = LMS_PREFETCH_POPULATE;
    assert_int_equal(lms_model_open(st, "tiny", &p, &m), 0);
    assert_int_equal(seg_usage_read(getpid(), g_store, &u), 0);
    assert_true(u.rss >= total);
    assert_int_equal(u.anonymous, 0);
    assert_int_equal(u.private_dirty, 0);
    lms_model_close(m);
    p.prefetch = LMS_PREFETCH_WILLNEED;
    assert_int_equal(lms_model_open(st, "tiny", &p, &m), 0);
    lms_model_close(m);
    /* after the last model closes, nothing stays mapped */
    assert_int_equal(seg_usage_read(getpid(), g_store, &u), 0);
    assert_int_equal(u.mappings, 0);
    assert_int_equal(lms_store_close(st), 0);
}

static void segments_are_mapped_once_per_store_and_locked_against_gc(void **state)
{
    (void)state;
    lms_store *st = open_store();
    lms_model *a = NULL, *b = NULL;
    assert_int_equal(lms_model_open(st, "tiny", NULL, &a), 0);
    assert_int_equal(lms_model_open(st, "tiny", NULL, &b), 0);
    const lms_tensor *ta = lms_model_tensor(a, "lm_head.weight"), *tb = lms_model_tensor(b, "lm_head.weight");
    assert_ptr_equal(ta->host, tb->host); /* the same mapping */
    seg_usage u;
    assert_int_equal(seg_usage_read(getpid(), g_store, &u), 0);
    char seg[1100];
    assert_int_equal(lms_store_segment_path(st, a->ti[0].segment, seg, sizeof seg), 0);
    int segs_used = 0;
    for (size_t i = 0; i < a->nmaps; i++)
        segs_used++;
    assert_int_equal(u.mappings, segs_used);

    /* gc's test: LOCK_EX|LOCK_NB on the segment fails while it is mapped */
    int fd = open(seg, O_RDONLY);
    assert_true(fd >= 0);
    assert_int_equal(flock(fd, LOCK_EX | LOCK_NB), -1);
    assert_int_equal(errno, EWOULDBLOCK);
    lms_model_close(a);
    assert_int_equal(flock(fd, LOCK_EX | LOCK_NB), -1); /* b still holds it */
    lms_model_close(b);
    assert_int_equal(flock(fd, LOCK_EX | LOCK_NB), 0);
    close(fd);
    assert_int_equal(lms_store_close(st), 0);
}

typedef struct recpos {
    const char *want;
    uint32_t seg;
    uint64_t off;
} recpos;

static int find_rec(void *ctx, const lms_tensor_record *r)
{
    recpos *p = ctx;
    if (!strcmp(r->name, p->want)) {
        p->seg = r->segment;
        p->off = r->offset;
    }
    return 0;
}

static void verify_names_the_corrupt_tensor(void **state)
{
    (void)state;
    /* a private copy of the store, so the corruption stays here */
    char dir2[1200], src[1200];
    snprintf(dir2, sizeof dir2, "%s/corrupt", g_dir);
    snprintf(src, sizeof src, "%s/src", g_dir);
    lms_store *st = NULL;
    assert_int_equal(lms_store_open(dir2, LMS_STORE_CREATE, NULL, &st), 0);
    lms_import_params ip = lms_import_default_params();
    ip.name = "tiny";
    assert_int_equal(lms_import(st, src, &ip, NULL), 0);
    lms_model *m = NULL;
    lms_model_params p = lms_model_default_params();
    p.verify = true;
    assert_int_equal(lms_model_open(st, "tiny", &p, &m), 0);
    lms_model_close(m);

    recpos rp = {.want = "model.layers.3.mlp.down_proj.weight"};
    assert_int_equal(lms_store_tensors(st, "tiny", find_rec, &rp), 0);
    char seg[1300];
    assert_int_equal(lms_store_segment_path(st, rp.seg, seg, sizeof seg), 0);
    int fd = open(seg, O_RDWR);
    assert_true(fd >= 0);
    uint8_t byte;
    assert_int_equal(pread(fd, &byte, 1, (off_t)(rp.off + 1000)), 1);
    byte ^= 0x10;
    assert_int_equal(pwrite(fd, &byte, 1, (off_t)(rp.off + 1000)), 1);
    close(fd);

    assert_int_equal(lms_model_open(st, "tiny", &p, &m), LMS_ECORRUPT);
    assert_null(m);
    assert_non_null(strstr(lms_last_error(), "model.layers.3.mlp.down_proj.weight"));
    /* without verification the open succeeds (the bytes are read as they are) */
    assert_int_equal(lms_model_open(st, "tiny", NULL, &m), 0);
    lms_model_close(m);
    assert_int_equal(lms_store_close(st), 0);
}

static void run_resident_cpu(bool staging, bool readers, lms_load_order order, int threads)
{
    lms_store *st = open_store();
    lms_device *dev = NULL;
    assert_int_equal(lms_device_open(LMS_DEVICE_CPU, 0, &dev), 0);
    lms_model_tuning t = {0};
    lms_model_params p = lms_model_default_params();
    p.device = dev;
    p.placement = LMS_PLACE_RESIDENT;
    p.tuning = &t;
    t.copy = readers ? LMS_COPY_STAGE_DIRECT : staging ? LMS_COPY_STAGE_MAP : LMS_COPY_AUTO;
    t.order = order;
    p.threads = threads;
    t.streams = 3;
    t.chunk_bytes = 1; /* rounds up to 2 MiB: the MLP matrices span chunks */
    t.ring_slots = 2;
    lms_model *m = NULL;
    assert_int_equal(lms_model_open(st, "tiny", &p, &m), 0);
    assert_int_equal(lms_model_placement(m), LMS_PLACE_RESIDENT);
    /* layers in an arbitrary order, each wait returning only once it is there */
    for (int l = lms_model_n_layers(m) - 1; l >= 0; l--) {
        assert_int_equal(lms_model_wait_layer(m, l), 0);
        assert_true(lms_model_layer_ready(m, l));
        for (size_t i = 0; i < lms_model_tensor_count(m); i++) {
            const lms_tensor *t = lms_model_tensor_at(m, i);
            if (t->layer == l)
                assert_memory_equal(t->device, t->host, t->nbytes);
        }
    }
    assert_int_equal(lms_model_wait_layer(m, LMS_LAYER_ALL), 0);
    assert_int_equal(lms_model_wait_layer(m, 99), LMS_EINVAL);
    check_bytes_equal_source(m, true);
    lms_model_stats s;
    assert_int_equal(lms_model_stats_get(m, &s), 0);
    assert_true(s.copied_bytes >= s.tensor_bytes); /* alignment padding inside extents is copied too */
    assert_true(s.copied_bytes <= s.tensor_bytes + (uint64_t)lms_model_tensor_count(m) * lms_store_alignment(st));
    assert_true(s.device_bytes >= s.tensor_bytes);
    assert_int_equal(s.staging, staging || readers);
    assert_int_equal(s.readers, readers);
    for (size_t i = 0; i < lms_model_tensor_count(m); i++) {
        const lms_tensor *t = lms_model_tensor_at(m, i);
        assert_true((uint8_t *)t->device != (const uint8_t *)t->host); /* a copy, not the mapping */
    }
    lms_model_close(m);
    lms_device_close(dev);
    assert_int_equal(lms_store_close(st), 0);
}

static void resident_on_cpu_device_direct_copies_every_byte(void **state)
{
    (void)state;
    run_resident_cpu(false, false, LMS_ORDER_BLOCKS_FIRST, 2);
    run_resident_cpu(false, false, LMS_ORDER_FILE, 1);
}

static void resident_staging_ring_copies_every_byte(void **state)
{
    (void)state;
    run_resident_cpu(true, false, LMS_ORDER_BLOCKS_FIRST, 3);
    run_resident_cpu(true, false, LMS_ORDER_FILE, 1);
}

static void resident_parallel_readers_copy_every_byte(void **state)
{
    (void)state;
    run_resident_cpu(false, true, LMS_ORDER_BLOCKS_FIRST, 4);
    run_resident_cpu(false, true, LMS_ORDER_FILE, 1);
}

static void mapped_on_cpu_device_points_at_the_mapping(void **state)
{
    (void)state;
    lms_store *st = open_store();
    lms_device *dev = NULL;
    assert_int_equal(lms_device_open_name("cpu", &dev), 0);
    lms_model_params p = lms_model_default_params();
    p.device = dev;
    p.placement = LMS_PLACE_MAPPED;
    lms_model *m = NULL;
    assert_int_equal(lms_model_open(st, "tiny", &p, &m), 0);
    for (size_t i = 0; i < lms_model_tensor_count(m); i++)
        assert_ptr_equal(lms_model_tensor_at(m, i)->device, lms_model_tensor_at(m, i)->host);
    assert_int_equal(lms_model_wait_layer(m, 0), 0);
    assert_ptr_equal(lms_model_device(m), dev);
    lms_model_close(m);
    lms_device_close(dev);
    assert_int_equal(lms_device_open_name("gpu", &dev), LMS_EINVAL);
    assert_int_equal(lms_device_open_name("cuda:x", &dev), LMS_EINVAL);
    assert_int_equal(lms_store_close(st), 0);
}


static void device_info_describes_the_cpu_and_its_memory(void **state)
{
    (void)state;
    lms_device *dev = NULL;
    lms_device_info di;
    assert_int_equal(lms_device_open_name("cpu", &dev), 0);
    assert_int_equal(lms_device_get_info(dev, &di), 0);
    assert_int_equal(di.kind, LMS_DEVICE_CPU);
    assert_int_equal(di.ordinal, 0);
    assert_string_equal(di.name, "cpu");
    assert_true(di.unified_memory);
    /* the machine's memory, as sysconf counts it */
    uint64_t phys = (uint64_t)sysconf(_SC_PHYS_PAGES) * (uint64_t)sysconf(_SC_PAGESIZE);
    assert_int_equal(di.total_mem, phys);
    assert_true(di.free_mem > 0 && di.free_mem <= di.total_mem);
    assert_int_equal(di.compute_major, 0);
    assert_int_equal(lms_device_get_info(NULL, &di), LMS_EINVAL);
    assert_int_equal(lms_device_get_info(dev, NULL), LMS_EINVAL);
    lms_device_close(dev);
    assert_true(lms_device_available(LMS_DEVICE_CPU));
    assert_int_equal(lms_device_open((lms_device_kind)7, 0, &dev), LMS_EINVAL);
    assert_null(dev);
}

/* "cuda:N" past the devices present: LMS_EDEVICE saying "no CUDA device"
 * (also on a machine without a GPU); a build without CUDA: LMS_EUNSUPPORTED.
 * The CLI turns either into exit status 1 with that message. */
static void opening_a_missing_cuda_device_fails_clearly(void **state)
{
    (void)state;
    bool cuda = lms_device_available(LMS_DEVICE_CUDA);
    const char *want = cuda ? "no CUDA device" : "without CUDA";
    lms_device *dev = (lms_device *)&dev;
    int rc = lms_device_open_name("cuda:1000", &dev);
    assert_int_equal(rc, cuda ? LMS_EDEVICE : LMS_EUNSUPPORTED);
    assert_null(dev);
    assert_non_null(strstr(lms_last_error(), want));
    assert_non_null(strstr(lms_last_error(), "cuda:1000"));
    rc = lms_device_open_name("cuda", &dev); /* succeeds on a GPU host */
    if (rc == 0) {
        lms_device_info di;
        assert_int_equal(lms_device_get_info(dev, &di), 0);
        assert_non_null(strstr(di.name, "cuda:0 ("));
        lms_device_close(dev);
    } else {
        assert_int_equal(rc, cuda ? LMS_EDEVICE : LMS_EUNSUPPORTED);
        assert_non_null(strstr(lms_last_error(), want));
    }
    char *out = NULL;
    rc = lms_test_sh(&out, "'%s' bench load tiny --store '%s' --device cuda:1000", lms_test_bin(), g_store);
    assert_int_equal(rc, 1);
    assert_non_null(out);
    if (!strstr(out, want))
        fail_msg("bench load --device cuda:1000 said: %s", out);
    free(out);
}


/* ---- a CPU device that "pins" like CUDA does: registrations are tracked,
 * overlapping ones are refused (cudaErrorHostMemoryAlreadyRegistered), and
 * unregistering an unknown base fails, so the registered paths run here. */
typedef struct pin {
    uintptr_t base;
    size_t len;
} pin;
static pin g_pins[4096];
static int g_npins, g_pin_calls, g_unpin_calls, g_pin_errors;
static lms_device_ops g_pin_ops;
static pthread_mutex_t g_pin_mu = PTHREAD_MUTEX_INITIALIZER; /* workers pin ring slots in parallel */
/* ring slots (pinned with no flags) pinned so far, and for each host-to-device
 * copy in issue order: its destination and that count when it was issued */
static int g_ring_pins;
static struct {
    uintptr_t dst, src;
    int ring_pins;
} g_copies[8192];
static int g_ncopies;
static int (*g_cpu_copy_h2d)(lms_device *, void *, const void *, size_t, lms_stream *);

/* true when [a, a+n) lies in one writable mapping of this process (as the
 * driver sees it: a read-only mapping cannot be pinned for writing) */
static bool range_writable(uintptr_t a, size_t n)
{
    FILE *f = fopen("/proc/self/maps", "r");
    char line[512];
    bool ok = false;
    if (!f)
        return false;
    while (fgets(line, sizeof line, f)) {
        unsigned long lo, hi;
        char perms[8];
        if (sscanf(line, "%lx-%lx %7s", &lo, &hi, perms) == 3 && a >= lo && a + n <= hi) {
            ok = perms[1] == 'w';
            break;
        }
    }
    fclose(f);
    return ok;
}

static int pin_register(lms_device *dev, void *host, size_t bytes, unsigned flags, void **dev_ptr)
{
    (void)dev;
    uintptr_t a = (uintptr_t)host;
    int rc = 0;
    *dev_ptr = NULL;
    pthread_mutex_lock(&g_pin_mu);
    g_pin_calls++;
    if (!(flags & LMS_REG_READONLY) && !range_writable(a, bytes)) {
        rc = lms__err(LMS_EDEVICE, "fake pin: read-only mapping pinned without READONLY");
        goto out;
    }
    for (int i = 0; i < g_npins; i++)
        if (a < g_pins[i].base + g_pins[i].len && g_pins[i].base < a + bytes) {
            g_pin_errors++;
            rc = lms__err(LMS_EDEVICE, "fake pin: already registered");
            goto out;
        }
    if (g_npins == (int)LMS_ARRAY_LEN(g_pins)) {
        rc = lms__err(LMS_EDEVICE, "fake pin: table full");
        goto out;
    }
    g_pins[g_npins++] = (pin){a, bytes};
    if (flags == 0)
        g_ring_pins++;
    if (flags & LMS_REG_MAPPED)
        *dev_ptr = host;
out:
    pthread_mutex_unlock(&g_pin_mu);
    return rc;
}

static int pin_copy_h2d(lms_device *dev, void *dst, const void *src, size_t n, lms_stream *s)
{
    pthread_mutex_lock(&g_pin_mu);
    if (g_ncopies < (int)LMS_ARRAY_LEN(g_copies)) {
        g_copies[g_ncopies].dst = (uintptr_t)dst;
        g_copies[g_ncopies].src = (uintptr_t)src;
        g_copies[g_ncopies++].ring_pins = g_ring_pins;
    }
    pthread_mutex_unlock(&g_pin_mu);
    return g_cpu_copy_h2d(dev, dst, src, n, s);
}

static int pin_unregister(lms_device *dev, void *host)
{
    (void)dev;
    pthread_mutex_lock(&g_pin_mu);
    g_unpin_calls++;
    for (int i = 0; i < g_npins; i++)
        if (g_pins[i].base == (uintptr_t)host) {
            g_pins[i] = g_pins[--g_npins];
            pthread_mutex_unlock(&g_pin_mu);
            return 0;
        }
    g_pin_errors++;
    pthread_mutex_unlock(&g_pin_mu);
    return lms__err(LMS_EDEVICE, "fake pin: %p not registered", host);
}

static lms_device *open_pin_device(void)
{
    lms_device *dev = NULL;
    assert_int_equal(lms_device_open(LMS_DEVICE_CPU, 0, &dev), 0);
    g_pin_ops = *dev->ops;
    g_pin_ops.name = "fakepin";
    g_pin_ops.host_register = pin_register;
    g_pin_ops.host_unregister = pin_unregister;
    g_cpu_copy_h2d = dev->ops->copy_h2d;
    g_pin_ops.copy_h2d = pin_copy_h2d;
    dev->ops = &g_pin_ops;
    g_npins = g_pin_calls = g_unpin_calls = g_pin_errors = g_ring_pins = g_ncopies = 0;
    return dev;
}

static void registered_paths_pin_once_share_blocks_and_unpin_before_unmap(void **state)
{
    (void)state;
    lms_store *st = open_store();
    lms_device *dev = open_pin_device();
    lms_model_tuning t = {0};
    lms_model_params p = lms_model_default_params();
    p.device = dev;
    p.tuning = &t;
    t.chunk_bytes = 2 << 20;
    t.no_readers = true;
    p.placement = LMS_PLACE_MAPPED;
    lms_model *a = NULL, *b = NULL, *c = NULL;
    assert_int_equal(lms_model_open(st, "tiny", &p, &a), 0);
    int pins_a = g_npins;
    assert_true(pins_a > 2);
    for (size_t i = 0; i < lms_model_tensor_count(a); i++)
        assert_ptr_equal(lms_model_tensor_at(a, i)->device, lms_model_tensor_at(a, i)->host);
    t.chunk_bytes = 0; /* another grid asked: the first one stays in effect */
    assert_int_equal(lms_model_open(st, "tiny", &p, &b), 0);
    assert_int_equal(g_npins, pins_a); /* b shares a's blocks */
    p.placement = LMS_PLACE_RESIDENT;
    t.copy = LMS_COPY_REGISTER;
    p.threads = 3;
    assert_int_equal(lms_model_open(st, "tiny", &p, &c), 0);
    assert_int_equal(lms_model_wait_layer(c, LMS_LAYER_ALL), 0);
    lms_model_stats s;
    assert_int_equal(lms_model_stats_get(c, &s), 0);
    assert_false(s.staging);
    check_bytes_equal_source(c, true);
    lms_model_close(c);
    assert_int_equal(g_npins, pins_a); /* the resident load released only its own references */
    lms_model_close(a);
    assert_int_equal(g_npins, pins_a);
    lms_model_close(b);
    assert_int_equal(g_npins, 0); /* everything unpinned when the last user went */
    assert_int_equal(g_pin_errors, 0);

    /* resident alone: pins while copying, none left once all is resident */
    assert_int_equal(lms_model_open(st, "tiny", &p, &c), 0);
    assert_int_equal(lms_model_wait_layer(c, LMS_LAYER_ALL), 0);
    check_bytes_equal_source(c, true);
    lms_model_close(c);
    assert_int_equal(g_npins, 0);
    assert_int_equal(g_pin_errors, 0);
    assert_int_equal(g_pin_calls, g_unpin_calls);

    /* refused registration: the staging ring takes over */
    atomic_store(&lms__loader_test_refuse, LMS__REFUSE_SIMULATED);
    assert_int_equal(lms_model_open(st, "tiny", &p, &c), 0);
    atomic_store(&lms__loader_test_refuse, LMS__REFUSE_NONE);
    assert_int_equal(lms_model_wait_layer(c, LMS_LAYER_ALL), 0);
    assert_int_equal(lms_model_stats_get(c, &s), 0);
    assert_true(s.staging);
    assert_int_equal(s.registered_bytes, 0);
    check_bytes_equal_source(c, true);
    lms_model_close(c);
    /* a real refusal from the "driver" (pinning without READONLY) */
    atomic_store(&lms__loader_test_refuse, LMS__REFUSE_DROP_READONLY);
    assert_int_equal(lms_model_open(st, "tiny", &p, &c), 0);
    atomic_store(&lms__loader_test_refuse, LMS__REFUSE_NONE);
    assert_int_equal(lms_model_wait_layer(c, LMS_LAYER_ALL), 0);
    assert_int_equal(lms_model_stats_get(c, &s), 0);
    assert_true(s.staging);
    check_bytes_equal_source(c, true);
    lms_model_close(c);
    /* AUTO on a device that pins, page cache warm: the staging ring filled by reads */
    t.copy = LMS_COPY_AUTO;
    assert_int_equal(lms_model_open(st, "tiny", &p, &c), 0);
    assert_int_equal(lms_model_wait_layer(c, LMS_LAYER_ALL), 0);
    assert_int_equal(lms_model_stats_get(c, &s), 0);
    assert_true(s.staging && s.readers && !s.direct_io);
    check_bytes_equal_source(c, true);
    lms_model_close(c);
    /* every copy source asked for explicitly */
    for (int src = LMS_COPY_REGISTER; src <= LMS_COPY_SPLIT; src++) {
        t.copy = (lms_copy_source)src;
        t.chunk_bytes = src == LMS_COPY_SPLIT ? 2 << 20 : 0; /* SPLIT: several blocks, some of each kind */
        int pin_calls = g_pin_calls;
        assert_int_equal(lms_model_open(st, "tiny", &p, &c), 0);
        assert_int_equal(lms_model_wait_layer(c, LMS_LAYER_ALL), 0);
        assert_int_equal(lms_model_stats_get(c, &s), 0);
        assert_int_equal(s.staging, src != LMS_COPY_REGISTER);
        assert_int_equal(s.readers, src == LMS_COPY_STAGE_READ || src == LMS_COPY_STAGE_DIRECT ||
                                        src == LMS_COPY_SPLIT);
        assert_int_equal(s.registered_bytes != 0, src == LMS_COPY_REGISTER || src == LMS_COPY_SPLIT);
        if (src == LMS_COPY_SPLIT) /* about half the blocks pinned in place, the rest staged */
            assert_true(s.registered_bytes > s.tensor_bytes / 4 && s.registered_bytes < s.tensor_bytes * 3 / 4);
        /* ring slots are host memory pinned through the device (fake pins here) */
        if (src != LMS_COPY_REGISTER)
            assert_true(g_pin_calls > pin_calls);
        check_bytes_equal_source(c, true);
        lms_model_close(c);
        assert_int_equal(g_npins, 0); /* slots and blocks unpinned at close */
    }
    assert_int_equal(g_npins, 0);
    /* the ring from the device's pinned allocator instead: no pin calls for it */
    t.copy = LMS_COPY_STAGE_READ;
    t.ring_host_alloc = true;
    {
        int pin_calls = g_pin_calls;
        assert_int_equal(lms_model_open(st, "tiny", &p, &c), 0);
        assert_int_equal(lms_model_wait_layer(c, LMS_LAYER_ALL), 0);
        check_bytes_equal_source(c, true);
        lms_model_close(c);
        assert_int_equal(g_pin_calls, pin_calls);
    }
    t.ring_host_alloc = false;
    /* mapped placement refused: an error naming the segment, nothing held */
    p.placement = LMS_PLACE_MAPPED;
    atomic_store(&lms__loader_test_refuse, LMS__REFUSE_SIMULATED);
    assert_int_equal(lms_model_open(st, "tiny", &p, &c), LMS_EDEVICE);
    atomic_store(&lms__loader_test_refuse, LMS__REFUSE_NONE);
    assert_null(c);
    assert_non_null(strstr(lms_last_error(), ".seg"));
    assert_int_equal(g_npins, 0);
    lms_device_close(dev);
    assert_int_equal(lms_store_close(st), 0);
}

/* ---- placement AUTO on a discrete GPU: the pin device, calling itself CUDA,
 * reports the memory below. */
static uint64_t g_fake_total, g_fake_free;
static bool g_fake_unified;

static int fake_gpu_props(lms_device *dev, lms_device_props *out)
{
    (void)dev;
    memset(out, 0, sizeof *out);
    strcpy(out->name, "Fake GPU");
    out->total_mem = g_fake_total;
    out->free_mem = g_fake_free;
    out->unified_memory = g_fake_unified;
    out->can_register_host = out->can_register_readonly = out->can_map_host = true;
    return 0;
}

/* Open "tiny" with AUTO placement (and `reserve`) on the fake GPU whose
 * free memory is `free`; returns the model, its stats in *s. */
static lms_model *open_auto(lms_store *st, lms_device *dev, uint64_t free, uint64_t reserve, lms_model_stats *s)
{
    g_fake_free = free;
    lms_model_params p = lms_model_default_params();
    p.device = dev;
    p.device_reserve_bytes = reserve;
    p.sync = true;
    lms_model *m = NULL;
    if (lms_model_open(st, "tiny", &p, &m))
        fail_msg("open: %s", lms_last_error());
    assert_int_equal(lms_model_stats_get(m, s), 0);
    assert_int_equal(s->placement, lms_model_placement(m));
    return m;
}

static void auto_placement_is_resident_when_the_model_fits_and_mapped_when_not(void **state)
{
    (void)state;
    lms_store *st = open_store();
    lms_device *dev = open_pin_device();
    dev->kind = LMS_DEVICE_CUDA; /* a discrete GPU, as far as the loader can tell */
    g_pin_ops.props = fake_gpu_props;
    g_fake_total = 16ull << 30;
    g_fake_unified = false;
    const uint64_t margin = 256ull << 20, reserve = 512ull << 20; /* the documented defaults */
    lms_device_info di;
    assert_int_equal(lms_device_get_info(dev, &di), 0);
    assert_string_equal(di.name, "fakepin:0 (Fake GPU)");

    /* plenty free: resident, and the need is arena + default reserve + margin */
    lms_model_stats s;
    lms_model *m = open_auto(st, dev, 8ull << 30, 0, &s);
    assert_int_equal(s.placement, LMS_PLACE_RESIDENT);
    assert_true(s.device_bytes >= s.tensor_bytes);
    assert_int_equal(s.device_need_bytes, s.device_bytes + reserve + margin);
    assert_int_equal(s.device_free_bytes, 8ull << 30);
    check_bytes_equal_source(m, true);
    uint64_t need = s.device_need_bytes, arena = s.device_bytes;
    lms_model_close(m);

    /* exactly enough: still resident; one byte less: mapped, reading the mapping in place */
    m = open_auto(st, dev, need, 0, &s);
    assert_int_equal(s.placement, LMS_PLACE_RESIDENT);
    lms_model_close(m);
    m = open_auto(st, dev, need - 1, 0, &s);
    assert_int_equal(s.placement, LMS_PLACE_MAPPED);
    assert_int_equal(s.device_need_bytes, need);
    assert_int_equal(s.device_free_bytes, need - 1);
    assert_int_equal(s.device_bytes, 0);
    assert_true(g_npins > 0);
    for (size_t i = 0; i < lms_model_tensor_count(m); i++)
        assert_ptr_equal(lms_model_tensor_at(m, i)->device, lms_model_tensor_at(m, i)->host);
    lms_model_close(m);
    assert_int_equal(g_npins, 0);

    /* the caller's reserve counts: a large one turns the same free memory into mapped, a small one fits */
    m = open_auto(st, dev, 8ull << 30, 8ull << 30, &s);
    assert_int_equal(s.placement, LMS_PLACE_MAPPED);
    lms_model_close(m);
    m = open_auto(st, dev, arena + 1 + margin, 1, &s);
    assert_int_equal(s.placement, LMS_PLACE_RESIDENT);
    assert_int_equal(s.device_need_bytes, arena + 1 + margin);
    lms_model_close(m);
    /* the margin grows with the device: 1% of it when that is more than 256 MiB */
    g_fake_total = 64ull << 30;
    m = open_auto(st, dev, 8ull << 30, 0, &s);
    assert_int_equal(s.device_need_bytes, arena + reserve + (64ull << 30) / 100);
    lms_model_close(m);

    /* too large, and the mapped placement refused: a clear error, nothing left behind */
    atomic_store(&lms__loader_test_refuse, LMS__REFUSE_SIMULATED);
    g_fake_free = need - 1;
    lms_model_params p = lms_model_default_params();
    p.device = dev;
    m = NULL;
    assert_int_equal(lms_model_open(st, "tiny", &p, &m), LMS_EDEVICE);
    atomic_store(&lms__loader_test_refuse, LMS__REFUSE_NONE);
    assert_null(m);
    assert_non_null(strstr(lms_last_error(), "does not fit in device memory"));
    assert_int_equal(g_npins, 0);

    /* free memory unknown: resident, as before AUTO weighed it */
    m = open_auto(st, dev, 0, 0, &s);
    assert_int_equal(s.placement, LMS_PLACE_RESIDENT);
    assert_int_equal(s.device_need_bytes, 0);
    lms_model_close(m);
    /* unified memory: mapped, whatever is free */
    g_fake_unified = true;
    m = open_auto(st, dev, 8ull << 30, 0, &s);
    assert_int_equal(s.placement, LMS_PLACE_MAPPED);
    assert_int_equal(s.device_need_bytes, 0);
    lms_model_close(m);
    assert_int_equal(g_pin_errors, 0);
    lms_device_close(dev);

    /* the CPU device: host views */
    assert_int_equal(lms_device_open_name("cpu", &dev), 0);
    m = open_auto(st, dev, 0, 0, &s);
    assert_int_equal(s.placement, LMS_PLACE_HOST);
    assert_null(lms_model_tensor_at(m, 0)->device);
    lms_model_close(m);
    lms_device_close(dev);
    assert_int_equal(lms_store_close(st), 0);
}

/* ring_first_slots: layer 0 (the first in copy order) is copied out of at most
 * that many ring slots, and the other slots are pinned only after all of its
 * copies were issued; every byte still arrives, for each setting. */
/* Params of a resident load through the staging ring filled by pread
 * (0 = the default for chunk, threads, slots). */
static lms_model_params staged_params(lms_device *dev, lms_model_tuning *t, uint64_t chunk, int threads, int slots)
{
    lms_model_params p = lms_model_default_params();
    memset(t, 0, sizeof *t);
    p.tuning = t;
    p.device = dev;
    p.placement = LMS_PLACE_RESIDENT;
    t->copy = LMS_COPY_STAGE_READ;
    t->chunk_bytes = chunk;
    p.threads = threads;
    t->ring_slots = slots;
    return p;
}

/* Reset the pin device's ring-pin and copy records, load "tiny" with p to
 * the end and check every byte; the records then describe this load. */
static lms_model *load_counting_copies(lms_store *st, const lms_model_params *p)
{
    pthread_mutex_lock(&g_pin_mu);
    g_ring_pins = g_ncopies = 0;
    pthread_mutex_unlock(&g_pin_mu);
    lms_model *m = NULL;
    assert_int_equal(lms_model_open(st, "tiny", p, &m), 0);
    assert_int_equal(lms_model_wait_layer(m, LMS_LAYER_ALL), 0);
    check_bytes_equal_source(m, true);
    return m;
}

static void first_layer_uses_only_the_first_ring_slots(void **state)
{
    (void)state;
    lms_store *st = open_store();
    lms_device *dev = open_pin_device();
    lms_model_tuning t;
    lms_model_params p = staged_params(dev, &t, 2 << 20, 4, 6); /* layer 0 spans several 2 MiB chunks */
    const int firsts[] = {1, 2, 6, 1024};
    for (size_t k = 0; k < LMS_ARRAY_LEN(firsts); k++) {
        t.ring_first_slots = firsts[k];
        lms_model *m = load_counting_copies(st, &p);
        uintptr_t lo = UINTPTR_MAX, hi = 0;
        for (size_t i = 0; i < lms_model_tensor_count(m); i++) {
            const lms_tensor *t = lms_model_tensor_at(m, i);
            if (t->layer == 0 && t->nbytes) {
                lo = LMS_MIN(lo, (uintptr_t)t->device);
                hi = LMS_MAX(hi, (uintptr_t)t->device + t->nbytes);
            }
        }
        pthread_mutex_lock(&g_pin_mu);
        int l0 = 0, most = 0;
        for (int c = 0; c < g_ncopies; c++)
            if (g_copies[c].dst >= lo && g_copies[c].dst < hi) {
                l0++;
                most = LMS_MAX(most, g_copies[c].ring_pins);
            }
        int pins = g_ring_pins;
        pthread_mutex_unlock(&g_pin_mu);
        assert_true(l0 > 2);
        if (firsts[k] < t.ring_slots)
            assert_true(most <= firsts[k]);
        assert_true(pins <= t.ring_slots);
        if (firsts[k] <= 2)
            assert_true(pins > firsts[k]); /* the rest of the ring is used after layer 0 */
        lms_model_close(m);
        assert_int_equal(g_npins, 0);
    }
    t.ring_first_slots = -1;
    lms_model *m = NULL;
    assert_int_equal(lms_model_open(st, "tiny", &p, &m), LMS_EINVAL);
    assert_null(m);
    assert_int_equal(g_pin_errors, 0);
    lms_device_close(dev);
    assert_int_equal(lms_store_close(st), 0);
}

/* lms_device_reserve_staging: pinned once, lent to one load at a time,
 * never pinned again by the loads that borrow it, and unpinned at close. */
static void reserved_staging_is_lent_to_one_load_at_a_time(void **state)
{
    (void)state;
    lms_store *st = open_store();
    lms_device *dev = open_pin_device();
    assert_int_equal(lms_device_reserve_staging(NULL, 0), LMS_EINVAL);
    assert_int_equal(lms_device_reserve_staging(dev, 16 << 20), 0);
    assert_int_equal(g_ring_pins, 1); /* one registration for the whole pool */
    uintptr_t pool = g_pins[0].base, pool_end = pool + g_pins[0].len;
    assert_true(g_pins[0].len >= (16u << 20));
    assert_int_equal(lms_device_reserve_staging(dev, 1 << 20), 0); /* already covered: nothing pinned */
    assert_int_equal(g_pin_calls, 1);

    lms_model_tuning t;
    lms_model_params p = staged_params(dev, &t, 2 << 20, 3, 6); /* 6 x (2 MiB + 8 KiB) fits in 16 MiB */
    t.ring_first_slots = 2;
    for (int round = 0; round < 3; round++) {
        /* round 1: the pool is lent elsewhere, so the load pins a ring of its own */
        uint8_t *held = round == 1 ? lms__staging_borrow(dev, 1) : NULL;
        assert_true((round == 1) == (held != NULL));
        if (round == 1)
            assert_int_equal(lms_device_reserve_staging(dev, 64 << 20), LMS_EBUSY);
        lms_model *m = load_counting_copies(st, &p);
        lms_model_stats s;
        assert_int_equal(lms_model_stats_get(m, &s), 0);
        assert_int_equal(s.ring_reserved, round != 1);
        assert_true(s.setup_s > 0 && s.first_copy_s >= s.setup_s && s.all_s >= s.first_copy_s);
        pthread_mutex_lock(&g_pin_mu);
        int in_pool = 0;
        for (int c = 0; c < g_ncopies; c++)
            in_pool += g_copies[c].src >= pool && g_copies[c].src < pool_end;
        assert_true(g_ncopies > 2);
        if (round == 1) {
            assert_int_equal(in_pool, 0);
            assert_true(g_ring_pins > 0);
        } else {
            assert_int_equal(in_pool, g_ncopies);
            assert_int_equal(g_ring_pins, 0);
        }
        pthread_mutex_unlock(&g_pin_mu);
        lms_model_close(m);
        if (held)
            lms__staging_return(dev);
        assert_int_equal(g_npins, 1); /* the pool stays pinned */
    }
    /* a ring larger than the pool pins its own */
    t.ring_slots = 12;
    lms_model *m = NULL;
    assert_int_equal(lms_model_open(st, "tiny", &p, &m), 0);
    assert_int_equal(lms_model_wait_layer(m, LMS_LAYER_ALL), 0);
    check_bytes_equal_source(m, true);
    lms_model_stats s;
    assert_int_equal(lms_model_stats_get(m, &s), 0);
    assert_false(s.ring_reserved);
    lms_model_close(m);
    /* growing it replaces the pool */
    assert_int_equal(lms_device_reserve_staging(dev, 32 << 20), 0);
    assert_int_equal(g_npins, 1);
    assert_true(g_pins[0].len >= (32u << 20));
    lms_device_close(dev);
    assert_int_equal(g_npins, 0);
    assert_int_equal(g_pin_errors, 0);

    /* a device without registration (the CPU): the pool is plain host memory */
    assert_int_equal(lms_device_open(LMS_DEVICE_CPU, 0, &dev), 0);
    assert_int_equal(lms_device_reserve_staging(dev, 0), 0);
    p = staged_params(dev, &t, 0, 0, 0);
    assert_int_equal(lms_model_open(st, "tiny", &p, &m), 0);
    assert_int_equal(lms_model_wait_layer(m, LMS_LAYER_ALL), 0);
    check_bytes_equal_source(m, true);
    assert_int_equal(lms_model_stats_get(m, &s), 0);
    assert_true(s.ring_reserved);
    lms_model_close(m);
    lms_device_close(dev);
    assert_int_equal(lms_store_close(st), 0);
}

/* Loads on several threads borrow, miss and return the pool while another
 * thread keeps growing it: every byte arrives, nothing is pinned twice or
 * freed while lent (ASan build), and the pool is the only pin left. */
typedef struct reserve_race {
    lms_store *st;
    lms_device *dev;
    atomic_int bad, borrowed;
} reserve_race;

static void *reserve_race_loads(void *v)
{
    reserve_race *rr = v;
    lms_model_tuning t;
    lms_model_params p = staged_params(rr->dev, &t, 2 << 20, 2, 3);
    for (int k = 0; k < 6; k++) {
        lms_model *m = NULL;
        lms_model_stats s;
        if (lms_model_open(rr->st, "tiny", &p, &m) || lms_model_wait_layer(m, LMS_LAYER_ALL) ||
            lms_model_stats_get(m, &s)) {
            atomic_fetch_add(&rr->bad, 1);
            lms_model_close(m);
            continue;
        }
        for (size_t i = 0; i < lms_model_tensor_count(m); i++) {
            const lms_tensor *t = lms_model_tensor_at(m, i);
            if (t->nbytes && memcmp(t->device, t->host, t->nbytes))
                atomic_fetch_add(&rr->bad, 1);
        }
        atomic_fetch_add(&rr->borrowed, s.ring_reserved);
        lms_model_close(m);
    }
    return NULL;
}

static void reserving_while_loads_run_is_safe(void **state)
{
    (void)state;
    reserve_race rr = {.st = open_store(), .dev = open_pin_device()};
    assert_int_equal(lms_device_reserve_staging(rr.dev, 8 << 20), 0);
    pthread_t th[3];
    for (int i = 0; i < 3; i++)
        assert_int_equal(pthread_create(&th[i], NULL, reserve_race_loads, &rr), 0);
    int grown = 0;
    for (int k = 1; k <= 12; k++) {
        int rc = lms_device_reserve_staging(rr.dev, (size_t)(8 + 2 * k) << 20);
        assert_true(rc == 0 || rc == LMS_EBUSY);
        grown += rc == 0;
    }
    for (int i = 0; i < 3; i++)
        pthread_join(th[i], NULL);
    print_message("pool grown %d of 12 times; %d of 18 loads borrowed it\n", grown, atomic_load(&rr.borrowed));
    assert_int_equal(atomic_load(&rr.bad), 0);
    assert_int_equal(g_npins, 1);
    assert_int_equal(g_pin_errors, 0);
    lms_device_close(rr.dev);
    assert_int_equal(g_npins, 0);
    assert_int_equal(g_pin_errors, 0);
    assert_int_equal(lms_store_close(rr.st), 0);
}

/* The preconditions are asserted in every build type: releasing a
 * registration never taken, or returning staging memory never borrowed,
 * stops the process (run in a child) instead of corrupting the counts. */
static void broken_preconditions_stop_at_an_assertion(void **state)
{
    (void)state;
    for (int k = 0; k < 2; k++) {
        fflush(NULL);
        pid_t pid = fork();
        assert_true(pid >= 0);
        if (pid == 0) {
            int null = open("/dev/null", O_WRONLY);
            dup2(null, 2); /* the assertion's message */
            lms_store *st = NULL;
            lms_device *dev = NULL;
            lms_model *m = NULL;
            if (lms_store_open(g_store, LMS_STORE_RDONLY, NULL, &st) || lms_device_open(LMS_DEVICE_CPU, 0, &dev) ||
                lms_model_open(st, "tiny", NULL, &m))
                _exit(3);
            if (k == 0)
                lms__reg_release(m->ti[0].map, dev, 0);
            else
                lms__staging_return(dev);
            _exit(0); /* not reached while assertions are on */
        }
        int status = 0;
        assert_int_equal(waitpid(pid, &status, 0), pid);
        if (!WIFSIGNALED(status) || WTERMSIG(status) != SIGABRT)
            fail_msg("case %d: child ended with status %#x, not SIGABRT", k, status);
    }
}

static void read_error_during_resident_load_is_reported_by_wait(void **state)
{
    (void)state;
    lms_store *st = open_store();
    lms_device *dev = NULL;
    assert_int_equal(lms_device_open(LMS_DEVICE_CPU, 0, &dev), 0);
    lms_model_tuning t = {.copy = LMS_COPY_STAGE_DIRECT, .chunk_bytes = 2 << 20};
    lms_model_params p = lms_model_default_params();
    p.device = dev;
    p.placement = LMS_PLACE_RESIDENT;
    p.tuning = &t;
    p.threads = 2;
    lms_model *m = NULL;
    lms__fault_arm(LMS_FAULT_READ, 4, true);
    int rc = lms_model_open(st, "tiny", &p, &m);
    if (rc == 0) {
        rc = lms_model_wait_layer(m, LMS_LAYER_ALL);
        assert_int_equal(rc, LMS_EIO);
        assert_non_null(strstr(lms_last_error(), "model 'tiny'"));
        assert_non_null(strstr(lms_last_error(), ".seg"));
        assert_int_equal(lms_model_wait_layer(m, LMS_LAYER_ALL), LMS_EIO); /* and stays failed */
        lms_model_close(m);
    } else {
        assert_int_equal(rc, LMS_EIO);
    }
    lms__fault_disarm_all();
    lms_device_close(dev);
    assert_int_equal(lms_store_close(st), 0);
}


typedef struct conc_arg {
    lms_store *st;
    lms_device *dev;
    int id;
    int bad;
} conc_arg;

static void *conc_main(void *v)
{
    conc_arg *a = v;
    for (int it = 0; it < 12; it++) {
        lms_model_tuning tu = {.copy = LMS_COPY_STAGE_READ};
        lms_model_params p = lms_model_default_params();
        if ((it + a->id) % 3 == 1) {
            p.device = a->dev;
            p.placement = LMS_PLACE_RESIDENT;
            p.tuning = &tu;
            p.threads = 2;
        } else if ((it + a->id) % 3 == 2) {
            p.prefetch = LMS_PREFETCH_POPULATE;
            p.threads = 2;
        }
        lms_model *m = NULL;
        if (lms_model_open(a->st, "tiny", &p, &m)) {
            a->bad++;
            continue;
        }
        if (lms_model_wait_layer(m, LMS_LAYER_ALL))
            a->bad++;
        const lms_tensor *t = lms_model_tensor(m, "model.layers.1.mlp.gate_proj.weight");
        uint8_t *want = t ? tm_expected(tm_find(&g_m, t->name), false) : NULL;
        if (!t || memcmp(t->host, want, t->nbytes) || (t->device && memcmp(t->device, want, t->nbytes)))
            a->bad++;
        free(want);
        lms_model_close(m);
    }
    return NULL;
}

static void concurrent_opens_and_closes_on_one_store(void **state)
{
    (void)state;
    lms_store *st = open_store();
    lms_device *dev = NULL;
    assert_int_equal(lms_device_open(LMS_DEVICE_CPU, 0, &dev), 0);
    pthread_t th[4];
    conc_arg args[4];
    for (int i = 0; i < 4; i++) {
        args[i] = (conc_arg){.st = st, .dev = dev, .id = i};
        assert_int_equal(pthread_create(&th[i], NULL, conc_main, &args[i]), 0);
    }
    for (int i = 0; i < 4; i++) {
        pthread_join(th[i], NULL);
        assert_int_equal(args[i].bad, 0);
    }
    seg_usage u;
    assert_int_equal(seg_usage_read(getpid(), g_store, &u), 0);
    assert_int_equal(u.mappings, 0);
    lms_device_close(dev);
    assert_int_equal(lms_store_close(st), 0);
}


static void a_grown_segment_gets_a_second_mapping_and_both_stay_valid(void **state)
{
    (void)state;
    lms_store *st = open_store();
    lms_model *a = NULL, *b = NULL;
    assert_int_equal(lms_model_open(st, "tiny", NULL, &a), 0);
    seg_usage u0;
    assert_int_equal(seg_usage_read(getpid(), g_store, &u0), 0);

    /* another process appends a model (other bytes) to the same segment */
    static tm_model other;
    other = g_m;
    for (int i = 0; i < other.n; i++)
        other.t[i].seed += 100000;
    char src[1200];
    snprintf(src, sizeof src, "%s/src-other", g_dir);
    assert_int_equal(mkdir(src, 0755), 0);
    for (int sh = 0; sh < 2; sh++)
        assert_int_equal(tm_write_shard(&other, src, sh, 2, false), 0);
    char *out = NULL;
    int rc = lms_test_sh(&out, "'%s' import '%s' --store '%s' --name other", lms_test_bin(), src, g_store);
    if (rc)
        fail_msg("import: %s", out ? out : "");
    free(out);

    assert_int_equal(lms_model_open(st, "other", NULL, &b), 0);
    seg_usage u1;
    assert_int_equal(seg_usage_read(getpid(), g_store, &u1), 0);
    assert_true(u1.mappings > u0.mappings); /* the old mapping was too short for the new bytes */
    for (size_t i = 0; i < lms_model_tensor_count(b); i++) {
        const lms_tensor *t = lms_model_tensor_at(b, i);
        uint8_t *want = tm_expected(tm_find(&other, t->name), false);
        assert_memory_equal(t->host, want, t->nbytes);
        free(want);
    }
    check_bytes_equal_source(a, false); /* the first mapping is untouched */
    lms_model_close(a);
    lms_model_close(b);
    assert_int_equal(seg_usage_read(getpid(), g_store, &u1), 0);
    assert_int_equal(u1.mappings, 0);
    assert_int_equal(lms_store_close(st), 0);
}

static void failed_opens_leave_nothing_behind(void **state)
{
    (void)state;
    lms_store *st = open_store();
    lms_device *dev = NULL;
    assert_int_equal(lms_device_open(LMS_DEVICE_CPU, 0, &dev), 0);
    lms_device *pin = open_pin_device();
    for (int variant = 0; variant < 4; variant++) {
        lms_model_tuning t = {.copy = variant == 1 ? LMS_COPY_STAGE_READ : LMS_COPY_REGISTER,
                              .chunk_bytes = 2 << 20};
        lms_model_params p = lms_model_default_params();
        if (variant >= 1) {
            p.device = variant == 1 ? dev : pin;
            p.placement = variant == 3 ? LMS_PLACE_MAPPED : LMS_PLACE_RESIDENT;
            p.tuning = &t;
            p.sync = true;
            p.threads = 2;
        }
        int failures = 0;
        bool opened = false;
        for (long n = 1; n < 400 && !opened; n++) {
            lms_model *m = NULL;
            lms__fault_arm(LMS_FAULT_ALLOC, n, false);
            int rc = lms_model_open(st, "tiny", &p, &m);
            lms__fault_disarm_all();
            if (rc == 0) {
                lms_model_close(m);
                opened = true;
                continue;
            }
            failures++;
            assert_null(m);
            assert_int_equal(rc, LMS_ENOMEM);
            /* nothing stays mapped, and the store can still be closed */
            seg_usage u;
            assert_int_equal(seg_usage_read(getpid(), g_store, &u), 0);
            assert_int_equal(u.mappings, 0);
            assert_int_equal(atomic_load(&st->users), 0);
            assert_int_equal(g_npins, 0); /* nothing left registered */
            assert_int_equal(g_pin_errors, 0);
        }
        assert_true(opened);
        assert_true(failures > 5);
    }
    lms_device_close(pin);
    lms_device_close(dev);
    assert_int_equal(lms_store_close(st), 0);
}

int main(void)
{
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(views_equal_source_bytes_shapes_and_layers),
        cmocka_unit_test(lookups_files_and_ids),
        cmocka_unit_test(store_close_with_open_model_returns_ebusy),
        cmocka_unit_test(open_touches_no_data_page_until_populate),
        cmocka_unit_test(segments_are_mapped_once_per_store_and_locked_against_gc),
        cmocka_unit_test(verify_names_the_corrupt_tensor),
        cmocka_unit_test(resident_on_cpu_device_direct_copies_every_byte),
        cmocka_unit_test(resident_staging_ring_copies_every_byte),
        cmocka_unit_test(resident_parallel_readers_copy_every_byte),
        cmocka_unit_test(mapped_on_cpu_device_points_at_the_mapping),
        cmocka_unit_test(device_info_describes_the_cpu_and_its_memory),
        cmocka_unit_test(opening_a_missing_cuda_device_fails_clearly),
        cmocka_unit_test(registered_paths_pin_once_share_blocks_and_unpin_before_unmap),
        cmocka_unit_test(auto_placement_is_resident_when_the_model_fits_and_mapped_when_not),
        cmocka_unit_test(first_layer_uses_only_the_first_ring_slots),
        cmocka_unit_test(reserved_staging_is_lent_to_one_load_at_a_time),
        cmocka_unit_test(reserving_while_loads_run_is_safe),
        cmocka_unit_test(broken_preconditions_stop_at_an_assertion),
        cmocka_unit_test(read_error_during_resident_load_is_reported_by_wait),
        cmocka_unit_test(concurrent_opens_and_closes_on_one_store),
        cmocka_unit_test(a_grown_segment_gets_a_second_mapping_and_both_stay_valid),
        cmocka_unit_test(failed_opens_leave_nothing_behind),
    };
    return cmocka_run_group_tests(tests, setup_all, teardown_all);
}
