/*
 * tools/bench_kv.c - `lmstore bench kv`: KV session save and resume
 * throughput and each codec's compression ratio, on a Llama-3-8B-shaped
 * cache (32 layers, 8 KV heads, head dim 128, bf16, 16 tokens per page)
 * holding 4096 tokens (512 MiB of K/V).
 *
 * Data: --data FILE is a safetensors file with bf16 tensors "k" and "v" of
 * shape [layers, kv_heads, tokens, head_dim] (tests/fixtures/kv/ holds one,
 * made by tests/reference/make_kv_fixture.py). Its ratio is measured twice:
 * on the file's own pages (no data repeated: the figure to quote) and on the
 * 8B layout tiled from it (heads, layers and token offsets rotated so no
 * page or block repeats, to time the codecs on that kind of data). Without
 * --data the cache is filled with uniformly random bits (nothing to
 * compress: the lower bound of every codec), or with --random gaussian with
 * N(0,1) bf16 values (synthetic; their narrow exponent range compresses
 * about as well as real K/V, so they are no evidence either way).
 *
 * Each codec saves into its own fresh store (page keys are content
 * addresses, so a second save into one store would write nothing), then the
 * session is resumed --repeat times into the emptied cache from the page
 * cache. Side by side, in the same run: memcpy bandwidth over the arena, the
 * physical peer of a resume (which must at least write every byte once).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <unistd.h>

#include "common/common.h"
#include "kvcache/kv_codec.h"
#include "lmstore/kvcache.h"
#include "lmstore/loader.h"
#include "loader/device.h"
#include "store/safetensors.h"
#include "tools/bench.h"
#include "tools/cli.h"

static const char usage[] =
    "usage: lmstore bench kv [--tokens N] [--codec raw|zstd|shuffle-zstd|all] [--level L] [--data FILE]\n"
    "           [--random bits|gaussian] [--store DIR] [--threads N] [--repeat N] [--device cpu|cuda] [--json]\n"
    "  --data FILE   safetensors with bf16 'k' and 'v' [layers, kv_heads, tokens, head_dim] (real KV)\n"
    "  --random      without --data: uniformly random bits (default; the lower bound of compression)\n"
    "                or N(0,1) bf16 values (synthetic, not K/V)\n"
    "  --store DIR   scratch folder for the stores (default: a new folder in $TMPDIR or /tmp, removed after)\n";

typedef struct fixture {
    uint32_t L, H, T, D;
    uint16_t *k, *v; /* [L][H][T][D] */
} fixture;

static int load_fixture(const char *path, fixture *f)
{
    lms__st_file *st = NULL;
    int rc = lms__st_open(path, &st), fd = -1;
    if (rc)
        return rc;
    memset(f, 0, sizeof *f);
    const lms__st_tensor *tk = NULL, *tv = NULL;
    for (size_t i = 0; i < st->n_tensors; i++) {
        if (!strcmp(st->tensors[i].name, "k"))
            tk = &st->tensors[i];
        if (!strcmp(st->tensors[i].name, "v"))
            tv = &st->tensors[i];
    }
    if (!tk || !tv || tk->dtype != LMS_DTYPE_BF16 || tv->dtype != LMS_DTYPE_BF16 || tk->ndim != 4 ||
        memcmp(tk->shape, tv->shape, sizeof tk->shape)) {
        rc = lms__err(LMS_EFORMAT, "%s: needs bf16 tensors 'k' and 'v' of one shape [layers, heads, tokens, dim]",
                      path);
        goto out;
    }
    f->L = (uint32_t)tk->shape[0];
    f->H = (uint32_t)tk->shape[1];
    f->T = (uint32_t)tk->shape[2];
    f->D = (uint32_t)tk->shape[3];
    rc = LMS_ENOMEM;
    if (!(f->k = lms__malloc(tk->nbytes)) || !(f->v = lms__malloc(tv->nbytes)))
        goto out;
    if ((fd = lms__open(path, 0, 0)) < 0) {
        rc = fd;
        goto out;
    }
    if ((rc = lms__pread_all(fd, f->k, tk->nbytes, st->data_off + tk->begin, path)) ||
        (rc = lms__pread_all(fd, f->v, tv->nbytes, st->data_off + tv->begin, path)))
        goto out;
    rc = 0;
out:
    if (fd >= 0)
        lms__close(fd);
    lms__st_free(st);
    if (rc) {
        lms__free(f->k);
        lms__free(f->v);
        f->k = f->v = NULL;
    }
    return rc;
}

static uint64_t rng = 0x243F6A8885A308D3ull;
static inline uint64_t next64(void)
{
    rng ^= rng << 13;
    rng ^= rng >> 7;
    rng ^= rng << 17;
    return rng;
}

static uint16_t bf16_of(float x)
{
    uint32_t u;
    memcpy(&u, &x, 4);
    u += 0x7fff + ((u >> 16) & 1);
    return (uint16_t)(u >> 16);
}

/* Fill positions [0, n) of seq: page images built on the host, copied to the device. */
static int fill(lms_kv *kv, lms_kv_seq *s, uint32_t n, const fixture *fx, bool gaussian)
{
    lms_kv_layout L;
    lms_kv_geometry g;
    lms_kv_get_layout(kv, &L);
    lms_kv_get_geometry(kv, &g);
    lms_device *dev = lms_kv_device(kv);
    int32_t *toks = lms__malloc(n * sizeof *toks);
    uint16_t *img = lms__malloc(g.page_bytes);
    int rc = LMS_ENOMEM;
    if (!toks || !img)
        goto out;
    for (uint32_t i = 0; i < n; i++)
        toks[i] = (int32_t)(next64() % 128000);
    if ((rc = lms_kv_seq_append(kv, s, toks, n)))
        goto out;
    for (uint32_t p0 = 0; p0 < n; p0 += L.page_tokens) {
        uint32_t page, slot;
        lms_kv_seq_slot(kv, s, p0, &page, &slot);
        memset(img, 0, g.page_bytes);
        for (uint32_t l = 0; l < L.n_layers; l++)
            for (uint32_t c = 0; c < 2; c++)
                for (uint32_t h = 0; h < L.n_kv_heads; h++)
                    for (uint32_t t = 0; t < L.page_tokens && p0 + t < n; t++) {
                        uint16_t *row = img + (l * g.layer_bytes + c * g.v_offset + h * g.head_bytes +
                                               t * g.token_bytes) / 2;
                        uint32_t pos = p0 + t;
                        if (fx) {
                            /* Row = 128/D fixture rows side by side. Block b of the page
                             * (layer, sub-row) takes fixture layer/head b mod (L*H) and a
                             * token window shifted by 32 per wrap, rotated per cycle of the
                             * fixture's length: no 16-token block repeats within a page,
                             * no page repeats another. */
                            uint32_t S = L.n_kv_heads * (L.head_dim / fx->D), cyc = pos / fx->T;
                            for (uint32_t j = 0; j < L.head_dim / fx->D; j++) {
                                uint32_t b = l * S + h * (L.head_dim / fx->D) + j;
                                uint32_t lh = (b + cyc) % (fx->L * fx->H), wrap = b / (fx->L * fx->H);
                                uint32_t tf = (pos + 32 * wrap) % fx->T;
                                const uint16_t *src = (c ? fx->v : fx->k) +
                                                      ((size_t)lh * fx->T + tf) * fx->D;
                                memcpy(row + j * fx->D, src, fx->D * 2);
                            }
                        } else if (!gaussian) {
                            for (uint32_t d = 0; d < L.head_dim; d += 4) {
                                uint64_t r = next64();
                                memcpy(row + d, &r, 8);
                            }
                        } else {
                            for (uint32_t d = 0; d < L.head_dim; d += 2) {
                                /* Box-Muller: two N(0,1) values */
                                double u1 = ((next64() >> 11) + 1.0) / 9007199254740993.0;
                                double u2 = (next64() >> 11) / 9007199254740992.0;
                                double r = sqrt(-2 * log(u1));
                                row[d] = bf16_of((float)(r * cos(2 * M_PI * u2)));
                                row[d + 1] = bf16_of((float)(r * sin(2 * M_PI * u2)));
                            }
                        }
                    }
        if ((rc = dev->ops->copy_h2d(dev, (uint8_t *)g.base + (size_t)page * g.page_bytes, img, g.page_bytes, NULL)))
            goto out;
    }
    rc = lms_kv_seq_commit(kv, s, n);
out:
    lms__free(toks);
    lms__free(img);
    return rc;
}

/* XXH3-64 of every page of seq (device pages copied back first). */
static int page_hashes(lms_kv *kv, const lms_kv_seq *s, uint64_t *out)
{
    lms_kv_geometry g;
    lms_kv_get_geometry(kv, &g);
    lms_device *dev = lms_kv_device(kv);
    uint8_t *img = lms__malloc(g.page_bytes);
    if (!img)
        return LMS_ENOMEM;
    uint32_t np;
    const uint32_t *tbl = lms_kv_seq_pages(s, &np);
    int rc = 0;
    for (uint32_t i = 0; i < np && !rc; i++) {
        rc = dev->ops->copy_d2h(dev, img, (uint8_t *)g.base + (size_t)tbl[i] * g.page_bytes, g.page_bytes, NULL);
        out[i] = lms__hash64(img, g.page_bytes, 0);
    }
    lms__free(img);
    return rc;
}

/* Ratio of each codec on the fixture's own pages: [L][K,V][H][16 tokens][D]
 * blocks of its real layers, no data repeated. */
static void fixture_ratios(const fixture *fx, double ratio[3])
{
    uint32_t P = 16, D = fx->D;
    (void)D;
    size_t page = (size_t)fx->L * 2 * fx->H * P * D * 2;
    uint8_t *raw = lms__malloc(page), *out = lms__malloc(lms__kv_encode_bound(page));
    lms__kv_codec_ctx c = {0};
    c.scratch = lms__malloc(page);
    uint64_t tot_raw = 0, tot[3] = {0, 0, 0};
    for (uint32_t t0 = 0; t0 + P <= fx->T; t0 += P) {
        uint8_t *w = raw;
        for (uint32_t l = 0; l < fx->L; l++)
            for (uint32_t kvi = 0; kvi < 2; kvi++)
                for (uint32_t h = 0; h < fx->H; h++) {
                    const uint16_t *src = (kvi ? fx->v : fx->k) + (((size_t)l * fx->H + h) * fx->T + t0) * D;
                    memcpy(w, src, (size_t)P * D * 2);
                    w += (size_t)P * D * 2;
                }
        tot_raw += page;
        for (int k = 0; k < 3; k++) {
            size_t len = page;
            if (lms__kv_encode(&c, k, 1, raw, page, 2, out, lms__kv_encode_bound(page), &len) == 0)
                tot[k] += LMS_MIN(len, page);
        }
    }
    for (int k = 0; k < 3; k++)
        ratio[k] = tot[k] ? (double)tot_raw / (double)tot[k] : 0;
    lms__kv_codec_ctx_free(&c);
    lms__free(raw);
    lms__free(out);
}

/* CPU seconds (user + system) of the whole process so far. */
static double cpu_seconds(void)
{
    struct rusage ru;
    getrusage(RUSAGE_SELF, &ru);
    return (double)ru.ru_utime.tv_sec + ru.ru_utime.tv_usec / 1e6 + (double)ru.ru_stime.tv_sec +
           ru.ru_stime.tv_usec / 1e6;
}

static double memcpy_gbps(lms_kv *kv)
{
    lms_kv_geometry g;
    lms_kv_get_geometry(kv, &g);
    size_t total = (size_t)g.n_pages * g.page_bytes, chunk = 64u << 20;
    if (chunk > total)
        chunk = total;
    uint8_t *dst = lms__malloc(chunk);
    if (!dst)
        return 0;
    memset(dst, 1, chunk);
    double best = 0;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = lms__now();
        for (size_t off = 0; off + chunk <= total; off += chunk)
            memcpy(dst, (uint8_t *)g.base + off, chunk);
        double s = lms__now() - t0;
        double gbps = (double)(total / chunk * chunk) / s / 1e9;
        if (gbps > best)
            best = gbps;
    }
    lms__free(dst);
    return best;
}

int lms_bench_kv(int argc, char **argv)
{
    int64_t tokens = 4096, threads = 0, repeat = 3, level = 1;
    const char *codec_s = "all", *data = NULL, *store_dir = NULL, *dev_s = "cpu", *random_s = "bits", *v;
    bool json = false;
    for (int i = 1; i < argc;) {
        if (lms_cli_end_of_options(argv, &i))
            continue;
        if (lms_cli_opt(argc, argv, &i, "--tokens", &v)) {
            if (!lms_cli_parse_i64(v, &tokens) || tokens < 16 || tokens > (1 << 20))
                return lms_cli_usage("bench", "bad --tokens %s", v);
        } else if (lms_cli_opt(argc, argv, &i, "--threads", &v)) {
            if (!lms_cli_parse_i64(v, &threads) || threads < 0 || threads > 1024)
                return lms_cli_usage("bench", "bad --threads %s", v);
        } else if (lms_cli_opt(argc, argv, &i, "--repeat", &v)) {
            if (!lms_cli_parse_i64(v, &repeat) || repeat < 1 || repeat > 100)
                return lms_cli_usage("bench", "bad --repeat %s", v);
        } else if (lms_cli_opt(argc, argv, &i, "--level", &v)) {
            if (!lms_cli_parse_i64(v, &level) || level < 1 || level > 19)
                return lms_cli_usage("bench", "bad --level %s", v);
        } else if (lms_cli_opt(argc, argv, &i, "--codec", &codec_s) || lms_cli_opt(argc, argv, &i, "--data", &data) ||
                   lms_cli_opt(argc, argv, &i, "--store", &store_dir) ||
                   lms_cli_opt(argc, argv, &i, "--random", &random_s) ||
                   lms_cli_opt(argc, argv, &i, "--device", &dev_s)) {
        } else if (lms_cli_flag(argv, i, "--json")) {
            json = true;
            i++;
        } else if (lms_cli_flag(argv, i, "--help") || lms_cli_flag(argv, i, "-h")) {
            fputs(usage, stdout);
            return LMS_EXIT_OK;
        } else {
            return lms_cli_usage("bench", "unexpected argument %s", argv[i]);
        }
    }
    int codecs[3], n_codecs = 0;
    if (!strcmp(codec_s, "all")) {
        for (int k = 0; k < 3; k++)
            codecs[n_codecs++] = k;
    } else {
        lms_kv_codec c;
        if (lms_kv_codec_from_name(codec_s, &c) || c == LMS_KV_CODEC_AUTO)
            return lms_cli_usage("bench", "unknown codec '%s' (raw, zstd, shuffle-zstd, all)", codec_s);
        codecs[n_codecs++] = (int)c;
    }

    bool gaussian = !strcmp(random_s, "gaussian");
    if (!gaussian && strcmp(random_s, "bits"))
        return lms_cli_usage("bench", "--random is bits or gaussian, not '%s'", random_s);
    fixture fx = {0};
    double fx_ratio[3] = {0, 0, 0};
    int rc;
    if (data) {
        if ((rc = load_fixture(data, &fx)))
            return lms_cli_fail("bench", rc, "reading --data");
        if (!fx.D || 128 % fx.D || (uint64_t)fx.L * fx.H * 32 * 22 > (uint64_t)fx.L * fx.H * fx.T)
            return lms_cli_usage("bench", "--data: head_dim %u must divide 128, and %u tokens are too few", fx.D, fx.T);
        fixture_ratios(&fx, fx_ratio);
    }

    lms_device *dev = NULL;
    if ((rc = lms_device_open_name(dev_s, &dev)))
        return lms_cli_fail("bench", rc, "opening the device");
    lms_kv_layout L = {.n_layers = 32, .n_kv_heads = 8, .head_dim = 128, .dtype = LMS_DTYPE_BF16, .page_tokens = 16};
    lms_kv_params kp = lms_kv_default_params();
    kp.budget_pages = (uint64_t)(tokens + 15) / 16;
    kp.max_seqs = 2;
    memset(kp.model_id, 0x8b, sizeof kp.model_id);
    lms_kv *kv = NULL;
    lms_kv_seq *s = NULL;
    char *tmp = NULL;
    uint64_t *want = NULL, *got = NULL;
    int exit_code = LMS_EXIT_FAIL;
    if ((rc = lms_kv_create(dev, &L, &kp, &kv))) {
        lms_cli_fail("bench", rc, "creating the 8B-shaped KV cache");
        goto out;
    }
    if ((rc = lms_kv_seq_new(kv, &s)) || (rc = fill(kv, s, (uint32_t)tokens, data ? &fx : NULL, gaussian))) {
        lms_cli_fail("bench", rc, "filling the cache");
        goto out;
    }
    uint32_t np;
    lms_kv_seq_pages(s, &np);
    want = lms__calloc(np, 8);
    got = lms__calloc(np, 8);
    if (!want || !got || page_hashes(kv, s, want))
        goto out;
    double copy_gbps = dev->kind == LMS_DEVICE_CPU ? memcpy_gbps(kv) : 0;

    if (store_dir) {
        tmp = lms__strdup(store_dir);
    } else {
        const char *t = getenv("TMPDIR");
        tmp = lms__asprintf("%s/lmstore-bench-kv-XXXXXX", t && *t ? t : "/tmp");
        if (tmp && !mkdtemp(tmp)) {
            lms__free(tmp);
            tmp = NULL;
        }
    }
    if (!tmp) {
        fprintf(stderr, "lmstore bench: cannot make a scratch folder\n");
        goto out;
    }
    const char *label = data       ? "real KV (--data), tiled to the 8B layout"
                        : gaussian ? "random N(0,1) bf16 values (synthetic, not KV)"
                                   : "uniformly random bits (the lower bound of compression)";
    if (!json) {
        printf("bench kv: 8B layout (32 layers x 8 KV heads x 128, bf16, 16 tok/page), %lld tokens = %.1f MiB; data: %s\n",
               (long long)tokens, (double)tokens * 32 * 2 * 8 * 128 * 2 / 1048576.0, label);
        printf("device %s; memcpy over the arena: %.2f GB/s\n", dev->ops->name, copy_gbps);
        printf("%-13s %8s %10s %11s %11s %11s %9s %12s\n", "codec", "ratio", "stored MB", "save GB/s", "resume GB/s",
               "(median)", "vs memcpy", "GB/CPU-s");
    } else {
        printf("{\"layout\": \"llama3-8b\", \"tokens\": %lld, \"device\": \"%s\", \"data\": \"%s\", "
               "\"memcpy_gbps\": %.3f, \"codecs\": [",
               (long long)tokens, dev->ops->name, data ? "real" : gaussian ? "random-gaussian" : "random-bits",
               copy_gbps);
    }
    for (int ci = 0; ci < n_codecs; ci++) {
        int codec = codecs[ci];
        char *sdir = lms__asprintf("%s/%s", tmp, lms_kv_codec_name((lms_kv_codec)codec));
        lms_store *st = NULL;
        lms_store_params sp = lms_store_default_params();
        if (!sdir || (rc = lms_store_open(sdir, LMS_STORE_CREATE, &sp, &st))) {
            lms__free(sdir);
            lms_cli_fail("bench", rc, "creating a scratch store");
            goto out;
        }
        lms_kv_save_params svp = lms_kv_default_save_params();
        svp.codec = (lms_kv_codec)codec;
        svp.level = (int)level;
        svp.threads = (int)threads;
        lms_kv_io_stats ss, rs;
        if ((rc = lms_kv_save_ex(kv, s, st, "bench", &svp, &ss))) {
            lms_cli_fail("bench", rc, "save");
            lms_store_close(st);
            lms__free(sdir);
            goto out;
        }
        double *times = lms__calloc((size_t)repeat, sizeof *times);
        lms_kv_resume_params rp = lms_kv_default_resume_params();
        rp.threads = (int)threads;
        bool exact = true;
        double cpu = 0;
        for (int r = 0; r < repeat && !rc; r++) {
            lms_kv_seq_free(kv, s);
            s = NULL;
            lms_kv_drop_cached(kv);
            double c0 = cpu_seconds();
            if ((rc = lms_kv_resume_ex(kv, st, "bench", &rp, &s, &rs)))
                break;
            cpu += cpu_seconds() - c0;
            times[r] = rs.seconds;
            if ((rc = page_hashes(kv, s, got)))
                break;
            exact = exact && !memcmp(want, got, np * 8);
        }
        lms_store_close(st);
        if (rc) {
            lms__free(times);
            lms__free(sdir);
            lms_cli_fail("bench", rc, "resume");
            goto out;
        }
        /* best and median */
        for (int a = 0; a < repeat; a++)
            for (int b = a + 1; b < repeat; b++)
                if (times[b] < times[a]) {
                    double t = times[a];
                    times[a] = times[b];
                    times[b] = t;
                }
        double raw = (double)ss.raw_bytes, ratio = raw / (double)ss.stored_bytes;
        double save_gbps = raw / ss.seconds / 1e9, best = raw / times[0] / 1e9, med = raw / times[repeat / 2] / 1e9;
        double per_cpu = cpu > 0 ? raw * repeat / cpu / 1e9 : 0; /* GB per CPU-second */
        if (!json)
            printf("%-13s %7.3fx %10.1f %11.2f %11.2f %11.2f %8.2fx %12.2f%s\n", lms_kv_codec_name((lms_kv_codec)codec),
                   ratio, (double)ss.stored_bytes / 1e6, save_gbps, best, med, copy_gbps > 0 ? best / copy_gbps : 0,
                   per_cpu, exact ? "" : "  MISMATCH");
        else
            printf("%s{\"codec\": \"%s\", \"ratio\": %.4f, \"stored_bytes\": %llu, \"raw_bytes\": %llu, "
                   "\"save_gbps\": %.3f, \"resume_gbps_best\": %.3f, \"resume_gbps_median\": %.3f, "
                   "\"resume_gb_per_cpu_second\": %.3f, \"fixture_ratio\": %.4f, \"exact\": %s}",
                   ci ? ", " : "", lms_kv_codec_name((lms_kv_codec)codec), ratio,
                   (unsigned long long)ss.stored_bytes, (unsigned long long)ss.raw_bytes, save_gbps, best, med,
                   per_cpu, fx_ratio[codec], exact ? "true" : "false");
        lms__free(times);
        if (!store_dir) {
            char *cmd = lms__asprintf("rm -rf '%s'", sdir);
            if (cmd && system(cmd) != 0)
                fprintf(stderr, "lmstore bench: could not remove %s\n", sdir);
            lms__free(cmd);
        }
        lms__free(sdir);
        if (!exact) {
            fprintf(stderr, "lmstore bench: resumed bytes differ from the saved ones (%s)\n",
                    lms_kv_codec_name((lms_kv_codec)codec));
            goto out;
        }
    }
    if (json)
        printf("]}\n");
    else if (data)
        printf("ratio on the --data file's own pages (%u layers x %u heads x %u tokens, no repetition): raw %.3fx, "
               "zstd %.3fx, shuffle-zstd %.3fx\n",
               fx.L, fx.H, fx.T, fx_ratio[0], fx_ratio[1], fx_ratio[2]);
    exit_code = LMS_EXIT_OK;
out:
    if (tmp && !store_dir)
        rmdir(tmp);
    lms__free(tmp);
    lms__free(want);
    lms__free(got);
    lms_kv_seq_free(kv, s);
    lms_kv_destroy(kv);
    lms_device_close(dev);
    lms__free(fx.k);
    lms__free(fx.v);
    return exit_code;
}
