/*
 * tools/bench_load.c - `lmstore bench load MODEL`: how long a model takes to
 * open, to have its first layer ready and to have every weight ready on the
 * chosen device, and what that costs in memory (peak RSS and how much of the
 * resident memory is file-backed, i.e. shared page cache rather than a copy).
 *
 * "Ready" means: CPU (host views) - every page of the weights is in memory
 * and mapped (prefetch populate, the default here; --prefetch none measures
 * the bare open); CUDA mapped - the mapping is registered and addressable;
 * CUDA resident - every weight is in the device arena (lms_model_wait_layer).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/common.h"
#include "lmstore/loader.h"
#include "lmstore/loader_experimental.h" /* the copy knobs: --copy, --chunk, --slots, ... */
#include "lmstore/store.h"
#include "tools/bench.h"
#include "tools/cli.h"

static const char usage[] =
    "usage: lmstore bench load MODEL [--store DIR] [--device cpu|cuda|cuda:N] [--place host|mapped|resident]\n"
    "           [--prefetch none|willneed|populate] [--staging] [--readers] [--no-readers]\n"
    "           [--copy auto|register|stage-map|stage-read|stage-direct|split] [--register-percent P]\n"
    "           [--streams N] [--threads N] [--chunk SIZE] [--slots N] [--ring-first N] [--ring-hostalloc]\n"
    "           [--order blocks|file] [--verify] [--reserve]\n"
    "           [--json]\n"
    "--reserve pins the staging ring when the device is opened (lms_device_reserve_staging), before the\n"
    "timed load; its time is reported as reserve.\n";

/* VmHWM, VmRSS, RssAnon, RssFile, RssShmem from /proc/self/status (bytes). */
typedef struct memstat {
    uint64_t hwm, rss, anon, file, shmem;
} memstat;

static void read_mem(memstat *m)
{
    memset(m, 0, sizeof *m);
    FILE *f = fopen("/proc/self/status", "r");
    if (!f)
        return;
    char line[256];
    while (fgets(line, sizeof line, f)) {
        unsigned long long kb;
        if (sscanf(line, "VmHWM: %llu", &kb) == 1) m->hwm = kb << 10;
        else if (sscanf(line, "VmRSS: %llu", &kb) == 1) m->rss = kb << 10;
        else if (sscanf(line, "RssAnon: %llu", &kb) == 1) m->anon = kb << 10;
        else if (sscanf(line, "RssFile: %llu", &kb) == 1) m->file = kb << 10;
        else if (sscanf(line, "RssShmem: %llu", &kb) == 1) m->shmem = kb << 10;
    }
    fclose(f);
}

static const char *place_name(lms_placement p)
{
    switch (p) {
    case LMS_PLACE_HOST: return "host";
    case LMS_PLACE_MAPPED: return "mapped";
    case LMS_PLACE_RESIDENT: return "resident";
    default: return "auto";
    }
}

int lms_bench_load(int argc, char **argv)
{
    const char *store_opt = NULL, *devname = "cpu", *place = NULL, *prefetch = NULL, *v = NULL, *model = NULL;
    bool json = false, reserve = false, staging = false, readers = false;
    lms_model_tuning t = {0};
    lms_model_params p = lms_model_default_params();
    p.tuning = &t;
    int64_t n;
    uint64_t sz;
    for (int i = 1; i < argc;) {
        if (lms_cli_end_of_options(argv, &i))
            continue;
        if (lms_cli_opt(argc, argv, &i, "--store", &store_opt) || lms_cli_opt(argc, argv, &i, "--device", &devname) ||
            lms_cli_opt(argc, argv, &i, "--place", &place) || lms_cli_opt(argc, argv, &i, "--prefetch", &prefetch))
            continue;
        if (lms_cli_opt(argc, argv, &i, "--streams", &v)) {
            if (!lms_cli_parse_i64(v, &n) || n < 1 || n > 64)
                return lms_cli_usage("bench", "--streams wants 1..64");
            t.streams = (int)n;
        } else if (lms_cli_opt(argc, argv, &i, "--threads", &v)) {
            if (!lms_cli_parse_i64(v, &n) || n < 1 || n > 256)
                return lms_cli_usage("bench", "--threads wants 1..256");
            p.threads = (int)n;
        } else if (lms_cli_opt(argc, argv, &i, "--slots", &v)) {
            if (!lms_cli_parse_i64(v, &n) || n < 1 || n > 1024)
                return lms_cli_usage("bench", "--slots wants 1..1024");
            t.ring_slots = (int)n;
        } else if (lms_cli_opt(argc, argv, &i, "--chunk", &v)) {
            if (!lms_cli_parse_size(v, &sz) || sz == 0)
                return lms_cli_usage("bench", "--chunk wants a size such as 64M");
            t.chunk_bytes = sz;
        } else if (lms_cli_opt(argc, argv, &i, "--copy", &v)) {
            if (!strcmp(v, "auto")) t.copy = LMS_COPY_AUTO;
            else if (!strcmp(v, "register")) t.copy = LMS_COPY_REGISTER;
            else if (!strcmp(v, "stage-map")) t.copy = LMS_COPY_STAGE_MAP;
            else if (!strcmp(v, "stage-read")) t.copy = LMS_COPY_STAGE_READ;
            else if (!strcmp(v, "stage-direct")) t.copy = LMS_COPY_STAGE_DIRECT;
            else if (!strcmp(v, "split")) t.copy = LMS_COPY_SPLIT;
            else return lms_cli_usage("bench", "--copy wants auto, register, stage-map, stage-read, stage-direct "
                                               "or split");
        } else if (lms_cli_opt(argc, argv, &i, "--register-percent", &v)) {
            if (!lms_cli_parse_i64(v, &n) || n < 1 || n > 100)
                return lms_cli_usage("bench", "--register-percent wants 1..100");
            t.register_percent = (int)n;
        } else if (lms_cli_opt(argc, argv, &i, "--order", &v)) {
            if (!strcmp(v, "blocks")) t.order = LMS_ORDER_BLOCKS_FIRST;
            else if (!strcmp(v, "file")) t.order = LMS_ORDER_FILE;
            else return lms_cli_usage("bench", "--order wants blocks or file");
        } else if (lms_cli_flag(argv, i, "--json")) {
            json = true, i++;
        } else if (lms_cli_flag(argv, i, "--staging")) {
            staging = true, i++;
        } else if (lms_cli_flag(argv, i, "--readers")) {
            readers = true, i++;
        } else if (lms_cli_flag(argv, i, "--no-readers")) {
            t.no_readers = true, i++;
        } else if (lms_cli_opt(argc, argv, &i, "--ring-first", &v)) {
            if (!lms_cli_parse_i64(v, &n) || n < 1 || n > 1024)
                return lms_cli_usage("bench", "--ring-first wants 1..1024");
            t.ring_first_slots = (int)n;
        } else if (lms_cli_flag(argv, i, "--ring-hostalloc")) {
            t.ring_host_alloc = true, i++;
        } else if (lms_cli_flag(argv, i, "--reserve")) {
            reserve = true, i++;
        } else if (lms_cli_flag(argv, i, "--verify")) {
            p.verify = true, i++;
        } else if (lms_cli_flag(argv, i, "--help")) {
            fputs(usage, stdout);
            return LMS_EXIT_OK;
        } else if (lms_cli_is_option(argv[i]) || model) {
            return lms_cli_usage("bench", "unexpected argument '%s'", argv[i]);
        } else {
            model = argv[i++];
        }
    }
    if (!model)
        return lms_cli_usage("bench", "bench load needs a MODEL");
    /* --readers (= --copy stage-direct), else --staging (= --copy stage-map), overrides --copy */
    if (readers)
        t.copy = LMS_COPY_STAGE_DIRECT;
    else if (staging)
        t.copy = LMS_COPY_STAGE_MAP;
    bool cpu = !strcmp(devname, "cpu");
    if (!place) p.placement = cpu ? LMS_PLACE_HOST : LMS_PLACE_AUTO;
    else if (!strcmp(place, "host")) p.placement = LMS_PLACE_HOST;
    else if (!strcmp(place, "mapped")) p.placement = LMS_PLACE_MAPPED;
    else if (!strcmp(place, "resident")) p.placement = LMS_PLACE_RESIDENT;
    else return lms_cli_usage("bench", "--place wants host, mapped or resident");
    if (!prefetch) p.prefetch = p.placement == LMS_PLACE_HOST ? LMS_PREFETCH_POPULATE : LMS_PREFETCH_NONE;
    else if (!strcmp(prefetch, "none")) p.prefetch = LMS_PREFETCH_NONE;
    else if (!strcmp(prefetch, "willneed")) p.prefetch = LMS_PREFETCH_WILLNEED;
    else if (!strcmp(prefetch, "populate")) p.prefetch = LMS_PREFETCH_POPULATE;
    else return lms_cli_usage("bench", "--prefetch wants none, willneed or populate");

    lms_store *st = NULL;
    lms_device *dev = NULL;
    lms_model *m = NULL;
    int rc, status = LMS_EXIT_FAIL;
    double t_dev = 0, t_reserve = 0;
    if ((rc = lms_store_open(lms_cli_store_path(store_opt), LMS_STORE_RDONLY, NULL, &st)))
        return lms_cli_fail("bench", rc, "open store");
    if (!cpu || p.placement != LMS_PLACE_HOST) {
        double td = lms__now();
        if ((rc = lms_device_open_name(devname, &dev))) {
            lms_cli_fail("bench", rc, devname);
            goto out;
        }
        t_dev = lms__now() - td;
        p.device = dev;
        if (reserve) {
            td = lms__now();
            if ((rc = lms_device_reserve_staging(dev, lms_model_staging_bytes(&p)))) {
                lms_cli_fail("bench", rc, "reserve staging memory");
                goto out;
            }
            t_reserve = lms__now() - td;
        }
    }

    double t0 = lms__now();
    if ((rc = lms_model_open(st, model, &p, &m))) {
        lms_cli_fail("bench", rc, model);
        goto out;
    }
    double t_open = lms__now() - t0;
    int32_t first = t.order == LMS_ORDER_FILE ? LMS_LAYER_PRE : 0;
    if (lms_model_n_layers(m) == 0)
        first = LMS_LAYER_ALL;
    if ((rc = lms_model_wait_layer(m, first))) {
        lms_cli_fail("bench", rc, "first layer");
        goto out;
    }
    double t_first = lms__now() - t0;
    if ((rc = lms_model_wait_layer(m, LMS_LAYER_ALL))) {
        lms_cli_fail("bench", rc, "all layers");
        goto out;
    }
    double t_all = lms__now() - t0;
    lms_model_stats s;
    lms_model_stats_get(m, &s);
    memstat ms;
    read_mem(&ms);
    double gbs = t_all > 0 ? (double)s.tensor_bytes / t_all / 1e9 : 0;
    const char *path = s.placement == LMS_PLACE_RESIDENT
                           ? (s.readers && s.registered_bytes ? "split"
                              : s.readers ? (s.direct_io ? "readers-odirect" : "readers")
                              : s.staging ? "staging" : s.registered_bytes ? "registered" : "direct")
                           : place_name(s.placement);
    if (json) {
        printf("{\"model\": \"%s\", \"device\": \"%s\", \"placement\": \"%s\", \"path\": \"%s\", "
               "\"tensors\": %zu, \"bytes\": %" PRIu64 ", \"device_bytes\": %" PRIu64 ", "
               "\"open_s\": %.6f, \"first_layer_s\": %.6f, \"all_s\": %.6f, \"gb_per_s\": %.3f, "
               "\"first_layer_fraction\": %.4f, \"setup_s\": %.6f, \"first_copy_s\": %.6f, "
               "\"device_open_s\": %.6f, \"reserve_s\": %.6f, \"ring_reserved\": %s, "
               "\"streams\": %d, \"threads\": %d, "
               "\"peak_rss_bytes\": %" PRIu64 ", \"rss_bytes\": %" PRIu64 ", \"rss_file_bytes\": %" PRIu64
               ", \"rss_anon_bytes\": %" PRIu64 ", \"file_backed_share\": %.4f}\n",
               model, devname, place_name(s.placement), path, lms_model_tensor_count(m), s.tensor_bytes,
               s.device_bytes, t_open, t_first, t_all, gbs, t_all > 0 ? t_first / t_all : 0, s.setup_s,
               s.first_copy_s, t_dev, t_reserve, s.ring_reserved ? "true" : "false", s.streams, s.threads,
               ms.hwm, ms.rss, ms.file, ms.anon, ms.rss ? (double)ms.file / (double)ms.rss : 0);
    } else {
        printf("model %s on %s, placement %s (%s), %zu tensors, %.3f GB\n", model, devname, place_name(s.placement),
               path, lms_model_tensor_count(m), s.tensor_bytes / 1e9);
        if (dev)
            printf("  device open   %9.3f ms  (before the load, not in the times below)\n", t_dev * 1e3);
        if (reserve)
            printf("  reserve       %9.3f ms  staging memory pinned (before the load)\n", t_reserve * 1e3);
        printf("  open          %9.3f ms\n", t_open * 1e3);
        if (s.placement == LMS_PLACE_RESIDENT)
            printf("  setup         %9.3f ms  arena allocated; first copy issued at %.3f ms%s\n", s.setup_s * 1e3,
                   s.first_copy_s * 1e3, s.ring_reserved ? " (reserved ring)" : "");
        printf("  first layer   %9.3f ms  (%.1f%% of all)\n", t_first * 1e3, t_all > 0 ? 100 * t_first / t_all : 0);
        printf("  all ready     %9.3f ms  %.2f GB/s\n", t_all * 1e3, gbs);
        printf("  peak RSS      %9.1f MB; RSS %.1f MB, file-backed %.1f MB (%.0f%%), anonymous %.1f MB\n",
               ms.hwm / 1e6, ms.rss / 1e6, ms.file / 1e6, ms.rss ? 100.0 * ms.file / ms.rss : 0, ms.anon / 1e6);
    }
    status = LMS_EXIT_OK;
out:
    lms_model_close(m);
    lms_device_close(dev);
    lms_store_close(st);
    return status;
}
