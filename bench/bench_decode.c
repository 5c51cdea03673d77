/*
 * bench/bench_decode.c - one-token decode steps of the CUDA backend on a
 * model shape with synthetic weights made on the device (no model files):
 * the time a step takes through the forward pass (lms__fwd_block_argmax,
 * replayed from the decode graph as the engine runs it), and of steps that
 * run only one kind of operation of every layer (RoPE + attention, the q/k/v
 * product, the o product, the MLP, nothing but the embedding), so that each
 * kind's share of a step shows with the launch gaps it brings. Weights are
 * pseudo-random bf16 in [-0.02, 0.02] (a 64 MiB block copied over every
 * matrix), K/V F16 with every page filled; the context is as if `--pos`
 * tokens were there (attention reads their K/V, whatever they hold).
 *
 *   bench_decode [--shape llama8b|gemma12b] [--pos P] [--steps N] [--reps R]
 *                [--only full,attn,qkv,o,mlp,embed]
 *
 * Prints one JSON line per part: median, min and max milliseconds a step over
 * R repetitions of N steps (positions P .. P + N - 1), and the weight bytes a
 * full step reads. Environment variables of the backend (LMSTORE_CUDA_*)
 * apply, so that variants run in one process each.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "engine/backend.h"
#include "loader/device.h"

#define PAGE_TOKENS 16
#define FILL_BYTES (64u << 20)

static lms_device *g_dev;
static void *g_fill; /* FILL_BYTES of random bf16 on the device */

static double now(void)
{
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return ts.tv_sec + ts.tv_nsec * 1e-9;
}

static int cmp_d(const void *a, const void *b)
{
    double x = *(const double *)a, y = *(const double *)b;
    return x < y ? -1 : x > y;
}

static void die(const char *what, int rc)
{
    fprintf(stderr, "bench_decode: %s: %s (%d)\n", what, lms_last_error(), rc);
    exit(1);
}

/* A device matrix of rows x cols bf16, filled from the random block. */
static void make_wt(lms__wt *w, uint32_t rows, uint32_t cols)
{
    size_t n = (size_t)rows * cols * 2;
    void *d = NULL;
    int rc = g_dev->ops->alloc(g_dev, n, &d);
    if (rc)
        die("weights", rc);
    for (size_t o = 0; o < n; o += FILL_BYTES) {
        size_t k = n - o < FILL_BYTES ? n - o : FILL_BYTES;
        if ((rc = g_dev->ops->copy_d2d(g_dev, (uint8_t *)d + o, g_fill, k, NULL)))
            die("weights fill", rc);
    }
    *w = (lms__wt){NULL, d, LMS_DTYPE_BF16, rows, cols, NULL};
}

static float *vec(lms__weights *w, size_t *used, uint32_t n, float base)
{
    float *v = w->vec_store + *used;
    for (uint32_t i = 0; i < n; i++) v[i] = base + 0.1f * (float)((i * 2654435761u) % 1000) / 1000.f;
    *used += n;
    return v;
}

static void shape_hp(lms__hparams *hp, const char *shape)
{
    memset(hp, 0, sizeof *hp);
    hp->eps = 1e-5f;
    hp->rope_kind = LMS__ROPE_DEFAULT;
    hp->max_pos = 8192;
    if (!strcmp(shape, "gemma12b")) {
        hp->n_vocab = 262144, hp->n_embd = 3840, hp->n_layers = 48, hp->n_heads = 16, hp->n_kv_heads = 8;
        hp->head_dim = 256, hp->n_ff = 15360, hp->act = LMS__ACT_GELU_TANH, hp->rope_theta = 1e6;
        hp->rope_local_theta = 1e4, hp->qk_norm = true, hp->post_norms = true, hp->window = 1024;
        hp->embed_scale = sqrtf(3840.f), hp->attn_scale = 1.0f / 16.0f;
        for (uint32_t l = 0; l < hp->n_layers; l++) hp->sliding[l] = (l + 1) % 6 != 0;
    } else if (!strcmp(shape, "llama8b")) {
        hp->n_vocab = 128256, hp->n_embd = 4096, hp->n_layers = 32, hp->n_heads = 32, hp->n_kv_heads = 8;
        hp->head_dim = 128, hp->n_ff = 14336, hp->act = LMS__ACT_SILU, hp->rope_theta = 5e5;
        hp->embed_scale = 1, hp->attn_scale = 1.0f / sqrtf(128.f);
    } else {
        fprintf(stderr, "bench_decode: unknown shape %s (llama8b, gemma12b)\n", shape);
        exit(2);
    }
}

static void make_weights(const lms__hparams *hp, lms__weights *w)
{
    uint32_t E = hp->n_embd, qd = hp->n_heads * hp->head_dim, kvd = hp->n_kv_heads * hp->head_dim, F = hp->n_ff;
    memset(w, 0, sizeof *w);
    w->vec_len = (size_t)hp->n_layers * (4 * E + 2 * hp->head_dim) + E + 64;
    w->vec_store = malloc(w->vec_len * 4);
    w->layers = calloc(hp->n_layers, sizeof *w->layers);
    if (!w->vec_store || !w->layers)
        die("host memory", LMS_ENOMEM);
    size_t used = 0;
    make_wt(&w->embed, hp->n_vocab, E);
    w->lm_head = w->embed; /* tied, as gemma's; llama's own head reads the same bytes */
    w->final_norm = vec(w, &used, E, 1.0f);
    for (uint32_t l = 0; l < hp->n_layers; l++) {
        lms__layer_w *L = &w->layers[l];
        make_wt(&L->wq, qd, E);
        make_wt(&L->wk, kvd, E);
        make_wt(&L->wv, kvd, E);
        make_wt(&L->wo, E, qd);
        make_wt(&L->w_gate, F, E);
        make_wt(&L->w_up, F, E);
        make_wt(&L->w_down, E, F);
        L->attn_norm = vec(w, &used, E, 1.0f);
        L->ffn_norm = vec(w, &used, E, 1.0f);
        if (hp->post_norms) {
            L->post_attn_norm = vec(w, &used, E, 1.0f);
            L->post_ffn_norm = vec(w, &used, E, 1.0f);
        }
        if (hp->qk_norm) {
            L->q_norm = vec(w, &used, hp->head_dim, 1.0f);
            L->k_norm = vec(w, &used, hp->head_dim, 1.0f);
        }
    }
}

/* The matrix bytes one step reads: every layer's, the LM head's. */
static double step_bytes(const lms__hparams *hp)
{
    double E = hp->n_embd, qd = hp->n_heads * hp->head_dim, kvd = hp->n_kv_heads * hp->head_dim, F = hp->n_ff;
    return 2.0 * (hp->n_layers * (E * qd * 2 + E * kvd * 2 + 3 * E * F) + hp->n_vocab * E);
}

typedef struct bench {
    const lms__hparams *hp;
    const lms__weights *w;
    lms__kvview kv;
    uint32_t n_ctx;
} bench;

/* One step of `part` on backend instance bk (a fresh one per part: its graph records that part). */
static int part_step(const bench *B, lms__bk *bk, const char *part, int32_t tok, uint32_t pos)
{
    const lms__fwd_ops *o = lms__fwd_cuda;
    const lms__hparams *hp = B->hp;
    lms__step st = {.tokens = &tok, .nb = 1, .pos0 = pos, .kv = &B->kv, .out = LMS__OUT_NONE};
    bool replayed = false;
    int rc = o->begin(bk, &st, &replayed);
    if (rc)
        return rc;
    if (!replayed) {
        o->embed(bk, hp->embed_scale);
        for (uint32_t l = 0; l < hp->n_layers; l++) {
            const lms__layer_w *L = &B->w->layers[l];
            bool local = hp->window && hp->sliding[l];
            lms__buf out = hp->post_norms ? LMS__B_T : LMS__B_X;
            if (!strcmp(part, "qkv")) {
                lms__mm qkv[3] = {{&L->wq, LMS__B_X, L->attn_norm, LMS__ACT_NONE, 0, LMS__B_Q, NULL, false},
                                  {&L->wk, LMS__B_X, L->attn_norm, LMS__ACT_NONE, 0, LMS__B_K, NULL, false},
                                  {&L->wv, LMS__B_X, L->attn_norm, LMS__ACT_NONE, 0, LMS__B_V, NULL, false}};
                o->matmul(bk, qkv, 3);
            } else if (!strcmp(part, "attn")) {
                o->qk_rope(bk, l, L->q_norm, L->k_norm, local ? LMS__ROPE_LOCAL : LMS__ROPE_GLOBAL);
                o->attention(bk, l, local ? hp->window : 0, hp->attn_scale, hp->attn_softcap);
            } else if (!strcmp(part, "o")) {
                lms__mm wo = {&L->wo, LMS__B_ATT, NULL, LMS__ACT_NONE, 0, out, NULL, !hp->post_norms};
                if (hp->post_norms)
                    o->matmul_norm_add(bk, &wo, LMS__B_X, L->post_attn_norm);
                else
                    o->matmul(bk, &wo, 1);
            } else if (!strcmp(part, "mlp")) {
                lms__mm gu[2] = {{&L->w_gate, LMS__B_X, L->ffn_norm, LMS__ACT_NONE, 0, LMS__B_G, NULL, false},
                                 {&L->w_up, LMS__B_X, L->ffn_norm, LMS__ACT_NONE, 0, LMS__B_U, NULL, false}};
                o->matmul(bk, gu, 2);
                lms__mm down = {&L->w_down, LMS__B_G, NULL, hp->act, LMS__B_U, out, NULL, !hp->post_norms};
                if (hp->post_norms)
                    o->matmul_norm_add(bk, &down, LMS__B_X, L->post_ffn_norm);
                else
                    o->matmul(bk, &down, 1);
            }
        }
    }
    return o->end(bk);
}

static void run_part(const bench *B, const char *part, uint32_t pos0, int steps, int reps)
{
    double *t = calloc((size_t)reps, sizeof *t);
    int rc;
    lms__fwd *f = NULL;
    lms__bk *bk = NULL;
    bool full = !strcmp(part, "full");
    if (full)
        rc = lms__fwd_create(lms__fwd_cuda, B->hp, B->w, g_dev, NULL, NULL, 1, 1, B->n_ctx, &B->kv, &f);
    else {
        lms__fwd_cfg cfg = {B->hp, B->w, g_dev, NULL, NULL, 1, B->n_ctx, &B->kv, 1};
        rc = lms__fwd_cuda->create(&cfg, &bk);
    }
    if (rc)
        die("backend", rc);
    for (int r = -1; r < reps; r++) { /* r = -1: warm-up (records the graph) */
        double t0 = now();
        for (int s = 0; s < steps; s++) {
            int32_t tok = (int32_t)((s * 7919 + 11) % B->hp->n_vocab), id = -1;
            uint32_t pos = pos0 + (uint32_t)s;
            rc = full ? lms__fwd_block_argmax(f, &tok, 1, pos, &B->kv, &id) : part_step(B, bk, part, tok, pos);
            if (rc)
                die(part, rc);
        }
        if (r >= 0)
            t[r] = (now() - t0) * 1e3 / steps;
    }
    qsort(t, (size_t)reps, sizeof *t, cmp_d);
    printf("{\"what\": \"decode_step\", \"part\": \"%s\", \"layers\": %u, \"pos\": %u, \"steps\": %d, \"ms_median\": %.4f, "
           "\"ms_min\": %.4f, \"ms_max\": %.4f, \"weight_gb\": %.3f}\n",
           part, B->hp->n_layers, pos0, steps, t[reps / 2], t[0], t[reps - 1], step_bytes(B->hp) / 1e9);
    fflush(stdout);
    if (full)
        lms__fwd_free(f);
    else
        lms__fwd_cuda->destroy(bk);
    free(t);
}

int main(int argc, char **argv)
{
    const char *shape = "llama8b", *only = "full,attn,qkv,o,mlp,embed";
    int steps = 128, reps = 5;
    uint32_t pos = 128;
    for (int i = 1; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--shape"))
            shape = argv[i + 1];
        else if (!strcmp(argv[i], "--pos"))
            pos = (uint32_t)atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--steps"))
            steps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps"))
            reps = atoi(argv[i + 1]);
        else if (!strcmp(argv[i], "--only"))
            only = argv[i + 1];
        else {
            fprintf(stderr, "usage: bench_decode [--shape llama8b|gemma12b] [--pos P] [--steps N] [--reps R] "
                            "[--only full,attn,qkv,o,mlp,embed]\n");
            return 2;
        }
    }
    if (!lms__fwd_cuda) {
        fprintf(stderr, "bench_decode: built without CUDA\n");
        return 77;
    }
    if (steps < 1 || reps < 1)
        return 2;
    int rc = lms_device_open(LMS_DEVICE_CUDA, 0, &g_dev);
    if (rc)
        die("cuda device", rc);
    lms__hparams hp;
    shape_hp(&hp, shape);

    /* the random block, then the weights */
    uint16_t *h = malloc(FILL_BYTES);
    uint64_t x = 88172645463325252ull;
    for (size_t i = 0; i < FILL_BYTES / 2; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        h[i] = lms__f32_to_bf16(((float)(x >> 40) / (float)(1u << 24) - 0.5f) * 0.04f);
    }
    if ((rc = g_dev->ops->alloc(g_dev, FILL_BYTES, &g_fill)) ||
        (rc = g_dev->ops->copy_h2d(g_dev, g_fill, h, FILL_BYTES, NULL)))
        die("fill block", rc);
    free(h);
    lms__weights w;
    make_weights(&hp, &w);

    /* the cache: pages for n_ctx positions, F16, every layer in one group, identity table */
    bench B = {&hp, &w, {0}, pos + (uint32_t)steps + 16};
    lms__kvview *kv = &B.kv;
    kv->dtype = LMS_DTYPE_F16;
    kv->page_tokens = PAGE_TOKENS;
    kv->elem_size = 2;
    kv->token_bytes = hp.head_dim * 2;
    kv->head_bytes = PAGE_TOKENS * kv->token_bytes;
    kv->v_offset = hp.n_kv_heads * kv->head_bytes;
    kv->layer_bytes = 2 * kv->v_offset;
    kv->page_bytes = hp.n_layers * kv->layer_bytes;
    kv->n_pages = (B.n_ctx + PAGE_TOKENS - 1) / PAGE_TOKENS;
    uint32_t *table = malloc(kv->n_pages * 4);
    for (uint32_t i = 0; i < kv->n_pages; i++) table[i] = i;
    kv->pages = table;
    void *arena = NULL;
    size_t ab = (size_t)kv->n_pages * kv->page_bytes;
    if ((rc = g_dev->ops->alloc(g_dev, ab, &arena)) || (rc = g_dev->ops->memset(g_dev, arena, 0x2c, ab, NULL)))
        die("kv arena", rc);
    kv->base = arena;

    char parts[256];
    snprintf(parts, sizeof parts, "%s", only);
    for (char *p = strtok(parts, ","); p; p = strtok(NULL, ","))
        run_part(&B, p, pos, steps, reps);
    return 0;
}
